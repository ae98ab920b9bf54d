//! The Consul-compatible HTTP API: one route table, one file per resource. Handlers translate
//! HTTP into server requests and back; Consul's status codes, texts and headers are kept.

pub mod acl;
mod agent;
mod agent_check;
mod agent_health;
mod agent_service;
mod body;
mod catalog;
mod coordinate;
pub mod error;
mod event;
#[cfg(test)]
mod fuzz;
mod health;
mod history;
mod host;
mod keyring;
mod kv;
mod kv_wait;
pub mod limits;
mod lock;
mod members;
mod metrics;
mod monitor;
mod operator;
pub mod params;
mod park;
pub mod permissions;
mod query;
pub mod serve;
mod session;
pub mod shapes;
mod snapshot;
mod status;
#[cfg(test)]
mod tests;
mod txn;
mod ui;
mod vigil;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use futures::FutureExt as _;
use futures::future::Either;
use serde::Serialize;
use vigil_gossip::Gossip;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::acl::{Policy, Role};
use vigil_shared::rpc::{QueryMeta, QueryOptions};

use crate::backend::Backend;
use params::Params;

/// What every handler needs: one `Arc`, so the copies that every request's middleware and
/// handler futures hold (a waiting blocking query holds several) are a pointer each.
#[derive(Clone)]
pub struct AppState(Arc<HttpState>);

impl From<HttpState> for AppState {
    fn from(state: HttpState) -> AppState {
        AppState(Arc::new(state))
    }
}

impl std::ops::Deref for AppState {
    type Target = HttpState;

    fn deref(&self) -> &HttpState {
        &self.0
    }
}

/// The agent's state as its handlers see it ([`AppState`]).
pub struct HttpState {
    pub backend: Arc<Backend>,
    /// This agent's own services and checks.
    pub local: Arc<crate::local::LocalState>,
    pub gossip: Gossip,
    pub node_name: String,
    /// This node's UUID in the catalog.
    pub node_id: String,
    /// The bound plain-HTTP address (`None`: turned off).
    pub http_addr: Option<std::net::SocketAddr>,
    /// The bound HTTPS address (`None`: no HTTPS).
    pub https_addr: Option<std::net::SocketAddr>,
    pub rpc_addr: std::net::SocketAddr,
    /// The smallest session TTL this agent's servers accept (`/v1/agent/self`).
    pub session_ttl_min: std::time::Duration,
    /// Cancelled by `/v1/agent/leave` to stop the agent.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Re-reads the config file for `/v1/agent/reload`.
    pub reloader: Arc<crate::local::reload::Reloader>,
    /// Resolves request tokens (everything is allowed with ACLs disabled).
    pub acls: Arc<crate::acl::Acls>,
    /// The `?acquire`s waiting in this agent, by key, in arrival order.
    pub acquire_waits: vigil_server::turns::KeyTurns,
}

/// What most handlers take from a request: the agent's state, what the request's token may do,
/// and the request's URI with its query string parsed. The token is resolved first, so one that
/// does not resolve is refused before anything else about the request is looked at.
pub struct Ctx {
    pub state: AppState,
    pub authz: acl::Authz,
    pub uri: Uri,
    pub params: Params,
    /// Where the request's first blocking read waits ([`park`]).
    park: Option<park::Park>,
}

impl FromRequestParts<AppState> for Ctx {
    type Rejection = error::ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Ctx, error::ApiError> {
        let OriginalUri(uri) = OriginalUri::from_request_parts(parts, state)
            .await
            .unwrap_or_else(|never| match never {});
        // A copy of its own: the request's URI shares the connection's whole read buffer
        // (8 KiB), which a blocking query would otherwise keep alive for as long as it waits.
        let uri = Uri::try_from(uri.to_string()).unwrap_or(uri);
        let params = Params::parse(uri.query());
        // Resolved already by the route's guard when the route needs a fixed permission.
        let authz = match parts.extensions.get::<permissions::Resolved>() {
            Some(permissions::Resolved(authz)) => acl::Authz(Arc::clone(authz)),
            None => acl::Authz::resolve(parts, &params, state).await?,
        };
        Ok(Ctx {
            state: state.clone(),
            authz,
            uri,
            params,
            park: parts.extensions.remove::<park::Park>(),
        })
    }
}

