//! The async HTTP client for a Vigil (or Consul) agent: KV, sessions, txn and blocking queries
//! over one pooled `reqwest` client, plus the recipes built on them — a session keeper, [`Lock`]
//! (`api.Lock`), [`Semaphore`] (`api.Semaphore`), [`Election`], the server-side queue's
//! [`LockQueue`], [`FairMutex`] and [`RwLock`], and the etcd-style [`KvFairMutex`] for a plain
//! Consul server. Every acquisition returns a [`Held`] whose `lost()` resolves once the lock is
//! no longer held. It speaks HTTP only and links neither the agent nor the server; the bodies it
//! reads are `vigil_shared`'s types, and what its recipes write to KV is `vigil_shared::recipe`.
//!
//! Invariants: a blocking read carries the last `X-Consul-Index` forward ([`next_wait_index`]);
//! every session a recipe creates is destroyed when its holder is released or dropped (drops
//! queue the cleanup on the client; [`Client::drain_cleanups`] waits for it before exiting).

mod agent;
mod config;
mod election;
mod error;
mod fair;
mod held;
mod keeper;
mod kv;
mod liveness;
mod lock;
mod lost;
pub mod path;
mod process;
mod queue;
mod recipe;
mod semaphore;
mod session;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::Method;
use reqwest::header::HeaderMap;
use vigil_shared::vigil_api::{HistoryReport, LocksReport};

pub use config::{ClientConfig, Token};
pub use election::{Election, Leader};
pub use error::ClientError;
pub use fair::{FairStep, KvFairMutex, KvFairOptions, fair_step};
pub use held::{Held, HeldKind};
pub use keeper::SessionKeeper;
pub use kv::{Acquired, TxnReply};
use liveness::AgentWatch;
pub use lock::{Lock, LockOptions};
pub use lost::{LossReason, LostSignal};
pub use queue::{FairMutex, LockQueue, QueueOptions, RwLock};
pub use recipe::RecipeSession;
pub use semaphore::{Semaphore, SemaphoreOptions};
pub use session::SessionRequest;
pub use vigil_shared::recipe::{
    FAIR_FLAG_VALUE, LOCK_FLAG_VALUE, SEMAPHORE_FLAG_VALUE, SEMAPHORE_KEY, SemaphoreLock,
};

/// Where client commands find the agent when no environment variable says otherwise.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8500";
/// How long a non-blocking request may take before it counts as failed.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// A blocking read without an explicit wait blocks this long on the server (Consul's default).
const DEFAULT_BLOCKING_WAIT: Duration = Duration::from_secs(300);

/// Options of one read: the index to block past (0: answer at once), how long, and whether the
/// leader must confirm its leadership first (`?consistent`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOpts {
    pub index: u64,
    pub wait: Option<Duration>,
    pub consistent: bool,
    /// Any server may answer from its own state (`?stale`, Go's `AllowStale`).
    pub stale: bool,
}

impl ReadOpts {
    /// A blocking read past `index` for at most `wait` (non-blocking when `index` is 0).
    pub fn blocking(index: u64, wait: Duration) -> ReadOpts {
        ReadOpts {
            index,
            wait: Some(wait),
            consistent: false,
            stale: false,
        }
    }

    pub fn consistent(mut self) -> ReadOpts {
        self.consistent = true;
        self
    }

    pub fn stale(mut self) -> ReadOpts {
        self.stale = true;
        self
    }
}

/// The read headers: `X-Consul-Index` (floored to 1), `X-Consul-KnownLeader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryMeta {
    pub index: u64,
    pub known_leader: bool,
}

/// The index for the next blocking read after one returned `returned` (Consul's client rules):
/// carry it forward, reset to 0 when it went backwards (snapshot restore, reaped tombstone), and
/// never block on 0.
pub fn next_wait_index(previous: u64, returned: u64) -> u64 {
    if returned < previous {
        0
    } else {
        returned.max(1)
    }
}

