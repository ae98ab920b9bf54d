//! `vigil operator raft remove-peer|transfer-leader` and `vigil operator autopilot
//! get-config|set-config|state`: Consul's operator commands, through the local agent's HTTP API.

use clap::Args;
use vigil_shared::api::{AutopilotHealthJson, AutopilotJson};

use super::AgentAddr;
use super::members::{AutopilotCommand, OperatorCommand, RaftCommand};

#[derive(Debug, Args)]
pub struct RemovePeerArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// The server's raft ID, as `list-peers` shows it.
    #[arg(long, conflicts_with = "address", required_unless_present = "address")]
    pub id: Option<String>,
    /// The server's RPC address (IP:port).
    #[arg(long)]
    pub address: Option<String>,
}

#[derive(Debug, Args)]
pub struct TransferLeaderArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// The raft ID of the server to hand leadership to [default: the most caught-up voter].
    #[arg(long)]
    pub id: Option<String>,
}

#[derive(Debug, Args)]
pub struct SetConfigArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// Remove dead servers automatically (never below a quorum).
    #[arg(long)]
    pub cleanup_dead_servers: Option<bool>,
    /// A server further behind the leader's log than this is unhealthy.
    #[arg(long)]
    pub max_trailing_logs: Option<u64>,
    /// Go duration.
    #[arg(long)]
    pub last_contact_threshold: Option<String>,
    /// Go duration.
    #[arg(long)]
    pub server_stabilization_time: Option<String>,
    #[arg(long)]
    pub min_quorum: Option<u64>,
}

/// Reads the settings, changes what the flags give, and writes them back with `?cas=` so a
/// concurrent change is not overwritten.
async fn set_config(args: SetConfigArgs) -> anyhow::Result<i32> {
    let path = "/v1/operator/autopilot/configuration";
    let mut config: AutopilotJson = json(&args.agent, path).await?;
    let index = config.modify_index;
    if let Some(v) = args.cleanup_dead_servers {
        config.cleanup_dead_servers = v;
    }
    if let Some(v) = args.max_trailing_logs {
        config.max_trailing_logs = v;
    }
    if let Some(v) = args.last_contact_threshold {
        config.last_contact_threshold = v;
    }
    if let Some(v) = args.server_stabilization_time {
        config.server_stabilization_time = v;
    }
    if let Some(v) = args.min_quorum {
        config.min_quorum = v;
    }
    let response = call_with(
        &args.agent,
        reqwest::Method::PUT,
        &format!("{path}?cas={index}"),
        Some(serde_json::to_string(&config)?),
    )
    .await?;
    let text = response.text().await.unwrap_or_default();
    if text.trim() == "true" {
        println!("Configuration updated!");
        Ok(0)
    } else {
        println!("Configuration could not be atomically updated, please try again");
        Ok(1)
    }
}

pub async fn run(cmd: OperatorCommand) -> anyhow::Result<i32> {
    match cmd {
        OperatorCommand::Raft(RaftCommand::ListPeers(agent)) => {
            super::members::list_peers(agent).await
        }
        OperatorCommand::Raft(RaftCommand::RemovePeer(args)) => {
            let query = match (&args.id, &args.address) {
                (Some(id), _) => format!("id={id}"),
                (None, Some(address)) => format!("address={address}"),
                (None, None) => anyhow::bail!("give --id or --address"),
            };
            call(
                &args.agent,
                reqwest::Method::DELETE,
                &format!("/v1/operator/raft/peer?{query}"),
            )
            .await?;
            let peer = args.id.or(args.address).unwrap_or_default();
            println!("Removed peer with {peer}");
            Ok(0)
        }
        OperatorCommand::Raft(RaftCommand::TransferLeader(args)) => {
            let path = match &args.id {
                Some(id) => format!("/v1/operator/raft/transfer-leader?id={id}"),
                None => "/v1/operator/raft/transfer-leader".to_owned(),
            };
            call(&args.agent, reqwest::Method::POST, &path).await?;
            println!("Success");
            Ok(0)
        }
        OperatorCommand::Autopilot(AutopilotCommand::GetConfig(agent)) => {
            let config: AutopilotJson =
                json(&agent, "/v1/operator/autopilot/configuration").await?;
            println!("CleanupDeadServers = {}", config.cleanup_dead_servers);
            println!("LastContactThreshold = {}", config.last_contact_threshold);
            println!("MaxTrailingLogs = {}", config.max_trailing_logs);
            println!("MinQuorum = {}", config.min_quorum);
            println!(
                "ServerStabilizationTime = {}",
                config.server_stabilization_time
            );
            Ok(0)
        }
        OperatorCommand::Autopilot(AutopilotCommand::SetConfig(args)) => set_config(args).await,
        OperatorCommand::Autopilot(AutopilotCommand::State(agent)) => {
            let health: AutopilotHealthJson = json(&agent, "/v1/operator/autopilot/health").await?;
            println!("Healthy: {}", health.healthy);
            println!("Failure Tolerance: {}", health.failure_tolerance);
            for s in &health.servers {
                println!();
                println!("Server {} ({})", s.name, s.id);
                println!("    Address: {}", s.address);
                println!("    SerfStatus: {}", s.serf_status);
                println!("    Leader: {}", s.leader);
                println!("    Voter: {}", s.voter);
                println!("    LastIndex: {}", s.last_index);
                println!("    Healthy: {}", s.healthy);
            }
            Ok(if health.healthy { 0 } else { 2 })
        }
    }
}

/// Sends a request to the agent; a status other than 2xx is an error with the agent's text
/// (except autopilot's 429 for an unhealthy cluster, which still carries the report).
pub async fn call(
    agent: &AgentAddr,
    method: reqwest::Method,
    path: &str,
) -> anyhow::Result<reqwest::Response> {
    call_with(agent, method, path, None).await
}

/// [`call`] with a request body.
pub async fn call_with(
    agent: &AgentAddr,
    method: reqwest::Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<reqwest::Response> {
    let mut request = agent.client()?.request(method, path);
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await?;
    let status = response.status();
    if !status.is_success() && status != reqwest::StatusCode::TOO_MANY_REQUESTS {
        let text = response.text().await.unwrap_or_default();
        anyhow::bail!("{status}: {}", text.trim());
    }
    Ok(response)
}

async fn json<T: serde::de::DeserializeOwned>(agent: &AgentAddr, path: &str) -> anyhow::Result<T> {
    Ok(call(agent, reqwest::Method::GET, path)
        .await?
        .json()
        .await?)
}
