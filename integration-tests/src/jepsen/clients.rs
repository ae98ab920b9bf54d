//! The checker's clients, which behave as real ones do: every request has a deadline and is
//! dropped (its connection with it) when it passes, and the next one goes to the next agent on
//! a new connection; an acquire whose answer was lost is asked again at once. Three kinds:
//! register clients (reads in every consistency mode, writes and cas on a few KV keys, each
//! recorded for the linearizability check), lock clients (a Consul-style KV lock or the lock
//! queue, guarding a fenced counter, one session reused for a second lock in another mode, and
//! now and then a holder that stalls past its session's TTL), and session clients (TTL sessions
//! renewed on time, which must never be invalidated early).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use vigil_client::{Client, ClientConfig, QueueOptions, ReadOpts, SessionRequest};
use vigil_shared::lock::LockMode;
use vigil_shared::vigil_api::NotAcquired;

use super::fence::Fenced;
use super::linear::{Input, Op, Output};
use crate::safety::register::{AgentBoard, client as agent_client};
use crate::safety::schedule::Rng;

/// What every client shares: where the agents are, the run's clock, and when to stop.
#[derive(Clone)]
pub struct Ctx {
    pub board: AgentBoard,
    pub config: ClientConfig,
    pub started: Instant,
    pub stop: watch::Receiver<bool>,
    /// A request not answered within this long is dropped.
    pub deadline: Duration,
}

impl Ctx {
    /// Nanoseconds since the run began.
    pub fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps `d`, or less if the run stops meanwhile.
    async fn pause(&self, d: Duration) {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(d) => {}
        }
    }
}

/// One client's way to the agents: the agent it uses now, a connection pool per agent, and a
/// move to the next agent (with fresh connections) after a request that failed.
struct Conn {
    turn: usize,
    /// Only these agents (indexes on the board); all when empty.
    pinned: Vec<usize>,
    clients: HashMap<String, Client>,
}

impl Conn {
    fn new(first: usize, pinned: Vec<usize>) -> Conn {
        Conn {
            turn: first,
            pinned,
            clients: HashMap::new(),
        }
    }

    /// The agent to ask now, if any is up.
    fn pick(&mut self, cx: &Ctx) -> Option<Client> {
        let base = if self.pinned.is_empty() {
            let up = cx.board.up();
            (!up.is_empty()).then(|| up[self.turn % up.len()].clone())?
        } else {
            cx.board.get(self.pinned[self.turn % self.pinned.len()])?
        };
        Some(
            self.clients
                .entry(base.clone())
                .or_insert_with(|| agent_client(&cx.config, &base))
                .clone(),
        )
    }

    /// The last request failed: its connections are dropped and the next agent is asked.
    fn failed(&mut self) {
        self.clients.clear();
        self.turn += 1;
    }
}

/// The history of one register key, as its clients saw it.
pub type History = Arc<Mutex<Vec<Op>>>;

/// How a register client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// Default and `?consistent` reads (both must be linearizable).
    Linearizable,
    /// `?stale` reads only (the negative control: they are not).
    Stale,
}

/// Where a register key lives.
pub fn register_key(k: usize) -> String {
    format!("jepsen/register/{k}")
}

