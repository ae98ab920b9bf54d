//! `/v1/kv/<key>`: reads (single, `recurse`, `keys`, `raw`, blocking), writes (`flags`, `cas`,
//! `acquire`, `release`) and deletes (`recurse`, `cas`), each a one-op KV transaction.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::DirEntry;
use vigil_shared::go::duration::format_go_duration;
use vigil_shared::kv::{KvOp, KvOpError, TxnOutcome};
use vigil_shared::rpc::{reads, writes};

use super::acl::{check_session_write, filtered_by_acls};
use super::body::{Limit, read};
use super::error::ApiError;
use super::params::{Params, decode_path};
use super::{AppState, Ctx, json, not_found_with_meta, with_meta};

/// Header telling a client its acquire was refused by lock-delay, and for how much longer.
const LOCK_DELAY_HEADER: &str = "X-Vigil-Lock-Delay";

/// The key: the path after `/v1/kv/`, percent-decoded. Keys are UTF-8; other bytes are refused
/// (a lossy decoding would store `%FF` and `%FE` under one key).
fn key_of(uri: &axum::http::Uri) -> Result<String, ApiError> {
    let path = uri.path();
    let raw = path
        .strip_prefix("/v1/kv/")
        .or_else(|| path.strip_prefix("/v1/kv"))
        .unwrap_or("");
    decode_path(raw).map_err(|_| ApiError::bad_request("Invalid URL: Invalid UTF-8 in `key`"))
}

pub async fn get(cx: Ctx) -> Result<Response, ApiError> {
    let key = key_of(&cx.uri)?;
    let recurse = cx.params.has("recurse");
    let keys = cx.params.has("keys");
    if key.is_empty() && !recurse && !keys {
        return Err(ApiError::bad_request("Missing key name"));
    }
    if keys {
        let separator = cx
            .params
            .get("separator")
            .or_else(|| cx.params.get("seperator"))
            .map(str::to_owned);
        let query = reads::KvKeys {
            prefix: key.clone(),
            separator,
        };
        let (mut list, meta) = cx.read(query).await?;
        let found = list.len();
        list.retain(|k| cx.authz.allows(Resource::Key, Access::Read, k));
        let filtered = list.len() < found;
        if list.is_empty() && !key.is_empty() {
            return Ok(filtered_by_acls(filtered, not_found_with_meta(meta)));
        }
        return Ok(filtered_by_acls(filtered, with_meta(meta, cx.json(&list))));
    }
    if !recurse {
        cx.check(Resource::Key, Access::Read, &key)?;
    }
    // A prefix the token can read nothing under answers at once, as not found.
    let (mut entries, meta) = if recurse {
        let query = reads::KvList {
            prefix: key.clone(),
        };
        cx.read(query).await?
    } else {
        cx.read(reads::KvGet { key }).await?
    };
    let found = entries.len();
    entries.retain(|e| cx.authz.allows(Resource::Key, Access::Read, &e.key));
    let filtered = entries.len() < found;
    if entries.is_empty() {
        return Ok(filtered_by_acls(filtered, not_found_with_meta(meta)));
    }
    if cx.params.has("raw") && !recurse {
        let value = entries
            .into_iter()
            .next()
            .map(|e| e.value)
            .unwrap_or_default();
        let response = (
            [
                (header::CONTENT_TYPE, "text/plain"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::CONTENT_SECURITY_POLICY, "sandbox"),
            ],
            Body::from(value),
        )
            .into_response();
        return Ok(with_meta(meta, response));
    }
    let dir: Vec<DirEntry> = entries.iter().map(DirEntry::from_entry).collect();
    Ok(filtered_by_acls(filtered, with_meta(meta, cx.json(&dir))))
}

fn conflicting(params: &Params, names: &[&str]) -> Result<(), ApiError> {
    if names.iter().filter(|n| params.has(n)).count() > 1 {
        return Err(ApiError::bad_request(format!(
            "Conflicting flags: {}\n",
            params.encoded_sorted()
        )));
    }
    Ok(())
}

pub async fn put(cx: Ctx, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let key = key_of(&cx.uri)?;
    if key.is_empty() {
        return Err(ApiError::bad_request("Missing key name"));
    }
    conflicting(&cx.params, &["cas", "acquire", "release"])?;
    cx.check(Resource::Key, Access::Write, &key)?;
    if let Some(session) = cx
        .params
        .get("acquire")
        .or_else(|| cx.params.get("release"))
    {
        check_session_write(&cx.state, &cx.authz, session).await?;
    }
    let flags = cx.params.u64("flags")?.unwrap_or(0);
    let cas = cx.params.u64("cas")?;
    let value = read(&headers, body, Limit::KvValue).await?.to_vec();
    let op = if let Some(session) = cx.params.get("acquire") {
        KvOp::Lock {
            key,
            value,
            flags,
            session: session.to_owned(),
        }
    } else if let Some(session) = cx.params.get("release") {
        KvOp::Unlock {
            key,
            value,
            flags,
            session: session.to_owned(),
        }
    } else if let Some(index) = cas {
        KvOp::Cas {
            key,
            value,
            flags,
            index,
        }
    } else {
        KvOp::Set { key, value, flags }
    };
    write_bool(&cx.state, &cx.params, op).await
}

pub async fn delete(cx: Ctx) -> Result<Response, ApiError> {
    let key = key_of(&cx.uri)?;
    let recurse = cx.params.has("recurse");
    conflicting(&cx.params, &["cas", "recurse"])?;
    if key.is_empty() && !recurse {
        return Err(ApiError::bad_request("Missing key name"));
    }
    if recurse {
        cx.authz.0.check_key_write_prefix(&key)?;
    } else {
        cx.check(Resource::Key, Access::Write, &key)?;
    }
    let op = if recurse {
        KvOp::DeleteTree { prefix: key }
    } else if let Some(index) = cx.params.u64("cas")? {
        KvOp::DeleteCas { key, index }
    } else {
        KvOp::Delete { key }
    };
    write_bool(&cx.state, &cx.params, op).await
}

/// Applies one KV op and answers Consul's `true`/`false`.
async fn write_bool(state: &AppState, params: &Params, op: KvOp) -> Result<Response, ApiError> {
    let error = match state.backend.write(writes::Kv(vec![op])).await? {
        TxnOutcome::Committed(_) => return Ok(json(params, &true)),
        TxnOutcome::RolledBack(mut errors) if !errors.is_empty() => errors.swap_remove(0).error,
        TxnOutcome::RolledBack(_) => return Ok(json(params, &false)),
    };
    match error {
        KvOpError::LockDelay { remaining_ms, .. } => {
            let mut response = json(params, &false);
            let remaining = format_go_duration(std::time::Duration::from_millis(remaining_ms));
            if let Ok(v) = HeaderValue::from_str(&remaining) {
                response.headers_mut().insert(LOCK_DELAY_HEADER, v);
            }
            Ok(response)
        }
        KvOpError::MissingSession | KvOpError::InvalidSession(_) => {
            Err(ApiError::server(format!("raft apply failed: {error}")))
        }
        KvOpError::MissingKey => Err(ApiError::server(error.to_string())),
        _ => Ok(json(params, &false)),
    }
}
