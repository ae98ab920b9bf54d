//! Blocking calls multiplexed on one stream. A blocking call on a stream of its own holds the
//! stream for as long as it waits (minutes): thousands of watchers behind a client agent were
//! thousands of streams, each with its state on both sides and its share of the connection's
//! tables. A client now opens one stream call per peer, on the peer's first watch connection,
//! and sends every blocking call on it, each request a frame `[kind: u8][id: u64 BE][payload]`:
//! an `ASK` (the request), a `CANCEL` (the caller left: the peer drops the handler's future and
//! gives its room back), or a `PING` (answered at once; the opening uses one to learn whether
//! the peer serves the stream). The peer answers each `ASK` and `PING` once, in whatever order
//! its handler finishes them, with `[ANSWER][id][response]`, `[BUSY][id]` when the peer's
//! streams carry as many calls as they may ([`MAX_CALLS`]), or `[TOO_LARGE][id]` when the
//! response does not fit in a frame. A peer that does not multiplex
//! ([`RpcHandler::multiplexes`]; a server of an older version) resets the stream: the client
//! then sends its blocking calls on streams of their own, as before, and asks again after
//! [`UNSUPPORTED_FOR`].
//!
//! A waiting call holds its id, the stream's shared state and the receiving end of a oneshot
//! channel; the stream's two tasks (one writing, one reading) are per peer. When the stream
//! or its connection ends, every call on it fails with why, as a call on its own stream would,
//! and the caller retries (on another server) as it would have. When the client's requests end
//! (it left, or a frame broke the format), the peer drops every call of the stream.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::{AbortHandle, Abortable, Aborted};
use futures::stream::{FuturesUnordered, Stream};
use tokio::sync::{mpsc, oneshot};

use super::*;

/// A request frame: ask the handler.
const ASK: u8 = 0;
/// A request frame: the caller of this id left.
const CANCEL: u8 = 1;
/// A request frame: answer at once, with nothing.
const PING: u8 = 2;
/// An answer frame: the handler's response.
const ANSWER: u8 = 0;
/// An answer frame: refused, the peer's streams carrying as many calls as they may.
const BUSY: u8 = 1;
/// An answer frame: the handler's response does not fit in a frame.
const TOO_LARGE: u8 = 2;
/// Kind and id.
const HEAD: usize = 9;
/// Calls one peer's multiplexed streams carry at once at most, all its connections together:
/// as many as the watch connections that carry blocking calls one stream each
/// ([`WATCH_STREAMS_PER_CONNECTION`] times [`MAX_WATCH_CONNECTIONS`]). Each call is a
/// handler's future; the blocking ones among them also take one of the server's
/// blocking-query slots.
pub(super) const MAX_CALLS: usize = WATCH_STREAMS_PER_CONNECTION * MAX_WATCH_CONNECTIONS;
/// The largest request sent on a multiplexed stream: a request frame larger than the peer
/// may read at once would end the stream, and every call on it, so a larger one (no blocking
/// read is) goes on a stream of its own.
const MAX_REQUEST: usize = 64 * 1024;
/// While calls wait, a peer silent this long is pinged on the stream: QUIC notices a killed
/// peer only after its idle timeout, and the calls should move to another server long before.
const PING_AFTER: Duration = Duration::from_secs(1);
/// A peer that does not answer that ping within this is taken to be gone: the stream ends,
/// and its calls fail.
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// After a peer turned a multiplexed stream down, how long its blocking calls go one stream
/// each before it is asked again (it may have been upgraded meanwhile).
const UNSUPPORTED_FOR: Duration = Duration::from_secs(60);