impl Ctx {
    /// Refuses the request unless its token may `access` the `resource` called `name`.
    pub fn check(
        &self,
        resource: Resource,
        access: Access,
        name: &str,
    ) -> Result<(), error::ApiError> {
        self.authz.check(resource, access, name)
    }

    /// Runs a read with the blocking and consistency options of the query string (see
    /// [`Ctx::query_options`]).
    pub async fn read<Q: vigil_shared::rpc::Query>(
        &self,
        query: Q,
    ) -> Result<(Q::Output, QueryMeta), error::ApiError> {
        let opts = self.query_options(&query)?;
        let backend = &self.state.backend;
        let Some(park) = self.park.as_ref().filter(|_| crate::backend::blocks(&opts)) else {
            return Ok(backend.read(opts, query).await?);
        };
        let answer = match park.claim(backend.blocking(opts, query.into())?) {
            park::Claim::Parked => return Err(error::ApiError::parked()),
            park::Claim::Answered(resumed) => resumed.answer,
            park::Claim::Wait(blocking) => blocking.answer().await,
        };
        Ok(crate::backend::typed::<Q>(answer?)?)
    }

    /// The query string's blocking and consistency options for `query`, except that a read
    /// whose every result the token would lose to its filter does not block: it is answered
    /// at once (its index is the current one), taking none of the servers' blocking-query
    /// slots, instead of waiting for changes the token could never be shown.
    pub fn query_options<Q: vigil_shared::rpc::Query>(
        &self,
        query: &Q,
    ) -> Result<QueryOptions, error::ApiError> {
        let opts = self.params.query_options()?;
        // Only a blocking read is worth the question (and the copy of the query it takes).
        if opts.min_index > 0 && self.authz.0.sees_nothing(&query.clone().into()) {
            return Ok(QueryOptions {
                min_index: 0,
                ..opts
            });
        }
        Ok(opts)
    }

    /// A read with the query string's consistency mode that never blocks (a second read of
    /// one request, or Consul's prepared-query execute and explain).
    pub async fn read_now<Q: vigil_shared::rpc::Query>(
        &self,
        query: Q,
    ) -> Result<(Q::Output, QueryMeta), error::ApiError> {
        let opts = QueryOptions {
            consistency: self.params.query_options()?.consistency,
            ..QueryOptions::default()
        };
        Ok(self.state.backend.read(opts, query).await?)
    }

    /// A JSON body, indented under `?pretty`.
    pub fn json<T: Serialize>(&self, value: &T) -> Response {
        json(&self.params, value)
    }
}

