//! The native lock table: each lock's holders and FIFO queue, and the sessions on each lock.
//!
//! Invariants:
//! - A session appears at most once per lock, as a holder or as a waiter.
//! - Only the front waiter is ever granted, and only when it fits ([`LockState::admits`]) and
//!   the lock-delay has passed; a grant happens in the apply of whatever made it possible (a
//!   release, a cancel, an invalidation, a wake-up), so a handoff is one raft entry.
//! - Fencing tokens grow across all locks and never go back: a grant at raft index `i` gets
//!   `max(last_token + 1, i)`, and `last_token` is in snapshots. A lock with no holder, no
//!   waiter and no lock-delay left is dropped; its successor's tokens continue above it.
//! - Losing a holder involuntarily (its session invalidated) arms the lock-delay of that
//!   session, capped to 60 s; the leader proposes [`LockOp::Wake`] when it ends.
//! - A waiter's place belongs to the request that claimed it last ([`LockOp::Enqueue`]); only
//!   that request's [`LockOp::Leave`] takes it out of the queue, and no leave ever takes a
//!   grant back. A session never holds or waits in a mode it did not get: asking for a
//!   stronger one than it has is refused, unless it is the only holder (an upgrade in place,
//!   with a new token).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use vigil_shared::MAX_LOCK_DELAY_MS;
use vigil_shared::lock::{
    LockHold, LockHolder, LockMode, LockOp, LockOutcome, LockStanding, LockState, LockWaiter,
};
use vigil_shared::rpc::ApplyError;

use super::session::SessionStore;

/// What a lock change touched, for wakeups and leader duties.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LockEffects {
    /// Locks whose state changed.
    pub changed: Vec<String>,
    /// `(lock, session)` pairs whose standing changed: granted, or left the queue.
    pub standings: Vec<(String, String)>,
    /// `(lock, until_ms)`: grants wait for a lock-delay ending then.
    pub delays: Vec<(String, u64)>,
    /// What happened to whom, in order, for the lock history: `(lock, session, what)`.
    pub events: Vec<(String, String, QueueEvent)>,
}

/// What happened on a lock, as the lock table sees it; the state machine adds who the session
/// is and why it was invalidated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueEvent {
    /// Granted after waiting `waited_ms` in the queue (0: at once).
    Granted {
        token: u64,
        mode: LockMode,
        waited_ms: u64,
    },
    /// The holder released it.
    Released,
    /// A waiter left the queue on its own (its request gave up).
    GaveUp,
    /// The holder's session was invalidated.
    Lost,
    /// A waiter's session was invalidated.
    WaiterLost,
    /// Lock-delay armed until then.
    LockDelay { until_ms: u64 },
    /// The leader's wake-up after the lock-delay.
    LockDelayEnded,
}

/// Who asks for a lock, and how.
struct Contender {
    session: String,
    mode: LockMode,
    limit: u32,
    try_only: bool,
    /// The asking request's identity (0: none, [`LockOp::Acquire`]).
    request: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    locks: BTreeMap<String, LockState>,
    /// Session ID → names of the locks it holds or waits on.
    by_session: HashMap<String, BTreeSet<String>>,
    /// The highest fencing token granted so far.
    last_token: u64,
    /// Raft index of the latest change to any lock.
    table_index: u64,
}

/// `(lock, session)` → the request whose [`LockOp::Leave`] may take the session's place in
/// that lock's queue (waiters only; 0 for a place taken by [`LockOp::Acquire`]). The state
/// machine keeps it after every table of the first release, so that release's snapshot
/// encoding stays a prefix of this one's.
pub type Requests = BTreeMap<(String, String), u64>;

