//! Serving the HTTP API on its listeners: HTTP/1.1 (Consul's API speaks nothing else), in plain
//! text (`--http-addr`) or over TLS (`--https-addr`, the same router), with Consul's per-client
//! connection cap, a cap on all connections, a header timeout, and a graceful drain on shutdown.
//!
//! - **TLS**: the handshake runs in the connection's own task, bounded by the header timeout,
//!   so a slow or silent client never holds up the accept loop. With `verify_incoming_https`
//!   the rustls config requires a client certificate signed by the CA and the handshake fails
//!   without one (see `vigil_wire::tls::TlsMaterial::https_server_config`).
//! - **Connections per client IP** (Consul's `limits.http_max_conns_per_client`, default 200):
//!   a connection over the cap gets Consul's `429 Too Many Requests` (written only if it fits
//!   the socket buffer at once) and is closed at once, so one client cannot use up the agent's
//!   file descriptors. 0 means no cap.
//! - **Connections in all** ([`Connections`], shared by both listeners, sized from the file
//!   descriptor limit by `crate::fds`): at the cap, a new connection closes the connection that
//!   has been idle (between requests, or never sent one) the longest, and is served; so idle
//!   connections from many addresses cannot lock clients out, nor leave raft and the snapshot
//!   files without descriptors. Only when every connection is in a request is the new one
//!   refused (`503`, written as the 429 is).
//! - **Header timeout**: a connection must deliver a complete request head within this long of
//!   being opened or of its previous response, else hyper closes it. It is therefore also the
//!   idle timeout of a keep-alive connection (Go's `http.Server` likewise falls back to its
//!   header timeout for idle connections). A request being handled (a blocking query) is not
//!   timed by it.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::Either;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixListener};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Api;

/// Consul's answer to a connection over the per-client cap (hashicorp/go-connlimit).
const TOO_MANY_CONNS: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\n\
Content-Type: text/plain\r\n\
Content-Length: 81\r\n\
Connection: close\r\n\r\n\
Your IP is issuing too many concurrent connections, please rate limit your calls\n";
/// The answer to a connection over the agent's cap while every connection is in a request.
const AGENT_FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain\r\n\
Content-Length: 57\r\n\
Connection: close\r\n\r\n\
The agent has too many open connections; try again later\n";
/// The accept queue asked for; the kernel caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = i32::MAX as u32;
/// Pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How the API's connections are bounded (defaults: the `vigil agent` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections one client IP may have; 0 for no cap.
    pub max_conns_per_client: usize,
    /// How long a connection may take to send a request head (and may stay idle).
    pub header_timeout: Duration,
}

/// The agent's open HTTP connections, counted per client IP and in all (both listeners share
/// one). A [`Slot`] is one of them, given back when dropped.
#[derive(Debug)]
pub struct Connections {
    /// Open connections in all at most (see the module documentation).
    max: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    per_ip: HashMap<IpAddr, usize>,
    total: usize,
    /// The idle connections by when they became idle (a counter), each with what closes it.
    idle: BTreeMap<u64, CancellationToken>,
    ticks: u64,
}

/// One open connection: counted until dropped, and listed as idle while it is between
/// requests.
struct Slot {
    connections: Arc<Connections>,
    ip: IpAddr,
    /// Its entry in the idle list while it has one.
    idle_since: Mutex<Option<u64>>,
    /// Cancelled when a newer connection needs its place, or the listener shuts down (a child
    /// of its token): a connection waits on this one token for both.
    evict: CancellationToken,
}

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Its client IP has `max_conns_per_client` open already.
    PerClient,
    /// The agent has its cap open and none of them is idle.
    Full,
}

impl Connections {
    /// Connections for an agent that holds `max` at most, whatever the client.
    pub fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max,
            table: Mutex::new(Table::default()),
        })
    }

    /// Takes a slot for a connection from `ip`, which has `per_client` at most (0: no cap), on
    /// a listener that closes its connections when `shutdown` is cancelled. At the agent's cap,
    /// the connection idle the longest is told to close instead.
    fn take(
        self: &Arc<Connections>,
        ip: IpAddr,
        per_client: usize,
        shutdown: &CancellationToken,
    ) -> Result<Arc<Slot>, Refusal> {
        let mut table = self.table.lock();
        let open = table.per_ip.get(&ip).copied().unwrap_or(0);
        if per_client > 0 && open >= per_client {
            return Err(Refusal::PerClient);
        }
        if table.total >= self.max {
            let Some((_, oldest)) = table.idle.pop_first() else {
                return Err(Refusal::Full);
            };
            oldest.cancel();
            vigil_server::telemetry::http_connection_shed("evicted_idle");
        }
        *table.per_ip.entry(ip).or_default() += 1;
        table.total += 1;
        vigil_server::telemetry::http_connections(table.total);
        let slot = Arc::new(Slot {
            connections: Arc::clone(self),
            ip,
            idle_since: Mutex::new(None),
            evict: shutdown.child_token(),
        });
        slot.idle_in(&mut table);
        Ok(slot)
    }
}

