//! Model-based property test of the state machine's KV and session rules. proptest writes
//! scripts of KV transactions (every verb, up to four ops in one), session creates (with and
//! without a TTL, `release` and `delete`, lock-delays from none to beyond the 60 s cap) and
//! destroys, tombstone reaps, and leader clocks that step forwards and now and then back, over
//! four keys under two prefixes and three session IDs. After every command the state machine's
//! response and effects, and then its whole KV and session state (entries, single-key and
//! prefix indexes, lock-delays, tombstones, the LockIndex floor, sessions), must equal what
//! [`Model`] computes.
//!
//! The model is written from docs/consul-compatibility.md (#invalidation, #lock-delay,
//! #write-rules, #deleting-keys-and-tombstones, #kv-index, the txn verbs of #transactions) and its
//! first deliberate difference (LockIndex never decreases: plain writes keep it, a key re-created
//! while its tombstone lives continues from it, and an acquire grants more than the highest
//! LockIndex any reaped tombstone held), with plain maps and no indexes of its own: a transaction
//! runs on a copy of the model that replaces it only if no op failed. Independently of the model,
//! every acquire must grant a LockIndex above every LockIndex its key ever had (the fencing-token
//! rule).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use vigil_shared::MAX_LOCK_DELAY_MS;
use vigil_shared::kv::{KvEntry, KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::rpc::{ApplyError, Command, Op, QueryResult, ReadQuery, Response};
use vigil_shared::session::{Behavior, Session};

use super::{Effects, StateMachine};

/// The one node; sessions bind no checks, so a registered node is all they need.
const NODE: &str = "node1";
/// Leader clock (ms) at the start of every script.
const T0: u64 = 1_700_000_000_000;
/// Four keys under two prefixes.
const KEYS: [&str; 4] = ["a/x", "a/y", "b/x", "b/y"];
/// Tree prefixes: everything, a prefix without its slash, both prefixes, and a key itself.
const PREFIXES: [&str; 5] = ["", "a", "a/", "b/", "a/x"];
/// Session IDs, lowercase as the agent makes them; each has letters, so an upper-case
/// reference to it is a different string naming the same session.
const SESSIONS: [&str; 3] = [
    "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a0a",
    "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a0b",
    "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a0c",
];
/// Lock-delays: none, under a millisecond (none once applied), 1 ms, 15 s, and 90 s (capped).
const LOCK_DELAYS_NS: [u64; 5] = [0, 500_000, 1_000_000, 15_000_000_000, 90_000_000_000];
const VALUES: [&str; 3] = ["", "v1", "v2"];
const FLAGS: [u64; 3] = [0, 1, 42];
/// Clock steps forward (ms): none, within a lock-delay, across the cap, past a tombstone's life.
const FORWARD_MS: [u64; 9] = [0, 0, 1, 500, 1_000, 15_000, 60_001, 900_000, 1_000_000];
/// Clock steps back (ms), as after a failover to a leader whose clock lags.
const BACK_MS: [u64; 2] = [1_000, 30_000];
/// How far before the clock a reap's bound lies (ms); 900 000 is Consul's tombstone TTL.
const REAP_AGES_MS: [u64; 4] = [0, 1_000, 60_000, 900_000];

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tombstone {
    index: u64,
    at_ms: u64,
    lock_index: u64,
}

/// What the KV and session tables must hold, as plain maps.
#[derive(Debug, Clone, Default)]
struct Model {
    /// The leader clock: the latest command's `now_ms`, never going back.
    now: u64,
    entries: BTreeMap<String, KvEntry>,
    /// Deleted keys and tree-deleted prefixes.
    tombstones: BTreeMap<String, Tombstone>,
    /// Highest LockIndex a reaped tombstone held.
    floor: u64,
    /// Raft index of the latest change to entries or tombstones.
    kv_index: u64,
    /// Key → end of its lock-delay (ms).
    lock_delays: BTreeMap<String, u64>,
    /// Lowercase ID → session.
    sessions: BTreeMap<String, Session>,
    /// Raft index of the latest session create or destroy.
    sessions_index: u64,
}

/// A write result: the entry without its value.
fn stripped(entry: KvEntry) -> KvEntry {
    KvEntry {
        value: Vec::new(),
        ..entry
    }
}

impl Model {
    fn apply(&mut self, index: u64, now_ms: u64, op: &Op) -> (Response, Effects) {
        self.now = self.now.max(now_ms);
        let mut fx = Effects::default();
        let response = match op {
            Op::Kv(ops) => {
                let (outcome, touched) = self.txn(index, ops);
                fx.kv_keys = touched;
                Response::Txn(outcome)
            }
            Op::CreateSession(session) => {
                match self.sessions.entry(session.id.to_ascii_lowercase()) {
                    Entry::Occupied(_) => Response::Rejected(ApplyError::DuplicateSession),
                    Entry::Vacant(slot) => {
                        slot.insert(Session {
                            create_index: index,
                            modify_index: index,
                            ..session.clone()
                        });
                        self.sessions_index = index;
                        fx.sessions_changed = true;
                        if !session.ttl.is_empty() {
                            fx.ttl_sessions_created
                                .push((session.id.clone(), session.ttl.clone()));
                        }
                        Response::SessionCreated {
                            id: session.id.clone(),
                        }
                    }
                }
            }
            Op::DestroySession { id } => {
                self.destroy(index, id, &mut fx);
                Response::Done
            }
            Op::ReapTombstones { before_ms } => {
                let (reaped, kept) = std::mem::take(&mut self.tombstones)
                    .into_iter()
                    .partition::<BTreeMap<_, _>, _>(|(_, t)| t.at_ms < *before_ms);
                self.tombstones = kept;
                self.floor = reaped
                    .values()
                    .map(|t| t.lock_index)
                    .fold(self.floor, u64::max);
                Response::Done
            }
            other => unreachable!("scripts write no {other:?}"),
        };
        (response, fx)
    }

    /// All or nothing: the ops run in order on a copy, which replaces the model only if every
    /// op succeeded. Answers the outcome and the keys whose entries were written or deleted.
    fn txn(&mut self, index: u64, ops: &[KvOp]) -> (TxnOutcome, Vec<String>) {
        let mut next = self.clone();
        let mut touched = BTreeSet::new();
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (op_index, op) in ops.iter().enumerate() {
            match next.kv_op(index, op, &mut touched) {
                Ok(out) => results.extend(out),
                Err(error) => errors.push(TxnError { op_index, error }),
            }
        }
        if !errors.is_empty() {
            return (TxnOutcome::RolledBack(errors), Vec::new());
        }
        if !touched.is_empty() {
            next.kv_index = index;
        }
        *self = next;
        (
            TxnOutcome::Committed(results),
            touched.into_iter().collect(),
        )
    }

    /// One op; a failing op changes nothing.
    fn kv_op(
        &mut self,
        index: u64,
        op: &KvOp,
        touched: &mut BTreeSet<String>,
    ) -> Result<Vec<KvEntry>, KvOpError> {
        let key = op.key().to_owned();
        let tree = matches!(op, KvOp::GetTree { .. } | KvOp::DeleteTree { .. });
        if key.is_empty() && !tree {
            return Err(KvOpError::MissingKey);
        }
        if let KvOp::Lock { session, .. } | KvOp::Unlock { session, .. } = op
            && session.is_empty()
        {
            return Err(KvOpError::MissingSession);
        }
        let current = self.entries.get(&key).cloned();
        let exists_at = |want: u64| current.as_ref().map(|e| e.modify_index == want);
        let cas_allowed = |want: u64| match want {
            0 => current.is_none(),
            want => exists_at(want) == Some(true),
        };
        match op {
            KvOp::Cas { index: want, .. } if !cas_allowed(*want) => Err(KvOpError::CasStale(key)),
            KvOp::Set { value, flags, .. } | KvOp::Cas { value, flags, .. } => {
                let base = current.unwrap_or_else(|| self.fresh(index, &key));
                Ok(vec![self.store(
                    index,
                    rewritten(base, value, *flags),
                    touched,
                )])
            }
            KvOp::Lock {
                value,
                flags,
                session,
                ..
            } => {
                let Some(holder) = self
                    .sessions
                    .get(&session.to_ascii_lowercase())
                    .map(|s| s.id.clone())
                else {
                    return Err(KvOpError::InvalidSession(session.clone()));
                };
                if let Some(until) = self.lock_delays.get(&key).filter(|u| **u > self.now) {
                    return Err(KvOpError::LockDelay {
                        remaining_ms: until - self.now,
                        key,
                    });
                }
                let new = match current {
                    Some(e) if e.session.as_ref() == Some(&holder) => rewritten(e, value, *flags),
                    Some(e) if e.session.is_some() => return Err(KvOpError::LockHeld(key)),
                    other => {
                        let base = other.unwrap_or_else(|| self.fresh(index, &key));
                        KvEntry {
                            session: Some(holder),
                            lock_index: base.lock_index.max(self.floor) + 1,
                            ..rewritten(base, value, *flags)
                        }
                    }
                };
                Ok(vec![self.store(index, new, touched)])
            }
            KvOp::Unlock {
                value,
                flags,
                session,
                ..
            } => match current {
                Some(e)
                    if e.session
                        .as_deref()
                        .is_some_and(|s| s.eq_ignore_ascii_case(session)) =>
                {
                    let released = KvEntry {
                        session: None,
                        ..rewritten(e, value, *flags)
                    };
                    Ok(vec![self.store(index, released, touched)])
                }
                _ => Err(KvOpError::NotHeld(key)),
            },
            KvOp::Get { .. } => current.map(|e| vec![e]).ok_or(KvOpError::NotFound(key)),
            // An absent key reads as a never-written one: no LockIndex, indexes 0.
            KvOp::GetOrEmpty { .. } => Ok(vec![current.unwrap_or_else(|| KvEntry {
                lock_index: 0,
                ..self.fresh(0, &key)
            })]),
            KvOp::GetTree { prefix } => Ok(self.tree(prefix).cloned().collect()),
            KvOp::CheckIndex { index: want, .. } => match current {
                None => Err(KvOpError::CheckIndexMissing(key)),
                Some(e) if e.modify_index != *want => Err(KvOpError::CheckIndexFailed {
                    key,
                    current: e.modify_index,
                    expected: *want,
                }),
                Some(e) => Ok(vec![stripped(e)]),
            },
            KvOp::CheckSession { session, .. } => match current {
                None => Err(KvOpError::CheckSessionMissing(key)),
                Some(e) if e.session.as_deref().unwrap_or("") != session => {
                    Err(KvOpError::CheckSessionFailed {
                        key,
                        current: e.session.unwrap_or_default(),
                        expected: session.clone(),
                    })
                }
                Some(e) => Ok(vec![stripped(e)]),
            },
            KvOp::CheckNotExists { .. } => match current {
                Some(_) => Err(KvOpError::Exists(key)),
                None => Ok(Vec::new()),
            },
            KvOp::Delete { .. } => {
                self.delete(index, &key, touched);
                Ok(Vec::new())
            }
            KvOp::DeleteTree { prefix } => {
                let doomed: Vec<KvEntry> = self.tree(prefix).cloned().collect();
                for e in &doomed {
                    self.entries.remove(&e.key);
                    touched.insert(e.key.clone());
                    // Vigil: a key that was ever locked keeps its LockIndex in its own tombstone.
                    if e.lock_index > 0 {
                        self.bury(index, &e.key, e.lock_index);
                    }
                }
                // Consul: one tombstone for the prefix, if anything was deleted under it.
                if !doomed.is_empty() && !prefix.is_empty() {
                    self.bury(index, prefix, 0);
                }
                Ok(Vec::new())
            }
            KvOp::DeleteCas { index: want, .. } => match exists_at(*want) {
                Some(false) => Err(KvOpError::DeleteCasStale(key)),
                _ => {
                    self.delete(index, &key, touched);
                    Ok(Vec::new())
                }
            },
        }
    }

    /// A key about to be created: unlocked, continuing its tombstone's LockIndex if it has one.
    fn fresh(&self, index: u64, key: &str) -> KvEntry {
        KvEntry {
            key: key.to_owned(),
            value: Vec::new(),
            flags: 0,
            session: None,
            lock_index: self.tombstones.get(key).map_or(0, |t| t.lock_index),
            create_index: index,
            modify_index: index,
        }
    }

    /// Writes `new` at `index` unless it equals the stored entry in value, flags, session and
    /// LockIndex (Consul's no-op rule); answers the entry as it then stands, without its value.
    fn store(&mut self, index: u64, new: KvEntry, touched: &mut BTreeSet<String>) -> KvEntry {
        let unchanged = self.entries.get(&new.key).is_some_and(|e| {
            (&e.value, e.flags, &e.session, e.lock_index)
                == (&new.value, new.flags, &new.session, new.lock_index)
        });
        let key = new.key.clone();
        if !unchanged {
            touched.insert(key.clone());
            let new = KvEntry {
                modify_index: index,
                ..new
            };
            self.entries.insert(key.clone(), new);
        }
        stripped(self.entries[&key].clone())
    }

    fn delete(&mut self, index: u64, key: &str, touched: &mut BTreeSet<String>) {
        if let Some(e) = self.entries.remove(key) {
            touched.insert(key.to_owned());
            self.bury(index, key, e.lock_index);
        }
    }

    /// A tombstone at `index`, now; it never lowers the LockIndex one before it held.
    fn bury(&mut self, index: u64, key: &str, lock_index: u64) {
        let held = self.tombstones.get(key).map_or(0, |t| t.lock_index);
        let tombstone = Tombstone {
            index,
            at_ms: self.now,
            lock_index: lock_index.max(held),
        };
        self.tombstones.insert(key.to_owned(), tombstone);
    }

    fn tree<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a KvEntry> + 'a {
        self.entries
            .values()
            .filter(move |e| e.key.starts_with(prefix))
    }

    /// Deletes the session and releases or deletes each key it holds, arming lock-delay.
    fn destroy(&mut self, index: u64, id: &str, fx: &mut Effects) {
        let Some(session) = self.sessions.remove(&id.to_ascii_lowercase()) else {
            return;
        };
        self.sessions_index = index;
        let keys: Vec<String> = self
            .entries
            .values()
            .filter(|e| e.session.as_deref() == Some(session.id.as_str()))
            .map(|e| e.key.clone())
            .collect();
        let delay_ms = (session.lock_delay_ns / 1_000_000).min(MAX_LOCK_DELAY_MS);
        for key in &keys {
            match session.behavior {
                Behavior::Release => {
                    let e = self.entries.get_mut(key).expect("a held key exists");
                    e.session = None;
                    e.modify_index = index;
                }
                Behavior::Delete => {
                    let e = self.entries.remove(key).expect("a held key exists");
                    self.bury(index, key, e.lock_index);
                }
            }
            if delay_ms > 0 {
                self.lock_delays.insert(key.clone(), self.now + delay_ms);
            }
        }
        if !keys.is_empty() {
            self.kv_index = index;
        }
        fx.kv_keys = keys;
        fx.sessions_changed = true;
        fx.sessions_destroyed = vec![session.id];
    }

    fn key_index(&self, key: &str) -> u64 {
        self.entries
            .get(key)
            .map_or(self.kv_index, |e| e.modify_index)
    }

    fn prefix_index(&self, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return self.kv_index;
        }
        let entries = self.tree(prefix).map(|e| e.modify_index);
        let tombstones = self
            .tombstones
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, t)| t.index);
        match entries.chain(tombstones).max() {
            Some(i) if i > 0 => i,
            _ => self.kv_index,
        }
    }

    fn lock_delay_remaining(&self, key: &str) -> Option<u64> {
        self.lock_delays
            .get(key)
            .filter(|until| **until > self.now)
            .map(|until| until - self.now)
    }
}