/// The HTTP API: its routes behind the front layer ([`front`]).
pub fn router(state: AppState) -> Api {
    let kv = get(kv::get).put(kv::put).delete(kv::delete);
    let routes = Router::new()
        .route("/v1/kv", kv.clone())
        .route("/v1/kv/", kv.clone())
        .route("/v1/kv/{*key}", kv)
        .route("/v1/txn", put(txn::txn))
        .route("/v1/acl/bootstrap", put(acl::bootstrap))
        .route("/v1/acl/token", put(acl::create_token))
        .route("/v1/acl/token/self", get(acl::token_self))
        .route(
            "/v1/acl/token/{id}",
            get(acl::get_token)
                .put(acl::update_token)
                .delete(acl::delete_token),
        )
        .route("/v1/acl/token/{id}/clone", put(acl::clone_token))
        .route("/v1/acl/tokens", get(acl::list_tokens))
        .route("/v1/acl/policy", put(acl::create::<Policy>))
        .route(
            "/v1/acl/policy/{id}",
            get(acl::get::<Policy>)
                .put(acl::update::<Policy>)
                .delete(acl::delete::<Policy>),
        )
        .route(
            "/v1/acl/policy/name/{name}",
            get(acl::get_by_name::<Policy>),
        )
        .route("/v1/acl/policies", get(acl::list_policies))
        .route("/v1/acl/role", put(acl::create::<Role>))
        .route(
            "/v1/acl/role/{id}",
            get(acl::get::<Role>)
                .put(acl::update::<Role>)
                .delete(acl::delete::<Role>),
        )
        .route("/v1/acl/role/name/{name}", get(acl::get_by_name::<Role>))
        .route("/v1/acl/roles", get(acl::list_roles))
        .route("/v1/acl/replication", get(acl::replication))
        .route("/v1/acl/login", axum::routing::post(acl::login))
        .route("/v1/acl/logout", axum::routing::post(acl::logout))
        .route("/v1/agent/token/{kind}", put(acl::set_agent_token))
        .route("/v1/agent/host", get(host::host_info))
        .route("/v1/coordinate/datacenters", get(coordinate::datacenters))
        .route("/v1/coordinate/nodes", get(coordinate::nodes))
        .route("/v1/coordinate/node/{node}", get(coordinate::node))
        .route("/v1/catalog/connect/{service}", get(catalog::connect))
        .route("/v1/snapshot", get(snapshot::save).put(snapshot::restore))
        .route("/v1/session/create", put(session::create))
        .route("/v1/session/destroy/", put(session::missing_id))
        .route("/v1/session/destroy/{id}", put(session::destroy))
        .route("/v1/session/renew/", put(session::missing_id))
        .route("/v1/session/renew/{id}", put(session::renew))
        .route("/v1/session/info/", get(session::missing_id))
        .route("/v1/session/info/{id}", get(session::info))
        .route("/v1/session/list", get(session::list))
        .route("/v1/session/node/", get(session::missing_node))
        .route("/v1/session/node/{node}", get(session::node))
        .route("/v1/status/leader", get(status::leader))
        .route("/v1/status/peers", get(status::peers))
        .route(
            "/v1/operator/raft/configuration",
            get(status::raft_configuration),
        )
        .route(
            "/v1/operator/raft/peer",
            axum::routing::delete(operator::remove_peer),
        )
        .route(
            "/v1/operator/raft/transfer-leader",
            axum::routing::post(operator::transfer_leader).put(operator::transfer_leader),
        )
        .route(
            "/v1/operator/autopilot/configuration",
            get(operator::autopilot_configuration).put(operator::set_autopilot_configuration),
        )
        .route(
            "/v1/operator/autopilot/health",
            get(operator::autopilot_health),
        )
        .route("/v1/operator/usage", get(operator::usage))
        .route(
            "/v1/operator/keyring",
            get(keyring::keyring)
                .post(keyring::keyring)
                .put(keyring::keyring)
                .delete(keyring::keyring),
        )
        .route("/v1/agent/self", get(agent::agent_self))
        .route("/v1/agent/metrics", get(metrics::metrics))
        .route("/v1/agent/reload", put(monitor::reload))
        .route("/v1/agent/monitor", get(monitor::monitor))
        .route("/v1/agent/members", get(members::members))
        .route("/v1/agent/join/{addr}", put(members::join))
        .route("/v1/agent/leave", put(members::leave))
        .route("/v1/agent/force-leave/{node}", put(members::force_leave))
        .route("/v1/agent/checks", get(agent_check::list))
        .route("/v1/agent/check/register", put(agent_check::register))
        .route(
            "/v1/agent/check/deregister/{*id}",
            put(agent_check::deregister),
        )
        .route("/v1/agent/check/pass/{*id}", put(agent_check::pass))
        .route("/v1/agent/check/warn/{*id}", put(agent_check::warn))
        .route("/v1/agent/check/fail/{*id}", put(agent_check::fail))
        .route("/v1/agent/check/update/{*id}", put(agent_check::update))
        .route("/v1/agent/maintenance", put(agent_check::node_maintenance))
        .route("/v1/agent/services", get(agent_service::list))
        .route(
            "/v1/agent/health/service/id/",
            get(agent_health::missing_id),
        )
        .route(
            "/v1/agent/health/service/id/{*id}",
            get(agent_health::by_id),
        )
        .route(
            "/v1/agent/health/service/name/",
            get(agent_health::missing_name),
        )
        .route(
            "/v1/agent/health/service/name/{*name}",
            get(agent_health::by_name),
        )
        .route("/v1/agent/service/register", put(agent_service::register))
        .route(
            "/v1/agent/service/deregister/{*id}",
            put(agent_service::deregister),
        )
        .route(
            "/v1/agent/service/maintenance/",
            put(agent_service::missing_maintenance_id),
        )
        .route(
            "/v1/agent/service/maintenance/{*id}",
            put(agent_service::maintenance),
        )
        .route("/v1/agent/service/{*id}", get(agent_service::get))
        .route("/v1/event/fire/", put(event::missing_name))
        .route("/v1/event/fire/{name}", put(event::fire))
        .route("/v1/event/list", get(event::list))
        .route("/v1/catalog/register", put(catalog::register))
        .route("/v1/catalog/deregister", put(catalog::deregister))
        .route("/v1/catalog/nodes", get(catalog::nodes))
        .route("/v1/catalog/services", get(catalog::services))
        .route("/v1/catalog/datacenters", get(catalog::datacenters))
        .route("/v1/catalog/service/{name}", get(catalog::service))
        .route("/v1/catalog/node/{node}", get(catalog::node))
        .route("/v1/health/node/{node}", get(health::node))
        .route("/v1/health/checks/{service}", get(health::service_checks))
        .route("/v1/health/service/{service}", get(health::service))
        .route("/v1/health/state/", get(health::missing_state))
        .route("/v1/health/state/{state}", get(health::state))
        .route("/v1/query", get(query::list).post(query::create))
        .route(
            "/v1/query/{id}",
            get(query::get).put(query::update).delete(query::delete),
        )
        .route("/v1/query/{id}/execute", get(query::execute))
        .route("/v1/query/{id}/explain", get(query::explain))
        .route("/v1/vigil/sequencer", get(vigil::sequencer))
        .route("/v1/vigil/locks", get(vigil::locks))
        .route("/v1/vigil/history", get(history::under))
        .route("/v1/vigil/history/{*name}", get(history::named))
        .route(
            "/v1/vigil/lock/{*name}",
            get(lock::get).put(lock::change).delete(lock::change),
        )
        .route("/", get(ui::root))
        .route("/ui", get(ui::root))
        .route("/ui/", get(ui::index))
        .route("/ui/{*file}", get(ui::asset))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            permissions::guard,
        ))
        .fallback(not_found)
        // Handlers read bodies through `body`, which applies the limits; this bounds any
        // extractor that would buffer a body without it.
        .layer(axum::extract::DefaultBodyLimit::max(limits::BODY_MAX))
        .with_state(state);
    Api::new(routes)
}

