//! The raft network between servers: each openraft RPC is one request on the QUIC transport to
//! the target's RPC address, over the pooled connection.

use std::net::SocketAddr;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::{Node, NodeId, TypeConfig};
use crate::rpc::{RpcRequest, RpcResponse};
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
    async fn call<E: std::error::Error>(
        &self,
        request: RpcRequest,
        timeout: Duration,
    ) -> Result<RpcResponse, RpcErr<E>> {
        let addr = self
            .addr
            .as_ref()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&PeerError(e.clone()))))?;
        match self
            .rpc
            .call_typed::<RpcRequest, RpcResponse>(*addr, &request, timeout)
            .await
        {
            Ok(RpcResponse::Refused(why)) => {
                Err(RPCError::Unreachable(Unreachable::new(&PeerError(why))))
            }
            Ok(response) => Ok(response),
            Err(e @ TransportError::Unreachable { .. }) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }

    fn unexpected<E: std::error::Error>(&self, response: RpcResponse) -> RpcErr<E> {
        RPCError::Network(NetworkError::new(&PeerError(format!(
            "node {} answered {response:?}",
            self.target
        ))))
    }
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
        match self
            .call(RpcRequest::AppendEntries(rpc), option.hard_ttl())
            .await?
        {
            RpcResponse::AppendEntries(Ok(r)) => Ok(r),
            RpcResponse::AppendEntries(Err(e)) => Err(remote(self.target, e)),
            other => Err(self.unexpected(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<RaftError<NodeId, InstallSnapshotError>>>
    {
        match self
            .call(RpcRequest::InstallSnapshot(rpc), option.hard_ttl())
            .await?
        {
            RpcResponse::InstallSnapshot(Ok(r)) => Ok(r),
            RpcResponse::InstallSnapshot(Err(e)) => Err(remote(self.target, e)),
            other => Err(self.unexpected(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr<RaftError<NodeId>>> {
        match self.call(RpcRequest::Vote(rpc), option.hard_ttl()).await? {
            RpcResponse::Vote(Ok(r)) => Ok(r),
            RpcResponse::Vote(Err(e)) => Err(remote(self.target, e)),
            other => Err(self.unexpected(other)),
        }
    }
}