/// `entry` with the value and flags a write carries.
fn rewritten(entry: KvEntry, value: &[u8], flags: u64) -> KvEntry {
    KvEntry {
        value: value.to_vec(),
        flags,
        ..entry
    }
}

// ---------------------------------------------------------------------------------------------
// Scripts
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Verb {
    Set,
    Cas,
    Lock,
    Unlock,
    Get,
    GetOrEmpty,
    GetTree,
    CheckIndex,
    CheckSession,
    CheckNotExists,
    Delete,
    DeleteTree,
    DeleteCas,
}

/// Writes weigh more than reads, so scripts build up state.
const VERBS: [Verb; 17] = [
    Verb::Set,
    Verb::Set,
    Verb::Cas,
    Verb::Lock,
    Verb::Lock,
    Verb::Lock,
    Verb::Unlock,
    Verb::Unlock,
    Verb::Get,
    Verb::GetOrEmpty,
    Verb::GetTree,
    Verb::CheckIndex,
    Verb::CheckSession,
    Verb::CheckNotExists,
    Verb::Delete,
    Verb::DeleteTree,
    Verb::DeleteCas,
];

/// A session reference in an op.
#[derive(Debug, Clone, Copy)]
enum Who {
    /// One of [`SESSIONS`], upper-cased or not; it may not exist (yet, or any more).
    Session { slot: usize, upper: bool },
    /// The empty string (`check-session`: the key must be unlocked).
    Nobody,
}

