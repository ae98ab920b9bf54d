//! Catalog domain types: nodes and their health checks. Sessions bind to checks, and a check
//! that turns critical or disappears invalidates the sessions bound to it.

use serde::{Deserialize, Serialize};

/// The check every node carries: the gossip failure detector's verdict on it.
pub const SERF_HEALTH: &str = "serfHealth";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HealthStatus {
    Passing,
    Warning,
    Critical,
}

impl HealthStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Passing => "passing",
            HealthStatus::Warning => "warning",
            HealthStatus::Critical => "critical",
        }
    }
}

/// A node registered in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub address: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A health check of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub node: String,
    pub check_id: String,
    pub name: String,
    pub status: HealthStatus,
    pub output: String,
    pub service_id: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A gossip member's state as Serf reports it (`/v1/agent/members` `Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberState {
    /// 1
    Alive,
    /// 2: announced a graceful leave that has not finished.
    Leaving,
    /// 3: left gracefully.
    Left,
    /// 4: declared down by the failure detector.
    Failed,
}

impl MemberState {
    /// Serf's numeric status code.
    pub fn code(self) -> u8 {
        match self {
            MemberState::Alive => 1,
            MemberState::Leaving => 2,
            MemberState::Left => 3,
            MemberState::Failed => 4,
        }
    }
}

/// Whether a member runs the server role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberRole {
    Server,
    Client,
}

/// One gossip member as the agent sees it: what the leader reconciles into the catalog and
/// what client agents use to find servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub name: String,
    /// Gossip (Serf) address.
    pub gossip_addr: std::net::SocketAddr,
    /// RPC address (servers answer RPC on it).
    pub rpc_addr: std::net::SocketAddr,
    pub role: MemberRole,
    pub datacenter: String,
    pub state: MemberState,
}
