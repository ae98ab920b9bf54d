//! The native lock queue (`/v1/vigil/lock/<name>`), a Vigil addition beside Consul's KV locks:
//! the ops the state machine applies, what it answers, and the state a read returns.
//!
//! A lock has `limit` slots (1 for a mutex, N for a semaphore), holders and a FIFO queue of
//! waiters. An exclusive holder takes one slot; shared holders take none but exclude exclusive
//! ones. The front waiter is granted as soon as it fits, and only the front: a reader behind a
//! waiting writer waits. Every grant gets a fencing token above every token granted before it,
//! by any lock. Enums are persisted in the raft log: append variants only.

use serde::{Deserialize, Serialize};

/// Most slots a lock may have.
pub const MAX_LOCK_LIMIT: u32 = 1024;

/// In JSON `"exclusive"` or `"shared"`; on the wire and in the log its variant index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// 0: one slot of the lock (the whole lock when its limit is 1).
    #[default]
    Exclusive,
    /// 1: shared with other shared holders, never with exclusive ones.
    Shared,
}

impl LockMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        }
    }

    pub fn parse(s: &str) -> Option<LockMode> {
        match s {
            "" | "exclusive" => Some(LockMode::Exclusive),
            "shared" => Some(LockMode::Shared),
            _ => None,
        }
    }
}

/// A change to one lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockOp {
    /// 0: takes the lock at once if it is free for `mode` and nobody waits, else joins the
    /// queue (or, with `try_only`, answers busy and changes nothing). Idempotent for a session
    /// that already holds or waits.
    Acquire {
        name: String,
        session: String,
        mode: LockMode,
        limit: u32,
        try_only: bool,
    },
    /// 1: the session releases the lock or leaves the queue; whoever is due is granted in the
    /// same entry.
    Release { name: String, session: String },
    /// 2: leader-internal, when the lock's lock-delay has passed: grants whoever is due.
    Wake { name: String },
    /// 3: [`LockOp::Acquire`] made by the request `request` (a random ID the agent draws for
    /// each HTTP request): the session's standing, new or already there, is claimed by this
    /// request, so only this request's [`LockOp::Leave`] can take it out of the queue. A
    /// session asking for a stronger mode than it holds or waits for is refused (an upgrade),
    /// unless it is the lock's only holder; a weaker or equal mode is answered with the
    /// standing as stored.
    Enqueue {
        name: String,
        session: String,
        mode: LockMode,
        limit: u32,
        try_only: bool,
        request: u64,
    },
    /// 4: the request `request` gives up: the session leaves the queue if it still waits
    /// there under this request. A grant, or a place claimed by a newer request of the same
    /// session, is left alone (a grant stays with the session, as a lost reply to Consul's
    /// `?acquire` does).
    Leave {
        name: String,
        session: String,
        request: u64,
    },
}

impl LockOp {
    pub fn name(&self) -> &str {
        match self {
            LockOp::Acquire { name, .. }
            | LockOp::Release { name, .. }
            | LockOp::Wake { name }
            | LockOp::Enqueue { name, .. }
            | LockOp::Leave { name, .. } => name,
        }
    }

    /// The op the previous release understands, for a cluster some of whose servers still run
    /// it (it cannot decode [`LockOp::Enqueue`] or [`LockOp::Leave`]): the request identity is
    /// dropped, so a leave is a plain release, as that release made it.
    pub fn downgraded(self) -> LockOp {
        match self {
            LockOp::Enqueue {
                name,
                session,
                mode,
                limit,
                try_only,
                request: _,
            } => LockOp::Acquire {
                name,
                session,
                mode,
                limit,
                try_only,
            },
            LockOp::Leave {
                name,
                session,
                request: _,
            } => LockOp::Release { name, session },
            op => op,
        }
    }
}

