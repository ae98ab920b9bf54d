//! Where a request runs: [`Server::at_leader`] is the one place deciding "here or at the
//! leader" (Consul's `forwardRPC`), from what each request says of itself ([`Route`]).
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

/// Where a request may run, and how (Consul's `RPCInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// Whether a caller's request waits out an election under way before it is routed, so it
    /// reaches the new leader instead of failing (see [`Server::await_leader`]).
    awaits_election: bool,
    /// Whether any server may answer it from its own state (a stale read).
    any_server: bool,
    /// How long the leader may hold it: a blocking read's wait.
    hold: Duration,
}

impl Route {
    /// At the leader, once an election under way has one.
    const LEADER: Route = Route {
        awaits_election: true,
        any_server: false,
        hold: Duration::ZERO,
    };
    /// At whoever leads now: membership and operator requests, whose callers ask again
    /// themselves.
    const LEADER_NOW: Route = Route {
        awaits_election: false,
        ..Route::LEADER
    };
}

/// A request that runs at the leader says how ([`Route`]). Every request [`Server::at_leader`]
/// routes has one, so a new one does not compile until someone decides.
pub(crate) trait AtLeader: Call<Output: Failed> + Into<Forwarded> {
    fn route(&self) -> Route;
}

/// The answer of a request that failed before it was served.
pub(crate) trait Failed {
    fn failed(error: ServerError) -> Self;
}

impl<T> Failed for Result<T, ServerError> {
    fn failed(error: ServerError) -> Self {
        Err(error)
    }
}

impl Failed for Result<OperatorReply, OperatorError> {
    fn failed(error: ServerError) -> Self {
        Err(error.into())
    }
}

impl AtLeader for calls::Write {
    fn route(&self) -> Route {
        Route::LEADER
    }
}

impl AtLeader for calls::Renew {
    fn route(&self) -> Route {
        Route::LEADER
    }
}

impl AtLeader for calls::Query {
    /// A stale read is answered wherever it is asked; only a read with an index blocks.
    fn route(&self) -> Route {
        let stale = self.opts.consistency == Consistency::Stale;
        let hold = if self.opts.min_index == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(self.opts.wait_ms)
        };
        Route {
            awaits_election: !stale,
            any_server: stale,
            hold,
        }
    }
}

impl AtLeader for calls::Join {
    fn route(&self) -> Route {
        Route::LEADER_NOW
    }
}

impl AtLeader for calls::Operator {
    fn route(&self) -> Route {
        Route::LEADER_NOW
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
    /// go back in time. The caller retries on the new leader. `serve` may answer more than
    /// the request's output (a read that waits, [`Server::query`]'s first step): what the
    /// leader or a refusal answers is converted into it.
    pub(crate) async fn at_leader<C, F, T>(
        &self,
        call: C,
        hop: Hop,
        serve: impl FnOnce(C) -> F,
    ) -> T
    where
        C: AtLeader,
        F: Future<Output = T>,
        T: From<C::Output>,
    {
        let route = call.route();
        // The election wait and the forwarding are boxed on their own: a blocking query served
        // here holds this future while it waits, which would otherwise keep room for them.
        if hop == Hop::Caller && route.awaits_election {
            Box::pin(self.await_leader()).await;
        }
        if self.is_leader() || route.any_server {
            return serve(call).await;
        }
        let answer = match hop {
            Hop::Forwarded => C::Output::failed(ServerError::NoLeader),
            Hop::Caller => Box::pin(self.forward(call, route.hold))
                .await
                .unwrap_or_else(C::Output::failed),
        };
        answer.into()
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
