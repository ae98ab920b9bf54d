//! Evidence that the local agent died, for holders that must stop acting on a lock before
//! anyone else can be granted it. Sessions are bound to their agent's node: when the agent's
//! process dies the cluster frees their locks within about a second (gossip evidence), possibly
//! while the holder itself is still running.
//!
//! One task per [`Client`](super::Client) holds an idle connection to the agent's HTTP port (it
//! sends nothing, so the agent serves nothing; started with the first session a keeper holds).
//! When the agent's process exits the kernel closes that connection at once, and the task dials
//! again: a connection *refused* is the evidence — nothing listens on the port any more — and
//! every session kept through the client counts as lost ([`LossReason::AgentGone`]). A
//! connection the agent closed while alive (its idle timeout, its connection cap) is simply
//! dialled again. What is *not* evidence: a dial that times out or fails otherwise, and a held
//! connection that stays silent — a stopped (SIGSTOP), starved or slow agent still owns its
//! listening socket, the kernel still accepts for it, and the session's TTL decides as before.
//!
//! Only an agent on this host is watched (a loopback address, `localhost`, or a Unix socket):
//! from a remote address a refusal may come from a firewall or a balancer rather than the agent.
//! For `localhost`, a dial is refused only when every address it resolves to refuses. On a Unix
//! socket a dead agent's socket file either stays (the dial is refused) or is gone (not found):
//! both are evidence.
//!
//! The task counts refusals; a keeper notes the count when its session is created and counts
//! its session lost once it grows, so a refusal seen before the session existed (an agent that
//! has since restarted) never ends it.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::lost::{LossReason, LostTrigger};

/// Longest a dial may take; a dial that times out is no evidence.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before dialling again after a dial that failed (refused or otherwise).
const REDIAL: Duration = Duration::from_secs(1);
/// A held connection closed sooner than this after it opened was closed quickly: see [`pause`].
const SHORT_LIVED: Duration = Duration::from_secs(1);
/// The longest pause between quickly closed connections.
const MOST_PAUSE: Duration = Duration::from_secs(5);

/// The watching task of one client and the count of refusals it has seen.
pub(crate) struct AgentWatch {
    refusals: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl AgentWatch {
    /// Starts watching the agent at `base` (`scheme://host:port`), or on `unix_socket`, if it
    /// is on this host and a runtime is running; `None` otherwise.
    pub fn start(base: &str, unix_socket: Option<&Path>) -> Option<AgentWatch> {
        let url = reqwest::Url::parse(base).ok()?;
        let host = url.host_str()?.to_owned();
        let port = url.port_or_known_default()?;
        if unix_socket.is_none() && !super::process::is_local(base) {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tx, refusals) = watch::channel(0);
        let unix_socket = unix_socket.map(Path::to_owned);
        let target = format!("{host}:{port}");
        let task = runtime.spawn(async move {
            let endpoint = match unix_socket {
                Some(path) => Endpoint::Unix(path),
                None => match loopback_addrs(&target).await {
                    Some(addrs) => Endpoint::Tcp(addrs),
                    None => {
                        tracing::debug!(%target, "agent address not on this host; not watched");
                        return;
                    }
                },
            };
            watch_agent(&endpoint, &tx).await;
        });
        Some(AgentWatch { refusals, task })
    }

    /// A subscription that completes at the next refusal from now on.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        let mut refusals = self.refusals.clone();
        refusals.mark_unchanged();
        refusals
    }
}

impl Drop for AgentWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Fires `trigger` with [`LossReason::AgentGone`] at the first refusal `refusals` reports; ends
/// without firing if the watch stops.
pub(crate) async fn lose_on_refusal(mut refusals: watch::Receiver<u64>, trigger: LostTrigger) {
    if refusals.changed().await.is_ok() {
        trigger.fire(LossReason::AgentGone);
    }
}

/// What `target` resolves to, kept only if every address is a loopback one.
async fn loopback_addrs(target: &str) -> Option<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(target).await.ok()?.collect();
    (!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())).then_some(addrs)
}

/// Where the agent listens.
enum Endpoint {
    /// Every address its host name resolves to (all loopback).
    Tcp(Vec<SocketAddr>),
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(addrs) => match addrs.first() {
                Some(addr) => write!(f, "{addr}"),
                None => f.write_str("-"),
            },
            Endpoint::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

/// A held connection to the agent.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// What one dial found.
enum Dial {
    Open(Conn),
    /// Nothing listens: every address refused, or the socket file is gone.
    Refused,
    /// No evidence either way (a timeout, no descriptors left, …).
    Failed(io::Error),
}

impl Dial {
    fn of(result: Result<io::Result<Conn>, tokio::time::error::Elapsed>) -> Dial {
        match result {
            Ok(Ok(conn)) => Dial::Open(conn),
            Ok(Err(e)) if is_refusal(&e) => Dial::Refused,
            Ok(Err(e)) => Dial::Failed(e),
            Err(_) => Dial::Failed(io::Error::from(io::ErrorKind::TimedOut)),
        }
    }
}

/// Whether a failed connect proves that nothing listens: refused, or (a Unix socket) no
/// socket file at all.
fn is_refusal(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
    )
}

async fn dial(endpoint: &Endpoint) -> Dial {
    match endpoint {
        Endpoint::Unix(path) => {
            let connect = async { UnixStream::connect(path).await.map(Conn::Unix) };
            Dial::of(tokio::time::timeout(DIAL_TIMEOUT, connect).await)
        }
        Endpoint::Tcp(addrs) => {
            let mut failure = None;
            for addr in addrs {
                let connect = async { TcpStream::connect(addr).await.map(Conn::Tcp) };
                match Dial::of(tokio::time::timeout(DIAL_TIMEOUT, connect).await) {
                    Dial::Open(conn) => return Dial::Open(conn),
                    Dial::Refused => {}
                    Dial::Failed(e) => failure = Some(e),
                }
            }
            failure.map_or(Dial::Refused, Dial::Failed)
        }
    }
}

