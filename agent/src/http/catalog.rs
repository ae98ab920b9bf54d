//! `/v1/catalog/nodes` and `/v1/health/node/<node>`: the catalog's nodes and a node's health
//! checks in Consul's shapes, blocking on the catalog index.

use axum::extract::{OriginalUri, Path, State};
use axum::response::Response;
use serde::Serialize;
use serde_json::{Map, Value};
use vigil_shared::catalog::{Check, Node};
use vigil_shared::rpc::{QueryResult, ReadQuery};

use super::error::ApiError;
use super::params::Params;
use super::{AppState, json, with_meta};

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct NodeJson<'a> {
    #[serde(rename = "ID")]
    id: &'static str,
    node: &'a str,
    address: &'a str,
    datacenter: &'static str,
    tagged_addresses: Map<String, Value>,
    meta: Map<String, Value>,
    create_index: u64,
    modify_index: u64,
}

impl<'a> NodeJson<'a> {
    fn from_node(n: &'a Node) -> NodeJson<'a> {
        let mut tagged = Map::new();
        tagged.insert("lan".into(), Value::from(n.address.as_str()));
        tagged.insert("wan".into(), Value::from(n.address.as_str()));
        NodeJson {
            id: "",
            node: &n.name,
            address: &n.address,
            datacenter: crate::DATACENTER,
            tagged_addresses: tagged,
            meta: Map::new(),
            create_index: n.create_index,
            modify_index: n.modify_index,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct CheckJson<'a> {
    node: &'a str,
    #[serde(rename = "CheckID")]
    check_id: &'a str,
    name: &'a str,
    status: &'static str,
    notes: &'static str,
    output: &'a str,
    #[serde(rename = "ServiceID")]
    service_id: &'a str,
    service_name: &'static str,
    service_tags: [&'static str; 0],
    #[serde(rename = "Type")]
    kind: &'static str,
    definition: Map<String, Value>,
    create_index: u64,
    modify_index: u64,
}

impl<'a> CheckJson<'a> {
    fn from_check(c: &'a Check) -> CheckJson<'a> {
        CheckJson {
            node: &c.node,
            check_id: &c.check_id,
            name: &c.name,
            status: c.status.as_str(),
            notes: "",
            output: &c.output,
            service_id: &c.service_id,
            service_name: "",
            service_tags: [],
            kind: "",
            definition: Map::new(),
            create_index: c.create_index,
            modify_index: c.modify_index,
        }
    }
}

pub async fn nodes(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let opts = params.query_options()?;
    let (result, meta) = state.backend.query(opts, ReadQuery::CatalogNodes).await?;
    let QueryResult::Nodes(nodes) = result else {
        return Err(ApiError::unexpected(result));
    };
    let out: Vec<NodeJson<'_>> = nodes.iter().map(NodeJson::from_node).collect();
    Ok(with_meta(meta, json(&params, &out)))
}

pub async fn node_health(
    State(state): State<AppState>,
    Path(node): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let opts = params.query_options()?;
    let (result, meta) = state
        .backend
        .query(opts, ReadQuery::NodeChecks { node })
        .await?;
    let QueryResult::Checks(checks) = result else {
        return Err(ApiError::unexpected(result));
    };
    let out: Vec<CheckJson<'_>> = checks.iter().map(CheckJson::from_check).collect();
    Ok(with_meta(meta, json(&params, &out)))
}
