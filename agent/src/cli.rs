//! The command line: `vigil agent --dev` and its flags, turned into an [`AgentConfig`].

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use vigil_shared::duration::parse_go_duration;

use crate::AgentConfig;

#[derive(Debug, Parser)]
#[command(
    name = "vigil",
    version,
    about = "A distributed lock and session service with a Consul-compatible API"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an agent.
    Agent(AgentArgs),
    /// Create the cluster CA and the certificates it signs.
    Tls(crate::tls_cmd::TlsCommand),
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Single node with the server role, everything in memory.
    #[arg(long, required = true)]
    pub dev: bool,
    /// Node name (default: the hostname).
    #[arg(long)]
    pub node: Option<String>,
    /// HTTP API address.
    #[arg(long, default_value = "127.0.0.1:8500")]
    pub http_addr: SocketAddr,
    /// RPC address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8300")]
    pub rpc_addr: SocketAddr,
    /// Log level filter (e.g. info, debug, vigil_server=debug).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Smallest session TTL accepted (Consul's session_ttl_min); lower it only for tests.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub session_ttl_min: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "vigil".to_owned())
}

impl AgentArgs {
    pub fn config(&self) -> AgentConfig {
        AgentConfig {
            node_name: self.node.clone().unwrap_or_else(hostname),
            http_addr: self.http_addr,
            rpc_addr: self.rpc_addr,
            session_ttl_min: self.session_ttl_min,
        }
    }
}
