//! Fuzzing of the HTTP API's request decoding, called directly (no sockets, no server): query
//! strings ([`Params`]), URL paths ([`decode_path`]), the JSON shape limits every body passes
//! ([`limits::json_shape`]), and the case-insensitive body decoders of session create, txn,
//! catalog register, agent check and service definitions, check updates and prepared queries.
//!
//! Each body decoder gets bodies built from a [`Shape`] of what it reads (every member in any
//! spelling Go's decoder accepts, values of the right type or of any other, unknown members),
//! the bytes of such bodies mutated, and arbitrary bytes. A decoder must not panic, must refuse
//! with a client error (400 or 413, never a 5xx), and what it accepts must be within the limits
//! README.md lists. Requests through the router itself are in `tests.rs` (on the in-memory
//! servers) and in the integration tests.

use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::strategy::Union;
use serde_json::{Map, Number, Value, json};
use vigil_shared::txn::TxnOp;
use vigil_shared::{KV_MAX_VALUE_SIZE, SESSION_TTL_MAX_NS, TXN_MAX_OPS};

use super::error::ApiError;
use super::limits::{self, DEPTH_MAX, ITEMS_MAX, NAME_MAX, STRING_MAX};
use super::params::{Params, decode_path};
use super::{catalog, query, session, txn};
use crate::local::definition::{
    DEFAULT_OUTPUT_MAX, DefinitionError, parse_check_body, parse_check_update, parse_service_body,
};
use vigil_shared::go::strconv::parse_uint;

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/// What a decoder reads, to build bodies that reach past its first check.
#[derive(Debug)]
enum Shape {
    /// A string, usually one of these.
    Str(&'static [&'static str]),
    Num,
    Bool,
    /// A free-form string map (`Meta`, `NodeMeta`, ...): keys kept as sent.
    Map,
    List(&'static Shape),
    /// An object whose members are each there or not (about three of them), named as Consul
    /// documents them, and now and then an unknown member.
    Obj(&'static [(&'static str, Shape)]),
    /// An object whose members are almost always there (what the decoder requires).
    Req(&'static [(&'static str, Shape)]),
    /// The members of several objects together.
    Merge(&'static [Shape]),
    OneOf(&'static [Shape]),
}

const NAMES: &[&str] = &[
    "",
    "web",
    "node1",
    "serfHealth",
    "service:web",
    "a/b",
    "é",
    " ",
];
const DURATIONS: &[&str] = &[
    "",
    "0",
    "0s",
    "15s",
    "1m30s",
    "250ms",
    "1h",
    "24h",
    "25h",
    "-1s",
    "10z",
    ".5s",
    "1.5h",
    "9223372036854775807ns",
    "9223372036854775808ns",
    "0.999999999999999999999999999999h",
];
const GOOD_DURATIONS: &[&str] = &["15s", "1m30s", "10s", "1h", "24h", "0.5s"];
const STATUSES: &[&str] = &[
    "",
    "passing",
    "warning",
    "critical",
    "maintenance",
    "Passing",
];
const VERBS: &[&str] = &[
    "set",
    "cas",
    "lock",
    "unlock",
    "get",
    "get-or-empty",
    "get-tree",
    "check-index",
    "check-session",
    "check-not-exists",
    "delete",
    "delete-tree",
    "delete-cas",
    "SET",
    "",
];
const BASE64: &[&str] = &["", "dg==", "aGVsbG8=", "!!", "dg", "===="];
const ADDRESSES: &[&str] = &[
    "",
    "127.0.0.1",
    "0.0.0.0",
    "[::]",
    "::",
    "10.0.0.1:80",
    "http://127.0.0.1:1/",
    "https://x/",
    "HTTPS://é/",
    "localhost:0",
];

const STR: Shape = Shape::Str(NAMES);
const NAME: Shape = Shape::Str(&["web", "node1", "db-2", "é"]);
const STRS: Shape = Shape::List(&STR);
const DURATION: Shape = Shape::OneOf(&[Shape::Str(DURATIONS), Shape::Num]);
const GOOD_DURATION: Shape = Shape::OneOf(&[
    Shape::Str(GOOD_DURATIONS),
    Shape::Str(DURATIONS),
    Shape::Num,
]);

const SESSION: Shape = Shape::Obj(&[
    ("Node", STR),
    ("Name", STR),
    ("LockDelay", DURATION),
    ("Behavior", Shape::Str(&["", "release", "delete", "Delete"])),
    ("TTL", Shape::Str(DURATIONS)),
    ("Checks", STRS),
    ("NodeChecks", STRS),
    (
        "ServiceChecks",
        Shape::List(&Shape::Obj(&[("ID", STR), ("Namespace", STR)])),
    ),
]);

const TXN_KV: Shape = Shape::Merge(&[
    Shape::Req(&[
        ("Verb", Shape::Str(VERBS)),
        ("Key", Shape::Str(&["a", "a/b", "é/ü", ""])),
    ]),
    Shape::Obj(&[
        ("Value", Shape::Str(BASE64)),
        ("Flags", Shape::Num),
        ("Index", Shape::Num),
        ("Session", STR),
        ("Namespace", STR),
        ("Partition", STR),
    ]),
]);

const TXN: Shape = Shape::List(&Shape::OneOf(&[
    Shape::Req(&[("KV", TXN_KV)]),
    Shape::Obj(&[
        ("KV", TXN_KV),
        ("Node", Shape::Map),
        ("Service", Shape::Map),
        ("Check", Shape::Map),
    ]),
]));

const CATALOG_CHECK: Shape = Shape::Merge(&[
    Shape::Req(&[("CheckID", NAME)]),
    Shape::Obj(&[
        ("Node", STR),
        ("Name", STR),
        ("Status", Shape::Str(STATUSES)),
        ("Notes", STR),
        ("Output", STR),
        ("ServiceID", STR),
        ("Type", Shape::Str(&["", "ttl", "http"])),
        ("Definition", Shape::Map),
    ]),
]);

const WEIGHTS: Shape = Shape::Obj(&[("Passing", Shape::Num), ("Warning", Shape::Num)]);

const REGISTER: Shape = Shape::Merge(&[
    Shape::Req(&[("Node", NAME), ("Address", Shape::Str(ADDRESSES))]),
    Shape::Obj(&[
        ("ID", STR),
        ("TaggedAddresses", Shape::Map),
        ("NodeMeta", Shape::Map),
        (
            "Service",
            Shape::Merge(&[
                Shape::Req(&[("Service", NAME)]),
                Shape::Obj(&[
                    ("ID", STR),
                    ("Tags", STRS),
                    ("Address", Shape::Str(ADDRESSES)),
                    ("Port", Shape::Num),
                    ("Meta", Shape::Map),
                    ("Weights", WEIGHTS),
                    ("EnableTagOverride", Shape::Bool),
                ]),
            ]),
        ),
        ("Check", CATALOG_CHECK),
        ("Checks", Shape::List(&CATALOG_CHECK)),
        ("SkipNodeUpdate", Shape::Bool),
    ]),
]);

/// Members any check may have besides the ones that make its type.
const CHECK_EXTRAS: Shape = Shape::Obj(&[
    ("ID", STR),
    ("CheckID", STR),
    ("Notes", STR),
    ("ServiceID", STR),
    ("Token", STR),
    ("Status", Shape::Str(STATUSES)),
    ("Timeout", DURATION),
    ("DeregisterCriticalServiceAfter", DURATION),
    ("SuccessBeforePassing", Shape::Num),
    ("FailuresBeforeWarning", Shape::Num),
    ("FailuresBeforeCritical", Shape::Num),
    ("OutputMaxSize", Shape::Num),
]);

/// Every member a check definition may carry, each rarely.
const CHECK_ANY: Shape = Shape::Obj(&[
    ("Name", STR),
    ("ScriptArgs", STRS),
    ("Args", STRS),
    ("HTTP", Shape::Str(ADDRESSES)),
    (
        "Header",
        Shape::Obj(&[("X-Custom", STRS), ("accept", STRS)]),
    ),
    ("Method", Shape::Str(&["", "GET", "POST"])),
    ("Body", STR),
    ("DisableRedirects", Shape::Bool),
    ("TCP", Shape::Str(ADDRESSES)),
    ("TCPUseTLS", Shape::Bool),
    ("UDP", Shape::Str(ADDRESSES)),
    ("Interval", DURATION),
    ("TTL", DURATION),
    ("DockerContainerID", STR),
    ("Shell", STR),
    ("GRPC", Shape::Str(ADDRESSES)),
    ("GRPCUseTLS", Shape::Bool),
    ("H2PING", Shape::Str(ADDRESSES)),
    ("H2PingUseTLS", Shape::Bool),
    ("OSService", STR),
    ("TLSServerName", STR),
    ("TLSSkipVerify", Shape::Bool),
    ("AliasNode", STR),
    ("AliasService", STR),
]);

/// A check of each type Vigil runs (what makes the type always there), or anything at all.
const CHECK: Shape = Shape::OneOf(&[
    Shape::Merge(&[
        Shape::Req(&[("Name", NAME), ("TTL", GOOD_DURATION)]),
        CHECK_EXTRAS,
    ]),
    Shape::Merge(&[
        Shape::Req(&[
            ("Name", NAME),
            ("HTTP", Shape::Str(ADDRESSES)),
            ("Interval", GOOD_DURATION),
        ]),
        Shape::Obj(&[
            (
                "Header",
                Shape::Obj(&[("X-Custom", STRS), ("accept", STRS)]),
            ),
            ("Method", Shape::Str(&["", "GET", "POST"])),
            ("Body", STR),
            ("DisableRedirects", Shape::Bool),
            ("TLSServerName", STR),
            ("TLSSkipVerify", Shape::Bool),
        ]),
        CHECK_EXTRAS,
    ]),
    Shape::Merge(&[
        Shape::Req(&[
            ("Name", NAME),
            ("TCP", Shape::Str(ADDRESSES)),
            ("Interval", GOOD_DURATION),
        ]),
        CHECK_EXTRAS,
    ]),
    Shape::Merge(&[
        Shape::Req(&[("Name", NAME), ("Args", STRS), ("Interval", GOOD_DURATION)]),
        CHECK_EXTRAS,
    ]),
    Shape::Merge(&[CHECK_ANY, CHECK_EXTRAS]),
]);

const SERVICE: Shape = Shape::Merge(&[
    Shape::Req(&[("Name", NAME)]),
    Shape::Obj(&[
        ("Kind", Shape::Str(&["", "connect-proxy"])),
        ("ID", STR),
        ("Tags", STRS),
        ("Address", Shape::Str(ADDRESSES)),
        ("TaggedAddresses", Shape::Map),
        ("Meta", Shape::Map),
        ("Port", Shape::Num),
        ("SocketPath", STR),
        ("Check", CHECK),
        ("Checks", Shape::List(&CHECK)),
        ("Weights", WEIGHTS),
        ("Token", STR),
        ("EnableTagOverride", Shape::Bool),
        ("Proxy", Shape::Map),
        ("Connect", Shape::Map),
        ("Locality", Shape::Map),
    ]),
]);

const CHECK_UPDATE: Shape = Shape::Merge(&[
    Shape::Req(&[("Status", Shape::Str(STATUSES))]),
    Shape::Obj(&[("Output", STR)]),
]);

const QUERY: Shape = Shape::Merge(&[
    Shape::Req(&[
        ("Name", STR),
        (
            "Service",
            Shape::Merge(&[
                Shape::Req(&[("Service", NAME)]),
                Shape::Obj(&[
                    ("Tags", STRS),
                    ("OnlyPassing", Shape::Bool),
                    ("Near", STR),
                    ("NodeMeta", Shape::Map),
                    ("ServiceMeta", Shape::Map),
                    (
                        "Failover",
                        Shape::Obj(&[("NearestN", Shape::Num), ("Datacenters", STRS)]),
                    ),
                ]),
            ]),
        ),
    ]),
    Shape::Obj(&[
        ("Session", STR),
        ("Token", STR),
        ("DNS", Shape::Obj(&[("TTL", Shape::Str(DURATIONS))])),
    ]),
]);

/// A short string of any characters.
fn any_string() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..8).prop_map(String::from_iter)
}

