//! The four safety checks, as pure functions of what a run recorded: the workers' lines (each
//! grant with the raft indexes at which its holder saw itself owning the lock), the bank's
//! decisions in the order it made them, the register workload's acknowledged writes and what
//! reads back at the end, and when the lock was granted after the faults stopped.
//!
//! Ground truth for "who held the lock when" is the server's history as linearizable reads
//! observed it: a worker confirms at start (and again at the end) with a `?consistent` read of
//! the lock's prefix that it is the owner, and notes that read's `X-Consul-Index` (the raft
//! index of the prefix's last change: the ownership it saw held from that index on). Grants
//! ordered by that index are the order in which the cluster granted the lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use vigil_demo::{Decision, WorkerEvent, WorkerLine};

/// Which property a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Property {
    /// (a) The bank never accepts a write with a stale token.
    StaleWrite,
    /// (b) No two holders' grants overlap in the server's history, and tokens follow grants.
    Overlap,
    /// (c) Every acknowledged KV write reads back at the end.
    LostWrite,
    /// (d) A lock is granted within the bound after the faults stop.
    Recovery,
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Property::StaleWrite => "(a) stale write accepted",
            Property::Overlap => "(b) overlapping grants",
            Property::LostWrite => "(c) lost write",
            Property::Recovery => "(d) no recovery",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub property: Property,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.property, self.what)
    }
}

fn violation(property: Property, what: String) -> Violation {
    Violation { property, what }
}

/// One turn of a worker holding the lock, assembled from its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub node: String,
    pub session: String,
    pub lock_index: u64,
    pub create_index: Option<u64>,
    /// Worker's wall clock when it started.
    pub at_ms: u64,
    /// Raft index of the read that confirmed ownership at start (`None`: the read failed).
    pub start_index: Option<u64>,
    /// Whether that read showed this worker owning the lock.
    pub confirmed: bool,
    /// The last raft index at which the worker saw itself owning the lock (from its `release`
    /// line; the start index when it never got that far).
    pub end_index: Option<u64>,
}

impl Grant {
    /// Fencing order of the token: `(CreateIndex, LockIndex)`, as the bank compares them.
    fn rank(&self) -> (u64, u64) {
        (self.create_index.unwrap_or(0), self.lock_index)
    }

    /// `[start, end]` in raft indexes, for a confirmed grant.
    fn interval(&self) -> Option<(u64, u64)> {
        let start = self.start_index.filter(|_| self.confirmed)?;
        Some((start, self.end_index.unwrap_or(start).max(start)))
    }
}

/// The grants in `lines`, one per `grant` line, with the end index from the same session's
/// `release` line.
pub fn grants(lines: &[WorkerLine]) -> Vec<Grant> {
    let mut ends: HashMap<&str, u64> = HashMap::new();
    for line in lines {
        if let WorkerEvent::Release { index, .. } = &line.event {
            ends.insert(&line.session, *index);
        }
    }
    lines
        .iter()
        .filter_map(|line| match &line.event {
            WorkerEvent::Grant {
                lock_index,
                create_index,
                index,
                owner,
                ..
            } => Some(Grant {
                node: line.node.clone(),
                session: line.session.clone(),
                lock_index: *lock_index,
                create_index: *create_index,
                at_ms: line.at_ms,
                start_index: *index,
                confirmed: *owner && index.is_some(),
                end_index: ends.get(line.session.as_str()).copied(),
            }),
            _ => None,
        })
        .collect()
}

/// Confirmed grants in the order the cluster granted them.
pub fn confirmed_in_order(grants: &[Grant]) -> Vec<&Grant> {
    let mut confirmed: Vec<&Grant> = grants.iter().filter(|g| g.interval().is_some()).collect();
    confirmed.sort_by_key(|g| (g.start_index, g.at_ms));
    confirmed
}

/// (a) Replays the bank's decisions: every accepted write must come from a confirmed holder,
/// and never from an earlier holder once a later one's write was accepted.
pub fn check_bank(grants: &[Grant], decisions: &[Decision]) -> Vec<Violation> {
    let order = confirmed_in_order(grants);
    let position: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, g)| (g.session.as_str(), i))
        .collect();
    let mut out = Vec::new();
    let mut newest: Option<(usize, &Decision)> = None;
    for d in decisions.iter().filter(|d| d.accepted) {
        let Some(&pos) = position.get(d.writer.as_str()) else {
            out.push(violation(
                Property::StaleWrite,
                format!(
                    "bank write #{} (write {} of {}) accepted from session {}, which never held the lock",
                    d.n, d.seq, d.node, d.writer
                ),
            ));
            continue;
        };
        match newest {
            Some((latest, by)) if pos < latest => out.push(violation(
                Property::StaleWrite,
                format!(
                    "bank write #{} (write {} of {}, grant {} of the run) accepted after write #{} of a later holder ({}, grant {})",
                    d.n,
                    d.seq,
                    d.node,
                    pos + 1,
                    by.n,
                    by.node,
                    latest + 1
                ),
            )),
            Some((latest, _)) if pos == latest => {}
            _ => newest = Some((pos, d)),
        }
    }
    out
}

