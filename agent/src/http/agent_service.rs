//! `/v1/agent/service/*` and `/v1/agent/services`: this agent's own services in Consul's
//! `AgentService` shape, their registration (with embedded checks) and maintenance mode. Every
//! change is synced to the catalog before the reply.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::time::Instant;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::Service;
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::go::hashstructure as go_hash;

use super::acl::Authz;
use super::agent_check::enable_param;
use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::shapes::{TaggedAddress, keyed_by_id, service_tagged_addresses};
use super::{AppState, Ctx};
use crate::local::Source;
use crate::local::definition::parse_service_body;

/// Longest and default wait of a hash-blocking `GET /v1/agent/service/<id>`.
const MAX_WAIT: Duration = Duration::from_secs(600);
const DEFAULT_WAIT: Duration = Duration::from_secs(300);

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct WeightsJson {
    passing: i64,
    warning: i64,
}

/// Consul's `api.AgentService` as `/v1/agent/services` returns it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct AgentServiceJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    service: &'a str,
    tags: &'a [String],
    meta: &'a BTreeMap<String, String>,
    port: u16,
    address: &'a str,
    /// As registered, and from an IP `Address` (`lan_ipv4`/`wan_ipv4` or the v6 pair), as
    /// Consul's agent fills them in.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tagged_addresses: BTreeMap<String, TaggedAddress>,
    weights: WeightsJson,
    enable_tag_override: bool,
    /// Only on `GET /v1/agent/service/<id>`.
    #[serde(skip_serializing_if = "String::is_empty")]
    content_hash: String,
    datacenter: &'static str,
}

impl<'a> AgentServiceJson<'a> {
    pub(super) fn new(s: &'a Service) -> AgentServiceJson<'a> {
        AgentServiceJson {
            id: &s.id,
            service: &s.name,
            tags: &s.tags,
            meta: &s.meta,
            port: s.port,
            address: &s.address,
            tagged_addresses: service_tagged_addresses(s),
            weights: WeightsJson {
                passing: s.weights.passing,
                warning: s.weights.warning,
            },
            enable_tag_override: s.enable_tag_override,
            content_hash: String::new(),
            datacenter: crate::DATACENTER,
        }
    }

    /// With `ContentHash` set as Consul 1.8.7's agent sets it (HashiCorp's Go tests pin its
    /// value): hashstructure's hash of the reply as 1.8.7's `api.AgentService`, whose fields
    /// are these without `Datacenter`, plus `Kind` (`""`), `CreateIndex` and `ModifyIndex` (0
    /// in an agent's own state), `ContentHash` itself (still `""`) and the nil pointers `Proxy`
    /// and `Connect` (`Namespace` is tagged `hash:"ignore"`). Printed as Go's `%x`: no leading
    /// zeros, so it may be shorter than 16 digits.
    fn with_hash(mut self) -> AgentServiceJson<'a> {
        let weights = go_hash::structure(
            "AgentWeights",
            [
                ("Passing", go_hash::int(self.weights.passing)),
                ("Warning", go_hash::int(self.weights.warning)),
            ],
        );
        let hash = go_hash::structure(
            "AgentService",
            [
                ("Kind", go_hash::string("")),
                ("ID", go_hash::string(self.id)),
                ("Service", go_hash::string(self.service)),
                (
                    "Tags",
                    go_hash::slice(self.tags.iter().map(|t| go_hash::string(t))),
                ),
                (
                    "Meta",
                    go_hash::map(
                        self.meta
                            .iter()
                            .map(|(k, v)| (go_hash::string(k), go_hash::string(v))),
                    ),
                ),
                ("Port", go_hash::int(self.port.into())),
                ("Address", go_hash::string(self.address)),
                (
                    "TaggedAddresses",
                    go_hash::map(
                        self.tagged_addresses
                            .iter()
                            .map(|(tag, a)| (go_hash::string(tag), a.go_hash())),
                    ),
                ),
                ("Weights", weights),
                ("EnableTagOverride", go_hash::bool(self.enable_tag_override)),
                ("CreateIndex", go_hash::uint(0)),
                ("ModifyIndex", go_hash::uint(0)),
                ("ContentHash", go_hash::string("")),
                ("Proxy", go_hash::nil()),
                ("Connect", go_hash::nil()),
            ],
        );
        self.content_hash = format!("{hash:x}");
        self
    }
}

