//! The lock history: the last events of each lock (a KV key acquired with a session, or a
//! native lock), derived in the apply of the ops that cause them, so every server holds the
//! same history at the same index, and it travels in snapshots (format 5, from protocol
//! level 2). Bounded per lock and in total: the oldest event of a lock over its bound goes,
//! and over the total the oldest event of all goes (a lock whose last event goes is dropped).
//! The bounds are each server's own configuration ([`set_limits`]); set them alike on every
//! server, since a server trims to its own bounds as it applies.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use vigil_shared::history::{LockEvent, LockHistory, LockKind};

/// Events kept per lock unless configured otherwise.
pub const DEFAULT_PER_LOCK: usize = 100;
/// Events kept in all unless configured otherwise.
pub const DEFAULT_TOTAL: usize = 50_000;

static PER_LOCK: AtomicUsize = AtomicUsize::new(DEFAULT_PER_LOCK);
static TOTAL: AtomicUsize = AtomicUsize::new(DEFAULT_TOTAL);

/// How many events are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_lock: usize,
    pub total: usize,
}

impl Limits {
    /// This process's bounds.
    pub fn configured() -> Limits {
        Limits {
            per_lock: PER_LOCK.load(Ordering::Relaxed),
            total: TOTAL.load(Ordering::Relaxed),
        }
    }
}

/// Sets this process's history bounds (`--lock-history-per-lock`, `--lock-history-total`);
/// each is at least 1.
pub fn set_limits(limits: Limits) {
    PER_LOCK.store(limits.per_lock.max(1), Ordering::Relaxed);
    TOTAL.store(limits.total.max(1), Ordering::Relaxed);
}

type LockId = (String, LockKind);

/// Events of one lock, each with its sequence number (order of recording, across locks).
type Events = VecDeque<(u64, LockEvent)>;

#[derive(Debug, Clone, Default)]
pub struct History {
    locks: BTreeMap<LockId, Events>,
    /// Sequence number of the next event.
    next_seq: u64,
    /// Events held in all.
    total: usize,
    /// `(seq, lock)` in recording order, to find the oldest event of all. An event trimmed by
    /// its lock's own bound leaves its entry behind, skipped when met and swept once they
    /// outnumber the live ones.
    order: VecDeque<(u64, LockId)>,
}

impl PartialEq for History {
    fn eq(&self, other: &History) -> bool {
        self.locks == other.locks && self.next_seq == other.next_seq
    }
}

impl Eq for History {}

/// What a snapshot holds of the history (the order is rebuilt from the sequence numbers).
#[derive(Serialize)]
pub struct Encoded<'a> {
    locks: &'a BTreeMap<LockId, Events>,
    next_seq: u64,
}

#[derive(Deserialize)]
pub struct Decoded {
    locks: BTreeMap<LockId, Events>,
    next_seq: u64,
}

impl History {
    pub fn encoded(&self) -> Encoded<'_> {
        Encoded {
            locks: &self.locks,
            next_seq: self.next_seq,
        }
    }

    pub fn from_decoded(decoded: Decoded) -> History {
        let Decoded { locks, next_seq } = decoded;
        let mut order: Vec<(u64, LockId)> = locks
            .iter()
            .flat_map(|(id, events)| events.iter().map(move |(seq, _)| (*seq, id.clone())))
            .collect();
        order.sort_unstable_by_key(|(seq, _)| *seq);
        let mut history = History {
            total: order.len(),
            order: order.into(),
            locks,
            next_seq,
        };
        history.trim(None, Limits::configured());
        history
    }

    /// Events held in all.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Records `event` on lock `name`, then trims to `limits`.
    pub fn record_within(&mut self, name: &str, kind: LockKind, event: LockEvent, limits: Limits) {
        let id = (name.to_owned(), kind);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.locks
            .entry(id.clone())
            .or_default()
            .push_back((seq, event));
        self.order.push_back((seq, id.clone()));
        self.total += 1;
        self.trim(Some(&id), limits);
    }

    /// Drops what is over the bounds: each lock's oldest events over its own (`only`: that
    /// lock's alone), then the oldest of all over the total.
    fn trim(&mut self, only: Option<&LockId>, limits: Limits) {
        let Limits { per_lock, total } = limits;
        let mut over = |events: &mut Events| {
            while events.len() > per_lock {
                events.pop_front();
                self.total -= 1;
            }
        };
        match only {
            Some(id) => self.locks.get_mut(id).into_iter().for_each(&mut over),
            None => self.locks.values_mut().for_each(&mut over),
        }
        while self.total > total {
            let Some((seq, id)) = self.order.pop_front() else {
                break;
            };
            let Some(events) = self.locks.get_mut(&id) else {
                continue;
            };
            if events.front().is_some_and(|(front, _)| *front == seq) {
                events.pop_front();
                self.total -= 1;
                if events.is_empty() {
                    self.locks.remove(&id);
                }
            }
        }
        if self.order.len() > 2 * self.total + 64 {
            let locks = &self.locks;
            self.order.retain(|(seq, id)| {
                locks
                    .get(id)
                    .and_then(|events| events.front())
                    .is_some_and(|(front, _)| front <= seq)
            });
        }
    }

    /// The events of one lock, oldest first.
    pub fn events(
        &self,
        name: &str,
        kind: LockKind,
    ) -> impl DoubleEndedIterator<Item = &LockEvent> {
        self.locks
            .get(&(name.to_owned(), kind))
            .into_iter()
            .flatten()
            .map(|(_, e)| e)
    }

    /// The histories of the locks named `name` or, with `prefix`, of every lock whose name
    /// starts with it, in name order; and the highest index among their events (0: none).
    pub fn read(&self, name: &str, prefix: bool) -> (Vec<LockHistory>, u64) {
        let from = (name.to_owned(), LockKind::Key);
        let found: Vec<LockHistory> = self
            .locks
            .range(from..)
            .take_while(|((n, _), _)| {
                if prefix {
                    n.starts_with(name)
                } else {
                    n == name
                }
            })
            .map(|((n, kind), events)| LockHistory {
                name: n.clone(),
                kind: *kind,
                events: events.iter().map(|(_, e)| e.clone()).collect(),
            })
            .collect();
        let index = found
            .iter()
            .filter_map(|h| h.events.last().map(|e| e.index))
            .max()
            .unwrap_or(0);
        (found, index)
    }
}
