//! `/v1/status/*` and `/v1/operator/raft/configuration`: the leader's RPC address, the raft
//! voters, and the full raft membership.

use axum::extract::State;
use axum::response::Response;

use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::agent::{RaftConfigurationJson, RaftServerJson};

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

/// Consul's `GET /v1/operator/raft/configuration`.
pub async fn raft_configuration(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Read, "")?;
    let status = cx.state.backend.status().await?;
    let servers = status
        .peers
        .into_iter()
        .map(|p| RaftServerJson {
            id: format!("{:016x}", p.node_id),
            node: p.node.name,
            address: p.node.rpc_addr,
            leader: p.leader,
            voter: p.voter,
            protocol_version: "3".to_owned(),
        })
        .collect();
    Ok(json(
        &cx.params,
        &RaftConfigurationJson {
            servers,
            index: status.config_index,
        },
    ))
}
