//! Fuzzing of the postcard decoding a peer's bytes go through before any handler sees them:
//! [`RpcRequest`], [`PeerRequest`] and a replication stream's [`AppendEntriesRequest`] on the
//! server side, [`RpcResponse`], [`PeerResponse`] and [`StreamAppendReply`] on the calling side
//! (the frame around them is fuzzed in `vigil-wire`). The client requests
//! are `vigil-shared`'s ([`vigil_shared::rpc::calls`]) and raft's messages the server's
//! ([`crate::raft::network`]), so the fuzzing of both lives here. proptest feeds
//! arbitrary bytes and mutated valid encodings (bits flipped, bytes replaced, inserted or
//! removed, the message truncated, a varint of 2^32 - 1 planted where a length or count may be)
//! of a corpus that holds every variant of the four enums, every `Op` and the KV verbs.
//!
//! Decoding must never panic, and whatever decodes must be no larger than its input: postcard
//! checks each string and byte-string length against the bytes left, every other element costs
//! at least one input byte, and serde preallocates at most 1 MiB for a sequence whatever count
//! it announces, so a decoded value's own encoding never outgrows the bytes it came from (a
//! global allocator counting bytes would say it more directly, but needs `unsafe`). A decoded
//! value must also encode to a canonical form that decodes to itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use openraft::EntryPayload;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, StreamAppendError, VoteRequest, VoteResponse,
};
use openraft_legacy::network_v1::{InstallSnapshotRequest, InstallSnapshotResponse, SnapshotMeta};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use serde::Serialize;
use serde::de::DeserializeOwned;
use vigil_shared::autopilot::AutopilotConfig;
use vigil_shared::catalog::{Check, HealthStatus, Node, Service};
use vigil_shared::kv::{KvEntry, KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::operator::{OperatorReply, OperatorRequest, PeerRef};
use vigil_shared::query::{PreparedQuery, ServiceQuery};
use vigil_shared::rpc::calls::{
    self, Forwarded, HelloInfo, PeerInfo, RpcRequest, RpcResponse, ServerNode, StatusInfo,
};
use vigil_shared::rpc::{
    Command, Consistency, Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Registration,
    Response, ServerError,
};
use vigil_shared::session::{Behavior, ServiceCheck, Session};
use vigil_shared::txn::{CatalogVerb, TxnOp};

use crate::raft::network::{PeerRequest, PeerResponse, StreamAppendReply};
use crate::raft::{Entry, LogId, Membership, StoredMembership, TypeConfig, Vote};

// ---------------------------------------------------------------------------------------------
// The corpus: valid requests and responses
// ---------------------------------------------------------------------------------------------

fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, 1, index)
}

fn server(name: &str) -> ServerNode {
    ServerNode {
        name: name.to_owned(),
        rpc_addr: "127.0.0.1:8300".to_owned(),
    }
}

fn membership() -> Membership {
    let voters = BTreeSet::from([1, 2, 3]);
    let nodes = BTreeMap::from([(1, server("s1")), (2, server("s2")), (3, server("s3"))]);
    Membership::new(vec![voters], nodes).expect("a valid membership")
}

fn session() -> Session {
    Session {
        id: "5b0a4bc6-5a5b-4c7a-9a1e-0d3f2c1b0a01".to_owned(),
        name: "lock".to_owned(),
        node: "node1".to_owned(),
        lock_delay_ns: 15_000_000_000,
        behavior: Behavior::Delete,
        ttl: "15s".to_owned(),
        node_checks: vec!["serfHealth".to_owned()],
        service_checks: Some(vec![ServiceCheck {
            id: "web".to_owned(),
            namespace: String::new(),
        }]),
        checks: vec!["disk".to_owned()],
        create_index: 7,
        modify_index: 7,
        owner: String::new(),
    }
}

fn check() -> Check {
    Check {
        node: "node1".to_owned(),
        check_id: "web".to_owned(),
        name: "web".to_owned(),
        status: HealthStatus::Warning,
        service_id: "web1".to_owned(),
        kind: "http".to_owned(),
        interval: "10s".to_owned(),
        definition: r#"{"HTTP":"http://127.0.0.1/"}"#.to_owned(),
        ..Check::default()
    }
}

