//! Restoring a snapshot archive: the whole state is replaced by the archive's, except what must
//! never go backwards, which [`carry_floors`] carries over from the state being replaced. The
//! effects name everything that changed, so every blocking query wakes and the leader re-arms
//! the TTL timer of every restored session (at its full TTL) and drops those of sessions gone.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use vigil_shared::rpc::{ApplyError, Response};

use super::{Effects, StateMachine};

/// The parts of a restore received so far (`Op::RestoreChunk`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedRestore {
    pub id: String,
    #[serde(with = "serde_bytes")]
    pub state: Vec<u8>,
}

/// Applies `Op::RestoreChunk`: stages `bytes` at `offset` of restore `id`, and with `last`
/// restores the staged state. A part that neither begins a restore (offset 0) nor continues the
/// staged one where it ends is refused, changing nothing.
pub fn stage(
    current: &mut StateMachine,
    id: String,
    offset: u64,
    bytes: Vec<u8>,
    last: bool,
    index: u64,
    fx: &mut Effects,
) -> Response {
    let staged = match current.staged_restore.take() {
        _ if offset == 0 => StagedRestore { id, state: bytes },
        Some(mut staged) if staged.id == id && staged.state.len() as u64 == offset => {
            staged.state.extend_from_slice(&bytes);
            staged
        }
        other => {
            current.staged_restore = other;
            return Response::Rejected(ApplyError::RestoreInterrupted);
        }
    };
    if !last {
        current.staged_restore = Some(staged);
        return Response::Done;
    }
    restore(current, &staged.state, index, fx)
}

/// Carries over from `before` (the state a restore replaces) into `restored` everything that
/// must keep growing across a restore: every fencing token. Each KV LockIndex granted after
/// the restore is above every LockIndex granted before it (on any key, even one the archive
/// does not hold), and the command clock, the op index and the protocol level never go back.
/// Extend it for every new counter that is a fencing token.
pub fn carry_floors(before: &StateMachine, restored: &mut StateMachine) {
    restored
        .kv
        .raise_lock_index_floor(before.kv.highest_lock_index());
    restored.locks.raise_token_floor(before.locks.last_token());
    restored.last_now_ms = restored.last_now_ms.max(before.last_now_ms);
    restored.index = restored.index.max(before.index);
    restored.protocol = restored.protocol.max(before.protocol);
}

