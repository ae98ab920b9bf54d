//! The checks run at the end of a run, on what the clients saw ([`History`]) and what the
//! servers committed and proposed ([`World`]). Raft's state machine safety (every server
//! commits the same entry at each index) is checked as it goes, by [`World::committed`].

use std::collections::BTreeMap;

use crate::linear;
use crate::workload::{Grant, History, TTL};
use crate::world::World;

/// Every check's violations, described.
pub fn check(world: &World, history: &History) -> Vec<String> {
    let mut out = Vec::new();
    for (key, ops) in &history.registers {
        if let Err(anomaly) = linear::check(ops) {
            out.push(format!("register {key} is not linearizable: {anomaly}"));
        }
    }
    out.extend(grants("KV lock LockIndex", &history.kv_grants));
    out.extend(grants("lock queue token", &history.queue_grants));
    for (session, proposed) in world.expired() {
        let renewed = history
            .renewals
            .get(&session)
            .and_then(|calls| calls.iter().filter(|c| **c <= proposed).max().copied());
        if let Some(renewed) = renewed
            && proposed.duration_since(renewed) < TTL
        {
            out.push(format!(
                "session {session} was expired {:?} after a request that restarted its TTL of {TTL:?}",
                proposed.duration_since(renewed)
            ));
        }
    }
    out
}

/// Grants of one lock: no two sessions were granted the same `LockIndex` or token, and none
/// went back: a grant asked for after another was acknowledged has a larger one (or the same,
/// to the same session, which re-acquires what it holds).
fn grants(what: &str, grants: &[Grant]) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_index: BTreeMap<u64, &Grant> = BTreeMap::new();
    for g in grants {
        match by_index.get(&g.index) {
            Some(other) if other.session != g.session => out.push(format!(
                "double grant: {what} {} went to session {} (client {}) and to session {} (client {})",
                g.index, other.session, other.client, g.session, g.client
            )),
            Some(_) => {}
            None => {
                by_index.insert(g.index, g);
            }
        }
    }
    for earlier in grants {
        for later in grants {
            let went_back = later.index < earlier.index
                || (later.index == earlier.index && later.session != earlier.session);
            if earlier.ret < later.call && went_back {
                out.push(format!(
                    "{what} went back: {} (session {}) was acknowledged before {} (session {}) was asked for",
                    earlier.index, earlier.session, later.index, later.session
                ));
            }
        }
    }
    out
}