fn number() -> impl Strategy<Value = Value> {
    let float = select(vec![
        0.5, 2.9, -1.5, 65535.0, 65536.0, 9.3e18, -9.3e18, 1e19, 1e30,
    ])
    .prop_map(|f| Value::Number(Number::from_f64(f).expect("finite")));
    prop_oneof![
        3 => (-5i64..2000).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => float,
    ]
}

/// A value of any JSON type, for a member that expects another.
fn junk() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number(),
        any_string().prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
        Just(json!([1, "x", null])),
    ]
}

/// A member name as some client may spell it: as documented, lowercase, uppercase or
/// snake_case (`DeregisterCriticalServiceAfter`, `deregister_critical_service_after`).
fn spelling(name: &'static str) -> impl Strategy<Value = String> {
    let snake = || {
        let mut out = String::new();
        for (i, c) in name.char_indices() {
            if i > 0 && c.is_ascii_uppercase() {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    };
    prop_oneof![
        4 => Just(name.to_owned()),
        2 => Just(name.to_ascii_lowercase()),
        1 => Just(name.to_ascii_uppercase()),
        1 => Just(snake()),
    ]
}

fn string_map() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        3 => select(vec!["env", "rack", "Key", "consul-x", "bad key!", ""]).prop_map(str::to_owned),
        1 => Just("k".repeat(129)),
        1 => any_string(),
    ];
    let value = prop_oneof![
        3 => select(vec!["prod", "", "10.0.0.1"]).prop_map(Value::from),
        1 => Just(Value::from("v".repeat(513))),
        1 => junk(),
    ];
    vec((key, value), 0..4).prop_map(|members| Value::Object(members.into_iter().collect()))
}

