//! Lock history: what the state machine records of each lock's life (grants, releases, losses
//! with their cause, lock-delays, waiters giving up, keys deleted while held), derived in the
//! apply of the ops that cause them. These are the wire and snapshot forms; the JSON of
//! `/v1/vigil/history` is in [`crate::vigil_api`]. Enums are persisted: append variants only.

use serde::{Deserialize, Serialize};

use crate::lock::LockMode;

/// Which kind of lock a history belongs to: a KV key and a native lock may share a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LockKind {
    /// 0: a KV key acquired with a session (Consul's lock and semaphore recipes).
    Key,
    /// 1: a native lock (`/v1/vigil/lock/<name>`).
    Queue,
}

/// Why a session was invalidated, as the op that invalidated it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cause {
    /// 0: destroyed by a client (`PUT /v1/session/destroy`).
    Destroyed,
    /// 1: its TTL lapsed without a renewal (the leader's expiry).
    TtlExpired,
    /// 2: a check it is bound to went critical; `serfHealth` is its node failing.
    CheckCritical { node: String, check_id: String },
    /// 3: a check it is bound to was deregistered (alone or with its service).
    CheckDeregistered { node: String, check_id: String },
    /// 4: its node was deregistered.
    NodeDeregistered { node: String },
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// 0: the session was granted the lock: `token` is a KV key's LockIndex or a native lock's
    /// fencing token; `waited_ms` how long it waited in a native lock's queue (`None` for a
    /// key, whose waiters wait in their clients).
    Granted {
        node: String,
        session_name: String,
        token: u64,
        mode: LockMode,
        waited_ms: Option<u64>,
    },
    /// 1: the holder released it.
    Released,
    /// 2: the holder's session was invalidated.
    Lost { cause: Cause },
    /// 3: no grant before `until_ms` (leader wall clock), after an involuntary loss.
    LockDelay { until_ms: u64 },
    /// 4: a native lock's lock-delay ended (the leader's wake-up).
    LockDelayEnded,
    /// 5: a waiter left a native lock's queue: its request gave up (timed out, or its client
    /// went away: `cause` `None`), or its session was invalidated.
    GaveUp { cause: Option<Cause> },
    /// 6: the key was deleted while held.
    Deleted,
}

/// One event, at the raft index of the op that caused it and the leader's wall clock (ms since
/// the epoch) of its entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockEvent {
    pub index: u64,
    pub at_ms: u64,
    pub session: String,
    pub event: Event,
}

impl LockEvent {
    /// `event` of `session`, caused by the op at `index` of an entry the leader proposed at
    /// `at_ms`.
    pub fn new(index: u64, at_ms: u64, session: String, event: Event) -> LockEvent {
        LockEvent {
            index,
            at_ms,
            session,
            event,
        }
    }
}

/// One lock's recorded events, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHistory {
    pub name: String,
    pub kind: LockKind,
    pub events: Vec<LockEvent>,
}
