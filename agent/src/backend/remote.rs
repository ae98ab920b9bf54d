//! Where the HTTP API's requests go: the in-process server when this agent runs the server role,
//! or a server reached over QUIC RPC otherwise. Both retry what is safe to retry: anything that
//! was never applied (no leader yet, a server that could not be reached) and every read, within
//! a deadline, so an election or a server loss looks like latency rather than an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use rand::Rng as _;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_server::Server;
use vigil_server::operator::{self, OperatorError, OperatorReply, OperatorRequest};
use vigil_server::rpc::{Call, Prepared, RpcRequest, RpcResponse, StatusInfo, calls, reply};
use vigil_server::transport::{CallKind, RpcClient, TransportError};
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::rpc::{
    Consistency, Op, Query, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
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
        self.last_answer.lock().insert(server, Instant::now());
    }

    /// Whether `server` answered within [`PROBE_AFTER`].
    fn recently_answered(&self, server: SocketAddr) -> bool {
        self.last_answer
            .lock()
            .get(&server)
            .is_some_and(|t| t.elapsed() < PROBE_AFTER)
    }

    /// Pings `server`; a server that does not answer is dropped from the connection pool. One
    /// ping per server at a time: callers that queued behind it take its outcome instead of
    /// each sending their own (thousands of blocking queries wait on one server at once).
    async fn ping(&self, server: SocketAddr) -> Result<(), TransportError> {
        let asked = Instant::now();
        let probe = Arc::clone(self.probes.lock().entry(server).or_default());
        let mut last = probe.lock().await;
        if let Some((at, outcome)) = last.as_ref()
            && *at >= asked
        {
            return outcome.clone();
        }
        let outcome = match self
            .rpc
            .call_typed::<RpcRequest, RpcResponse>(server, &RpcRequest::Hello {}, PROBE_TIMEOUT)
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
        let preferred = *self.preferred.lock();
        if let Some(at) = preferred.and_then(|p| servers.iter().position(|s| *s == p)) {
            servers.swap(0, at);
        }
        servers
    }

    /// Sends `request` to the preferred server, moving on to the next one when a server cannot
    /// be reached. `Err` only when every server failed.
    async fn call<C: Call>(
        &self,
        request: &Prepared<C>,
        timeout: Duration,
    ) -> Result<C::Reply, ServerError> {
        let response = self.call_any(request.request(), timeout).await?;
        reply::<C>(response)
    }

    async fn call_any(
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
                    *self.preferred.lock() = Some(server);
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
            Some(e) => Err(if idempotent(request) {
                ServerError::Unavailable(format!("server RPC: {e}"))
            } else {
                ServerError::Indeterminate(format!(
                    "server RPC: {e}; the change may or may not have been applied"
                ))
            }),
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
    match request {
        RpcRequest::Write { .. } => false,
        RpcRequest::Operator { request, .. } => matches!(
            request,
            OperatorRequest::AutopilotHealth | OperatorRequest::SnapshotSave
        ),
        _ => true,
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
                if e.safe_to_retry(idempotent)
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
                let request = Prepared::new(calls::Write {
                    op,
                    forwarded: false,
                });
                with_retries(self, deadline, false, || async {
                    remote.call(&request, CALL_SLACK).await?
                })
                .await
            }
        }
    }

    /// A typed read: [`Backend::query`] with the answer taken out of its wire form.
    pub async fn read<Q: Query>(
        &self,
        opts: QueryOptions,
        query: Q,
    ) -> Result<(Q::Output, QueryMeta), ServerError> {
        let (result, meta) = self.query(opts, query.into()).await?;
        let output = Q::output(result).map_err(|other| {
            ServerError::Internal(format!("a read was answered with {other:?}"))
        })?;
        Ok((output, meta))
    }

    /// Reads, blocking on the server; a lost server is retried on another within the wait. A
    /// blocking query answers by its deadline whatever the servers do (see
    /// [`Backend::blocking_query`]).
    async fn query(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        // Only a query with an index blocks; the HTTP layer sets a default wait on every read,
        // which must not stretch the retry window of a plain read to minutes.
        if opts.min_index > 0 && opts.wait_ms > 0 {
            return self.blocking_query(opts, query).await;
        }
        let deadline = Instant::now() + RETRY_FOR;
        let opts = QueryOptions { wait_ms: 0, ..opts };
        with_retries(self, deadline, true, || {
            self.query_once(opts, query.clone())
        })
        .await
    }

    /// A blocking query that answers by its deadline, Consul's `wait + wait/16`, also while the
    /// servers elect a leader or one of them is lost. The servers are asked to block for `wait`
    /// plus a jitter of at most `wait/32` (Consul's is up to `wait/16`; the rest of it is this
    /// agent's margin), with retries until then. If none has answered shortly after, a stale
    /// read from any server runs beside; if it is not behind the index the caller knows, it is
    /// the answer, with `X-Consul-KnownLeader: false`, when by the deadline the servers have not
    /// answered. Otherwise the deadline brings Consul's `No cluster leader`.
    async fn blocking_query(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        let wait = Duration::from_millis(opts.wait_ms);
        let spread = wait / 32;
        let jitter = if spread.is_zero() {
            Duration::ZERO
        } else {
            rand::thread_rng().gen_range(Duration::ZERO..spread)
        };
        let started = Instant::now();
        let due = started + wait + jitter;
        let deadline = started + wait + wait / 16;
        // Half the margin lets a quiet query's answer, due at `due`, arrive.
        let grace = (deadline - due) / 2;
        let primary = with_retries(self, due, true, || {
            // A retry blocks only for what is left of the wait.
            let left = due.saturating_duration_since(Instant::now());
            let opts = QueryOptions {
                wait_ms: left.as_millis() as u64,
                ..opts
            };
            self.query_once(opts, query.clone())
        });
        tokio::pin!(primary);
        let mut failed = None;
        match tokio::time::timeout_at(due + grace, &mut primary).await {
            Ok(Err(e)) if e.safe_to_retry(true) => failed = Some(e),
            Ok(result) => return result,
            Err(_) => {}
        }
        // From now on a stale read runs beside: the answer if the servers give none in time. A
        // server behind what the caller has seen (a lower index) has nothing to tell it: its
        // data could say a held lock is free.
        let fallback = async {
            let (result, meta) = self.stale_read(query.clone()).await?;
            if meta.index < opts.min_index {
                return Err(ServerError::NoLeader);
            }
            let meta = QueryMeta {
                known_leader: false,
                ..meta
            };
            Ok((result, meta))
        };
        tokio::pin!(fallback);
        let expiry = tokio::time::sleep_until(deadline);
        tokio::pin!(expiry);
        let mut stale = None;
        let mut fallback_done = false;
        loop {
            tokio::select! {
                biased;
                result = &mut primary, if failed.is_none() => match result {
                    Err(e) if e.safe_to_retry(true) => {
                        if let Some(answer) = stale.take() {
                            return Ok(answer);
                        }
                        if fallback_done {
                            return Err(e);
                        }
                        failed = Some(e);
                    }
                    result => return result,
                },
                answer = &mut fallback, if !fallback_done => {
                    fallback_done = true;
                    match (answer, failed.take()) {
                        (Ok(answer), None) => stale = Some(answer),
                        (Ok(answer), Some(_)) => return Ok(answer),
                        (Err(_), Some(e)) => return Err(e),
                        (Err(_), None) => {}
                    }
                }
                () = &mut expiry => {
                    return match stale {
                        Some(answer) => Ok(answer),
                        None => Err(failed.unwrap_or(ServerError::NoLeader)),
                    };
                }
            }
        }
    }

    /// One attempt at a read: the in-process server, or the servers over RPC in turn.
    async fn query_once(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        match self {
            Backend::Local(server) => server.query(opts, query).await,
            Backend::Remote(remote) => {
                let request = Prepared::new(calls::Query {
                    opts,
                    query,
                    forwarded: false,
                });
                let timeout = Duration::from_millis(opts.wait_ms) + CALL_SLACK;
                // A blocking query must not hold up the agent's shutdown.
                tokio::select! {
                    answer = remote.call(&request, timeout) => answer?,
                    () = remote.shutdown.cancelled() => Err(ServerError::ShuttingDown),
                }
            }
        }
    }

    /// The query answered at once from a server's own state, without a leader: this agent's
    /// server, or whichever live server answers first.
    async fn stale_read(&self, query: ReadQuery) -> Result<(QueryResult, QueryMeta), ServerError> {
        let opts = QueryOptions {
            consistency: Consistency::Stale,
            min_index: 0,
            wait_ms: 0,
        };
        match self {
            Backend::Local(server) => server.query(opts, query).await,
            Backend::Remote(remote) => {
                let request = Prepared::new(calls::Query {
                    opts,
                    query,
                    forwarded: false,
                });
                let mut asked: FuturesUnordered<_> = remote
                    .servers()
                    .into_iter()
                    .map(|server| remote.call_one(server, request.request(), PROBE_TIMEOUT))
                    .collect();
                let mut last = ServerError::NoServers;
                while let Some(response) = asked.next().await {
                    match response.map(reply::<calls::Query>) {
                        Ok(Ok(Ok(answer))) => return Ok(answer),
                        Ok(Ok(Err(e)) | Err(e)) => last = e,
                        Err(e) => last = ServerError::Unavailable(format!("server RPC: {e}")),
                    }
                }
                Err(last)
            }
        }
    }

    /// Renews a session on the leader, retrying through an election.
    pub async fn renew(&self, id: &str) -> Result<Session, ServerError> {
        let deadline = Instant::now() + RETRY_FOR;
        with_retries(self, deadline, true, || async move {
            match self {
                Backend::Local(server) => server.renew_session(id).await,
                Backend::Remote(remote) => {
                    let request = Prepared::new(calls::Renew {
                        id: id.to_owned(),
                        forwarded: false,
                    });
                    remote.call(&request, CALL_SLACK).await?
                }
            }
        })
        .await
    }

    /// The leader and the raft members, as this agent's server (or the first to answer) sees it.
    /// Operates the server set (`/v1/operator/*`) on the leader.
    pub async fn operator(&self, request: OperatorRequest) -> Result<OperatorReply, OperatorError> {
        match self {
            Backend::Local(server) => operator::handle(server, request, false).await,
            Backend::Remote(remote) => {
                let request = Prepared::new(calls::Operator {
                    request,
                    forwarded: false,
                });
                remote.call(&request, CALL_SLACK).await?
            }
        }
    }

    pub async fn status(&self) -> Result<StatusInfo, ServerError> {
        match self {
            Backend::Local(server) => Ok(server.status()),
            Backend::Remote(remote) => {
                let request = Prepared::new(calls::Status {});
                remote.call(&request, Duration::from_secs(5)).await
            }
        }
    }
}
