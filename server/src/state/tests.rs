//! Table-driven tests of the deterministic state machine, mirroring Consul's state-store tests
//! (`session_test.go`, `kvs_test.go`, `delay_test.go`, `graveyard_test.go`, `txn_test.go`;
//! CONSUL-SEMANTICS.md §11.3, §11.4, §11.7) plus Vigil's deliberate differences (SPEC.md):
//! LockIndex never decreases, lock-delay is enforced in apply from the command's `now_ms`,
//! 0 means no lock-delay, and lock-delay is capped at 60 s.
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

// ---------------------------------------------------------------------------------------------
// Fixtures and helpers
// ---------------------------------------------------------------------------------------------

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
        id: id.to_owned(),
        name: String::new(),
        node: node.to_owned(),
        lock_delay_ns: DEFAULT_LOCK_DELAY_NS,
        behavior: Behavior::Release,
        ttl: String::new(),
        node_checks: vec![SERF_HEALTH.to_owned()],
        service_checks: None,
        checks: Vec::new(),
        create_index: 0,
        modify_index: 0,
        owner: String::new(),
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
    let mut sm = StateMachine::default();
    register_node(&mut sm, 1, N1);
    register_check(&mut sm, 2, check(N1, SERF_HEALTH, HealthStatus::Passing));
    sm
}

// ---------------------------------------------------------------------------------------------
// Sessions (session_test.go)
// ---------------------------------------------------------------------------------------------

/// TestStateStore_SessionCreate_SessionGet: every refusal, and a refusal changes nothing.
#[test]
fn session_create_refusals_change_nothing() {
    // Setup: node1 with serfHealth (passing), web (warning), db (critical); node2 with only a
    // passing "other" check; S1 already exists.
    let mut sm = world();
    register_check(&mut sm, 3, check(N1, "web", HealthStatus::Warning));
    register_check(&mut sm, 4, check(N1, "db", HealthStatus::Critical));
    register_node(&mut sm, 5, N2);
    register_check(&mut sm, 6, check(N2, "other", HealthStatus::Passing));
    create_session(&mut sm, 7, session(S1, N1));

    // S2 on node1 bound to the given checks, in each of the three check lists.
    let node_checks = |ids: &[&str]| Session {
        node_checks: strings(ids),
        ..session(S2, N1)
    };
    let legacy_checks = |ids: &[&str]| Session {
        checks: strings(ids),
        ..session(S2, N1)
    };
    let service_check = |id: &str| Session {
        service_checks: Some(vec![ServiceCheck {
            id: id.to_owned(),
            namespace: String::new(),
        }]),
        ..session(S2, N1)
    };
    let missing = |id: &str| ApplyError::MissingCheck(id.to_owned());
    let critical = |id: &str| ApplyError::CriticalCheck(id.to_owned());

    #[rustfmt::skip]
    let cases: Vec<(&str, Session, ApplyError)> = vec![
        ("node not in the catalog",                  session(S2, "nope"),                     ApplyError::MissingNode),
        ("default serfHealth missing on the node",   session(S2, N2),                         missing(SERF_HEALTH)),
        ("unknown node check",                       node_checks(&[SERF_HEALTH, "ghost"]),    missing("ghost")),
        ("checks are looked up on the own node",     node_checks(&["other"]),                 missing("other")),
        ("unknown service check",                    service_check("svc1"),                   missing("svc1")),
        ("unknown legacy check",                     legacy_checks(&["legacy"]),              missing("legacy")),
        ("critical node check",                      node_checks(&[SERF_HEALTH, "db"]),       critical("db")),
        ("critical service check",                   service_check("db"),                     critical("db")),
        ("critical legacy check",                    legacy_checks(&["db"]),                  critical("db")),
        ("duplicate ID",                             session(S1, N1),                         ApplyError::DuplicateSession),
        ("duplicate ID in another case",             session(&S1.to_ascii_uppercase(), N1),   ApplyError::DuplicateSession),
    ];

    for (i, (name, s, want)) in cases.into_iter().enumerate() {
        // A refused create still uses a raft index, but moves no table index and changes no
        // state (same clock, so even the clamp stays put).
        let before = sm.clone();
        let (response, fx) = apply(&mut sm, 10 + i as u64, Op::CreateSession(s));
        assert_eq!(response, Response::Rejected(want), "{name}");
        assert_eq!(fx, Effects::default(), "{name}");
        assert_eq!(sm, before, "{name}");
        assert_eq!(sm.sessions().table_index(), 7, "{name}");
    }
}

/// TestStateStore_SessionCreate_SessionGet / TestSessionCreate*: what is stored, which checks
/// are mapped, and which creates hand a TTL to the leader.
#[test]
fn session_create_stores_indexes_and_check_mappings() {
    // Setup: node1 with serfHealth passing, web warning, api passing; node2 with no checks.
    let mut sm = world();
    register_check(&mut sm, 3, check(N1, "web", HealthStatus::Warning));
    register_check(&mut sm, 4, check(N1, "api", HealthStatus::Passing));
    register_node(&mut sm, 5, N2);

    struct Case {
        name: &'static str,
        session: Session,
        mapped: &'static [&'static str],
        ttl_effect: bool,
    }
    let cases = [
        Case {
            name: "defaults: release, serfHealth",
            session: session(S1, N1),
            mapped: &[SERF_HEALTH],
            ttl_effect: false,
        },
        Case {
            name: "a warning check is accepted",
            session: Session {
                node_checks: strings(&["web"]),
                ..session(S2, N1)
            },
            mapped: &["web"],
            ttl_effect: false,
        },
        Case {
            name: "no checks at all on a node without serfHealth",
            session: Session {
                node_checks: Vec::new(),
                ..session(S3, N2)
            },
            mapped: &[],
            ttl_effect: false,
        },
        Case {
            name: "union of legacy, node and service checks; delete behaviour; TTL",
            session: Session {
                name: "svc lock".into(),
                behavior: Behavior::Delete,
                ttl: "30s".into(),
                lock_delay_ns: 0,
                checks: strings(&["web"]),
                service_checks: Some(vec![ServiceCheck {
                    id: "api".into(),
                    namespace: String::new(),
                }]),
                ..session(S4, N1)
            },
            mapped: &[SERF_HEALTH, "web", "api"],
            ttl_effect: true,
        },
    ];

    for (i, case) in cases.into_iter().enumerate() {
        let index = 10 + i as u64;
        let name = case.name;
        let id = case.session.id.clone();

        // Create: stored as given, with CreateIndex == ModifyIndex == the raft index.
        let fx = create_session(&mut sm, index, case.session.clone());
        let stored = sm.sessions().get(&id).expect(name).clone();
        let want = Session {
            create_index: index,
            modify_index: index,
            owner: String::new(),
            ..case.session.clone()
        };
        assert_eq!(stored, want, "{name}");
        assert_eq!(sm.sessions().table_index(), index, "{name}");

        // Effects: sessions changed; the leader hears about TTL sessions only.
        assert!(fx.sessions_changed, "{name}");
        let ttl: Vec<(String, String)> = if case.ttl_effect {
            vec![(id.clone(), case.session.ttl.clone())]
        } else {
            Vec::new()
        };
        assert_eq!(fx.ttl_sessions_created, ttl, "{name}");
        assert!(
            fx.kv_keys.is_empty() && fx.sessions_destroyed.is_empty(),
            "{name}"
        );

        // Check mappings: every check the session depends on finds it.
        for c in case.mapped {
            let bound = sm.sessions().on_check(&case.session.node, c);
            assert!(bound.contains(&id), "{name}: {c}");
        }
        assert!(
            sm.sessions().on_node(&case.session.node).contains(&id),
            "{name}"
        );
    }
    assert_eq!(sm.sessions().len(), 4);
}

/// TestStateStore_SessionList / TestStateStore_NodeSessions / TestSessionGet: reads return
/// arrays and the sessions table index, whatever the session's own index.
#[test]
fn session_reads_report_the_table_index() {
    // Before any session: info of an unknown ID is empty, at table index 0.
    let mut sm = world();
    register_node(&mut sm, 3, N2);
    register_check(&mut sm, 4, check(N2, SERF_HEALTH, HealthStatus::Passing));
    let info = |id: &str| ReadQuery::SessionInfo { id: id.to_owned() };
    let (result, index) = sm.query(&info(S1));
    assert_eq!((session_ids(result), index), (Vec::new(), 0));

    // Three sessions on two nodes, created out of ID order.
    create_session(&mut sm, 5, session(S3, N1));
    create_session(&mut sm, 6, session(S1, N1));
    create_session(&mut sm, 7, session(S2, N2));

    // List: every session, in ID order, at the table index.
    let (result, index) = sm.query(&ReadQuery::SessionList {});
    assert_eq!((session_ids(result), index), (strings(&[S1, S2, S3]), 7));

    // Node: only that node's sessions; an unknown node is empty.
    let node = |n: &str| ReadQuery::SessionNode { node: n.to_owned() };
    let (result, index) = sm.query(&node(N1));
    assert_eq!((session_ids(result), index), (strings(&[S1, S3]), 7));
    let (result, _) = sm.query(&node(N2));
    assert_eq!(session_ids(result), strings(&[S2]));
    let (result, _) = sm.query(&node("nope"));
    assert!(session_ids(result).is_empty());

    // Info: the one session, but at the table index (7), not its own ModifyIndex (5); a
    // missing ID is empty at the table index.
    let (result, index) = sm.query(&info(S3));
    assert_eq!((session_ids(result), index), (strings(&[S3]), 7));
    let (result, index) = sm.query(&info(S4));
    assert_eq!((session_ids(result), index), (Vec::new(), 7));
}

/// TestStateStore_SessionDestroy: destroying an unknown session is an idempotent no-op that
/// moves no index; a real destroy bumps the table index.
#[test]
fn session_destroy_is_idempotent() {
    // Destroying a session that never existed changes nothing at all.
    let mut sm = world();
    let before = sm.clone();
    assert_eq!(destroy_at(&mut sm, 3, T0, S1), Effects::default());
    assert_eq!(sm, before);
    assert_eq!(sm.sessions().table_index(), 0);

    // A real session: destroy removes it, bumps the table index and reports it.
    create_session(&mut sm, 4, session(S1, N1));
    let fx = destroy_at(&mut sm, 5, T0, S1);
    assert_eq!(fx.sessions_destroyed, strings(&[S1]));
    assert!(fx.sessions_changed && fx.kv_keys.is_empty());
    assert!(sm.sessions().get(S1).is_none());
    assert_eq!(sm.sessions().table_index(), 5);
    assert!(sm.sessions().on_node(N1).is_empty());
    assert!(sm.sessions().on_check(N1, SERF_HEALTH).is_empty());

    // Destroying it again is a no-op: the index stays at 5.
    assert_eq!(destroy_at(&mut sm, 6, T0, S1), Effects::default());
    assert_eq!(sm.sessions().table_index(), 5);
}