/// `GET /v1/agent/services`: every local service keyed by ID.
pub async fn list(cx: Ctx) -> Result<Response, ApiError> {
    let services = cx.state.local.services();
    let out = keyed_by_id(
        &cx.params,
        services
            .iter()
            .filter(|s| cx.authz.allows(Resource::Service, Access::Read, &s.name))
            .map(|s| (s.id.clone(), AgentServiceJson::new(s))),
    )?;
    Ok(cx.json(&out))
}

/// `GET /v1/agent/service/<id>`: one service with its `ContentHash` (also in
/// `X-Consul-ContentHash`). With `?hash=`, blocks until the service differs from that hash or
/// `?wait=` (default 5 min, at most 10) passes.
pub async fn get(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Read, &cx.state.node_name)?;
    let wait = match cx.params.get("wait").filter(|w| !w.is_empty()) {
        None => DEFAULT_WAIT,
        Some(w) => parse_go_duration(w)
            .map_err(|_| ApiError::bad_request("Invalid wait time"))?
            .min(MAX_WAIT),
    };
    let known = cx.params.get("hash").unwrap_or_default();
    let deadline = Instant::now() + wait;
    let mut changes = cx.state.local.watch();
    loop {
        changes.borrow_and_update();
        let service = cx.state.local.service(&id).ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, format!("unknown service ID: {id}"))
        })?;
        let reply = AgentServiceJson::new(&service).with_hash();
        let changed_or_due = known.is_empty() || reply.content_hash != known;
        if changed_or_due || Instant::now() >= deadline {
            let hash =
                HeaderValue::from_str(&reply.content_hash).map_err(|e| ApiError::encoding(&e))?;
            let mut response = cx.json(&reply);
            response.headers_mut().insert("X-Consul-ContentHash", hash);
            return Ok(response);
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() {
                return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "agent is shutting down"));
            },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// `PUT /v1/agent/service/register[?replace-existing-checks]`.