fn entry() -> KvEntry {
    KvEntry {
        key: "a/lock".to_owned(),
        value: b"holder".to_vec(),
        flags: 3304740253564472344,
        session: Some(session().id),
        lock_index: 4,
        create_index: 10,
        modify_index: 17,
    }
}

/// One of each KV verb, with values, flags, indexes and sessions set.
fn kv_ops() -> Vec<KvOp> {
    let (key, value, session) = ("a/lock".to_owned(), b"v".to_vec(), session().id);
    vec![
        KvOp::Set {
            key: key.clone(),
            value: value.clone(),
            flags: 1,
        },
        KvOp::Cas {
            key: key.clone(),
            value: value.clone(),
            flags: 2,
            index: 300,
        },
        KvOp::Lock {
            key: key.clone(),
            value: value.clone(),
            flags: 3,
            session: session.clone(),
        },
        KvOp::Unlock {
            key: key.clone(),
            value,
            flags: 4,
            session: session.clone(),
        },
        KvOp::Get { key: key.clone() },
        KvOp::GetOrEmpty { key: key.clone() },
        KvOp::GetTree {
            prefix: "a/".to_owned(),
        },
        KvOp::CheckIndex {
            key: key.clone(),
            index: 5,
        },
        KvOp::CheckSession {
            key: key.clone(),
            session,
        },
        KvOp::CheckNotExists { key: key.clone() },
        KvOp::Delete { key: key.clone() },
        KvOp::DeleteTree {
            prefix: "a".to_owned(),
        },
        KvOp::DeleteCas { key, index: 9 },
    ]
}

/// Every `Op` variant.
fn ops() -> Vec<Op> {
    let node = "node1".to_owned();
    vec![
        Op::Kv(kv_ops()),
        Op::CreateSession(session()),
        Op::DestroySession { id: session().id },
        Op::RegisterNode {
            name: node.clone(),
            address: "10.0.0.1".to_owned(),
        },
        Op::RegisterCheck(check()),
        Op::DeregisterCheck {
            node: node.clone(),
            check_id: "web".to_owned(),
        },
        Op::DeregisterNode { name: node.clone() },
        Op::ReapTombstones {
            before_ms: 1_700_000_000_000,
        },
        Op::CatalogRegister(Registration {
            node: node.clone(),
            node_id: "e0a1b2c3-0000-4000-8000-000000000001".to_owned(),
            address: "10.0.0.1".to_owned(),
            tagged_addresses: BTreeMap::from([("lan".to_owned(), "10.0.0.1".to_owned())]),
            node_meta: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
            skip_node_update: false,
            service: Some(Service {
                node: node.clone(),
                id: "web1".to_owned(),
                name: "web".to_owned(),
                tags: vec!["primary".to_owned(), "v2".to_owned()],
                port: 8080,
                ..Service::default()
            }),
            checks: vec![check(), check()],
        }),
        Op::DeregisterService {
            node,
            service_id: "web1".to_owned(),
        },
        Op::SetQuery {
            query: PreparedQuery {
                id: "q1".to_owned(),
                name: "web".to_owned(),
                service: ServiceQuery {
                    service: "web".to_owned(),
                    tags: vec!["!v1".to_owned()],
                    node_meta: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
                    failover_nearest_n: -3,
                    failover_datacenters: vec!["dc2".to_owned()],
                    ..ServiceQuery::default()
                },
                dns_ttl: "10s".to_owned(),
                ..PreparedQuery::default()
            },
            update: true,
        },
        Op::DeleteQuery {
            id: "q1".to_owned(),
        },
        Op::CheckpointTtls {
            deadlines: vec![(session().id, 1_700_000_030_000), ("b".to_owned(), 1)],
        },
        Op::Txn(vec![
            TxnOp::Kv(KvOp::Get {
                key: "a".to_owned(),
            }),
            TxnOp::Node {
                verb: CatalogVerb::Cas,
                node: Node {
                    name: "node1".to_owned(),
                    address: "10.0.0.1".to_owned(),
                    modify_index: 7,
                    ..Node::default()
                },
            },
            TxnOp::Service {
                verb: CatalogVerb::Set,
                service: Service {
                    node: "node1".to_owned(),
                    id: "web1".to_owned(),
                    name: "web".to_owned(),
                    ..Service::default()
                },
            },
            TxnOp::Check {
                verb: CatalogVerb::DeleteCas,
                check: check(),
            },
        ]),
    ]
}

