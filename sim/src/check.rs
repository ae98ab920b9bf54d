//! The checks run at the end of a run, on what the clients saw ([`History`]) and what the
//! servers committed and proposed ([`World`]). Raft's state machine safety (every server
//! commits the same entry at each index) is checked as it goes, by [`World::committed`], each
//! blocking read's answer as it arrives ([`BlockingAnswer`]), and the servers' sessions
//! against the session contract once the faults have healed ([`sessions_agree`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use tokio::time::Instant;

use crate::linear;
use crate::workload::{Applied, Grant, History, TTL};
use crate::world::World;

/// A blocking read's answer, as its client saw it.
pub struct BlockingAnswer {
    /// The index asked for, and the client's wait (the agent's jitter aside).
    pub min_index: u64,
    pub wait: Duration,
    /// The wait the server was asked for: `wait` and the jitter.
    pub wait_ms: u64,
    /// The index answered.
    pub index: u64,
    /// How long the servers held it: from the request's arrival to its answer's departure
    /// (the time it took, less its time on the network).
    pub served_in: Duration,
}

impl BlockingAnswer {
    /// What is wrong with it: answered later than `wait + wait/16`, or unchanged (an index not
    /// above the one asked for) before its wait was over. Consul's blocking query answers
    /// unchanged only when its wait runs out (it loops on every wake until the index moves
    /// past the one asked for: docs/consul-compatibility.md, "Blocking queries and
    /// consistency"), and so does Vigil.
    pub fn check(&self) -> Option<String> {
        // The servers' timers fire on whole milliseconds (tokio's resolution).
        let latest = self.wait + self.wait / 16 + Duration::from_millis(1);
        if self.served_in > latest {
            return Some(format!(
                "from index {} with a wait of {:?} was held {:?}, beyond wait + wait/16",
                self.min_index, self.wait, self.served_in
            ));
        }
        let asked = Duration::from_millis(self.wait_ms);
        if self.min_index > 0 && self.index <= self.min_index && self.served_in < asked {
            return Some(format!(
                "from index {} answered unchanged (index {}) after {:?}, before its wait of {asked:?}",
                self.min_index, self.index, self.served_in
            ));
        }
        None
    }
}

/// What is wrong with the sessions each running server holds: each must hold exactly those
/// the session contract, replayed over the committed log up to the entry it last applied,
/// leaves alive.
pub fn sessions_agree(world: &World, history: &History) -> Vec<String> {
    let mut out = Vec::new();
    for id in &world.servers {
        let Some(node) = world.node(*id) else {
            continue;
        };
        let applied = {
            let metrics = node.raft.metrics();
            metrics.borrow_watched().last_applied.map_or(0, |l| l.index)
        };
        let held: BTreeSet<String> = {
            let state = node.shared.read();
            state.sessions().list().map(|s| s.id.clone()).collect()
        };
        let alive = world.contract(&history.bindings, Some(applied)).alive;
        let alive: BTreeSet<String> = alive.into_keys().collect();
        if held != alive {
            out.push(format!(
                "server {id} at index {applied} holds sessions {:?} the session contract ended or never created, and lacks {:?}",
                held.difference(&alive).collect::<Vec<_>>(),
                alive.difference(&held).collect::<Vec<_>>()
            ));
        }
    }
    out
}