fn frame(kind: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEAD + payload.len());
    frame.push(kind);
    frame.extend_from_slice(&id.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A frame's kind, id and payload; `None` if it is too short to have them.
fn parse(frame: &[u8]) -> Option<(u8, u64, &[u8])> {
    let (head, payload) = frame.split_at_checked(HEAD)?;
    let id = u64::from_be_bytes(head[1..].try_into().ok()?);
    Some((head[0], id, payload))
}

/// What a client knows of its multiplexed stream to one peer.
pub(super) enum MuxState {
    Open(Arc<Mux>),
    /// The peer reset the stream at this time: it does not multiplex.
    Unsupported(Instant),
    /// The last opening, which ended at this time, failed so: the callers that queued behind
    /// it take its outcome rather than each trying again in turn (thousands of blocking calls
    /// may wait for one unreachable server).
    Failed(Instant, TransportError),
}

/// The per-peer slot of a client's multiplexed stream, locked while it is opened, so that
/// concurrent callers wait for one opening.
pub(super) type MuxSlot = Arc<tokio::sync::Mutex<Option<MuxState>>>;

/// One multiplexed stream, as its calls and its tasks share it.
pub(super) struct Mux {
    addr: SocketAddr,
    calls: Mutex<Calls>,
    /// Wakes the watchdog: a call came whose deadline is earlier than the one it waits for.
    rearm: tokio::sync::Notify,
    /// Stops the tasks: cancelled when the stream ends, or the client is dropped.
    stop: CancellationToken,
}

/// A call's answer, or why it has none. The error is boxed: every waiting call holds a
/// channel with room for one.
type Outcome = Result<Vec<u8>, Box<TransportError>>;

/// A call waiting for its answer.
struct Waiter {
    tx: oneshot::Sender<Outcome>,
    /// When it fails with [`TransportError::Timeout`] unanswered.
    deadline: Instant,
    timeout: Duration,
}

struct Calls {
    next_id: u64,
    waiting: HashMap<u64, Waiter>,
    /// To the writing task; `None` once the stream ended.
    outbound: Option<mpsc::UnboundedSender<Bytes>>,
    /// Why the stream ended, once it has.
    ended: Option<TransportError>,
    /// Whether it ended because the peer does not multiplex.
    unsupported: bool,
    /// When a frame last came from the peer.
    heard: Instant,
    /// When the ping sent for the peer's silence left, until something comes.
    pinged: Option<Instant>,
    /// When the watchdog looks next (`None`: when a call comes).
    looks_at: Option<Instant>,
}

impl Mux {
    /// Sends a frame of `kind` with `payload`; the returned call resolves to its answer, or
    /// fails with [`TransportError::Timeout`] if none comes within `timeout`.
    fn send(self: &Arc<Self>, kind: u8, payload: &[u8], timeout: Duration) -> MuxCall {
        let (tx, answer) = oneshot::channel();
        let mut calls = self.calls.lock();
        if let Some(why) = &calls.ended {
            let _ = tx.send(Err(Box::new(why.clone())));
            return MuxCall {
                mux: Arc::clone(self),
                id: 0,
                answer,
            };
        }
        calls.next_id += 1;
        let id = calls.next_id;
        let deadline = Instant::now() + timeout;
        calls.waiting.insert(
            id,
            Waiter {
                tx,
                deadline,
                timeout,
            },
        );
        if let Some(outbound) = &calls.outbound {
            let _ = outbound.send(frame(kind, id, payload).into());
        }
        if calls.looks_at.is_none_or(|at| deadline < at) {
            self.rearm.notify_one();
        }
        MuxCall {
            mux: Arc::clone(self),
            id,
            answer,
        }
    }

    /// Hands an answer frame to its call (gone already if its caller left).
    fn answer(&self, frame: &[u8]) -> Result<(), TransportError> {
        let (kind, id, payload) = parse(frame)
            .ok_or_else(|| TransportError::Protocol("a multiplexed answer too short".into()))?;
        let answer = match kind {
            ANSWER => Ok(payload.to_vec()),
            BUSY => Err(Box::new(TransportError::Busy { addr: self.addr })),
            TOO_LARGE => Err(Box::new(TransportError::Protocol(
                "the peer's response exceeds the frame limit".to_owned(),
            ))),
            other => {
                return Err(TransportError::Protocol(format!(
                    "a multiplexed answer of unknown kind {other}"
                )));
            }
        };
        let waiter = {
            let mut calls = self.calls.lock();
            calls.heard = Instant::now();
            calls.waiting.remove(&id)
        };
        if let Some(waiter) = waiter {
            let _ = waiter.tx.send(answer);
        }
        Ok(())
    }

    /// Fails the calls past their deadline; pings the peer when calls wait and it has said
    /// nothing for [`PING_AFTER`], and ends the stream when it has not answered that ping
    /// within [`PING_TIMEOUT`]. Answers when to look again (`None`: when a call comes).
    fn look(&self, now: Instant) -> Option<Instant> {
        let mut calls = self.calls.lock();
        if calls.ended.is_some() {
            return None;
        }
        if let Some(sent) = calls.pinged {
            if calls.heard >= sent {
                calls.pinged = None;
            } else if now >= sent + PING_TIMEOUT {
                drop(calls);
                self.end(
                    TransportError::Closed {
                        addr: self.addr,
                        reason: format!("no answer to a ping within {PING_TIMEOUT:?}"),
                    },
                    false,
                );
                return None;
            }
        }
        // A call past its deadline fails, and the peer is told, as when its caller leaves.
        let addr = self.addr;
        let calls = &mut *calls;
        for (id, waiter) in calls.waiting.extract_if(|_, waiter| waiter.deadline <= now) {
            let after = waiter.timeout;
            let _ = waiter
                .tx
                .send(Err(Box::new(TransportError::Timeout { addr, after })));
            if let Some(outbound) = &calls.outbound {
                let _ = outbound.send(frame(CANCEL, id, &[]).into());
            }
        }
        if calls.waiting.is_empty() {
            calls.looks_at = None;
            return None;
        }
        if calls.pinged.is_none() && now >= calls.heard + PING_AFTER {
            calls.pinged = Some(now);
            calls.next_id += 1;
            let id = calls.next_id;
            if let Some(outbound) = &calls.outbound {
                let _ = outbound.send(frame(PING, id, &[]).into());
            }
        }
        let judged = match calls.pinged {
            Some(sent) => sent + PING_TIMEOUT,
            None => calls.heard + PING_AFTER,
        };
        let next = calls
            .waiting
            .values()
            .map(|waiter| waiter.deadline)
            .fold(judged, Instant::min);
        calls.looks_at = Some(next);
        Some(next)
    }

    /// Ends the stream: every call on it fails with `why`, and so does every later one.
    fn end(&self, why: TransportError, unsupported: bool) {
        let waiting = {
            let mut calls = self.calls.lock();
            calls.outbound = None;
            calls.unsupported |= unsupported;
            calls.ended.get_or_insert(why.clone());
            std::mem::take(&mut calls.waiting)
        };
        self.stop.cancel();
        for (_, waiter) in waiting {
            let _ = waiter.tx.send(Err(Box::new(why.clone())));
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.calls.lock().ended.is_none()
    }
}

/// One call on a multiplexed stream, until it is answered. Dropped before that, it tells the
/// peer, which drops the handler's future.
pub(super) struct MuxCall {
    mux: Arc<Mux>,
    id: u64,
    answer: oneshot::Receiver<Outcome>,
}

impl Future for MuxCall {
    type Output = Result<Vec<u8>, TransportError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let addr = self.mux.addr;
        Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| match answer {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(why)) => Err(*why),
                Err(_) => Err(TransportError::Closed {
                    addr,
                    reason: "the multiplexed stream ended".to_owned(),
                }),
            })
    }
}

