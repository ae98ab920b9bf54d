//! Where the HTTP API's requests go: the in-process server when this agent runs the server role,
//! or a server reached over QUIC RPC otherwise. Both retry what is safe to retry: anything that
//! was never applied (no leader yet, a server that could not be reached) and every read, within
//! a deadline, so an election or a server loss looks like latency rather than an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_server::Server;
use vigil_server::rpc::{RpcRequest, RpcResponse, StatusInfo, unexpected};
use vigil_server::transport::{CallKind, RpcClient, TransportError};
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::rpc::{
    Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::Session;

/// How long a request keeps retrying through an election or a server loss.
const RETRY_FOR: Duration = Duration::from_secs(15);
/// Time allowed for one RPC beyond its blocking wait.
const CALL_SLACK: Duration = Duration::from_secs(30);
/// A server that has answered nothing for this long while a call waits on it is pinged.
const PROBE_AFTER: Duration = Duration::from_secs(1);
/// A server that does not answer a ping within this is taken to be gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

type Probe = Arc<tokio::sync::Mutex<Option<(Instant, Result<(), TransportError>)>>>;

pub enum Backend {
    Local(Arc<Server>),
    Remote(RemoteServers),
}

/// The servers a client agent talks to, found through gossip, with the one that answered last
/// tried first.
pub struct RemoteServers {
    rpc: RpcClient,
    members: watch::Receiver<Vec<MemberStatus>>,
    preferred: Mutex<Option<SocketAddr>>,
    /// When each server last answered, so a write is not sent blind to one silent for long.
    last_answer: Mutex<HashMap<SocketAddr, Instant>>,
    /// Per server, the last ping's time and outcome, behind the lock a ping is sent under.
    probes: Mutex<HashMap<SocketAddr, Probe>>,
    shutdown: CancellationToken,
}

impl RemoteServers {
    pub fn new(
        rpc: RpcClient,
        members: watch::Receiver<Vec<MemberStatus>>,
        shutdown: CancellationToken,
    ) -> RemoteServers {
        RemoteServers {
            rpc,
            members,
            preferred: Mutex::new(None),
            last_answer: Mutex::new(HashMap::new()),
            probes: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    fn answered(&self, server: SocketAddr) {
        self.last_answer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(server, Instant::now());
    }

    /// Whether `server` answered within [`PROBE_AFTER`].
    fn recently_answered(&self, server: SocketAddr) -> bool {
        self.last_answer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&server)
            .is_some_and(|t| t.elapsed() < PROBE_AFTER)
    }

    /// Pings `server`; a server that does not answer is dropped from the connection pool. One
    /// ping per server at a time: callers that queued behind it take its outcome instead of
    /// each sending their own (thousands of blocking queries wait on one server at once).
    async fn ping(&self, server: SocketAddr) -> Result<(), TransportError> {
        let asked = Instant::now();
        let probe = Arc::clone(
            self.probes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(server)
                .or_default(),
        );
        let mut last = probe.lock().await;
        if let Some((at, outcome)) = last.as_ref()
            && *at >= asked
        {
            return outcome.clone();
        }
        let outcome = match self
            .rpc
            .call_typed::<RpcRequest, RpcResponse>(server, &RpcRequest::Hello, PROBE_TIMEOUT)
            .await
        {
            Ok(_) => {
                self.answered(server);
                Ok(())
            }
            Err(e) => {
                self.rpc.disconnect(server).await;
                Err(e)
            }
        };
        *last = Some((Instant::now(), outcome.clone()));
        outcome
    }

    /// One call to one server. While it waits (a blocking query), the server is pinged every
    /// [`PROBE_AFTER`]: QUIC notices a killed peer only after its idle timeout, and the caller
    /// should move to another server long before that. Blocking queries travel on the
    /// server's watch connections, everything else on its control connection.
    async fn call_one(
        &self,
        server: SocketAddr,
        request: &RpcRequest,
        timeout: Duration,
    ) -> Result<RpcResponse, TransportError> {
        // A write is never sent to a server that has been silent: if it died, the write's fate
        // would be unknown, while a failed ping means "not sent" and another server is tried.
        if !idempotent(request) && !self.recently_answered(server) {
            self.ping(server)
                .await
                .map_err(|e| TransportError::Unreachable {
                    addr: server,
                    reason: format!("no answer to a ping: {e}"),
                })?;
        }
        let kind = match request {
            RpcRequest::Query { opts, .. } if opts.min_index > 0 => CallKind::Blocking,
            _ => CallKind::Prompt,
        };
        let call = self
            .rpc
            .call_typed_as::<RpcRequest, RpcResponse>(kind, server, request, timeout);
        tokio::pin!(call);
        loop {
            tokio::select! {
                result = &mut call => {
                    if result.is_ok() {
                        self.answered(server);
                    }
                    return result;
                }
                () = tokio::time::sleep(PROBE_AFTER) => {
                    if !self.recently_answered(server) {
                        self.ping(server).await?;
                    }
                }
            }
        }
    }

    /// Alive servers' RPC addresses, the last one that answered first.
    fn servers(&self) -> Vec<SocketAddr> {
        let mut servers: Vec<SocketAddr> = self
            .members
            .borrow()
            .iter()
            .filter(|m| m.role == MemberRole::Server && m.state == MemberState::Alive)
            .map(|m| m.rpc_addr)
            .collect();
        let preferred = *self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = preferred.and_then(|p| servers.iter().position(|s| *s == p)) {
            servers.swap(0, at);
        }
        servers
    }

    /// Sends `request` to the preferred server, moving on to the next one when a server cannot
    /// be reached. `Err` only when every server failed.
    async fn call(
        &self,
        request: &RpcRequest,
        timeout: Duration,
    ) -> Result<RpcResponse, ServerError> {
        let mut last = None;
        let mut leaderless = None;
        for server in self.servers() {
            match self.call_one(server, request, timeout).await {
                // A server that answers but knows no leader (cut off from the others, or its
                // raft stopped) did nothing with the request: another one may have a leader.
                Ok(response) if knows_no_leader(&response) => {
                    tracing::debug!(%server, "server knows no leader; trying the next");
                    leaderless = Some(response);
                }
                Ok(response) => {
                    *self.preferred.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
                    return Ok(response);
                }
                Err(e) => {
                    tracing::debug!(%server, error = %e, "server RPC failed");
                    let delivered = !matches!(e, TransportError::Unreachable { .. });
                    last = Some(e);
                    if delivered && !idempotent(request) {
                        break;
                    }
                }
            }
        }
        if let Some(response) = leaderless {
            return Ok(response);
        }
        match last {
            Some(TransportError::Unreachable { .. }) | None => Err(ServerError::NoServers),
            Some(TransportError::Busy { .. }) => Err(ServerError::TooManyBlockingQueries),
            Some(e) => Err(ServerError::Raft(format!("server RPC: {e}"))),
        }
    }
}

/// Whether a server's answer says it has no leader to serve the request with (so it did not
/// apply it).
fn knows_no_leader(response: &RpcResponse) -> bool {
    matches!(
        response,
        RpcResponse::Write(Err(ServerError::NoLeader | ServerError::NotLeader { .. }))
            | RpcResponse::Query(Err(ServerError::NoLeader | ServerError::NotLeader { .. }))
            | RpcResponse::Renew(Err(ServerError::NoLeader | ServerError::NotLeader { .. }))
    )
}

fn idempotent(request: &RpcRequest) -> bool {
    !matches!(request, RpcRequest::Write { .. })
}

/// Whether an error means the request was not applied and a retry is safe.
fn retryable(e: &ServerError, idempotent: bool) -> bool {
    match e {
        ServerError::NoLeader | ServerError::NotLeader { .. } | ServerError::NoServers => true,
        ServerError::Raft(_) => idempotent,
        ServerError::SessionNotFound(_)
        | ServerError::ShuttingDown
        | ServerError::TooLarge { .. }
        | ServerError::TooManyBlockingQueries
        | ServerError::InvalidSessionTtl(_) => false,
    }
}

/// Retries `attempt` with backoff while it fails retryably, the deadline allows and the agent
/// is not stopping.
async fn with_retries<T, F, Fut>(
    backend: &Backend,
    deadline: Instant,
    idempotent: bool,
    mut attempt: F,
) -> Result<T, ServerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ServerError>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match attempt().await {
            Err(e)
                if retryable(&e, idempotent)
                    && Instant::now() + backoff < deadline
                    && !backend.shutting_down() =>
            {
                tracing::debug!(error = %e, "retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            result => return result,
        }
    }
}

impl Backend {
    /// True once the agent is stopping.
    fn shutting_down(&self) -> bool {
        match self {
            Backend::Local(server) => server.is_shutting_down(),
            Backend::Remote(remote) => remote.shutdown.is_cancelled(),
        }
    }

    /// Commits a state change.
    pub async fn write(&self, op: Op) -> Result<Response, ServerError> {
        let deadline = Instant::now() + RETRY_FOR;
        match self {
            // The in-process server takes the op by value, so each attempt gets a copy.
            Backend::Local(server) => {
                with_retries(self, deadline, false, || server.write(op.clone())).await
            }
            // Over RPC the request is only serialized: build it once, copy nothing.
            Backend::Remote(remote) => {
                let request = RpcRequest::Write {
                    op,
                    forwarded: false,
                };
                with_retries(self, deadline, false, || async {
                    match remote.call(&request, CALL_SLACK).await? {
                        RpcResponse::Write(result) => result,
                        other => Err(unexpected(other)),
                    }
                })
                .await
            }
        }
    }

    /// Reads, blocking on the server; a lost server is retried on another within the wait.
    pub async fn query(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        // Only a query with an index blocks; the HTTP layer sets a default wait on every read,
        // which must not stretch the retry window of a plain read to minutes.
        let wait = if opts.min_index == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(opts.wait_ms)
        };
        let deadline = Instant::now() + wait + RETRY_FOR;
        let started = Instant::now();
        with_retries(self, deadline, true, || {
            let query = query.clone();
            // A retry blocks only for what is left of the caller's wait.
            let left = wait.saturating_sub(started.elapsed());
            let opts = QueryOptions {
                wait_ms: left.as_millis() as u64,
                ..opts
            };
            async move {
                match self {
                    Backend::Local(server) => server.query(opts, query).await,
                    Backend::Remote(remote) => {
                        let request = RpcRequest::Query {
                            opts,
                            query,
                            forwarded: false,
                        };
                        let timeout = Duration::from_millis(opts.wait_ms) + CALL_SLACK;
                        // A blocking query must not hold up the agent's shutdown.
                        let response = tokio::select! {
                            response = remote.call(&request, timeout) => response?,
                            () = remote.shutdown.cancelled() => {
                                return Err(ServerError::ShuttingDown);
                            }
                        };
                        match response {
                            RpcResponse::Query(result) => result,
                            other => Err(unexpected(other)),
                        }
                    }
                }
            }
        })
        .await
    }

    /// Renews a session on the leader, retrying through an election.
    pub async fn renew(&self, id: &str) -> Result<Session, ServerError> {
        let deadline = Instant::now() + RETRY_FOR;
        with_retries(self, deadline, true, || async move {
            match self {
                Backend::Local(server) => server.renew_session(id).await,
                Backend::Remote(remote) => {
                    let request = RpcRequest::Renew {
                        id: id.to_owned(),
                        forwarded: false,
                    };
                    match remote.call(&request, CALL_SLACK).await? {
                        RpcResponse::Renew(result) => result,
                        other => Err(unexpected(other)),
                    }
                }
            }
        })
        .await
    }

    /// The leader and the raft members, as this agent's server (or the first to answer) sees it.
    pub async fn status(&self) -> Result<StatusInfo, ServerError> {
        match self {
            Backend::Local(server) => Ok(server.status()),
            Backend::Remote(remote) => {
                match remote
                    .call(&RpcRequest::Status, Duration::from_secs(5))
                    .await?
                {
                    RpcResponse::Status(status) => Ok(status),
                    other => Err(unexpected(other)),
                }
            }
        }
    }
}
