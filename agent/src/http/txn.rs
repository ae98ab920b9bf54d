//! `PUT /v1/txn`: up to 128 ops applied all-or-nothing through raft. KV ops alone are answered
//! from state without raft when every op is a read; `Node`, `Service` and `Check` ops (Consul's
//! `get`, `set`, `cas`, `delete`, `delete-cas`) make a catalog transaction, always applied
//! through raft.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;
use serde_json::{Value, json as json_value};
use std::collections::BTreeMap;
use vigil_shared::acl::authz::{Access, Resource};

use vigil_shared::api::{DirEntry, decode_case_insensitive};
use vigil_shared::catalog::{Check, Node, Service};
use vigil_shared::kv::{KvOp, TxnOutcome};
use vigil_shared::rpc::{reads, writes};
use vigil_shared::txn::{CatalogTxnOutcome, CatalogVerb, TxnOp, TxnResult};
use vigil_shared::{KV_MAX_VALUE_SIZE, TXN_MAX_OPS};

use super::acl::{Authz, check_session_write};
use super::body::{Limit, read};
use super::catalog::{CheckBody, OPAQUE, ServiceBody, to_check, to_service};
use super::error::ApiError;
use super::limits;
use super::params::Params;
use super::shapes::{CheckJson, NodeJson, ServiceJson};
use super::{AppState, Ctx, json, set_leader_headers};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TxnOpBody {
    kv: Option<TxnKvBody>,
    node: Option<TxnNodeBody>,
    service: Option<TxnServiceBody>,
    check: Option<TxnCheckBody>,
}

