//! Forwarding a request to the leader on behalf of a caller, and telling a lost leader from a
//! failed request.

use super::*;

/// Time allowed for a forwarded request beyond its own blocking wait.
const FORWARD_SLACK: Duration = Duration::from_secs(30);

impl Server {
    pub(super) fn leader_socket(&self) -> Result<SocketAddr, ServerError> {
        self.leader_addr()
            .and_then(|a| a.parse().ok())
            .ok_or(ServerError::NoLeader)
    }

    /// Sends a request to the leader on behalf of a caller.
    pub(crate) async fn forward<C: Call>(
        &self,
        call: C,
        wait: Duration,
    ) -> Result<C::Reply, ServerError> {
        let request: RpcRequest = call.into();
        // Server metrics: they change with the leader, not with every entry.
        let mut metrics = self.raft.server_metrics();
        let leader_id = metrics.borrow_and_update().current_leader;
        let leader = self.leader_socket()?;
        // Not sent to a leader found dead: "no leader" is then certain, and safe to retry
        // (sent, a write's fate would be unknown until raft elects another).
        if self.leader_gone().await {
            return Err(ServerError::NoLeader);
        }
        let is_write = matches!(request, RpcRequest::Write { .. });
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