impl Slot {
    /// Lists the connection as idle (it is waiting for a request).
    fn idle(&self) {
        let mut table = self.connections.table.lock();
        self.idle_in(&mut table);
    }

    fn idle_in(&self, table: &mut Table) {
        let mut since = self.idle_since.lock();
        if since.is_none() && !self.evict.is_cancelled() {
            table.ticks += 1;
            table.idle.insert(table.ticks, self.evict.clone());
            *since = Some(table.ticks);
        }
    }

    /// Takes the connection off the idle list (a request is being handled).
    fn busy(&self) {
        let mut table = self.connections.table.lock();
        if let Some(tick) = self.idle_since.lock().take() {
            table.idle.remove(&tick);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.connections.table.lock();
        if let Some(tick) = self.idle_since.lock().take() {
            table.idle.remove(&tick);
        }
        table.total -= 1;
        if let Some(n) = table.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                table.per_ip.remove(&self.ip);
            }
        }
        vigil_server::telemetry::http_connections(table.total);
    }
}

/// The API as hyper calls it, telling the connection's [`Slot`] when it is in a request
/// (until the response head is ready; a body still streaming out counts as idle, and closing
/// such a connection gracefully lets the body finish first). It calls the API itself rather
/// than through `hyper_util`'s tower adapter, whose future keeps room for a router and a
/// request beside the API's own: a waiting blocking query holds this future.
struct Tracked {
    api: Api,
    slot: Arc<Slot>,
}

type Request = hyper::Request<hyper::body::Incoming>;
type Answer = axum::response::Response;

impl hyper::service::Service<Request> for Tracked {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, request: Request) -> Self::Future {
        self.slot.busy();
        let slot = Arc::clone(&self.slot);
        // A combinator, not an `async` block: a block would keep the API's future twice, as
        // what it captured and as what it awaits.
        let answer = self.api.answer(request.map(axum::body::Body::new));
        Box::pin(answer.map(move |answer| {
            slot.idle();
            Ok(answer)
        }))
    }
}

/// Serves `api` on `listener` until `shutdown`, then lets open requests finish. With `tls`
/// every connection is a TLS one (HTTPS). `connections` counts them with the other
/// listener's.
pub async fn serve(
    listener: TcpListener,
    api: Api,
    limits: ConnLimits,
    tls: Option<TlsAcceptor>,
    connections: Arc<Connections>,
    shutdown: CancellationToken,
) {
    let tasks = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let slot = match connections.take(peer.ip(), limits.max_conns_per_client, &shutdown) {
            Ok(slot) => slot,
            Err(refusal) => {
                refuse(stream, peer, refusal);
                continue;
            }
        };
        let api = api.clone();
        let tls = tls.clone();
        // Every open connection is a task: a plain one holds only what plain HTTP needs, the
        // TLS session and handshake state (several times larger) are boxed on their own. The
        // task is the connection's future itself, not an `async` block around it, which would
        // keep what it captured beside the future it awaits.
        tasks.spawn(match tls {
            None => Either::Left(serve_connection(stream, api, limits, slot)),
            Some(acceptor) => Either::Right(Box::pin(serve_tls(
                stream, peer, acceptor, api, limits, slot,
            ))),
        });
    }
    tasks.close();
    tasks.wait().await;
}

