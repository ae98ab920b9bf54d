//! The KV table: entries in key order, tombstones that keep prefix indexes from going backwards,
//! the keys each session holds, and lock-delay deadlines. Writes run as transactions over an
//! overlay, so a failing op leaves the table untouched.
//!
//! LockIndex never goes backwards (docs/consul-compatibility.md#deliberate-differences,
//! difference 1), whatever deletes it: every way a key disappears (a delete, a tree delete, a
//! delete-behaviour session) leaves a tombstone holding the key's LockIndex, and a key created
//! again continues from it. A tree delete also writes one tombstone for its prefix (as Consul does,
//! for the prefix's index), and a tombstone never lowers the LockIndex another one already holds
//! for the same key. Tombstones are reaped after 15 minutes (`Op::ReapTombstones`), so the table
//! keeps one number past them: the highest LockIndex any reaped tombstone held. Every acquire
//! grants more than that floor, so a key whose history was reaped still never hands out a LockIndex
//! it handed out before. The price is that a fresh key's first LockIndex can be above 1 once
//! tombstones with locks have been reaped; clients only ever compare LockIndexes of one key, so
//! that is harmless.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use vigil_shared::MAX_LOCK_DELAY_MS;
use vigil_shared::kv::{KvEntry, KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::session::Behavior;

use super::session::SessionStore;

/// A deleted key (or a prefix removed by a tree delete) and when it was deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub index: u64,
    pub at_ms: u64,
    /// The deleted key's LockIndex, so a key re-created before the tombstone is reaped continues
    /// counting from it: a sequencer must not go backwards when a lock key is deleted.
    pub lock_index: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvStore {
    entries: BTreeMap<String, KvEntry>,
    tombstones: BTreeMap<String, Tombstone>,
    /// Raft index of the latest change to entries or tombstones (the "global" KV index).
    table_index: u64,
    /// Session ID → keys it holds, so invalidation touches only those keys.
    held: HashMap<String, BTreeSet<String>>,
    /// Key → end of its lock-delay (leader's clock, ms).
    lock_delays: HashMap<String, u64>,
    /// Highest LockIndex held by a reaped tombstone: every acquire grants more than this, so
    /// reaping a key's history never lets its LockIndex start again from 1.
    lock_index_floor: u64,
}

/// Everything a transaction needs from outside the KV table.
pub struct TxnContext<'a> {
    pub index: u64,
    pub now_ms: u64,
    /// The sessions table: `lock` needs the session to exist and stores its canonical ID.
    pub sessions: &'a SessionStore,
}

/// A held key changing hands in a committed transaction, for the lock history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// `session` acquired `key`, at LockIndex `lock_index`.
    Granted {
        key: String,
        session: String,
        lock_index: u64,
    },
    /// `session` released `key`.
    Released { key: String, session: String },
    /// `key` was deleted while `session` held it.
    Deleted { key: String, session: String },
}

/// What a committed transaction changed: the keys whose entries were written or deleted, and
/// the held keys among them that changed hands.
#[derive(Debug, Default)]
pub struct Applied {
    pub touched: Vec<String>,
    pub changes: Vec<KeyChange>,
}

/// A transaction's view: reads see earlier ops' writes; nothing reaches the table until commit.
struct Overlay<'a> {
    base: &'a KvStore,
    writes: BTreeMap<String, Option<KvEntry>>,
    /// Key or prefix deleted → the highest LockIndex it had when deleted.
    tombstones: BTreeMap<String, u64>,
}