/// TestStateStore_Session_Invalidate_{DeleteNode,Critical_Check,DeleteCheck} and
/// TestStateStore_Session_Invalidate_Key_{Unlock,Delete}_Behavior: every trigger, for both
/// behaviours, against a bystander session on another node.
#[test]
fn session_invalidation_triggers() {
    let critical =
        |node: &str, id: &str| Op::RegisterCheck(check(node, id, HealthStatus::Critical));
    let status = |id: &str, status: HealthStatus| Op::RegisterCheck(check(N1, id, status));
    let dereg_check = |node: &str, id: &str| Op::DeregisterCheck {
        node: node.to_owned(),
        check_id: id.to_owned(),
    };
    let dereg_node = |name: &str| Op::DeregisterNode {
        name: name.to_owned(),
    };
    let destroy = |id: &str| Op::DestroySession { id: id.to_owned() };
    let passing_again = Op::RegisterCheck(CheckRegistration {
        output: "still fine".into(),
        ..check(N1, "web", HealthStatus::Passing)
    });

    // (what happens, the command, which sessions it destroys)
    #[rustfmt::skip]
    let cases: Vec<(&str, Op, &[&str])> = vec![
        ("explicit destroy",                  destroy(S1),                            &[S1]),
        ("destroy by upper-case ID",          destroy(&S1.to_ascii_uppercase()),      &[S1]),
        ("node deregistered",                 dereg_node(N1),                         &[S1]),
        ("serfHealth turns critical",         critical(N1, SERF_HEALTH),              &[S1]),
        ("bound check turns critical",        critical(N1, "web"),                    &[S1]),
        ("bound check deregistered",          dereg_check(N1, "web"),                 &[S1]),
        ("serfHealth deregistered",           dereg_check(N1, SERF_HEALTH),           &[S1]),
        ("other node's serfHealth critical",  critical(N2, SERF_HEALTH),              &[S2]),
        ("other node deregistered",           dereg_node(N2),                         &[S2]),
        ("warning never invalidates",         status("web", HealthStatus::Warning),   &[]),
        ("passing update",                    passing_again,                          &[]),
        ("unbound check turns critical",      critical(N1, "spare"),                  &[]),
        ("unbound check deregistered",        dereg_check(N1, "spare"),               &[]),
        ("unknown check deregistered",        dereg_check(N1, "ghost"),               &[]),
        ("unknown node deregistered",         dereg_node("ghost"),                    &[]),
        ("unknown session destroyed",         destroy(S3),                            &[]),
    ];

    for behavior in [Behavior::Release, Behavior::Delete] {
        for (name, trigger, destroyed) in &cases {
            let name = format!("{name} ({})", behavior.as_str());

            // Setup: S1 on node1 bound to serfHealth + web holds lock/a; bystander S2 on
            // node2 holds lock/b. Both have the default 15 s lock-delay.
            let mut sm = world();
            register_check(&mut sm, 3, check(N1, "web", HealthStatus::Passing));
            register_check(&mut sm, 4, check(N1, "spare", HealthStatus::Passing));
            register_node(&mut sm, 5, N2);
            register_check(&mut sm, 6, check(N2, SERF_HEALTH, HealthStatus::Passing));
            let s1 = Session {
                node_checks: strings(&[SERF_HEALTH, "web"]),
                behavior,
                ..session(S1, N1)
            };
            create_session(&mut sm, 7, s1);
            create_session(
                &mut sm,
                8,
                Session {
                    behavior,
                    ..session(S2, N2)
                },
            );
            write(&mut sm, 9, op::lock("lock/a", "a", S1));
            write(&mut sm, 10, op::lock("lock/b", "b", S2));

            // Trigger at index 11.
            let (response, fx) = apply(&mut sm, 11, trigger.clone());
            assert_eq!(response, Response::Done, "{name}");
            assert_eq!(fx.sessions_destroyed, strings(destroyed), "{name}");
            assert_eq!(fx.sessions_changed, !destroyed.is_empty(), "{name}");
            let want_table_index = if destroyed.is_empty() { 8 } else { 11 };
            assert_eq!(sm.sessions().table_index(), want_table_index, "{name}");

            // Each session's key: released or deleted at index 11 with a 15 s lock-delay if
            // its session died, untouched otherwise.
            let mut touched = Vec::new();
            for (id, key, value, lock_at) in [(S1, "lock/a", "a", 9), (S2, "lock/b", "b", 10)] {
                let held = locked(entry(key, value, lock_at, lock_at), id, 1);
                if !destroyed.contains(&id) {
                    assert!(sm.sessions().get(id).is_some(), "{name}: {id} survives");
                    assert_eq!(get(&sm, key), Some(held), "{name}: {key} still held");
                    assert_eq!(sm.kv().lock_delay_remaining(key, T0), None, "{name}");
                    continue;
                }
                touched.push(key);
                assert!(sm.sessions().get(id).is_none(), "{name}: {id} gone");
                assert_eq!(sm.kv().held_by(id).count(), 0, "{name}");
                let want = match behavior {
                    Behavior::Release => Some(KvEntry {
                        session: None,
                        modify_index: 11,
                        ..held
                    }),
                    Behavior::Delete => None,
                };
                assert_eq!(get(&sm, key), want, "{name}: {key}");
                assert_eq!(
                    list_index(&sm, key),
                    11,
                    "{name}: {key} index from entry or tombstone"
                );
                assert_eq!(
                    sm.kv().lock_delay_remaining(key, T0),
                    Some(15_000),
                    "{name}"
                );
            }
            assert_eq!(fx.kv_keys, strings(&touched), "{name}");
        }
    }
}

/// §1.6.3 / §10.16: deregistering a node destroys all of its sessions, including sessions with
/// no checks and TTL-only sessions; the node's checks go with it.
#[test]
fn node_deregistration_destroys_every_session_on_the_node() {
    // Setup: three kinds of session on node1, one on node2.
    let mut sm = world();
    register_node(&mut sm, 3, N2);
    register_check(&mut sm, 4, check(N2, SERF_HEALTH, HealthStatus::Passing));
    create_session(&mut sm, 5, session(S1, N1));
    let no_checks = Session {
        node_checks: Vec::new(),
        ..session(S2, N1)
    };
    create_session(&mut sm, 6, no_checks);
    let ttl_only = Session {
        node_checks: Vec::new(),
        ttl: "30s".into(),
        ..session(S3, N1)
    };
    let fx = create_session(&mut sm, 7, ttl_only);
    assert_eq!(
        fx.ttl_sessions_created,
        vec![(S3.to_owned(), "30s".to_owned())]
    );
    create_session(&mut sm, 8, session(S4, N2));

    // Deregister node1: its three sessions go in ID order, node2's stays.
    let (response, fx) = apply(&mut sm, 9, Op::DeregisterNode { name: N1.into() });
    assert_eq!(response, Response::Done);
    assert_eq!(fx.sessions_destroyed, strings(&[S1, S2, S3]));
    assert!(fx.catalog_changed && fx.sessions_changed);
    let (result, index) = sm.query(&ReadQuery::SessionList {});
    assert_eq!((session_ids(result), index), (strings(&[S4]), 9));

    // The node and its checks are gone from the catalog.
    assert!(sm.catalog().node(N1).is_none());
    assert!(sm.catalog().check(N1, SERF_HEALTH).is_none());
    let (checks, index) = sm.query(&ReadQuery::NodeChecks { node: N1.into() });
    assert_eq!((checks, index), (QueryResult::Checks(Vec::new()), 9));
    assert_eq!(sm.catalog().table_index(), 9);
}

/// TestStateStore_Session_Invalidate_Key_Unlock_Behavior in detail, then Consul's
/// TestKVS_Apply_LockDelay: the released key keeps everything but Session, and the next
/// acquire waits out the lock-delay and bumps LockIndex.
#[test]
fn release_invalidation_keeps_key_and_arms_lock_delay() {
    // Setup: S1 holds "lock" with flags and a value; S2 wants it.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    let acquire = KvOp::Lock {
        key: "lock".into(),
        value: b"owner".to_vec(),
        flags: 42,
        session: S1.into(),
    };
    write(&mut sm, 5, acquire);

    // Invalidate S1 (a check failure) at index 6, time T0.
    let critical = check(N1, SERF_HEALTH, HealthStatus::Critical);
    let (_, fx) = apply_at(&mut sm, 6, T0, Op::RegisterCheck(critical));
    assert_eq!(fx.sessions_destroyed, strings(&[S1, S2]));
    assert_eq!(fx.kv_keys, strings(&["lock"]));
    let released = KvEntry {
        flags: 42,
        lock_index: 1,
        ..entry("lock", "owner", 5, 6)
    };
    assert_eq!(get(&sm, "lock"), Some(released.clone()));
    assert_eq!(key_index(&sm, "lock"), 6);
    assert_eq!(sm.kv().lock_delay_remaining("lock", T0), Some(15_000));

    // A new session (the node recovered) is refused until T0 + 15 s.
    register_check(&mut sm, 7, check(N1, SERF_HEALTH, HealthStatus::Passing));
    create_session(&mut sm, 8, session(S3, N1));
    let (outcome, fx) = kv_at(&mut sm, 9, T0 + 14_999, vec![op::lock("lock", "new", S3)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"lock\" due to lock delay".into())]
    );
    assert!(fx.kv_keys.is_empty());
    assert_eq!(get(&sm, "lock"), Some(released));

    // At T0 + 15 s the acquire succeeds and LockIndex goes to 2; CreateIndex is kept.
    let (outcome, fx) = kv_at(&mut sm, 10, T0 + 15_000, vec![op::lock("lock", "new", S3)]);
    let want = locked(entry("lock", "new", 5, 10), S3, 2);
    assert_eq!(
        committed(outcome),
        vec![KvEntry {
            value: Vec::new(),
            ..want.clone()
        }]
    );
    assert_eq!(fx.kv_keys, strings(&["lock"]));
    assert_eq!(get(&sm, "lock"), Some(want));
}

/// TestStateStore_Session_Invalidate_Key_Delete_Behavior in detail: the key is deleted (a
/// tombstone keeps the index), and lock-delay still applies to the now-missing key.
#[test]
fn delete_invalidation_removes_key_and_arms_lock_delay() {
    // Setup: delete-behaviour S1 holds two keys under sema/; an unrelated key sorts after.
    let mut sm = world();
    let s1 = Session {
        behavior: Behavior::Delete,
        ..session(S1, N1)
    };
    create_session(&mut sm, 3, s1);
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("sema/a", "a", S1));
    write(&mut sm, 6, op::lock("sema/b", "b", S1));
    write(&mut sm, 7, op::set("z", "z"));

    // Destroy S1 at index 8: both keys are deleted in key order and tombstoned.
    let fx = destroy_at(&mut sm, 8, T0, S1);
    assert_eq!(fx.kv_keys, strings(&["sema/a", "sema/b"]));
    assert_eq!(sm.kv().get("sema/a"), None);
    assert_eq!(sm.kv().get("sema/b"), None);
    assert_eq!(sm.kv().tombstone_count(), 2);
    assert_eq!(list(&sm, "sema/"), (Vec::new(), 8));
    assert_eq!(key_index(&sm, "sema/a"), 8);
    assert_eq!(sm.kv().table_index(), 8);

    // Lock-delay holds even though the key does not exist.
    let (outcome, _) = kv_at(&mut sm, 9, T0 + 1, vec![op::lock("sema/a", "x", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"sema/a\" due to lock delay".into())]
    );

    // After it, the key is created afresh but its LockIndex continues from the tombstone's
    // (Vigil: a sequencer never goes backwards, even across a delete), so 2, not Consul's 1.
    let (outcome, _) = kv_at(&mut sm, 10, T0 + 15_000, vec![op::lock("sema/a", "x", S2)]);
    committed(outcome);
    assert_eq!(
        get(&sm, "sema/a"),
        Some(locked(entry("sema/a", "x", 10, 10), S2, 2))
    );
}

/// Vigil: LockIndex survives a plain delete and a delete-then-lock inside one transaction, and
/// the reaping of the tombstone too (the reaped LockIndex becomes the floor of every acquire).
#[test]
fn lock_index_continues_across_delete() {
    // Lock twice (LockIndex 2), then delete the key.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("k", "a", S1));
    write(&mut sm, 5, op::unlock("k", "a", S1));
    write(&mut sm, 6, op::lock("k", "a", S1));
    write(&mut sm, 7, KvOp::Delete { key: "k".into() });
    assert_eq!(sm.kv().get("k"), None);

    // Re-locking continues at 3; a plain set of a re-created key keeps the count too.
    write(&mut sm, 8, op::lock("k", "b", S1));
    assert_eq!(sm.kv().get("k").map(|e| e.lock_index), Some(3));
    let (outcome, _) = kv_at(
        &mut sm,
        9,
        T0,
        vec![KvOp::Delete { key: "k".into() }, op::set("k", "c")],
    );
    committed(outcome);
    assert_eq!(sm.kv().get("k").map(|e| e.lock_index), Some(3));

    // Once the tombstone is reaped the key's own history is gone, but the floor is not.
    write(&mut sm, 10, KvOp::Delete { key: "k".into() });
    sm.apply(
        11,
        Command {
            now_ms: T0 + 1_000_000,
            op: Op::ReapTombstones {
                before_ms: T0 + 1_000_000,
            },
        },
    );
    assert_eq!(sm.kv().tombstone_count(), 0);
    write(&mut sm, 12, op::lock("k", "d", S1));
    assert_eq!(sm.kv().get("k").map(|e| e.lock_index), Some(4));
}