impl LockTable {
    pub fn get(&self, name: &str) -> Option<&LockState> {
        self.locks.get(name)
    }

    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// The locks whose names start with `prefix`, in name order.
    pub fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a LockState> + 'a {
        self.locks
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, l)| l)
    }

    /// Raises the token floor: every later grant gets a token above `floor` (a restore carries
    /// the replaced state's last token over, so no token goes backwards).
    pub fn raise_token_floor(&mut self, floor: u64) {
        self.last_token = self.last_token.max(floor);
    }

    /// Every `(lock, session)` pair of a holder or a waiter.
    pub fn contenders(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.locks.values().flat_map(|l| {
            l.holders
                .iter()
                .map(|h| &h.session)
                .chain(l.waiters.iter().map(|w| &w.session))
                .map(|s| (l.name.clone(), s.clone()))
        })
    }

    /// Locks with a lock-delay end recorded and someone waiting: `(name, until_ms)`.
    pub fn pending_delays(&self) -> impl Iterator<Item = (&str, u64)> {
        self.locks
            .values()
            .filter(|l| l.delay_until_ms > 0 && !l.waiters.is_empty())
            .map(|l| (l.name.as_str(), l.delay_until_ms))
    }

    pub fn standing(&self, name: &str, session: &str) -> (LockStanding, u64) {
        let Some(lock) = self.locks.get(name) else {
            return (LockStanding::Absent, self.table_index);
        };
        if let Some(h) = lock.holder(session) {
            let held = LockStanding::Held {
                token: h.token,
                since_ms: h.since_ms,
            };
            return (held, h.index);
        }
        match lock.waiters.iter().position(|w| w.session == session) {
            Some(p) => (
                LockStanding::Queued {
                    position: p as u64 + 1,
                },
                lock.waiters[p].index,
            ),
            None => (LockStanding::Absent, self.table_index),
        }
    }

    /// Where `session` stands on `name`, with its mode, and the index of that standing.
    pub fn hold(&self, name: &str, session: &str) -> (LockHold, u64) {
        let Some(lock) = self.locks.get(name) else {
            return (LockHold::Absent, self.table_index);
        };
        if let Some(h) = lock.holder(session) {
            let held = LockHold::Held {
                token: h.token,
                since_ms: h.since_ms,
                mode: h.mode,
            };
            return (held, h.index);
        }
        match lock.waiters.iter().position(|w| w.session == session) {
            Some(p) => (
                LockHold::Queued {
                    position: p as u64 + 1,
                    mode: lock.waiters[p].mode,
                },
                lock.waiters[p].index,
            ),
            None => (LockHold::Absent, self.table_index),
        }
    }

    /// Is `session` holding `name` with exactly `token`? `Err` says why not.
    pub fn check_sequencer(&self, name: &str, token: u64, session: &str) -> Result<(), String> {
        let Some(lock) = self.locks.get(name) else {
            return Err(format!("lock \"{name}\" is not held"));
        };
        match lock
            .holders
            .iter()
            .find(|h| h.session.eq_ignore_ascii_case(session))
        {
            None => Err(format!("lock \"{name}\" is not held by session {session}")),
            Some(h) if h.token != token => Err(format!(
                "token {token} is not current (the session holds token {})",
                h.token
            )),
            Some(_) => Ok(()),
        }
    }

    /// Applies `op` at `index`. `legacy`: the cluster's protocol is below 2, where
    /// [`LockOp::Acquire`] answers a contender whatever mode it asks, as the first release did.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        op: LockOp,
        sessions: &SessionStore,
        requests: &mut Requests,
        index: u64,
        now_ms: u64,
        legacy: bool,
        fx: &mut LockEffects,
    ) -> Result<LockOutcome, ApplyError> {
        match op {
            LockOp::Acquire {
                name,
                session,
                mode,
                limit,
                try_only,
            } => {
                let Some(found) = sessions.get(&session) else {
                    return Err(ApplyError::LockSession(session));
                };
                let contender = Contender {
                    session: found.id.clone(),
                    mode,
                    limit,
                    try_only,
                    request: 0,
                };
                let outcome =
                    self.enqueue(&name, &contender, requests, legacy, index, now_ms, fx)?;
                // The first release's answers, which carry no mode.
                Ok(match outcome {
                    LockOutcome::Granted { token, .. } => LockOutcome::Held { token },
                    LockOutcome::Waiting {
                        position, index, ..
                    } => LockOutcome::Queued { position, index },
                    other => other,
                })
            }
            LockOp::Enqueue {
                name,
                session,
                mode,
                limit,
                try_only,
                request,
            } => {
                let Some(found) = sessions.get(&session) else {
                    return Err(ApplyError::LockSession(session));
                };
                let contender = Contender {
                    session: found.id.clone(),
                    mode,
                    limit,
                    try_only,
                    request,
                };
                self.enqueue(&name, &contender, requests, false, index, now_ms, fx)
            }
            LockOp::Release { name, session } => {
                let session = sessions.get(&session).map_or(session, |s| s.id.clone());
                Ok(self.release(&name, &session, requests, index, now_ms, fx))
            }
            LockOp::Leave {
                name,
                session,
                request,
            } => {
                let session = sessions.get(&session).map_or(session, |s| s.id.clone());
                let claimed = requests.get(&(name.clone(), session.clone())).copied();
                match self.hold(&name, &session).0 {
                    LockHold::Queued { .. } if claimed == Some(request) => {
                        self.release(&name, &session, requests, index, now_ms, fx);
                        Ok(LockOutcome::Left)
                    }
                    hold => Ok(LockOutcome::Stayed(hold)),
                }
            }
            LockOp::Wake { name } => {
                if let Some(lock) = self.locks.get_mut(&name) {
                    if lock.delay_until_ms > 0 && lock.delay_left_ms(now_ms) == 0 {
                        fx.events
                            .push((name.clone(), String::new(), QueueEvent::LockDelayEnded));
                        // Its history changed: wake its readers.
                        fx.changed.push(name.clone());
                    }
                    if promote(lock, &mut self.last_token, requests, index, now_ms, fx) {
                        lock.modify_index = index;
                        self.table_index = index;
                        fx.changed.push(name.clone());
                    }
                    self.drop_if_idle(&name, now_ms);
                }
                Ok(LockOutcome::Woken)
            }
        }
    }

    /// Takes the lock for `c` or queues it; a session already holding or waiting keeps its
    /// standing, claimed by `c`'s request (a try claims nothing: it ends at once). Without
    /// `legacy`, a session asking for exclusive what it holds or waits for shared is refused,
    /// unless it is the only holder (then it is upgraded in place, with a new token).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &mut self,
        name: &str,
        c: &Contender,
        requests: &mut Requests,
        legacy: bool,
        index: u64,
        now_ms: u64,
        fx: &mut LockEffects,
    ) -> Result<LockOutcome, ApplyError> {
        if let Some(lock) = self.locks.get_mut(name) {
            let upgrade = |held: LockMode| {
                !legacy && c.mode == LockMode::Exclusive && held == LockMode::Shared
            };
            if let Some(h) = lock.holders.iter().position(|h| h.session == c.session) {
                let held = lock.holders[h].mode;
                if !upgrade(held) {
                    let token = lock.holders[h].token;
                    return Ok(LockOutcome::Granted { token, mode: held });
                }
                if lock.holders.len() > 1 {
                    return Err(ApplyError::LockUpgradeHeld {
                        lock: name.to_owned(),
                        session: c.session.clone(),
                    });
                }
                lock.holders.remove(h);
                let token = grant(
                    lock,
                    &mut self.last_token,
                    &c.session,
                    LockMode::Exclusive,
                    index,
                    now_ms,
                );
                lock.modify_index = index;
                self.table_index = index;
                fx.changed.push(name.to_owned());
                fx.standings.push((name.to_owned(), c.session.clone()));
                let granted = QueueEvent::Granted {
                    token,
                    mode: LockMode::Exclusive,
                    waited_ms: 0,
                };
                fx.events
                    .push((name.to_owned(), c.session.clone(), granted));
                return Ok(LockOutcome::Granted {
                    token,
                    mode: LockMode::Exclusive,
                });
            }
            if let Some(position) = lock.position(&c.session) {
                let waiter = &lock.waiters[position as usize - 1];
                if upgrade(waiter.mode) {
                    return Err(ApplyError::LockUpgradeQueued {
                        lock: name.to_owned(),
                        session: c.session.clone(),
                    });
                }
                let (index, mode) = (waiter.index, waiter.mode);
                if !legacy && !c.try_only {
                    requests.insert((name.to_owned(), c.session.clone()), c.request);
                }
                return Ok(LockOutcome::Waiting {
                    position,
                    index,
                    mode,
                });
            }
            let in_use = !lock.holders.is_empty() || !lock.waiters.is_empty();
            if in_use && lock.limit != c.limit {
                return Err(ApplyError::LockLimitConflict {
                    lock: lock.limit,
                    local: c.limit,
                });
            }
        }
        let lock = self
            .locks
            .entry(name.to_owned())
            .or_insert_with(|| LockState {
                name: name.to_owned(),
                limit: c.limit,
                holders: Vec::new(),
                waiters: VecDeque::new(),
                token: 0,
                grants: 0,
                delay_until_ms: 0,
                create_index: index,
                modify_index: index,
            });
        lock.limit = c.limit;
        let delay_left = lock.delay_left_ms(now_ms);
        let outcome = if lock.waiters.is_empty() && delay_left == 0 && lock.admits(c.mode) {
            let token = grant(
                lock,
                &mut self.last_token,
                &c.session,
                c.mode,
                index,
                now_ms,
            );
            let granted = QueueEvent::Granted {
                token,
                mode: c.mode,
                waited_ms: 0,
            };
            fx.events
                .push((name.to_owned(), c.session.clone(), granted));
            LockOutcome::Granted {
                token,
                mode: c.mode,
            }
        } else if c.try_only {
            self.drop_if_idle(name, now_ms);
            return Ok(LockOutcome::Busy {
                lock_delay_ms: delay_left,
            });
        } else {
            lock.waiters.push_back(LockWaiter {
                session: c.session.clone(),
                mode: c.mode,
                since_ms: now_ms,
                index,
            });
            if delay_left > 0 {
                fx.delays.push((name.to_owned(), lock.delay_until_ms));
            }
            if !legacy {
                requests.insert((name.to_owned(), c.session.clone()), c.request);
            }
            LockOutcome::Waiting {
                position: lock.waiters.len() as u64,
                index,
                mode: c.mode,
            }
        };
        lock.modify_index = index;
        self.table_index = index;
        self.by_session
            .entry(c.session.clone())
            .or_default()
            .insert(name.to_owned());
        fx.changed.push(name.to_owned());
        Ok(outcome)
    }

    fn release(
        &mut self,
        name: &str,
        session: &str,
        requests: &mut Requests,
        index: u64,
        now_ms: u64,
        fx: &mut LockEffects,
    ) -> LockOutcome {
        let Some(lock) = self.locks.get_mut(name) else {
            return LockOutcome::Released {
                held: false,
                queued: false,
            };
        };
        let (held, queued) = remove(lock, session);
        if !held && !queued {
            return LockOutcome::Released { held, queued };
        }
        requests.remove(&(name.to_owned(), session.to_owned()));
        let what = if held {
            QueueEvent::Released
        } else {
            QueueEvent::GaveUp
        };
        fx.events.push((name.to_owned(), session.to_owned(), what));
        self.after_leaving(name, session, queued, requests, index, now_ms, fx);
        self.forget(session, name);
        self.drop_if_idle(name, now_ms);
        LockOutcome::Released { held, queued }
    }

    /// Removes an invalidated session from every lock it holds or waits on. A lost holder arms
    /// the session's lock-delay (capped to 60 s) on that lock, and its standing is reported
    /// changed, since it did not ask (its own `lost()` watches it); whoever is due is granted.
    pub fn invalidate_session(
        &mut self,
        session: &str,
        lock_delay_ns: u64,
        requests: &mut Requests,
        index: u64,
        now_ms: u64,
        fx: &mut LockEffects,
    ) {
        let Some(names) = self.by_session.remove(session) else {
            return;
        };
        let delay_ms = (lock_delay_ns / 1_000_000).min(MAX_LOCK_DELAY_MS);
        for name in names {
            let Some(lock) = self.locks.get_mut(&name) else {
                continue;
            };
            let (held, queued) = remove(lock, session);
            requests.remove(&(name.clone(), session.to_owned()));
            if held {
                fx.events
                    .push((name.clone(), session.to_owned(), QueueEvent::Lost));
            } else if queued {
                fx.events
                    .push((name.clone(), session.to_owned(), QueueEvent::WaiterLost));
            }
            if held && delay_ms > 0 {
                lock.delay_until_ms = lock.delay_until_ms.max(now_ms + delay_ms);
                let armed = QueueEvent::LockDelay {
                    until_ms: lock.delay_until_ms,
                };
                fx.events.push((name.clone(), session.to_owned(), armed));
            }
            self.after_leaving(&name, session, held || queued, requests, index, now_ms, fx);
            self.drop_if_idle(&name, now_ms);
        }
    }

    /// Drops every idle lock whose lock-delay has ended (with the tombstone reaping).
    pub fn reap(&mut self, now_ms: u64) {
        self.locks.retain(|_, l| {
            !(l.holders.is_empty() && l.waiters.is_empty() && l.delay_left_ms(now_ms) == 0)
        });
    }

    /// After `session` left lock `name` (`tell`: its standing change is reported, since it did
    /// not ask itself: a waiter taken out of the queue, or any contender whose session was
    /// invalidated): grants whoever is now due and marks the lock changed at `index`.
    #[allow(clippy::too_many_arguments)]
    fn after_leaving(
        &mut self,
        name: &str,
        session: &str,
        tell: bool,
        requests: &mut Requests,
        index: u64,
        now_ms: u64,
        fx: &mut LockEffects,
    ) {
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        if tell {
            fx.standings.push((name.to_owned(), session.to_owned()));
        }
        promote(lock, &mut self.last_token, requests, index, now_ms, fx);
        lock.modify_index = index;
        self.table_index = index;
        fx.changed.push(name.to_owned());
    }

    fn forget(&mut self, session: &str, name: &str) {
        if let Some(names) = self.by_session.get_mut(session) {
            names.remove(name);
            if names.is_empty() {
                self.by_session.remove(session);
            }
        }
    }

    /// Drops a lock nobody holds or waits on once its lock-delay is over.
    fn drop_if_idle(&mut self, name: &str, now_ms: u64) {
        if self.locks.get(name).is_some_and(|l| {
            l.holders.is_empty() && l.waiters.is_empty() && l.delay_left_ms(now_ms) == 0
        }) {
            self.locks.remove(name);
        }
    }
}