pub async fn register(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    let definition = parse_service_body(&body)?;
    let service = &definition.service;
    cx.check(Resource::Service, Access::Write, &service.name)?;
    limits::name("ID", &service.id)?;
    limits::name("Name", &service.name)?;
    limits::tags("Tags", &service.tags)?;
    definition.checks.iter().try_for_each(limits::check)?;
    // Consul: present with an empty value or `true`.
    let replace = cx
        .params
        .get("replace-existing-checks")
        .is_some_and(|v| v.is_empty() || v == "true");
    cx.state
        .local
        .add_service(definition, replace, Source::Remote)?;
    cx.state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

/// Changing a local service needs `service:write` on its name (an unknown ID is left for the
/// local state to refuse).
fn check_local_service_write(state: &AppState, authz: &Authz, id: &str) -> Result<(), ApiError> {
    match state.local.services().iter().find(|s| s.id == id) {
        Some(s) => authz.check(Resource::Service, Access::Write, &s.name),
        None => Ok(()),
    }
}

/// `PUT /v1/agent/service/deregister/<id>`: the service and its checks (invalidating the
/// sessions bound to them).
pub async fn deregister(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    check_local_service_write(&cx.state, &cx.authz, &id)?;
    cx.state.local.remove_service(&id)?;
    cx.state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

/// `PUT /v1/agent/service/maintenance/` without an ID.
pub async fn missing_maintenance_id() -> ApiError {
    ApiError::bad_request("Missing service ID")
}

/// `PUT /v1/agent/service/maintenance/<id>?enable=&reason=`: a critical
/// `_service_maintenance:<id>` check while enabled.
pub async fn maintenance(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    check_local_service_write(&cx.state, &cx.authz, &id)?;
    let enable = enable_param(&cx.params)?;
    let reason = cx.params.get("reason").unwrap_or_default();
    cx.state.local.service_maintenance(&id, enable, reason)?;
    cx.state.local.sync_now().await;
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use vigil_shared::catalog::{ServiceAddress, Weights};

    fn service(address: &str) -> Service {
        Service {
            node: "n".into(),
            id: "web1".into(),
            name: "web".into(),
            tags: vec!["v1".into()],
            address: address.into(),
            port: 80,
            tagged_addresses: BTreeMap::new(),
            meta: BTreeMap::from([("env".into(), "prod".into())]),
            weights: Weights::default(),
            enable_tag_override: false,
            create_index: 0,
            modify_index: 0,
        }
    }

    #[test]
    fn consul_agent_service_shape() {
        let s = service("");
        let v = serde_json::to_value(AgentServiceJson::new(&s)).unwrap();
        assert_eq!(
            v,
            json!({"ID": "web1", "Service": "web", "Tags": ["v1"], "Meta": {"env": "prod"},
                   "Port": 80, "Address": "", "Weights": {"Passing": 1, "Warning": 1},
                   "EnableTagOverride": false, "Datacenter": "dc1"})
        );
        let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "ID",
                "Service",
                "Tags",
                "Meta",
                "Port",
                "Address",
                "Weights",
                "EnableTagOverride",
                "Datacenter"
            ]
        );
    }

    #[test]
    fn ip_addresses_get_tagged_addresses() {
        let s = service("10.0.0.5");
        let v = serde_json::to_value(AgentServiceJson::new(&s)).unwrap();
        assert_eq!(
            v["TaggedAddresses"],
            json!({"lan_ipv4": {"Address": "10.0.0.5", "Port": 80},
                   "wan_ipv4": {"Address": "10.0.0.5", "Port": 80}})
        );
        let v6 = service("::1");
        let v = serde_json::to_value(AgentServiceJson::new(&v6)).unwrap();
        assert!(v["TaggedAddresses"].get("lan_ipv6").is_some());
        // Registered ones are kept, and one of a derived name wins over the derived.
        let mut s = service("10.0.0.5");
        for (tag, address) in [("lan", "192.168.0.1"), ("wan_ipv4", "198.51.100.1")] {
            let address = ServiceAddress {
                address: address.into(),
                port: 8080,
            };
            s.tagged_addresses.insert(tag.into(), address);
        }
        let v = serde_json::to_value(AgentServiceJson::new(&s)).unwrap();
        assert_eq!(
            v["TaggedAddresses"],
            json!({"lan": {"Address": "192.168.0.1", "Port": 8080},
                   "lan_ipv4": {"Address": "10.0.0.5", "Port": 80},
                   "wan_ipv4": {"Address": "198.51.100.1", "Port": 8080}})
        );
    }

    /// Expected values are what Consul 1.8.7 computes for the same `api.AgentService`
    /// (hashstructure 1.0.0 under Go 1.19); the first is `TestAPI_AgentService`'s.
    #[test]
    fn content_hash_is_consul_187s() {
        let hash = |s: &Service| AgentServiceJson::new(s).with_hash().content_hash;
        let mut foo = service("");
        (foo.id, foo.name, foo.port) = ("foo".into(), "foo".into(), 8000);
        foo.tags = vec!["bar".into(), "baz".into()];
        foo.meta.clear();
        assert_eq!(hash(&foo), "6b13684bfe179e67");

        let mut web = service("");
        web.meta.insert("team".into(), "a".into());
        assert_eq!(hash(&web), "b6b441edef19a840");

        // The lan_ipv4/wan_ipv4 pair derived from the address is hashed too.
        let mut tagged = web.clone();
        tagged.address = "10.0.0.5".into();
        assert_eq!(hash(&tagged), "8c93e17b96669183");

        let mut changed = web.clone();
        changed.enable_tag_override = true;
        changed.weights = Weights {
            passing: 3,
            warning: 0,
        };
        changed.tags.clear();
        assert_eq!(hash(&changed), "cd66d8a2f8791550");

        // `%x`: a hash below 2^60 has 15 digits, not a leading zero.
        let mut short = foo.clone();
        short.id = "s11".into();
        assert_eq!(hash(&short), "febf1d0744cf469");
    }
}