/// Routes behind the front layer ([`front`]), which is outside them, so the 405 rewrite sees
/// the `Allow` header axum sets per route. Not an axum middleware: axum boxes the future of
/// each layer and of the router, and a waiting blocking query would hold them all. Here a
/// request's one future is [`front`]'s, and each run of the routes is boxed on its own
/// ([`park::run`]), so a waiting query holds none.
#[derive(Clone)]
pub struct Api {
    routes: Router,
}

impl Api {
    /// `routes` behind the front layer.
    pub fn new(routes: Router) -> Api {
        Api { routes }
    }

    /// Answers `req`.
    pub fn answer(&self, req: Request) -> impl Future<Output = Response> + Send + use<> {
        front(req, self.routes.clone())
    }
}

/// What `routes` answer `req`: a router never fails.
fn run_routes(mut routes: Router, req: Request) -> impl Future<Output = Response> + Send {
    use tower_service::Service as _;
    routes.call(req).map(|answer| match answer {
        Ok(response) => response,
        Err(never) => match never {},
    })
}

/// In front of the routes, in the order a request meets them: timed ([`metrics::Timing`]), its
/// path cleaned (Consul's 301), its datacenter checked, a blocking query's wait kept
/// ([`park`]), and a 405 rewritten as Consul's. One function rather than five layers: axum
/// boxes the future of every layer it wraps. Not an `async fn`, which would keep its arguments
/// (a request is about 250 bytes) for as long as it runs: a waiting blocking query holds this
/// future, which keeps only the timing, the method and [`park::run`]'s future.
fn front(req: Request, routes: Router) -> impl Future<Output = Response> + Send {
    let timing = metrics::Timing::start(&req);
    let method = req.method().clone();
    let answer = match redirect_unclean_path(&req).or_else(|| other_datacenter(&req)) {
        Some(answer) => Either::Left(std::future::ready(answer)),
        None => Either::Right(park::run(req, routes).map(move |r| consul_405(&method, r))),
    };
    answer.map(move |response| {
        timing.finish(&response);
        response
    })
}

/// One datacenter: a request for another (`?dc=`, or `?datacenter=`, which wins) gets Consul's
/// answer for a datacenter it has no route to, instead of this one's data.
fn other_datacenter(req: &Request) -> Option<Response> {
    let params = Params::parse(req.uri().query());
    let asked = params
        .get("datacenter")
        .or_else(|| params.get("dc"))
        .filter(|dc| !dc.is_empty());
    asked
        .is_some_and(|dc| dc != crate::DATACENTER)
        .then(|| error::ApiError::server("No path to datacenter").into_response())
}