impl Drop for MuxCall {
    fn drop(&mut self) {
        let mut calls = self.mux.calls.lock();
        if calls.waiting.remove(&self.id).is_some()
            && let Some(outbound) = &calls.outbound
        {
            let _ = outbound.send(frame(CANCEL, self.id, &[]).into());
        }
    }
}

impl RpcClient {
    /// A blocking call on the multiplexed stream to `addr`, opened first if need be, or on a
    /// stream of its own (boxed: the rare case) when the peer does not multiplex or the request
    /// is larger than [`MAX_REQUEST`]. What the call holds while it waits is its place on the
    /// stream: its deadline and the peer's silence are the stream's watchdog's.
    pub(super) fn call_muxed(
        &self,
        addr: SocketAddr,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send + '_ {
        // The opening is boxed on its own (with its share of the timeout) and freed before the
        // wait.
        let opening = tokio::time::timeout(timeout, self.mux(addr)).map(move |opened| {
            opened.unwrap_or(Err(TransportError::Timeout {
                addr,
                after: timeout,
            }))
        });
        Box::pin(opening).then(move |mux| match mux {
            Ok(Some(mux)) if !request.is_empty() && request.len() <= MAX_REQUEST => {
                Either::Left(mux.send(ASK, &request, timeout))
            }
            Ok(_) => {
                Either::Right(Box::pin(self.call_alone(addr, request, timeout)) as BoxFuture<'_, _>)
            }
            Err(e) => Either::Right(Box::pin(std::future::ready(Err(e))) as BoxFuture<'_, _>),
        })
    }

    /// The open multiplexed stream to `addr`, opened if there is none; `None` if the peer
    /// turned one down less than [`UNSUPPORTED_FOR`] ago.
    async fn mux(&self, addr: SocketAddr) -> Result<Option<Arc<Mux>>, TransportError> {
        let asked = Instant::now();
        let slot = Arc::clone(self.inner.muxes.lock().entry(addr).or_default());
        let mut state = slot.lock().await;
        match &*state {
            Some(MuxState::Open(mux)) if mux.is_open() => return Ok(Some(Arc::clone(mux))),
            Some(MuxState::Unsupported(at)) if at.elapsed() < UNSUPPORTED_FOR => return Ok(None),
            Some(MuxState::Failed(at, why)) if *at >= asked => return Err(why.clone()),
            _ => {}
        }
        let opened = tokio::time::timeout(FRAME_DEADLINE, self.open_mux(addr))
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::Timeout {
                    addr,
                    after: FRAME_DEADLINE,
                })
            });
        *state = Some(match &opened {
            Ok(Some(mux)) => MuxState::Open(Arc::clone(mux)),
            Ok(None) => MuxState::Unsupported(Instant::now()),
            Err(why) => MuxState::Failed(Instant::now(), why.clone()),
        });
        opened
    }

    /// Opens a stream call on the first watch connection to `addr` (redialing once if the
    /// cached connection was stale), starts its tasks, and pings it: a peer that does not
    /// multiplex resets it (`None`).
    async fn open_mux(&self, addr: SocketAddr) -> Result<Option<Arc<Mux>>, TransportError> {
        let (send, recv) = self
            .on_connection(addr, Lane::Watch(0), |connection| async move {
                open_stream_call(&connection).await
            })
            .await?;
        let (outbound, frames) = mpsc::unbounded_channel();
        let mux = Arc::new(Mux {
            addr,
            calls: Mutex::new(Calls {
                next_id: 0,
                waiting: HashMap::new(),
                outbound: Some(outbound),
                ended: None,
                unsupported: false,
                heard: Instant::now(),
                pinged: None,
                looks_at: None,
            }),
            rearm: tokio::sync::Notify::new(),
            stop: self.inner.closing.child_token(),
        });
        tokio::spawn(write_frames(Arc::clone(&mux), send, frames));
        tokio::spawn(read_answers(Arc::clone(&mux), recv));
        tokio::spawn(watch(Arc::clone(&mux)));
        match mux.send(PING, &[], FRAME_DEADLINE).await {
            Ok(_) => Ok(Some(mux)),
            Err(_) if mux.calls.lock().unsupported => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends the multiplexed stream to `addr`, if any: its calls fail.
    pub(super) fn end_mux(&self, addr: SocketAddr) {
        let slot = self.inner.muxes.lock().remove(&addr);
        if let Some(slot) = slot
            && let Ok(state) = slot.try_lock()
            && let Some(MuxState::Open(mux)) = &*state
        {
            mux.end(
                TransportError::Closed {
                    addr,
                    reason: "disconnected".to_owned(),
                },
                false,
            );
        }
    }
}

/// The watchdog of a multiplexed stream ([`Mux::look`]): one timer for all its calls.
async fn watch(mux: Arc<Mux>) {
    loop {
        let next = mux.look(Instant::now());
        let asleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = asleep => {}
            () = mux.rearm.notified() => {}
            () = mux.stop.cancelled() => return,
        }
    }
}