/// One agent's HTTP API. Cheap to clone; clones share the connection pool, the counters of
/// requests sent and blocking-query returns, and the queue of pending cleanups.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// `http://host:port`, no trailing slash.
    base: String,
    /// The agent's Unix socket, when it is reached through one (`base` is then
    /// `http://localhost`).
    unix_socket: Option<PathBuf>,
    /// Requests sent through [`Client::send`]: every call of the API and the recipes.
    requests_sent: AtomicU64,
    /// Blocking reads (index > 0) and waiting queue acquisitions that returned, for measuring
    /// wakeups.
    blocking_returns: AtomicU64,
    /// Cleanups queued by dropped holders (release, delete, session destroy).
    cleanups: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Sent as `X-Consul-Token` on every request, as Consul's clients do with `-token`.
    token: Option<Token>,
    /// Whether the agent has died, watched from the first session a keeper holds (only for an
    /// agent on this host; see [`liveness`]).
    agent_watch: Mutex<Option<AgentWatch>>,
}

/// A raw answer.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    /// The reply itself when it is a 200; any other status is the API's error.
    fn ok(self) -> Result<Reply, ClientError> {
        if self.status == 200 {
            Ok(self)
        } else {
            Err(ClientError::api(&self))
        }
    }

    /// The body as JSON.
    fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, ClientError> {
        serde_json::from_slice(&self.body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim_end().to_owned()
    }

    fn meta(&self) -> QueryMeta {
        let header = |name: &str| self.headers.get(name).and_then(|v| v.to_str().ok());
        QueryMeta {
            index: header("X-Consul-Index")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                .max(1),
            known_leader: header("X-Consul-KnownLeader") == Some("true"),
        }
    }
}

impl Client {
    /// A client for the agent at `addr` (`host:port` or `http://host:port`), with no token and
    /// no TLS files: HTTPS and tokens go through [`ClientConfig`].
    pub fn new(addr: &str) -> Result<Client, ClientError> {
        ClientConfig {
            addr: Some(addr.to_owned()),
            ..ClientConfig::default()
        }
        .build()
    }

    /// Assembles a client; [`ClientConfig::build`] is the one caller.
    fn from_parts(
        http: reqwest::Client,
        base: String,
        unix_socket: Option<PathBuf>,
        token: Option<Token>,
    ) -> Client {
        Client {
            inner: Arc::new(Inner {
                http,
                base,
                unix_socket,
                requests_sent: AtomicU64::new(0),
                blocking_returns: AtomicU64::new(0),
                cleanups: Mutex::new(Vec::new()),
                token,
                agent_watch: Mutex::new(None),
            }),
        }
    }

    /// The same agent, with `token` sent as `X-Consul-Token` on every request.
    pub fn with_token(&self, token: &str) -> Client {
        Client::from_parts(
            self.inner.http.clone(),
            self.inner.base.clone(),
            self.inner.unix_socket.clone(),
            Token::new(token),
        )
    }

    /// The agent, TLS files and token the environment names (`VIGIL_HTTP_ADDR`, else
    /// `CONSUL_HTTP_ADDR`, else 127.0.0.1:8500; see [`ClientConfig`]).
    pub fn from_env() -> Result<Client, ClientError> {
        ClientConfig::default().from_env()?.build()
    }

    /// `http://host:port` (or `https://…`) of the agent.
    pub fn base(&self) -> &str {
        &self.inner.base
    }