/// Applies `Op::RestoreSnapshot` at `index`: `state` is a postcard-encoded [`StateMachine`].
/// Every read afterwards reports at least `index`.
pub fn restore(current: &mut StateMachine, state: &[u8], index: u64, fx: &mut Effects) -> Response {
    let Ok(mut restored) = StateMachine::decode(state) else {
        return Response::Rejected(ApplyError::InvalidSnapshot);
    };
    carry_floors(current, &mut restored);

    let keys: BTreeSet<String> = current
        .kv
        .list("")
        .chain(restored.kv.list(""))
        .map(|e| e.key.clone())
        .collect();
    fx.kv_keys.extend(keys);
    let services: BTreeSet<String> = current
        .catalog
        .services()
        .chain(restored.catalog.services())
        .map(|s| s.name.clone())
        .collect();
    fx.services_changed.extend(services);
    // Every lock and every contender's standing may differ; pending lock-delays are re-armed.
    for table in [&current.locks, &restored.locks] {
        fx.locks
            .changed
            .extend(table.under("").map(|l| l.name.clone()));
        fx.locks.standings.extend(table.contenders());
    }
    fx.locks.delays.extend(
        restored
            .locks
            .pending_delays()
            .map(|(n, t)| (n.to_owned(), t)),
    );
    fx.sessions_changed = true;
    fx.catalog_changed = true;
    fx.queries_changed = true;
    fx.acl_changed = true;
    fx.sessions_destroyed.extend(
        current
            .sessions
            .list()
            .filter(|s| restored.sessions.get(&s.id).is_none())
            .map(|s| s.id.clone()),
    );
    fx.ttl_sessions_created.extend(
        restored
            .sessions
            .list()
            .filter(|s| !s.ttl.is_empty())
            .map(|s| (s.id.clone(), s.ttl.clone())),
    );
    *current = restored;
    // Below level 2 neither is kept, as in the first release (see `next_index`).
    if current.protocol >= 2 {
        current.index = current.index.max(index);
        current.restored_at = index;
    }
    Response::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_shared::kv::{KvOp, TxnOutcome};
    use vigil_shared::rpc::{Command, Op};
    use vigil_shared::session::Session;

    fn apply(sm: &mut StateMachine, index: u64, op: Op) -> Response {
        sm.apply(
            index,
            Command {
                now_ms: 1_000 + index,
                op,
            },
        )
        .0
    }

    fn acquire(sm: &mut StateMachine, index: u64, key: &str, session: &str) -> u64 {
        let op = Op::Kv(vec![KvOp::Lock {
            key: key.to_owned(),
            value: Vec::new(),
            flags: 0,
            session: session.to_owned(),
        }]);
        assert!(matches!(
            apply(sm, index, op),
            Response::Txn(TxnOutcome::Committed(_))
        ));
        sm.kv().get(key).expect("locked key").lock_index
    }

    fn release(sm: &mut StateMachine, index: u64, key: &str, session: &str) {
        let op = Op::Kv(vec![KvOp::Unlock {
            key: key.to_owned(),
            value: Vec::new(),
            flags: 0,
            session: session.to_owned(),
        }]);
        apply(sm, index, op);
    }

    fn with_session(id: &str) -> StateMachine {
        let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
        apply(
            &mut sm,
            1,
            Op::RegisterNode {
                name: "n1".to_owned(),
                address: "127.0.0.1".to_owned(),
            },
        );
        let session = Session {
            id: id.to_owned(),
            node: "n1".to_owned(),
            ttl: "10s".to_owned(),
            ..Session::default()
        };
        apply(&mut sm, 2, Op::CreateSession(session));
        sm
    }

    #[test]
    fn lock_indexes_after_a_restore_are_above_every_one_before() {
        let s = "11111111-1111-1111-1111-111111111111";
        let mut sm = with_session(s);
        // The archive is taken when `a` has been granted once.
        acquire(&mut sm, 3, "a", s);
        let archive = sm.encode().expect("encode");
        // After it, `a` is granted many more times and `b` once.
        let mut highest = 0;
        for i in 0..5 {
            release(&mut sm, 10 + 2 * i, "a", s);
            highest = acquire(&mut sm, 11 + 2 * i, "a", s);
        }
        highest = highest.max(acquire(&mut sm, 30, "b", s));

        let mut fx = Effects::default();
        assert_eq!(restore(&mut sm, &archive, 35, &mut fx), Response::Done);
        assert!(fx.kv_keys.contains(&"b".to_owned()), "b's watchers wake");
        assert_eq!(fx.ttl_sessions_created, [(s.to_owned(), "10s".to_owned())]);

        release(&mut sm, 40, "a", s);
        assert!(acquire(&mut sm, 41, "a", s) > highest);
        assert!(acquire(&mut sm, 42, "c", s) > highest);
    }

    fn queue(sm: &mut StateMachine, index: u64, op: vigil_shared::lock::LockOp) -> Response {
        apply(sm, index, Op::Lock(op))
    }

    #[test]
    fn queued_lock_tokens_after_a_restore_are_above_every_one_before() {
        use vigil_shared::lock::{LockMode, LockOp, LockOutcome};
        let s = "11111111-1111-1111-1111-111111111111";
        let mut sm = with_session(s);
        let take = |name: &str| LockOp::Acquire {
            name: name.to_owned(),
            session: s.to_owned(),
            mode: LockMode::Exclusive,
            limit: 1,
            try_only: false,
        };
        let give = |name: &str| LockOp::Release {
            name: name.to_owned(),
            session: s.to_owned(),
        };
        queue(&mut sm, 3, take("q"));
        let archive = sm.encode().expect("encode");
        for i in 0..5 {
            queue(&mut sm, 10 + 2 * i, give("q"));
            queue(&mut sm, 11 + 2 * i, take("q"));
        }
        let highest = sm.locks().last_token();

        let mut fx = Effects::default();
        assert_eq!(restore(&mut sm, &archive, 25, &mut fx), Response::Done);
        assert!(fx.locks.standings.contains(&("q".to_owned(), s.to_owned())));
        // Even an entry at a low index (the floor alone decides) grants above every token.
        queue(&mut sm, 4, give("q"));
        let Response::Lock(LockOutcome::Held { token }) = queue(&mut sm, 5, take("q")) else {
            panic!("granted");
        };
        assert!(token > highest, "token {token} after {highest}");
    }

    #[test]
    fn a_state_that_does_not_decode_changes_nothing() {
        let mut sm = with_session("11111111-1111-1111-1111-111111111111");
        let before = sm.clone();
        let mut fx = Effects::default();
        assert_eq!(
            restore(&mut sm, b"\xff\xff\xff", 5, &mut fx),
            Response::Rejected(ApplyError::InvalidSnapshot)
        );
        assert_eq!(sm, before);
        assert_eq!(fx, Effects::default());
    }
}