/// Takes `session` out of the lock's holders or queue: `(was holder, was waiting)`.
fn remove(lock: &mut LockState, session: &str) -> (bool, bool) {
    let holders = lock.holders.len();
    lock.holders.retain(|h| h.session != session);
    let waiters = lock.waiters.len();
    lock.waiters.retain(|w| w.session != session);
    (lock.holders.len() < holders, lock.waiters.len() < waiters)
}

fn grant(
    lock: &mut LockState,
    last_token: &mut u64,
    session: &str,
    mode: LockMode,
    index: u64,
    now_ms: u64,
) -> u64 {
    let token = (*last_token + 1).max(index);
    *last_token = token;
    lock.token = token;
    lock.grants += 1;
    lock.holders.push(LockHolder {
        session: session.to_owned(),
        mode,
        token,
        since_ms: now_ms,
        index,
    });
    token
}

/// Grants the front waiters while they fit and the lock-delay is over. Returns whether any was
/// granted; a pending lock-delay is reported for the leader to wake the lock then.
fn promote(
    lock: &mut LockState,
    last_token: &mut u64,
    requests: &mut Requests,
    index: u64,
    now_ms: u64,
    fx: &mut LockEffects,
) -> bool {
    if lock.waiters.is_empty() {
        return false;
    }
    if lock.delay_left_ms(now_ms) > 0 {
        fx.delays.push((lock.name.clone(), lock.delay_until_ms));
        return false;
    }
    let mut granted = false;
    while lock.waiters.front().is_some_and(|w| lock.admits(w.mode)) {
        let w = lock.waiters.pop_front().expect("front exists");
        requests.remove(&(lock.name.clone(), w.session.clone()));
        let token = grant(lock, last_token, &w.session, w.mode, index, now_ms);
        let event = QueueEvent::Granted {
            token,
            mode: w.mode,
            waited_ms: now_ms.saturating_sub(w.since_ms),
        };
        fx.events
            .push((lock.name.clone(), w.session.clone(), event));
        fx.standings.push((lock.name.clone(), w.session));
        granted = true;
    }
    granted
}