fn peer_requests() -> Vec<PeerRequest> {
    let entries = ops()
        .into_iter()
        .enumerate()
        .map(|(i, op)| Entry {
            log_id: log_id(2, 40 + i as u64),
            payload: EntryPayload::Normal(Command {
                now_ms: 1_700_000_000_000 + i as u64,
                op,
            }),
        })
        .chain([
            Entry {
                log_id: log_id(3, 60),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(3, 61),
                payload: EntryPayload::Membership(membership()),
            },
        ])
        .collect();
    vec![
        PeerRequest::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(2, 39)),
            entries,
            leader_commit: Some(log_id(2, 38)),
        }),
        PeerRequest::Vote(VoteRequest::new(Vote::new(4, 2), Some(log_id(3, 61)))),
        PeerRequest::InstallSnapshot(InstallSnapshotRequest {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta {
                last_log_id: Some(log_id(3, 61)),
                last_membership: StoredMembership::new(Some(log_id(3, 61)), membership()),
                snapshot_id: "3-61-1".to_owned(),
            },
            offset: 0,
            data: (0..=255).collect(),
            done: true,
        }),
        PeerRequest::Campaign,
        PeerRequest::PreVote(VoteRequest::new(Vote::new(5, 2), Some(log_id(3, 61)))),
    ]
}

/// A replication stream's requests: the AppendEntries of [`peer_requests`], and a heartbeat.
fn stream_requests() -> Vec<AppendEntriesRequest<TypeConfig>> {
    let mut requests: Vec<_> = peer_requests()
        .into_iter()
        .filter_map(|request| match request {
            PeerRequest::AppendEntries(request) => Some(request),
            _ => None,
        })
        .collect();
    requests.push(AppendEntriesRequest {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(3, 61)),
        entries: Vec::new(),
        leader_commit: Some(log_id(3, 61)),
    });
    requests
}

fn stream_replies() -> Vec<StreamAppendReply> {
    vec![
        Ok(Ok(Some(log_id(3, 61)))),
        Ok(Ok(None)),
        Ok(Err(StreamAppendError::Conflict(log_id(2, 39)))),
        Ok(Err(StreamAppendError::HigherVote(Vote::new(4, 2)))),
        Err("raft stopped".to_owned()),
    ]
}

fn peer_responses() -> Vec<PeerResponse> {
    vec![
        PeerResponse::AppendEntries(Ok(AppendEntriesResponse::Success)),
        PeerResponse::AppendEntries(Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(
            3, 50,
        ))))),
        PeerResponse::Vote(Ok(VoteResponse {
            vote: Vote::new(4, 2),
            vote_granted: true,
            last_log_id: Some(log_id(3, 61)),
        })),
        PeerResponse::InstallSnapshot(Ok(InstallSnapshotResponse {
            vote: Vote::new_committed(3, 1),
        })),
        PeerResponse::Undecodable("unexpected end of input".to_owned()),
        PeerResponse::Campaign(Ok(())),
        PeerResponse::Campaign(Err("raft stopped".to_owned())),
        PeerResponse::PreVote(Ok(VoteResponse {
            vote: Vote::new(5, 2),
            vote_granted: false,
            last_log_id: Some(log_id(3, 61)),
        })),
    ]
}

fn requests() -> Vec<RpcRequest> {
    let mut requests = vec![
        RpcRequest::Hello {},
        RpcRequest::Renew { id: session().id },
        RpcRequest::Forwarded(Forwarded::Join(calls::Join {
            node_id: 4,
            node: server("s4"),
        })),
        RpcRequest::Status {},
    ];
    requests.extend(ops().into_iter().map(|op| RpcRequest::Write { op }));
    let queries = [
        ReadQuery::KvGet {
            key: "a/lock".to_owned(),
        },
        ReadQuery::KvKeys {
            prefix: "a/".to_owned(),
            separator: Some("/".to_owned()),
        },
        ReadQuery::Txn { ops: kv_ops() },
        ReadQuery::Sequencer {
            key: "a/lock".to_owned(),
            lock_index: 4,
            session: session().id,
        },
        ReadQuery::ChecksInState {
            state: Some(HealthStatus::Critical),
        },
        ReadQuery::QueryExecute {
            id_or_name: "web".to_owned(),
        },
    ];
    requests.extend(queries.into_iter().map(|query| {
        RpcRequest::Forwarded(Forwarded::Query(calls::Query {
            opts: QueryOptions {
                consistency: Consistency::Consistent,
                min_index: 1_000_000,
                wait_ms: 300_000,
            },
            query,
        }))
    }));
    requests.push(RpcRequest::Operator {
        request: OperatorRequest::TransferLeader { to: Some(2) },
    });
    let token = || "2d7d1b4c-6d0e-4e0a-9d0b-7c3c3f3f0001".to_owned();
    requests.extend([
        RpcRequest::WriteAs {
            op: Op::DestroySession { id: session().id },
            token: token(),
        },
        RpcRequest::QueryAs {
            opts: QueryOptions::default(),
            query: ReadQuery::AclTokenList {},
            token: token(),
        },
        RpcRequest::RenewAs {
            id: session().id,
            token: token(),
        },
        RpcRequest::OperatorAs {
            request: OperatorRequest::SnapshotSave,
            token: String::new(),
        },
    ]);
    requests
}

