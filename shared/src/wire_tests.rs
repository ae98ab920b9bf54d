//! Golden variant indexes of the enums that are persisted (the raft log, snapshots) or cross the
//! wire between agents and servers. postcard encodes a variant by its position, so reordering
//! or inserting a variant silently changes what an old log or an older peer means. Each
//! `expected_*` function is an exhaustive `match` (adding a variant does not compile until it
//! gets its index here), and each test encodes one value of every variant and checks its
//! first byte against that index.

use serde::Serialize;

use crate::acl::{Policy, Role, Token};
use crate::autopilot::AutopilotConfig;
use crate::catalog::{Check, HealthStatus, Node, Service};
use crate::kv::{KvEntry, KvOp, TxnOutcome};
use crate::lock::{LockHold, LockMode, LockOp, LockOutcome, LockStanding};
use crate::query::PreparedQuery;
use crate::rpc::{
    AclOp, ApplyError, Op, Query as _, ReadQuery, Registration, Request as _, Response,
    ServerError, reads,
};
use crate::session::{Behavior, Session};
use crate::txn::{CatalogTxnOutcome, CatalogVerb, TxnOp, TxnResult};

fn first_byte(value: &impl Serialize) -> u8 {
    postcard::to_allocvec(value).expect("encodes")[0]
}

fn check<T: Serialize + std::fmt::Debug>(samples: &[T], expected: fn(&T) -> u8) {
    let mut seen: Vec<u8> = samples.iter().map(expected).collect();
    for sample in samples {
        assert_eq!(first_byte(sample), expected(sample), "{sample:?}");
    }
    seen.sort_unstable();
    let all: Vec<u8> = (0..samples.len() as u8).collect();
    assert_eq!(seen, all, "one sample of every variant, indexes 0..n");
}

fn expected_op(op: &Op) -> u8 {
    match op {
        Op::Kv(_) => 0,
        Op::CreateSession(_) => 1,
        Op::DestroySession { .. } => 2,
        Op::RegisterNode { .. } => 3,
        Op::RegisterCheck(_) => 4,
        Op::DeregisterCheck { .. } => 5,
        Op::DeregisterNode { .. } => 6,
        Op::ReapTombstones { .. } => 7,
        Op::CatalogRegister(_) => 8,
        Op::DeregisterService { .. } => 9,
        Op::SetQuery { .. } => 10,
        Op::DeleteQuery { .. } => 11,
        Op::CheckpointTtls { .. } => 12,
        Op::Lock(_) => 13,
        Op::Batch(_) => 14,
        Op::RestoreSnapshot { .. } => 15,
        Op::SetAutopilotConfig { .. } => 16,
        Op::RestoreChunk { .. } => 17,
        Op::Acl(_) => 18,
        Op::SetProtocol { .. } => 19,
        Op::Txn(_) => 20,
        Op::SetQueryFull { .. } => 21,
        Op::CatalogRegisterFull(_) => 22,
        Op::ExpireSession { .. } => 23,
    }
}

fn session() -> Session {
    Session {
        id: "s".to_owned(),
        node: "n".to_owned(),
        ..Session::default()
    }
}

fn s(v: &str) -> String {
    v.to_owned()
}

#[test]
fn op_variants_keep_their_indexes() {
    let samples = [
        Op::Kv(Vec::new()),
        Op::CreateSession(session()),
        Op::DestroySession { id: s("s") },
        Op::RegisterNode {
            name: s("n"),
            address: s("a"),
        },
        Op::RegisterCheck(Check::default()),
        Op::DeregisterCheck {
            node: s("n"),
            check_id: s("c"),
        },
        Op::DeregisterNode { name: s("n") },
        Op::ReapTombstones { before_ms: 1 },
        Op::CatalogRegister(Registration::default()),
        Op::DeregisterService {
            node: s("n"),
            service_id: s("x"),
        },
        Op::SetQuery {
            query: PreparedQuery::default(),
            update: false,
        },
        Op::DeleteQuery { id: s("q") },
        Op::CheckpointTtls {
            deadlines: Vec::new(),
        },
        Op::Lock(LockOp::Wake { name: s("l") }),
        Op::Batch(Vec::new()),
        Op::RestoreSnapshot { state: Vec::new() },
        Op::SetAutopilotConfig {
            config: AutopilotConfig::default(),
            cas: None,
        },
        Op::RestoreChunk {
            id: s("r"),
            offset: 0,
            bytes: Vec::new(),
            last: true,
        },
        Op::Acl(AclOp::DeleteRole { id: s("r") }),
        Op::SetProtocol { level: 2 },
        Op::Txn(Vec::new()),
        Op::SetQueryFull {
            query: PreparedQuery::default(),
            update: false,
        },
        Op::CatalogRegisterFull(Registration::default()),
        Op::ExpireSession { id: s("s") },
    ];
    check(&samples, expected_op);
}

