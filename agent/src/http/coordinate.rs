//! `/v1/coordinate/*`: Vigil keeps no network coordinates (no Vivaldi estimates ride on its
//! gossip), so every node sits at the origin, the coordinate a new Consul node starts from and
//! the one `/v1/agent/self` reports. Tools that sort by round-trip time see every node as
//! equally near. Updates are not accepted (the route is not served).

use axum::extract::Path;
use axum::response::Response;
use serde_json::{Value, json};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::{MemberRole, MemberState};
use vigil_shared::rpc::reads;

use super::error::ApiError;
use super::{Ctx, not_found_with_meta, with_meta};

/// The origin in Consul's 8-dimensional Vivaldi space, with a new node's error and height.
pub fn origin() -> Value {
    json!({"Vec": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "Error": 1.5, "Adjustment": 0.0,
           "Height": 1.0e-5})
}

/// `GET /v1/coordinate/datacenters`: this datacenter with its live servers (as `<node>.<dc>`).
pub async fn datacenters(cx: Ctx) -> Result<Response, ApiError> {
    let servers: Vec<Value> = cx
        .state
        .gossip
        .members()
        .iter()
        .filter(|m| m.role == MemberRole::Server && m.state == MemberState::Alive)
        .map(|m| json!({"Node": format!("{}.{}", m.name, m.datacenter), "Coord": origin()}))
        .collect();
    let dc = crate::DATACENTER;
    Ok(cx.json(&json!([{"Datacenter": dc, "AreaID": "wan", "Coordinates": servers}])))
}

fn entry(node: &str) -> Value {
    json!({"Node": node, "Segment": "", "Coord": origin()})
}

/// `GET /v1/coordinate/nodes`: every node of the catalog the token may read.
pub async fn nodes(cx: Ctx) -> Result<Response, ApiError> {
    let (nodes, meta) = cx.read(reads::CatalogNodes {}).await?;
    let out: Vec<Value> = nodes
        .iter()
        .filter(|n| cx.authz.allows(Resource::Node, Access::Read, &n.name))
        .map(|n| entry(&n.name))
        .collect();
    Ok(with_meta(meta, cx.json(&out)))
}

/// `GET /v1/coordinate/node/<node>`: the node's coordinate, 404 for a node not in the catalog.
pub async fn node(cx: Ctx, Path(node): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Node, Access::Read, &node)?;
    let (found, meta) = cx.read(reads::CatalogNode { node: node.clone() }).await?;
    if found.is_none() {
        return Ok(not_found_with_meta(meta));
    }
    Ok(with_meta(meta, cx.json(&[entry(&node)])))
}
