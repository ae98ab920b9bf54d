//! Gossip membership through the agent: `/v1/agent/members`, `/v1/agent/join/<addr>`,
//! `/v1/agent/leave` and `/v1/agent/force-leave/<node>`, in Consul's shapes.

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::agent::{MemberJson, MemberTagsJson};
use vigil_shared::catalog::{MemberRole, MemberStatus};

use super::error::ApiError;
use super::{AppState, Ctx};
use crate::gossip::GossipError;

/// A gossip member in Consul's shape.
fn member_json(m: &MemberStatus) -> MemberJson {
    MemberJson {
        name: m.name.clone(),
        addr: m.gossip_addr.ip().to_string(),
        port: m.gossip_addr.port(),
        tags: MemberTagsJson {
            role: match m.role {
                MemberRole::Server => "consul",
                MemberRole::Client => "node",
            }
            .to_owned(),
            dc: m.datacenter.clone(),
            segment: String::new(),
            port: m.rpc_addr.port().to_string(),
            vsn: "2".to_owned(),
            vsn_min: "2".to_owned(),
            vsn_max: "3".to_owned(),
            raft_vsn: (m.role == MemberRole::Server).then(|| "3".to_owned()),
            build: env!("CARGO_PKG_VERSION").to_owned(),
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

/// This agent's own entry of `/v1/agent/members` (`Member` in `/v1/agent/self`): the member with
/// its name *and* its gossip address, so a node not admitted because an older process still
/// holds its name (see `gossip::book`) is not mistaken for that process.
pub(super) fn local_member(state: &AppState) -> Option<MemberJson> {
    let me = state.gossip.gossip_addr();
    state
        .gossip
        .members()
        .iter()
        .find(|m| m.name == state.node_name && m.gossip_addr == me)
        .map(member_json)
}

/// Consul's answer to a failed join, leave or force-leave: 500 with the error.
fn gossip_error(e: GossipError) -> ApiError {
    match e {
        GossipError::UnknownMember { name } => {
            ApiError::server(format!("agent: No node found with name '{name}'"))
        }
        e => ApiError::server(e.to_string()),
    }
}

/// Members the token may read (`node:read` on their name). With `?wan`, Consul's WAN pool:
/// one datacenter's servers, named `<node>.<dc>`, as a server sees them (a client agent is in
/// no WAN pool and lists none).
pub async fn members(cx: Ctx) -> Response {
    let wan = cx.params.has("wan");
    if wan && cx.state.backend.server().is_none() {
        return cx.json(&Vec::<MemberJson>::new());
    }
    // Pruned members are Left for the leader but no longer listed (Consul's `?prune`).
    let out: Vec<MemberJson> = cx
        .state
        .gossip
        .members()
        .iter()
        .filter(|m| !m.pruned && cx.authz.allows(Resource::Node, Access::Read, &m.name))
        .filter(|m| !wan || m.role == MemberRole::Server)
        .map(|m| {
            let mut json = member_json(m);
            if wan {
                json.name = format!("{}.{}", m.name, m.datacenter);
            }
            json
        })
        .collect();
    cx.json(&out)
}

pub async fn join(cx: Ctx, Path(addr): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Agent, Access::Write, &cx.state.node_name)?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| ApiError::server(format!("Failed to join {addr}: {e}")))?;
    // Joining oneself is a join to a member already known, as Serf counts it.
    if addr == cx.state.gossip.gossip_addr() {
        return Ok(StatusCode::OK.into_response());
    }
    cx.state.gossip.join(addr).await.map_err(gossip_error)?;
    Ok(StatusCode::OK.into_response())
}

/// Leaves the cluster gracefully, then shuts the agent down (as Consul's leave does).
pub async fn leave(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.local.stop();
    state.gossip.leave().await.map_err(gossip_error)?;
    state.shutdown.cancel();
    Ok(StatusCode::OK.into_response())
}

/// `PUT /v1/agent/force-leave/<node>[?prune]`: a failed member becomes Left (with `?prune`,
/// also no longer listed).
pub async fn force_leave(cx: Ctx, Path(node): Path<String>) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Write, "")?;
    if node == cx.state.node_name {
        // This agent is alive: as for any live member, nothing to do.
        return Ok(StatusCode::OK.into_response());
    }
    let prune = cx.params.has("prune");
    match cx.state.gossip.force_leave(&node, prune).await {
        // Consul's force-leave of a live member does nothing and answers 200.
        Ok(()) | Err(GossipError::NotFailed { .. }) => Ok(StatusCode::OK.into_response()),
        Err(e) => Err(gossip_error(e)),
    }
}
