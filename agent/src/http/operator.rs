//! Consul's `/v1/operator/raft/peer`, `/v1/operator/raft/transfer-leader` and
//! `/v1/operator/autopilot/*`: operating the server set through whichever agent is asked (the
//! request runs on the leader). The logic is in `vigil_server::operator`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use vigil_server::api::operations::{
    GetAutopilot, Health, RemovePeer, SetAutopilot, TransferLeader,
};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::{
    AutopilotHealthJson, AutopilotJson, ServerHealthJson, decode_case_insensitive,
};
use vigil_shared::autopilot::AutopilotConfig;
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::operator::{AutopilotHealth, OperatorError, PeerRef};

use super::Ctx;
use super::body::RequestBody;
use super::error::ApiError;

/// A raft ID as `/v1/operator/raft/configuration` prints it (16 hex digits).
fn parse_id(id: &str) -> Result<u64, ApiError> {
    u64::from_str_radix(id, 16).map_err(|_| OperatorError::UnknownId(id.to_owned()).into())
}

/// `DELETE /v1/operator/raft/peer?id=<ID>` or `?address=<IP:port>`.
pub async fn remove_peer(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Write, "")?;
    let peer = match (cx.params.get("id"), cx.params.get("address")) {
        (Some(id), _) => PeerRef::Id(parse_id(id)?),
        (None, Some(address)) => PeerRef::Address(address.to_owned()),
        (None, None) => {
            return Err(ApiError::bad_request(
                "Must specify either ?id with the server's ID or ?address with IP:port of peer to remove",
            ));
        }
    };
    cx.state.backend.operate(RemovePeer(peer)).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct TransferReply {
    success: bool,
}

/// `POST /v1/operator/raft/transfer-leader` (optionally `?id=<ID>`).
pub async fn transfer_leader(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Write, "")?;
    let to = cx
        .params
        .get("id")
        .filter(|id| !id.is_empty())
        .map(parse_id)
        .transpose()?;
    cx.state.backend.operate(TransferLeader { to }).await?;
    Ok(cx.json(&TransferReply { success: true }))
}

/// A `PUT` body: every field replaces the setting (a missing one is its zero value, as Consul
/// decodes it); names match case-insensitively.
#[derive(Deserialize, Default)]
#[serde(default)]
struct AutopilotBody {
    cleanupdeadservers: bool,
    lastcontactthreshold: String,
    maxtrailinglogs: u64,
    minquorum: u64,
    serverstabilizationtime: String,
    redundancyzonetag: String,
    disableupgrademigration: bool,
    upgradeversiontag: String,
}

/// A Go duration setting that parses; a missing one (absent, `null` or empty) is zero, which
/// Consul prints `0s`, as Go's clients parse it back.
fn duration_setting(name: &str, value: String) -> Result<String, ApiError> {
    if value.is_empty() {
        return Ok("0s".to_owned());
    }
    parse_go_duration(&value).map_err(|e| {
        ApiError::bad_request(format!("Error parsing autopilot config: {name}: {e}"))
    })?;
    Ok(value)
}

/// `GET /v1/operator/autopilot/configuration`.
pub async fn autopilot_configuration(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Read, "")?;
    let config = cx.state.backend.operate(GetAutopilot).await?;
    Ok(cx.json(&AutopilotJson::from(config)))
}

/// `PUT /v1/operator/autopilot/configuration` (`?cas=<ModifyIndex>`): `true` when applied.
pub async fn set_autopilot_configuration(
    cx: Ctx,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Write, "")?;
    let cas = cx.params.u64("cas")?;
    let body: AutopilotBody = decode_case_insensitive(&body, &[])
        .map_err(|e| ApiError::bad_request(format!("Error parsing autopilot config: {e}")))?;
    let config = AutopilotConfig {
        cleanup_dead_servers: body.cleanupdeadservers,
        last_contact_threshold: duration_setting(
            "LastContactThreshold",
            body.lastcontactthreshold,
        )?,
        max_trailing_logs: body.maxtrailinglogs,
        min_quorum: body.minquorum,
        server_stabilization_time: duration_setting(
            "ServerStabilizationTime",
            body.serverstabilizationtime,
        )?,
        redundancy_zone_tag: body.redundancyzonetag,
        disable_upgrade_migration: body.disableupgrademigration,
        upgrade_version_tag: body.upgradeversiontag,
        create_index: 0,
        modify_index: 0,
    };
    let applied = cx
        .state
        .backend
        .operate(SetAutopilot { config, cas })
        .await?;
    Ok(cx.json(&applied))
}

/// Autopilot's health in Consul's shape, this agent's version on every server.
fn health_json(h: AutopilotHealth) -> AutopilotHealthJson {
    AutopilotHealthJson {
        healthy: h.healthy,
        failure_tolerance: h.failure_tolerance,
        servers: h
            .servers
            .into_iter()
            .map(|s| ServerHealthJson {
                id: format!("{:016x}", s.id),
                name: s.name,
                address: s.address,
                serf_status: s.serf_status,
                version: env!("CARGO_PKG_VERSION").to_owned(),
                leader: s.leader,
                last_term: s.last_term,
                last_index: s.last_index,
                healthy: s.healthy,
                voter: s.voter,
            })
            .collect(),
    }
}

/// `GET /v1/operator/autopilot/health`: 200 when every server is healthy, else 429 (as Consul).
pub async fn autopilot_health(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Read, "")?;
    let health = cx.state.backend.operate(Health).await?;
    let status = if health.healthy {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut response = cx.json(&health_json(health));
    *response.status_mut() = status;
    Ok(response)
}

/// `GET /v1/operator/usage` (`operator:read`): the catalog's counts for this datacenter, in
/// Consul's shape with the query's meta in the body; the `consul` service is not billable and
/// nothing is Connect.
pub async fn usage(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Operator, Access::Read, "")?;
    let (services, meta) = cx
        .read(vigil_shared::rpc::reads::CatalogServices {})
        .await?;
    let (nodes, _) = cx
        .read_now(vigil_shared::rpc::reads::CatalogNodes {})
        .await?;
    let names: std::collections::BTreeSet<&str> =
        services.iter().map(|s| s.name.as_str()).collect();
    let billable = services
        .iter()
        .filter(|s| s.name != vigil_shared::catalog::CONSUL_SERVICE)
        .count();
    let connect = serde_json::json!({
        "api-gateway": 0, "connect-native": 0, "connect-proxy": 0, "ingress-gateway": 0,
        "mesh-gateway": 0, "terminating-gateway": 0,
    });
    let body = serde_json::json!({
        "Usage": {
            crate::DATACENTER: {
                "Services": names.len(),
                "ServiceInstances": services.len(),
                "ConnectServiceInstances": connect,
                "BillableServiceInstances": billable,
                "Nodes": nodes.len(),
            },
        },
        "Index": meta.index,
        "LastContact": meta.last_contact_ms,
        "KnownLeader": meta.known_leader,
        "ConsistencyLevel": "leader",
        "NotModified": false,
        "Backend": 0,
        "ResultsFilteredByACLs": false,
    });
    Ok(super::with_meta(meta, cx.json(&body)))
}
