//! The servers as a client agent reaches them: over QUIC RPC, found through gossip, with the
//! one that answered last tried first. One attempt of a request goes to each live server in
//! turn until one takes it up; a server silent during a call is pinged and left for the next
//! one long before QUIC's idle timeout would notice it died. A write is never sent blind to a
//! server that may be gone, so its failure means "not applied" whenever it can.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::StreamExt as _;
use futures::future::{BoxFuture, Either};
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_server::ServerApi;
use vigil_server::api::QueryFuture;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::operator::{OperatorError, OperatorReply, OperatorRequest};
use vigil_shared::rpc::calls::{self, Call, RpcRequest, RpcResponse, StatusInfo, reply};

use crate::token::AgentToken;
use vigil_shared::rpc::{Consistency, Op, QueryOptions, ReadQuery, Request, Response, ServerError};
use vigil_shared::session::Session;
use vigil_wire::transport::{CallKind, RpcClient, TransportError};

/// Time allowed for one RPC beyond its blocking wait.
const CALL_SLACK: Duration = Duration::from_secs(30);
/// A server silent this long during a prompt call (anything but a blocking query) is pinged,
/// and a write goes to a server silent this long only after a ping: a killed server's closed
/// port answers the ping at once (see [`RemoteServers::ping`]), so a write is not sent blind
/// to a server that died since it last answered, which a leader failover (a few hundred
/// milliseconds on evidence) would otherwise make likely.
const PROMPT_PROBE_AFTER: Duration = Duration::from_millis(250);
/// A server that does not answer a ping within this is taken to be gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

type Probe = Arc<tokio::sync::Mutex<Option<(Instant, Result<(), TransportError>)>>>;

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
    /// Whose token each request carries (see [`crate::token`]).
    token: AgentToken,
}

impl RemoteServers {
    pub fn new(
        rpc: RpcClient,
        members: watch::Receiver<Vec<MemberStatus>>,
        shutdown: CancellationToken,
        token: AgentToken,
    ) -> RemoteServers {
        RemoteServers {
            rpc,
            members,
            preferred: Mutex::new(None),
            last_answer: Mutex::new(HashMap::new()),
            probes: Mutex::new(HashMap::new()),
            shutdown,
            token,
        }
    }

    fn answered(&self, server: SocketAddr) {
        self.last_answer.lock().insert(server, Instant::now());
    }

    /// Whether `server` answered within `within`.
    fn answered_within(&self, server: SocketAddr, within: Duration) -> bool {
        self.last_answer
            .lock()
            .get(&server)
            .is_some_and(|t| t.elapsed() < within)
    }

    /// Pings `server`; a server that does not answer, or whose port is found closed, is dropped
    /// from the connection pool. One ping per server at a time: callers that queued behind it
    /// take its outcome instead of each sending their own (thousands of blocking queries wait
    /// on one server at once).
    async fn ping(&self, server: SocketAddr) -> Result<(), TransportError> {
        let asked = Instant::now();
        let probe = Arc::clone(self.probes.lock().entry(server).or_default());
        let mut last = probe.lock().await;
        if let Some((at, outcome)) = last.as_ref()
            && *at >= asked
        {
            return outcome.clone();
        }
        let hello = self.rpc.call_typed::<RpcRequest, RpcResponse>(
            server,
            &RpcRequest::Hello {},
            PROBE_TIMEOUT,
        );
        // A server whose port is closed is gone for sure: no need to wait for the ping's
        // timeout (QUIC does not hear the kernel's refusal).
        let closed = async {
            if !vigil_server::dial::port_closed(server, PROBE_TIMEOUT).await {
                std::future::pending::<()>().await;
            }
        };
        let answer = tokio::select! {
            answer = hello => answer.map(drop),
            () = closed => Err(TransportError::Closed {
                addr: server,
                reason: "nothing listens on its port any more".to_owned(),
            }),
        };
        let outcome = match answer {
            Ok(()) => {
                self.answered(server);
                Ok(())
            }
            Err(e) => {
                // The next write pings it again before trusting it, and it is no longer tried
                // first.
                self.last_answer.lock().remove(&server);
                {
                    let mut preferred = self.preferred.lock();
                    if *preferred == Some(server) {
                        *preferred = None;
                    }
                }
                self.rpc.disconnect(server).await;
                Err(e)
            }
        };
        *last = Some((Instant::now(), outcome.clone()));
        outcome
    }