impl Overlay<'_> {
    fn get(&self, key: &str) -> Option<KvEntry> {
        match self.writes.get(key) {
            Some(written) => written.clone(),
            None => self.base.entries.get(key).cloned(),
        }
    }

    fn tree(&self, prefix: &str) -> Vec<KvEntry> {
        let mut merged: BTreeMap<String, KvEntry> = self
            .base
            .entries
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        for (k, w) in self
            .writes
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match w {
                Some(e) => merged.insert(k.clone(), e.clone()),
                None => merged.remove(k),
            };
        }
        merged.into_values().collect()
    }

    /// Writes `new` unless it equals the current entry (Consul's no-op rule). Returns the
    /// entry as it now stands, with its value stripped (write results carry no value).
    fn put(&mut self, new: KvEntry, existing: Option<KvEntry>) -> KvEntry {
        let unchanged = existing.as_ref().is_some_and(|e| {
            e.lock_index == new.lock_index
                && e.flags == new.flags
                && e.value == new.value
                && e.session == new.session
        });
        let stored = if unchanged {
            existing.expect("unchanged implies an existing entry")
        } else {
            self.writes.insert(new.key.clone(), Some(new.clone()));
            new
        };
        KvEntry {
            value: Vec::new(),
            ..stored
        }
    }

    fn delete(&mut self, key: &str) {
        if let Some(e) = self.get(key) {
            self.writes.insert(key.to_owned(), None);
            self.bury(key, e.lock_index);
        }
    }

    /// Records a tombstone for `key`, keeping the higher LockIndex if it already has one.
    fn bury(&mut self, key: &str, lock_index: u64) {
        let held = self.tombstones.entry(key.to_owned()).or_default();
        *held = (*held).max(lock_index);
    }

    /// LockIndex a deleted key had, for a key created again (0 for a key never seen).
    fn previous_lock_index(&self, key: &str) -> u64 {
        let here = self.tombstones.get(key).copied().unwrap_or(0);
        let before = self.base.tombstones.get(key).map_or(0, |t| t.lock_index);
        here.max(before)
    }
}

fn strip(e: KvEntry) -> KvEntry {
    KvEntry {
        value: Vec::new(),
        ..e
    }
}

impl KvStore {
    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    pub fn get(&self, key: &str) -> Option<&KvEntry> {
        self.entries.get(key)
    }

