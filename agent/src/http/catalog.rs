//! `/v1/catalog/*`: register and deregister nodes, services and checks directly, and the
//! blocking reads of nodes and services in Consul's shapes.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::Path;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Map, Value};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::decode_case_insensitive;
use vigil_shared::catalog::{Check, HealthStatus, Node, SERF_HEALTH, Service, Weights};
use vigil_shared::rpc::{Registration, reads, writes};

use crate::local::definition::service_addresses;

use super::acl::Authz;
use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::params::Params;
use super::shapes::{
    NodeJson, ServiceJson, ServiceNodeJson, filtered, keyed_by_id, node_meta_matches, tags_match,
};
use super::{Ctx, json, with_meta};

/// Free-form maps whose keys are kept as sent.
pub(super) const OPAQUE: &[&str] = &[
    "taggedaddresses",
    "nodemeta",
    "meta",
    "definition",
    "header",
];

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WeightsBody {
    passing: Option<i64>,
    warning: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ServiceBody {
    pub(super) id: String,
    service: String,
    tags: Option<Vec<String>>,
    address: String,
    port: u16,
    taggedaddresses: Option<BTreeMap<String, Value>>,
    meta: Option<BTreeMap<String, String>>,
    weights: Option<WeightsBody>,
    enabletagoverride: bool,
    /// What a transaction's `cas` and `delete-cas` compare against.
    pub(super) modifyindex: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct CheckBody {
    pub(super) node: String,
    pub(super) checkid: String,
    name: String,
    status: String,
    notes: String,
    output: String,
    serviceid: String,
    #[serde(rename = "type")]
    kind: String,
    definition: Option<Map<String, Value>>,
    /// The service's name, which a transaction's ACL check of a service check asks about.
    pub(super) servicename: String,
    /// What a transaction's `cas` and `delete-cas` compare against.
    pub(super) modifyindex: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RegisterBody {
    /// Another datacenter than this one gets Consul's answer for a datacenter it has no route
    /// to (as `?dc=` does).
    datacenter: String,
    node: String,
    id: String,
    address: String,
    taggedaddresses: Option<BTreeMap<String, String>>,
    nodemeta: Option<BTreeMap<String, String>>,
    service: Option<ServiceBody>,
    check: Option<CheckBody>,
    checks: Vec<CheckBody>,
    skipnodeupdate: bool,
}

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    decode_case_insensitive(body, OPAQUE)
        .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))
}

impl WeightsBody {
    fn weights(self) -> Weights {
        let default = Weights::default();
        Weights {
            passing: self.passing.unwrap_or(default.passing),
            warning: self.warning.unwrap_or(default.warning),
        }
    }
}

pub(super) fn to_service(node: &str, body: ServiceBody) -> Result<Service, ApiError> {
    if body.service.is_empty() {
        return Err(ApiError::server(
            "Must provide service name (Service.Service) when service ID is provided",
        ));
    }
    let id = if body.id.is_empty() {
        body.service.clone()
    } else {
        body.id
    };
    limits::name("Service.ID", &id)?;
    limits::name("Service.Service", &body.service)?;
    let tags = body.tags.unwrap_or_default();
    limits::tags("Service.Tags", &tags)?;
    let meta = body.meta.unwrap_or_default();
    limits::meta("Invalid Service Meta: ", &meta)?;
    let tagged_addresses = service_addresses(body.taggedaddresses.unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?;
    Ok(Service {
        node: node.to_owned(),
        id,
        name: body.service,
        tags,
        address: body.address,
        port: body.port,
        tagged_addresses,
        meta,
        weights: body.weights.map(WeightsBody::weights).unwrap_or_default(),
        enable_tag_override: body.enabletagoverride,
        create_index: 0,
        modify_index: 0,
    })
}

pub(super) fn to_check(node: &str, body: CheckBody) -> Result<Check, ApiError> {
    if !body.node.is_empty() && body.node != node {
        return Err(ApiError::server(
            "Checks must belong to the node being registered",
        ));
    }
    let status = if body.status.is_empty() {
        HealthStatus::Critical
    } else {
        HealthStatus::parse(&body.status)
            .ok_or_else(|| ApiError::server(format!("Invalid check status: '{}'", body.status)))?
    };
    let check_id = if body.checkid.is_empty() {
        body.name.clone()
    } else {
        body.checkid
    };
    if check_id.is_empty() {
        return Err(ApiError::server("Missing check name"));
    }
    limits::name("Check.CheckID", &check_id)?;
    limits::name("Check.Name", &body.name)?;
    let kind = if body.kind.is_empty() {
        body.definition
            .as_ref()
            .map(definition_type)
            .unwrap_or_default()
            .to_owned()
    } else {
        body.kind
    };
    Ok(Check {
        node: node.to_owned(),
        check_id,
        name: body.name,
        status,
        notes: body.notes,
        output: body.output,
        service_id: body.serviceid,
        kind,
        definition: body
            .definition
            .map(|d| Value::Object(d).to_string())
            .unwrap_or_default(),
        ..Check::default()
    })
}

/// A check's `Type` when the registration names none: what its `Definition` runs, as Consul
/// reports it (`tcp` for a `TCP` address, ...), or empty.
fn definition_type(definition: &Map<String, Value>) -> &'static str {
    let set = |name: &str| {
        definition
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case(name) && v.as_str().is_some_and(|s| !s.is_empty()))
    };
    ["HTTP", "TCP", "UDP", "GRPC", "H2PING"]
        .into_iter()
        .zip(["http", "tcp", "udp", "grpc", "h2ping"])
        .find_map(|(field, kind)| set(field).then_some(kind))
        .unwrap_or_default()
}