#[cfg(test)]
mod staging_tests {
    use super::*;
    use vigil_shared::kv::KvOp;
    use vigil_shared::rpc::{Command, Op};

    fn apply(sm: &mut StateMachine, index: u64, op: Op) -> Response {
        let command = Command {
            now_ms: 1_000 + index,
            op,
        };
        sm.apply(index, command).0
    }

    fn part(id: &str, offset: usize, bytes: &[u8], last: bool) -> Op {
        Op::RestoreChunk {
            id: id.to_owned(),
            offset: offset as u64,
            bytes: bytes.to_vec(),
            last,
        }
    }

    fn set(key: &str) -> Op {
        Op::Kv(vec![KvOp::Set {
            key: key.to_owned(),
            value: b"v".to_vec(),
            flags: 0,
        }])
    }

    /// The archive of a state holding `keys`, and the state that currently holds `other`.
    fn archive_and_current(keys: &[&str], other: &str) -> (Vec<u8>, StateMachine) {
        let mut archived = StateMachine::at_protocol(vigil_shared::PROTOCOL);
        for (i, key) in keys.iter().enumerate() {
            apply(&mut archived, 1 + i as u64, set(key));
        }
        let mut current = StateMachine::at_protocol(vigil_shared::PROTOCOL);
        apply(&mut current, 1, set(other));
        (archived.encode().expect("encode"), current)
    }

    #[test]
    fn the_last_part_restores_what_the_parts_carried() {
        let (archive, mut sm) = archive_and_current(&["a", "b", "c"], "old");
        let third = archive.len() / 3;
        let (one, rest) = archive.split_at(third);
        let (two, three) = rest.split_at(third);
        assert_eq!(apply(&mut sm, 10, part("r", 0, one, false)), Response::Done);
        assert_eq!(
            apply(&mut sm, 11, part("r", third, two, false)),
            Response::Done
        );
        // Until the last part, nothing but the staging changed.
        assert!(sm.kv().get("old").is_some());
        assert!(sm.staged_restore().is_some());
        let at = 2 * third;
        assert_eq!(
            apply(&mut sm, 12, part("r", at, three, true)),
            Response::Done
        );
        assert!(sm.kv().get("old").is_none());
        assert!(["a", "b", "c"].iter().all(|k| sm.kv().get(k).is_some()));
        assert_eq!(sm.staged_restore(), None);
    }

    #[test]
    fn a_part_that_does_not_continue_the_staged_restore_changes_nothing() {
        let (archive, mut sm) = archive_and_current(&["a"], "old");
        let (one, two) = archive.split_at(archive.len() / 2);
        apply(&mut sm, 10, part("r", 0, one, false));
        let staged = sm.staged_restore().cloned();
        let refused = Response::Rejected(ApplyError::RestoreInterrupted);
        // Another restore's part, a gap, and a part of a restore never begun.
        assert_eq!(apply(&mut sm, 11, part("x", one.len(), two, true)), refused);
        assert_eq!(
            apply(&mut sm, 12, part("r", one.len() + 1, two, true)),
            refused
        );
        assert_eq!(sm.staged_restore().cloned(), staged);
        let mut fresh = StateMachine::at_protocol(vigil_shared::PROTOCOL);
        assert_eq!(apply(&mut fresh, 1, part("r", 5, two, true)), refused);
        // A new restore (offset 0) replaces the staged one.
        apply(&mut sm, 13, part("y", 0, one, false));
        assert_eq!(apply(&mut sm, 14, part("r", one.len(), two, true)), refused);
        assert_eq!(
            apply(&mut sm, 15, part("y", one.len(), two, true)),
            Response::Done
        );
        assert!(sm.kv().get("a").is_some() && sm.kv().get("old").is_none());
    }
}
