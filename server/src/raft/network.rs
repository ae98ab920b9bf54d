//! The raft network between servers. A dev server is the only voter, so openraft never asks it
//! to reach a peer; any attempt is reported as an unreachable peer rather than hanging.

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::{NodeId, TypeConfig};

/// Network factory of a single-server cluster: there are no peers to reach.
#[derive(Clone, Default)]
pub struct SoloNetwork;

#[derive(Debug, thiserror::Error)]
#[error("node {0} is not reachable: this server runs without a server-to-server transport")]
struct NoTransport(NodeId);

pub struct SoloClient {
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for SoloNetwork {
    type Network = SoloClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        SoloClient { target }
    }
}

impl SoloClient {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoTransport(self.target)))
    }
}

impl RaftNetwork<TypeConfig> for SoloClient {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
