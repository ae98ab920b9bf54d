//! The raft network between servers: each openraft RPC is one request on the QUIC transport to
//! the target's RPC address, over the pooled connection. Snapshots cross in chunks (openraft's
//! v1 network, through `openraft-legacy`'s adapter); a large backlog of entries crosses as a
//! series of AppendEntries, each cut at [`super::MAX_APPEND_BYTES`] by the log reader.

use std::net::SocketAddr;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft_legacy::network_v1::{
    Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};

use super::{Node, NodeId, SnapshotData, TypeConfig};
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
    type Network = Adapter<TypeConfig, QuicPeer, SnapshotData>;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        Adapter::new(QuicPeer {
            rpc: self.rpc.clone(),
            target,
            addr: node
                .rpc_addr
                .parse()
                .map_err(|e| format!("bad RPC address {:?} of node {target}: {e}", node.rpc_addr)),
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

type RpcErr<E> = RPCError<TypeConfig, E>;

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

fn remote<E: std::error::Error>(
    target: NodeId,
    e: RaftError<TypeConfig, E>,
) -> RpcErr<RaftError<TypeConfig, E>> {
    RPCError::RemoteError(RemoteError::new(target, e))
}

impl RaftNetwork<TypeConfig> for QuicPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcErr<RaftError<TypeConfig>>> {
        let call = calls::AppendEntries { request: rpc };
        self.call(call, option.hard_ttl())
            .await?
            .map_err(|e| remote(self.target, e))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<TypeConfig>,
        RpcErr<RaftError<TypeConfig, InstallSnapshotError>>,
    > {
        let call = calls::InstallSnapshot { request: rpc };
        self.call(call, option.hard_ttl())
            .await?
            .map_err(|e| remote(self.target, e))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr<RaftError<TypeConfig>>> {
        self.call(calls::Vote { request: rpc }, option.hard_ttl())
            .await?
            .map_err(|e| remote(self.target, e))
    }
}
