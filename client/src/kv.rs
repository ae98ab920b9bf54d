//! KV and txn calls: reads (single, recurse, keys, all blocking-capable) and the write verbs
//! (`flags`, `cas`, `acquire`, `release`, delete), sent the way Consul's Go client sends them.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use reqwest::Method;
use serde_json::{Value, json};
use vigil_shared::api::DirEntry;
use vigil_shared::go::duration::{format_go_duration, parse_go_duration};
use vigil_shared::kv::{KvEntry, KvOp};

use super::{
    Client, ClientError, QueryMeta, REQUEST_TIMEOUT, ReadOpts, Reply, encode_path, with_query,
};

/// Header with which Vigil says an acquire was refused by lock-delay, and for how long.
const LOCK_DELAY_HEADER: &str = "X-Vigil-Lock-Delay";
/// Header with which Vigil gives a taken lock's `LockIndex`.
const LOCK_INDEX_HEADER: &str = "X-Vigil-Lock-Index";
/// Header with which Vigil gives the index to block on the key from after an acquire.
const KEY_INDEX_HEADER: &str = "X-Vigil-Key-Index";
/// Request header asking a Vigil agent for [`KEY_INDEX_HEADER`] on a refusal too (Consul and
/// older Vigil agents ignore it).
const ASK_KEY_INDEX_HEADER: &str = "X-Vigil-Ask-Key-Index";
/// Request header asking a Vigil agent to wait, up to the duration given, for a key another
/// session holds to come free, and take it then (Consul and older Vigil agents ignore it).
const ACQUIRE_WAIT_HEADER: &str = "X-Vigil-Acquire-Wait";

/// The answer to `?acquire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub acquired: bool,
    /// Set when a Vigil agent refused because of lock-delay: how much of it is left.
    pub lock_delay: Option<Duration>,
    /// Set by a Vigil agent when the lock was taken: the `LockIndex` granted (the sequencer's).
    pub lock_index: Option<u64>,
    /// Set by a Vigil agent when the lock was taken, or refused because another session holds
    /// it: the key's index then, to block on the key from (a blocking read from it answers at
    /// the key's next change). Consul's client reads the key for it.
    pub key_index: Option<u64>,
}

/// The answer to `/v1/txn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnReply {
    /// Whether the ops were applied (200) or rolled back (409).
    pub committed: bool,
    pub results: Vec<KvEntry>,
    /// `(OpIndex, What)` of each failed op.
    pub errors: Vec<(usize, String)>,
}

fn entry(dir: DirEntry) -> Result<KvEntry, ClientError> {
    let value = dir
        .value_bytes()
        .map_err(|e| ClientError::Decode(format!("value of {}: {e}", dir.key)))?;
    Ok(KvEntry {
        key: dir.key,
        value,
        flags: dir.flags,
        session: dir.session.filter(|s| !s.is_empty()),
        lock_index: dir.lock_index,
        create_index: dir.create_index,
        modify_index: dir.modify_index,
    })
}

fn entries(reply: &Reply) -> Result<Vec<KvEntry>, ClientError> {
    reply
        .json::<Vec<DirEntry>>()?
        .into_iter()
        .map(entry)
        .collect()
}

fn kv_path(key: &str) -> String {
    format!("/v1/kv/{}", encode_path(key))
}

fn flags_query(flags: u64) -> Vec<(&'static str, String)> {
    // The Go client sends `flags` only when it is not 0.
    if flags == 0 {
        Vec::new()
    } else {
        vec![("flags", flags.to_string())]
    }
}

impl Client {
    /// `GET /v1/kv/<key>`: the entry, or `None` when it does not exist.
    pub async fn kv_get(
        &self,
        key: &str,
        opts: ReadOpts,
    ) -> Result<(Option<KvEntry>, QueryMeta), ClientError> {
        let (reply, meta) = self.read(&kv_path(key), &[], &opts).await?;
        if reply.status == 404 {
            return Ok((None, meta));
        }
        Ok((entries(&reply)?.into_iter().next(), meta))
    }

    /// `GET /v1/kv/<prefix>?recurse`: every entry under the raw prefix, sorted by key.
    pub async fn kv_list(
        &self,
        prefix: &str,
        opts: ReadOpts,
    ) -> Result<(Vec<KvEntry>, QueryMeta), ClientError> {
        let query = [("recurse", String::new())];
        let (reply, meta) = self.read(&kv_path(prefix), &query, &opts).await?;
        if reply.status == 404 {
            return Ok((Vec::new(), meta));
        }
        Ok((entries(&reply)?, meta))
    }

