//! `/v1/agent/self`: this agent's configuration, membership and raft figures, in Consul's shape
//! (clients read `Config.NodeName`, `Config.Version` and `Stats.consul.leader_addr`).

use axum::extract::{OriginalUri, State};
use axum::response::Response;
use serde_json::json as json_value;

use super::error::ApiError;
use super::params::Params;
use super::{AppState, json};
use crate::backend::Backend;

pub async fn agent_self(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let status = state.backend.status().await?;
    let leader_addr = status.leader.unwrap_or_default();
    let rpc = state.rpc_addr;
    let serf = state.gossip.gossip_addr();
    let is_server = matches!(*state.backend, Backend::Local(_));
    let raft = match &*state.backend {
        Backend::Local(server) => {
            let r = server.raft_stats();
            json_value!({
                "state": r.state,
                "term": r.term.to_string(),
                "last_log_index": r.last_log_index.to_string(),
                "applied_index": r.applied_index.to_string(),
                "num_peers": r.num_peers.to_string(),
            })
        }
        Backend::Remote(_) => json_value!({}),
    };
    let blocking_queries = match &*state.backend {
        Backend::Local(server) => server.blocking_queries(),
        Backend::Remote(_) => 0,
    };
    let body = json_value!({
        "Config": {
            "Datacenter": crate::DATACENTER,
            "PrimaryDatacenter": crate::DATACENTER,
            "NodeName": state.node_name,
            "Server": is_server,
            "Revision": "",
            "Version": env!("CARGO_PKG_VERSION"),
        },
        "Member": {
            "Name": state.node_name,
            "Addr": serf.ip().to_string(),
            "Port": serf.port(),
            "Tags": {
                "role": if is_server { "consul" } else { "node" },
                "dc": crate::DATACENTER,
                "port": rpc.port().to_string(),
                "vsn": "2",
                "build": env!("CARGO_PKG_VERSION"),
            },
            "Status": 1,
        },
        "Stats": {
            "agent": {
                "http_addr": state.http_addr.to_string(),
            },
            "consul": {
                "server": is_server.to_string(),
                "leader": (is_server && leader_addr == rpc.to_string()).to_string(),
                "leader_addr": leader_addr,
                "known_servers": status.peers.len().to_string(),
                "known_datacenters": "1",
                "blocking_queries": blocking_queries.to_string(),
            },
            "raft": raft,
        },
        "Meta": {},
    });
    Ok(json(&params, &body))
}