/// A `cas`, `check-index` or `delete-cas` index.
#[derive(Debug, Clone, Copy)]
enum At {
    Zero,
    /// The key's ModifyIndex before the transaction (0 when it is missing).
    Current,
    Fixed(u64),
}

/// One op, with every field any verb needs; [`Run::op`] keeps the ones its verb takes.
#[derive(Debug, Clone, Copy)]
struct OpSpec {
    verb: Verb,
    key: &'static str,
    prefix: &'static str,
    value: &'static str,
    flags: u64,
    at: At,
    who: Who,
}

#[derive(Debug, Clone)]
enum Action {
    Txn(Vec<OpSpec>),
    Create {
        slot: usize,
        behavior: Behavior,
        ttl: bool,
        lock_delay_ns: u64,
    },
    Destroy {
        slot: usize,
        upper: bool,
    },
    Reap {
        age_ms: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum Clock {
    Forward(u64),
    Back(u64),
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    let key = prop_oneof![12 => select(KEYS.to_vec()), 1 => Just("")];
    let at = prop_oneof![
        1 => Just(At::Zero),
        3 => Just(At::Current),
        1 => (1u64..8).prop_map(At::Fixed),
    ];
    let who = prop_oneof![
        12 => (0..SESSIONS.len(), prop::bool::weighted(0.2))
            .prop_map(|(slot, upper)| Who::Session { slot, upper }),
        1 => Just(Who::Nobody),
    ];
    (
        select(VERBS.to_vec()),
        key,
        select(PREFIXES.to_vec()),
        select(VALUES.to_vec()),
        select(FLAGS.to_vec()),
        at,
        who,
    )
        .prop_map(|(verb, key, prefix, value, flags, at, who)| OpSpec {
            verb,
            key,
            prefix,
            value,
            flags,
            at,
            who,
        })
}

fn action() -> impl Strategy<Value = Action> {
    let behavior = prop_oneof![Just(Behavior::Release), Just(Behavior::Delete)];
    prop_oneof![
        8 => vec(op_spec(), 1..=4).prop_map(Action::Txn),
        2 => (0..SESSIONS.len(), behavior, any::<bool>(), select(LOCK_DELAYS_NS.to_vec())).prop_map(
            |(slot, behavior, ttl, lock_delay_ns)| Action::Create {
                slot,
                behavior,
                ttl,
                lock_delay_ns,
            }
        ),
        2 => (0..SESSIONS.len(), prop::bool::weighted(0.2))
            .prop_map(|(slot, upper)| Action::Destroy { slot, upper }),
        1 => select(REAP_AGES_MS.to_vec()).prop_map(|age_ms| Action::Reap { age_ms }),
    ]
}

fn script() -> impl Strategy<Value = Vec<(Clock, Action)>> {
    let clock = prop_oneof![
        6 => select(FORWARD_MS.to_vec()).prop_map(Clock::Forward),
        1 => select(BACK_MS.to_vec()).prop_map(Clock::Back),
    ];
    vec((clock, action()), 1..48)
}

// ---------------------------------------------------------------------------------------------
// Running a script against both
// ---------------------------------------------------------------------------------------------

struct Run {
    sm: StateMachine,
    model: Model,
    index: u64,
    /// The clock the next command carries (it may go back; apply clamps it).
    clock: u64,
    /// Highest LockIndex each key has ever had, and who held it at what LockIndex.
    seen: BTreeMap<String, u64>,
    holders: BTreeMap<String, (String, u64)>,
    /// The LockIndex of each key that exists.
    present: BTreeMap<String, u64>,
    /// Every command so far, printed: a failure shows the (shrunk) script that led to it.
    log: String,
}

impl Run {
    fn new() -> Run {
        let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
        let node = Op::RegisterNode {
            name: NODE.to_owned(),
            address: "127.0.0.1".to_owned(),
        };
        let (response, _) = sm.apply(
            1,
            Command {
                now_ms: T0,
                op: node,
            },
        );
        assert_eq!(response, Response::Done);
        Run {
            sm,
            model: Model {
                now: T0,
                ..Model::default()
            },
            index: 1,
            clock: T0,
            seen: BTreeMap::new(),
            holders: BTreeMap::new(),
            present: BTreeMap::new(),
            log: String::new(),
        }
    }

    fn session_ref(who: Who) -> String {
        match who {
            Who::Session { slot, upper: true } => SESSIONS[slot].to_ascii_uppercase(),
            Who::Session { slot, upper: false } => SESSIONS[slot].to_owned(),
            Who::Nobody => String::new(),
        }
    }

    /// The op a spec stands for, with indexes resolved against the state before the command.
    fn op(&self, spec: OpSpec) -> KvOp {
        let key = spec.key.to_owned();
        let value = spec.value.as_bytes().to_vec();
        let flags = spec.flags;
        let index = match spec.at {
            At::Zero => 0,
            At::Current => self.model.entries.get(&key).map_or(0, |e| e.modify_index),
            At::Fixed(i) => i,
        };
        let session = Run::session_ref(spec.who);
        let prefix = spec.prefix.to_owned();
        match spec.verb {
            Verb::Set => KvOp::Set { key, value, flags },
            Verb::Cas => KvOp::Cas {
                key,
                value,
                flags,
                index,
            },
            Verb::Lock => KvOp::Lock {
                key,
                value,
                flags,
                session,
            },
            Verb::Unlock => KvOp::Unlock {
                key,
                value,
                flags,
                session,
            },
            Verb::Get => KvOp::Get { key },
            Verb::GetOrEmpty => KvOp::GetOrEmpty { key },
            Verb::GetTree => KvOp::GetTree { prefix },
            Verb::CheckIndex => KvOp::CheckIndex { key, index },
            Verb::CheckSession => KvOp::CheckSession { key, session },
            Verb::CheckNotExists => KvOp::CheckNotExists { key },
            Verb::Delete => KvOp::Delete { key },
            Verb::DeleteTree => KvOp::DeleteTree { prefix },
            Verb::DeleteCas => KvOp::DeleteCas { key, index },
        }
    }

    fn command(&self, action: &Action) -> Op {
        match action {
            Action::Txn(specs) => Op::Kv(specs.iter().map(|s| self.op(*s)).collect()),
            Action::Create {
                slot,
                behavior,
                ttl,
                lock_delay_ns,
            } => Op::CreateSession(Session {
                lock_delay_ns: *lock_delay_ns,
                behavior: *behavior,
                ttl: if *ttl {
                    "15s".to_owned()
                } else {
                    String::new()
                },
                id: SESSIONS[*slot].to_owned(),
                node: NODE.to_owned(),
                ..Session::default()
            }),
            Action::Destroy { slot, upper } => Op::DestroySession {
                id: Run::session_ref(Who::Session {
                    slot: *slot,
                    upper: *upper,
                }),
            },
            Action::Reap { age_ms } => Op::ReapTombstones {
                before_ms: self.model.now.saturating_sub(*age_ms),
            },
        }
    }

    fn step(&mut self, clock: Clock, action: &Action) {
        self.clock = match clock {
            Clock::Forward(ms) => self.clock + ms,
            Clock::Back(ms) => self.clock.saturating_sub(ms),
        };
        self.index += 1;
        let op = self.command(action);
        let at = i128::from(self.clock) - i128::from(T0);
        writeln!(self.log, "#{} at T0{at:+}ms: {op:?}", self.index)
            .expect("writing to a String cannot fail");
        let expected = self.model.apply(self.index, self.clock, &op);
        let (response, mut fx) = self.sm.apply(
            self.index,
            Command {
                now_ms: self.clock,
                op,
            },
        );
        // Hold and wait times feed metrics from the lock history, which the model does not keep.
        fx.lock_holds.clear();
        fx.lock_waits.clear();
        let actual = (response, fx);
        assert_eq!(actual, expected, "response and effects after\n{}", self.log);
        self.compare();
        self.check_fencing();
    }

    /// The state machine's whole KV and session state against the model's.
    fn compare(&self) {
        let (sm, model, log) = (&self.sm, &self.model, &self.log);
        let (QueryResult::Entries(entries), kv_index) = sm.query(&ReadQuery::KvList {
            prefix: String::new(),
        }) else {
            panic!("a KV list answers with entries");
        };
        let expected: Vec<KvEntry> = model.entries.values().cloned().collect();
        assert_eq!(entries, expected, "entries after\n{log}");
        assert_eq!(kv_index, model.kv_index, "KV table index after\n{log}");
        for key in KEYS {
            let get = ReadQuery::KvGet {
                key: key.to_owned(),
            };
            let index = sm.query(&get).1;
            assert_eq!(index, model.key_index(key), "index of {key} after\n{log}");
            assert_eq!(
                sm.kv().lock_delay_remaining(key, model.now),
                model.lock_delay_remaining(key),
                "lock-delay of {key} after\n{log}"
            );
        }
        for prefix in PREFIXES {
            let list = ReadQuery::KvList {
                prefix: prefix.to_owned(),
            };
            let index = sm.query(&list).1;
            let want = model.prefix_index(prefix);
            assert_eq!(index, want, "index of prefix {prefix:?} after\n{log}");
        }
        assert_eq!(
            sm.kv().tombstone_count(),
            model.tombstones.len(),
            "tombstones after\n{log}"
        );
        assert_eq!(
            sm.kv().lock_index_floor(),
            model.floor,
            "LockIndex floor after\n{log}"
        );
        assert_eq!(sm.now_ms(), model.now, "clock after\n{log}");

        let (QueryResult::Sessions(sessions), sessions_index) =
            sm.query(&ReadQuery::SessionList {})
        else {
            panic!("a session list answers with sessions");
        };
        let expected: Vec<Session> = model.sessions.values().cloned().collect();
        assert_eq!(sessions, expected, "sessions after\n{log}");
        assert_eq!(
            sessions_index, model.sessions_index,
            "sessions index after\n{log}"
        );

        // A held key's sequencer is valid, and only for its holder at its LockIndex.
        for e in model.entries.values() {
            let key = &e.key;
            for id in SESSIONS {
                let valid = sm.check_sequencer(key, e.lock_index, id).is_ok();
                let holds = e.session.as_deref() == Some(id);
                let lock_index = e.lock_index;
                let what = format!("sequencer ({key}, {lock_index}, {id})");
                assert_eq!(valid, holds, "{what} after\n{log}");
            }
            if let Some(holder) = &e.session {
                let older = sm.check_sequencer(key, e.lock_index - 1, holder);
                assert!(older.is_err(), "an older sequencer of {key} after\n{log}");
            }
        }
    }

    /// The fencing-token rule, whatever the model says: every acquire grants its key a
    /// LockIndex above every LockIndex that key ever had, and a key that exists before and
    /// after a command has not gone back (only a reaped history lets a plain write start a key
    /// again from 0).
    fn check_fencing(&mut self) {
        let mut holders = BTreeMap::new();
        let mut present = BTreeMap::new();
        for e in self.sm.kv().list("") {
            let seen = self.seen.get(&e.key).copied().unwrap_or(0);
            if let Some(before) = self.present.get(&e.key) {
                assert!(
                    e.lock_index >= *before,
                    "{} went back from LockIndex {before} to {}, after\n{}",
                    e.key,
                    e.lock_index,
                    self.log
                );
            }
            present.insert(e.key.clone(), e.lock_index);
            if let Some(session) = &e.session {
                let holder = (session.clone(), e.lock_index);
                if self.holders.get(&e.key) != Some(&holder) {
                    assert!(
                        e.lock_index > seen,
                        "{} granted LockIndex {} after having {seen}, after\n{}",
                        e.key,
                        e.lock_index,
                        self.log
                    );
                }
                holders.insert(e.key.clone(), holder);
            }
            self.seen.insert(e.key.clone(), seen.max(e.lock_index));
        }
        self.holders = holders;
        self.present = present;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every script leaves the state machine exactly where the model is, step by step.
    #[test]
    fn state_machine_matches_the_model(script in script()) {
        let mut run = Run::new();
        for (clock, action) in &script {
            run.step(*clock, action);
        }
    }
}
