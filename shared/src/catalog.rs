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