    /// How many requests the API calls and recipes of this client and its clones have sent
    /// (not those built with [`Client::request`]).
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests_sent.load(Ordering::Relaxed)
    }

    /// How many blocking reads (index > 0) and waiting queue acquisitions have returned through
    /// this client and its clones.
    pub fn blocking_returns(&self) -> u64 {
        self.inner.blocking_returns.load(Ordering::Relaxed)
    }

    /// Runs `cleanup` in the background; [`Client::drain_cleanups`] waits for it.
    pub(crate) fn spawn_cleanup(
        &self,
        cleanup: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let handle = runtime.spawn(cleanup);
        let mut queue = self.inner.cleanups.lock();
        queue.retain(|h| !h.is_finished());
        queue.push(handle);
    }

    /// Waits (at most `limit`) for cleanups queued by dropped holders: call before exiting.
    pub async fn drain_cleanups(&self, limit: Duration) {
        let pending: Vec<_> = {
            let mut queue = self.inner.cleanups.lock();
            std::mem::take(&mut *queue)
        };
        let all = futures::future::join_all(pending);
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// A request to any endpoint (`path_and_query` already encoded) through this client's
    /// connection pool, TLS settings and token, for callers that need the raw answer (a
    /// streamed log, a snapshot's bytes). Sets no timeout.
    pub fn request(&self, method: Method, path_and_query: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path_and_query}", self.inner.base);
        let request = self.inner.http.request(method, url);
        match &self.inner.token {
            Some(token) => match reqwest::header::HeaderValue::from_str(token.secret()) {
                Ok(mut value) => {
                    // Kept out of any debug output of the HTTP stack.
                    value.set_sensitive(true);
                    request.header("X-Consul-Token", value)
                }
                // A token that cannot be a header value is not sent (nor printed).
                Err(_) => request,
            },
            None => request,
        }
    }

    /// Sends one request; `path_and_query` is already encoded.
    pub(crate) async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Reply, ClientError> {
        self.send_with(method, path_and_query, body, timeout, &[])
            .await
    }

    /// [`Client::send`] with more request headers, `(name, value)`.
    pub(crate) async fn send_with(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
        headers: &[(&'static str, String)],
    ) -> Result<Reply, ClientError> {
        let mut request = self.request(method, path_and_query).timeout(timeout);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let unreachable = |source: reqwest::Error| ClientError::Unreachable {
            addr: self.inner.base.clone(),
            source,
        };
        self.inner.requests_sent.fetch_add(1, Ordering::Relaxed);
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(unreachable)?.to_vec();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// A subscription that completes when the agent next refuses a connection (see
    /// [`liveness`]), starting the watch if needed; `None` when the agent is not on this host.
    pub(crate) fn agent_refusals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        let mut watch = self.inner.agent_watch.lock();
        if watch.is_none() {
            *watch = AgentWatch::start(&self.inner.base, self.inner.unix_socket.as_deref());
        }
        watch.as_ref().map(AgentWatch::subscribe)
    }

    pub(crate) fn count_blocking_return(&self) {
        self.inner.blocking_returns.fetch_add(1, Ordering::Relaxed);
    }

    /// A GET with the read options applied; 200 and 404 are both answers.
    pub(crate) async fn read(
        &self,
        path: &str,
        query: &[(&str, String)],
        opts: &ReadOpts,
    ) -> Result<(Reply, QueryMeta), ClientError> {
        let mut pairs: Vec<(&str, String)> = query.to_vec();
        if opts.consistent {
            pairs.push(("consistent", String::new()));
        }
        if opts.stale {
            pairs.push(("stale", String::new()));
        }
        let blocking = opts.index > 0;
        let mut timeout = REQUEST_TIMEOUT;
        if blocking {
            let wait = opts.wait.unwrap_or(DEFAULT_BLOCKING_WAIT);
            pairs.push(("index", opts.index.to_string()));
            // As the Go client sends it: whole milliseconds.
            pairs.push(("wait", format!("{}ms", wait.as_millis())));
            // The server adds up to wait/16 of jitter.
            timeout = wait + wait / 16 + REQUEST_TIMEOUT;
        }
        let reply = self
            .send(Method::GET, &with_query(path, &pairs), None, timeout)
            .await;
        if blocking {
            self.count_blocking_return();
        }
        let reply = reply?;
        match reply.status {
            200 | 404 => {
                let meta = reply.meta();
                Ok((reply, meta))
            }
            _ => Err(ClientError::api(&reply)),
        }
    }
}

impl Client {
    /// A GET of any endpoint as JSON, with the read options applied: `None` for a 404 (a key
    /// that does not exist).
    pub async fn get_json(
        &self,
        path: &str,
        query: &[(&str, String)],
        opts: ReadOpts,
    ) -> Result<(Option<serde_json::Value>, QueryMeta), ClientError> {
        let (reply, meta) = self.read(&encode_path(path), query, &opts).await?;
        if reply.status == 404 {
            return Ok((None, meta));
        }
        Ok((Some(reply.json()?), meta))
    }

    /// `GET /v1/vigil/locks?prefix=`: native locks, held keys, semaphore holders and fair-lock
    /// queues.
    pub async fn locks_report(&self, prefix: &str) -> Result<LocksReport, ClientError> {
        self.vigil_locks_as(prefix).await
    }

    /// `GET /v1/vigil/history/<name>` (with `prefix`, every lock whose name starts with it):
    /// each lock's recorded events, oldest first, blocking past `opts.index`.
    pub async fn lock_history(
        &self,
        name: &str,
        prefix: bool,
        opts: &ReadOpts,
    ) -> Result<(Vec<HistoryReport>, QueryMeta), ClientError> {
        // Every lock: `?prefix=` of the bare path.
        let path = match name {
            "" => "/v1/vigil/history".to_owned(),
            name => format!("/v1/vigil/history/{}", encode_path(name)),
        };
        let query = match prefix || name.is_empty() {
            true => vec![("prefix", String::new())],
            false => Vec::new(),
        };
        let (reply, meta) = self.read(&path, &query, opts).await?;
        Ok((reply.ok()?.json()?, meta))
    }

    /// [`Client::locks_report`] as the agent wrote it (with any field a newer agent adds).
    pub async fn vigil_locks(&self, prefix: &str) -> Result<serde_json::Value, ClientError> {
        self.vigil_locks_as(prefix).await
    }

    async fn vigil_locks_as<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<T, ClientError> {
        let query = [("prefix", prefix.to_owned())];
        let (reply, _) = self
            .read("/v1/vigil/locks", &query, &ReadOpts::default())
            .await?;
        reply.ok()?.json()
    }
}

/// Percent-encodes a KV key for a URL path, keeping `/` as the separator.
pub(crate) fn encode_path(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes a query value.
fn encode_query(value: &str) -> String {
    encode_path(value).replace('/', "%2F")
}

/// `path?k=v&flag` (a flag with an empty value is sent bare, as presence-based flags are).
pub(crate) fn with_query(path: &str, pairs: &[(&str, String)]) -> String {
    if pairs.is_empty() {
        return path.to_owned();
    }
    let query: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                (*k).to_owned()
            } else {
                format!("{k}={}", encode_query(v))
            }
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_index_carries_forward_resets_backwards_and_floors_at_one() {
        assert_eq!(next_wait_index(0, 5), 5);
        assert_eq!(next_wait_index(5, 9), 9);
        assert_eq!(next_wait_index(9, 9), 9);
        assert_eq!(next_wait_index(9, 3), 0, "went backwards");
        assert_eq!(next_wait_index(0, 0), 1, "never block on 0");
    }

    #[test]
    fn keys_and_queries_are_encoded() {
        assert_eq!(encode_path("a b/c%"), "a%20b/c%25");
        assert_eq!(
            with_query(
                "/v1/kv/x",
                &[("recurse", String::new()), ("separator", "/".into())]
            ),
            "/v1/kv/x?recurse&separator=%2F"
        );
    }

    #[test]
    fn addresses_accept_host_port_and_urls() {
        assert_eq!(
            Client::new("127.0.0.1:1").unwrap().base(),
            "http://127.0.0.1:1"
        );
        assert_eq!(Client::new("http://h:2/").unwrap().base(), "http://h:2");
        assert!(Client::new(" ").is_err());
    }
}