/// Bodies of `shape`: its members each present or not, their values of the expected kind
/// mostly, and now and then an unknown member.
fn shaped(shape: &'static Shape) -> BoxedStrategy<Value> {
    match shape {
        Shape::Str(choices) => prop_oneof![
            4 => select(choices.to_vec()).prop_map(Value::from),
            1 => any_string().prop_map(Value::from),
        ]
        .boxed(),
        Shape::Num => number().boxed(),
        Shape::Bool => any::<bool>().prop_map(Value::from).boxed(),
        Shape::Map => string_map().boxed(),
        Shape::List(item) => vec(shaped(item), 0..4).prop_map(Value::Array).boxed(),
        Shape::OneOf(shapes) => Union::new(shapes.iter().map(shaped)).boxed(),
        Shape::Obj(members) => {
            // About three members of a big object, more of a small one.
            let present = (3.0 / members.len() as f64).clamp(0.2, 0.6);
            let unknown = prop::option::weighted(0.1, (any_string(), junk()));
            (object(members, present), unknown)
                .prop_map(|(mut object, unknown)| {
                    object.extend(unknown);
                    Value::Object(object)
                })
                .boxed()
        }
        Shape::Req(members) => object(members, 0.95).prop_map(Value::Object).boxed(),
        Shape::Merge(shapes) => shapes
            .iter()
            .map(shaped)
            .collect::<Vec<_>>()
            .prop_map(|parts| {
                let members = parts.into_iter().flat_map(|part| match part {
                    Value::Object(members) => members,
                    _ => Map::new(),
                });
                Value::Object(members.collect())
            })
            .boxed(),
    }
}

