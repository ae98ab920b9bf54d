//! `/v1/agent/self`: this agent's configuration, membership and raft figures, in Consul's shape
//! (clients read `Config.NodeName`, `Config.Version` and `Stats.consul.leader_addr`).

use axum::extract::{OriginalUri, State};
use axum::response::Response;
use serde_json::json as json_value;

use super::params::Params;
use super::{AppState, json};

pub async fn agent_self(State(state): State<AppState>, OriginalUri(uri): OriginalUri) -> Response {
    let params = Params::parse(uri.query());
    let server = &state.server;
    let config = server.config();
    let leader_addr = server.leader_addr().unwrap_or_default();
    let raft = server.raft_stats();
    let rpc = config.rpc_addr;
    let body = json_value!({
        "Config": {
            "Datacenter": crate::DATACENTER,
            "PrimaryDatacenter": crate::DATACENTER,
            "NodeName": state.node_name,
            "NodeID": format!("{:016x}", config.node_id),
            "Server": true,
            "Revision": "",
            "Version": env!("CARGO_PKG_VERSION"),
        },
        "Member": {
            "Name": state.node_name,
            "Addr": rpc.ip().to_string(),
            "Port": rpc.port(),
            "Tags": {
                "role": "consul",
                "dc": crate::DATACENTER,
                "port": rpc.port().to_string(),
                "bootstrap": "1",
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
                "server": "true",
                "leader": (leader_addr == rpc.to_string()).to_string(),
                "leader_addr": leader_addr,
                "bootstrap": "true",
                "known_datacenters": "1",
            },
            "raft": {
                "state": raft.state,
                "term": raft.term.to_string(),
                "last_log_index": raft.last_log_index.to_string(),
                "applied_index": raft.applied_index.to_string(),
                "num_peers": raft.num_peers.to_string(),
            },
        },
        "Meta": {},
    });
    json(&params, &body)
}
