//! `/v1/health/*`: checks by node, by service and by state, and the healthy instances of a
//! service. Service reads block on that service's own index, so a watcher on one service is
//! not woken by changes elsewhere.

use axum::extract::Path;
use axum::response::Response;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::{Check, HealthStatus};
use vigil_shared::rpc::{QueryMeta, reads};

use super::error::ApiError;
use super::params::Params;
use super::shapes::{CheckJson, HealthJson, filtered, node_meta_matches, tags_match};
use super::{Ctx, json, with_meta};

fn checks_response(
    params: &Params,
    checks: &[Check],
    meta: QueryMeta,
) -> Result<Response, ApiError> {
    let out = filtered(params, checks.iter().map(CheckJson::new).collect())?;
    Ok(with_meta(meta, json(params, &out)))
}

/// `GET /v1/health/node/<node>`.
pub async fn node(cx: Ctx, Path(node): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Read, &node)?;
    let (list, meta) = cx.read(reads::NodeChecks { node }).await?;
    checks_response(&cx.params, &list, meta)
}

/// `GET /v1/health/checks/<service>`.
pub async fn service_checks(cx: Ctx, Path(name): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Service, Access::Read, &name)?;
    let (list, meta) = cx.read(reads::ServiceChecks { name }).await?;
    checks_response(&cx.params, &list, meta)
}

/// `GET /v1/health/state/` with no state.
pub async fn missing_state() -> ApiError {
    ApiError::bad_request("Missing check state")
}

/// `GET /v1/health/state/<passing|warning|critical|any>`.
pub async fn state(cx: Ctx, Path(wanted): Path<String>) -> Result<Response, ApiError> {
    let wanted = match wanted.as_str() {
        "any" => None,
        s => Some(
            HealthStatus::parse(s)
                .ok_or_else(|| ApiError::bad_request(format!("Invalid check state: '{s}'")))?,
        ),
    };
    let query = reads::ChecksInState { state: wanted };
    let (mut list, meta) = cx.read(query).await?;
    list.retain(|c| match c.service_name.as_str() {
        "" => cx.authz.allows(Resource::Node, Access::Read, &c.node),
        service => cx.authz.allows(Resource::Service, Access::Read, service),
    });
    checks_response(&cx.params, &list, meta)
}

/// `GET /v1/health/service/<name>[?passing][&tag=][&node-meta=][&filter=]`: `?passing` keeps
/// the instances whose every check, node checks included, is passing.
pub async fn service(cx: Ctx, Path(name): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Service, Access::Read, &name)?;
    let passing_only = cx
        .params
        .bool("passing")
        .map_err(|_| ApiError::bad_request("Invalid value for ?passing"))?;
    let (instances, meta) = cx.read(reads::HealthServiceFull { name }).await?;
    let out = instances
        .iter()
        .filter(|h| !passing_only || h.passing())
        .filter(|h| node_meta_matches(&cx.params, &h.node) && tags_match(&cx.params, &h.service))
        .map(HealthJson::new)
        .collect();
    Ok(with_meta(meta, cx.json(&filtered(&cx.params, out)?)))
}