fn responses() -> Vec<RpcResponse> {
    let meta = QueryMeta {
        index: 17,
        known_leader: true,
        last_contact_ms: 3,
    };
    vec![
        RpcResponse::Hello(HelloInfo {
            node_id: 2,
            node: server("s2"),
            initialized: true,
            leader: Some("127.0.0.1:8300".to_owned()),
        }),
        RpcResponse::Write(Ok(Response::Txn(TxnOutcome::Committed(vec![entry()])))),
        RpcResponse::Write(Ok(Response::Txn(TxnOutcome::RolledBack(vec![TxnError {
            op_index: 1,
            error: KvOpError::CheckIndexFailed {
                key: "a/lock".to_owned(),
                current: 17,
                expected: 5,
            },
        }])))),
        RpcResponse::Write(Err(ServerError::NotLeader {
            leader: Some("127.0.0.1:8301".to_owned()),
        })),
        RpcResponse::Query(Ok((QueryResult::Entries(vec![entry(), entry()]), meta))),
        RpcResponse::Query(Ok((QueryResult::Sessions(vec![session()]), meta))),
        RpcResponse::Query(Ok((QueryResult::Checks(vec![check()]), meta))),
        RpcResponse::Query(Ok((
            QueryResult::Keys(vec!["a/".to_owned(), "b".to_owned()]),
            meta,
        ))),
        RpcResponse::Renew(Ok(session())),
        RpcResponse::Join(Err(ServerError::TooLarge {
            size: 1 << 20,
            limit: 1 << 19,
        })),
        RpcResponse::Status(StatusInfo {
            leader: Some("127.0.0.1:8300".to_owned()),
            peers: vec![PeerInfo {
                node_id: 1,
                node: server("s1"),
                leader: true,
                voter: true,
            }],
            config_index: 61,
        }),
        RpcResponse::Operator(Ok(OperatorReply::Applied(true))),
        RpcResponse::Refused("a join needs a server certificate".to_owned()),
    ]
}

fn encode_all<T: Serialize>(values: Vec<T>) -> Vec<Vec<u8>> {
    values
        .iter()
        .map(|v| postcard::to_allocvec(v).expect("the corpus encodes"))
        .collect()
}

static REQUESTS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| encode_all(requests()));
static RESPONSES: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| encode_all(responses()));
static PEER_REQUESTS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| encode_all(peer_requests()));
static PEER_RESPONSES: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| encode_all(peer_responses()));
static STREAM_REQUESTS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| encode_all(stream_requests()));
static STREAM_REPLIES: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| encode_all(stream_replies()));

// ---------------------------------------------------------------------------------------------
// Mutations and the property
// ---------------------------------------------------------------------------------------------

/// The varint postcard writes for 2^32 - 1, a length or count far beyond any input.
const HUGE_VARINT: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 0x0f];

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Truncate(Index),
    /// [`HUGE_VARINT`] written over the bytes at the position.
    HugeCount(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 0..8u8).prop_map(|(at, bit)| Mutation::FlipBit(at, bit)),
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte(at, byte)),
        (any::<Index>(), vec(any::<u8>(), 1..8)).prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<Index>(), 1..16usize).prop_map(|(at, n)| Mutation::Remove(at, n)),
        any::<Index>().prop_map(Mutation::Truncate),
        any::<Index>().prop_map(Mutation::HugeCount),
    ]
}

