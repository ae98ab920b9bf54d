//! Lock history over HTTP, a Vigil addition: what the servers recorded of each lock's life
//! (grants, releases, losses with their cause, lock-delays, waiters giving up, keys deleted
//! while held), oldest event first.
//! - `GET /v1/vigil/history/<name>`: the histories of the KV key and the native lock named
//!   `<name>` (none, one or both), under `key:read` on the name (403 without it).
//! - `GET /v1/vigil/history/<prefix>?prefix` and `GET /v1/vigil/history?prefix=P`: every lock
//!   whose name starts with the prefix, cut down to what the token may read (with
//!   `X-Consul-Results-Filtered-By-ACLs`).
//!
//! Both block with `?index=&wait=` until a lock they cover changes; `X-Consul-Index` is the
//! index of the newest event answered.

use axum::response::Response;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::rpc::reads;
use vigil_shared::vigil_api::HistoryReport;

use super::acl::filtered_by_acls;
use super::error::ApiError;
use super::lock::rfc3339;
use super::params::decode_path;
use super::{Ctx, with_meta};

/// `GET /v1/vigil/history/<name>` (`?prefix`: every lock under it).
pub async fn named(cx: Ctx) -> Result<Response, ApiError> {
    let raw = cx.uri.path().strip_prefix("/v1/vigil/history/");
    let name = decode_path(raw.unwrap_or_default())
        .map_err(|_| ApiError::bad_request("Invalid URL: Invalid UTF-8 in lock name"))?;
    let prefix = cx.params.has("prefix");
    if !prefix {
        cx.check(Resource::Key, Access::Read, &name)?;
    }
    answer(cx, name, prefix).await
}

/// `GET /v1/vigil/history?prefix=P`: every lock whose name starts with `P`.
pub async fn under(cx: Ctx) -> Result<Response, ApiError> {
    let prefix = cx.params.get("prefix").unwrap_or_default().to_owned();
    answer(cx, prefix, true).await
}

async fn answer(cx: Ctx, name: String, prefix: bool) -> Result<Response, ApiError> {
    let query = reads::History { name, prefix };
    let opts = cx.query_options(&query)?;
    let (mut found, meta) = cx.state.backend.read(opts, query).await?;
    let before = found.len();
    found.retain(|h| cx.authz.allows(Resource::Key, Access::Read, &h.name));
    let reports: Vec<HistoryReport> = found
        .iter()
        .map(|h| HistoryReport::new(h, &rfc3339))
        .collect();
    Ok(filtered_by_acls(
        found.len() < before,
        with_meta(meta, cx.json(&reports)),
    ))
}