/// A register client: random reads, writes and cas on the keys of `histories` until the run
/// stops, each recorded with its call and return times.
pub async fn register_client(
    id: usize,
    cx: Ctx,
    histories: Arc<Vec<History>>,
    reads: Reads,
    pinned: Vec<usize>,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let mut conn = Conn::new(id, pinned);
    // The last value this client read of each key, with its ModifyIndex (cas's token).
    let mut seen: HashMap<usize, (Option<String>, u64)> = HashMap::new();
    let mut seq = 0u64;
    while !cx.stopped() {
        let Some(client) = conn.pick(&cx) else {
            cx.pause(Duration::from_millis(100)).await;
            continue;
        };
        let k = rng.below(histories.len() as u64) as usize;
        let key = register_key(k);
        seq += 1;
        let value = format!("c{id}-{seq}");
        let roll = rng.below(100);
        let call = cx.now();
        let (input, output) = if roll < 50 {
            let answer = match reads {
                Reads::Linearizable => {
                    let opts = if roll < 25 {
                        ReadOpts::default()
                    } else {
                        ReadOpts::default().consistent()
                    };
                    timeout(cx.deadline, client.kv_get(&key, opts))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|(entry, _)| entry)
                }
                Reads::Stale => timeout(
                    cx.deadline,
                    client.kv_get(&key, ReadOpts::default().stale()),
                )
                .await
                .ok()
                .and_then(Result::ok)
                .map(|(entry, _)| entry),
            };
            let output = answer.map(|entry| {
                let read = entry.map(|e| {
                    let value = String::from_utf8_lossy(&e.value).into_owned();
                    (value, e.modify_index)
                });
                seen.insert(
                    k,
                    read.as_ref()
                        .map_or((None, 0), |(v, i)| (Some(v.clone()), *i)),
                );
                Output::Value(read.map(|(v, _)| v))
            });
            (Input::Read, output)
        } else if roll < 80 {
            let answer = timeout(cx.deadline, client.kv_put(&key, value.as_bytes(), 0)).await;
            let output = matches!(answer, Ok(Ok(true))).then_some(Output::Written);
            (Input::Write(value), output)
        } else {
            let (expected, index) = seen.get(&k).cloned().unwrap_or((None, 0));
            let answer =
                timeout(cx.deadline, client.kv_cas(&key, value.as_bytes(), 0, index)).await;
            let output = match answer {
                Ok(Ok(applied)) => Some(Output::Applied(applied)),
                _ => None,
            };
            (
                Input::Cas {
                    expected,
                    new: value,
                },
                output,
            )
        };
        let ret = output.is_some().then(|| cx.now());
        if output.is_none() {
            conn.failed();
        }
        // A read with no answer tells nothing; everything else is kept.
        if !(input == Input::Read && output.is_none()) {
            histories[k].lock().push(Op {
                client: id,
                input,
                output,
                call,
                ret,
            });
        }
        cx.pause(Duration::from_millis(rng.below(20))).await;
    }
}

/// Which lock a lock client takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// A Consul-style lock: `?acquire=` on a key; the token is its LockIndex.
    Kv,
    /// The server-side lock queue; the token is the grant's.
    Queue,
}

impl LockKind {
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Kv => "KV lock",
            LockKind::Queue => "queue lock",
        }
    }
}

const KV_LOCK: &str = "jepsen/kv-lock";
const QUEUE_LOCK: &str = "jepsen/queue-lock";
/// The second lock a queue client's session takes, shared, while it holds the first.
const SHARED_LOCK: &str = "jepsen/shared-lock";
/// A lock client's session TTL: a holder that stalls longer than twice this loses it.
const LOCK_TTL: Duration = Duration::from_secs(2);
/// A lock client's session lock-delay.
const LOCK_DELAY: Duration = Duration::from_secs(1);
/// How long a stalling holder stalls: past its session's expiry (TTL × 2 on the leader), the
/// lock-delay, and time for the next holder to reach the resource.
const STALL: Duration = Duration::from_secs(2 * 2 + 1 + 2);

/// What one lock client saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct LockLog {
    pub grants: u64,
    /// Acquire requests that got no answer (dropped and asked again).
    pub retried: u64,
    /// Holds in which the holder stalled past its session's TTL.
    pub stalls: u64,
}