/// `PUT /v1/catalog/register`: a node, optionally a service and checks; answers `true`.
pub async fn register(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    let registration = registration(&body)?;
    if !registration.skip_node_update {
        cx.check(Resource::Node, Access::Write, &registration.node)?;
    }
    if let Some(service) = &registration.service {
        cx.check(Resource::Service, Access::Write, &service.name)?;
    }
    for check in &registration.checks {
        check_serf_health_write(&cx.authz, &check.check_id)?;
    }
    cx.state
        .backend
        .write(writes::CatalogRegister(registration))
        .await?
        .map_err(|e| ApiError::server(e.to_string()))?;
    Ok(json(&Params::default(), &true))
}

/// A node's `serfHealth` is the gossip layer's, written by the leader: through the catalog it
/// needs a management token (`acl:write`), so that `node:write` alone cannot mark the node
/// critical and with it invalidate sessions other tokens own.
pub(super) fn check_serf_health_write(authz: &Authz, check_id: &str) -> Result<(), ApiError> {
    if check_id == SERF_HEALTH {
        authz.check(Resource::Acl, Access::Write, "")?;
    }
    Ok(())
}

/// A body's `Datacenter`: empty or this one, else Consul's 500 for a datacenter it cannot reach.
fn same_datacenter(datacenter: &str) -> Result<(), ApiError> {
    if datacenter.is_empty() || datacenter == crate::DATACENTER {
        Ok(())
    } else {
        Err(ApiError::server("No path to datacenter"))
    }
}