/// (b) Grants, in the order the cluster granted them, must not overlap in raft indexes (each
/// holder's last confirmed index comes before the next holder's first), and their tokens must
/// grow in that order (or the bank would fence the wrong holder).
pub fn check_grants(grants: &[Grant]) -> Vec<Violation> {
    let order = confirmed_in_order(grants);
    let mut out = Vec::new();
    let mut sessions = BTreeSet::new();
    for g in &order {
        if !sessions.insert(g.session.as_str()) {
            out.push(violation(
                Property::Overlap,
                format!("session {} was granted the lock twice", g.session),
            ));
        }
    }
    let mut latest: Option<(&Grant, u64)> = None;
    for pair in order.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        if next.rank() <= prev.rank() {
            out.push(violation(
                Property::Overlap,
                format!(
                    "token order disagrees with grant order: {} (CreateIndex {:?}, LockIndex {}) was granted after {} (CreateIndex {:?}, LockIndex {})",
                    next.node,
                    next.create_index,
                    next.lock_index,
                    prev.node,
                    prev.create_index,
                    prev.lock_index
                ),
            ));
        }
    }
    for g in order {
        let (start, end) = g.interval().expect("confirmed grants have an interval");
        if let Some((holder, holder_end)) = latest
            && start <= holder_end
        {
            out.push(violation(
                Property::Overlap,
                format!(
                    "{} (session {}) owned the lock at index {start} while {} (session {}) still owned it until index {holder_end}",
                    g.node, g.session, holder.node, holder.session
                ),
            ));
        }
        if latest.is_none_or(|(_, e)| end > e) {
            latest = Some((g, end));
        }
    }
    out
}

/// (c) Every acknowledged write reads back with its value, and nothing reads back that was
/// never written.
pub fn check_registers(
    acked: &BTreeMap<String, String>,
    attempted: &BTreeSet<String>,
    final_state: &BTreeMap<String, String>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for (key, value) in acked {
        match final_state.get(key) {
            Some(v) if v == value => {}
            Some(v) => out.push(violation(
                Property::LostWrite,
                format!("{key}: acknowledged {value:?}, reads back {v:?}"),
            )),
            None => out.push(violation(
                Property::LostWrite,
                format!("{key}: acknowledged {value:?}, gone at the end"),
            )),
        }
    }
    for key in final_state.keys().filter(|k| !attempted.contains(*k)) {
        out.push(violation(
            Property::LostWrite,
            format!("{key} reads back but was never written"),
        ));
    }
    out
}

/// How long after `healed_ms` (wall clock) the lock was next granted (and confirmed).
pub fn recovery_time(grants: &[Grant], healed_ms: u64) -> Option<Duration> {
    grants
        .iter()
        .filter(|g| g.confirmed && g.at_ms >= healed_ms)
        .map(|g| g.at_ms - healed_ms)
        .min()
        .map(Duration::from_millis)
}