fn expected_txn_op(op: &TxnOp) -> u8 {
    match op {
        TxnOp::Kv(_) => 0,
        TxnOp::Node { .. } => 1,
        TxnOp::Service { .. } => 2,
        TxnOp::Check { .. } => 3,
    }
}

#[test]
fn txn_op_and_result_variants_keep_their_indexes() {
    let verbs = [
        CatalogVerb::Get,
        CatalogVerb::Set,
        CatalogVerb::Cas,
        CatalogVerb::Delete,
        CatalogVerb::DeleteCas,
    ];
    check(&verbs, |v| match v {
        CatalogVerb::Get => 0,
        CatalogVerb::Set => 1,
        CatalogVerb::Cas => 2,
        CatalogVerb::Delete => 3,
        CatalogVerb::DeleteCas => 4,
    });
    let ops = [
        TxnOp::Kv(KvOp::Get { key: s("k") }),
        TxnOp::Node {
            verb: CatalogVerb::Get,
            node: Node::default(),
        },
        TxnOp::Service {
            verb: CatalogVerb::Get,
            service: Service::default(),
        },
        TxnOp::Check {
            verb: CatalogVerb::Get,
            check: Check::default(),
        },
    ];
    check(&ops, expected_txn_op);
    let results = [
        TxnResult::Kv(KvEntry {
            key: s("k"),
            value: Vec::new(),
            flags: 0,
            session: None,
            lock_index: 0,
            create_index: 1,
            modify_index: 1,
        }),
        TxnResult::Node(Node::default()),
        TxnResult::Service(Service::default()),
        TxnResult::Check(Check::default()),
    ];
    check(&results, |r| match r {
        TxnResult::Kv(_) => 0,
        TxnResult::Node(_) => 1,
        TxnResult::Service(_) => 2,
        TxnResult::Check(_) => 3,
    });
    let outcomes = [
        CatalogTxnOutcome::Committed(Vec::new()),
        CatalogTxnOutcome::RolledBack(Vec::new()),
    ];
    check(&outcomes, |o| match o {
        CatalogTxnOutcome::Committed(_) => 0,
        CatalogTxnOutcome::RolledBack(_) => 1,
    });
}

fn expected_acl_op(op: &AclOp) -> u8 {
    match op {
        AclOp::Init { .. } => 0,
        AclOp::Bootstrap(_) => 1,
        AclOp::SetToken { .. } => 2,
        AclOp::DeleteToken { .. } => 3,
        AclOp::SetPolicy { .. } => 4,
        AclOp::DeletePolicy { .. } => 5,
        AclOp::SetRole { .. } => 6,
        AclOp::DeleteRole { .. } => 7,
    }
}

fn token() -> Token {
    Token::new("a", "s")
}

fn policy() -> Policy {
    Policy {
        id: s("p"),
        name: s("p"),
        description: String::new(),
        rules: String::new(),
        datacenters: Vec::new(),
        create_index: 0,
        modify_index: 0,
    }
}

fn role() -> Role {
    Role {
        id: s("r"),
        name: s("r"),
        description: String::new(),
        policies: Vec::new(),
        service_identities: Vec::new(),
        node_identities: Vec::new(),
        create_index: 0,
        modify_index: 0,
    }
}

#[test]
fn acl_op_variants_keep_their_indexes() {
    let samples = [
        AclOp::Init {
            initial_management: None,
        },
        AclOp::Bootstrap(token()),
        AclOp::SetToken {
            token: token(),
            create: true,
        },
        AclOp::DeleteToken {
            accessor_id: s("a"),
        },
        AclOp::SetPolicy {
            policy: policy(),
            create: true,
        },
        AclOp::DeletePolicy { id: s("p") },
        AclOp::SetRole {
            role: role(),
            create: true,
        },
        AclOp::DeleteRole { id: s("r") },
    ];
    check(&samples, expected_acl_op);
}