// ---------------------------------------------------------------------------------------------
// Lock-delay (delay_test.go, TestKVS_Apply_LockDelay, TestTxn_Apply_LockDelay, SPEC.md)
// ---------------------------------------------------------------------------------------------

/// Refusal then expiry, with zero, ordinary, exactly-capped and over-capped delays: the delay
/// is min(LockDelay, 60 s) from the invalidating command's clock; 0 means none.
#[test]
fn lock_delay_refuses_then_expires() {
    // (what, session LockDelay in ns, probes: (ms after invalidation, expected remaining ms
    // or None when the acquire succeeds))
    type Probe = (u64, Option<u64>);
    #[rustfmt::skip]
    let cases: [(&str, u64, &[Probe]); 6] = [
        ("zero means no lock-delay",            0,                 &[(0, None)]),
        ("Consul's default 15 s",               15_000_000_000,    &[(0, Some(15_000)), (14_999, Some(1)), (15_000, None)]),
        ("50 ms as in TestKVS_Apply_LockDelay", 50_000_000,        &[(0, Some(50)), (49, Some(1)), (50, None)]),
        ("exactly the 60 s cap",                60_000_000_000,    &[(0, Some(60_000)), (59_999, Some(1)), (60_000, None)]),
        ("120 s is capped to 60 s",             120_000_000_000,   &[(0, Some(60_000)), (59_999, Some(1)), (60_000, None)]),
        ("one hour is capped to 60 s",          3_600_000_000_000, &[(30_000, Some(30_000)), (60_000, None)]),
    ];

    for (name, lock_delay_ns, probes) in cases {
        // Setup: S1 with this lock-delay holds "k"; destroyed at T0 (index 5). S2 is a
        // brand-new session, which lock-delay blocks too.
        let mut sm = world();
        create_session(
            &mut sm,
            3,
            Session {
                lock_delay_ns,
                ..session(S1, N1)
            },
        );
        write(&mut sm, 4, op::lock("k", "v", S1));
        destroy_at(&mut sm, 5, T0, S1);
        create_session(&mut sm, 6, session(S2, N1));
        let released = KvEntry {
            lock_index: 1,
            ..entry("k", "v", 4, 5)
        };

        for (i, &(after_ms, remaining)) in probes.iter().enumerate() {
            let now = T0 + after_ms;
            let index = 7 + i as u64;
            assert_eq!(
                sm.kv().lock_delay_remaining("k", now),
                remaining,
                "{name} +{after_ms}ms"
            );
            let (outcome, fx) = kv_at(&mut sm, index, now, vec![op::lock("k", "mine", S2)]);
            match remaining {
                // Refused: the error says why and how long; nothing is written.
                Some(remaining_ms) => {
                    let TxnOutcome::RolledBack(errors) = outcome else {
                        panic!("{name} +{after_ms}ms: expected a refusal");
                    };
                    let want = KvOpError::LockDelay {
                        key: "k".into(),
                        remaining_ms,
                    };
                    assert_eq!(
                        errors,
                        vec![TxnError {
                            op_index: 0,
                            error: want
                        }],
                        "{name}"
                    );
                    assert_eq!(fx, Effects::default(), "{name}");
                    assert_eq!(get(&sm, "k"), Some(released.clone()), "{name}");
                }
                // Granted: an acquisition, so LockIndex goes from 1 to 2.
                None => {
                    committed(outcome);
                    assert_eq!(fx.kv_keys, strings(&["k"]), "{name}");
                    let want = locked(entry("k", "mine", 4, index), S2, 2);
                    assert_eq!(get(&sm, "k"), Some(want), "{name}");
                }
            }
        }
    }
}

/// §1.9: lock-delay blocks only acquire. Plain set, cas, delete, reads and release proceed;
/// a voluntary release sets no lock-delay; a key that never had one reports none
/// (TestStateStore_KVSLockDelay).
#[test]
fn lock_delay_blocks_only_acquire() {
    // Setup: S1 held "k" and was destroyed at T0 (15 s delay). S2 is alive.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("k", "v", S1));
    destroy_at(&mut sm, 6, T0, S1);
    let now = T0 + 1_000;
    assert_eq!(sm.kv().lock_delay_remaining("never-locked", now), None);

    // Plain set, cas and reads on the delayed key all go through (LockIndex is kept).
    let (outcome, _) = kv_at(
        &mut sm,
        7,
        now,
        vec![op::set("k", "plain"), op::cas("k", "cas", 7), op::get("k")],
    );
    let results = committed(outcome);
    assert_eq!(
        results[2],
        KvEntry {
            lock_index: 1,
            ..entry("k", "cas", 5, 7)
        }
    );

    // Unlock by a non-holder fails as "not held", not as lock-delay.
    let (outcome, _) = kv_at(&mut sm, 8, now, vec![op::unlock("k", "", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(
            0,
            "failed to unlock key \"k\", lock isn't held, or is held by another session".into()
        )]
    );

    // Other keys are not delayed; a voluntary release arms no delay, so re-acquire is at once.
    write(&mut sm, 9, op::lock("other", "x", S2));
    write(&mut sm, 10, op::unlock("other", "x", S2));
    assert_eq!(sm.kv().lock_delay_remaining("other", now), None);
    write(&mut sm, 11, op::lock("other", "x", S2));
    assert_eq!(get(&sm, "other").map(|e| e.lock_index), Some(2));

    // Delete of the delayed key is allowed, and the delay outlives the key.
    let (outcome, _) = kv_at(&mut sm, 12, now, vec![op::delete("k")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(get(&sm, "k"), None);
    let (outcome, _) = kv_at(&mut sm, 13, now, vec![op::lock("k", "x", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"k\" due to lock delay".into())]
    );
}

/// TestTxn_Apply_LockDelay: a txn `lock` in lock-delay fails the whole transaction (other ops
/// included) with "due to lock delay", and the same transaction succeeds afterwards.
#[test]
fn txn_lock_during_lock_delay_rolls_back_everything() {
    // Setup: S1 held "test" and was destroyed at T0 with a 50 ms lock-delay.
    let mut sm = world();
    create_session(
        &mut sm,
        3,
        Session {
            lock_delay_ns: 50_000_000,
            ..session(S1, N1)
        },
    );
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("test", "v", S1));
    destroy_at(&mut sm, 6, T0, S1);
    let txn = || vec![op::set("side", "effect"), op::lock("test", "mine", S2)];

    // During the delay: refused, and the set before it is not applied either.
    let before = sm.clone();
    let (outcome, fx) = kv_at(&mut sm, 7, T0 + 10, txn());
    assert_eq!(
        failures(outcome),
        vec![(1, "failed to lock key \"test\" due to lock delay".into())]
    );
    assert_eq!(fx, Effects::default());
    assert_eq!(get(&sm, "side"), None);
    assert_eq!(sm.kv(), before.kv());

    // After the delay: both ops apply.
    let (outcome, fx) = kv_at(&mut sm, 8, T0 + 50, txn());
    assert_eq!(committed(outcome).len(), 2);
    assert_eq!(fx.kv_keys, strings(&["side", "test"]));
    assert_eq!(
        get(&sm, "test").and_then(|e| e.session),
        Some(S2.to_owned())
    );
}

/// SPEC.md: apply uses the command's leader-stamped `now_ms`, clamped so it never goes
/// backwards; a command stamped by a leader with a lagging clock cannot shorten or extend a
/// lock-delay relative to what the state machine has already seen.
#[test]
fn lock_delay_uses_the_command_clock_clamped_monotonic() {
    // S1 held "k" and was destroyed at T0: delay until T0 + 15 s.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("k", "v", S1));
    destroy_at(&mut sm, 6, T0, S1);
    assert_eq!(sm.now_ms(), T0);

    // A command at T0 + 20 s moves the state machine's clock forward.
    kv_at(&mut sm, 7, T0 + 20_000, vec![op::set("tick", "")]);
    assert_eq!(sm.now_ms(), T0 + 20_000);

    // A later command stamped with an older clock (T0 + 1 s) is applied at T0 + 20 s, so the
    // lock-delay has already passed.
    let (outcome, _) = kv_at(&mut sm, 8, T0 + 1_000, vec![op::lock("k", "mine", S2)]);
    committed(outcome);
    assert_eq!(sm.now_ms(), T0 + 20_000);
}

// ---------------------------------------------------------------------------------------------
// KV (kvs_test.go)
// ---------------------------------------------------------------------------------------------

/// TestStateStore_KVSSet_KVSGet: indexes on create and update, a plain set keeps a lock's
/// Session (and, in Vigil, its LockIndex), a missing key reads at the table index, and an
/// identical set is a no-op that moves no index and wakes nobody.
#[test]
fn kv_set_get() {
    // Empty store: a missing key reads at index 0.
    let mut sm = world();
    let (result, index) = sm.query(&ReadQuery::KvGet { key: "foo".into() });
    assert_eq!((result, index), (QueryResult::Entries(Vec::new()), 0));

    // Create: CreateIndex == ModifyIndex; the write result has no value.
    let (outcome, fx) = kv(&mut sm, 3, vec![op::set("foo", "bar")]);
    assert_eq!(committed(outcome), vec![entry("foo", "", 3, 3)]);
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(get(&sm, "foo"), Some(entry("foo", "bar", 3, 3)));
    assert_eq!(key_index(&sm, "foo"), 3);

    // Update: CreateIndex kept, ModifyIndex moves; flags come from the request.
    write(&mut sm, 4, op::set_flags("foo", "baz", 7));
    assert_eq!(
        get(&sm, "foo"),
        Some(KvEntry {
            flags: 7,
            ..entry("foo", "baz", 3, 4)
        })
    );
    assert_eq!(key_index(&sm, "foo"), 4);

    // A plain set on a locked key keeps Session and LockIndex (locking is advisory).
    create_session(&mut sm, 5, session(S1, N1));
    write(&mut sm, 6, op::lock("foo", "locked", S1));
    write(&mut sm, 7, op::set("foo", "overwritten"));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "overwritten", 3, 7), S1, 1))
    );
    assert_eq!(sm.kv().held_by(S1).collect::<Vec<_>>(), vec!["foo"]);

    // An identical set is a no-op: result carries the old ModifyIndex, no key is touched, the
    // table index stays.
    let (outcome, fx) = kv(&mut sm, 8, vec![op::set("foo", "overwritten")]);
    assert_eq!(
        committed(outcome),
        vec![locked(entry("foo", "", 3, 7), S1, 1)]
    );
    assert!(fx.kv_keys.is_empty());
    assert_eq!(sm.kv().table_index(), 7);
    assert_eq!(key_index(&sm, "foo"), 7);

    // Changing only the flags is a change.
    write(&mut sm, 9, op::set_flags("foo", "overwritten", 1));
    assert_eq!(key_index(&sm, "foo"), 9);

    // A missing key reads at the table index.
    assert_eq!(key_index(&sm, "nope"), 9);
}

