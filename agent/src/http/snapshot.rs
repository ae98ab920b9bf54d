//! Consul's `/v1/snapshot`: `GET` answers the leader's whole state as a gzip-compressed archive
//! (`vigil_server::snapshot`), `PUT` restores one through raft on every server. A damaged or
//! foreign archive is refused and changes nothing.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use vigil_server::api::operations::{RestoreSnapshot, SaveSnapshot, Saved};

use vigil_shared::acl::authz::{Access, Resource};

use super::Ctx;
use super::body::{Limit, read};
use super::error::ApiError;

/// `GET /v1/snapshot`: the whole state, secrets included, so only for `acl:write` (Consul's
/// management requirement).
pub async fn save(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Acl, Access::Write, "")?;
    let Saved { index, archive } = cx.state.backend.operate(SaveSnapshot).await?;
    let mut response = (
        [(header::CONTENT_TYPE, "application/x-gzip")],
        Body::from(archive),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert("X-Consul-Index", HeaderValue::from(index.max(1)));
    headers.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
    headers.insert("X-Consul-LastContact", HeaderValue::from_static("0"));
    Ok(response)
}

/// `PUT /v1/snapshot` with an archive as the body.
pub async fn restore(cx: Ctx, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    cx.check(Resource::Acl, Access::Write, "")?;
    let archive = read(&headers, body, Limit::Snapshot).await?;
    cx.state
        .backend
        .operate(RestoreSnapshot(archive.to_vec()))
        .await?;
    Ok(StatusCode::OK.into_response())
}
