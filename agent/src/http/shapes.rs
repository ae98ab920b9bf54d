//! Consul's JSON shapes for catalog and health data (`Node`, `ServiceNode`, `NodeService`,
//! `HealthCheck`, `CheckServiceNode`), shared by the catalog, health, query and agent
//! endpoints. Lists and maps are `[]`/`{}`, never `null`, as Consul's endpoints normalise them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Map, Value};
use vigil_shared::catalog::{Check, Node, Service, ServiceHealth, Weights};
use vigil_shared::go::hashstructure;

use super::error::ApiError;
use super::params::Params;

/// The fields that name a node, first in both a node and a service instance on it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct NodeNameJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    node: &'a str,
    address: &'a str,
    datacenter: &'static str,
    tagged_addresses: BTreeMap<&'a str, &'a str>,
}

impl<'a> NodeNameJson<'a> {
    fn new(n: &'a Node) -> NodeNameJson<'a> {
        NodeNameJson {
            id: &n.id,
            node: &n.name,
            address: &n.address,
            datacenter: crate::DATACENTER,
            tagged_addresses: tagged_addresses(n),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeJson<'a> {
    #[serde(flatten)]
    name: NodeNameJson<'a>,
    meta: &'a BTreeMap<String, String>,
    create_index: u64,
    modify_index: u64,
}

/// A node's tagged addresses; a node registered from gossip has Consul's `lan` and `wan`, with
/// `lan_ipv4`/`wan_ipv4` (or the v6 pair) for an IP address.
fn tagged_addresses(n: &Node) -> BTreeMap<&str, &str> {
    if n.tagged_addresses.is_empty() {
        let address = n.address.as_str();
        let mut out = BTreeMap::from([("lan", address), ("wan", address)]);
        match address.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => out.extend([("lan_ipv4", address), ("wan_ipv4", address)]),
            Ok(IpAddr::V6(_)) => out.extend([("lan_ipv6", address), ("wan_ipv6", address)]),
            Err(_) => {}
        }
        out
    } else {
        n.tagged_addresses
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

impl<'a> NodeJson<'a> {
    pub fn new(n: &'a Node) -> NodeJson<'a> {
        NodeJson {
            name: NodeNameJson::new(n),
            meta: &n.meta,
            create_index: n.create_index,
            modify_index: n.modify_index,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct WeightsJson {
    passing: i64,
    warning: i64,
}

impl From<Weights> for WeightsJson {
    fn from(w: Weights) -> WeightsJson {
        WeightsJson {
            passing: w.passing,
            warning: w.warning,
        }
    }
}

/// Consul's empty `Proxy` object of a plain (non-mesh) service.
fn empty_proxy() -> Value {
    serde_json::json!({"Mode": "", "MeshGateway": {}, "Expose": {}})
}

/// A service instance as `/v1/catalog/node/<n>` and `/v1/health/service/<s>` return it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    service: &'a str,
    tags: &'a [String],
    address: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tagged_addresses: BTreeMap<String, TaggedAddress>,
    meta: &'a BTreeMap<String, String>,
    port: u16,
    weights: WeightsJson,
    enable_tag_override: bool,
    proxy: Value,
    connect: Map<String, Value>,
    peer_name: &'static str,
    create_index: u64,
    modify_index: u64,
}

/// One of a service's tagged addresses.
#[derive(Serialize)]
pub struct TaggedAddress {
    #[serde(rename = "Address")]
    address: String,
    #[serde(rename = "Port")]
    port: u16,
}

impl TaggedAddress {
    /// hashstructure's hash of it as Go's `api.ServiceAddress`, for a `ContentHash`.
    pub fn go_hash(&self) -> u64 {
        hashstructure::structure(
            "ServiceAddress",
            [
                ("Address", hashstructure::string(&self.address)),
                ("Port", hashstructure::int(self.port.into())),
            ],
        )
    }
}

/// A service's tagged addresses: those it registered, and as Consul's agent fills them from an
/// IP `Address`, `lan_ipv4`/`wan_ipv4` (or the v6 pair) where it registered none of that name.
pub fn service_tagged_addresses(s: &Service) -> BTreeMap<String, TaggedAddress> {
    let mut out: BTreeMap<String, TaggedAddress> = s
        .tagged_addresses
        .iter()
        .map(|(tag, a)| {
            let address = TaggedAddress {
                address: a.address.clone(),
                port: a.port,
            };
            (tag.clone(), address)
        })
        .collect();
    let derived = match s.address.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => ["lan_ipv4", "wan_ipv4"],
        Ok(IpAddr::V6(_)) => ["lan_ipv6", "wan_ipv6"],
        Err(_) => return out,
    };
    for tag in derived {
        out.entry(tag.to_owned()).or_insert_with(|| TaggedAddress {
            address: s.address.clone(),
            port: s.port,
        });
    }
    out
}

impl<'a> ServiceJson<'a> {
    pub fn new(s: &'a Service) -> ServiceJson<'a> {
        ServiceJson {
            id: &s.id,
            service: &s.name,
            tags: &s.tags,
            address: &s.address,
            tagged_addresses: service_tagged_addresses(s),
            meta: &s.meta,
            port: s.port,
            weights: s.weights.into(),
            enable_tag_override: s.enable_tag_override,
            proxy: empty_proxy(),
            connect: Map::new(),
            peer_name: "",
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

/// A service instance with its node's fields, as `/v1/catalog/service/<s>` returns it.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceNodeJson<'a> {
    #[serde(flatten)]
    node: NodeNameJson<'a>,
    node_meta: &'a BTreeMap<String, String>,
    service_kind: &'static str,
    #[serde(rename = "ServiceID")]
    service_id: &'a str,
    service_name: &'a str,
    service_tags: &'a [String],
    service_address: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    service_tagged_addresses: BTreeMap<String, TaggedAddress>,
    service_weights: WeightsJson,
    service_meta: &'a BTreeMap<String, String>,
    service_port: u16,
    service_enable_tag_override: bool,
    service_proxy: Value,
    service_connect: Map<String, Value>,
    create_index: u64,
    modify_index: u64,
}

impl<'a> ServiceNodeJson<'a> {
    pub fn new(n: &'a Node, s: &'a Service) -> ServiceNodeJson<'a> {
        ServiceNodeJson {
            node: NodeNameJson::new(n),
            node_meta: &n.meta,
            service_kind: "",
            service_id: &s.id,
            service_name: &s.name,
            service_tags: &s.tags,
            service_address: &s.address,
            service_tagged_addresses: service_tagged_addresses(s),
            service_weights: s.weights.into(),
            service_meta: &s.meta,
            service_port: s.port,
            service_enable_tag_override: s.enable_tag_override,
            service_proxy: empty_proxy(),
            service_connect: Map::new(),
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

/// A health check (`HealthCheck`).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct CheckJson<'a> {
    node: &'a str,
    #[serde(rename = "CheckID")]
    check_id: &'a str,
    name: &'a str,
    status: &'static str,
    notes: &'a str,
    output: &'a str,
    #[serde(rename = "ServiceID")]
    service_id: &'a str,
    service_name: &'a str,
    service_tags: &'a [String],
    #[serde(rename = "Type")]
    kind: &'a str,
    interval: &'a str,
    timeout: &'a str,
    exposed_port: u16,
    definition: Value,
    create_index: u64,
    modify_index: u64,
}

impl<'a> CheckJson<'a> {
    pub fn new(c: &'a Check) -> CheckJson<'a> {
        CheckJson {
            node: &c.node,
            check_id: &c.check_id,
            name: &c.name,
            status: c.status.as_str(),
            notes: &c.notes,
            output: &c.output,
            service_id: &c.service_id,
            service_name: &c.service_name,
            service_tags: &c.service_tags,
            kind: &c.kind,
            interval: &c.interval,
            timeout: &c.timeout,
            exposed_port: 0,
            definition: serde_json::from_str(&c.definition)
                .unwrap_or_else(|_| Value::Object(Map::new())),
            create_index: c.create_index,
            modify_index: c.modify_index,
        }
    }
}

/// A service instance with its node and checks (`CheckServiceNode`).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthJson<'a> {
    node: NodeJson<'a>,
    service: ServiceJson<'a>,
    checks: Vec<CheckJson<'a>>,
}

impl<'a> HealthJson<'a> {
    pub fn new(h: &'a ServiceHealth) -> HealthJson<'a> {
        HealthJson {
            node: NodeJson::new(&h.node),
            service: ServiceJson::new(&h.service),
            checks: h.checks.iter().map(CheckJson::new).collect(),
        }
    }
}

/// Applies `?filter=` to a list response: each item is matched as the JSON object it is
/// returned as. Without the parameter the items pass through unchanged.
pub fn filtered<T: Serialize>(params: &Params, items: Vec<T>) -> Result<Vec<Value>, ApiError> {
    Ok(
        filtered_keyed(params, items.into_iter().map(|item| ((), item)))?
            .into_iter()
            .map(|((), value)| value)
            .collect(),
    )
}

/// Applies `?filter=` to an object keyed by ID (`/v1/agent/checks`, `/v1/agent/services`,
/// a node's services): each value is matched as it is returned.
pub fn keyed_by_id<T: Serialize>(
    params: &Params,
    items: impl Iterator<Item = (String, T)>,
) -> Result<Map<String, Value>, ApiError> {
    Ok(filtered_keyed(params, items)?.into_iter().collect())
}

fn filtered_keyed<K, T: Serialize>(
    params: &Params,
    items: impl Iterator<Item = (K, T)>,
) -> Result<Vec<(K, Value)>, ApiError> {
    let filter = params
        .get("filter")
        .filter(|f| !f.is_empty())
        .map(vigil_shared::go::filter::Filter::parse)
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut out = Vec::new();
    for (key, item) in items {
        let value = serde_json::to_value(item).map_err(|e| ApiError::encoding(&e))?;
        if filter.as_ref().is_none_or(|f| f.matches(&value)) {
            out.push((key, value));
        }
    }
    Ok(out)
}

/// `?node-meta=key:value` (repeatable): every pair must be in the node's metadata.
pub fn node_meta_matches(params: &Params, node: &Node) -> bool {
    params.all("node-meta").all(|pair| {
        let (k, v) = pair.split_once(':').unwrap_or((pair, ""));
        node.meta.get(k).is_some_and(|have| have == v)
    })
}

/// `?tag=` (repeatable): the service has every tag named, compared without case as Consul
/// does.
pub fn tags_match(params: &Params, service: &Service) -> bool {
    params
        .all("tag")
        .all(|tag| service.tags.iter().any(|t| t.eq_ignore_ascii_case(tag)))
}