    /// `GET /v1/kv/<prefix>?keys[&separator=]`.
    pub async fn kv_keys(
        &self,
        prefix: &str,
        separator: Option<&str>,
        opts: ReadOpts,
    ) -> Result<(Vec<String>, QueryMeta), ClientError> {
        let mut query = vec![("keys", String::new())];
        if let Some(sep) = separator {
            query.push(("separator", sep.to_owned()));
        }
        let (reply, meta) = self.read(&kv_path(prefix), &query, &opts).await?;
        if reply.status == 404 {
            return Ok((Vec::new(), meta));
        }
        Ok((reply.json()?, meta))
    }

    /// A write answering `true`/`false`; returns the bool and the reply headers.
    async fn write_bool(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        timeout: Duration,
        headers: &[(&'static str, String)],
    ) -> Result<(bool, reqwest::header::HeaderMap), ClientError> {
        let path = with_query(path, query);
        let reply = self
            .send_with(method, &path, body, timeout, headers)
            .await?
            .ok()?;
        let ok = serde_json::from_slice::<bool>(&reply.body).map_err(|_| {
            ClientError::Decode(format!("expected true or false, got {:?}", reply.text()))
        })?;
        Ok((ok, reply.headers))
    }

    /// `PUT /v1/kv/<key>` with `value`: whether it took, and the reply headers.
    async fn kv_write(
        &self,
        key: &str,
        value: &[u8],
        query: &[(&str, String)],
    ) -> Result<(bool, reqwest::header::HeaderMap), ClientError> {
        let body = Some(value.to_vec());
        let path = kv_path(key);
        self.write_bool(Method::PUT, &path, query, body, REQUEST_TIMEOUT, &[])
            .await
    }

    /// `DELETE /v1/kv/<key>`: whether it took.
    async fn kv_remove(&self, key: &str, query: &[(&str, String)]) -> Result<bool, ClientError> {
        Ok(self
            .write_bool(
                Method::DELETE,
                &kv_path(key),
                query,
                None,
                REQUEST_TIMEOUT,
                &[],
            )
            .await?
            .0)
    }

    /// `PUT /v1/kv/<key>[?flags=]`: always `true` on success.
    pub async fn kv_put(&self, key: &str, value: &[u8], flags: u64) -> Result<bool, ClientError> {
        let query = flags_query(flags);
        Ok(self.kv_write(key, value, &query).await?.0)
    }

    /// `PUT ?cas=<index>` (0: only if absent).
    pub async fn kv_cas(
        &self,
        key: &str,
        value: &[u8],
        flags: u64,
        index: u64,
    ) -> Result<bool, ClientError> {
        let mut query = flags_query(flags);
        query.push(("cas", index.to_string()));
        Ok(self.kv_write(key, value, &query).await?.0)
    }

    /// `PUT ?acquire=<session>`; a Vigil agent also says how long a lock-delay refusal lasts,
    /// and, when the lock is taken, its `LockIndex` and the key's index.
    pub async fn kv_acquire(
        &self,
        key: &str,
        value: &[u8],
        flags: u64,
        session: &str,
    ) -> Result<Acquired, ClientError> {
        self.acquire_as(key, value, flags, session, REQUEST_TIMEOUT, &[])
            .await
    }

    /// [`Client::kv_acquire`] for a client that blocks on the key when another session holds
    /// it: asks a Vigil agent to wait in the agent, up to `wait` (zero: not at all), for the key
    /// to come free and take it then, and, when it still answers a refusal because another
    /// session holds the key, for the index to block from (a read of the key on the agent's
    /// server, so only worth asking for to use it).
    pub async fn kv_acquire_waiting(
        &self,
        key: &str,
        value: &[u8],
        flags: u64,
        session: &str,
        wait: Duration,
    ) -> Result<Acquired, ClientError> {
        let mut headers = vec![(ASK_KEY_INDEX_HEADER, "true".to_owned())];
        if !wait.is_zero() {
            headers.push((ACQUIRE_WAIT_HEADER, format_go_duration(wait)));
        }
        let timeout = wait + wait / 16 + REQUEST_TIMEOUT;
        self.acquire_as(key, value, flags, session, timeout, &headers)
            .await
    }

    /// `?acquire`, with this request timeout and these request headers.
    async fn acquire_as(
        &self,
        key: &str,
        value: &[u8],
        flags: u64,
        session: &str,
        timeout: Duration,
        extra: &[(&'static str, String)],
    ) -> Result<Acquired, ClientError> {
        let mut query = flags_query(flags);
        query.push(("acquire", session.to_owned()));
        let body = Some(value.to_vec());
        let path = kv_path(key);
        let (acquired, headers) = self
            .write_bool(Method::PUT, &path, &query, body, timeout, extra)
            .await?;
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
        let index = |name| header(name).and_then(|v| v.parse().ok());
        Ok(Acquired {
            acquired,
            lock_delay: header(LOCK_DELAY_HEADER).and_then(|v| parse_go_duration(v).ok()),
            lock_index: index(LOCK_INDEX_HEADER),
            key_index: index(KEY_INDEX_HEADER),
        })
    }

    /// `PUT ?release=<session>`; release overwrites value and flags, so both are re-sent.
    pub async fn kv_release(
        &self,
        key: &str,
        value: &[u8],
        flags: u64,
        session: &str,
    ) -> Result<bool, ClientError> {
        let mut query = flags_query(flags);
        query.push(("release", session.to_owned()));
        Ok(self.kv_write(key, value, &query).await?.0)
    }

    /// `DELETE /v1/kv/<key>` (idempotent).
    pub async fn kv_delete(&self, key: &str) -> Result<bool, ClientError> {
        self.kv_remove(key, &[]).await
    }

    /// `DELETE ?cas=<index>`.
    pub async fn kv_delete_cas(&self, key: &str, index: u64) -> Result<bool, ClientError> {
        let query = [("cas", index.to_string())];
        self.kv_remove(key, &query).await
    }

    /// `DELETE ?recurse`.
    pub async fn kv_delete_tree(&self, prefix: &str) -> Result<bool, ClientError> {
        let query = [("recurse", String::new())];
        self.kv_remove(prefix, &query).await
    }

    /// `PUT /v1/txn` with KV ops: 200 committed, 409 rolled back with Consul's error texts.
    pub async fn txn(&self, ops: &[KvOp]) -> Result<TxnReply, ClientError> {
        let body: Vec<Value> = ops.iter().map(txn_op_json).collect();
        let body = serde_json::to_vec(&body).map_err(|e| ClientError::Decode(e.to_string()))?;
        let reply = self
            .send(Method::PUT, "/v1/txn", Some(body), REQUEST_TIMEOUT)
            .await?;
        if reply.status != 200 && reply.status != 409 {
            return Err(ClientError::api(&reply));
        }
        let v: Value = reply.json()?;
        let mut results = Vec::new();
        for r in v["Results"].as_array().into_iter().flatten() {
            let dir: DirEntry = serde_json::from_value(r["KV"].clone())
                .map_err(|e| ClientError::Decode(e.to_string()))?;
            results.push(entry(dir)?);
        }
        let errors = v["Errors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["OpIndex"].as_u64().unwrap_or(0) as usize,
                    e["What"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        Ok(TxnReply {
            committed: reply.status == 200,
            results,
            errors,
        })
    }
}

/// One op as Consul's txn JSON: `{"KV":{"Verb":…,"Key":…,…}}`.
fn txn_op_json(op: &KvOp) -> Value {
    let b64 = |v: &[u8]| BASE64.encode(v);
    let kv = match op {
        KvOp::Set { key, value, flags } => {
            json!({"Verb": "set", "Key": key, "Value": b64(value), "Flags": flags})
        }
        KvOp::Cas {
            key,
            value,
            flags,
            index,
        } => {
            json!({"Verb": "cas", "Key": key, "Value": b64(value), "Flags": flags, "Index": index})
        }
        KvOp::Lock {
            key,
            value,
            flags,
            session,
        } => {
            json!({"Verb": "lock", "Key": key, "Value": b64(value), "Flags": flags, "Session": session})
        }
        KvOp::Unlock {
            key,
            value,
            flags,
            session,
        } => {
            json!({"Verb": "unlock", "Key": key, "Value": b64(value), "Flags": flags, "Session": session})
        }
        KvOp::Get { key } => json!({"Verb": "get", "Key": key}),
        KvOp::GetOrEmpty { key } => json!({"Verb": "get-or-empty", "Key": key}),
        KvOp::GetTree { prefix } => json!({"Verb": "get-tree", "Key": prefix}),
        KvOp::CheckIndex { key, index } => {
            json!({"Verb": "check-index", "Key": key, "Index": index})
        }
        KvOp::CheckSession { key, session } => {
            json!({"Verb": "check-session", "Key": key, "Session": session})
        }
        KvOp::CheckNotExists { key } => json!({"Verb": "check-not-exists", "Key": key}),
        KvOp::Delete { key } => json!({"Verb": "delete", "Key": key}),
        KvOp::DeleteTree { prefix } => json!({"Verb": "delete-tree", "Key": prefix}),
        KvOp::DeleteCas { key, index } => {
            json!({"Verb": "delete-cas", "Key": key, "Index": index})
        }
    };
    json!({ "KV": kv })
}