/// A session the client keeps alive from a task of its own (renewing every TTL / 4) until it
/// is told to stall, or finds the session gone.
struct KeptSession {
    id: String,
    stalled: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl KeptSession {
    async fn create(cx: &Ctx, conn: &mut Conn) -> Option<KeptSession> {
        let client = conn.pick(cx)?;
        let request = SessionRequest {
            name: "jepsen".to_owned(),
            node: None,
            ttl: Some(LOCK_TTL),
            lock_delay: Some(LOCK_DELAY),
            behavior: vigil_shared::session::Behavior::Release,
            node_checks: Some(Vec::new()),
            service_checks: None,
        };
        let Ok(Ok(id)) = timeout(cx.deadline, client.session_create(&request)).await else {
            conn.failed();
            return None;
        };
        let stalled = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = tokio::spawn({
            let (cx, id, stalled, lost) = (cx.clone(), id.clone(), stalled.clone(), lost.clone());
            async move {
                let mut conn = Conn::new(0, Vec::new());
                while !cx.stopped() && !lost.load(Ordering::Relaxed) {
                    cx.pause(LOCK_TTL / 4).await;
                    if stalled.load(Ordering::Relaxed) {
                        continue;
                    }
                    let Some(client) = conn.pick(&cx) else {
                        continue;
                    };
                    match timeout(cx.deadline, client.session_renew(&id)).await {
                        Ok(Ok(Some(_))) => {}
                        Ok(Ok(None)) => lost.store(true, Ordering::Relaxed),
                        _ => conn.failed(),
                    }
                }
            }
        });
        Some(KeptSession {
            id,
            stalled,
            lost,
            keeper,
        })
    }
}

impl Drop for KeptSession {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// A lock client: takes `kind`'s lock, increments `counter` through the fence with its token,
/// releases, again and again until the run stops. One hold in `stall_in` stalls (stops
/// renewing and sleeps past twice the TTL) before its write.
pub async fn lock_client(
    id: usize,
    kind: LockKind,
    cx: Ctx,
    counter: Arc<Fenced>,
    stall_in: u64,
    hold: Duration,
    seed: u64,
) -> LockLog {
    let mut rng = Rng::new(seed);
    let mut conn = Conn::new(id, Vec::new());
    let mut log = LockLog::default();
    let mut session: Option<KeptSession> = None;
    while !cx.stopped() {
        if session
            .as_ref()
            .is_none_or(|s| s.lost.load(Ordering::Relaxed))
        {
            session = KeptSession::create(&cx, &mut conn).await;
            if session.is_none() {
                cx.pause(Duration::from_millis(100)).await;
                continue;
            }
        }
        let s = session.as_ref().expect("a session");
        let Some(client) = conn.pick(&cx) else {
            cx.pause(Duration::from_millis(100)).await;
            continue;
        };
        let token = match kind {
            LockKind::Kv => kv_acquire(&cx, &client, &s.id).await,
            LockKind::Queue => queue_acquire(&cx, &client, &s.id).await,
        };
        let token = match token {
            Acquire::Held(token) => token,
            Acquire::NotNow => {
                cx.pause(Duration::from_millis(20 + rng.below(80))).await;
                continue;
            }
            Acquire::NoAnswer => {
                // Asked again at once, on another agent and a new connection.
                log.retried += 1;
                conn.failed();
                continue;
            }
        };
        log.grants += 1;
        if kind == LockKind::Queue {
            // The same session takes a second lock, shared, beside the first.
            let shared = QueueOptions {
                mode: LockMode::Shared,
                ..QueueOptions::new(SHARED_LOCK)
            };
            let _ = timeout(
                cx.deadline,
                client.lock_queue_acquire(&shared, &s.id, true, cx.deadline, None),
            )
            .await;
        }
        // The critical section: read, maybe stall, write one more, both with the token.
        if let Ok(value) = counter.read(token) {
            if stall_in > 0 && rng.below(stall_in) == 0 {
                log.stalls += 1;
                s.stalled.store(true, Ordering::Relaxed);
                cx.pause(STALL).await;
                s.stalled.store(false, Ordering::Relaxed);
            } else {
                cx.pause(hold).await;
            }
            let _ = counter.write(token, value + 1);
        }
        let release = async {
            match kind {
                LockKind::Kv => client.kv_release(KV_LOCK, b"", 0, &s.id).await.map(|_| ()),
                LockKind::Queue => {
                    let _ = client.lock_queue_release(SHARED_LOCK, &s.id).await;
                    client
                        .lock_queue_release(QUEUE_LOCK, &s.id)
                        .await
                        .map(|_| ())
                }
            }
        };
        if !matches!(timeout(cx.deadline, release).await, Ok(Ok(()))) {
            conn.failed();
        }
        cx.pause(Duration::from_millis(rng.below(30))).await;
    }
    log
}

/// How an acquire went.
enum Acquire {
    Held(u64),
    /// Taken by someone else, in lock-delay, or still queued.
    NotNow,
    /// No answer in time (the request was dropped).
    NoAnswer,
}

async fn kv_acquire(cx: &Ctx, client: &Client, session: &str) -> Acquire {
    match timeout(cx.deadline, client.kv_acquire(KV_LOCK, b"", 0, session)).await {
        Ok(Ok(a)) if a.acquired => {}
        Ok(Ok(_)) => return Acquire::NotNow,
        _ => return Acquire::NoAnswer,
    }
    // The token: the key's LockIndex while this session holds it (a linearizable read).
    match timeout(
        cx.deadline,
        client.kv_get(KV_LOCK, ReadOpts::default().consistent()),
    )
    .await
    {
        Ok(Ok((Some(entry), _))) if entry.session.as_deref() == Some(session) => {
            Acquire::Held(entry.lock_index)
        }
        Ok(Ok(_)) => Acquire::NotNow,
        _ => Acquire::NoAnswer,
    }
}

async fn queue_acquire(cx: &Ctx, client: &Client, session: &str) -> Acquire {
    // The agent holds the request for up to twice the client's own deadline, so a waiting
    // request is often dropped by the client and asked again (the retry must keep its place,
    // and never lead to a double grant).
    let opts = QueueOptions::new(QUEUE_LOCK);
    let wait = cx.deadline * 2;
    match timeout(
        cx.deadline,
        client.lock_queue_acquire(&opts, session, false, wait, None),
    )
    .await
    {
        Ok(Ok(reply)) if reply.acquired => reply.token.map_or(Acquire::NotNow, Acquire::Held),
        Ok(Ok(reply)) if reply.reason == Some(NotAcquired::Queued) => Acquire::NotNow,
        Ok(Ok(_)) => Acquire::NotNow,
        _ => Acquire::NoAnswer,
    }
}

/// What the session clients saw.
#[derive(Debug, Default, Clone)]
pub struct SessionLog {
    pub renewals: u64,
    /// Sessions found gone although renewed less than a TTL before (the TTL is a lower bound).
    pub early: Vec<String>,
}

/// How a session client keeps its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSpec {
    /// The TTL the sessions are created with.
    pub ttl: Duration,
    /// The TTL the client holds the servers to (the negative control asks for less).
    pub promised: Duration,
    pub renew_every: Duration,
}

impl SessionSpec {
    /// TTL 2 s, renewed every half second.
    pub const HONEST: SessionSpec = SessionSpec {
        ttl: Duration::from_secs(2),
        promised: Duration::from_secs(2),
        renew_every: Duration::from_millis(500),
    };
    /// The negative control: sessions of 1 s (which the leader expires 2 s after a renewal)
    /// held to 3 s and renewed every 2.4 s, so each is found gone "early".
    pub const SHORTENED: SessionSpec = SessionSpec {
        ttl: Duration::from_secs(1),
        promised: Duration::from_secs(3),
        renew_every: Duration::from_millis(2400),
    };
}

/// A session client: a TTL session with no checks, renewed every `spec.renew_every`; a renewal
/// that finds it gone less than the promised TTL after the last renewal that was asked and
/// acknowledged is an early invalidation.
pub async fn session_client(id: usize, cx: Ctx, spec: SessionSpec) -> SessionLog {
    let mut conn = Conn::new(id, Vec::new());
    let mut log = SessionLog::default();
    let mut current: Option<(String, u64)> = None;
    while !cx.stopped() {
        let Some(client) = conn.pick(&cx) else {
            cx.pause(Duration::from_millis(100)).await;
            continue;
        };
        let Some((session, renewed_at)) = current.clone() else {
            let request = SessionRequest {
                name: format!("jepsen-ttl-{id}"),
                node: None,
                ttl: Some(spec.ttl),
                lock_delay: Some(Duration::ZERO),
                behavior: vigil_shared::session::Behavior::Release,
                node_checks: Some(Vec::new()),
                service_checks: None,
            };
            let call = cx.now();
            match timeout(cx.deadline, client.session_create(&request)).await {
                Ok(Ok(session)) => current = Some((session, call)),
                _ => conn.failed(),
            }
            continue;
        };
        cx.pause(spec.renew_every).await;
        if cx.stopped() {
            break;
        }
        let call = cx.now();
        match timeout(cx.deadline, client.session_renew(&session)).await {
            Ok(Ok(Some(_))) => {
                log.renewals += 1;
                current = Some((session, call));
            }
            Ok(Ok(None)) => {
                let found_gone = cx.now();
                if found_gone < renewed_at + spec.promised.as_nanos() as u64 {
                    log.early.push(format!(
                        "session {session} was gone {:.3} s after a renewal asked at {:.3} s (TTL {:?})",
                        found_gone as f64 / 1e9,
                        renewed_at as f64 / 1e9,
                        spec.promised
                    ));
                }
                current = None;
            }
            _ => conn.failed(),
        }
    }
    log
}