/// Consul's router is Go's `http.ServeMux`, which answers a path with `//`, `.` or `..`
/// segments with a 301 to the cleaned path (the query kept) before any handler sees it; so
/// `PUT /v1/kv//x` never stores the key `/x`.
fn redirect_unclean_path(req: &Request) -> Option<Response> {
    let path = req.uri().path();
    let clean = vigil_shared::go::path::clean(path);
    if clean == path || req.method() == Method::CONNECT {
        return None;
    }
    let location = match req.uri().query().filter(|q| !q.is_empty()) {
        Some(query) => format!("{clean}?{query}"),
        None => clean,
    };
    // Made of a URI's characters, so always a valid header value.
    HeaderValue::from_str(&location)
        .ok()
        .map(|value| go_redirect(req.method(), value))
}

/// Go's `http.Redirect` with 301: a `Location` header; GET also gets a small HTML body and HEAD
/// its content type.
fn go_redirect(method: &Method, location: HeaderValue) -> Response {
    let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
    let href = location
        .to_str()
        .unwrap_or_default()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;");
    response.headers_mut().insert(header::LOCATION, location);
    if method == Method::GET || method == Method::HEAD {
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
    }
    if method == Method::GET {
        *response.body_mut() = Body::from(format!("<a href=\"{href}\">Moved Permanently</a>.\n\n"));
    }
    response
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

/// Consul answers a wrong method with 405, an `Allow` header that includes OPTIONS, and
/// `method X not allowed`; an OPTIONS request gets 200 with the same `Allow` header. `response`
/// is the router's answer to a request with `method`.
fn consul_405(method: &Method, response: Response) -> Response {
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let mut allowed: Vec<String> = response
        .headers()
        .get(header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect()
        })
        .unwrap_or_default();
    allowed.retain(|m| m != "HEAD");
    allowed.insert(0, "OPTIONS".to_owned());
    let allow = allowed.join(",");
    if *method == Method::OPTIONS {
        return (StatusCode::OK, [(header::ALLOW, allow)]).into_response();
    }
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [
            (header::ALLOW, allow),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
        ],
        format!("method {method} not allowed"),
    )
        .into_response()
}

/// A JSON body; under `?pretty` indented by four spaces with a trailing newline, as Consul's
/// `json.MarshalIndent(obj, "", "    ")` prints it.
pub fn json<T: Serialize>(params: &Params, value: &T) -> Response {
    let body = if params.pretty() {
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        value.serialize(&mut serializer).map(|()| {
            out.push(b'\n');
            out
        })
    } else {
        serde_json::to_vec(value)
    };
    match body {
        Ok(body) => (
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(body),
        )
            .into_response(),
        Err(e) => {
            error::ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

/// Runs a read with the blocking and consistency options of the query string.
pub async fn read<Q: vigil_shared::rpc::Query>(
    state: &AppState,
    params: &Params,
    query: Q,
) -> Result<(Q::Output, QueryMeta), error::ApiError> {
    Ok(state.backend.read(params.query_options()?, query).await?)
}

/// Adds Consul's read headers: `X-Consul-Index`, `X-Consul-KnownLeader`, `X-Consul-LastContact`.
pub fn with_meta(meta: QueryMeta, mut response: Response) -> Response {
    set_leader_headers(response.headers_mut(), meta);
    response
        .headers_mut()
        .insert("X-Consul-Index", HeaderValue::from(meta.index));
    response
}

/// The leader headers alone (the read-only txn path sends no index).
pub fn set_leader_headers(headers: &mut HeaderMap, meta: QueryMeta) {
    headers.insert(
        "X-Consul-KnownLeader",
        HeaderValue::from_static(if meta.known_leader { "true" } else { "false" }),
    );
    headers.insert(
        "X-Consul-LastContact",
        HeaderValue::from(meta.last_contact_ms),
    );
}

/// A 404 with an empty body and the read headers (a missing key).
pub fn not_found_with_meta(meta: QueryMeta) -> Response {
    with_meta(meta, StatusCode::NOT_FOUND.into_response())
}
