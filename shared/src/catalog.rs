//! Catalog domain types: nodes, the services they run, and their health checks. Sessions bind
//! to checks, and a check that turns critical or disappears invalidates the sessions bound to it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The check every node carries: the gossip failure detector's verdict on it.
pub const SERF_HEALTH: &str = "serfHealth";

/// The service every server's node carries (ID and name), at the server's RPC port.
pub const CONSUL_SERVICE: &str = "consul";

/// A check's status. A new check starts critical unless told otherwise, as in Consul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum HealthStatus {
    Passing,
    Warning,
    #[default]
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

    /// Parses Consul's lowercase status names.
    pub fn parse(s: &str) -> Option<HealthStatus> {
        match s {
            "passing" => Some(HealthStatus::Passing),
            "warning" => Some(HealthStatus::Warning),
            "critical" => Some(HealthStatus::Critical),
            _ => None,
        }
    }
}

/// A node registered in the catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// The node's UUID when it registered with one; empty otherwise.
    pub id: String,
    pub address: String,
    pub tagged_addresses: BTreeMap<String, String>,
    pub meta: BTreeMap<String, String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Relative weights a service instance asks DNS load balancing for, by health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weights {
    pub passing: i64,
    pub warning: i64,
}

impl Default for Weights {
    /// Consul's defaults: `{"Passing":1,"Warning":1}`.
    fn default() -> Weights {
        Weights {
            passing: 1,
            warning: 1,
        }
    }
}

/// One of a service's tagged addresses (Consul's `ServiceAddress`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAddress {
    pub address: String,
    pub port: u16,
}

/// A service instance on a node. In a registration the indexes are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub node: String,
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub address: String,
    pub port: u16,
    /// The addresses it registered by tag (`lan`, `wan`, ...), as given. Not in the first
    /// release (see [`crate::first_release`]).
    pub tagged_addresses: BTreeMap<String, ServiceAddress>,
    pub meta: BTreeMap<String, String>,
    pub weights: Weights,
    pub enable_tag_override: bool,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A health check of a node, or of one of its services when `service_id` is set. In a
/// registration the indexes and the service's name and tags are ignored: the catalog fills
/// them in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub node: String,
    pub check_id: String,
    pub name: String,
    pub status: HealthStatus,
    pub notes: String,
    pub output: String,
    pub service_id: String,
    /// Filled in from the service on reads.
    pub service_name: String,
    /// Filled in from the service on reads.
    pub service_tags: Vec<String>,
    /// `ttl`, `http`, `tcp`, `script`, or empty for checks registered through the catalog.
    pub kind: String,
    /// Go duration strings, empty when unset.
    pub interval: String,
    pub timeout: String,
    /// The check's `Definition` object as JSON text (postcard cannot carry a JSON value).
    pub definition: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Check {
    /// Whether two versions of a check differ in anything but their indexes.
    pub fn same_content(&self, other: &Check) -> bool {
        let strip = |c: &Check| Check {
            create_index: 0,
            modify_index: 0,
            service_name: String::new(),
            service_tags: Vec::new(),
            ..c.clone()
        };
        strip(self) == strip(other)
    }
}

/// A service instance with its node and every check that applies to it (node checks first),
/// as `/v1/health/service/<name>` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceHealth {
    pub node: Node,
    pub service: Service,
    pub checks: Vec<Check>,
}

impl ServiceHealth {
    /// True when every check, node checks included, is passing.
    pub fn passing(&self) -> bool {
        self.checks
            .iter()
            .all(|c| c.status == HealthStatus::Passing)
    }
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
    /// Force-left with `?prune`: still Left for the leader (which deregisters the node), but no
    /// longer listed as a member (`/v1/agent/members`), as Consul's prune does.
    pub pruned: bool,
    /// The state-machine protocol level the member's build applies ([`crate::PROTOCOL`]).
    pub protocol: u32,
}
