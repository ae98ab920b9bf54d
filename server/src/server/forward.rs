//! Where a request runs: [`Server::at_leader`] is the one place deciding "here or at the
//! leader" (Consul's `forwardRPC`), from what each request says of itself ([`AtLeader`]).
//! Forwarding it to the leader on behalf of a caller, and telling a lost leader from a failed
//! request.

use std::future::Future;

use vigil_shared::operator::{OperatorError, OperatorReply};
use vigil_shared::rpc::calls::Forwarded;

use super::*;

/// How a request reached this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    /// From its caller (an agent, this server's own API, another server's own request).
    Caller,
    /// Forwarded by a server that is not the leader: served here, or refused, never forwarded
    /// again.
    Forwarded,
}

/// What a request that runs at the leader says about where it may run (Consul's `RPCInfo`).
/// Every request [`Server::at_leader`] routes answers these, so a new one does not compile
/// until someone decides.
pub(crate) trait AtLeader: Call + Into<Forwarded> {
    /// Whether a caller's request waits out an election under way before it is routed, so it
    /// reaches the new leader instead of failing (see [`Server::await_leader`]).
    fn awaits_election(&self) -> bool;
    /// Whether any server may answer it from its own state (a stale read).
    fn any_server(&self) -> bool;
    /// How long the leader may hold it: a blocking read's wait.
    fn hold(&self) -> Duration;
    /// The answer of a request that failed before it was served.
    fn failed(error: ServerError) -> Self::Output;
}

impl AtLeader for calls::Write {
    fn awaits_election(&self) -> bool {
        true
    }

    fn any_server(&self) -> bool {
        false
    }

    fn hold(&self) -> Duration {
        Duration::ZERO
    }

    fn failed(error: ServerError) -> Result<Response, ServerError> {
        Err(error)
    }
}

impl AtLeader for calls::Query {
    /// A stale read is answered wherever it is asked, leader or not.
    fn awaits_election(&self) -> bool {
        self.opts.consistency != Consistency::Stale
    }

    fn any_server(&self) -> bool {
        self.opts.consistency == Consistency::Stale
    }

    /// Only a query with an index blocks.
    fn hold(&self) -> Duration {
        if self.opts.min_index == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(self.opts.wait_ms)
        }
    }

    fn failed(error: ServerError) -> Result<(QueryResult, QueryMeta), ServerError> {
        Err(error)
    }
}

impl AtLeader for calls::Renew {
    fn awaits_election(&self) -> bool {
        true
    }

    fn any_server(&self) -> bool {
        false
    }

    fn hold(&self) -> Duration {
        Duration::ZERO
    }

    fn failed(error: ServerError) -> Result<Session, ServerError> {
        Err(error)
    }
}

/// Membership and operator requests go to whoever leads now: a joiner and an operator ask
/// again themselves.
impl AtLeader for calls::Join {
    fn awaits_election(&self) -> bool {
        false
    }

    fn any_server(&self) -> bool {
        false
    }

    fn hold(&self) -> Duration {
        Duration::ZERO
    }

    fn failed(error: ServerError) -> Result<(), ServerError> {
        Err(error)
    }
}

impl AtLeader for calls::Operator {
    fn awaits_election(&self) -> bool {
        false
    }

    fn any_server(&self) -> bool {
        false
    }

    fn hold(&self) -> Duration {
        Duration::ZERO
    }

    fn failed(error: ServerError) -> Result<OperatorReply, OperatorError> {
        Err(error.into())
    }
}

/// Time allowed for a forwarded request beyond its own blocking wait.
const FORWARD_SLACK: Duration = Duration::from_secs(30);

impl Server {
    pub(super) fn leader_socket(&self) -> Result<SocketAddr, ServerError> {
        self.leader_addr()
            .and_then(|a| a.parse().ok())
            .ok_or(ServerError::NoLeader)
    }

    /// Runs `call` at the leader: `serve` runs it here when this server leads (or when any
    /// server may answer it); otherwise a caller's request is forwarded, once, to the leader,
    /// and a forwarded one is refused with [`ServerError::NoLeader`]: the leader that
    /// forwarded it lost its place meanwhile, and answering from this server's own state could
    /// go back in time. The caller retries on the new leader.
    pub(crate) async fn at_leader<C, F>(
        &self,
        call: C,
        hop: Hop,
        serve: impl FnOnce(C) -> F,
    ) -> C::Output
    where
        C: AtLeader,
        F: Future<Output = C::Output>,
    {
        if hop == Hop::Caller && call.awaits_election() {
            self.await_leader().await;
        }
        if self.is_leader() || call.any_server() {
            return serve(call).await;
        }
        match hop {
            Hop::Forwarded => C::failed(ServerError::NoLeader),
            Hop::Caller => {
                let hold = call.hold();
                self.forward(call, hold).await.unwrap_or_else(C::failed)
            }
        }
    }

    /// Sends a request to the leader on behalf of a caller, in the forwarded envelope.
    async fn forward<C: AtLeader>(
        &self,
        call: C,
        wait: Duration,
    ) -> Result<C::Output, ServerError> {
        let request = RpcRequest::Forwarded(call.into());
        // Server metrics: they change with the leader, not with every entry.
        let mut metrics = self.raft.server_metrics();
        let leader_id = metrics.borrow_and_update().current_leader;
        let leader = self.leader_socket()?;
        // Not sent to a leader found dead: "no leader" is then certain, and safe to retry
        // (sent, a write's fate would be unknown until raft elects another).
        if self.leader_gone().await {
            return Err(ServerError::NoLeader);
        }
        let is_write = matches!(request, RpcRequest::Forwarded(Forwarded::Write(_)));
        let kind = if wait.is_zero() {
            CallKind::Prompt
        } else {
            CallKind::Blocking
        };
        let call = self.rpc.call_typed_as::<RpcRequest, RpcResponse>(
            kind,
            leader,
            &request,
            wait + FORWARD_SLACK,
        );
        // QUIC notices a killed leader only after its idle timeout; raft notices within an
        // election timeout. Stop waiting as soon as raft names another leader or none.
        let leader_lost = async {
            while metrics.borrow_and_update().current_leader == leader_id {
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        let response = tokio::select! {
            result = call => result.map_err(|e| match e {
                // Never delivered: the caller may safely retry.
                TransportError::Unreachable { .. } => ServerError::NoLeader,
                TransportError::Busy { .. } => ServerError::TooManyBlockingQueries,
                // Refused unread: not applied.
                e @ TransportError::Refused { .. } => {
                    ServerError::Unavailable(format!("forwarding to the leader {leader}: {e}"))
                }
                other if is_write => ServerError::Indeterminate(format!(
                    "forwarding to the leader {leader}: {other}; the change may or may not have been applied"
                )),
                other => ServerError::Unavailable(format!("forwarding to the leader {leader}: {other}")),
            }),
            // A write may have been applied before the leader went; only reads and renewals
            // are safe to retry.
            // A forwarded read (possibly blocking for minutes) must not hold up shutdown.
            () = self.shutdown.cancelled(), if !is_write => Err(ServerError::ShuttingDown),
            () = leader_lost => Err(if is_write {
                ServerError::Indeterminate(format!(
                    "lost the leader {leader} while forwarding a write; it may or may not have been applied"
                ))
            } else {
                ServerError::NoLeader
            }),
        }?;
        reply::<C>(response)
    }
}
