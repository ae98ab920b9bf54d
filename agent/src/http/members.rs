//! Gossip membership through the agent: `/v1/agent/members`, `/v1/agent/join/<addr>`,
//! `/v1/agent/leave` and `/v1/agent/force-leave/<node>`, in Consul's shapes.

use std::net::SocketAddr;

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use vigil_shared::catalog::{MemberRole, MemberStatus};

use super::error::ApiError;
use super::params::Params;
use super::{AppState, json};
use crate::gossip::GossipError;

#[derive(Serialize)]
struct Tags {
    role: &'static str,
    dc: String,
    port: String,
    vsn: &'static str,
    build: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct MemberJson {
    name: String,
    addr: String,
    port: u16,
    tags: Tags,
    status: u8,
    protocol_min: u8,
    protocol_max: u8,
    protocol_cur: u8,
    delegate_min: u8,
    delegate_max: u8,
    delegate_cur: u8,
}

impl MemberJson {
    fn from_member(m: &MemberStatus) -> MemberJson {
        MemberJson {
            name: m.name.clone(),
            addr: m.gossip_addr.ip().to_string(),
            port: m.gossip_addr.port(),
            tags: Tags {
                role: match m.role {
                    MemberRole::Server => "consul",
                    MemberRole::Client => "node",
                },
                dc: m.datacenter.clone(),
                port: m.rpc_addr.port().to_string(),
                vsn: "2",
                build: env!("CARGO_PKG_VERSION"),
            },
            status: m.state.code(),
            protocol_min: 1,
            protocol_max: 5,
            protocol_cur: 2,
            delegate_min: 2,
            delegate_max: 5,
            delegate_cur: 4,
        }
    }
}

fn gossip_error(e: GossipError) -> ApiError {
    let status = match &e {
        GossipError::UnknownMember { .. } => StatusCode::NOT_FOUND,
        GossipError::NotFailed { .. } | GossipError::JoinSelf(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, e.to_string())
}

pub async fn members(State(state): State<AppState>, OriginalUri(uri): OriginalUri) -> Response {
    let params = Params::parse(uri.query());
    let out: Vec<MemberJson> = state
        .gossip
        .members()
        .iter()
        .map(MemberJson::from_member)
        .collect();
    json(&params, &out)
}

pub async fn join(
    State(state): State<AppState>,
    Path(addr): Path<String>,
) -> Result<Response, ApiError> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| ApiError::bad_request(format!("invalid address {addr:?}: {e}")))?;
    state.gossip.join(addr).await.map_err(gossip_error)?;
    Ok(StatusCode::OK.into_response())
}

/// Leaves the cluster gracefully, then shuts the agent down (as Consul's leave does).
pub async fn leave(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.local.stop();
    state.gossip.leave().await.map_err(gossip_error)?;
    state.shutdown.cancel();
    Ok(StatusCode::OK.into_response())
}

pub async fn force_leave(
    State(state): State<AppState>,
    Path(node): Path<String>,
) -> Result<Response, ApiError> {
    state
        .gossip
        .force_leave(&node)
        .await
        .map_err(gossip_error)?;
    Ok(StatusCode::OK.into_response())
}