/// Holds a connection to the agent, dials again whenever it closes, and counts refused dials
/// in `refusals`. Runs until aborted.
async fn watch_agent(endpoint: &Endpoint, refusals: &watch::Sender<u64>) {
    let mut quick_closes = 0;
    // Refusals since the last open connection: only the first is worth a warning.
    let mut refused = 0;
    loop {
        match dial(endpoint).await {
            Dial::Open(mut conn) => {
                refused = 0;
                let opened = Instant::now();
                until_closed(&mut conn).await;
                quick_closes = if opened.elapsed() < SHORT_LIVED {
                    quick_closes + 1
                } else {
                    0
                };
                tokio::time::sleep(pause(quick_closes)).await;
            }
            Dial::Refused => {
                if refused == 0 {
                    tracing::warn!(agent = %endpoint,
                        "the agent refused a connection: it is gone, and so are the locks held through it");
                }
                refused += 1;
                refusals.send_modify(|n| *n += 1);
                tokio::time::sleep(REDIAL).await;
            }
            Dial::Failed(e) => {
                tracing::debug!(agent = %endpoint, error = %e, "dialling the agent failed; no evidence");
                tokio::time::sleep(REDIAL).await;
            }
        }
    }
}

/// Reads until the agent closes the connection (it never speaks first; whatever it sends
/// before closing, a 429 at its connection cap say, is ignored).
async fn until_closed(conn: &mut Conn) {
    let mut buf = [0u8; 512];
    loop {
        let read = match conn {
            Conn::Tcp(stream) => stream.read(&mut buf).await,
            Conn::Unix(stream) => stream.read(&mut buf).await,
        };
        if !matches!(read, Ok(n) if n > 0) {
            return;
        }
    }
}

/// The pause before dialling again after `quick_closes` connections in a row were closed
/// quickly. The first is dialled again at once: as the agent's process exits, its listening
/// socket may outlive the held connection by a moment and accept one more, which the kernel
/// then resets. Later ones back off, so an agent that keeps closing (its cap reached) is not
/// hammered.
fn pause(quick_closes: u32) -> Duration {
    match quick_closes {
        0 | 1 => Duration::ZERO,
        n => (Duration::from_millis(10) * 2u32.pow((n - 2).min(9))).min(MOST_PAUSE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn quick_closes_back_off_up_to_a_limit() {
        assert_eq!(pause(0), Duration::ZERO);
        assert_eq!(pause(1), Duration::ZERO);
        assert_eq!(pause(2), Duration::from_millis(10));
        assert_eq!(pause(3), Duration::from_millis(20));
        assert_eq!(pause(40), MOST_PAUSE);
    }

    /// A watch of a listener on loopback, with one subscription.
    async fn watched(listener: &TcpListener) -> (AgentWatch, watch::Receiver<u64>) {
        let base = format!("http://{}", listener.local_addr().unwrap());
        let watch = AgentWatch::start(&base, None).expect("a loopback agent is watched");
        let refusals = watch.subscribe();
        (watch, refusals)
    }

    #[tokio::test]
    async fn a_closed_listener_is_evidence_and_an_idle_close_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_watch, mut refusals) = watched(&listener).await;

        // The agent closes the held connection while it still listens: dialled again, no loss.
        let (held, _) = listener.accept().await.unwrap();
        drop(held);
        let (held, _) = listener.accept().await.unwrap();
        assert!(!refusals.has_changed().unwrap());

        // Its process exits: connection and listener close together, and the redial is refused.
        drop((held, listener));
        tokio::time::timeout(Duration::from_secs(5), refusals.changed())
            .await
            .expect("a refusal reported at once")
            .unwrap();
    }

    #[tokio::test]
    async fn a_silent_agent_is_no_evidence() {
        // A listener that never accepts is what a stopped agent looks like: the kernel completes
        // the dial, and the connection then stays silent.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_watch, mut refusals) = watched(&listener).await;
        let waited = tokio::time::timeout(Duration::from_millis(500), refusals.changed()).await;
        assert!(waited.is_err(), "a silent agent counted as gone");
        drop(listener);
        tokio::time::timeout(Duration::from_secs(5), refusals.changed())
            .await
            .expect("refused once it is gone")
            .unwrap();
    }

    #[tokio::test]
    async fn a_unix_socket_left_behind_or_removed_is_evidence() {
        let dir = tempfile_dir();
        let path = dir.join("http.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let watch = AgentWatch::start("http://localhost", Some(&path)).unwrap();
        let mut refusals = watch.subscribe();
        let (held, _) = listener.accept().await.unwrap();

        // A killed agent leaves its socket file: the dial is refused.
        drop((held, listener));
        tokio::time::timeout(Duration::from_secs(5), refusals.changed())
            .await
            .expect("a refusal reported at once")
            .unwrap();

        // Removed (a clean exit): not found, which is evidence too.
        std::fs::remove_file(&path).unwrap();
        tokio::time::timeout(Duration::from_secs(5), refusals.changed())
            .await
            .expect("the missing socket reported")
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fresh directory for a socket (short enough for a socket path).
    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vigil-liveness-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn remote_agents_are_not_watched() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        assert!(AgentWatch::start("http://10.0.0.5:8500", None).is_none());
        assert!(AgentWatch::start("http://127.0.0.1:8500", None).is_some());
        let socket = Path::new("/run/vigil/http.sock");
        assert!(AgentWatch::start("http://localhost", Some(socket)).is_some());
    }
}
