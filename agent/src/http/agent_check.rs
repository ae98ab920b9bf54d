//! `/v1/agent/check/*`, `/v1/agent/checks` and `/v1/agent/maintenance`: this agent's own
//! checks. Every change is synced to the catalog before the reply (a failed sync is retried in
//! the background, as Consul does), so once `fail` returns the sessions bound to the check are
//! gone.

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::HealthStatus;
use vigil_shared::go::strconv::parse_bool;

use super::acl::Authz;
use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::params::Params;
use super::shapes::{CheckJson, keyed_by_id};
use super::{AppState, json};
use crate::local::definition::{DefinitionError, parse_check_body, parse_check_update};
use crate::local::{LocalError, Source};

/// The one place local-state refusals get their HTTP status, Consul's: 404 for unknown IDs, 400
/// for an invalid definition, 500 for a non-TTL update and for disabled scripts.
impl From<LocalError> for ApiError {
    fn from(e: LocalError) -> ApiError {
        let status = match &e {
            LocalError::MissingService(_)
            | LocalError::UnknownCheck(_)
            | LocalError::UnknownService(_) => StatusCode::NOT_FOUND,
            LocalError::Definition(_) => StatusCode::BAD_REQUEST,
            LocalError::NotTtl(_)
            | LocalError::ScriptsDisabledRemote
            | LocalError::ScriptsDisabledLocal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<DefinitionError> for ApiError {
    fn from(e: DefinitionError) -> ApiError {
        ApiError::from(LocalError::from(e))
    }
}

/// `GET /v1/agent/checks`: every local check keyed by ID, in Consul's `HealthCheck` shape.
pub async fn list(
    State(state): State<AppState>,
    authz: Authz,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let checks = state.local.checks();
    let out = keyed_by_id(
        &params,
        checks
            .iter()
            .filter(|c| match c.service_name.as_str() {
                "" => authz.allows(Resource::Node, Access::Read, &c.node),
                service => authz.allows(Resource::Service, Access::Read, service),
            })
            .map(|c| (c.check_id.clone(), CheckJson::new(c))),
    )?;
    Ok(json(&params, &out))
}

/// `PUT /v1/agent/check/register`.
pub async fn register(
    State(state): State<AppState>,
    authz: Authz,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    let check = parse_check_body(&body)?;
    limits::check(&check)?;
    state.local.add_check(check, Source::Remote)?;
    state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

/// `PUT /v1/agent/check/deregister/<id>`: also invalidates the sessions bound to the check.
pub async fn deregister(
    State(state): State<AppState>,
    authz: Authz,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    state.local.remove_check(&id)?;
    state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

async fn set_ttl(
    state: &AppState,
    id: &str,
    status: HealthStatus,
    output: &str,
) -> Result<Response, ApiError> {
    state.local.update_ttl(id, status, output)?;
    state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

/// The `?note=` of a TTL update: it becomes the check's output.
fn note(uri: &axum::http::Uri) -> String {
    Params::parse(uri.query())
        .get("note")
        .unwrap_or_default()
        .to_owned()
}

/// `PUT /v1/agent/check/pass/<id>?note=`.
pub async fn pass(
    State(state): State<AppState>,
    authz: Authz,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    set_ttl(&state, &id, HealthStatus::Passing, &note(&uri)).await
}

/// `PUT /v1/agent/check/warn/<id>?note=`.
pub async fn warn(
    State(state): State<AppState>,
    authz: Authz,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    set_ttl(&state, &id, HealthStatus::Warning, &note(&uri)).await
}

/// `PUT /v1/agent/check/fail/<id>?note=`.
pub async fn fail(
    State(state): State<AppState>,
    authz: Authz,
    Path(id): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    set_ttl(&state, &id, HealthStatus::Critical, &note(&uri)).await
}

/// `PUT /v1/agent/check/update/<id>` with `{"Status": ..., "Output": ...}`.
pub async fn update(
    State(state): State<AppState>,
    authz: Authz,
    Path(id): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    let (status, output) = parse_check_update(&body)?;
    set_ttl(&state, &id, status, &output).await
}

/// `?enable=` of the maintenance endpoints: required, a Go bool.
pub fn enable_param(params: &Params) -> Result<bool, ApiError> {
    let raw = params
        .get("enable")
        .ok_or_else(|| ApiError::bad_request("Missing value for enable"))?;
    parse_bool(raw).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Invalid value for enable: {}",
            serde_json::to_string(raw).unwrap_or_default()
        ))
    })
}

/// `PUT /v1/agent/maintenance?enable=&reason=`: node maintenance mode, a critical
/// `_node_maintenance` check while enabled.
pub async fn node_maintenance(
    State(state): State<AppState>,
    authz: Authz,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Write, &state.node_name)?;
    let params = Params::parse(uri.query());
    let enable = enable_param(&params)?;
    state
        .local
        .node_maintenance(enable, params.get("reason").unwrap_or_default());
    state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enable_parameter_messages() {
        let err = |q: &str| enable_param(&Params::parse(Some(q))).unwrap_err().message;
        assert_eq!(err("reason=x"), "Missing value for enable");
        assert_eq!(err("enable=maybe"), "Invalid value for enable: \"maybe\"");
        assert!(enable_param(&Params::parse(Some("enable=true"))).unwrap());
    }
}
