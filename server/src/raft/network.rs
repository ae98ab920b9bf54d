//! The raft network between servers: each openraft RPC is one [`PeerRequest`] on the QUIC
//! transport's raft protocol ([`ALPN_RAFT`], which only a server certificate may open) to the
//! target's RPC address, over a connection pooled apart from client requests. Snapshots cross
//! in chunks (openraft's v1 network, through `openraft-legacy`'s adapter); a large backlog of
//! entries crosses as a series of AppendEntries, each cut at [`super::MAX_APPEND_BYTES`] by the
//! log reader.

use std::net::SocketAddr;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft_legacy::network_v1::{
    Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};
use serde::{Deserialize, Serialize};
#[cfg(doc)]
use vigil_wire::tls::ALPN_RAFT;
use vigil_wire::transport::{RpcClient, TransportError};

use super::{Node, NodeId, SnapshotData, TypeConfig};

/// Raft's messages, server to server. Append-only: postcard encodes the variant index.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    /// 0
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// 1
    Vote(VoteRequest<TypeConfig>),
    /// 2
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// 3: the leader hands leadership over to this server: campaign now (see
    /// [`crate::operator`]).
    Campaign,
}

/// What answers a [`PeerRequest`]: the variant of the same name, or
/// [`PeerResponse::Undecodable`].
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    /// 0
    AppendEntries(Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>),
    /// 1
    Vote(Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>>),
    /// 2
    InstallSnapshot(
        Result<InstallSnapshotResponse<TypeConfig>, RaftError<TypeConfig, InstallSnapshotError>>,
    ),
    /// 3: the request did not decode (a peer of another build).
    Undecodable(String),
    /// 4: whether the campaign started; `Err` says why not.
    Campaign(Result<(), String>),
}

/// Hands out clients that share the server's pool of raft connections.
#[derive(Clone)]
pub struct QuicNetwork {
    /// Dials with the raft protocol ([`vigil_wire::tls::TlsMaterial::raft_client_config`]).
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
    /// Sends a raft message; a refused connection (this server's certificate is not a
    /// server's) is an unreachable peer to raft.
    async fn call<E: std::error::Error>(
        &self,
        request: PeerRequest,
        timeout: Duration,
    ) -> Result<PeerResponse, RpcErr<E>> {
        let addr = self
            .addr
            .as_ref()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&PeerError(e.clone()))))?;
        self.rpc
            .call_typed(*addr, &request, timeout)
            .await
            .map_err(|e| match e {
                TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                e => RPCError::Network(NetworkError::new(&e)),
            })
    }

    /// A network error for an answer that is not the one asked for.
    fn wrong_answer<E: std::error::Error>(&self, answer: PeerResponse) -> RpcErr<E> {
        RPCError::Network(NetworkError::new(&PeerError(format!(
            "node {} answered {answer:?}",
            self.target
        ))))
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
        let request = PeerRequest::AppendEntries(rpc);
        match self.call(request, option.hard_ttl()).await? {
            PeerResponse::AppendEntries(result) => result.map_err(|e| remote(self.target, e)),
            other => Err(self.wrong_answer(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<TypeConfig>,
        RpcErr<RaftError<TypeConfig, InstallSnapshotError>>,
    > {
        let request = PeerRequest::InstallSnapshot(rpc);
        match self.call(request, option.hard_ttl()).await? {
            PeerResponse::InstallSnapshot(result) => result.map_err(|e| remote(self.target, e)),
            other => Err(self.wrong_answer(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr<RaftError<TypeConfig>>> {
        match self.call(PeerRequest::Vote(rpc), option.hard_ttl()).await? {
            PeerResponse::Vote(result) => result.map_err(|e| remote(self.target, e)),
            other => Err(self.wrong_answer(other)),
        }
    }
}