/// TestStateStore_KVSList: raw-prefix listing in key order; the prefix index comes from the
/// entries, then from a tombstone after a delete, then from the table once it is reaped.
#[test]
fn kv_list_and_tombstone_index() {
    // Empty store: nothing, at index 0.
    let mut sm = StateMachine::default();
    assert_eq!(list(&sm, ""), (Vec::new(), 0));

    // Setup (out of key order on purpose).
    write(&mut sm, 1, op::set("foo", "foo"));
    write(&mut sm, 2, op::set("foo/bar", "bar"));
    write(&mut sm, 3, op::set("foo/bar/zip", "zip"));
    write(&mut sm, 4, op::set("foo/bar/zip/zorp", "zorp"));
    write(&mut sm, 5, op::set("foo/bar/baz", "baz"));
    write(&mut sm, 6, op::set("foobar", "raw prefix"));

    // A prefix lists every key starting with it, in key order, at the highest ModifyIndex.
    let (entries, index) = list(&sm, "foo/bar");
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["foo/bar", "foo/bar/baz", "foo/bar/zip", "foo/bar/zip/zorp"]
    );
    assert_eq!(entries[1], entry("foo/bar/baz", "baz", 5, 5));
    assert_eq!(index, 5);
    assert_eq!(list_index(&sm, "foo/bar/zip"), 4);
    assert_eq!(list(&sm, "foo").0.len(), 6);
    assert_eq!(list_index(&sm, ""), 6);

    // Delete a key: its tombstone holds the prefix index.
    kv_at(&mut sm, 7, T0, vec![op::delete("foo/bar/baz")]);
    assert_eq!(list(&sm, "foo/bar/baz"), (Vec::new(), 7));

    // A write elsewhere moves the global index but not this prefix's.
    write(&mut sm, 8, op::set("some/other/key", ""));
    assert_eq!(list_index(&sm, "foo/bar/baz"), 7);

    // Reap the tombstone: with nothing under the prefix the index falls back to the table's.
    let (_, fx) = apply_at(&mut sm, 9, T0 + 1, Op::ReapTombstones { before_ms: T0 + 1 });
    assert_eq!(fx, Effects::default());
    assert_eq!(list_index(&sm, "foo/bar/baz"), 8);
}

/// TestKVSEndpoint_ListKeys at the state level: keys listing with and without a separator.
#[test]
fn kv_keys_with_separator() {
    let mut sm = StateMachine::default();
    for (i, key) in ["/test/key1", "/test/key2", "/test/sub/key3", "/other"]
        .iter()
        .enumerate()
    {
        write(&mut sm, 1 + i as u64, op::set(key, "v"));
    }
    let keys = |prefix: &str, separator: Option<&str>| {
        sm.query(&ReadQuery::KvKeys {
            prefix: prefix.into(),
            separator: separator.map(str::to_owned),
        })
    };
    assert_eq!(
        keys("/test/", Some("/")),
        (
            QueryResult::Keys(strings(&["/test/key1", "/test/key2", "/test/sub/"])),
            3
        )
    );
    assert_eq!(
        keys("/test/", None),
        (
            QueryResult::Keys(strings(&["/test/key1", "/test/key2", "/test/sub/key3"])),
            3
        )
    );
    assert_eq!(
        keys("/nope/", Some("/")),
        (QueryResult::Keys(Vec::new()), 4)
    );
}

/// TestStateStore_KVSDelete: delete writes a tombstone; the index does not slide back until
/// it is reaped; deleting a missing key is idempotent and moves nothing.
#[test]
fn kv_delete() {
    // Setup.
    let mut sm = StateMachine::default();
    write(&mut sm, 1, op::set("foo", "foo"));
    write(&mut sm, 2, op::set("foo/bar", "bar"));

    // Delete "foo": no result, the key is touched, a tombstone holds the index at 3.
    let (outcome, fx) = kv_at(&mut sm, 3, T0, vec![op::delete("foo")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(get(&sm, "foo"), None);
    assert_eq!(get(&sm, "foo/bar"), Some(entry("foo/bar", "bar", 2, 2)));
    assert_eq!(sm.kv().tombstone_count(), 1);
    assert_eq!(list_index(&sm, "foo"), 3);
    assert_eq!(key_index(&sm, "foo"), 3);

    // Reap it: the prefix index reverts to the remaining foo/bar.
    apply_at(&mut sm, 4, T0 + 1, Op::ReapTombstones { before_ms: T0 + 1 });
    assert_eq!(sm.kv().tombstone_count(), 0);
    assert_eq!(list_index(&sm, "foo"), 2);

    // Deleting a missing key succeeds and changes nothing.
    let before = sm.clone();
    let (outcome, fx) = kv_at(&mut sm, 5, T0 + 1, vec![op::delete("foo")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(fx, Effects::default());
    assert_eq!(sm, before);
    assert_eq!(sm.kv().table_index(), 3);
}

/// TestStateStore_KVSDeleteCAS: a missing key is success, a wrong index refuses, the right
/// index deletes (and tombstones).
#[test]
fn kv_delete_cas() {
    // (what, key, index, Ok(deleted) or the error text)
    #[rustfmt::skip]
    let cases: [(&str, &str, u64, Result<bool, &str>); 5] = [
        ("missing key is success for any index",  "nope", 99, Ok(false)),
        ("missing key with index 0",              "nope", 0,  Ok(false)),
        ("index 0 never deletes an existing key", "bar",  0,  Err("failed to delete key \"bar\", index is stale")),
        ("wrong index",                           "bar",  1,  Err("failed to delete key \"bar\", index is stale")),
        ("right index",                           "bar",  2,  Ok(true)),
    ];
    for (name, key, index, want) in cases {
        // Setup: foo at 1, bar at 2, baz at 3.
        let mut sm = StateMachine::default();
        write(&mut sm, 1, op::set("foo", "foo"));
        write(&mut sm, 2, op::set("bar", "bar"));
        write(&mut sm, 3, op::set("baz", "baz"));
        let before = sm.clone();

        let (outcome, fx) = kv(&mut sm, 4, vec![op::delete_cas(key, index)]);
        match want {
            Ok(deleted) => {
                assert!(committed(outcome).is_empty(), "{name}");
                assert_eq!(get(&sm, key), None, "{name}");
                let touched: &[&str] = if deleted { &[key] } else { &[] };
                assert_eq!(fx.kv_keys, strings(touched), "{name}");
                assert_eq!(sm.kv().tombstone_count(), usize::from(deleted), "{name}");
                assert_eq!(sm.kv().table_index(), if deleted { 4 } else { 3 }, "{name}");
            }
            Err(text) => {
                assert_eq!(failures(outcome), vec![(0, text.to_owned())], "{name}");
                assert_eq!(sm, before, "{name}");
            }
        }
    }
}

/// TestStateStore_KVSSetCAS: cas 0 creates only if absent, a mismatch is refused, a match
/// writes like set; the Session (and in Vigil the LockIndex) of a locked key is preserved.
#[test]
fn kv_cas() {
    let stale = |key: &str| format!("failed to set key \"{key}\", index is stale");
    let mut sm = world();

    // cas 0 on a missing key creates it.
    let (outcome, fx) = kv(&mut sm, 3, vec![op::cas("foo", "bar", 0)]);
    assert_eq!(committed(outcome), vec![entry("foo", "", 3, 3)]);
    assert_eq!(fx.kv_keys, strings(&["foo"]));

    // Refusals change nothing: cas 0 on an existing key, a wrong index, any non-zero index
    // on a missing key.
    for (key, index) in [("foo", 0), ("foo", 2), ("foo", 4), ("missing", 3)] {
        let before = sm.clone();
        let (outcome, fx) = kv(&mut sm, 4, vec![op::cas(key, "nope", index)]);
        assert_eq!(
            failures(outcome),
            vec![(0, stale(key))],
            "cas {key}@{index}"
        );
        assert_eq!(fx, Effects::default());
        assert_eq!(sm, before);
    }

    // The matching index writes.
    write(&mut sm, 5, op::cas("foo", "baz", 3));
    assert_eq!(get(&sm, "foo"), Some(entry("foo", "baz", 3, 5)));

    // On a locked key, cas keeps Session and LockIndex (Consul would reset LockIndex to 0).
    create_session(&mut sm, 6, session(S1, N1));
    write(&mut sm, 7, op::lock("foo", "locked", S1));
    write(&mut sm, 8, op::cas("foo", "cas", 7));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "cas", 3, 8), S1, 1))
    );
}

/// TestStateStore_KVSDeleteTree and TestStateStore_Watches_PrefixDelete: a tree delete that
/// matches nothing changes nothing; a nested prefix delete writes one tombstone for the prefix;
/// deleting everything writes none but still moves the index.
#[test]
fn kv_delete_tree() {
    // Setup.
    let mut sm = world();
    write(&mut sm, 3, op::set("foo/bar", "bar"));
    write(&mut sm, 4, op::set("foo/bar/baz", "baz"));
    write(&mut sm, 5, op::set("foo/bar/zip", "zip"));
    write(&mut sm, 6, op::set("foo/zorp", "zorp"));

    // No match: no index change, no tombstone, no effects.
    let before = sm.clone();
    let (outcome, fx) = kv_at(&mut sm, 9, T0, vec![op::delete_tree("bar")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(fx, Effects::default());
    assert_eq!(sm, before);

    // Nested prefix: the three keys go; one tombstone for "foo/bar" holds the index.
    let (outcome, fx) = kv_at(&mut sm, 10, T0, vec![op::delete_tree("foo/bar")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(
        fx.kv_keys,
        strings(&["foo/bar", "foo/bar/baz", "foo/bar/zip"])
    );
    let (entries, index) = list(&sm, "foo");
    assert_eq!(entries, vec![entry("foo/zorp", "zorp", 6, 6)]);
    assert_eq!(index, 10);
    assert_eq!(sm.kv().table_index(), 10);
    assert_eq!(sm.kv().tombstone_count(), 1);

    // Reaping the tombstone lets the index revert to foo/zorp.
    apply_at(
        &mut sm,
        11,
        T0 + 1,
        Op::ReapTombstones { before_ms: T0 + 1 },
    );
    assert_eq!(list_index(&sm, "foo"), 6);

    // A locked key deleted by a tree delete is no longer held by its session.
    create_session(&mut sm, 12, session(S1, N1));
    write(&mut sm, 13, op::lock("foo/lock", "", S1));
    // Deleting everything: every key goes, no prefix tombstone is written (only the locked
    // key's, which keeps its LockIndex), the index moves.
    let (_, fx) = kv_at(&mut sm, 14, T0 + 1, vec![op::delete_tree("")]);
    assert_eq!(fx.kv_keys, strings(&["foo/lock", "foo/zorp"]));
    assert!(sm.kv().is_empty());
    assert_eq!(sm.kv().tombstone_count(), 1);
    assert_eq!(list_index(&sm, ""), 14);
    assert_eq!(sm.kv().held_by(S1).count(), 0);
    // ...so destroying the session later touches no key.
    assert!(destroy_at(&mut sm, 15, T0 + 1, S1).kv_keys.is_empty());
}

/// TestStateStore_KVSLock: missing or bogus session errors; lock creates with LockIndex 1;
/// re-lock by the holder updates the value without bumping LockIndex; unlock + re-lock bumps
/// it; locking an existing key bumps from its LockIndex; another session is refused.
#[test]
fn kv_lock() {
    let mut sm = world();

    // No session, then a bogus one.
    let (outcome, _) = kv(&mut sm, 3, vec![op::lock("foo", "foo", "")]);
    assert_eq!(failures(outcome), vec![(0, "missing session".into())]);
    let (outcome, _) = kv(&mut sm, 3, vec![op::lock("foo", "foo", S1)]);
    assert_eq!(
        failures(outcome),
        vec![(0, format!("invalid session \"{S1}\""))]
    );
    assert_eq!(sm.kv().table_index(), 0);

    // Lock creates the key: LockIndex 1, CreateIndex == ModifyIndex; the result has no value.
    create_session(&mut sm, 4, session(S1, N1));
    let (outcome, fx) = kv(&mut sm, 5, vec![op::lock("foo", "foo", S1)]);
    assert_eq!(
        committed(outcome),
        vec![locked(entry("foo", "", 5, 5), S1, 1)]
    );
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "foo", 5, 5), S1, 1))
    );
    assert_eq!(key_index(&sm, "foo"), 5);
    assert_eq!(sm.kv().held_by(S1).collect::<Vec<_>>(), vec!["foo"]);

    // Re-lock by the holder: value updated, LockIndex stays 1.
    write(&mut sm, 6, op::lock("foo", "bar", S1));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "bar", 5, 6), S1, 1))
    );

    // Re-lock with nothing changed is a no-op (no index move).
    let (_, fx) = kv(&mut sm, 7, vec![op::lock("foo", "bar", S1)]);
    assert!(fx.kv_keys.is_empty());
    assert_eq!(key_index(&sm, "foo"), 6);

    // Unlock and re-lock: LockIndex 2.
    write(&mut sm, 8, op::unlock("foo", "baz", S1));
    write(&mut sm, 9, op::lock("foo", "zoo", S1));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "zoo", 5, 9), S1, 2))
    );

    // Lock an existing unlocked key: LockIndex from 0 to 1, CreateIndex kept.
    write(&mut sm, 10, op::set("bar", "bar"));
    write(&mut sm, 11, op::lock("bar", "xxx", S1));
    assert_eq!(
        get(&sm, "bar"),
        Some(locked(entry("bar", "xxx", 10, 11), S1, 1))
    );

    // Another session is refused and nothing changes.
    create_session(&mut sm, 12, session(S2, N1));
    let before = sm.clone();
    let (outcome, fx) = kv(&mut sm, 13, vec![op::lock("bar", "nope", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"bar\", lock is already held".into())]
    );
    assert_eq!(fx, Effects::default());
    assert_eq!(sm, before);
    assert_eq!(key_index(&sm, "bar"), 11);
}

