//! `/v1/status/*` and `/v1/operator/raft/configuration`: the leader's RPC address, the raft
//! voters, and the full raft membership.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;

use vigil_shared::acl::authz::{Access, Resource};

use super::error::ApiError;
use super::params::Params;
use super::{AppState, Ctx, json};

pub async fn leader(State(state): State<AppState>, params: Params) -> Result<Response, ApiError> {
    let status = state.backend.status().await?;
    Ok(json(&params, &status.leader.unwrap_or_default()))
}

pub async fn peers(State(state): State<AppState>, params: Params) -> Result<Response, ApiError> {
    let status = state.backend.status().await?;
    let voters: Vec<String> = status
        .peers
        .into_iter()
        .filter(|p| p.voter)
        .map(|p| p.node.rpc_addr)
        .collect();
    Ok(json(&params, &voters))
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RaftServer {
    #[serde(rename = "ID")]
    id: String,
    node: String,
    address: String,
    leader: bool,
    voter: bool,
    protocol_version: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RaftConfiguration {
    servers: Vec<RaftServer>,
    index: u64,
}

/// Consul's `GET /v1/operator/raft/configuration`.
pub async fn raft_configuration(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Read, "")?;
    let status = cx.state.backend.status().await?;
    let servers = status
        .peers
        .into_iter()
        .map(|p| RaftServer {
            id: format!("{:016x}", p.node_id),
            node: p.node.name,
            address: p.node.rpc_addr,
            leader: p.leader,
            voter: p.voter,
            protocol_version: "3",
        })
        .collect();
    Ok(json(
        &cx.params,
        &RaftConfiguration {
            servers,
            index: status.config_index,
        },
    ))
}