/// The writing task of a multiplexed stream: its frames in the order sent, until it ends.
async fn write_frames(
    mux: Arc<Mux>,
    mut send: SendStream,
    mut frames: mpsc::UnboundedReceiver<Bytes>,
) {
    loop {
        let frame = tokio::select! {
            frame = frames.recv() => frame,
            () = mux.stop.cancelled() => None,
        };
        let Some(frame) = frame else {
            let _ = send.reset(STREAM_SHUTTING_DOWN);
            return;
        };
        if let Err(failure) = write_frame(&mut send, frame).await {
            mux.end(failure.into_error(mux.addr), false);
            return;
        }
    }
}

/// The reading task of a multiplexed stream: each answer to its call, until the stream ends
/// (then every call still waiting fails).
async fn read_answers(mux: Arc<Mux>, mut recv: RecvStream) {
    let addr = mux.addr;
    loop {
        let frame = tokio::select! {
            frame = read_frame(&mut recv) => frame,
            () = mux.stop.cancelled() => return,
        };
        let (why, unsupported) = match frame {
            Ok(frame) => match mux.answer(&frame) {
                Ok(()) => continue,
                Err(why) => (why, false),
            },
            Err(failure) => {
                let unsupported = matches!(failure, Failure::NotStreamed);
                (failure.into_error(addr), unsupported)
            }
        };
        let _ = recv.stop(STREAM_BAD_REQUEST);
        mux.end(why, unsupported);
        return;
    }
}