    pub fn list(&self, prefix: &str) -> impl Iterator<Item = &KvEntry> {
        self.entries
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn tombstone_count(&self) -> usize {
        self.tombstones.len()
    }

    /// `X-Consul-Index` of a single-key read: the entry's ModifyIndex, or the global index.
    pub fn key_index(&self, key: &str) -> u64 {
        self.entries
            .get(key)
            .map_or(self.table_index, |e| e.modify_index)
    }

    /// `X-Consul-Index` of a prefix read: the highest entry or tombstone index under the prefix,
    /// falling back to the global index when there is neither.
    pub fn prefix_index(&self, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return self.table_index;
        }
        let entries = self.list(prefix).map(|e| e.modify_index).max();
        let tombs = self
            .tombstones
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, t)| t.index)
            .max();
        match entries.max(tombs) {
            Some(i) if i > 0 => i,
            _ => self.table_index,
        }
    }

    /// Remaining lock-delay on `key` at `now_ms`, if any.
    pub fn lock_delay_remaining(&self, key: &str, now_ms: u64) -> Option<u64> {
        self.lock_delays
            .get(key)
            .and_then(|until| until.checked_sub(now_ms))
            .filter(|left| *left > 0)
    }

    /// Keys whose lock-delay has not passed at `now_ms`.
    pub fn lock_delays_active(&self, now_ms: u64) -> usize {
        self.lock_delays
            .values()
            .filter(|until| **until > now_ms)
            .count()
    }

    /// Runs `ops` in order. Every failing op is reported and nothing is applied; otherwise the
    /// writes are committed at `ctx.index`. Returns what changed.
    pub fn apply_txn(&mut self, ops: &[KvOp], ctx: &TxnContext<'_>) -> (TxnOutcome, Applied) {
        let (outcome, writes, tombstones) = self.execute(ops, ctx);
        if let TxnOutcome::RolledBack(_) = outcome {
            return (outcome, Applied::default());
        }
        let touched: Vec<String> = writes.keys().cloned().collect();
        let changes = writes
            .iter()
            .flat_map(|(key, write)| self.changes(key, write.as_ref()))
            .collect();
        if !writes.is_empty() || !tombstones.is_empty() {
            self.table_index = ctx.index;
        }
        for (key, write) in writes {
            self.commit_write(key, write);
        }
        for (key, lock_index) in tombstones {
            self.bury(key, ctx.index, ctx.now_ms, lock_index);
        }
        (outcome, Applied { touched, changes })
    }

    /// How writing `write` to `key` changes who holds it: the holder before lets go (a release,
    /// or a delete) and the holder after acquires.
    fn changes(&self, key: &str, write: Option<&KvEntry>) -> Vec<KeyChange> {
        let before = self.entries.get(key).and_then(|e| e.session.as_deref());
        let after = write.and_then(|e| e.session.as_deref());
        let mut changes = Vec::new();
        if before == after {
            return changes;
        }
        if let Some(session) = before {
            let (key, session) = (key.to_owned(), session.to_owned());
            changes.push(match write {
                Some(_) => KeyChange::Released { key, session },
                None => KeyChange::Deleted { key, session },
            });
        }
        if let (Some(session), Some(entry)) = (after, write) {
            changes.push(KeyChange::Granted {
                key: key.to_owned(),
                session: session.to_owned(),
                lock_index: entry.lock_index,
            });
        }
        changes
    }

    /// Writes the tombstone of a key or prefix deleted at `index`; a LockIndex an earlier
    /// tombstone of the same key holds is never lowered.
    fn bury(&mut self, key: String, index: u64, at_ms: u64, lock_index: u64) {
        let lock_index = self
            .tombstones
            .get(&key)
            .map_or(lock_index, |t| t.lock_index.max(lock_index));
        self.tombstones.insert(
            key,
            Tombstone {
                index,
                at_ms,
                lock_index,
            },
        );
    }

    /// Runs a read-only transaction against the current table.
    pub fn read_txn(&self, ops: &[KvOp], ctx: &TxnContext<'_>) -> TxnOutcome {
        self.execute(ops, ctx).0
    }

    fn commit_write(&mut self, key: String, write: Option<KvEntry>) {
        let old_session = self.entries.get(&key).and_then(|e| e.session.clone());
        let new_session = write.as_ref().and_then(|e| e.session.clone());
        if old_session != new_session {
            if let Some(s) = &old_session {
                self.unhold(s, &key);
            }
            if let Some(s) = new_session {
                self.held.entry(s).or_default().insert(key.clone());
            }
        }
        match write {
            Some(entry) => self.entries.insert(key, entry),
            None => self.entries.remove(&key),
        };
    }

    fn unhold(&mut self, session: &str, key: &str) {
        if let Some(keys) = self.held.get_mut(session) {
            keys.remove(key);
            if keys.is_empty() {
                self.held.remove(session);
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn execute(
        &self,
        ops: &[KvOp],
        ctx: &TxnContext<'_>,
    ) -> (
        TxnOutcome,
        BTreeMap<String, Option<KvEntry>>,
        BTreeMap<String, u64>,
    ) {
        let mut view = Overlay {
            base: self,
            writes: BTreeMap::new(),
            tombstones: BTreeMap::new(),
        };
        let mut results = Vec::new();
        let mut errors = Vec::new();
        for (op_index, op) in ops.iter().enumerate() {
            match self.execute_op(&mut view, op, ctx) {
                Ok(mut out) => results.append(&mut out),
                Err(error) => errors.push(TxnError { op_index, error }),
            }
        }
        if errors.is_empty() {
            let Overlay {
                writes, tombstones, ..
            } = view;
            (TxnOutcome::Committed(results), writes, tombstones)
        } else {
            (
                TxnOutcome::RolledBack(errors),
                BTreeMap::new(),
                BTreeMap::new(),
            )
        }
    }

    fn execute_op(
        &self,
        view: &mut Overlay<'_>,
        op: &KvOp,
        ctx: &TxnContext<'_>,
    ) -> Result<Vec<KvEntry>, KvOpError> {
        let key = op.key();
        let needs_key = !matches!(op, KvOp::GetTree { .. } | KvOp::DeleteTree { .. });
        if needs_key && key.is_empty() {
            return Err(KvOpError::MissingKey);
        }
        let existing = view.get(key);
        let idx = ctx.index;
        // A key created again continues the LockIndex its tombstone remembers.
        let reborn_lock_index = if existing.is_none() {
            view.previous_lock_index(key)
        } else {
            0
        };
        // An acquire grants more than any LockIndex this key had, including one whose
        // tombstone has been reaped (the floor).
        let granted = |current: u64| current.max(self.lock_index_floor) + 1;
        let set = |view: &mut Overlay<'_>, value: &[u8], flags: u64| {
            let new = match &existing {
                // Vigil keeps LockIndex on plain writes: the sequencer must never go backwards.
                Some(e) => KvEntry {
                    value: value.to_vec(),
                    flags,
                    modify_index: idx,
                    ..e.clone()
                },
                None => KvEntry {
                    key: key.to_owned(),
                    value: value.to_vec(),
                    flags,
                    session: None,
                    lock_index: reborn_lock_index,
                    create_index: idx,
                    modify_index: idx,
                },
            };
            view.put(new, existing.clone())
        };
        match op {
            KvOp::Set { value, flags, .. } => Ok(vec![set(view, value, *flags)]),
            KvOp::Cas {
                value,
                flags,
                index,
                ..
            } => {
                let matches = match &existing {
                    None => *index == 0,
                    Some(e) => *index != 0 && e.modify_index == *index,
                };
                if !matches {
                    return Err(KvOpError::CasStale(key.to_owned()));
                }
                Ok(vec![set(view, value, *flags)])
            }
            KvOp::Lock { session, .. } | KvOp::Unlock { session, .. } if session.is_empty() => {
                Err(KvOpError::MissingSession)
            }
            KvOp::Lock {
                value,
                flags,
                session,
                ..
            } => {
                let Some(session) = ctx.sessions.get(session).map(|s| s.id.clone()) else {
                    return Err(KvOpError::InvalidSession(session.clone()));
                };
                let session = &session;
                if let Some(remaining_ms) = self.lock_delay_remaining(key, ctx.now_ms) {
                    return Err(KvOpError::LockDelay {
                        key: key.to_owned(),
                        remaining_ms,
                    });
                }
                let new = match &existing {
                    Some(e) if e.session.as_deref() == Some(session) => KvEntry {
                        value: value.clone(),
                        flags: *flags,
                        modify_index: idx,
                        ..e.clone()
                    },
                    Some(e) if e.session.is_some() => {
                        return Err(KvOpError::LockHeld(key.to_owned()));
                    }
                    Some(e) => KvEntry {
                        value: value.clone(),
                        flags: *flags,
                        session: Some(session.clone()),
                        lock_index: granted(e.lock_index),
                        modify_index: idx,
                        ..e.clone()
                    },
                    None => KvEntry {
                        key: key.to_owned(),
                        value: value.clone(),
                        flags: *flags,
                        session: Some(session.clone()),
                        lock_index: granted(reborn_lock_index),
                        create_index: idx,
                        modify_index: idx,
                    },
                };
                Ok(vec![view.put(new, existing)])
            }
            KvOp::Unlock {
                value,
                flags,
                session,
                ..
            } => {
                let holds = |e: &KvEntry| {
                    e.session
                        .as_deref()
                        .is_some_and(|s| s.eq_ignore_ascii_case(session))
                };
                match &existing {
                    Some(e) if holds(e) => {
                        let new = KvEntry {
                            value: value.clone(),
                            flags: *flags,
                            session: None,
                            modify_index: idx,
                            ..e.clone()
                        };
                        Ok(vec![view.put(new, existing)])
                    }
                    _ => Err(KvOpError::NotHeld(key.to_owned())),
                }
            }
            KvOp::Get { .. } => existing
                .map(|e| vec![e])
                .ok_or_else(|| KvOpError::NotFound(key.to_owned())),
            KvOp::GetOrEmpty { .. } => Ok(vec![existing.unwrap_or_else(|| KvEntry {
                key: key.to_owned(),
                value: Vec::new(),
                flags: 0,
                session: None,
                lock_index: 0,
                create_index: 0,
                modify_index: 0,
            })]),
            KvOp::GetTree { prefix } => Ok(view.tree(prefix)),
            KvOp::CheckIndex { index, .. } => match existing {
                None => Err(KvOpError::CheckIndexMissing(key.to_owned())),
                Some(e) if e.modify_index != *index => Err(KvOpError::CheckIndexFailed {
                    key: key.to_owned(),
                    current: e.modify_index,
                    expected: *index,
                }),
                Some(e) => Ok(vec![strip(e)]),
            },
            KvOp::CheckSession { session, .. } => match existing {
                None => Err(KvOpError::CheckSessionMissing(key.to_owned())),
                Some(e) if e.session.as_deref().unwrap_or("") != session => {
                    Err(KvOpError::CheckSessionFailed {
                        key: key.to_owned(),
                        current: e.session.unwrap_or_default(),
                        expected: session.clone(),
                    })
                }
                Some(e) => Ok(vec![strip(e)]),
            },
            KvOp::CheckNotExists { .. } => match existing {
                Some(_) => Err(KvOpError::Exists(key.to_owned())),
                None => Ok(Vec::new()),
            },
            KvOp::Delete { .. } => {
                view.delete(key);
                Ok(Vec::new())
            }
            KvOp::DeleteTree { prefix } => {
                let doomed = view.tree(prefix);
                for e in &doomed {
                    view.writes.insert(e.key.clone(), None);
                    // Only a key that was ever locked has a LockIndex to keep; the prefix
                    // tombstone below holds the index for all of them.
                    if e.lock_index > 0 {
                        view.bury(&e.key, e.lock_index);
                    }
                }
                if !doomed.is_empty() && !prefix.is_empty() {
                    view.bury(prefix, 0);
                }
                Ok(Vec::new())
            }
            KvOp::DeleteCas { index, .. } => match existing {
                None => Ok(Vec::new()),
                Some(e) if e.modify_index != *index => {
                    Err(KvOpError::DeleteCasStale(key.to_owned()))
                }
                Some(_) => {
                    view.delete(key);
                    Ok(Vec::new())
                }
            },
        }
    }

    /// Applies a session's invalidation to the keys it holds: release or delete each, and arm
    /// a lock-delay of `min(lock_delay, 60 s)` on each. Returns the keys changed.
    pub fn invalidate_session(
        &mut self,
        session: &str,
        behavior: Behavior,
        lock_delay_ns: u64,
        index: u64,
        now_ms: u64,
    ) -> Vec<String> {
        let keys: Vec<String> = self
            .held
            .remove(session)
            .map(|k| k.into_iter().collect())
            .unwrap_or_default();
        let delay_ms = (lock_delay_ns / 1_000_000).min(MAX_LOCK_DELAY_MS);
        for key in &keys {
            match behavior {
                Behavior::Release => {
                    if let Some(e) = self.entries.get_mut(key) {
                        e.session = None;
                        e.modify_index = index;
                    }
                }
                Behavior::Delete => {
                    let removed = self.entries.remove(key);
                    let lock_index = removed.map_or(0, |e| e.lock_index);
                    self.bury(key.clone(), index, now_ms, lock_index);
                }
            }
            if delay_ms > 0 {
                self.lock_delays.insert(key.clone(), now_ms + delay_ms);
            }
        }
        if !keys.is_empty() {
            self.table_index = index;
        }
        keys
    }

    /// Drops tombstones written before `before_ms` and lock-delays that ended before `now_ms`.
    /// The LockIndexes the dropped tombstones held raise the floor every acquire grants above.
    pub fn reap(&mut self, before_ms: u64, now_ms: u64) -> usize {
        let before = self.tombstones.len();
        let mut floor = self.lock_index_floor;
        self.tombstones.retain(|_, t| {
            let keep = t.at_ms >= before_ms;
            if !keep {
                floor = floor.max(t.lock_index);
            }
            keep
        });
        self.lock_index_floor = floor;
        self.lock_delays.retain(|_, until| *until > now_ms);
        before - self.tombstones.len()
    }

    /// Every acquire grants a LockIndex above this (the highest a reaped tombstone held).
    pub fn lock_index_floor(&self) -> u64 {
        self.lock_index_floor
    }

    /// The highest LockIndex this table ever granted that it still knows of: its entries',
    /// its tombstones' and its floor.
    pub fn highest_lock_index(&self) -> u64 {
        let entries = self.entries.values().map(|e| e.lock_index);
        let tombstones = self.tombstones.values().map(|t| t.lock_index);
        entries
            .chain(tombstones)
            .fold(self.lock_index_floor, u64::max)
    }

    /// Makes every later acquire grant a LockIndex above `floor`.
    pub fn raise_lock_index_floor(&mut self, floor: u64) {
        self.lock_index_floor = self.lock_index_floor.max(floor);
    }

    /// The oldest tombstone's deletion time, so the leader knows when a reap is due.
    pub fn oldest_tombstone_ms(&self) -> Option<u64> {
        self.tombstones.values().map(|t| t.at_ms).min()
    }

    /// Keys held by a session.
    pub fn held_by(&self, session: &str) -> impl Iterator<Item = &String> {
        self.held.get(session).into_iter().flatten()
    }
}