/// Serves a TLS connection once its handshake is over (within the header timeout).
async fn serve_tls(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    api: Api,
    limits: ConnLimits,
    slot: Arc<Slot>,
) {
    let closing = slot.evict.clone();
    let handshake = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        () = closing.cancelled() => return,
    };
    match handshake {
        Ok(Ok(stream)) => serve_connection(stream, api, limits, slot).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// The answer for a connection that was not taken, written only if the socket takes it at
/// once; then the connection is closed (dropped).
fn refuse(stream: TcpStream, peer: SocketAddr, refusal: Refusal) {
    let (answer, reason) = match refusal {
        Refusal::PerClient => (TOO_MANY_CONNS, "client_cap"),
        Refusal::Full => (AGENT_FULL, "agent_cap"),
    };
    tracing::debug!(%peer, reason, "too many HTTP connections; closing");
    vigil_server::telemetry::http_connection_shed(reason);
    let _ = stream.try_write(answer);
}

/// A TCP listener on `addr` with the longest accept queue the kernel allows (it caps the
/// backlog at `net.core.somaxconn`, as Go's listeners, and so Consul's, ask): a burst of new
/// connections waits there to be accepted. With a short queue the kernel drops the handshakes
/// that overflow it, and a client that sends nothing first never learns that its connection
/// does not exist.
pub fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// A Unix socket listener at `path`; a socket left there by an earlier run is replaced, as
/// Consul replaces it (any other file is not touched, and binding fails).
pub fn bind_unix(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt as _;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}

/// Serves `api` on a Unix socket until `shutdown`, as [`serve`] does on TCP; its clients are
/// local processes with no address, so no per-client cap applies, but they count towards the
/// agent's (the header timeout applies too).
pub async fn serve_unix(
    listener: UnixListener,
    api: Api,
    limits: ConnLimits,
    connections: Arc<Connections>,
    shutdown: CancellationToken,
) {
    let tasks = TaskTracker::new();
    let local = IpAddr::from([127, 0, 0, 1]);
    loop {
        let stream = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed on the Unix socket");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let Ok(slot) = connections.take(local, 0, &shutdown) else {
            tracing::debug!("too many HTTP connections; closing one on the Unix socket");
            vigil_server::telemetry::http_connection_shed("agent_cap");
            continue;
        };
        tasks.spawn(serve_connection(stream, api.clone(), limits, slot));
    }
    tasks.close();
    tasks.wait().await;
}

