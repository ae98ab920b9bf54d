//! `PUT /v1/txn`: up to 128 KV ops applied all-or-nothing through raft, or answered from state
//! without raft when every op is a read.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;
use serde_json::{Value, json as json_value};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::{DirEntry, decode_case_insensitive};
use vigil_shared::kv::{KvOp, TxnOutcome};
use vigil_shared::rpc::{reads, writes};
use vigil_shared::{KV_MAX_VALUE_SIZE, TXN_MAX_OPS};

use super::acl::{Authz, check_session_write};
use super::body::{Limit, read};
use super::error::ApiError;
use super::params::Params;
use super::{AppState, Ctx, json, set_leader_headers};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TxnOpBody {
    kv: Option<TxnKvBody>,
    node: Option<Value>,
    service: Option<Value>,
    check: Option<Value>,
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

/// Decodes a txn body: the ops, or the ops' pre-check failures (a 409), or a 400 or 413.
pub(super) fn parse_ops(body: &[u8]) -> Result<Result<Vec<KvOp>, Vec<PreError>>, ApiError> {
    let parse_err = |e: String| ApiError::bad_request(format!("Failed to parse body: {e}"));
    let raw: Vec<TxnOpBody> =
        decode_case_insensitive(body, &[]).map_err(|e| parse_err(e.to_string()))?;
    if raw.len() > TXN_MAX_OPS {
        return Err(ApiError::too_large(format!(
            "Transaction contains too many operations ({} > {TXN_MAX_OPS})",
            raw.len()
        )));
    }
    let mut ops = Vec::with_capacity(raw.len());
    let mut errors = Vec::new();
    for (op_index, op) in raw.into_iter().enumerate() {
        if op.node.is_some() || op.service.is_some() || op.check.is_some() {
            return Err(parse_err(format!(
                "operation {op_index}: only KV operations are supported in transactions"
            )));
        }
        let Some(kv) = op.kv else {
            return Err(parse_err(format!("operation {op_index} has no KV field")));
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
            Ok(op) => ops.push(op),
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