/// Decodes and validates a `/v1/catalog/register` body.
pub(super) fn registration(body: &[u8]) -> Result<Registration, ApiError> {
    let body: RegisterBody = decode(body)?;
    same_datacenter(&body.datacenter)?;
    if body.node.is_empty() {
        return Err(ApiError::server("Must provide node"));
    }
    if body.address.is_empty() && !body.skipnodeupdate {
        return Err(ApiError::server(
            "Must provide address if SkipNodeUpdate is not set",
        ));
    }
    let node = body.node;
    limits::name("Node", &node)?;
    let node_meta = body.nodemeta.unwrap_or_default();
    limits::meta("Invalid NodeMeta: ", &node_meta)?;
    let service = body.service.map(|s| to_service(&node, s)).transpose()?;
    let checks = body
        .check
        .into_iter()
        .chain(body.checks)
        .map(|c| to_check(&node, c))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Registration {
        node,
        node_id: body.id,
        address: body.address,
        tagged_addresses: body.taggedaddresses.unwrap_or_default(),
        node_meta,
        skip_node_update: body.skipnodeupdate,
        service,
        checks,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DeregisterBody {
    datacenter: String,
    node: String,
    serviceid: String,
    checkid: String,
}

/// `PUT /v1/catalog/deregister`: a check, a service with its checks, or a whole node.
pub async fn deregister(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    let body: DeregisterBody = decode(&body)?;
    same_datacenter(&body.datacenter)?;
    if body.node.is_empty() {
        return Err(ApiError::server("Must provide node"));
    }
    cx.check(Resource::Node, Access::Write, &body.node)?;
    check_serf_health_write(&cx.authz, &body.checkid)?;
    let backend = &cx.state.backend;
    if !body.checkid.is_empty() {
        let check = writes::DeregisterCheck {
            node: body.node,
            check_id: body.checkid,
        };
        backend.write(check).await?;
    } else if !body.serviceid.is_empty() {
        let service = writes::DeregisterService {
            node: body.node,
            service_id: body.serviceid,
        };
        backend.write(service).await?;
    } else {
        backend
            .write(writes::DeregisterNode { name: body.node })
            .await?;
    }
    Ok(json(&Params::default(), &true))
}

pub async fn nodes(cx: Ctx) -> Result<Response, ApiError> {
    let (nodes, meta) = cx.read(reads::CatalogNodes {}).await?;
    let out = nodes
        .iter()
        .filter(|n| node_meta_matches(&cx.params, n))
        .filter(|n| cx.authz.allows(Resource::Node, Access::Read, &n.name))
        .map(NodeJson::new)
        .collect();
    Ok(with_meta(meta, cx.json(&filtered(&cx.params, out)?)))
}

/// `GET /v1/catalog/datacenters`: the one datacenter this cluster is.
pub async fn datacenters(params: Params) -> Response {
    json(&params, &[crate::DATACENTER])
}

/// `GET /v1/catalog/services[?node-meta=][&filter=]`: each service name with the union of its
/// instances' tags. As in Consul, `?filter=` is matched against each instance as
/// `/v1/catalog/service/<s>` shows it (`ServiceTags`, `NodeMeta`, ...), and only the instances
/// that pass (and are on nodes with the `?node-meta=` pairs) contribute.
pub async fn services(cx: Ctx) -> Result<Response, ApiError> {
    let (mut services, meta) = cx.read(reads::CatalogServicesFull {}).await?;
    services.retain(|s| cx.authz.allows(Resource::Service, Access::Read, &s.name));
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if cx.params.has("node-meta") || cx.params.get("filter").is_some_and(|f| !f.is_empty()) {
        // The instances' nodes, read at once with the same consistency.
        let (nodes, _) = cx.read_now(reads::CatalogNodes {}).await?;
        let nodes: BTreeMap<&str, &Node> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let instances = services
            .iter()
            .filter_map(|s| Some((*nodes.get(s.node.as_str())?, s)))
            .filter(|(n, _)| node_meta_matches(&cx.params, n))
            .map(|(n, s)| ServiceNodeJson::new(n, s))
            .collect();
        for instance in filtered(&cx.params, instances)? {
            let name = instance["ServiceName"].as_str().unwrap_or_default();
            let tags = instance["ServiceTags"].as_array().into_iter().flatten();
            out.entry(name.to_owned())
                .or_default()
                .extend(tags.filter_map(Value::as_str).map(str::to_owned));
        }
    } else {
        for s in &services {
            out.entry(s.name.clone())
                .or_default()
                .extend(s.tags.iter().cloned());
        }
    }
    Ok(with_meta(meta, cx.json(&out)))
}

/// `GET /v1/catalog/service/<name>[?tag=][&node-meta=][&filter=]`.
pub async fn service(cx: Ctx, Path(name): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Service, Access::Read, &name)?;
    let (instances, meta) = cx.read(reads::CatalogServiceFull { name }).await?;
    let out = instances
        .iter()
        .filter(|(n, s)| node_meta_matches(&cx.params, n) && tags_match(&cx.params, s))
        .map(|(n, s)| ServiceNodeJson::new(n, s))
        .collect();
    Ok(with_meta(meta, cx.json(&filtered(&cx.params, out)?)))
}

/// `GET /v1/catalog/connect/<name>`: the Connect-capable instances of a service, which are none
/// (Vigil builds no Connect): an empty list with the service's index, Consul's answer for a
/// service with no Connect proxy or native instance.
pub async fn connect(cx: Ctx, Path(name): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Service, Access::Read, &name)?;
    let (_, meta) = cx.read(reads::CatalogService { name }).await?;
    Ok(with_meta(meta, cx.json(&Vec::<Value>::new())))
}

/// `GET /v1/catalog/node/<name>`: `{"Node":…,"Services":{id:…}}`, or `null` for an unknown node.
pub async fn node(cx: Ctx, Path(node): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Read, &node)?;
    let (found, meta) = cx.read(reads::CatalogNodeFull { node }).await?;
    let Some((node, services)) = &found else {
        return Ok(with_meta(meta, cx.json(&Value::Null)));
    };
    let by_id = keyed_by_id(
        &cx.params,
        services.iter().map(|s| (s.id.clone(), ServiceJson::new(s))),
    )?;
    let out = serde_json::json!({"Node": NodeJson::new(node), "Services": by_id});
    Ok(with_meta(meta, cx.json(&out)))
}