/// TestStateStore_KVSUnlock: no session errors; a missing or unlocked key and the wrong
/// session are refused with no index change; the holder unlocks (LockIndex kept, value and
/// flags replaced); a second unlock is refused.
#[test]
fn kv_unlock() {
    let not_held = "failed to unlock key \"foo\", lock isn't held, or is held by another session";
    let mut sm = world();

    // No session.
    let (outcome, _) = kv(&mut sm, 3, vec![op::unlock("foo", "bar", "")]);
    assert_eq!(failures(outcome), vec![(0, "missing session".into())]);

    // A real session but no key.
    create_session(&mut sm, 4, session(S1, N1));
    let (outcome, _) = kv(&mut sm, 5, vec![op::unlock("foo", "bar", S1)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);

    // An unlocked key.
    write(&mut sm, 6, op::set("foo", "bar"));
    let (outcome, _) = kv(&mut sm, 7, vec![op::unlock("foo", "baz", S1)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);
    assert_eq!(get(&sm, "foo"), Some(entry("foo", "bar", 6, 6)));

    // Locked by S1; S2 cannot unlock it.
    write(&mut sm, 8, op::lock("foo", "bar", S1));
    create_session(&mut sm, 9, session(S2, N1));
    let (outcome, _) = kv(&mut sm, 10, vec![op::unlock("foo", "zoo", S2)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "bar", 6, 8), S1, 1))
    );
    assert_eq!(key_index(&sm, "foo"), 8);

    // The holder unlocks: Session cleared, LockIndex kept, value and flags from the request.
    let release = KvOp::Unlock {
        key: "foo".into(),
        value: b"zoo".to_vec(),
        flags: 5,
        session: S1.into(),
    };
    let (outcome, fx) = kv(&mut sm, 11, vec![release]);
    let want = KvEntry {
        flags: 5,
        lock_index: 1,
        ..entry("foo", "zoo", 6, 11)
    };
    assert_eq!(
        committed(outcome),
        vec![KvEntry {
            value: Vec::new(),
            ..want.clone()
        }]
    );
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(get(&sm, "foo"), Some(want));
    assert_eq!(sm.kv().held_by(S1).count(), 0);

    // A bare release (no body) sets the value to empty and flags to 0.
    write(&mut sm, 12, op::lock("foo", "again", S1));
    write(&mut sm, 13, op::unlock("foo", "", S1));
    assert_eq!(
        get(&sm, "foo"),
        Some(KvEntry {
            lock_index: 2,
            ..entry("foo", "", 6, 13)
        })
    );

    // Unlocking again is refused and moves nothing.
    let (outcome, _) = kv(&mut sm, 14, vec![op::unlock("foo", "zoo", S1)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);
    assert_eq!(key_index(&sm, "foo"), 13);
}

/// SPEC.md difference 1 (and TestTxnEndpoint_KV_Actions with Vigil's twist): LockIndex never
/// decreases on a key: plain set, cas, unlock, invalidation and re-lock all keep or raise it.
#[test]
fn lock_index_never_decreases() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(
        &mut sm,
        4,
        Session {
            lock_delay_ns: 0,
            ..session(S2, N1)
        },
    );
    let lock_index = |sm: &StateMachine| get(sm, "k").map(|e| e.lock_index);

    // (what, command, LockIndex after, holder after)
    #[rustfmt::skip]
    let steps: Vec<(&str, Op, u64, Option<&str>)> = vec![
        ("lock",                            Op::Kv(vec![op::lock("k", "v", S1)]),     1, Some(S1)),
        ("plain set keeps it",              Op::Kv(vec![op::set("k", "w")]),          1, Some(S1)),
        ("cas keeps it",                    Op::Kv(vec![op::cas("k", "x", 6)]),       1, Some(S1)),
        ("unlock keeps it",                 Op::Kv(vec![op::unlock("k", "y", S1)]),   1, None),
        ("set on an unlocked key keeps it", Op::Kv(vec![op::set("k", "z")]),          1, None),
        ("re-lock raises it",               Op::Kv(vec![op::lock("k", "v", S2)]),     2, Some(S2)),
        ("invalidation keeps it",           Op::DestroySession { id: S2.into() },     2, None),
        ("next lock raises it",             Op::Kv(vec![op::lock("k", "v", S1)]),     3, Some(S1)),
    ];
    for (i, (name, command, want_index, want_holder)) in steps.into_iter().enumerate() {
        let (response, _) = apply(&mut sm, 5 + i as u64, command);
        assert!(
            !matches!(response, Response::Txn(TxnOutcome::RolledBack(_))),
            "{name}: {response:?}"
        );
        assert_eq!(lock_index(&sm), Some(want_index), "{name}");
        let holder = get(&sm, "k").and_then(|e| e.session);
        assert_eq!(holder.as_deref(), want_holder, "{name}");
    }
}

/// (what, key, lock index, session, expected verdict)
type SequencerCase<'a> = (&'a str, &'a str, u64, &'a str, Result<(), String>);

/// Vigil's sequencer: `(key, LockIndex, session)` is valid only while that session holds the
/// key at that LockIndex. Session IDs match case-insensitively.
#[test]
fn sequencer_checks() {
    // Setup: S1 locked "k" twice (LockIndex 2); "free" is unlocked; S2 exists.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("k", "", S1));
    write(&mut sm, 6, op::unlock("k", "", S1));
    write(&mut sm, 7, op::lock("k", "", S1));
    write(&mut sm, 8, op::set("free", ""));

    let upper = S1.to_ascii_uppercase();
    #[rustfmt::skip]
    let cases: [SequencerCase; 6] = [
        ("current holder and index", "k",    2, S1,     Ok(())),
        ("session in another case",  "k",    2, &upper, Ok(())),
        ("stale lock index",         "k",    1, S1,     Err("lock index 1 is not current (current is 2)".into())),
        ("another session",          "k",    2, S2,     Err("key \"k\" is held by another session".into())),
        ("unlocked key",             "free", 0, S1,     Err("key \"free\" is not locked".into())),
        ("missing key",              "gone", 1, S1,     Err("key \"gone\" does not exist".into())),
    ];
    for (name, key, lock_index, session, want) in cases {
        assert_eq!(sm.check_sequencer(key, lock_index, session), want, "{name}");
        let query = ReadQuery::Sequencer {
            key: key.into(),
            lock_index,
            session: session.into(),
        };
        assert_eq!(
            sm.query(&query),
            (QueryResult::Sequencer(want), key_index(&sm, key)),
            "{name}"
        );
    }

    // Once the session is destroyed the old token is no longer valid.
    destroy_at(&mut sm, 9, T0, S1);
    assert!(sm.check_sequencer("k", 2, S1).is_err());
}

// ---------------------------------------------------------------------------------------------
// Transactions (txn_test.go, txn_endpoint_test.go)
// ---------------------------------------------------------------------------------------------

/// TestStateStore_Txn_KVS: one transaction hitting every verb. Later ops see earlier ones;
/// write results carry no value, read results do; deletes and check-not-exists give none.
#[test]
fn txn_every_verb_result_shape() {
    // Setup: five keys and a session.
    let mut sm = world();
    write(&mut sm, 3, op::set("foo/delete", "bar"));
    write(&mut sm, 4, op::set("foo/bar/baz", "baz"));
    write(&mut sm, 5, op::set("foo/bar/zip", "zip"));
    write(&mut sm, 6, op::set("foo/zorp", "zorp"));
    write(&mut sm, 7, op::set("foo/update", "stale"));
    create_session(&mut sm, 8, session(S1, N1));

    // (op, the results it produces)
    let none = Vec::new;
    #[rustfmt::skip]
    let steps: Vec<(KvOp, Vec<KvEntry>)> = vec![
        (op::get_tree("foo/bar"),                 vec![entry("foo/bar/baz", "baz", 4, 4), entry("foo/bar/zip", "zip", 5, 5)]),
        (op::get_or_empty("foo/update"),          vec![entry("foo/update", "stale", 7, 7)]),
        (op::get_or_empty("foo/nope"),            vec![entry("foo/nope", "", 0, 0)]),
        (op::get("foo/update"),                   vec![entry("foo/update", "stale", 7, 7)]),
        (op::check_index("foo/update", 7),        vec![entry("foo/update", "", 7, 7)]),
        (op::cas("foo/update", "new", 7),         vec![entry("foo/update", "", 7, 9)]),
        (op::get("foo/update"),                   vec![entry("foo/update", "new", 7, 9)]),
        (op::check_index("foo/update", 9),        vec![entry("foo/update", "", 7, 9)]),
        (op::set("foo/set", "set"),               vec![entry("foo/set", "", 9, 9)]),
        (op::lock("foo/lock", "locked", S1),      vec![locked(entry("foo/lock", "", 9, 9), S1, 1)]),
        (op::check_session("foo/lock", S1),       vec![locked(entry("foo/lock", "", 9, 9), S1, 1)]),
        (op::unlock("foo/lock", "unlocked", S1),  vec![KvEntry { lock_index: 1, ..entry("foo/lock", "", 9, 9) }]),
        (op::check_session("foo/lock", ""),       vec![KvEntry { lock_index: 1, ..entry("foo/lock", "", 9, 9) }]),
        (op::check_not_exists("foo/nope"),        none()),
        (op::delete("foo/delete"),                none()),
        (op::delete_cas("foo/zorp", 6),           none()),
        (op::delete_tree("foo/bar"),              none()),
        (op::get_tree("foo/"),                    vec![
            KvEntry { lock_index: 1, ..entry("foo/lock", "unlocked", 9, 9) },
            entry("foo/set", "set", 9, 9),
            entry("foo/update", "new", 7, 9),
        ]),
    ];
    let (ops, want): (Vec<KvOp>, Vec<Vec<KvEntry>>) = steps.into_iter().unzip();

    // Apply at index 9: results come back flattened, in op order.
    let (outcome, fx) = kv(&mut sm, 9, ops);
    assert_eq!(committed(outcome), want.concat());

    // Effects and the committed table.
    assert_eq!(
        fx.kv_keys,
        strings(&[
            "foo/bar/baz",
            "foo/bar/zip",
            "foo/delete",
            "foo/lock",
            "foo/set",
            "foo/update",
            "foo/zorp"
        ])
    );
    assert_eq!(sm.kv().table_index(), 9);
    assert_eq!(
        sm.kv().tombstone_count(),
        3,
        "foo/delete, foo/zorp and the foo/bar prefix"
    );
    assert_eq!(list(&sm, "").0, want[want.len() - 1]);
    assert_eq!(
        sm.kv().held_by(S1).count(),
        0,
        "locked and unlocked in the same txn"
    );
}