/// A `Node` op; the node's own fields are read as `/v1/catalog/register` reads them.
#[derive(Debug, Deserialize)]
struct TxnNodeBody {
    #[serde(default)]
    verb: String,
    #[serde(default)]
    node: NodeBody,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NodeBody {
    id: String,
    node: String,
    address: String,
    taggedaddresses: BTreeMap<String, String>,
    meta: BTreeMap<String, String>,
    modifyindex: u64,
}

#[derive(Debug, Deserialize)]
struct TxnServiceBody {
    #[serde(default)]
    verb: String,
    #[serde(default)]
    node: String,
    #[serde(default)]
    service: ServiceBody,
}

#[derive(Debug, Deserialize)]
struct TxnCheckBody {
    #[serde(default)]
    verb: String,
    #[serde(default)]
    check: CheckBody,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TxnKvBody {
    verb: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    index: u64,
    #[serde(default)]
    session: String,
    /// Enterprise fields, accepted and ignored (Vigil has one namespace and partition).
    #[serde(default, rename = "namespace")]
    _namespace: Option<String>,
    #[serde(default, rename = "partition")]
    _partition: Option<String>,
}

/// One op's pre-check failure (reported like an apply failure, before raft is touched).
pub(super) struct PreError {
    op_index: usize,
    what: String,
}

fn to_op(body: TxnKvBody, value: Vec<u8>) -> Result<KvOp, String> {
    let TxnKvBody {
        verb,
        key,
        flags,
        index,
        session,
        ..
    } = body;
    Ok(match verb.as_str() {
        "set" => KvOp::Set { key, value, flags },
        "cas" => KvOp::Cas {
            key,
            value,
            flags,
            index,
        },
        "lock" => KvOp::Lock {
            key,
            value,
            flags,
            session,
        },
        "unlock" => KvOp::Unlock {
            key,
            value,
            flags,
            session,
        },
        "get" => KvOp::Get { key },
        "get-or-empty" => KvOp::GetOrEmpty { key },
        "get-tree" => KvOp::GetTree { prefix: key },
        "check-index" => KvOp::CheckIndex { key, index },
        "check-session" => KvOp::CheckSession { key, session },
        "check-not-exists" => KvOp::CheckNotExists { key },
        "delete" => KvOp::Delete { key },
        "delete-tree" => KvOp::DeleteTree { prefix: key },
        "delete-cas" => KvOp::DeleteCas { key, index },
        other => return Err(format!("unknown KV operation: {other}")),
    })
}

/// A catalog op's verb, or Consul's text for an unknown one (`what` names the kind as Consul's
/// message does).
fn catalog_verb(verb: &str, what: &str) -> Result<CatalogVerb, String> {
    CatalogVerb::parse(verb).ok_or_else(|| format!("unknown {what} verb {verb:?}"))
}

/// A `Node`, `Service` or `Check` op; a `get` or delete needs only the names, a write the whole
/// definition (validated as `/v1/catalog/register` validates it).
fn catalog_op(op: TxnOpBody) -> Result<Result<TxnOp, String>, ApiError> {
    if let Some(body) = op.node {
        let verb = match catalog_verb(&body.verb, "Node") {
            Ok(verb) => verb,
            Err(what) => return Ok(Err(what)),
        };
        let n = body.node;
        if verb.is_write() {
            limits::name("Node", &n.node)?;
            limits::meta("Invalid NodeMeta: ", &n.meta)?;
        }
        let node = Node {
            name: n.node,
            id: n.id,
            address: n.address,
            tagged_addresses: n.taggedaddresses,
            meta: n.meta,
            create_index: 0,
            modify_index: n.modifyindex,
        };
        return Ok(Ok(TxnOp::Node { verb, node }));
    }
    if let Some(body) = op.service {
        let verb = match catalog_verb(&body.verb, "Service") {
            Ok(verb) => verb,
            Err(what) => return Ok(Err(what)),
        };
        let modify_index = body.service.modifyindex;
        let mut service = if matches!(verb, CatalogVerb::Set | CatalogVerb::Cas) {
            to_service(&body.node, body.service)?
        } else {
            Service {
                node: body.node,
                id: body.service.id,
                ..Service::default()
            }
        };
        service.modify_index = modify_index;
        return Ok(Ok(TxnOp::Service { verb, service }));
    }
    let Some(body) = op.check else {
        return Err(ApiError::bad_request(
            "Failed to parse body: an operation has no KV, Node, Service or Check field",
        ));
    };
    let verb = match catalog_verb(&body.verb, "CheckOp") {
        Ok(verb) => verb,
        Err(what) => return Ok(Err(what)),
    };
    let modify_index = body.check.modifyindex;
    let service_name = body.check.servicename.clone();
    let mut check = if matches!(verb, CatalogVerb::Set | CatalogVerb::Cas) {
        let node = body.check.node.clone();
        to_check(&node, body.check)?
    } else {
        Check {
            node: body.check.node,
            check_id: body.check.checkid,
            ..Check::default()
        }
    };
    check.modify_index = modify_index;
    // Only for the ACL check of a service check (the catalog fills the name in itself).
    check.service_name = service_name;
    Ok(Ok(TxnOp::Check { verb, check }))
}

/// Decodes a txn body: the ops, or the ops' pre-check failures (a 409), or a 400 or 413.
pub(super) fn parse_ops(body: &[u8]) -> Result<Result<Vec<TxnOp>, Vec<PreError>>, ApiError> {
    let parse_err = |e: String| ApiError::bad_request(format!("Failed to parse body: {e}"));
    let raw: Vec<TxnOpBody> =
        decode_case_insensitive(body, OPAQUE).map_err(|e| parse_err(e.to_string()))?;
    if raw.len() > TXN_MAX_OPS {
        return Err(ApiError::too_large(format!(
            "Transaction contains too many operations ({} > {TXN_MAX_OPS})",
            raw.len()
        )));
    }
    let mut ops = Vec::with_capacity(raw.len());
    let mut errors = Vec::new();
    for (op_index, op) in raw.into_iter().enumerate() {
        let Some(kv) = op.kv else {
            if op.node.is_none() && op.service.is_none() && op.check.is_none() {
                return Err(parse_err(format!("operation {op_index} has no KV field")));
            }
            match catalog_op(op)? {
                Ok(op) => ops.push(op),
                Err(what) => errors.push(PreError { op_index, what }),
            }
            continue;
        };
        let value = kv
            .value
            .as_deref()
            .map_or(Ok(Vec::new()), |v| BASE64.decode(v))
            .map_err(|e| parse_err(format!("operation {op_index}: Value: {e}")))?;
        if value.len() > KV_MAX_VALUE_SIZE {
            return Err(ApiError::too_large(format!(
                "Value for key \"{}\" is too large ({} > {KV_MAX_VALUE_SIZE} bytes)",
                kv.key,
                value.len()
            )));
        }
        match to_op(kv, value) {
            Ok(op) => ops.push(TxnOp::Kv(op)),
            Err(what) => errors.push(PreError { op_index, what }),
        }
    }
    Ok(if errors.is_empty() {
        Ok(ops)
    } else {
        Err(errors)
    })
}

fn conflict(errors: Vec<(usize, String)>) -> Response {
    let errors: Vec<Value> = errors
        .into_iter()
        .map(|(i, what)| json_value!({ "OpIndex": i, "What": what }))
        .collect();
    (
        StatusCode::CONFLICT,
        [(header::CONTENT_TYPE, "application/json")],
        json_value!({ "Results": null, "Errors": errors }).to_string(),
    )
        .into_response()
}

fn render(params: &Params, outcome: TxnOutcome) -> Response {
    match outcome {
        TxnOutcome::Committed(entries) => {
            let results: Vec<Value> = entries
                .iter()
                .map(|e| json_value!({ "KV": DirEntry::from_entry(e) }))
                .collect();
            json(params, &json_value!({ "Results": results, "Errors": null }))
        }
        TxnOutcome::RolledBack(errors) => conflict(
            errors
                .into_iter()
                .map(|e| (e.op_index, e.error.to_string()))
                .collect(),
        ),
    }
}

/// What each op needs of the token, as Consul vets a transaction before applying it: writes
/// need `key:write` (a tree delete on the whole prefix; a lock or unlock also `session:write`
/// on the session's node), reads `key:read`, checks both. A refused op is a 409 error.
async fn vet(state: &AppState, authz: &Authz, ops: &[KvOp]) -> Vec<(usize, String)> {
    let mut errors = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let key = op.key();
        let verdict = match op {
            KvOp::DeleteTree { .. } => authz.0.check_key_write_prefix(key).map_err(ApiError::from),
            KvOp::Get { .. } | KvOp::GetOrEmpty { .. } => {
                authz.check(Resource::Key, Access::Read, key)
            }
            KvOp::GetTree { .. } => Ok(()),
            KvOp::CheckIndex { .. } | KvOp::CheckSession { .. } | KvOp::CheckNotExists { .. } => {
                authz
                    .check(Resource::Key, Access::Read, key)
                    .and_then(|()| authz.check(Resource::Key, Access::Write, key))
            }
            KvOp::Lock { session, .. } | KvOp::Unlock { session, .. } => {
                match authz.check(Resource::Key, Access::Write, key) {
                    Ok(()) => check_session_write(state, authz, session).await,
                    Err(e) => Err(e),
                }
            }
            KvOp::Set { .. } | KvOp::Cas { .. } | KvOp::Delete { .. } | KvOp::DeleteCas { .. } => {
                authz.check(Resource::Key, Access::Write, key)
            }
        };
        if let Err(e) = verdict {
            errors.push((i, e.message));
        }
    }
    errors
}

/// What a catalog op needs of the token, as Consul vets it: a write needs `node:write` on the
/// node, `service:write` on the service (a service check's too); reads are filtered instead.
fn vet_catalog(authz: &Authz, op: &TxnOp) -> Result<(), ApiError> {
    match op {
        TxnOp::Kv(_) => Ok(()),
        TxnOp::Node { verb, node } if verb.is_write() => {
            authz.check(Resource::Node, Access::Write, &node.name)
        }
        TxnOp::Service { verb, service } if verb.is_write() => {
            authz.check(Resource::Service, Access::Write, &service.name)
        }
        TxnOp::Check { verb, check } if verb.is_write() => {
            super::catalog::check_serf_health_write(authz, &check.check_id)?;
            if check.service_id.is_empty() {
                authz.check(Resource::Node, Access::Write, &check.node)
            } else {
                authz.check(Resource::Service, Access::Write, &check.service_name)
            }
        }
        TxnOp::Node { .. } | TxnOp::Service { .. } | TxnOp::Check { .. } => Ok(()),
    }
}

/// Whether the token may read a catalog transaction's result (Consul filters the others out).
fn readable(authz: &Authz, result: &TxnResult) -> bool {
    match result {
        TxnResult::Kv(e) => authz.allows(Resource::Key, Access::Read, &e.key),
        TxnResult::Node(n) => authz.allows(Resource::Node, Access::Read, &n.name),
        TxnResult::Service(s) => authz.allows(Resource::Service, Access::Read, &s.name),
        TxnResult::Check(c) => {
            authz.allows(Resource::Node, Access::Read, &c.node)
                && (c.service_id.is_empty()
                    || authz.allows(Resource::Service, Access::Read, &c.service_name))
        }
    }
}

/// `null` for an empty map or list, as Go writes the nil one Consul keeps.
fn nil_if_empty(value: &mut Value) {
    let empty = match value {
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    };
    if empty {
        *value = Value::Null;
    }
}

/// A node as a transaction answers it: as stored, so no tagged addresses filled in from its
/// address, and `null` for none (Consul's state store entry, not its catalog endpoint's view).
fn stored_node(n: &Node) -> Value {
    let mut json = json_value!(NodeJson::new(n));
    json["TaggedAddresses"] = json_value!(n.tagged_addresses);
    nil_if_empty(&mut json["TaggedAddresses"]);
    nil_if_empty(&mut json["Meta"]);
    json
}

/// A check as a transaction answers it (`ServiceTags` `null` when there are none).
fn stored_check(c: &Check) -> Value {
    let mut json = json_value!(CheckJson::new(c));
    nil_if_empty(&mut json["ServiceTags"]);
    json
}

/// A catalog transaction: vetted op by op (KV as [`vet`] does), then applied through raft.
async fn catalog_txn(cx: &Ctx, ops: Vec<TxnOp>) -> Result<Response, ApiError> {
    let (kv_indexes, kv_ops): (Vec<usize>, Vec<KvOp>) = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            TxnOp::Kv(op) => Some((i, op.clone())),
            _ => None,
        })
        .unzip();
    let mut denied: Vec<(usize, String)> = vet(&cx.state, &cx.authz, &kv_ops)
        .await
        .into_iter()
        .map(|(i, what)| (kv_indexes[i], what))
        .collect();
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = vet_catalog(&cx.authz, op) {
            denied.push((i, e.message));
        }
    }
    if !denied.is_empty() {
        denied.sort_by_key(|(i, _)| *i);
        return Ok(conflict(denied));
    }
    match cx.state.backend.write(writes::Txn(ops)).await? {
        CatalogTxnOutcome::RolledBack(failures) => Ok(conflict(
            failures.into_iter().map(|f| (f.op_index, f.what)).collect(),
        )),
        CatalogTxnOutcome::Committed(results) => {
            let results: Vec<Value> = results
                .iter()
                .filter(|r| readable(&cx.authz, r))
                .map(|r| match r {
                    TxnResult::Kv(e) => json_value!({ "KV": DirEntry::from_entry(e) }),
                    TxnResult::Node(n) => json_value!({ "Node": stored_node(n) }),
                    TxnResult::Service(s) => json_value!({ "Service": ServiceJson::new(s) }),
                    TxnResult::Check(c) => json_value!({ "Check": stored_check(c) }),
                })
                .collect();
            Ok(json(
                &cx.params,
                &json_value!({ "Results": results, "Errors": null }),
            ))
        }
    }
}