/// The accepting side of a multiplexed stream: each `ASK` of `requests` is answered by
/// `handle` (its answer sent as soon as it is ready, in whatever order) if the peer has room
/// for another call (`calls`, shared by its streams), a `CANCEL` drops its handler's future, a
/// `PING` is answered at once. When the requests end (the caller left: it never finishes them
/// otherwise) or a frame breaks the format, the answers end at once and every handler's future
/// still running is dropped.
pub(super) fn serve<H>(requests: Frames, calls: Arc<Semaphore>, handle: H) -> Muxed<H>
where
    H: Fn(Vec<u8>) -> BoxFuture<'static, Vec<u8>>,
{
    Muxed {
        requests,
        calls,
        handle,
        answering: FuturesUnordered::new(),
        running: HashMap::new(),
        ready: VecDeque::new(),
    }
}

/// A call on a multiplexed stream being answered: its id and answer, once it has one.
type Answering = Abortable<BoxFuture<'static, (u64, Vec<u8>)>>;

pub(super) struct Muxed<H> {
    requests: Frames,
    /// The peer's room for calls; each running call holds a permit.
    calls: Arc<Semaphore>,
    handle: H,
    answering: FuturesUnordered<Answering>,
    /// Each running call's way to drop its future, and its room, by id.
    running: HashMap<u64, (AbortHandle, OwnedSemaphorePermit)>,
    /// Answers that need no handler (pings, refusals), in order.
    ready: VecDeque<Vec<u8>>,
}