/// TestStateStore_Txn_KVS_Rollback: every failing op is reported, in order, with Consul's
/// text; the ops that would have succeeded are not applied either.
#[test]
fn txn_rollback_reports_every_error_in_order() {
    // Setup: S1 holds foo/lock; S2 is another live session.
    let mut sm = world();
    write(&mut sm, 3, op::set("foo/delete", "bar"));
    write(&mut sm, 4, op::set("foo/update", "stale"));
    create_session(&mut sm, 5, session(S1, N1));
    create_session(&mut sm, 6, session(S2, N1));
    write(&mut sm, 7, op::lock("foo/lock", "", S1));
    let session_mismatch =
        format!("failed session check for key \"foo/lock\", current session \"{S1}\" != \"{S2}\"");

    // (op, None if it would succeed, else its `What`)
    #[rustfmt::skip]
    let steps: Vec<(KvOp, Option<&str>)> = vec![
        (op::cas("foo/update", "new", 1),       Some("failed to set key \"foo/update\", index is stale")),
        (op::set("foo/new", "fine"),            None),
        (op::lock("foo/lock", "", S2),          Some("failed to lock key \"foo/lock\", lock is already held")),
        (op::unlock("foo/lock", "", S2),        Some("failed to unlock key \"foo/lock\", lock isn't held, or is held by another session")),
        (op::check_session("foo/lock", S2),     Some(&session_mismatch)),
        (op::get("nope"),                       Some("key \"nope\" doesn't exist")),
        (op::check_session("nope", S2),         Some("failed to check session, key \"nope\" doesn't exist")),
        (op::check_index("foo/lock", 6),        Some("failed index check for key \"foo/lock\", current modify index 7 != 6")),
        (op::check_index("nope", 6),            Some("failed to check index, key \"nope\" doesn't exist")),
        (op::delete("foo/delete"),              None),
        (op::delete_cas("foo/update", 1),       Some("failed to delete key \"foo/update\", index is stale")),
        (op::check_not_exists("foo/update"),    Some("key \"foo/update\" exists")),
        (op::lock("foo/x", "", ""),             Some("missing session")),
        (op::lock("foo/x", "", "bogus"),        Some("invalid session \"bogus\"")),
        (op::set("", "no key"),                 Some("Must provide key")),
        (op::get_or_empty("nope"),              None),
    ];
    let want: Vec<(usize, String)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, (_, what))| what.map(|w| (i, w.to_owned())))
        .collect();
    let ops = steps.into_iter().map(|(op, _)| op).collect();

    let before = sm.clone();
    let (outcome, fx) = kv(&mut sm, 8, ops);
    assert_eq!(failures(outcome), want);
    assert_eq!(fx, Effects::default());
    assert_eq!(sm, before, "nothing applied");
}

/// TestTxn_CheckNotExists: check-not-exists then set succeeds once; the second run fails with
/// exactly `op 0: key "test" exists`.
#[test]
fn txn_check_not_exists_then_set() {
    let mut sm = StateMachine::default();
    let txn = || vec![op::check_not_exists("test"), op::set("test", "hello")];

    let (outcome, _) = kv(&mut sm, 1, txn());
    assert_eq!(committed(outcome), vec![entry("test", "", 1, 1)]);

    let (outcome, _) = kv(&mut sm, 2, txn());
    let TxnOutcome::RolledBack(errors) = outcome else {
        panic!("the second run must fail");
    };
    let text: Vec<String> = errors
        .iter()
        .map(|e| format!("op {}: {}", e.op_index, e.error))
        .collect();
    assert_eq!(text, ["op 0: key \"test\" exists"]);
}

/// TestStateStore_Txn_KVS_ModifyIndexes: an unchanged set keeps its ModifyIndex, a changed one
/// gets the transaction's index; only the changed key is touched.
#[test]
fn txn_unchanged_set_keeps_modify_index() {
    let mut sm = StateMachine::default();
    write(&mut sm, 1, op::set("foo/a", "1"));
    write(&mut sm, 2, op::set("foo/b", "2"));

    let (outcome, fx) = kv(
        &mut sm,
        3,
        vec![op::set("foo/a", "new"), op::set("foo/b", "2")],
    );
    assert_eq!(
        committed(outcome),
        vec![entry("foo/a", "", 1, 3), entry("foo/b", "", 2, 2)]
    );
    assert_eq!(fx.kv_keys, strings(&["foo/a"]));
    let (entries, index) = list(&sm, "");
    assert_eq!(
        entries,
        vec![entry("foo/a", "new", 1, 3), entry("foo/b", "2", 2, 2)]
    );
    assert_eq!(index, 3);
}

/// TestStateStore_Txn_KVS_RO / _RO_Safety and TestTxnEndpoint_KV_Actions' read path: a
/// read-only transaction answers from the current table at the KV table index, and never
/// changes state, even if handed a write verb.
#[test]
fn txn_read_only_query() {
    // Setup: S1 holds "lock"; "plain" is unlocked.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("lock", "held", S1));
    write(&mut sm, 5, op::set("plain", "p"));

    // Reads succeed, with values on get/get-tree and none on the checks.
    let reads = vec![
        op::get("lock"),
        op::get_tree(""),
        op::check_index("plain", 5),
        op::check_session("lock", S1),
        op::check_session("plain", ""),
        op::check_not_exists("nope"),
        op::get_or_empty("nope"),
    ];
    let held = locked(entry("lock", "held", 4, 4), S1, 1);
    let want = vec![
        held.clone(),
        held.clone(),
        entry("plain", "p", 5, 5),
        entry("plain", "", 5, 5),
        locked(entry("lock", "", 4, 4), S1, 1),
        entry("plain", "", 5, 5),
        entry("nope", "", 0, 0),
    ];
    let (result, index) = sm.query(&ReadQuery::Txn { ops: reads });
    assert_eq!(result, QueryResult::Txn(TxnOutcome::Committed(want)));
    assert_eq!(index, 5);

    // A failing read reports its error.
    let (result, _) = sm.query(&ReadQuery::Txn {
        ops: vec![op::get("nope"), op::check_index("plain", 1)],
    });
    let QueryResult::Txn(outcome) = result else {
        panic!("a read txn answers with a txn outcome");
    };
    assert_eq!(
        failures(outcome),
        vec![
            (0, "key \"nope\" doesn't exist".into()),
            (
                1,
                "failed index check for key \"plain\", current modify index 5 != 1".into()
            ),
        ]
    );

    // Safety: write verbs handed to the read path are refused, each reported, and change nothing.
    let before = sm.clone();
    let writes = vec![
        op::get("plain"),
        op::set("x", "y"),
        op::delete("plain"),
        op::delete_tree(""),
        op::unlock("lock", "", S1),
    ];
    let (result, _) = sm.query(&ReadQuery::Txn { ops: writes });
    let QueryResult::Txn(outcome) = result else {
        panic!("expected a txn result, got {result:?}");
    };
    let refused: Vec<usize> = failures(outcome).into_iter().map(|(i, _)| i).collect();
    assert_eq!(refused, vec![1, 2, 3, 4]);
    assert_eq!(sm, before);
}

// ---------------------------------------------------------------------------------------------
// Tombstone reaping, snapshots, catalog, session ID case
// ---------------------------------------------------------------------------------------------

/// TestStateStore_ReapTombstones: tombstones hold the prefix index until reaped; reaping is by
/// the leader-clock time they were written (strictly before `before_ms`), and touches neither
/// entries nor the table index.
#[test]
fn reap_tombstones() {
    // Setup: five keys; delete two of them at T0 + 6 s and T0 + 7 s.
    let mut sm = StateMachine::default();
    for (i, key) in ["foo", "foo/bar", "foo/baz", "foo/moo", "foo/zoo"]
        .iter()
        .enumerate()
    {
        write(&mut sm, 1 + i as u64, op::set(key, "v"));
    }
    kv_at(&mut sm, 6, T0 + 6_000, vec![op::delete("foo/baz")]);
    kv_at(&mut sm, 7, T0 + 7_000, vec![op::delete("foo/moo")]);
    assert_eq!(list_index(&sm, "foo/"), 7);
    assert_eq!(sm.kv().oldest_tombstone_ms(), Some(T0 + 6_000));

    // A reap bound equal to a tombstone's time keeps it.
    let reap = |before_ms| Op::ReapTombstones { before_ms };
    let (response, fx) = apply_at(&mut sm, 8, T0 + 8_000, reap(T0 + 6_000));
    assert_eq!((response, fx), (Response::Done, Effects::default()));
    assert_eq!(sm.kv().tombstone_count(), 2);

    // Reap the first: the index still comes from the second.
    apply_at(&mut sm, 9, T0 + 8_000, reap(T0 + 6_001));
    assert_eq!(sm.kv().tombstone_count(), 1);
    assert_eq!(sm.kv().oldest_tombstone_ms(), Some(T0 + 7_000));
    assert_eq!(list_index(&sm, "foo/"), 7);

    // Reap all: the prefix index slides back to the highest live entry.
    apply_at(&mut sm, 10, T0 + 8_000, reap(T0 + 8_000));
    assert_eq!(sm.kv().tombstone_count(), 0);
    assert_eq!(sm.kv().oldest_tombstone_ms(), None);
    assert_eq!(list_index(&sm, "foo/"), 5);
    assert_eq!(sm.kv().table_index(), 7);
    assert_eq!(sm.kv().len(), 3);
}

/// TestStateStore_{Session,KVS,Tombstone}_Snapshot_Restore: the whole state machine survives a
/// postcard round trip, and the restored copy behaves identically afterwards: check mappings,
/// held keys, tombstones and lock-delays (SPEC.md difference 4) all come back.
#[test]
fn snapshot_round_trip() {
    // Setup: two nodes with checks; sessions of both behaviours; locked keys, a tombstone, a
    // pending lock-delay.
    let mut sm = world();
    register_check(&mut sm, 3, check(N1, "web", HealthStatus::Passing));
    register_node(&mut sm, 4, N2);
    register_check(&mut sm, 5, check(N2, SERF_HEALTH, HealthStatus::Warning));
    let s1 = Session {
        node_checks: strings(&[SERF_HEALTH, "web"]),
        ..session(S1, N1)
    };
    create_session(&mut sm, 6, s1);
    let s2 = Session {
        behavior: Behavior::Delete,
        ttl: "15s".into(),
        ..session(S2, N2)
    };
    create_session(&mut sm, 7, s2);
    create_session(&mut sm, 8, session(S3, N1));
    create_session(&mut sm, 9, session(S4, N1));
    write(&mut sm, 10, op::lock("leader", "s1", S1));
    write(&mut sm, 11, op::lock(&format!("sema/{S2}"), "s2", S2));
    write(&mut sm, 12, op::lock("delayed", "s4", S4));
    write(&mut sm, 13, op::set("gone", ""));
    kv(&mut sm, 14, vec![op::delete("gone")]);
    destroy_at(&mut sm, 15, T0, S4);

    // Round trip through postcard: equal in every field.
    let bytes = postcard::to_allocvec(&sm).expect("encode");
    let mut restored: StateMachine = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(restored, sm);
    assert_eq!(restored.now_ms(), T0);
    assert_eq!(restored.sessions().on_check(N1, "web"), strings(&[S1]));
    assert_eq!(restored.kv().tombstone_count(), 1);
    assert_eq!(list_index(&restored, "gone"), 14);
    assert_eq!(
        restored.kv().lock_delay_remaining("delayed", T0),
        Some(15_000)
    );

    // The same script applied to both gives the same answers and the same state.
    let sema = format!("sema/{S2}");
    let script: Vec<(u64, Op)> = vec![
        (T0 + 1, Op::Kv(vec![op::lock("delayed", "s3", S3)])),
        (
            T0 + 2,
            Op::RegisterCheck(check(N1, "web", HealthStatus::Critical)),
        ),
        (T0 + 3, Op::DeregisterNode { name: N2.into() }),
        (T0 + 15_000, Op::Kv(vec![op::lock("delayed", "s3", S3)])),
    ];
    for (i, (now, command)) in script.into_iter().enumerate() {
        let index = 16 + i as u64;
        let a = apply_at(&mut sm, index, now, command.clone());
        let b = apply_at(&mut restored, index, now, command);
        assert_eq!(a, b, "step {i}");
        assert_eq!(restored, sm, "step {i}");
    }

    // And what the script did is what the restored indexes promise: the lock-delay refused
    // S3 at first, web → critical released S1's key, node2's removal deleted S2's key.
    assert_eq!(
        restored.kv().get("leader").and_then(|e| e.session.clone()),
        None
    );
    assert_eq!(restored.kv().get(&sema), None);
    assert_eq!(get(&restored, "delayed").map(|e| e.lock_index), Some(2));
    let (result, _) = restored.query(&ReadQuery::SessionList {});
    assert_eq!(session_ids(result), strings(&[S3]));
}

