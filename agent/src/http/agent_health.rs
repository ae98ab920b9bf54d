//! `/v1/agent/health/service/{id,name}/<s>`: the health of this agent's own service instances,
//! answered locally with Consul's status codes (200 passing, 429 warning, 503 critical or
//! maintenance, 404 unknown) so a load balancer can probe the agent. The body is Consul's
//! `AgentServiceChecksInfo` JSON, or with `?format=text` (or `Accept: text/plain`) the status
//! word alone.

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::{Check, HealthStatus, Service};

use super::agent_service::AgentServiceJson;
use super::error::ApiError;
use super::params::Params;
use super::shapes::CheckJson;
use super::{Ctx, json};
use crate::local::{NODE_MAINTENANCE, SERVICE_MAINTENANCE_PREFIX};

/// Consul's `api.AgentServiceChecksInfo`.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ChecksInfo<'a> {
    aggregated_status: &'static str,
    service: AgentServiceJson<'a>,
    checks: Vec<CheckJson<'a>>,
}

/// `api.HealthChecks.AggregatedStatus`: maintenance wins, then critical, warning, passing (also
/// for no checks at all).
pub fn aggregated_status<'a>(checks: impl IntoIterator<Item = &'a Check>) -> &'static str {
    let (mut maintenance, mut critical, mut warning) = (false, false, false);
    for check in checks {
        if check.check_id == NODE_MAINTENANCE
            || check.check_id.starts_with(SERVICE_MAINTENANCE_PREFIX)
        {
            maintenance = true;
            continue;
        }
        match check.status {
            HealthStatus::Critical => critical = true,
            HealthStatus::Warning => warning = true,
            HealthStatus::Passing => {}
        }
    }
    if maintenance {
        "maintenance"
    } else if critical {
        "critical"
    } else if warning {
        "warning"
    } else {
        "passing"
    }
}

/// The status code Consul answers an aggregated status with.
pub fn status_code(aggregated: &str) -> StatusCode {
    match aggregated {
        "passing" => StatusCode::OK,
        "warning" => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// Consul's `returnTextPlain`: an `Accept: text/plain...` header, else `?format=text`.
fn wants_text(params: &Params, headers: &HeaderMap) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    accept.starts_with("text/plain") || params.get("format") == Some("text")
}

/// The instance's checks and the node's, as Consul's `ChecksForService(id, true)`.
fn service_checks<'a>(checks: &'a [Check], service: &Service) -> Vec<&'a Check> {
    checks
        .iter()
        .filter(|c| c.service_id.is_empty() || c.service_id == service.id)
        .collect()
}

fn reply(
    code: StatusCode,
    text: bool,
    status: &str,
    params: &Params,
    body: &impl Serialize,
) -> Response {
    let mut response = if text {
        (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            status.to_owned(),
        )
            .into_response()
    } else {
        json(params, body)
    };
    *response.status_mut() = code;
    response
}

/// `GET /v1/agent/health/service/id/<id>`.
pub async fn by_id(
    cx: Ctx,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Read, &cx.state.node_name)?;
    let text = wants_text(&cx.params, &headers);
    let Some(service) = cx.state.local.service(&id) else {
        let reason = format!("ServiceId {id} not found");
        let body =
            serde_json::json!({"AggregatedStatus": "critical", "Service": null, "Checks": null});
        return Ok(reply(
            StatusCode::NOT_FOUND,
            text,
            &reason,
            &cx.params,
            &body,
        ));
    };
    let all = cx.state.local.checks();
    let checks = service_checks(&all, &service);
    let status = aggregated_status(checks.iter().copied());
    let info = ChecksInfo {
        aggregated_status: status,
        service: AgentServiceJson::new(&service),
        checks: checks.into_iter().map(CheckJson::new).collect(),
    };
    Ok(reply(status_code(status), text, status, &cx.params, &info))
}

/// `GET /v1/agent/health/service/name/<name>`: every instance of the service on this agent;
/// the code and text are the worst instance's (404 if there is none).
pub async fn by_name(
    cx: Ctx,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    cx.check(Resource::Service, Access::Read, &name)?;
    let text = wants_text(&cx.params, &headers);
    let all = cx.state.local.checks();
    let services: Vec<Service> = cx
        .state
        .local
        .services()
        .into_iter()
        .filter(|s| s.name == name)
        .collect();
    let mut code = StatusCode::NOT_FOUND;
    let mut status = format!("ServiceName {name} Not Found");
    let mut infos = Vec::new();
    for service in &services {
        let checks = service_checks(&all, service);
        let instance = aggregated_status(checks.iter().copied());
        let instance_code = status_code(instance);
        if code == StatusCode::NOT_FOUND || code < instance_code {
            code = instance_code;
            instance.clone_into(&mut status);
        }
        infos.push(ChecksInfo {
            aggregated_status: instance,
            service: AgentServiceJson::new(service),
            checks: checks.into_iter().map(CheckJson::new).collect(),
        });
    }
    let body = serde_json::to_value(&infos).map_err(|e| ApiError::encoding(&e))?;
    Ok(reply(code, text, &status, &cx.params, &body))
}

/// `GET /v1/agent/health/service/{id,name}/` with nothing after it.
pub async fn missing_id() -> ApiError {
    ApiError::bad_request("Missing serviceID")
}

pub async fn missing_name() -> ApiError {
    ApiError::bad_request("Missing service Name")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(id: &str, status: HealthStatus) -> Check {
        Check {
            check_id: id.to_owned(),
            status,
            ..Check::default()
        }
    }

    #[test]
    fn the_worst_check_decides_and_maintenance_wins() {
        use HealthStatus::{Critical, Passing, Warning};
        for (checks, want, code) in [
            (vec![], "passing", 200),
            (vec![check("a", Passing)], "passing", 200),
            (
                vec![check("a", Passing), check("b", Warning)],
                "warning",
                429,
            ),
            (
                vec![check("a", Critical), check("b", Warning)],
                "critical",
                503,
            ),
            (
                vec![
                    check("a", Passing),
                    check("_service_maintenance:web", Critical),
                ],
                "maintenance",
                503,
            ),
            (
                vec![check("_node_maintenance", Critical)],
                "maintenance",
                503,
            ),
        ] {
            let status = aggregated_status(&checks);
            assert_eq!(status, want, "{checks:?}");
            assert_eq!(status_code(status).as_u16(), code, "{checks:?}");
        }
    }

    #[test]
    fn text_when_asked_by_header_or_format() {
        let mut headers = HeaderMap::new();
        assert!(!wants_text(&Params::parse(None), &headers));
        assert!(wants_text(&Params::parse(Some("format=text")), &headers));
        assert!(!wants_text(&Params::parse(Some("format=json")), &headers));
        headers.insert(header::ACCEPT, "text/plain; q=1".parse().unwrap());
        assert!(wants_text(&Params::parse(None), &headers));
    }
}