fn expected_kv_op(op: &KvOp) -> u8 {
    match op {
        KvOp::Set { .. } => 0,
        KvOp::Cas { .. } => 1,
        KvOp::Lock { .. } => 2,
        KvOp::Unlock { .. } => 3,
        KvOp::Get { .. } => 4,
        KvOp::GetOrEmpty { .. } => 5,
        KvOp::GetTree { .. } => 6,
        KvOp::CheckIndex { .. } => 7,
        KvOp::CheckSession { .. } => 8,
        KvOp::CheckNotExists { .. } => 9,
        KvOp::Delete { .. } => 10,
        KvOp::DeleteTree { .. } => 11,
        KvOp::DeleteCas { .. } => 12,
    }
}

#[test]
fn kv_op_variants_keep_their_indexes() {
    let samples = [
        KvOp::Set {
            key: s("k"),
            value: Vec::new(),
            flags: 0,
        },
        KvOp::Cas {
            key: s("k"),
            value: Vec::new(),
            flags: 0,
            index: 0,
        },
        KvOp::Lock {
            key: s("k"),
            value: Vec::new(),
            flags: 0,
            session: s("s"),
        },
        KvOp::Unlock {
            key: s("k"),
            value: Vec::new(),
            flags: 0,
            session: s("s"),
        },
        KvOp::Get { key: s("k") },
        KvOp::GetOrEmpty { key: s("k") },
        KvOp::GetTree { prefix: s("p") },
        KvOp::CheckIndex {
            key: s("k"),
            index: 1,
        },
        KvOp::CheckSession {
            key: s("k"),
            session: s("s"),
        },
        KvOp::CheckNotExists { key: s("k") },
        KvOp::Delete { key: s("k") },
        KvOp::DeleteTree { prefix: s("p") },
        KvOp::DeleteCas {
            key: s("k"),
            index: 1,
        },
    ];
    check(&samples, expected_kv_op);
}

#[test]
fn lock_and_small_enums_keep_their_indexes() {
    let lock_ops = [
        LockOp::Acquire {
            name: s("l"),
            session: s("s"),
            mode: LockMode::Shared,
            limit: 1,
            try_only: false,
        },
        LockOp::Release {
            name: s("l"),
            session: s("s"),
        },
        LockOp::Wake { name: s("l") },
        LockOp::Enqueue {
            name: s("l"),
            session: s("s"),
            mode: LockMode::Exclusive,
            limit: 1,
            try_only: false,
            request: 9,
        },
        LockOp::Leave {
            name: s("l"),
            session: s("s"),
            request: 9,
        },
    ];
    check(&lock_ops, |op| match op {
        LockOp::Acquire { .. } => 0,
        LockOp::Release { .. } => 1,
        LockOp::Wake { .. } => 2,
        LockOp::Enqueue { .. } => 3,
        LockOp::Leave { .. } => 4,
    });
    check(&[LockMode::Exclusive, LockMode::Shared], |m| match m {
        LockMode::Exclusive => 0,
        LockMode::Shared => 1,
    });
    check(&[Behavior::Release, Behavior::Delete], |b| match b {
        Behavior::Release => 0,
        Behavior::Delete => 1,
    });
    let statuses = [
        HealthStatus::Passing,
        HealthStatus::Warning,
        HealthStatus::Critical,
    ];
    for status in &statuses {
        let expected = match status {
            HealthStatus::Passing => 0,
            HealthStatus::Warning => 1,
            HealthStatus::Critical => 2,
        };
        assert_eq!(first_byte(status), expected, "{status:?}");
    }
    let standings = [
        LockStanding::Held {
            token: 1,
            since_ms: 1,
        },
        LockStanding::Queued { position: 1 },
        LockStanding::Absent,
    ];
    check(&standings, |st| match st {
        LockStanding::Held { .. } => 0,
        LockStanding::Queued { .. } => 1,
        LockStanding::Absent => 2,
    });
    let holds = [
        LockHold::Held {
            token: 1,
            since_ms: 1,
            mode: LockMode::Shared,
        },
        LockHold::Queued {
            position: 1,
            mode: LockMode::Exclusive,
        },
        LockHold::Absent,
    ];
    check(&holds, |h| match h {
        LockHold::Held { .. } => 0,
        LockHold::Queued { .. } => 1,
        LockHold::Absent => 2,
    });
}