/// Serves HTTP/1 on `stream` until its client leaves, or its slot's token (the listener's
/// shutdown, or an eviction) closes it gracefully. A plain function: the connection's task is
/// the future it returns, which keeps the connection (boxed), the token and the wait on it,
/// and nothing the connection was built from.
fn serve_connection<S>(
    stream: S,
    api: Api,
    limits: ConnLimits,
    slot: Arc<Slot>,
) -> impl Future<Output = ()> + Send + 'static
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let closing = slot.evict.clone();
    let service = Tracked { api, slot };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut conn = Box::pin(builder.serve_connection(TokioIo::new(stream), service));
    async move {
        let result = tokio::select! {
            result = conn.as_mut() => result,
            () = closing.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "HTTP connection ended with an error");
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;

    use super::*;

    #[test]
    fn slots_are_counted_per_ip_and_given_back() {
        let counts = Connections::new(10_000);
        let shutdown = CancellationToken::new();
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let first = counts.take(a, 2, &shutdown).expect("first");
        let second = counts.take(a, 2, &shutdown).expect("second");
        assert_eq!(counts.take(a, 2, &shutdown).err(), Some(Refusal::PerClient));
        let other = counts
            .take(b, 2, &shutdown)
            .expect("another IP has its own cap");
        drop(first);
        let again = counts
            .take(a, 2, &shutdown)
            .expect("a slot given back is free");
        drop((second, other, again));
        assert!(counts.table.lock().per_ip.is_empty());
        assert!(counts.table.lock().idle.is_empty());
        // 0: no cap.
        let many: Vec<Arc<Slot>> = (0..1000)
            .filter_map(|_| counts.take(a, 0, &shutdown).ok())
            .collect();
        assert_eq!(many.len(), 1000);
        // The listener's shutdown closes every connection through its slot's one token.
        shutdown.cancel();
        assert!(many.iter().all(|slot| slot.evict.is_cancelled()));
    }

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room() {
        let counts = Connections::new(3);
        let shutdown = CancellationToken::new();
        let ip = |n: u8| IpAddr::from([127, 0, 0, n]);
        let slots: Vec<Arc<Slot>> = (1..=3)
            .map(|n| counts.take(ip(n), 0, &shutdown).unwrap())
            .collect();
        // The oldest is in a request, so the second (idle the longest) is told to close.
        slots[0].busy();
        let fourth = counts.take(ip(4), 0, &shutdown).expect("room made");
        assert!(!slots[0].evict.is_cancelled());
        assert!(slots[1].evict.is_cancelled());
        assert!(!slots[2].evict.is_cancelled());
        // Idle again after its request, the first is now behind the third.
        slots[0].idle();
        let fifth = counts.take(ip(5), 0, &shutdown).expect("room made");
        assert!(slots[2].evict.is_cancelled());
        assert!(!slots[0].evict.is_cancelled());
        // Every connection in a request: the next is refused.
        for slot in [&slots[0], &fourth, &fifth] {
            slot.busy();
        }
        assert_eq!(counts.take(ip(6), 0, &shutdown).err(), Some(Refusal::Full));
        drop((slots, fourth, fifth));
        let table = counts.table.lock();
        assert_eq!((table.total, table.idle.len()), (0, 0));
    }

    /// A server of `router` on a port of its own, and what stops it.
    async fn serving(router: Router) -> (SocketAddr, CancellationToken) {
        let api = Api::new(router);
        let listener = bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnLimits {
            max_conns_per_client: 0,
            header_timeout: Duration::from_secs(30),
        };
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(
            listener,
            api,
            limits,
            None,
            Connections::new(100),
            shutdown.clone(),
        ));
        (addr, shutdown)
    }

    /// Reads one response with a `Content-Length` from `stream`: its status line and body.
    async fn response(stream: &mut TcpStream) -> (String, String) {
        tokio::time::timeout(Duration::from_secs(30), read_response(stream))
            .await
            .expect("an answer")
    }

    async fn read_response(stream: &mut TcpStream) -> (String, String) {
        use tokio::io::AsyncReadExt as _;
        let mut got = Vec::new();
        let mut byte = [0; 1];
        while !got.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed mid-head");
            got.push(byte[0]);
        }
        let head = String::from_utf8(got).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("a content-length")
            .parse()
            .unwrap();
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        let status = head.lines().next().unwrap().to_owned();
        (status, String::from_utf8(body).unwrap())
    }

    /// Answers with the length of the request's body and its path.
    fn echo() -> Router {
        Router::new().route(
            "/{*path}",
            axum::routing::any(|uri: axum::http::Uri, body: axum::body::Bytes| async move {
                format!("{} {}", uri.path(), body.len())
            }),
        )
    }

    // The connection's buffers are made only when bytes come (vendor/hyper): a head in pieces,
    // pipelined requests, a body larger than a buffer and a connection reused all read whole.
    #[tokio::test]
    async fn requests_in_pieces_pipelined_or_large_are_read_whole() {
        use tokio::io::AsyncWriteExt as _;
        let (addr, shutdown) = serving(echo()).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        for piece in ["GE", "T /a HTTP/1.1\r", "\nHost: x\r\n", "\r\n"] {
            stream.write_all(piece.as_bytes()).await.unwrap();
            stream.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(
            response(&mut stream).await,
            ("HTTP/1.1 200 OK".into(), "/a 0".into())
        );
        let pipelined = "GET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n";
        stream.write_all(pipelined.as_bytes()).await.unwrap();
        assert_eq!(response(&mut stream).await.1, "/b 0");
        assert_eq!(response(&mut stream).await.1, "/c 0");
        let body = vec![b'v'; 300_000];
        let head = format!(
            "PUT /d HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        for chunk in body.chunks(1000) {
            stream.write_all(chunk).await.unwrap();
        }
        assert_eq!(response(&mut stream).await.1, "/d 300000");
        shutdown.cancel();
    }

    // A request waiting (as a blocking query does) holds no read buffer, but still learns that
    // its client hung up: the handler is dropped.
    #[tokio::test]
    async fn a_waiting_request_whose_client_hangs_up_is_dropped() {
        use tokio::io::AsyncWriteExt as _;
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (dropped_tx, mut dropped) = tokio::sync::mpsc::unbounded_channel::<()>();
        struct OnDrop(tokio::sync::mpsc::UnboundedSender<()>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let router = Router::new().route(
            "/wait",
            axum::routing::get(move || {
                let (entered, dropped) = (entered_tx.clone(), OnDrop(dropped_tx.clone()));
                async move {
                    let _dropped = dropped;
                    let _ = entered.send(());
                    std::future::pending::<()>().await;
                }
            }),
        );
        let (addr, shutdown) = serving(router).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        entered.recv().await.unwrap();
        assert!(
            dropped.try_recv().is_err(),
            "dropped while its client waits"
        );
        drop(stream);
        tokio::time::timeout(Duration::from_secs(30), dropped.recv())
            .await
            .expect("the handler of a closed connection is dropped")
            .unwrap();
        shutdown.cancel();
    }

    #[test]
    fn the_refusals_are_well_formed() {
        for (answer, status) in [
            (TOO_MANY_CONNS, "429 Too Many Requests"),
            (AGENT_FULL, "503 Service Unavailable"),
        ] {
            let text = std::str::from_utf8(answer).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status}\r\n")));
            assert!(head.contains(&format!("Content-Length: {}", body.len())));
        }
    }
}
