//! `/v1/health/*`: checks by node, by service and by state, and the healthy instances of a
//! service. Service reads block on that service's own index, so a watcher on one service is
//! not woken by changes elsewhere.

use axum::extract::{OriginalUri, Path, State};
use axum::response::Response;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::{Check, HealthStatus};
use vigil_shared::rpc::{QueryMeta, reads};

use super::acl::Authz;
use super::error::ApiError;
use super::params::Params;
use super::shapes::{CheckJson, HealthJson, filtered, node_meta_matches, tags_match};
use super::{AppState, json, read, with_meta};

fn checks_response(
    params: &Params,
    checks: &[Check],
    meta: QueryMeta,
) -> Result<Response, ApiError> {
    let out = filtered(params, checks.iter().map(CheckJson::new).collect())?;
    Ok(with_meta(meta, json(params, &out)))
}

/// `GET /v1/health/node/<node>`.
pub async fn node(
    State(state): State<AppState>,
    authz: Authz,
    Path(node): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Read, &node)?;
    let params = Params::parse(uri.query());
    let (list, meta) = read(&state, &params, reads::NodeChecks { node }).await?;
    checks_response(&params, &list, meta)
}

/// `GET /v1/health/checks/<service>`.
pub async fn service_checks(
    State(state): State<AppState>,
    authz: Authz,
    Path(name): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Service, Access::Read, &name)?;
    let params = Params::parse(uri.query());
    let (list, meta) = read(&state, &params, reads::ServiceChecks { name }).await?;
    checks_response(&params, &list, meta)
}

/// `GET /v1/health/state/` with no state.
pub async fn missing_state() -> ApiError {
    ApiError::bad_request("Missing check state")
}

/// `GET /v1/health/state/<passing|warning|critical|any>`.
pub async fn state(
    State(state): State<AppState>,
    authz: Authz,
    Path(wanted): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let wanted = match wanted.as_str() {
        "any" => None,
        s => Some(
            HealthStatus::parse(s)
                .ok_or_else(|| ApiError::bad_request(format!("Invalid check state: '{s}'")))?,
        ),
    };
    let query = reads::ChecksInState { state: wanted };
    let (mut list, meta) = read(&state, &params, query).await?;
    list.retain(|c| match c.service_name.as_str() {
        "" => authz.allows(Resource::Node, Access::Read, &c.node),
        service => authz.allows(Resource::Service, Access::Read, service),
    });
    checks_response(&params, &list, meta)
}

/// `GET /v1/health/service/<name>[?passing][&tag=][&node-meta=][&filter=]`: `?passing` keeps
/// the instances whose every check, node checks included, is passing.
pub async fn service(
    State(state): State<AppState>,
    authz: Authz,
    Path(name): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Service, Access::Read, &name)?;
    let params = Params::parse(uri.query());
    let passing_only = params
        .bool("passing")
        .map_err(|_| ApiError::bad_request("Invalid value for ?passing"))?;
    let (instances, meta) = read(&state, &params, reads::HealthService { name }).await?;
    let out = instances
        .iter()
        .filter(|h| !passing_only || h.passing())
        .filter(|h| node_meta_matches(&params, &h.node) && tags_match(&params, &h.service))
        .map(HealthJson::new)
        .collect();
    Ok(with_meta(meta, json(&params, &filtered(&params, out)?)))
}