fn expected_response(r: &Response) -> u8 {
    match r {
        Response::Done => 0,
        Response::Txn(_) => 1,
        Response::SessionCreated { .. } => 2,
        Response::Rejected(_) => 3,
        Response::Lock(_) => 4,
        Response::Batch(_) => 5,
        Response::Applied(_) => 6,
        Response::CatalogTxn(_) => 7,
    }
}

#[test]
fn response_variants_keep_their_indexes() {
    let samples = [
        Response::Done,
        Response::Txn(TxnOutcome::Committed(Vec::new())),
        Response::SessionCreated { id: s("s") },
        Response::Rejected(ApplyError::MissingNode),
        Response::Lock(LockOutcome::Woken),
        Response::Batch(Vec::new()),
        Response::Applied(true),
        Response::CatalogTxn(CatalogTxnOutcome::Committed(Vec::new())),
    ];
    check(&samples, expected_response);
    let outcomes = [
        LockOutcome::Held { token: 1 },
        LockOutcome::Queued {
            position: 1,
            index: 1,
        },
        LockOutcome::Busy { lock_delay_ms: 0 },
        LockOutcome::Released {
            held: true,
            queued: false,
        },
        LockOutcome::Woken,
        LockOutcome::Granted {
            token: 1,
            mode: LockMode::Shared,
        },
        LockOutcome::Waiting {
            position: 1,
            index: 1,
            mode: LockMode::Shared,
        },
        LockOutcome::Left,
        LockOutcome::Stayed(LockHold::Absent),
    ];
    check(&outcomes, |o| match o {
        LockOutcome::Held { .. } => 0,
        LockOutcome::Queued { .. } => 1,
        LockOutcome::Busy { .. } => 2,
        LockOutcome::Released { .. } => 3,
        LockOutcome::Woken => 4,
        LockOutcome::Granted { .. } => 5,
        LockOutcome::Waiting { .. } => 6,
        LockOutcome::Left => 7,
        LockOutcome::Stayed(_) => 8,
    });
}

fn expected_apply_error(e: &ApplyError) -> u8 {
    match e {
        ApplyError::MissingNode => 0,
        ApplyError::MissingCheck(_) => 1,
        ApplyError::CriticalCheck(_) => 2,
        ApplyError::DuplicateSession => 3,
        ApplyError::UnknownServiceForCheck { .. } => 4,
        ApplyError::InvalidQuerySession(_) => 5,
        ApplyError::DuplicateQueryName(_) => 6,
        ApplyError::MissingQuery(_) => 7,
        ApplyError::LockSession(_) => 8,
        ApplyError::LockLimitConflict { .. } => 9,
        ApplyError::InvalidSnapshot => 10,
        ApplyError::RestoreInterrupted => 11,
        ApplyError::AclBootstrapped { .. } => 12,
        ApplyError::AclNotFound => 13,
        ApplyError::AclInvalid(_) => 14,
        ApplyError::LockUpgradeHeld { .. } => 15,
        ApplyError::LockUpgradeQueued { .. } => 16,
    }
}

#[test]
fn apply_error_variants_keep_their_indexes() {
    let samples = [
        ApplyError::MissingNode,
        ApplyError::MissingCheck(s("c")),
        ApplyError::CriticalCheck(s("c")),
        ApplyError::DuplicateSession,
        ApplyError::UnknownServiceForCheck {
            service_id: s("x"),
            check_id: s("c"),
        },
        ApplyError::InvalidQuerySession(s("s")),
        ApplyError::DuplicateQueryName(s("q")),
        ApplyError::MissingQuery(s("q")),
        ApplyError::LockSession(s("s")),
        ApplyError::LockLimitConflict { lock: 1, local: 2 },
        ApplyError::InvalidSnapshot,
        ApplyError::RestoreInterrupted,
        ApplyError::AclBootstrapped { reset_index: 1 },
        ApplyError::AclNotFound,
        ApplyError::AclInvalid(s("x")),
        ApplyError::LockUpgradeHeld {
            lock: s("l"),
            session: s("s"),
        },
        ApplyError::LockUpgradeQueued {
            lock: s("l"),
            session: s("s"),
        },
    ];
    check(&samples, expected_apply_error);
}