impl<H> Muxed<H>
where
    H: Fn(Vec<u8>) -> BoxFuture<'static, Vec<u8>>,
{
    /// Takes in one request frame; `false` if it breaks the format.
    fn take(&mut self, request: &[u8]) -> bool {
        let Some((kind, id, payload)) = parse(request) else {
            return false;
        };
        match kind {
            ASK if payload.is_empty() || self.running.contains_key(&id) => false,
            ASK => {
                let Ok(room) = Arc::clone(&self.calls).try_acquire_owned() else {
                    self.ready.push_back(frame(BUSY, id, &[]));
                    return true;
                };
                let (abort, registration) = AbortHandle::new_pair();
                let call = (self.handle)(payload.to_vec()).map(move |answer| (id, answer));
                self.answering
                    .push(Abortable::new(call.boxed(), registration));
                self.running.insert(id, (abort, room));
                true
            }
            CANCEL if payload.is_empty() => {
                // Its room is given back at once; its future goes when next polled.
                if let Some((abort, _room)) = self.running.remove(&id) {
                    abort.abort();
                }
                true
            }
            PING if payload.is_empty() => {
                self.ready.push_back(frame(ANSWER, id, &[]));
                true
            }
            _ => false,
        }
    }
}

impl<H> Stream for Muxed<H>
where
    H: Fn(Vec<u8>) -> BoxFuture<'static, Vec<u8>> + Unpin,
{
    type Item = Vec<u8>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
        let this = &mut *self;
        loop {
            match this.requests.poll_next_unpin(cx) {
                Poll::Ready(Some(frame)) if this.take(&frame) => {}
                Poll::Ready(Some(_)) => {
                    tracing::debug!("a malformed multiplexed request; ending the stream");
                    return Poll::Ready(None);
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => break,
            }
        }
        if let Some(answer) = this.ready.pop_front() {
            return Poll::Ready(Some(answer));
        }
        loop {
            match this.answering.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok((id, answer)))) => {
                    this.running.remove(&id);
                    // One call's answer too large for a frame fails that call, not the stream.
                    if HEAD + answer.len() > MAX_FRAME_LEN {
                        tracing::error!(len = answer.len(), "RPC response exceeds the frame limit");
                        return Poll::Ready(Some(frame(TOO_LARGE, id, &[])));
                    }
                    return Poll::Ready(Some(frame(ANSWER, id, &answer)));
                }
                Poll::Ready(Some(Err(Aborted))) => {}
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::channel::mpsc::{UnboundedSender, unbounded};

    use super::*;

    /// Counts the handler futures dropped before they finished.
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Echoes a request at once, or never (`wait`), counting those dropped.
    fn serving(dropped: &Arc<AtomicUsize>) -> (UnboundedSender<Vec<u8>>, Frames) {
        let (requests, frames) = unbounded();
        let dropped = Arc::clone(dropped);
        let calls = Arc::new(Semaphore::new(MAX_CALLS));
        let answers = serve(frames.boxed(), calls, move |request| {
            if request == b"huge" {
                async move { vec![0; MAX_FRAME_LEN] }.boxed()
            } else if request == b"wait" {
                let guard = Dropped(Arc::clone(&dropped));
                async move {
                    let _guard = guard;
                    futures::future::pending().await
                }
                .boxed()
            } else {
                async move { request }.boxed()
            }
        });
        (requests, answers.boxed())
    }

    async fn next(answers: &mut Frames) -> Option<Vec<u8>> {
        tokio::time::timeout(Duration::from_secs(5), answers.next())
            .await
            .expect("an answer or the end in time")
    }

    /// Nothing more within a moment (the handler has had every chance to answer).
    async fn quiet(answers: &mut Frames) {
        let more = tokio::time::timeout(Duration::from_millis(50), answers.next()).await;
        assert!(more.is_err(), "{more:?}");
    }

    #[tokio::test]
    async fn asks_are_answered_as_they_finish_pings_at_once_and_a_cancel_drops_the_handler() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let (requests, mut answers) = serving(&dropped);
        requests.unbounded_send(frame(ASK, 1, b"wait")).unwrap();
        requests.unbounded_send(frame(ASK, 2, b"now")).unwrap();
        requests.unbounded_send(frame(PING, 3, &[])).unwrap();
        let mut got = vec![
            next(&mut answers).await.unwrap(),
            next(&mut answers).await.unwrap(),
        ];
        got.sort();
        assert_eq!(got, vec![frame(ANSWER, 2, b"now"), frame(ANSWER, 3, &[])]);
        quiet(&mut answers).await;
        requests.unbounded_send(frame(CANCEL, 1, &[])).unwrap();
        requests.unbounded_send(frame(CANCEL, 9, &[])).unwrap();
        requests.unbounded_send(frame(ASK, 1, b"again")).unwrap();
        assert_eq!(
            next(&mut answers).await.unwrap(),
            frame(ANSWER, 1, b"again")
        );
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the cancelled call's future"
        );
        // An answer too large for a frame fails its call alone.
        requests.unbounded_send(frame(ASK, 6, b"huge")).unwrap();
        assert_eq!(next(&mut answers).await.unwrap(), frame(TOO_LARGE, 6, &[]));
        requests.unbounded_send(frame(ASK, 7, b"after")).unwrap();
        assert_eq!(
            next(&mut answers).await.unwrap(),
            frame(ANSWER, 7, b"after")
        );
        // The caller leaving ends the answers, and drops every call still running.
        requests.unbounded_send(frame(ASK, 4, b"wait")).unwrap();
        requests.unbounded_send(frame(PING, 5, &[])).unwrap();
        assert_eq!(next(&mut answers).await.unwrap(), frame(ANSWER, 5, &[]));
        drop(requests);
        assert_eq!(next(&mut answers).await, None);
        drop(answers);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
    }

    /// A frame that breaks the format (too short, an unknown kind, an empty or a repeated
    /// ask, a cancel or ping with a payload) ends the stream, and drops every call on it.
    #[tokio::test]
    async fn a_malformed_or_repeated_request_ends_the_stream() {
        let breaking = [
            vec![ASK, 0, 0],
            frame(7, 1, b"x"),
            frame(ASK, 1, &[]),
            frame(ASK, 10, b"wait"),
            frame(CANCEL, 1, b"x"),
            frame(PING, 1, b"x"),
        ];
        for bad in breaking {
            let dropped = Arc::new(AtomicUsize::new(0));
            let (requests, mut answers) = serving(&dropped);
            requests.unbounded_send(frame(ASK, 10, b"wait")).unwrap();
            requests.unbounded_send(frame(PING, 11, &[])).unwrap();
            assert_eq!(next(&mut answers).await.unwrap(), frame(ANSWER, 11, &[]));
            requests.unbounded_send(bad.clone()).unwrap();
            assert_eq!(next(&mut answers).await, None, "{bad:?}");
            drop(answers);
            assert_eq!(dropped.load(Ordering::SeqCst), 1, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn beyond_its_calls_a_stream_refuses_an_ask_and_takes_the_next_once_one_ends() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let (requests, mut answers) = serving(&dropped);
        for id in 0..MAX_CALLS as u64 {
            requests.unbounded_send(frame(ASK, id, b"wait")).unwrap();
        }
        requests
            .unbounded_send(frame(ASK, u64::MAX, b"now"))
            .unwrap();
        assert_eq!(
            next(&mut answers).await.unwrap(),
            frame(BUSY, u64::MAX, &[])
        );
        requests.unbounded_send(frame(CANCEL, 0, &[])).unwrap();
        requests
            .unbounded_send(frame(ASK, u64::MAX, b"now"))
            .unwrap();
        assert_eq!(
            next(&mut answers).await.unwrap(),
            frame(ANSWER, u64::MAX, b"now")
        );
    }
}