fn mutate(bytes: &mut Vec<u8>, mutation: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let len = bytes.len();
    match mutation {
        Mutation::FlipBit(at, bit) => bytes[at.index(len)] ^= 1 << bit,
        Mutation::SetByte(at, byte) => bytes[at.index(len)] = *byte,
        Mutation::Insert(at, new) => {
            let at = at.index(len + 1);
            bytes.splice(at..at, new.iter().copied());
        }
        Mutation::Remove(at, n) => {
            let at = at.index(len);
            bytes.drain(at..(at + n).min(len));
        }
        Mutation::Truncate(at) => bytes.truncate(at.index(len)),
        Mutation::HugeCount(at) => plant_huge_count(bytes, at.index(len)),
    }
}

/// The message of `corpus` that `which` picks, with `mutations` applied in order.
fn mutated(corpus: &[Vec<u8>], which: &Index, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = which.get(corpus).clone();
    for m in mutations {
        mutate(&mut bytes, m);
    }
    bytes
}

fn plant_huge_count(bytes: &mut Vec<u8>, at: usize) {
    let end = (at + HUGE_VARINT.len()).min(bytes.len());
    bytes.splice(at..end, HUGE_VARINT);
}

/// Decoding `bytes` as `T` does not panic; a value that decodes is no larger than its input
/// and re-encodes canonically.
fn decodes_safely<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(value) = postcard::from_bytes::<T>(bytes) else {
        return Ok(());
    };
    let encoded = postcard::to_allocvec(&value).expect("a decoded value encodes");
    prop_assert!(
        encoded.len() <= bytes.len(),
        "{} input bytes decoded to a value of {} bytes",
        bytes.len(),
        encoded.len()
    );
    let again = postcard::from_bytes::<T>(&encoded).expect("a canonical encoding decodes");
    prop_assert_eq!(postcard::to_allocvec(&again).expect("encodes"), encoded);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_bytes_never_break_decoding(bytes in vec(any::<u8>(), 0..512)) {
        decodes_safely::<RpcRequest>(&bytes)?;
        decodes_safely::<RpcResponse>(&bytes)?;
        decodes_safely::<PeerRequest>(&bytes)?;
        decodes_safely::<PeerResponse>(&bytes)?;
        decodes_safely::<AppendEntriesRequest<TypeConfig>>(&bytes)?;
        decodes_safely::<StreamAppendReply>(&bytes)?;
    }

    #[test]
    fn mutated_messages_never_break_decoding(
        which in any::<Index>(),
        mutations in vec(mutation(), 1..5),
    ) {
        decodes_safely::<RpcRequest>(&mutated(&REQUESTS, &which, &mutations))?;
        decodes_safely::<RpcResponse>(&mutated(&RESPONSES, &which, &mutations))?;
        decodes_safely::<PeerRequest>(&mutated(&PEER_REQUESTS, &which, &mutations))?;
        decodes_safely::<PeerResponse>(&mutated(&PEER_RESPONSES, &which, &mutations))?;
        decodes_safely::<AppendEntriesRequest<TypeConfig>>(
            &mutated(&STREAM_REQUESTS, &which, &mutations),
        )?;
        decodes_safely::<StreamAppendReply>(&mutated(&STREAM_REPLIES, &which, &mutations))?;
    }
}

/// Every message of `corpus` decodes as a `T`, and with `planted`, a 2^32 - 1 count planted at
/// any offset of it is refused (or read as a value no larger than the input) rather than
/// allocated.
fn resists_huge_counts<T: Serialize + DeserializeOwned>(corpus: &[Vec<u8>], planted: bool) {
    for (i, bytes) in corpus.iter().enumerate() {
        assert!(postcard::from_bytes::<T>(bytes).is_ok(), "message {i}");
        for at in (0..bytes.len()).filter(|_| planted) {
            let mut planted = bytes.clone();
            plant_huge_count(&mut planted, at);
            decodes_safely::<T>(&planted).unwrap();
        }
    }
}

#[test]
fn a_huge_count_at_any_offset_is_not_believed() {
    resists_huge_counts::<RpcRequest>(&REQUESTS, true);
    resists_huge_counts::<PeerRequest>(&PEER_REQUESTS, true);
    resists_huge_counts::<RpcResponse>(&RESPONSES, false);
    resists_huge_counts::<PeerResponse>(&PEER_RESPONSES, false);
    resists_huge_counts::<AppendEntriesRequest<TypeConfig>>(&STREAM_REQUESTS, true);
    resists_huge_counts::<StreamAppendReply>(&STREAM_REPLIES, false);
}

