//! `/v1/kv/<key>`: reads (single, `recurse`, `keys`, `raw`, blocking), writes (`flags`, `cas`,
//! `acquire`, `release`) and deletes (`recurse`, `cas`), each a one-op KV transaction.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::DirEntry;
use vigil_shared::go::duration::format_go_duration;
use vigil_shared::kv::{KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::rpc::{Consistency, QueryOptions, reads, writes};

use super::acl::{check_session_write, filtered_by_acls};
use super::body::{Limit, read};
use super::error::ApiError;
use super::params::{Params, decode_path};
use super::{AppState, Ctx, json, kv_wait, not_found_with_meta, with_meta};

/// Header telling a client its acquire was refused by lock-delay, and for how much longer.
const LOCK_DELAY_HEADER: &str = "X-Vigil-Lock-Delay";
/// Header telling a client that took a lock with `?acquire` the key's `LockIndex` it was
/// granted: its sequencer, without a read.
const LOCK_INDEX_HEADER: &str = "X-Vigil-Lock-Index";
/// Header telling a client, on an `?acquire`, the index to block on the key from: the key as
/// the acquire left it, or as another session holds it after a refusal. Consul's lock client
/// reads the key for it (a consistent read after taking it, a second read after a refusal).
const KEY_INDEX_HEADER: &str = "X-Vigil-Key-Index";
/// Request header with which a client asks a refused `?acquire` for [`KEY_INDEX_HEADER`]: a
/// read of the key on this agent's server, which a client that does not use it (Consul's)
/// should not cost the herd of a contended lock.
const ASK_KEY_INDEX_HEADER: &str = "X-Vigil-Ask-Key-Index";
/// How long a refused acquire waits for the read behind [`KEY_INDEX_HEADER`].
const HELD_READ_TIMEOUT: Duration = Duration::from_secs(1);

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
        let ask = headers.contains_key(ASK_KEY_INDEX_HEADER);
        let wait = kv_wait::asked(&headers)?;
        let op = KvOp::Lock {
            key,
            value,
            flags,
            session: session.to_owned(),
        };
        return acquire(&cx, op, ask, wait).await;
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

/// `?acquire` (`op`), answered as Consul does, with Vigil's headers for its own lock client: a
/// taken lock's `LockIndex` and the key's index, and, for a refusal because another session
/// holds the key, when the client asks for it (`ask`), the index at which a read of the key on
/// this agent's server found it held. That read may be behind the leader's refusal (a blocking
/// read from its index then answers at once) but never hides a release: the index is sent only
/// if the read found the key held. The token was checked for `key:write`, which grants read.
/// With `wait`, a refusal waits in the agent ([`kv_wait`]).
async fn acquire(
    cx: &Ctx,
    op: KvOp,
    ask: bool,
    wait: Option<Duration>,
) -> Result<Response, ApiError> {
    let outcome = match wait {
        Some(wait) => kv_wait::acquire(cx, &op, Instant::now() + wait).await?,
        None => cx.state.backend.write(writes::Kv(vec![op])).await?,
    };
    let mut indexes = None;
    match &outcome {
        TxnOutcome::Committed(entries) => {
            if let [entry] = entries.as_slice() {
                indexes = Some((Some(entry.lock_index), entry.modify_index));
            }
        }
        TxnOutcome::RolledBack(errors) if ask => {
            if let [
                TxnError {
                    error: KvOpError::LockHeld(key),
                    ..
                },
            ] = errors.as_slice()
            {
                indexes = held_at(cx, key.clone()).await.map(|index| (None, index));
            }
        }
        _ => {}
    }
    let mut response = answer_bool(&cx.params, outcome)?;
    if let Some((lock_index, key_index)) = indexes {
        let headers = response.headers_mut();
        if let Some(lock_index) = lock_index {
            headers.insert(LOCK_INDEX_HEADER, HeaderValue::from(lock_index));
        }
        headers.insert(KEY_INDEX_HEADER, HeaderValue::from(key_index));
    }
    Ok(response)
}

/// The index at which this agent's server (any, its state possibly behind the leader's) finds
/// `key` held by a session; `None` when it does not, or does not answer within
/// [`HELD_READ_TIMEOUT`] (the refusal is not held up for what only saves the client a read).
async fn held_at(cx: &Ctx, key: String) -> Option<u64> {
    let opts = QueryOptions {
        consistency: Consistency::Stale,
        ..QueryOptions::default()
    };
    let read = cx.state.backend.read(opts, reads::KvGet { key });
    let (entries, meta) = tokio::time::timeout(HELD_READ_TIMEOUT, read)
        .await
        .ok()?
        .ok()?;
    entries
        .iter()
        .any(|entry| entry.session.is_some())
        .then_some(meta.index)
}

/// Applies one KV op and answers Consul's `true`/`false`.
async fn write_bool(state: &AppState, params: &Params, op: KvOp) -> Result<Response, ApiError> {
    answer_bool(params, state.backend.write(writes::Kv(vec![op])).await?)
}

/// Consul's `true`/`false` for the outcome of one KV op.
fn answer_bool(params: &Params, outcome: TxnOutcome) -> Result<Response, ApiError> {
    let error = match outcome {
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