/// The catalog side of apply: registrations report catalog changes only when something
/// changed; a check needs its node.
#[test]
fn catalog_registration_effects() {
    let mut sm = StateMachine::default();
    let node = |address: &str| Op::RegisterNode {
        name: N1.into(),
        address: address.into(),
    };

    // A check for an unknown node is refused.
    let reg = Op::RegisterCheck(check(N1, SERF_HEALTH, HealthStatus::Passing));
    let (response, fx) = apply(&mut sm, 1, reg.clone());
    assert_eq!(
        (response, fx),
        (
            Response::Rejected(ApplyError::MissingNode),
            Effects::default()
        )
    );

    // New node: changed; identical re-registration: not; new address: changed.
    let (_, fx) = apply(&mut sm, 2, node("10.0.0.1"));
    assert!(fx.catalog_changed);
    let (_, fx) = apply(&mut sm, 3, node("10.0.0.1"));
    assert!(!fx.catalog_changed);
    assert_eq!(sm.catalog().table_index(), 2);
    let (_, fx) = apply(&mut sm, 4, node("10.0.0.2"));
    assert!(fx.catalog_changed);
    let n = sm.catalog().node(N1).expect("registered").clone();
    assert_eq!(
        (n.address.as_str(), n.create_index, n.modify_index),
        ("10.0.0.2", 2, 4)
    );

    // Check: new is a change; identical is not; a status change is (CreateIndex kept).
    assert!(apply(&mut sm, 5, reg.clone()).1.catalog_changed);
    assert!(!apply(&mut sm, 6, reg).1.catalog_changed);
    let warn = Op::RegisterCheck(check(N1, SERF_HEALTH, HealthStatus::Warning));
    assert!(apply(&mut sm, 7, warn).1.catalog_changed);
    let c = sm.catalog().check(N1, SERF_HEALTH).expect("registered");
    assert_eq!(
        (c.status, c.create_index, c.modify_index),
        (HealthStatus::Warning, 5, 7)
    );
    let (checks, index) = sm.query(&ReadQuery::NodeChecks { node: N1.into() });
    assert_eq!((checks, index), (QueryResult::Checks(vec![c.clone()]), 7));

    // Deregistering an unknown check changes nothing.
    let (_, fx) = apply(
        &mut sm,
        8,
        Op::DeregisterCheck {
            node: N1.into(),
            check_id: "nope".into(),
        },
    );
    assert_eq!(fx, Effects::default());
}

/// §1.1: session IDs are looked up case-insensitively everywhere: info, lock, re-lock,
/// unlock, destroy.
#[test]
fn session_ids_are_case_insensitive() {
    let upper = S1.to_ascii_uppercase();
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));

    // Info by the upper-case ID finds the session.
    let (result, _) = sm.query(&ReadQuery::SessionInfo { id: upper.clone() });
    assert_eq!(session_ids(result), strings(&[S1]));

    // Lock with the upper-case ID: the key records the session's stored ID.
    write(&mut sm, 4, op::lock("k", "v", &upper));
    assert_eq!(get(&sm, "k"), Some(locked(entry("k", "v", 4, 4), S1, 1)));

    // Re-lock in the other case is the same holder: LockIndex stays 1.
    write(&mut sm, 5, op::lock("k", "w", S1));
    write(&mut sm, 6, op::lock("k", "x", &upper));
    assert_eq!(get(&sm, "k"), Some(locked(entry("k", "x", 4, 6), S1, 1)));

    // Unlock and destroy by the upper-case ID work too.
    write(&mut sm, 7, op::unlock("k", "", &upper));
    write(&mut sm, 8, op::lock("k", "", S1));
    let fx = destroy_at(&mut sm, 9, T0, &upper);
    assert_eq!(fx.sessions_destroyed, strings(&[S1]));
    assert_eq!(fx.kv_keys, strings(&["k"]));
    assert!(sm.sessions().is_empty());
    assert_eq!(get(&sm, "k").and_then(|e| e.session), None);
}

// ---------------------------------------------------------------------------------------------
// Services, per-service health indexes and prepared queries
// ---------------------------------------------------------------------------------------------

fn web(node: &str, id: &str, tags: &[&str]) -> Service {
    Service {
        node: node.to_owned(),
        id: id.to_owned(),
        name: "web".to_owned(),
        tags: strings(tags),
        ..Service::default()
    }
}

fn registration(node: &str, service: Option<Service>, checks: Vec<CheckRegistration>) -> Op {
    Op::CatalogRegister(Registration {
        node: node.to_owned(),
        address: "10.0.0.1".to_owned(),
        service,
        checks,
        ..Registration::default()
    })
}

fn service_check(node: &str, id: &str, service: &str, status: HealthStatus) -> CheckRegistration {
    CheckRegistration {
        service_id: service.to_owned(),
        ..check(node, id, status)
    }
}

fn health(sm: &StateMachine, service: &str) -> (Vec<ServiceHealth>, u64) {
    match sm.query(&ReadQuery::HealthService {
        name: service.to_owned(),
    }) {
        (QueryResult::Health(h), index) => (h, index),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn catalog_register_adds_node_service_and_checks_at_once() {
    let mut sm = StateMachine::default();
    let op = registration(
        N1,
        Some(web(N1, "web1", &["v1"])),
        vec![
            check(N1, "disk", HealthStatus::Passing),
            service_check(N1, "http", "web1", HealthStatus::Warning),
        ],
    );
    let (response, fx) = apply(&mut sm, 5, op);
    assert_eq!(response, Response::Done);
    assert!(fx.catalog_changed);
    assert_eq!(fx.services_changed, strings(&["web"]));

    let (h, index) = health(&sm, "web");
    assert_eq!(index, 5);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].node.address, "10.0.0.1");
    // Node checks first, then the instance's, with its service name and tags filled in.
    let ids: Vec<&str> = h[0].checks.iter().map(|c| c.check_id.as_str()).collect();
    assert_eq!(ids, ["disk", "http"]);
    assert_eq!(h[0].checks[1].service_name, "web");
    assert_eq!(h[0].checks[1].service_tags, strings(&["v1"]));
    assert!(!h[0].passing());

    // The same registration again changes nothing and wakes nobody.
    let op = registration(
        N1,
        Some(web(N1, "web1", &["v1"])),
        vec![
            check(N1, "disk", HealthStatus::Passing),
            service_check(N1, "http", "web1", HealthStatus::Warning),
        ],
    );
    let (_, fx) = apply(&mut sm, 6, op);
    assert_eq!(fx, Effects::default());
    assert_eq!(health(&sm, "web").1, 5);
}

#[test]
fn catalog_register_refusals_change_nothing() {
    let mut sm = StateMachine::default();
    let orphan = registration(
        N1,
        None,
        vec![service_check(N1, "http", "nope", HealthStatus::Passing)],
    );
    assert_eq!(
        apply(&mut sm, 5, orphan).0,
        Response::Rejected(ApplyError::UnknownServiceForCheck {
            service_id: "nope".into(),
            check_id: "http".into()
        })
    );
    let skip = Op::CatalogRegister(Registration {
        node: N1.into(),
        skip_node_update: true,
        ..Registration::default()
    });
    assert_eq!(
        apply(&mut sm, 6, skip).0,
        Response::Rejected(ApplyError::MissingNode)
    );
    assert!(sm.catalog().node(N1).is_none());
}

#[test]
fn a_service_watcher_wakes_only_for_its_service() {
    let mut sm = StateMachine::default();
    apply(
        &mut sm,
        5,
        registration(N1, Some(web(N1, "web1", &[])), vec![]),
    );
    let db = Service {
        name: "db".into(),
        ..web(N2, "db1", &[])
    };
    apply(&mut sm, 6, registration(N2, Some(db), vec![]));

    // A check of a db instance touches db only.
    let (_, fx) = apply(
        &mut sm,
        7,
        Op::RegisterCheck(service_check(N2, "db-ping", "db1", HealthStatus::Passing)),
    );
    assert_eq!(fx.services_changed, strings(&["db"]));
    assert_eq!(health(&sm, "web").1, 5);
    assert_eq!(health(&sm, "db").1, 7);

    // A node-level check touches every service on that node.
    let (_, fx) = apply(
        &mut sm,
        8,
        Op::RegisterCheck(check(N1, "disk", HealthStatus::Passing)),
    );
    assert_eq!(fx.services_changed, strings(&["web"]));
    assert_eq!(health(&sm, "web").1, 8);

    // A KV write touches no service.
    let (_, fx) = apply(&mut sm, 9, Op::Kv(vec![op::set("k", "v")]));
    assert!(fx.services_changed.is_empty() && !fx.catalog_changed);

    // Removing the last instance still moves the service's index, so a watcher sees it go.
    let (_, fx) = apply(
        &mut sm,
        10,
        Op::DeregisterService {
            node: N1.into(),
            service_id: "web1".into(),
        },
    );
    assert_eq!(fx.services_changed, strings(&["web"]));
    assert_eq!(health(&sm, "web"), (Vec::new(), 10));
}

#[test]
fn deregistering_a_service_invalidates_sessions_on_its_checks() {
    let mut sm = StateMachine::default();
    let op = registration(
        N1,
        Some(web(N1, "web1", &[])),
        vec![service_check(N1, "http", "web1", HealthStatus::Passing)],
    );
    apply(&mut sm, 5, op);
    let s = Session {
        node_checks: Vec::new(),
        checks: strings(&["http"]),
        lock_delay_ns: 0,
        ..session(S1, N1)
    };
    create_session(&mut sm, 6, s);
    kv(&mut sm, 7, vec![op::lock("leader", "me", S1)]);

    let (_, fx) = apply(
        &mut sm,
        8,
        Op::DeregisterService {
            node: N1.into(),
            service_id: "web1".into(),
        },
    );
    assert_eq!(fx.sessions_destroyed, strings(&[S1]));
    assert_eq!(sm.kv().get("leader").unwrap().session, None);
    assert!(sm.catalog().check(N1, "http").is_none());
}

fn query(id: &str, name: &str, session: &str) -> PreparedQuery {
    PreparedQuery {
        id: id.to_owned(),
        name: name.to_owned(),
        session: session.to_owned(),
        service: ServiceQuery {
            service: "web".to_owned(),
            ..ServiceQuery::default()
        },
        ..PreparedQuery::default()
    }
}

fn set_query(q: PreparedQuery, update: bool) -> Op {
    Op::SetQuery { query: q, update }
}

