//! `/v1/agent/metrics` (Consul's JSON, or Prometheus text with `?format=prometheus`) and the
//! middleware that times every HTTP request and logs it at debug level. Series names are in
//! `vigil_server::telemetry`.

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use vigil_server::telemetry::{self, Sink};

use vigil_shared::acl::authz::{Access, Resource};

use super::Ctx;
use super::error::ApiError;

/// The content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Consul's `GET /v1/agent/metrics`: this agent's series, runtime and gossip gauges, and a
/// server's raft and state gauges.
pub async fn metrics(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Agent, Access::Read, &cx.state.node_name)?;
    telemetry::record_runtime();
    telemetry::record_gossip(
        &cx.state.gossip.members(),
        cx.state.gossip.decrypt_failures(),
        cx.state.gossip.foreign_datacenter_drops(),
        cx.state.gossip.health_score(),
    );
    if let Some(server) = cx.state.backend.server() {
        telemetry::record_server(server);
    }
    let sink = Sink::install();
    match cx.params.get("format") {
        Some("prometheus") => {
            Ok(([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], sink.prometheus()).into_response())
        }
        _ => Ok(cx.json(&sink.consul_json())),
    }
}

/// The route a request matched, carried on its response to [`Timing::finish`].
#[derive(Clone)]
struct Route(String);

/// Tells [`Timing::finish`] which route answered (the permission guard does, inside the routes).
pub fn tag_route(response: &mut Response, route: &MatchedPath) {
    response
        .extensions_mut()
        .insert(Route(route.as_str().to_owned()));
}

/// Outside everything: times each request into `consul.http.<METHOD>.<route>` and logs method,
/// path (never the query, which may carry a token), status and duration at debug level.
pub struct Timing {
    started: Instant,
    method: Method,
    path: String,
}

impl Timing {
    pub fn start(req: &Request) -> Timing {
        Timing {
            started: Instant::now(),
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
        }
    }

    pub fn finish(self, response: &Response) {
        let elapsed = self.started.elapsed();
        let route = response
            .extensions()
            .get::<Route>()
            .map_or("/unmatched", |r| r.0.as_str());
        telemetry::http_request(self.method.as_str(), route, elapsed);
        tracing::debug!(
            method = %self.method,
            path = %self.path,
            status = response.status().as_u16(),
            duration = ?elapsed,
            "http request"
        );
    }
}