/// (d) The lock was granted within `bound` of the last fault being healed.
pub fn check_recovery(recovery: Option<Duration>, bound: Duration) -> Vec<Violation> {
    match recovery {
        Some(t) if t <= bound => Vec::new(),
        Some(t) => vec![violation(
            Property::Recovery,
            format!("the lock was granted {t:?} after the faults stopped (bound {bound:?})"),
        )],
        None => vec![violation(
            Property::Recovery,
            format!("no lock was granted within {bound:?} after the faults stopped"),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_demo::Token;

    fn line(node: &str, session: &str, at_ms: u64, event: WorkerEvent) -> WorkerLine {
        WorkerLine {
            node: node.into(),
            session: session.into(),
            at_ms,
            event,
        }
    }

    fn grant_line(session: &str, create_index: u64, index: u64, owner: bool) -> WorkerLine {
        line(
            session,
            session,
            index * 10,
            WorkerEvent::Grant {
                key: format!("demo/leader/{session}"),
                lock_index: 1,
                create_index: Some(create_index),
                index: Some(index),
                owner,
                pid: 1,
                error: None,
            },
        )
    }

    fn release_line(session: &str, index: u64) -> WorkerLine {
        line(
            session,
            session,
            index * 10,
            WorkerEvent::Release {
                index,
                owner: true,
                error: None,
            },
        )
    }

    fn decision(n: u64, writer: &str, accepted: bool) -> Decision {
        Decision {
            n,
            at_ms: n,
            node: writer.into(),
            writer: writer.into(),
            seq: n,
            token: Some(Token {
                key: format!("demo/leader/{writer}"),
                lock_index: 1,
                session: writer.into(),
                create_index: 0,
            }),
            accepted,
            reason: None,
        }
    }

    /// a (created at 3) held 5..7, b (created at 6) held 9..9, c (created at 8) from 12.
    fn history() -> Vec<WorkerLine> {
        vec![
            grant_line("a", 3, 5, true),
            grant_line("b", 6, 9, true),
            release_line("a", 7),
            release_line("b", 9),
            grant_line("c", 8, 12, true),
        ]
    }

    #[test]
    fn grants_take_their_end_from_the_release_line() {
        let g = grants(&history());
        assert_eq!(g.len(), 3);
        assert_eq!((g[0].start_index, g[0].end_index), (Some(5), Some(7)));
        assert_eq!(g[2].end_index, None, "c never released");
        assert_eq!(g[2].interval(), Some((12, 12)));
    }

    #[test]
    fn a_clean_history_has_no_violations() {
        let g = grants(&history());
        assert!(check_grants(&g).is_empty(), "{:?}", check_grants(&g));
        let bank = [
            decision(1, "a", true),
            decision(2, "a", true),
            decision(3, "b", true),
            decision(4, "a", false),
            decision(5, "c", true),
        ];
        assert!(
            check_bank(&g, &bank).is_empty(),
            "{:?}",
            check_bank(&g, &bank)
        );
    }

    #[test]
    fn an_earlier_holder_accepted_after_a_later_one_is_a_stale_write() {
        let g = grants(&history());
        let bank = [
            decision(1, "a", true),
            decision(2, "b", true),
            decision(3, "a", true),
            decision(4, "x", true),
        ];
        let v = check_bank(&g, &bank);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|v| v.property == Property::StaleWrite));
        assert!(
            v[0].what.contains("#3") && v[0].what.contains("#2"),
            "{v:?}"
        );
        assert!(v[1].what.contains("never held"), "{v:?}");
    }

    #[test]
    fn an_unconfirmed_grant_cannot_write() {
        let mut lines = history();
        lines.push(grant_line("d", 20, 30, false));
        let g = grants(&lines);
        assert!(
            check_grants(&g).is_empty(),
            "unconfirmed grants are not intervals"
        );
        let v = check_bank(&g, &[decision(1, "d", true)]);
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn overlapping_intervals_and_tokens_out_of_order_are_reported() {
        let overlapping = [
            grant_line("a", 3, 5, true),
            release_line("a", 10),
            grant_line("b", 6, 9, true),
        ];
        let v = check_grants(&grants(&overlapping));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("until index 10"), "{v:?}");

        let backwards = [grant_line("a", 8, 5, true), grant_line("b", 6, 9, true)];
        let v = check_grants(&grants(&backwards));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.starts_with("token order"), "{v:?}");

        let twice = [grant_line("a", 3, 5, true), grant_line("a", 3, 9, true)];
        let v = check_grants(&grants(&twice));
        assert!(v.iter().any(|v| v.what.contains("twice")), "{v:?}");
    }

    #[test]
    fn registers_must_read_back_what_was_acknowledged() {
        let acked = BTreeMap::from([("k1".to_owned(), "1".to_owned()), ("k2".into(), "2".into())]);
        let attempted = BTreeSet::from(["k1".to_owned(), "k2".into(), "k3".into()]);
        let ok = BTreeMap::from([
            ("k1".to_owned(), "1".to_owned()),
            ("k2".into(), "2".into()),
            ("k3".into(), "3".into()),
        ]);
        assert!(
            check_registers(&acked, &attempted, &ok).is_empty(),
            "k3 was in doubt"
        );
        let bad = BTreeMap::from([("k1".to_owned(), "x".to_owned()), ("k9".into(), "9".into())]);
        let v = check_registers(&acked, &attempted, &bad);
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn recovery_is_the_first_confirmed_grant_after_the_heal() {
        let g = grants(&history());
        assert_eq!(recovery_time(&g, 60), Some(Duration::from_millis(30)));
        assert_eq!(recovery_time(&g, 121), None);
        assert!(check_recovery(Some(Duration::from_secs(1)), Duration::from_secs(2)).is_empty());
        assert_eq!(
            check_recovery(Some(Duration::from_secs(3)), Duration::from_secs(2)).len(),
            1
        );
        assert_eq!(check_recovery(None, Duration::from_secs(2)).len(), 1);
    }
}
