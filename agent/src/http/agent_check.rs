//! `/v1/agent/check/*`, `/v1/agent/checks` and `/v1/agent/maintenance`: this agent's own
//! checks. Every change is synced to the catalog before the reply (a failed sync is retried in
//! the background, as Consul does), so once `fail` returns the sessions bound to the check are
//! gone.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::HealthStatus;
use vigil_shared::go::strconv::parse_bool;

use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::params::Params;
use super::shapes::{CheckJson, keyed_by_id};
use super::{AppState, Ctx};
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
pub async fn list(cx: Ctx) -> Result<Response, ApiError> {
    let checks = cx.state.local.checks();
    let out = keyed_by_id(
        &cx.params,
        checks
            .iter()
            .filter(|c| match c.service_name.as_str() {
                "" => cx.authz.allows(Resource::Node, Access::Read, &c.node),
                service => cx.authz.allows(Resource::Service, Access::Read, service),
            })
            .map(|c| (c.check_id.clone(), CheckJson::new(c))),
    )?;
    Ok(cx.json(&out))
}

/// `PUT /v1/agent/check/register`.
pub async fn register(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Write, &cx.state.node_name)?;
    let check = parse_check_body(&body)?;
    limits::check(&check)?;
    cx.state.local.add_check(check, Source::Remote)?;
    cx.state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

/// `PUT /v1/agent/check/deregister/<id>`: also invalidates the sessions bound to the check.
pub async fn deregister(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Write, &cx.state.node_name)?;
    cx.state.local.remove_check(&id)?;
    cx.state.local.sync_now().await;
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

/// Sets TTL check `id` to `status`; the `?note=` becomes its output.
async fn mark(cx: &Ctx, id: &str, status: HealthStatus) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Write, &cx.state.node_name)?;
    let note = cx.params.get("note").unwrap_or_default();
    set_ttl(&cx.state, id, status, note).await
}

/// `PUT /v1/agent/check/pass/<id>?note=`.
pub async fn pass(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    mark(&cx, &id, HealthStatus::Passing).await
}

/// `PUT /v1/agent/check/warn/<id>?note=`.
pub async fn warn(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    mark(&cx, &id, HealthStatus::Warning).await
}

/// `PUT /v1/agent/check/fail/<id>?note=`.
pub async fn fail(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    mark(&cx, &id, HealthStatus::Critical).await
}

/// `PUT /v1/agent/check/update/<id>` with `{"Status": ..., "Output": ...}`.
pub async fn update(
    cx: Ctx,
    Path(id): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Write, &cx.state.node_name)?;
    let (status, output) = parse_check_update(&body)?;
    set_ttl(&cx.state, &id, status, &output).await
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
pub async fn node_maintenance(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Write, &cx.state.node_name)?;
    let enable = enable_param(&cx.params)?;
    cx.state
        .local
        .node_maintenance(enable, cx.params.get("reason").unwrap_or_default());
    cx.state.local.sync_now().await;
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