/// The members of an object, each there with probability `present`, mostly of its shape.
fn object(
    members: &'static [(&'static str, Shape)],
    present: f64,
) -> impl Strategy<Value = Map<String, Value>> {
    members
        .iter()
        .map(|(name, shape)| {
            let value = prop_oneof![8 => shaped(shape), 1 => junk()];
            prop::option::weighted(present, (spelling(name), value))
        })
        .collect::<Vec<_>>()
        .prop_map(|members| members.into_iter().flatten().collect())
}

#[derive(Debug, Clone)]
enum Edit {
    Set(Index, u8),
    Insert(Index, u8),
    Remove(Index),
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop_oneof![
        select(b"{}[]\",:\\ 0-9eE.tfn\x00\xff".to_vec()),
        any::<u8>()
    ];
    prop_oneof![
        (any::<Index>(), byte.clone()).prop_map(|(at, b)| Edit::Set(at, b)),
        (any::<Index>(), byte).prop_map(|(at, b)| Edit::Insert(at, b)),
        any::<Index>().prop_map(Edit::Remove),
        any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn edited(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = bytes.len();
        match edit {
            Edit::Insert(at, b) => bytes.insert(at.index(len + 1), *b),
            _ if len == 0 => {}
            Edit::Set(at, b) => bytes[at.index(len)] = *b,
            Edit::Remove(at) => {
                bytes.remove(at.index(len));
            }
            Edit::Truncate(at) => bytes.truncate(at.index(len)),
        }
    }
    bytes
}

/// Bodies for a decoder reading `shape`: well-formed, mutated, or any bytes at all.
fn body(shape: &'static Shape) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => shaped(shape).prop_map(|v| v.to_string().into_bytes()),
        2 => (shaped(shape), vec(edit(), 1..4))
            .prop_map(|(v, edits)| edited(v.to_string().into_bytes(), &edits)),
        1 => vec(any::<u8>(), 0..48),
    ]
}