#[test]
fn a_prepared_query_goes_with_its_session() {
    let mut sm = StateMachine::default();
    register_node(&mut sm, 1, N1);
    register_check(&mut sm, 2, check(N1, SERF_HEALTH, HealthStatus::Passing));
    create_session(&mut sm, 3, session(S1, N1));

    assert_eq!(
        apply(&mut sm, 4, set_query(query("q1", "", S2), false)).0,
        Response::Rejected(ApplyError::InvalidQuerySession(S2.into()))
    );
    let (response, fx) = apply(&mut sm, 5, set_query(query("q1", "", S1), false));
    assert_eq!(response, Response::Done);
    assert!(fx.queries_changed);
    apply(&mut sm, 6, set_query(query("q2", "named", ""), false));
    assert_eq!(
        apply(&mut sm, 7, set_query(query("q3", "named", ""), false)).0,
        Response::Rejected(ApplyError::DuplicateQueryName("named".into()))
    );
    assert_eq!(
        apply(&mut sm, 8, set_query(query("q9", "x", ""), true)).0,
        Response::Rejected(ApplyError::MissingQuery("q9".into()))
    );
    assert_eq!(
        sm.queries().lookup("named").map(|q| q.id.as_str()),
        Some("q2")
    );

    // The session's node fails: the session goes, and its query with it in the same apply.
    let (_, fx) = register_critical(&mut sm, 9, N1);
    assert!(fx.queries_changed);
    assert!(sm.queries().lookup("q1").is_none());
    assert!(sm.queries().lookup("q2").is_some());
    assert_eq!(sm.queries().table_index(), 9);
}

fn register_critical(sm: &mut StateMachine, index: u64, node: &str) -> (Response, Effects) {
    apply(
        sm,
        index,
        Op::RegisterCheck(check(node, SERF_HEALTH, HealthStatus::Critical)),
    )
}

#[test]
fn executing_a_query_keeps_healthy_tagged_instances() {
    let mut sm = StateMachine::default();
    let instances = [
        (N1, "a", &["prod"][..], HealthStatus::Passing),
        (N2, "b", &["prod", "canary"][..], HealthStatus::Passing),
        ("node3", "c", &["prod"][..], HealthStatus::Warning),
        ("node4", "d", &["prod"][..], HealthStatus::Critical),
    ];
    for (i, (node, id, tags, status)) in instances.iter().enumerate() {
        let op = registration(
            node,
            Some(web(node, id, tags)),
            vec![service_check(node, "http", id, *status)],
        );
        apply(&mut sm, 10 + i as u64, op);
    }
    let run = |sm: &StateMachine, q: PreparedQuery| -> Vec<String> {
        let mut ids: Vec<String> = super::query::execute(&q, sm.catalog())
            .into_iter()
            .map(|h| h.service.id)
            .collect();
        ids.sort();
        ids
    };
    let mut q = query("q", "web", "");
    assert_eq!(run(&sm, q.clone()), strings(&["a", "b", "c"]));
    q.service.only_passing = true;
    assert_eq!(run(&sm, q.clone()), strings(&["a", "b"]));
    q.service.tags = strings(&["PROD", "!canary"]);
    assert_eq!(run(&sm, q), strings(&["a"]));
}

// ---------------------------------------------------------------------------------------------
// LockIndex across tree deletes and tombstone reaping (SPEC.md difference 1)
// ---------------------------------------------------------------------------------------------

/// The issue's sequence: three acquire/release rounds, a plain delete, an acquire (4), then a
/// tree delete of the prefix and an acquire: 5, not 1, and the old sequencer stays invalid.
#[test]
fn lock_index_survives_a_tree_delete() {
    // Three rounds, a plain delete, a fourth acquire.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    let mut index = 4;
    let mut next = || {
        index += 1;
        index
    };
    for _ in 0..3 {
        write(&mut sm, next(), op::lock("app/lock", "", S1));
        write(&mut sm, next(), op::unlock("app/lock", "", S1));
    }
    write(&mut sm, next(), op::delete("app/lock"));
    write(&mut sm, next(), op::lock("app/lock", "", S1));
    assert_eq!(get(&sm, "app/lock").map(|e| e.lock_index), Some(4));
    write(&mut sm, next(), op::unlock("app/lock", "", S1));

    // A tree delete of the prefix, then an acquire: the count goes on.
    write(&mut sm, next(), op::delete_tree("app/"));
    assert_eq!(get(&sm, "app/lock"), None);
    write(&mut sm, next(), op::lock("app/lock", "", S1));
    assert_eq!(get(&sm, "app/lock").map(|e| e.lock_index), Some(5));
    for old in 1..=4 {
        assert!(sm.check_sequencer("app/lock", old, S1).is_err(), "{old}");
    }
    assert_eq!(sm.check_sequencer("app/lock", 5, S1), Ok(()));

    // The same inside one transaction: a tree delete, then an acquire by another session.
    create_session(&mut sm, next(), session(S2, N1));
    let (outcome, _) = kv(
        &mut sm,
        next(),
        vec![op::delete_tree("app"), op::lock("app/lock", "", S2)],
    );
    committed(outcome);
    assert_eq!(get(&sm, "app/lock").map(|e| e.lock_index), Some(6));
}

/// A prefix tombstone written over a key's own tombstone keeps the key's LockIndex: `k` is
/// deleted at LockIndex 2, `k/x` is created and the tree `k` deleted (tombstone for prefix `k`).
#[test]
fn a_prefix_tombstone_never_lowers_a_key_tombstone() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("k", "", S1));
    write(&mut sm, 5, op::unlock("k", "", S1));
    write(&mut sm, 6, op::lock("k", "", S1));
    write(&mut sm, 7, op::delete("k"));
    write(&mut sm, 8, op::set("k/x", "x"));
    write(&mut sm, 9, op::delete_tree("k"));
    write(&mut sm, 10, op::lock("k", "", S1));
    assert_eq!(get(&sm, "k").map(|e| e.lock_index), Some(3));
}

/// No LockIndex ever goes back, whatever mix of single deletes, tree deletes (of the key's own
/// prefix, a parent prefix, everything), delete-behaviour invalidations and tombstone reaps
/// comes between acquisitions. Every script is run on a few keys at once; after every step each
/// key's next acquire must grant more than anything that key was granted before.
#[test]
fn no_lock_index_goes_back_after_any_deletes_and_reaps() {
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Acquire,
        Release,
        Delete,
        DeleteTreeOwn,
        DeleteTreeParent,
        DeleteTreeAll,
        DestroyDeleteSession,
        Reap,
    }
    use Step::*;
    const ALL: [Step; 8] = [
        Acquire,
        Release,
        Delete,
        DeleteTreeOwn,
        DeleteTreeParent,
        DeleteTreeAll,
        DestroyDeleteSession,
        Reap,
    ];
    let keys = ["a/lock", "a/lock/sub", "b/other"];
    // Every sequence of four steps (8^4 = 4096 scripts), each followed by a final acquire.
    for script in 0..ALL.len().pow(4) {
        let steps: Vec<Step> = (0..4)
            .map(|i| ALL[(script / ALL.len().pow(i)) % ALL.len()])
            .collect();
        let mut sm = world();
        let mut index = 3;
        let mut now = T0;
        // Each key's LockIndex when last seen, and whether it was held then.
        let mut last = std::collections::HashMap::<&str, (u64, bool)>::new();
        // The delete-behaviour session, re-created after each destroy; lock-delay 0 so acquires
        // after an invalidation are not refused.
        let mut generation = 0u32;
        let session_id = |g: u32| format!("5b0a4bc6-5a5b-4c7a-9a1e-{g:012x}");
        let new_session = |sm: &mut StateMachine, index: u64, g: u32| {
            let s = Session {
                behavior: Behavior::Delete,
                lock_delay_ns: 0,
                ..session(&session_id(g), N1)
            };
            create_session(sm, index, s);
        };
        new_session(&mut sm, index, generation);
        for step in steps.iter().copied().chain([Acquire]) {
            index += 1;
            now += 1_000;
            let sid = session_id(generation);
            let ops: Vec<KvOp> = match step {
                Acquire => keys.iter().map(|k| op::lock(k, "", &sid)).collect(),
                Release => keys.iter().map(|k| op::unlock(k, "", &sid)).collect(),
                Delete => keys.iter().map(|k| op::delete(k)).collect(),
                DeleteTreeOwn => keys.iter().map(|k| op::delete_tree(k)).collect(),
                DeleteTreeParent => vec![op::delete_tree("a/"), op::delete_tree("b")],
                DeleteTreeAll => vec![op::delete_tree("")],
                DestroyDeleteSession => {
                    destroy_at(&mut sm, index, now, &sid);
                    generation += 1;
                    index += 1;
                    new_session(&mut sm, index, generation);
                    Vec::new()
                }
                Reap => {
                    apply_at(&mut sm, index, now, Op::ReapTombstones { before_ms: now });
                    Vec::new()
                }
            };
            // One op at a time: a release of an unheld key fails without stopping the others.
            for op in ops {
                index += 1;
                kv_at(&mut sm, index, now, vec![op]);
            }
            for key in keys {
                let Some(e) = get(&sm, key) else {
                    last.entry(key).and_modify(|(_, held)| *held = false);
                    continue;
                };
                let (before, was_held) = last.get(key).copied().unwrap_or((0, false));
                let held = e.session.is_some();
                if held && !was_held {
                    assert!(
                        e.lock_index > before,
                        "{steps:?}: {key} granted {} again (had {before})",
                        e.lock_index
                    );
                }
                assert!(
                    e.lock_index >= before,
                    "{steps:?}: {key} went back from {before} to {}",
                    e.lock_index
                );
                last.insert(key, (e.lock_index, held));
            }
        }
        for key in keys {
            let held = get(&sm, key).expect("the final acquire creates every key");
            assert!(held.session.is_some(), "{steps:?}: {key} not held");
        }
    }
}

/// Reaping raises the floor to the highest LockIndex a reaped tombstone held, and the floor
/// survives a snapshot (the state machine's postcard round trip).
#[test]
fn reaping_sets_the_lock_index_floor() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    for (i, key) in ["x", "y"].iter().enumerate() {
        let base = 4 + 10 * i as u64;
        for round in 0..=(i as u64 * 2) {
            write(&mut sm, base + 2 * round, op::lock(key, "", S1));
            write(&mut sm, base + 2 * round + 1, op::unlock(key, "", S1));
        }
    }
    assert_eq!(get(&sm, "y").map(|e| e.lock_index), Some(3));
    write(&mut sm, 30, op::delete_tree(""));
    assert_eq!(sm.kv().lock_index_floor(), 0);
    apply_at(
        &mut sm,
        31,
        T0 + 1,
        Op::ReapTombstones { before_ms: T0 + 1 },
    );
    assert_eq!(sm.kv().tombstone_count(), 0);
    assert_eq!(sm.kv().lock_index_floor(), 3);

    let bytes = postcard::to_allocvec(&sm).expect("encode");
    let mut restored: StateMachine = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(restored, sm);
    // A plain write creates a fresh key at 0, as in Consul; its first acquire is above the floor.
    write(&mut restored, 32, op::set("x", "v"));
    assert_eq!(get(&restored, "x").map(|e| e.lock_index), Some(0));
    write(&mut restored, 33, op::lock("x", "v", S1));
    assert_eq!(get(&restored, "x").map(|e| e.lock_index), Some(4));
}

// ---------------------------------------------------------------------------------------------
// Batches: many ops in one raft entry
// ---------------------------------------------------------------------------------------------

/// A batch applies its ops in order at the entry's index, answers each, and reports what all
/// of them changed; a refused op refuses only itself.
#[test]
fn a_batch_applies_every_op_in_order_at_one_index() {
    let mut sm = world();
    let set = |key: &str, value: &str| {
        Op::Kv(vec![KvOp::Set {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            flags: 0,
        }])
    };
    let batch = Op::Batch(vec![
        set("a", "1"),
        Op::CreateSession(session(S1, "no-such-node")),
        set("a", "2"),
        set("b", "3"),
    ]);
    let (response, fx) = apply(&mut sm, 7, batch);
    let Response::Batch(responses) = response else {
        panic!("a batch answers with a batch, got {response:?}");
    };
    assert_eq!(responses.len(), 4);
    assert_eq!(responses[1], Response::Rejected(ApplyError::MissingNode));
    assert_eq!(get(&sm, "a"), Some(entry("a", "2", 7, 7)));
    assert_eq!(get(&sm, "b"), Some(entry("b", "3", 7, 7)));
    assert_eq!(fx.kv_keys, strings(&["a", "a", "b"]));
}