fn expected_read(q: &ReadQuery) -> u8 {
    match q {
        ReadQuery::KvGet { .. } => 0,
        ReadQuery::KvList { .. } => 1,
        ReadQuery::KvKeys { .. } => 2,
        ReadQuery::SessionInfo { .. } => 3,
        ReadQuery::SessionList {} => 4,
        ReadQuery::SessionNode { .. } => 5,
        ReadQuery::Txn { .. } => 6,
        ReadQuery::Sequencer { .. } => 7,
        ReadQuery::CatalogNodes {} => 8,
        ReadQuery::NodeChecks { .. } => 9,
        ReadQuery::CatalogServices {} => 10,
        ReadQuery::CatalogService { .. } => 11,
        ReadQuery::CatalogNode { .. } => 12,
        ReadQuery::ServiceChecks { .. } => 13,
        ReadQuery::ChecksInState { .. } => 14,
        ReadQuery::HealthService { .. } => 15,
        ReadQuery::QueryList {} => 16,
        ReadQuery::QueryGet { .. } => 17,
        ReadQuery::QueryExecute { .. } => 18,
        ReadQuery::Lock { .. } => 19,
        ReadQuery::Locks { .. } => 20,
        ReadQuery::LockStanding { .. } => 21,
        ReadQuery::LockSequencer { .. } => 22,
        ReadQuery::AclResolve { .. } => 23,
        ReadQuery::AclToken { .. } => 24,
        ReadQuery::AclTokenList {} => 25,
        ReadQuery::AclPolicy { .. } => 26,
        ReadQuery::AclPolicyList {} => 27,
        ReadQuery::AclRole { .. } => 28,
        ReadQuery::AclRoleList {} => 29,
        ReadQuery::LockHold { .. } => 30,
        ReadQuery::QueryListFull {} => 31,
        ReadQuery::QueryGetFull { .. } => 32,
        ReadQuery::CatalogServicesFull {} => 33,
        ReadQuery::CatalogServiceFull { .. } => 34,
        ReadQuery::CatalogNodeFull { .. } => 35,
        ReadQuery::HealthServiceFull { .. } => 36,
        ReadQuery::QueryExecuteFull { .. } => 37,
        ReadQuery::History { .. } => 38,
    }
}

#[test]
fn read_variants_keep_their_indexes_and_bytes() {
    let samples: Vec<ReadQuery> = vec![
        reads::KvGet { key: s("k") }.into(),
        reads::KvList { prefix: s("p") }.into(),
        reads::KvKeys {
            prefix: s("p"),
            separator: None,
        }
        .into(),
        reads::SessionInfo { id: s("s") }.into(),
        reads::SessionList {}.into(),
        reads::SessionNode { node: s("n") }.into(),
        reads::Txn { ops: Vec::new() }.into(),
        reads::Sequencer {
            key: s("k"),
            lock_index: 1,
            session: s("s"),
        }
        .into(),
        reads::CatalogNodes {}.into(),
        reads::NodeChecks { node: s("n") }.into(),
        reads::CatalogServices {}.into(),
        reads::CatalogService { name: s("x") }.into(),
        reads::CatalogNode { node: s("n") }.into(),
        reads::ServiceChecks { name: s("x") }.into(),
        reads::ChecksInState { state: None }.into(),
        reads::HealthService { name: s("x") }.into(),
        reads::QueryList {}.into(),
        reads::QueryGet { id_or_name: s("q") }.into(),
        reads::QueryExecute { id_or_name: s("q") }.into(),
        reads::Lock { name: s("l") }.into(),
        reads::Locks { prefix: s("p") }.into(),
        reads::LockStanding {
            name: s("l"),
            session: s("s"),
        }
        .into(),
        reads::LockSequencer {
            name: s("l"),
            token: 7,
            session: s("s"),
        }
        .into(),
        reads::AclResolve { secret_id: s("x") }.into(),
        reads::AclToken {
            accessor_id: s("a"),
        }
        .into(),
        reads::AclTokenList {}.into(),
        reads::AclPolicy {
            id: s("p"),
            by_name: false,
        }
        .into(),
        reads::AclPolicyList {}.into(),
        reads::AclRole {
            id: s("r"),
            by_name: true,
        }
        .into(),
        reads::AclRoleList {}.into(),
        reads::LockHold {
            name: s("l"),
            session: s("s"),
        }
        .into(),
        reads::QueryListFull {}.into(),
        reads::QueryGetFull { id_or_name: s("q") }.into(),
        reads::CatalogServicesFull {}.into(),
        reads::CatalogServiceFull { name: s("x") }.into(),
        reads::CatalogNodeFull { node: s("n") }.into(),
        reads::HealthServiceFull { name: s("x") }.into(),
        reads::QueryExecuteFull { id_or_name: s("q") }.into(),
        reads::History {
            name: s("l"),
            prefix: true,
        }
        .into(),
    ];
    check(&samples, expected_read);
    // Whole encodings, as older builds wrote them (fields in order, no names; a read without
    // fields is its index alone).
    let bytes = |q: ReadQuery| postcard::to_allocvec(&q).expect("encodes");
    assert_eq!(
        bytes(reads::KvGet { key: s("ab") }.into()),
        [0, 2, b'a', b'b']
    );
    assert_eq!(bytes(reads::SessionList {}.into()), [4]);
    assert_eq!(bytes(reads::Txn { ops: Vec::new() }.into()), [6, 0]);
    assert_eq!(
        bytes(
            reads::LockSequencer {
                name: s("l"),
                token: 7,
                session: s("s"),
            }
            .into()
        ),
        [22, 1, b'l', 7, 1, b's']
    );
}

