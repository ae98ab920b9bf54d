//! `/v1/catalog/*`: register and deregister nodes, services and checks directly, and the
//! blocking reads of nodes and services in Consul's shapes.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{OriginalUri, Path, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Map, Value};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::decode_case_insensitive;
use vigil_shared::catalog::{Check, HealthStatus, Node, Service, Weights};
use vigil_shared::rpc::{Op, QueryOptions, Registration, Response as ServerResponse, reads};

use super::acl::Authz;
use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::params::Params;
use super::shapes::{
    NodeJson, ServiceJson, ServiceNodeJson, filtered, keyed_by_id, node_meta_matches, tags_match,
};
use super::{AppState, json, read, with_meta};

/// Free-form maps whose keys are kept as sent.
const OPAQUE: &[&str] = &[
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
struct ServiceBody {
    id: String,
    service: String,
    tags: Option<Vec<String>>,
    address: String,
    port: u16,
    meta: Option<BTreeMap<String, String>>,
    weights: Option<WeightsBody>,
    enabletagoverride: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CheckBody {
    node: String,
    checkid: String,
    name: String,
    status: String,
    notes: String,
    output: String,
    serviceid: String,
    #[serde(rename = "type")]
    kind: String,
    definition: Option<Map<String, Value>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RegisterBody {
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

fn to_service(node: &str, body: ServiceBody) -> Result<Service, ApiError> {
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
    Ok(Service {
        node: node.to_owned(),
        id,
        name: body.service,
        tags,
        address: body.address,
        port: body.port,
        meta,
        weights: body.weights.map(WeightsBody::weights).unwrap_or_default(),
        enable_tag_override: body.enabletagoverride,
        create_index: 0,
        modify_index: 0,
    })
}

fn to_check(node: &str, body: CheckBody) -> Result<Check, ApiError> {
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
    Ok(Check {
        node: node.to_owned(),
        check_id,
        name: body.name,
        status,
        notes: body.notes,
        output: body.output,
        service_id: body.serviceid,
        kind: body.kind,
        definition: body
            .definition
            .map(|d| Value::Object(d).to_string())
            .unwrap_or_default(),
        ..Check::default()
    })
}

/// `PUT /v1/catalog/register`: a node, optionally a service and checks; answers `true`.
pub async fn register(
    State(state): State<AppState>,
    authz: Authz,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    let registration = registration(&body)?;
    if !registration.skip_node_update {
        authz.check(Resource::Node, Access::Write, &registration.node)?;
    }
    if let Some(service) = &registration.service {
        authz.check(Resource::Service, Access::Write, &service.name)?;
    }
    done(&state, Op::CatalogRegister(registration)).await
}

/// Decodes and validates a `/v1/catalog/register` body.
pub(super) fn registration(body: &[u8]) -> Result<Registration, ApiError> {
    let body: RegisterBody = decode(body)?;
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
    node: String,
    serviceid: String,
    checkid: String,
}

/// `PUT /v1/catalog/deregister`: a check, a service with its checks, or a whole node.
pub async fn deregister(
    State(state): State<AppState>,
    authz: Authz,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    let body: DeregisterBody = decode(&body)?;
    if body.node.is_empty() {
        return Err(ApiError::server("Must provide node"));
    }
    authz.check(Resource::Node, Access::Write, &body.node)?;
    let op = if !body.checkid.is_empty() {
        Op::DeregisterCheck {
            node: body.node,
            check_id: body.checkid,
        }
    } else if !body.serviceid.is_empty() {
        Op::DeregisterService {
            node: body.node,
            service_id: body.serviceid,
        }
    } else {
        Op::DeregisterNode { name: body.node }
    };
    done(&state, op).await
}

/// Applies a catalog write and answers Consul's `true`; a refusal is Consul's 500.
async fn done(state: &AppState, op: Op) -> Result<Response, ApiError> {
    match state.backend.write(op).await? {
        ServerResponse::Done => Ok(json(&Params::default(), &true)),
        ServerResponse::Rejected(e) => Err(ApiError::server(e.to_string())),
        other => Err(ApiError::unexpected(other)),
    }
}

pub async fn nodes(
    State(state): State<AppState>,
    authz: Authz,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let (nodes, meta) = read(&state, &params, reads::CatalogNodes {}).await?;
    let out = nodes
        .iter()
        .filter(|n| node_meta_matches(&params, n))
        .filter(|n| authz.allows(Resource::Node, Access::Read, &n.name))
        .map(NodeJson::new)
        .collect();
    Ok(with_meta(meta, json(&params, &filtered(&params, out)?)))
}

/// `GET /v1/catalog/datacenters`: the one datacenter this cluster is.
pub async fn datacenters(OriginalUri(uri): OriginalUri) -> Response {
    json(&Params::parse(uri.query()), &[crate::DATACENTER])
}

/// `GET /v1/catalog/services[?node-meta=][&filter=]`: each service name with the union of its
/// instances' tags. As in Consul, `?filter=` is matched against each instance as
/// `/v1/catalog/service/<s>` shows it (`ServiceTags`, `NodeMeta`, ...), and only the instances
/// that pass (and are on nodes with the `?node-meta=` pairs) contribute.
pub async fn services(
    State(state): State<AppState>,
    authz: Authz,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let (mut services, meta) = read(&state, &params, reads::CatalogServices {}).await?;
    services.retain(|s| authz.allows(Resource::Service, Access::Read, &s.name));
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if params.has("node-meta") || params.get("filter").is_some_and(|f| !f.is_empty()) {
        // The instances' nodes, read at once with the same consistency.
        let options = QueryOptions {
            min_index: 0,
            wait_ms: 0,
            ..params.query_options()?
        };
        let (nodes, _) = state.backend.read(options, reads::CatalogNodes {}).await?;
        let nodes: BTreeMap<&str, &Node> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let instances = services
            .iter()
            .filter_map(|s| Some((*nodes.get(s.node.as_str())?, s)))
            .filter(|(n, _)| node_meta_matches(&params, n))
            .map(|(n, s)| ServiceNodeJson::new(n, s))
            .collect();
        for instance in filtered(&params, instances)? {
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
    Ok(with_meta(meta, json(&params, &out)))
}

/// `GET /v1/catalog/service/<name>[?tag=][&node-meta=][&filter=]`.
pub async fn service(
    State(state): State<AppState>,
    authz: Authz,
    Path(name): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    authz.check(Resource::Service, Access::Read, &name)?;
    let (instances, meta) = read(&state, &params, reads::CatalogService { name }).await?;
    let out = instances
        .iter()
        .filter(|(n, s)| node_meta_matches(&params, n) && tags_match(&params, s))
        .map(|(n, s)| ServiceNodeJson::new(n, s))
        .collect();
    Ok(with_meta(meta, json(&params, &filtered(&params, out)?)))
}

/// `GET /v1/catalog/node/<name>`: `{"Node":…,"Services":{id:…}}`, or `null` for an unknown node.
pub async fn node(
    State(state): State<AppState>,
    authz: Authz,
    Path(node): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    authz.check(Resource::Node, Access::Read, &node)?;
    let params = Params::parse(uri.query());
    let (found, meta) = read(&state, &params, reads::CatalogNode { node }).await?;
    let Some((node, services)) = &found else {
        return Ok(with_meta(meta, json(&params, &Value::Null)));
    };
    let by_id = keyed_by_id(
        &params,
        services.iter().map(|s| (s.id.clone(), ServiceJson::new(s))),
    )?;
    let out = serde_json::json!({"Node": NodeJson::new(node), "Services": by_id});
    Ok(with_meta(meta, json(&params, &out)))
}