/// What applying a [`LockOp`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockOutcome {
    /// 0: the session holds the lock with this fencing token.
    Held { token: u64 },
    /// 1: the session waits at `position` (1: next in line) since raft index `index`.
    Queued { position: u64, index: u64 },
    /// 2: a try-acquire found the lock taken, or in its lock-delay for `lock_delay_ms` more.
    Busy { lock_delay_ms: u64 },
    /// 3: what the released session had: the lock, a place in the queue, or neither.
    Released { held: bool, queued: bool },
    /// 4: a wake-up ran.
    Woken,
    /// 5: ([`LockOp::Enqueue`]) the session holds the lock with this fencing token, in `mode`
    /// (what it holds, which may be stronger than what this request asked for).
    Granted { token: u64, mode: LockMode },
    /// 6: ([`LockOp::Enqueue`]) the session waits in `mode` at `position` (1: next in line)
    /// since raft index `index`.
    Waiting {
        position: u64,
        index: u64,
        mode: LockMode,
    },
    /// 7: ([`LockOp::Leave`]) the request's place in the queue is given up.
    Left,
    /// 8: ([`LockOp::Leave`]) nothing changed: the session's standing as stored (a grant, a
    /// place claimed by a newer request, or none).
    Stayed(LockHold),
}

/// Where one session stands on one lock, as stored: the mode it holds or waits for, and its
/// place in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockHold {
    /// 0: granted with `token` in `mode` by an entry the leader proposed at `since_ms` (its
    /// wall clock).
    Held {
        token: u64,
        since_ms: u64,
        mode: LockMode,
    },
    /// 1: waiting in `mode` at `position` (1: next in line).
    Queued { position: u64, mode: LockMode },
    /// 2: neither holds nor waits (released, given up, or its session is gone).
    Absent,
}

/// One holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub session: String,
    pub mode: LockMode,
    pub token: u64,
    /// Leader wall clock (ms since the epoch) and raft index of the grant.
    pub since_ms: u64,
    pub index: u64,
}

/// One contender waiting in a lock's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockWaiter {
    pub session: String,
    pub mode: LockMode,
    /// Leader wall clock (ms since the epoch) and raft index of the enqueue.
    pub since_ms: u64,
    pub index: u64,
}

/// A lock as the state machine holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockState {
    pub name: String,
    pub limit: u32,
    pub holders: Vec<LockHolder>,
    /// In grant order: the front is next.
    pub waiters: std::collections::VecDeque<LockWaiter>,
    /// Token of the latest grant (0: never granted since the lock was created).
    pub token: u64,
    /// Grants since the lock was created.
    pub grants: u64,
    /// No grant before this leader wall-clock time (ms), after a holder was lost involuntarily.
    pub delay_until_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

impl LockState {
    /// Can a contender in `mode` take a slot now (lock-delay aside)?
    pub fn admits(&self, mode: LockMode) -> bool {
        match mode {
            LockMode::Exclusive => {
                self.holders.iter().all(|h| h.mode == LockMode::Exclusive)
                    && self.holders.len() < self.limit as usize
            }
            LockMode::Shared => self.holders.iter().all(|h| h.mode == LockMode::Shared),
        }
    }

    pub fn holder(&self, session: &str) -> Option<&LockHolder> {
        self.holders.iter().find(|h| h.session == session)
    }

    /// 1-based queue position of `session`.
    pub fn position(&self, session: &str) -> Option<u64> {
        self.waiters
            .iter()
            .position(|w| w.session == session)
            .map(|p| p as u64 + 1)
    }

    /// Milliseconds of lock-delay left at `now_ms`.
    pub fn delay_left_ms(&self, now_ms: u64) -> u64 {
        self.delay_until_ms.saturating_sub(now_ms)
    }
}

/// Where one session stands on one lock (what a waiting contender blocks on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockStanding {
    /// 0: granted with `token` by an entry the leader proposed at `since_ms` (its wall clock).
    Held { token: u64, since_ms: u64 },
    /// 1
    Queued { position: u64 },
    /// 2: neither holds nor waits (released, cancelled, or its session is gone).
    Absent,
}