/// Each of `values` encodes with its variant's golden index (`expected`) first, and the
/// corpus holds all `variants` of its enum.
fn keeps_variant_indexes<T: std::fmt::Debug>(
    values: &[T],
    encoded: &[Vec<u8>],
    expected: impl Fn(&T) -> u8,
    variants: u8,
) {
    let mut seen = BTreeSet::new();
    for (value, bytes) in values.iter().zip(encoded) {
        assert_eq!(bytes[0], expected(value), "{value:?}");
        seen.insert(bytes[0]);
    }
    assert_eq!(
        seen,
        (0..variants).collect(),
        "the corpus has every variant"
    );
}

/// Golden variant indexes: a peer of another build reads a message by its position.
#[test]
fn messages_keep_their_variant_indexes() {
    keeps_variant_indexes(
        &requests(),
        &REQUESTS,
        |request| match request {
            RpcRequest::Hello {} => 0,
            RpcRequest::Write { .. } | RpcRequest::Forwarded(Forwarded::Write(_)) => 1,
            RpcRequest::Query { .. } | RpcRequest::Forwarded(Forwarded::Query(_)) => 2,
            RpcRequest::Renew { .. } | RpcRequest::Forwarded(Forwarded::Renew(_)) => 3,
            RpcRequest::Join { .. } | RpcRequest::Forwarded(Forwarded::Join(_)) => 4,
            RpcRequest::Status {} => 5,
            RpcRequest::Operator { .. } | RpcRequest::Forwarded(Forwarded::Operator(_)) => 6,
            RpcRequest::WriteAs { .. } => 7,
            RpcRequest::QueryAs { .. } => 8,
            RpcRequest::RenewAs { .. } => 9,
            RpcRequest::OperatorAs { .. } => 10,
        },
        11,
    );
    keeps_variant_indexes(
        &responses(),
        &RESPONSES,
        |response| match response {
            RpcResponse::Hello(_) => 0,
            RpcResponse::Write(_) => 1,
            RpcResponse::Query(_) => 2,
            RpcResponse::Renew(_) => 3,
            RpcResponse::Join(_) => 4,
            RpcResponse::Status(_) => 5,
            RpcResponse::Operator(_) => 6,
            RpcResponse::Refused(_) => 7,
        },
        8,
    );
    let operator = [
        OperatorRequest::RemovePeer(PeerRef::Id(2)),
        OperatorRequest::TransferLeader { to: None },
        OperatorRequest::AutopilotHealth,
        OperatorRequest::SnapshotSave,
        OperatorRequest::SnapshotRestore(vec![1, 2, 3]),
        OperatorRequest::AutopilotGet,
        OperatorRequest::AutopilotSet {
            config: AutopilotConfig::default(),
            cas: Some(7),
        },
    ];
    keeps_variant_indexes(
        &operator,
        &encode_all(operator.to_vec()),
        |request| match request {
            OperatorRequest::RemovePeer(_) => 0,
            OperatorRequest::TransferLeader { .. } => 1,
            OperatorRequest::AutopilotHealth => 2,
            OperatorRequest::SnapshotSave => 3,
            OperatorRequest::SnapshotRestore(_) => 4,
            OperatorRequest::AutopilotGet => 5,
            OperatorRequest::AutopilotSet { .. } => 6,
        },
        7,
    );
    keeps_variant_indexes(
        &peer_requests(),
        &PEER_REQUESTS,
        |request| match request {
            PeerRequest::AppendEntries(_) => 0,
            PeerRequest::Vote(_) => 1,
            PeerRequest::InstallSnapshot(_) => 2,
            PeerRequest::Campaign => 3,
            PeerRequest::PreVote(_) => 4,
        },
        5,
    );
    keeps_variant_indexes(
        &peer_responses(),
        &PEER_RESPONSES,
        |response| match response {
            PeerResponse::AppendEntries(_) => 0,
            PeerResponse::Vote(_) => 1,
            PeerResponse::InstallSnapshot(_) => 2,
            PeerResponse::Undecodable(_) => 3,
            PeerResponse::Campaign(_) => 4,
            PeerResponse::PreVote(_) => 5,
        },
        6,
    );
}