// ---------------------------------------------------------------------------------------------
// The decoders
// ---------------------------------------------------------------------------------------------

/// Consul's 500 texts for values its servers refuse (which real clients match on).
const CONSUL_500S: [&str; 10] = [
    "strconv.ParseUint: ",
    "Invalid Behavior setting '",
    "Must provide Node",
    "Must provide node",
    "Must provide address if SkipNodeUpdate is not set",
    "Must provide service name (Service.Service) when service ID is provided",
    "Checks must belong to the node being registered",
    "Invalid check status: '",
    "Missing check name",
    "Invalid prepared query: ",
];

/// A refusal is the client's fault (400, or 413 past a limit) or one of Consul's 500s for a
/// value its servers refuse; never anything else.
fn accepted<T>(result: Result<T, ApiError>) -> Result<Option<T>, TestCaseError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(e) => {
            let status = e.status.as_u16();
            let consul_500 = status == 500 && CONSUL_500S.iter().any(|p| e.message.starts_with(p));
            prop_assert!(
                status == 400 || status == 413 || consul_500,
                "{status}: {}",
                e.message
            );
            Ok(None)
        }
    }
}

/// What a route reading [`super::body::RequestBody`] does: the shape limits, then its decoder.
fn route<T>(body: &[u8], decode: impl FnOnce(&[u8]) -> Result<T, ApiError>) -> Result<T, ApiError> {
    limits::json_shape(body)?;
    decode(body)
}

