//! Session domain types: what a session binds (node, checks, TTL, behaviour, lock-delay)
//! and the request that creates one.

use serde::{Deserialize, Serialize};

/// What happens to the keys a session holds when it is invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Behavior {
    /// Clear the lock, keep the key.
    #[default]
    Release,
    /// Delete the key.
    Delete,
}

impl Behavior {
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }

    /// Parses Consul's setting; `""` means release.
    pub fn parse(s: &str) -> Option<Behavior> {
        match s {
            "" | "release" => Some(Behavior::Release),
            "delete" => Some(Behavior::Delete),
            _ => None,
        }
    }
}

/// A service check a session depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCheck {
    pub id: String,
    pub namespace: String,
}

/// A live session. Sessions are never updated, so `create_index == modify_index`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub name: String,
    pub node: String,
    /// Lock-delay in nanoseconds as requested (capped to 60 s only when applied).
    pub lock_delay_ns: u64,
    pub behavior: Behavior,
    /// TTL exactly as the client wrote it; empty for none.
    pub ttl: String,
    pub node_checks: Vec<String>,
    /// `None` prints as JSON `null`, as Consul does when none were given.
    pub service_checks: Option<Vec<ServiceCheck>>,
    /// Legacy check list (omitted from JSON when empty).
    pub checks: Vec<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Session {
    /// Every check ID the session depends on (union of all three lists).
    pub fn all_checks(&self) -> Vec<String> {
        let mut all: Vec<String> = self.checks.clone();
        all.extend(self.node_checks.iter().cloned());
        if let Some(svc) = &self.service_checks {
            all.extend(svc.iter().map(|c| c.id.clone()));
        }
        all.sort();
        all.dedup();
        all
    }
}