/// Leaves out of a committed transaction's results the entries the token may not read.
fn filter_results(authz: &Authz, outcome: TxnOutcome) -> TxnOutcome {
    match outcome {
        TxnOutcome::Committed(entries) => TxnOutcome::Committed(
            entries
                .into_iter()
                .filter(|e| authz.allows(Resource::Key, Access::Read, &e.key))
                .collect(),
        ),
        rolled_back => rolled_back,
    }
}

pub async fn txn(cx: Ctx, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read(&headers, body, Limit::Txn).await?;
    let ops = match parse_ops(&body)? {
        Ok(ops) => ops,
        Err(errors) => {
            return Ok(conflict(
                errors.into_iter().map(|e| (e.op_index, e.what)).collect(),
            ));
        }
    };
    let ops = match ops
        .iter()
        .map(|op| match op {
            TxnOp::Kv(op) => Some(op.clone()),
            _ => None,
        })
        .collect::<Option<Vec<KvOp>>>()
    {
        Some(kv_ops) => kv_ops,
        None => return catalog_txn(&cx, ops).await,
    };
    let denied = vet(&cx.state, &cx.authz, &ops).await;
    if !denied.is_empty() {
        return Ok(conflict(denied));
    }
    if ops.iter().all(|op| !op.is_write()) {
        let mut opts = cx.params.query_options()?;
        opts.min_index = 0;
        let (outcome, meta) = cx.state.backend.read(opts, reads::Txn { ops }).await?;
        let mut response = render(&cx.params, filter_results(&cx.authz, outcome));
        set_leader_headers(response.headers_mut(), meta);
        return Ok(response);
    }
    let outcome = cx.state.backend.write(writes::Kv(ops)).await?;
    Ok(render(&cx.params, filter_results(&cx.authz, outcome)))
}