#[test]
fn a_read_takes_only_its_own_answer() {
    let answer = reads::SessionList::answer(Vec::new());
    assert_eq!(first_byte(&answer), 2);
    assert_eq!(reads::SessionNode::output(answer.clone()), Ok(Vec::new()));
    assert_eq!(reads::KvGet::output(answer.clone()), Err(answer));
}

fn expected_server_error(e: &ServerError) -> u8 {
    match e {
        ServerError::NoLeader => 0,
        ServerError::NotLeader { .. } => 1,
        ServerError::SessionNotFound(_) => 2,
        ServerError::ShuttingDown => 3,
        ServerError::Indeterminate(_) => 4,
        ServerError::NoServers => 5,
        ServerError::TooLarge { .. } => 6,
        ServerError::TooManyBlockingQueries => 7,
        ServerError::InvalidSessionTtl(_) => 8,
        ServerError::Unavailable(_) => 9,
        ServerError::Membership(_) => 10,
        ServerError::Internal(_) => 11,
        ServerError::PermissionDenied(_) => 12,
    }
}

#[test]
fn server_error_variants_keep_their_indexes() {
    let samples = [
        ServerError::NoLeader,
        ServerError::NotLeader { leader: None },
        ServerError::SessionNotFound(s("s")),
        ServerError::ShuttingDown,
        ServerError::Indeterminate(s("x")),
        ServerError::NoServers,
        ServerError::TooLarge { size: 2, limit: 1 },
        ServerError::TooManyBlockingQueries,
        ServerError::InvalidSessionTtl(s("x")),
        ServerError::Unavailable(s("x")),
        ServerError::Membership(s("x")),
        ServerError::Internal(s("x")),
        ServerError::PermissionDenied(s("x")),
    ];
    check(&samples, expected_server_error);
}

#[test]
fn only_what_cannot_apply_twice_is_retried() {
    let not_applied = ServerError::Unavailable(s("x"));
    let maybe_applied = ServerError::Indeterminate(s("x"));
    assert!(not_applied.safe_to_retry(false));
    assert!(!maybe_applied.safe_to_retry(false));
    assert!(maybe_applied.safe_to_retry(true));
    assert!(!ServerError::Internal(s("x")).safe_to_retry(true));
    assert!(ServerError::NoLeader.safe_to_retry(false));
}

#[test]
fn a_servers_permission_refusal_is_a_403_not_a_bug() {
    use crate::rpc::calls::{self, RpcResponse};
    let denied = RpcResponse::Refused(s(
        "Permission denied: token with AccessorID 'a' lacks permission 'acl:write'",
    ));
    assert!(matches!(
        calls::reply::<calls::Renew>(denied),
        Err(ServerError::PermissionDenied(why)) if why.starts_with("Permission denied: token")
    ));
    let refused = RpcResponse::Refused(s("a join needs a server certificate"));
    assert!(matches!(
        calls::reply::<calls::Renew>(refused),
        Err(ServerError::Internal(_))
    ));
    assert!(!ServerError::PermissionDenied(s("x")).safe_to_retry(true));
}