fn definition<T>(result: Result<T, DefinitionError>) -> Result<T, ApiError> {
    result.map_err(ApiError::from)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn session_create_bodies(body in body(&SESSION)) {
        let min = Duration::from_secs(10);
        let decoded = route(&body, |b| session::build_session("agent-node", b));
        if let Some(s) = accepted(decoded)? {
            prop_assert!(!s.node.is_empty() && s.node.len() <= NAME_MAX);
            prop_assert!(s.name.len() <= NAME_MAX);
            // The servers' TTL check admits only TTLs in range.
            if vigil_shared::session::check_ttl(&s.ttl, min).is_ok() {
                let ttl = vigil_shared::go::duration::parse_go_duration_ns(&s.ttl).unwrap_or(0);
                prop_assert!(ttl == 0 || (10_000_000_000..=SESSION_TTL_MAX_NS as i64).contains(&ttl));
            }
        }
    }

    #[test]
    fn txn_bodies(body in body(&TXN)) {
        if let Some(parsed) = accepted(txn::parse_ops(&body))? {
            match parsed {
                Ok(ops) => {
                    prop_assert!(ops.len() <= TXN_MAX_OPS);
                    for op in &ops {
                        let value_len = match op {
                            TxnOp::Kv(vigil_shared::kv::KvOp::Set { value, .. })
                            | TxnOp::Kv(vigil_shared::kv::KvOp::Cas { value, .. })
                            | TxnOp::Kv(vigil_shared::kv::KvOp::Lock { value, .. })
                            | TxnOp::Kv(vigil_shared::kv::KvOp::Unlock { value, .. }) => value.len(),
                            _ => 0,
                        };
                        prop_assert!(value_len <= KV_MAX_VALUE_SIZE);
                    }
                }
                Err(pre_errors) => prop_assert!(!pre_errors.is_empty()),
            }
        }
    }

    #[test]
    fn catalog_register_bodies(body in body(&REGISTER)) {
        if let Some(reg) = accepted(route(&body, catalog::registration))? {
            prop_assert!(!reg.node.is_empty() && reg.node.len() <= NAME_MAX);
            prop_assert!(limits::meta("", &reg.node_meta).is_ok());
            if let Some(s) = &reg.service {
                prop_assert!(!s.name.is_empty() && s.name.len() <= NAME_MAX);
                prop_assert!(s.id.len() <= NAME_MAX && s.tags.iter().all(|t| t.len() <= NAME_MAX));
            }
            for c in &reg.checks {
                prop_assert!(!c.check_id.is_empty() && c.check_id.len() <= NAME_MAX);
                prop_assert_eq!(&c.node, &reg.node);
            }
        }
    }

    #[test]
    fn agent_check_definitions(body in body(&CHECK)) {
        let decoded = route(&body, |b| {
            let check = definition(parse_check_body(b))?;
            limits::check(&check)?;
            Ok(check)
        });
        if let Some(c) = accepted(decoded)? {
            prop_assert!(!c.name.is_empty() && !c.id.is_empty());
            prop_assert!((1..=DEFAULT_OUTPUT_MAX).contains(&c.output_max_size));
            prop_assert!(c.interval().is_none_or(|i| !i.is_zero()));
        }
    }

    #[test]
    fn agent_service_definitions(body in body(&SERVICE)) {
        if let Some(s) = accepted(route(&body, |b| definition(parse_service_body(b))))? {
            prop_assert!(!s.service.name.is_empty() && !s.service.id.is_empty());
            prop_assert!((1..=65535).contains(&s.service.weights.passing));
            for c in &s.checks {
                prop_assert_eq!(&c.service_id, &s.service.id);
                prop_assert!(!c.id.is_empty() && !c.name.is_empty());
            }
        }
    }

    #[test]
    fn check_update_bodies(body in body(&CHECK_UPDATE)) {
        accepted(route(&body, |b| definition(parse_check_update(b))))?;
    }

    #[test]
    fn prepared_query_bodies(body in body(&QUERY)) {
        if let Some(q) = accepted(route(&body, |b| query::parse("q1".to_owned(), b)))? {
            prop_assert!(!q.service.service.is_empty());
            prop_assert!(!q.name.is_empty() || !q.session.is_empty());
        }
    }
}

