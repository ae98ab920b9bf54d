//! `/v1/agent/self`: this agent's configuration, membership and raft figures, with every
//! top-level section Consul returns (`Config`, `DebugConfig`, `Coord`, `Member`, `Stats`, `Meta`,
//! `xDS`); clients read `Config.NodeName`, `Config.Version`, `Member` and
//! `Stats.consul.leader_addr`.

use axum::response::Response;
use serde_json::json as json_value;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::go::duration::format_go_duration;

use super::Ctx;
use super::error::ApiError;
use super::members::local_member;

pub async fn agent_self(cx: Ctx) -> Result<Response, ApiError> {
    let state = &cx.state;
    cx.check(Resource::Agent, Access::Read, &state.node_name)?;
    let status = state.backend.status().await?;
    let leader_addr = status.leader.unwrap_or_default();
    let rpc = state.rpc_addr;
    let serf = state.gossip.gossip_addr();
    let server = state.backend.server();
    let is_server = server.is_some();
    let raft = match server {
        Some(server) => {
            let r = server.raft_stats();
            json_value!({
                "state": r.state,
                "term": r.term.to_string(),
                "last_log_index": r.last_log_index.to_string(),
                "applied_index": r.applied_index.to_string(),
                "num_peers": r.num_peers.to_string(),
                "protocol_level": r.protocol.to_string(),
            })
        }
        None => json_value!({}),
    };
    let blocking_queries = server.map_or(0, |server| server.blocking_queries());
    let (watchers, server_waits) = state.backend.blocking_queries();
    let member = match local_member(state) {
        Some(member) => json_value!(member),
        None => {
            json_value!({"Name": state.node_name, "Addr": serf.ip().to_string(), "Port": serf.port()})
        }
    };
    let ttl_min = format_go_duration(state.session_ttl_min);
    // Consul reports a listener that is off as port -1.
    let port = |addr: Option<std::net::SocketAddr>| addr.map_or(-1, |a| i32::from(a.port()));
    let client_ip = state
        .http_addr
        .or(state.https_addr)
        .map(|a| a.ip().to_string());
    let body = json_value!({
        "Config": {
            "Datacenter": crate::DATACENTER,
            "PrimaryDatacenter": crate::DATACENTER,
            "NodeName": state.node_name,
            "NodeID": state.node_id,
            "Server": is_server,
            "Revision": "",
            "Version": env!("CARGO_PKG_VERSION"),
            "BuildDate": "",
            // Nanoseconds, as older Consul printed it here, and as Patroni reads it to adapt
            // its TTL (`DebugConfig` has the Go duration string).
            "SessionTTLMin": u64::try_from(state.session_ttl_min.as_nanos()).unwrap_or(u64::MAX),
        },
        // A few of Consul's sanitized runtime settings, under its names.
        "DebugConfig": {
            "Datacenter": crate::DATACENTER,
            "NodeName": state.node_name,
            "ServerMode": is_server,
            "SessionTTLMin": ttl_min,
            "ClientAddrs": client_ip.into_iter().collect::<Vec<_>>(),
            "HTTPPort": port(state.http_addr),
            "HTTPSPort": port(state.https_addr),
            "SerfBindAddrLAN": serf.to_string(),
            // Consul prints the address it advertises as a URL.
            "SerfAdvertiseAddrLAN": format!("tcp://{serf}"),
            "ServerPort": rpc.port(),
            "NodeMeta": state.local.node_meta(),
            "EnableRemoteScriptChecks": state.local.remote_scripts(),
            "EnableLocalScriptChecks": state.local.local_scripts(),
        },
        // Vigil keeps no network coordinates: the origin, as a new Consul node reports.
        "Coord": super::coordinate::origin(),
        "Member": member,
        "xDS": {"SupportedProxies": {"envoy": []}, "Port": -1, "Ports": {"Plaintext": -1, "TLS": -1}},
        "Stats": {
            "build": {
                "prerelease": "",
                "revision": "",
                "version": env!("CARGO_PKG_VERSION"),
                "version_metadata": "",
            },
            "runtime": {
                "arch": std::env::consts::ARCH,
                "os": std::env::consts::OS,
                "cpu_count": std::thread::available_parallelism().map_or(1, usize::from).to_string(),
            },
            "serf_lan": {
                "members": state.gossip.members().len().to_string(),
            },
            "agent": {
                "http_addr": state.http_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
                "https_addr": state.https_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
                // This agent's clients' blocking queries, and the waits on the servers they
                // share (one per distinct read).
                "blocking_queries": watchers.to_string(),
                "server_waits": server_waits.to_string(),
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
        "Meta": state.local.node_meta(),
    });
    Ok(cx.json(&body))
}
