//! The simulated network: every message (a raft RPC, a client's request, a forwarded one) is
//! carried by [`World::carry`], which draws its fate on each way (delivered after a delay, or
//! lost), honours the cuts of a partition, and refuses at once a server that is down. Raft's
//! messages reach the target's `Raft` directly, as `PeerService` hands them over after the QUIC
//! transport.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotOf, VoteOf};
use vigil_server::raft::{Node as RaftNode, NodeId, SnapshotData, TypeConfig};

use crate::gateway::Legs;
use crate::world::{Node, Party, World};

/// Why a message got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The server is down: refused at once, never served.
    Refused,
    /// No answer within the deadline: the request may or may not have been served.
    TimedOut,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lost::Refused => "connection refused (simulated)",
            Lost::TimedOut => "timed out (simulated)",
        })
    }
}

impl std::error::Error for Lost {}

impl World {
    /// Carries a request from `from` to server `to`, has `serve` answer it there, and carries
    /// the answer back, all within `ttl`; `legs` adds up the time on the network. A server that
    /// crashed while serving sends no answer.
    pub async fn carry<T, F, Fut>(
        &self,
        from: Party,
        to: NodeId,
        ttl: Duration,
        legs: &Legs,
        serve: F,
    ) -> Result<T, Lost>
    where
        F: FnOnce(Arc<Node>) -> Fut,
        Fut: Future<Output = T>,
    {
        let trip = async {
            let Some(there) = self.leg(from, Party::Server(to)) else {
                return std::future::pending().await;
            };
            legs.travel(there).await;
            let Some(node) = self.node(to) else {
                return Err(Lost::Refused);
            };
            let answer = serve(Arc::clone(&node)).await;
            if !self.node(to).is_some_and(|now| Arc::ptr_eq(&now, &node)) {
                return std::future::pending().await;
            }
            let Some(back) = self.leg(Party::Server(to), from) else {
                return std::future::pending().await;
            };
            legs.travel(back).await;
            Ok(answer)
        };
        tokio::time::timeout(ttl, trip)
            .await
            .unwrap_or(Err(Lost::TimedOut))
    }
}

/// Raft's network on server `from`.
pub struct SimNetwork {
    pub from: NodeId,
    pub world: Arc<World>,
}

pub struct SimPeer {
    from: NodeId,
    to: NodeId,
    world: Arc<World>,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = SimPeer;

    async fn new_client(&mut self, target: NodeId, _node: &RaftNode) -> SimPeer {
        SimPeer {
            from: self.from,
            to: target,
            world: Arc::clone(&self.world),
        }
    }
}

fn rpc_error(lost: Lost) -> RPCError<TypeConfig> {
    match lost {
        Lost::Refused => RPCError::Unreachable(Unreachable::new(&lost)),
        Lost::TimedOut => RPCError::Network(NetworkError::new(&lost)),
    }
}

impl SimPeer {
    async fn call<T, E, F, Fut>(
        &self,
        option: &RPCOption,
        serve: F,
    ) -> Result<T, RPCError<TypeConfig>>
    where
        E: std::error::Error + 'static,
        F: FnOnce(Arc<Node>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self
            .world
            .carry(
                Party::Server(self.from),
                self.to,
                option.hard_ttl(),
                &Legs::default(),
                serve,
            )
            .await
        {
            Ok(Ok(answer)) => Ok(answer),
            // Raft on the target has stopped.
            Ok(Err(e)) => Err(RPCError::Network(NetworkError::new(&e))),
            Err(lost) => Err(rpc_error(lost)),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for SimPeer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(&option, |n| async move { n.raft.append_entries(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(&option, |n| async move { n.raft.vote(rpc).await })
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(&option, |n| async move { n.raft.pre_vote(rpc).await })
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let install =
            |n: Arc<Node>| async move { n.raft.install_full_snapshot(vote, snapshot).await };
        match self
            .world
            .carry(
                Party::Server(self.from),
                self.to,
                option.hard_ttl(),
                &Legs::default(),
                install,
            )
            .await
        {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(StreamingError::Network(NetworkError::new(&e))),
            Err(lost @ Lost::Refused) => Err(StreamingError::Unreachable(Unreachable::new(&lost))),
            Err(lost) => Err(StreamingError::Network(NetworkError::new(&lost))),
        }
    }
}
