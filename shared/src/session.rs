//! Session domain types: what a session binds (node, checks, TTL, behaviour, lock-delay)
//! and the request that creates one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::SESSION_TTL_MAX_NS;
use crate::go::duration::{format_go_duration, parse_go_duration_ns};

/// Checks a session's TTL as Consul's servers do, against `[min, 24h]` (empty or zero: no TTL),
/// with Consul's texts: `Session TTL '10z' invalid: ...` or
/// `Invalid Session TTL '5000000000', must be between [10s=24h0m0s]` (the TTL in nanoseconds).
pub fn check_ttl(ttl: &str, min: Duration) -> Result<(), String> {
    if ttl.is_empty() {
        return Ok(());
    }
    let ns = parse_go_duration_ns(ttl).map_err(|e| format!("Session TTL '{ttl}' invalid: {e}"))?;
    if ns == 0 {
        return Ok(());
    }
    let min_ns = i64::try_from(min.as_nanos()).unwrap_or(i64::MAX);
    if ns < min_ns || ns > SESSION_TTL_MAX_NS as i64 {
        return Err(format!(
            "Invalid Session TTL '{ns}', must be between [{}={}]",
            format_go_duration(min),
            format_go_duration(Duration::from_nanos(SESSION_TTL_MAX_NS)),
        ));
    }
    Ok(())
}

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The accessor ID of the ACL token that created it (empty: created with ACLs off). Only
    /// that token, or a management token, may destroy, renew or lock with it (a Vigil rule
    /// over Consul's, which checks only `session:write` on its node).
    pub owner: String,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_messages_match_consul() {
        let min = Duration::from_secs(10);
        assert_eq!(
            check_ttl("5s", min).unwrap_err(),
            "Invalid Session TTL '5000000000', must be between [10s=24h0m0s]"
        );
        assert_eq!(
            check_ttl("10z", min).unwrap_err(),
            r#"Session TTL '10z' invalid: time: unknown unit "z" in duration "10z""#
        );
        assert!(check_ttl("100000s", min).is_err());
        for ok in ["10s", "24h", "0s", ""] {
            assert_eq!(check_ttl(ok, min), Ok(()), "{ok}");
        }
    }
}