/// The generators reach past the first check: a well-formed body of each shape is accepted,
/// spelled as documented and in lowercase.
#[test]
fn well_formed_bodies_are_accepted() {
    fn both(body: Value) -> [Vec<u8>; 2] {
        let lower = body.to_string().to_ascii_lowercase();
        [body.to_string().into_bytes(), lower.into_bytes()]
    }
    for b in both(json!({"Name": "lock", "TTL": "15s", "Behavior": "delete", "LockDelay": 0})) {
        let s = session::build_session("n1", &b).expect("session");
        assert_eq!((s.node.as_str(), s.ttl.as_str()), ("n1", "15s"));
    }
    for b in both(json!([{"KV": {"Verb": "lock", "Key": "a", "Value": "dg==", "Session": "s"}}])) {
        assert!(matches!(txn::parse_ops(&b), Ok(Ok(ops)) if ops.len() == 1));
    }
    let register = json!({"Node": "n1", "Address": "10.0.0.1", "NodeMeta": {"Rack": "r1"},
        "Service": {"Service": "web", "Port": 80, "Weights": {"Passing": 2, "Warning": 1}},
        "Checks": [{"CheckID": "web", "Status": "passing", "Definition": {"HTTP": "x"}}]});
    for b in both(register) {
        assert!(
            catalog::registration(&b).is_ok(),
            "{}",
            String::from_utf8_lossy(&b)
        );
    }
    let check = json!({"Name": "web", "HTTP": "http://127.0.0.1/", "Interval": "10s",
        "Header": {"X-Custom": ["a"]}, "FailuresBeforeCritical": 2, "OutputMaxSize": 100});
    for b in both(check.clone()) {
        assert!(
            parse_check_body(&b).is_ok(),
            "{}",
            String::from_utf8_lossy(&b)
        );
    }
    let service = json!({"Name": "web", "Port": 80, "Meta": {"env": "prod"}, "Check": check,
        "Weights": {"Passing": 3, "Warning": 1}});
    for b in both(service) {
        assert!(
            parse_service_body(&b).is_ok(),
            "{}",
            String::from_utf8_lossy(&b)
        );
    }
    for b in both(json!({"Status": "passing", "Output": "ok"})) {
        assert!(parse_check_update(&b).is_ok());
    }
    let prepared = json!({"Name": "web", "Service": {"Service": "web", "Failover": {"NearestN": 2}},
        "DNS": {"TTL": "10s"}});
    for b in both(prepared) {
        assert!(query::parse("q1".to_owned(), &b).is_ok());
    }
}

// ---------------------------------------------------------------------------------------------
// JSON shape limits
// ---------------------------------------------------------------------------------------------

/// Whether `value` is within the shape limits, measured directly: nodes at most `DEPTH_MAX`
/// deep, strings at most `STRING_MAX` bytes, at most `ITEMS_MAX` entries or members, member
/// names at most `NAME_MAX` bytes.
fn within_shape_limits(value: &Value, depth: usize) -> bool {
    depth <= DEPTH_MAX
        && match value {
            Value::String(s) => s.len() <= STRING_MAX,
            Value::Array(items) => {
                items.len() <= ITEMS_MAX && items.iter().all(|v| within_shape_limits(v, depth + 1))
            }
            Value::Object(members) => {
                members.len() <= ITEMS_MAX
                    && members
                        .iter()
                        .all(|(k, v)| k.len() <= NAME_MAX && within_shape_limits(v, depth + 1))
            }
            _ => true,
        }
}

