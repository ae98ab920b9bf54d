//! What this server reports about raft: leader, peers and figures.

use super::*;

impl Server {
    /// Leader, raft members and the membership's index.
    pub fn status(&self) -> StatusInfo {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let peers = membership
            .nodes()
            .map(|(id, node)| PeerInfo {
                node_id: *id,
                node: node.clone(),
                leader: m.running_state.is_ok() && m.current_leader == Some(*id),
                voter: voters.contains(id),
            })
            .collect();
        let leader = m
            .current_leader
            .filter(|_| m.running_state.is_ok())
            .and_then(|l| membership.get_node(&l))
            .map(|n| n.rpc_addr.clone());
        StatusInfo {
            leader,
            peers,
            config_index: m.membership_config.log_id().map_or(0, |l| l.index),
        }
    }

    /// Raft figures for `/v1/agent/self`.
    pub fn raft_stats(&self) -> RaftStats {
        let m = self.raft.metrics().borrow_watched().clone();
        RaftStats {
            state: format!("{:?}", m.state),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            num_peers: m
                .membership_config
                .membership()
                .voter_ids()
                .count()
                .saturating_sub(1),
            protocol: self.shared.read().protocol(),
        }
    }
}

/// Figures from raft's metrics, reported as strings the way Consul does.
#[derive(Debug, Clone)]
pub struct RaftStats {
    pub state: String,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub num_peers: usize,
    /// The state machine's protocol level the cluster applies (`vigil_shared::PROTOCOL`).
    pub protocol: u32,
}