/// Every check's violations, described. `now` is the end of the run: every client stopped
/// renewing its session long enough before it for every session to have lapsed.
pub fn check(world: &World, history: &History, now: Instant) -> Vec<String> {
    let mut out = Vec::new();
    for (key, ops) in &history.registers {
        if let Err(anomaly) = linear::check(ops) {
            out.push(format!("register {key} is not linearizable: {anomaly}"));
        }
    }
    out.extend(grants("KV lock LockIndex", &history.kv_grants));
    out.extend(grants("lock queue token", &history.queue_grants));
    let contract = world.contract(&history.bindings, None);
    let invalidated = contract.invalidated;
    for session in contract.alive.keys() {
        let restarts = history.renewals.get(session);
        let since = restarts.and_then(|calls| calls.iter().max()).map_or(
            "never renewed".to_owned(),
            |at| {
                format!(
                    "{:?} after the last request that restarted it",
                    now.duration_since(*at)
                )
            },
        );
        out.push(format!(
            "session {session} outlived its TTL of {TTL:?}: alive at the end, {since}"
        ));
    }
    for (session, (index, _)) in &invalidated {
        let Some(ended) = world.committed_at(*index) else {
            continue;
        };
        let late = history
            .renewals
            .get(session)
            .and_then(|calls| calls.iter().filter(|c| **c > ended).min());
        if let Some(late) = late {
            out.push(format!(
                "session {session} was renewed by a request sent {:?} after its invalidation (index {index}) committed",
                late.duration_since(ended)
            ));
        }
    }
    out.extend(grants_after_invalidation(
        "KV lock",
        &history.kv_grants,
        &invalidated,
    ));
    out.extend(grants_after_invalidation(
        "queue's lock",
        &history.queue_grants,
        &invalidated,
    ));
    let clock = |grant: &Grant| match grant.applied {
        Applied::AtIndex(index) => world.stamp(index),
        Applied::At(ms) | Applied::By(ms) => Some(ms),
    };
    out.extend(handoffs(
        "the KV lock",
        &history.kv_grants,
        &history.kv_releases,
        &invalidated,
        &history.lock_delays,
        clock,
    ));
    out.extend(handoffs(
        "the queue's lock",
        &history.queue_grants,
        &history.queue_releases,
        &invalidated,
        &history.lock_delays,
        clock,
    ));
    for (session, answered) in &history.lost {
        if invalidated.get(session).is_none_or(|(_, at)| at > answered) {
            out.push(format!(
                "session {session} released the queue's lock it was granted and was told it did not hold it, its session not invalidated"
            ));
        }
    }
    for (session, answered) in &history.destroys {
        match invalidated.get(session) {
            Some((_, at)) if at <= answered => {}
            other => out.push(format!(
                "session {session}'s destroy was acknowledged at {answered} ms, its invalidation committed {}",
                other.map_or("never".to_owned(), |(_, at)| format!("at {at} ms"))
            )),
        }
    }
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

/// Grants to a session applied after the entry that invalidated it.
fn grants_after_invalidation(
    what: &str,
    grants: &[Grant],
    invalidated: &BTreeMap<String, (u64, u64)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for g in grants {
        let Some((index, stamp)) = invalidated.get(&g.session) else {
            continue;
        };
        let after = match g.applied {
            Applied::AtIndex(at) => at > *index,
            Applied::At(ms) => ms > *stamp,
            Applied::By(_) => false,
        };
        if after {
            out.push(format!(
                "the {what} was granted to session {} (client {}, {}) after its invalidation at index {index}",
                g.session, g.client, g.index
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

/// Handoffs of one lock: a grant to another session comes only once the holder before it let
/// go (its client sent a release) or its session was invalidated, and, after an invalidation,
/// only once the invalidated holder's lock-delay has passed since the invalidation was applied
/// (on the servers' clock, which stamps the entries the state machine applies: its lock-delay
/// runs from the invalidating entry's clock, and an acquire is refused while its own entry's
/// clock is within it). `clock` is when a grant was applied at the latest.
fn handoffs(
    what: &str,
    grants: &[Grant],
    releases: &BTreeMap<String, Vec<u64>>,
    invalidated: &BTreeMap<String, (u64, u64)>,
    lock_delays: &BTreeMap<String, Duration>,
    clock: impl Fn(&Grant) -> Option<u64>,
) -> Vec<String> {
    let mut out = Vec::new();
    for before in grants {
        let since = before.ret_ms;
        let released = releases
            .get(&before.session)
            .and_then(|r| r.iter().copied().filter(|at| *at >= since).min());
        let ended = invalidated.get(&before.session).map(|(_, at)| *at);
        let freed = released.into_iter().chain(ended).min();
        // Held when it was invalidated: no release sent before then.
        let delay = match (ended, released) {
            (Some(ended), None) => Some(ended),
            (Some(ended), Some(released)) if released > ended => Some(ended),
            _ => None,
        }
        .map(|ended| {
            let delay = lock_delays
                .get(&before.session)
                .map_or(0, |d| d.as_millis() as u64)
                .min(60_000);
            (ended, ended + delay)
        });
        for after in grants
            .iter()
            .filter(|g| g.index > before.index && g.session != before.session)
        {
            let Some(applied) = clock(after) else {
                continue;
            };
            if freed.is_none_or(|freed| applied < freed) {
                out.push(format!(
                    "{what} was granted to session {} (client {}, {}) at {applied} ms while session {} (client {}, {}) held it: released {released:?}, invalidated {ended:?}",
                    after.session, after.client, after.index, before.session, before.client, before.index
                ));
            } else if let Some((ended, until)) = delay.filter(|(_, until)| applied < *until) {
                out.push(format!(
                    "{what} was granted to session {} (client {}, {}) at {applied} ms, within the lock-delay of session {} (client {}, {}) invalidated at {ended} ms, until {until} ms",
                    after.session, after.client, after.index, before.session, before.client, before.index
                ));
            }
        }
    }
    out
}