/// `1` inside `depth` arrays: a node `depth` deep.
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(1), |inner, _| json!([inner]))
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        8 => junk(),
        1 => Just(Value::from("x".repeat(STRING_MAX))),
        1 => Just(Value::from("x".repeat(STRING_MAX + 1))),
        1 => Just(Value::Array(vec![Value::Null; ITEMS_MAX + 1])),
        1 => Just(Value::Object(Map::from_iter([("k".repeat(NAME_MAX + 1), json!(1))]))),
        1 => (DEPTH_MAX - 2..DEPTH_MAX + 3).prop_map(nested),
    ];
    leaf.prop_recursive(40, 64, 3, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..3).prop_map(Value::Array),
            vec((any_string(), inner), 0..3)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// JSON is refused (with a 400) exactly when it breaks a limit; anything else passes to
    /// its decoder.
    #[test]
    fn json_shape_refuses_exactly_what_breaks_a_limit(value in any_json()) {
        let verdict = limits::json_shape(value.to_string().as_bytes());
        prop_assert_eq!(verdict.is_ok(), within_shape_limits(&value, 0));
        accepted(verdict)?;
    }

    #[test]
    fn json_shape_passes_anything_that_is_not_json(bytes in vec(any::<u8>(), 0..64)) {
        if serde_json::from_slice::<Value>(&bytes).is_err() {
            prop_assert!(limits::json_shape(&bytes).is_ok());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Query strings and paths
// ---------------------------------------------------------------------------------------------

const PARAM_NAMES: &[&str] = &[
    "index",
    "wait",
    "stale",
    "consistent",
    "flags",
    "cas",
    "acquire",
    "release",
    "recurse",
    "keys",
    "separator",
    "enable",
    "filter",
    "note",
    "pretty",
    "raw",
];
const PARAM_VALUES: &[&str] = &[
    "",
    "0",
    "1",
    "18446744073709551615",
    "18446744073709551616",
    "+5",
    "-1",
    "5s",
    "1600s",
    "0s",
    "10z",
    "true",
    "T",
    "maybe",
    "%FF",
    "%2",
    "%zz",
    "a+b",
    "a%20b",
    "=",
    "&",
];

fn query_string() -> impl Strategy<Value = String> {
    let name =
        prop_oneof![4 => select(PARAM_NAMES.to_vec()).prop_map(str::to_owned), 1 => any_string()];
    let value =
        prop_oneof![4 => select(PARAM_VALUES.to_vec()).prop_map(str::to_owned), 1 => any_string()];
    prop_oneof![
        4 => vec((name, prop::option::of(value)), 0..6).prop_map(|pairs| {
            pairs
                .into_iter()
                .map(|(k, v)| v.map_or(k.clone(), |v| format!("{k}={v}")))
                .collect::<Vec<_>>()
                .join("&")
        }),
        1 => any_string(),
    ]
}

/// Every byte percent-encoded.
fn percent_encoded(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Every parameter reader answers a value or a 400; blocking options stay within their
    /// limits; the sorted re-encoding reads back as the same parameters.
    #[test]
    fn query_strings(query in query_string()) {
        let params = Params::parse(Some(&query));
        if let Some(opts) = accepted(params.query_options())? {
            prop_assert!(opts.wait_ms <= 600_000 + 600_000 / 16);
            let index = params.get("index").filter(|v| !v.is_empty());
            prop_assert_eq!(opts.min_index, index.map_or(0, |v| v.parse().expect("accepted")));
        }
        for name in PARAM_NAMES {
            if let Some(Some(n)) = accepted(params.u64(name))? {
                prop_assert_eq!(params.get(name).map(str::parse::<u64>), Some(Ok(n)));
            }
            prop_assert_eq!(params.bool(name).is_ok(), params.get(name).is_none_or(|v| {
                v.is_empty() || vigil_shared::go::strconv::parse_bool(v).is_some()
            }));
        }
        let sorted = params.encoded_sorted();
        let reread = Params::parse(Some(&sorted));
        prop_assert_eq!(reread.encoded_sorted(), sorted);
        for name in PARAM_NAMES {
            prop_assert_eq!(reread.get(name), params.get(name));
        }
    }

    /// Go's `ParseUint` accepts what Rust's `u64` parser does, except a leading `+`.
    #[test]
    fn uints_parse_like_rust_without_a_plus(s in prop_oneof![
        select(PARAM_VALUES.to_vec()).prop_map(str::to_owned),
        vec(select(b"0123456789".to_vec()), 0..22)
            .prop_map(|digits| String::from_utf8(digits).expect("ASCII digits")),
        any_string(),
    ]) {
        let rust = s.parse::<u64>().ok().filter(|_| !s.starts_with('+'));
        prop_assert_eq!(parse_uint(&s).ok(), rust);
    }

    /// A path decodes to its bytes when they are UTF-8 and is refused (400) otherwise; an
    /// arbitrary path never panics.
    #[test]
    fn paths(raw in any_string(), bytes in vec(any::<u8>(), 0..16)) {
        let decoded = decode_path(&raw);
        prop_assert!(decoded.as_ref().map_or(true, |d| d.len() <= raw.len()));
        if !raw.contains('%') {
            prop_assert_eq!(decode_path(&raw), Ok(raw.clone()));
        }
        let decoded = decode_path(&percent_encoded(&bytes)).ok();
        prop_assert_eq!(decoded, String::from_utf8(bytes).ok());
    }
}