    /// One call to one server. A blocking query waits on the stream the server's blocking
    /// calls share, whose watchdog pings the server when it falls silent and fails the calls
    /// on it when it does not answer (`vigil_wire`'s transport): the call keeps no timer of its
    /// own. Anything else travels on the server's control connection, and the server is pinged
    /// every [`PROMPT_PROBE_AFTER`] of silence while it waits: QUIC notices a killed peer only
    /// after its idle timeout, and the caller should move to another server long before that.
    /// A plain function: a blocking query holds what it returns while it waits, which is only
    /// the call (a prompt one is boxed).
    fn call_one<'a>(
        &'a self,
        server: SocketAddr,
        request: &'a Encoded,
        timeout: Duration,
    ) -> impl Future<Output = Result<RpcResponse, TransportError>> + Send + 'a {
        match request.kind {
            CallKind::Blocking => {
                let call = self.rpc.call_encoded_as::<RpcResponse>(
                    CallKind::Blocking,
                    server,
                    request.bytes.clone(),
                    timeout,
                );
                Either::Left(call.map(move |result| {
                    if result.is_ok() {
                        self.answered(server);
                    }
                    result
                }))
            }
            CallKind::Prompt => Either::Right(Box::pin(self.call_prompt(server, request, timeout))),
        }
    }

    /// [`RemoteServers::call_one`] for a prompt call.
    async fn call_prompt(
        &self,
        server: SocketAddr,
        request: &Encoded,
        timeout: Duration,
    ) -> Result<RpcResponse, TransportError> {
        // A write is never sent to a server that has been silent: if it died, the write's
        // fate would be unknown, while a failed ping means "not sent" and another server is
        // tried.
        if !request.idempotent && !self.answered_within(server, PROMPT_PROBE_AFTER) {
            self.ping(server)
                .await
                .map_err(|e| TransportError::Unreachable {
                    addr: server,
                    reason: format!("no answer to a ping: {e}"),
                })?;
        }
        let call = self.rpc.call_encoded_as::<RpcResponse>(
            request.kind,
            server,
            request.bytes.clone(),
            timeout,
        );
        tokio::pin!(call);
        loop {
            let silent = tokio::select! {
                result = &mut call => {
                    if result.is_ok() {
                        self.answered(server);
                    }
                    return result;
                }
                () = tokio::time::sleep(PROMPT_PROBE_AFTER) => {
                    !self.answered_within(server, PROMPT_PROBE_AFTER)
                }
            };
            if silent {
                self.ping(server).await?;
            }
        }
    }

    /// Alive servers' RPC addresses, the last one that answered first. Exactly as many as
    /// there are: a blocking query holds the list while it waits.
    fn servers(&self) -> Box<[SocketAddr]> {
        let mut servers: Box<[SocketAddr]> = self
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
        request: &Outgoing<C>,
        timeout: Duration,
    ) -> Result<C::Output, ServerError> {
        let response = self.call_any(&request.encoded, timeout).await?;
        reply::<C>(response)
    }

    async fn call_any(
        &self,
        request: &Encoded,
        timeout: Duration,
    ) -> Result<RpcResponse, ServerError> {
        // Both boxed: a blocking query holds this future while it waits.
        let mut last: Option<Box<TransportError>> = None;
        let mut leaderless: Option<Box<RpcResponse>> = None;
        let servers = self.servers();
        for &server in &servers {
            match self.call_one(server, request, timeout).await {
                // A server that answers but knows no leader (cut off from the others, or its
                // raft stopped) did nothing with the request: another one may have a leader.
                Ok(response) if knows_no_leader(&response) => {
                    tracing::debug!(%server, "server knows no leader; trying the next");
                    leaderless = Some(Box::new(response));
                }
                Ok(response) => {
                    *self.preferred.lock() = Some(server);
                    return Ok(response);
                }
                Err(e) => {
                    tracing::debug!(%server, error = %e, "server RPC failed");
                    let delivered = !matches!(
                        e,
                        TransportError::Unreachable { .. } | TransportError::Refused { .. }
                    );
                    last = Some(Box::new(e));
                    if delivered && !request.idempotent {
                        break;
                    }
                }
            }
        }
        if let Some(response) = leaderless {
            return Ok(*response);
        }
        match last.map(|e| *e) {
            Some(TransportError::Unreachable { .. }) | None => Err(ServerError::NoServers),
            Some(TransportError::Busy { .. }) => Err(ServerError::TooManyBlockingQueries),
            Some(e @ TransportError::Refused { .. }) => {
                Err(ServerError::Unavailable(format!("server RPC: {e}")))
            }
            Some(e) => Err(if request.idempotent {
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

/// A read, with the caller's token when there is one (see [`crate::token::AgentToken`]).
fn query_request(opts: QueryOptions, query: ReadQuery, token: Option<String>) -> AnyQuery {
    match token {
        Some(token) => AnyQuery(RpcRequest::QueryAs { opts, query, token }),
        None => AnyQuery(RpcRequest::Query { opts, query }),
    }
}

/// A read as either request: both are answered with [`calls::Query`]'s reply.
struct AnyQuery(RpcRequest);

impl From<AnyQuery> for RpcRequest {
    fn from(query: AnyQuery) -> RpcRequest {
        query.0
    }
}

impl Request for AnyQuery {
    type Answer = RpcResponse;
    type Output = <calls::Query as Request>::Output;

    fn output(response: RpcResponse) -> Result<Self::Output, RpcResponse> {
        calls::Query::output(response)
    }
}

impl Call for AnyQuery {
    fn answer(output: Self::Output) -> RpcResponse {
        calls::Query::answer(output)
    }
}

/// A request to the servers, encoded once for as many sends as retries need, that still
/// names its reply.
struct Outgoing<C> {
    encoded: Encoded,
    call: PhantomData<fn() -> C>,
}

impl<C: Call> Outgoing<C> {
    fn new(call: C) -> Result<Outgoing<C>, ServerError> {
        let request: RpcRequest = call.into();
        let bytes = vigil_wire::transport::encode(&request)
            .map_err(|e| ServerError::Internal(e.to_string()))?;
        let kind = match &request {
            RpcRequest::Query { opts, .. } | RpcRequest::QueryAs { opts, .. }
                if opts.min_index > 0 =>
            {
                CallKind::Blocking
            }
            _ => CallKind::Prompt,
        };
        Ok(Outgoing {
            encoded: Encoded {
                bytes,
                kind,
                idempotent: idempotent(&request),
            },
            call: PhantomData,
        })
    }
}

/// A request's bytes, and what decides how it is sent: a blocking query travels on the
/// server's watch connections; a request that is not idempotent is never sent twice, nor
/// blind to a server that has been silent. A waiting query holds these, not the request.
struct Encoded {
    bytes: Vec<u8>,
    kind: CallKind,
    idempotent: bool,
}

fn idempotent(request: &RpcRequest) -> bool {
    match request {
        RpcRequest::Write { .. } | RpcRequest::WriteAs { .. } => false,
        RpcRequest::Operator { request, .. } | RpcRequest::OperatorAs { request, .. } => matches!(
            request,
            OperatorRequest::AutopilotHealth | OperatorRequest::SnapshotSave
        ),
        _ => true,
    }
}

impl ServerApi for RemoteServers {
    // Over RPC the request is only serialized: built once per attempt, the op moved into it.
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Response, ServerError>> {
        let token = self.token.current();
        Box::pin(async move {
            match token {
                Some(token) => {
                    let request = Outgoing::new(calls::WriteAs { op, token })?;
                    self.call(&request, CALL_SLACK).await?
                }
                None => {
                    let request = Outgoing::new(calls::Write { op })?;
                    self.call(&request, CALL_SLACK).await?
                }
            }
        })
    }

    fn query(&self, opts: QueryOptions, query: ReadQuery) -> QueryFuture<'_> {
        // Encoded before the future is made, which thus keeps only the request's bytes.
        let request = match Outgoing::new(query_request(opts, query, self.token.current())) {
            Ok(request) => request,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let timeout = Duration::from_millis(opts.wait_ms) + CALL_SLACK;
        Box::pin(async move {
            // A blocking query must not hold up the agent's shutdown.
            tokio::select! {
                answer = self.call(&request, timeout) => answer?,
                () = self.shutdown.cancelled() => Err(ServerError::ShuttingDown),
            }
        })
    }

    /// Whichever live server answers first, each given [`PROBE_TIMEOUT`].
    fn stale_read(&self, query: ReadQuery) -> QueryFuture<'_> {
        let token = self.token.current();
        Box::pin(async move {
            let opts = QueryOptions {
                consistency: Consistency::Stale,
                min_index: 0,
                wait_ms: 0,
            };
            let request = Outgoing::new(query_request(opts, query, token))?;
            let mut asked: FuturesUnordered<_> = self
                .servers()
                .into_iter()
                .map(|server| self.call_one(server, &request.encoded, PROBE_TIMEOUT))
                .collect();
            let mut last = ServerError::NoServers;
            while let Some(response) = asked.next().await {
                match response.map(reply::<AnyQuery>) {
                    Ok(Ok(Ok(answer))) => return Ok(answer),
                    Ok(Ok(Err(e)) | Err(e)) => last = e,
                    Err(e) => last = ServerError::Unavailable(format!("server RPC: {e}")),
                }
            }
            Err(last)
        })
    }

    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Session, ServerError>> {
        let token = self.token.current();
        Box::pin(async move {
            let id = id.to_owned();
            match token {
                Some(token) => {
                    let request = Outgoing::new(calls::RenewAs { id, token })?;
                    self.call(&request, CALL_SLACK).await?
                }
                None => {
                    let request = Outgoing::new(calls::Renew { id })?;
                    self.call(&request, CALL_SLACK).await?
                }
            }
        })
    }

    fn operator(
        &self,
        request: OperatorRequest,
    ) -> BoxFuture<'_, Result<OperatorReply, OperatorError>> {
        let token = self.token.current();
        Box::pin(async move {
            match token {
                Some(token) => {
                    let request = Outgoing::new(calls::OperatorAs { request, token })?;
                    self.call(&request, CALL_SLACK).await?
                }
                None => {
                    let request = Outgoing::new(calls::Operator { request })?;
                    self.call(&request, CALL_SLACK).await?
                }
            }
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusInfo, ServerError>> {
        Box::pin(async move {
            let request = Outgoing::new(calls::Status {})?;
            self.call(&request, Duration::from_secs(5)).await
        })
    }

    fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }
}
