//! Table-driven tests of the deterministic state machine, mirroring Consul's state-store tests
//! (`session_test.go`, `kvs_test.go`, `delay_test.go`, `graveyard_test.go`, `txn_test.go`;
//! docs/consul-compatibility.md#consul-tests-mirrored) plus Vigil's deliberate differences
//! (docs/consul-compatibility.md#deliberate-differences): LockIndex never decreases, lock-delay is
//! enforced in apply from the command's `now_ms`, 0 means no lock-delay, and lock-delay is capped
//! at 60 s.
//!
//! Time is only ever the `now_ms` put into a command; raft indexes are written out explicitly
//! so each script reads like the Consul test it mirrors.

use vigil_shared::DEFAULT_LOCK_DELAY_NS;
use vigil_shared::catalog::{HealthStatus, SERF_HEALTH, Service, ServiceHealth};
use vigil_shared::kv::{KvEntry, KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::query::{PreparedQuery, ServiceQuery};
use vigil_shared::rpc::{
    ApplyError, CheckRegistration, Command, Op, QueryResult, ReadQuery, Registration, Response,
};
use vigil_shared::session::{Behavior, ServiceCheck, Session};

use super::{Effects, StateMachine};

mod acl;
mod batch;
mod catalog_query;
mod history;
mod kv;
mod lock_delay;
mod lock_index;
mod reap_snapshot;
mod session;
mod txn;

// ---------------------------------------------------------------------------------------------
// Fixtures and helpers
// ---------------------------------------------------------------------------------------------

/// Asserts that applying something to `before` changed nothing but use up an op index (a
/// refused or empty write still takes one).
#[track_caller]
pub(super) fn assert_unchanged(sm: &StateMachine, before: &StateMachine, what: &str) {
    let before = StateMachine {
        index: sm.index,
        ..before.clone()
    };
    assert_eq!(*sm, before, "{what}");
}

/// The leader clock used when a test does not care about time (ms).
pub(super) const T0: u64 = 1_700_000_000_000;

pub(super) const N1: &str = "node1";
const N2: &str = "node2";

pub(super) const S1: &str = "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a01";
pub(super) const S2: &str = "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a02";
pub(super) const S3: &str = "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a03";
pub(super) const S4: &str = "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a04";

/// A session as the HTTP layer would propose it by default: release, 15 s lock-delay,
/// bound to `serfHealth`, no TTL.
pub(super) fn session(id: &str, node: &str) -> Session {
    Session {
        lock_delay_ns: DEFAULT_LOCK_DELAY_NS,
        node_checks: vec![SERF_HEALTH.to_owned()],
        id: id.to_owned(),
        node: node.to_owned(),
        ..Session::default()
    }
}

fn check(node: &str, check_id: &str, status: HealthStatus) -> CheckRegistration {
    CheckRegistration {
        node: node.to_owned(),
        check_id: check_id.to_owned(),
        name: check_id.to_owned(),
        status,
        ..CheckRegistration::default()
    }
}

/// An unlocked entry as stored, with `flags` 0 and `lock_index` 0.
fn entry(key: &str, value: &str, create_index: u64, modify_index: u64) -> KvEntry {
    KvEntry {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        flags: 0,
        session: None,
        lock_index: 0,
        create_index,
        modify_index,
    }
}

/// `entry` held by `session` at `lock_index`.
fn locked(entry: KvEntry, session: &str, lock_index: u64) -> KvEntry {
    KvEntry {
        session: Some(session.to_owned()),
        lock_index,
        ..entry
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// KV op constructors, named after Consul's txn verbs.
mod op {
    use vigil_shared::kv::KvOp;

    pub fn set(key: &str, value: &str) -> KvOp {
        set_flags(key, value, 0)
    }
    pub fn set_flags(key: &str, value: &str, flags: u64) -> KvOp {
        KvOp::Set {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            flags,
        }
    }
    pub fn cas(key: &str, value: &str, index: u64) -> KvOp {
        KvOp::Cas {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            flags: 0,
            index,
        }
    }
    pub fn lock(key: &str, value: &str, session: &str) -> KvOp {
        KvOp::Lock {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            flags: 0,
            session: session.to_owned(),
        }
    }
    pub fn unlock(key: &str, value: &str, session: &str) -> KvOp {
        KvOp::Unlock {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            flags: 0,
            session: session.to_owned(),
        }
    }
    pub fn get(key: &str) -> KvOp {
        KvOp::Get {
            key: key.to_owned(),
        }
    }
    pub fn get_or_empty(key: &str) -> KvOp {
        KvOp::GetOrEmpty {
            key: key.to_owned(),
        }
    }
    pub fn get_tree(prefix: &str) -> KvOp {
        KvOp::GetTree {
            prefix: prefix.to_owned(),
        }
    }
    pub fn check_index(key: &str, index: u64) -> KvOp {
        KvOp::CheckIndex {
            key: key.to_owned(),
            index,
        }
    }
    pub fn check_session(key: &str, session: &str) -> KvOp {
        KvOp::CheckSession {
            key: key.to_owned(),
            session: session.to_owned(),
        }
    }
    pub fn check_not_exists(key: &str) -> KvOp {
        KvOp::CheckNotExists {
            key: key.to_owned(),
        }
    }
    pub fn delete(key: &str) -> KvOp {
        KvOp::Delete {
            key: key.to_owned(),
        }
    }
    pub fn delete_tree(prefix: &str) -> KvOp {
        KvOp::DeleteTree {
            prefix: prefix.to_owned(),
        }
    }
    pub fn delete_cas(key: &str, index: u64) -> KvOp {
        KvOp::DeleteCas {
            key: key.to_owned(),
            index,
        }
    }
}

pub(super) fn apply_at(
    sm: &mut StateMachine,
    index: u64,
    now_ms: u64,
    op: Op,
) -> (Response, Effects) {
    sm.apply(index, Command { now_ms, op })
}

/// Reaps, at `now_ms`, every tombstone written before it.
pub(super) fn reap_at(sm: &mut StateMachine, index: u64, now_ms: u64) -> (Response, Effects) {
    apply_at(sm, index, now_ms, Op::ReapTombstones { before_ms: now_ms })
}

fn apply(sm: &mut StateMachine, index: u64, op: Op) -> (Response, Effects) {
    apply_at(sm, index, T0, op)
}

/// Applies a KV transaction at `now_ms`.
fn kv_at(sm: &mut StateMachine, index: u64, now_ms: u64, ops: Vec<KvOp>) -> (TxnOutcome, Effects) {
    match apply_at(sm, index, now_ms, Op::Kv(ops)) {
        (Response::Txn(outcome), fx) => (outcome, fx),
        (other, _) => panic!("a KV command must answer with a txn outcome, got {other:?}"),
    }
}

fn kv(sm: &mut StateMachine, index: u64, ops: Vec<KvOp>) -> (TxnOutcome, Effects) {
    kv_at(sm, index, T0, ops)
}

fn committed(outcome: TxnOutcome) -> Vec<KvEntry> {
    match outcome {
        TxnOutcome::Committed(results) => results,
        TxnOutcome::RolledBack(errors) => panic!("expected a commit, got {errors:?}"),
    }
}

/// The failed ops as (op index, Consul's `What` text).
fn failures(outcome: TxnOutcome) -> Vec<(usize, String)> {
    match outcome {
        TxnOutcome::RolledBack(errors) => errors
            .into_iter()
            .map(|TxnError { op_index, error }| (op_index, error.to_string()))
            .collect(),
        TxnOutcome::Committed(results) => panic!("expected a rollback, got {results:?}"),
    }
}

/// Applies one KV write that must succeed; returns its results.
fn write(sm: &mut StateMachine, index: u64, op: KvOp) -> Vec<KvEntry> {
    committed(kv(sm, index, vec![op]).0)
}

fn register_node(sm: &mut StateMachine, index: u64, name: &str) {
    let op = Op::RegisterNode {
        name: name.to_owned(),
        address: "127.0.0.1".to_owned(),
    };
    assert_eq!(apply(sm, index, op).0, Response::Done);
}

fn register_check(sm: &mut StateMachine, index: u64, reg: CheckRegistration) -> Effects {
    let (response, fx) = apply(sm, index, Op::RegisterCheck(reg));
    assert_eq!(response, Response::Done);
    fx
}

pub(super) fn create_session(sm: &mut StateMachine, index: u64, s: Session) -> Effects {
    let id = s.id.clone();
    let (response, fx) = apply(sm, index, Op::CreateSession(s));
    assert_eq!(response, Response::SessionCreated { id });
    fx
}

pub(super) fn destroy_at(sm: &mut StateMachine, index: u64, now_ms: u64, id: &str) -> Effects {
    let op = Op::DestroySession { id: id.to_owned() };
    let (response, fx) = apply_at(sm, index, now_ms, op);
    assert_eq!(response, Response::Done);
    fx
}

fn get(sm: &StateMachine, key: &str) -> Option<KvEntry> {
    sm.kv().get(key).cloned()
}

/// `X-Consul-Index` of a single-key read.
fn key_index(sm: &StateMachine, key: &str) -> u64 {
    sm.query(&ReadQuery::KvGet {
        key: key.to_owned(),
    })
    .1
}

/// Entries and `X-Consul-Index` of a recursive read.
fn list(sm: &StateMachine, prefix: &str) -> (Vec<KvEntry>, u64) {
    match sm.query(&ReadQuery::KvList {
        prefix: prefix.to_owned(),
    }) {
        (QueryResult::Entries(entries), index) => (entries, index),
        (other, _) => panic!("a KV list answers with entries, got {other:?}"),
    }
}

fn list_index(sm: &StateMachine, prefix: &str) -> u64 {
    list(sm, prefix).1
}

fn session_ids(result: QueryResult) -> Vec<String> {
    match result {
        QueryResult::Sessions(sessions) => sessions.into_iter().map(|s| s.id).collect(),
        other => panic!("a session read answers with sessions, got {other:?}"),
    }
}

/// Node `node1` (index 1) with a passing `serfHealth` (index 2): enough for default sessions.
pub(super) fn world() -> StateMachine {
    world_at(vigil_shared::PROTOCOL)
}

/// [`world`] at protocol `level`. Below 2 every op takes its raft index, as in the first
/// release, so the scripts mirroring Consul's state-store tests (which give a refused write the
/// same index as the next one) keep their indexes.
pub(super) fn world_at(level: u32) -> StateMachine {
    let mut sm = StateMachine::at_protocol(level);
    register_node(&mut sm, 1, N1);
    register_check(&mut sm, 2, check(N1, SERF_HEALTH, HealthStatus::Passing));
    sm
}
