//! The raft network between servers: each openraft RPC is one request on the QUIC transport to
//! the target's RPC address, over the pooled connection. An AppendEntries whose entries exceed
//! [`MAX_APPEND_BYTES`] is not sent: openraft gets `PayloadTooLarge` with the number of entries
//! that fit and retries at once with fewer, so a large backlog (a follower back from a pause)
//! crosses as a series of bounded batches, each well within the RPC's deadline.

use std::net::SocketAddr;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::{MAX_APPEND_BYTES, Node, NodeId, TypeConfig};
use crate::rpc::{Call, RpcRequest, RpcResponse, calls};
use crate::transport::{RpcClient, TransportError};

/// Hands out clients that share the server's connection pool.
#[derive(Clone)]
pub struct QuicNetwork {
    pub rpc: RpcClient,
}

pub struct QuicPeer {
    rpc: RpcClient,
    target: NodeId,
    addr: Result<SocketAddr, String>,
}

impl RaftNetworkFactory<TypeConfig> for QuicNetwork {
    type Network = QuicPeer;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        QuicPeer {
            rpc: self.rpc.clone(),
            target,
            addr: node
                .rpc_addr
                .parse()
                .map_err(|e| format!("bad RPC address {:?} of node {target}: {e}", node.rpc_addr)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

type RpcErr<E> = RPCError<NodeId, Node, E>;

impl QuicPeer {
    /// Sends a raft message; a refusal (this server's certificate is not a server's) is an
    /// unreachable peer to raft, an answer of another kind a network error.
    async fn call<C: Call, E: std::error::Error>(
        &self,
        call: C,
        timeout: Duration,
    ) -> Result<C::Reply, RpcErr<E>> {
        let addr = self
            .addr
            .as_ref()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&PeerError(e.clone()))))?;
        let request: RpcRequest = call.into();
        match self
            .rpc
            .call_typed::<RpcRequest, RpcResponse>(*addr, &request, timeout)
            .await
            .map(C::reply)
        {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(RpcResponse::Refused(why))) => {
                Err(RPCError::Unreachable(Unreachable::new(&PeerError(why))))
            }
            Ok(Err(other)) => Err(RPCError::Network(NetworkError::new(&PeerError(format!(
                "node {} answered {other:?}",
                self.target
            ))))),
            Err(e @ TransportError::Unreachable { .. }) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

/// How many leading entries of `entries` fit in [`MAX_APPEND_BYTES`] (at least one, so a single
/// large entry still goes), or `None` when all of them do.
fn entries_that_fit(entries: &[openraft::Entry<TypeConfig>]) -> Option<u64> {
    let mut total = 0usize;
    for (n, entry) in entries.iter().enumerate() {
        total += postcard::experimental::serialized_size(entry).unwrap_or(usize::MAX);
        if total > MAX_APPEND_BYTES {
            return Some(n.max(1) as u64);
        }
    }
    None
}

fn remote<E: std::error::Error>(
    target: NodeId,
    e: RaftError<NodeId, E>,
) -> RpcErr<RaftError<NodeId, E>> {
    RPCError::RemoteError(openraft::error::RemoteError::new(target, e))
}

impl RaftNetwork<TypeConfig> for QuicPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr<RaftError<NodeId>>> {
        if let Some(fit) = entries_that_fit(&rpc.entries)
            && fit < rpc.entries.len() as u64
        {
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(fit),
            ));
        }
        let call = calls::AppendEntries { request: rpc };
        self.call(call, option.hard_ttl())
            .await?
            .map_err(|e| remote(self.target, e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<RaftError<NodeId, InstallSnapshotError>>>
    {
        let call = calls::InstallSnapshot { request: rpc };
        self.call(call, option.hard_ttl())
            .await?
            .map_err(|e| remote(self.target, e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr<RaftError<NodeId>>> {
        self.call(calls::Vote { request: rpc }, option.hard_ttl())
            .await?
            .map_err(|e| remote(self.target, e))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{EntryPayload, LogId};
    use vigil_shared::kv::KvOp;
    use vigil_shared::rpc::{Command, Op};

    use super::*;

    fn entry(index: u64, value_len: usize) -> openraft::Entry<TypeConfig> {
        openraft::Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command {
                now_ms: 0,
                op: Op::Kv(vec![KvOp::Set {
                    key: format!("k{index}"),
                    value: vec![7; value_len],
                    flags: 0,
                }]),
            }),
        }
    }

    #[test]
    fn batches_are_cut_at_the_byte_budget_but_never_below_one_entry() {
        // Small entries all fit.
        let small: Vec<_> = (1..=100).map(|i| entry(i, 1000)).collect();
        assert_eq!(entries_that_fit(&small), None);
        // 400 KB entries: two fit in 1 MiB, the third does not.
        let large: Vec<_> = (1..=250).map(|i| entry(i, 400_000)).collect();
        assert_eq!(entries_that_fit(&large), Some(2));
        // One entry larger than the budget still goes alone.
        let huge = vec![entry(1, MAX_APPEND_BYTES + 1), entry(2, 10)];
        assert_eq!(entries_that_fit(&huge), Some(1));
        assert_eq!(entries_that_fit(&huge[..1]), Some(1));
        assert_eq!(entries_that_fit(&[]), None);
    }
}
