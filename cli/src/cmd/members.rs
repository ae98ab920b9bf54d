//! `vigil members`, `vigil join`, `vigil leave`, `vigil force-leave`: gossip membership through
//! the local agent; and `vigil operator raft list-peers`, the raft servers.

use clap::Args;
use vigil_shared::api::agent::{MemberJson, RaftServerJson};

use super::AgentAddr;

#[derive(Debug, Args)]
pub struct MembersArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// Gossip address of a member of the cluster to join.
    pub address: String,
}

/// `vigil operator ...`
#[derive(Debug, clap::Subcommand)]
pub enum OperatorCommand {
    /// Raft operations.
    #[command(subcommand)]
    Raft(RaftCommand),
    /// Autopilot's settings and its view of server health.
    #[command(subcommand)]
    Autopilot(AutopilotCommand),
}

#[derive(Debug, clap::Subcommand)]
pub enum RaftCommand {
    /// List the raft servers: node, ID, address, leader or follower, voter.
    ListPeers(AgentAddr),
    /// Remove a server from the raft configuration (`--id` or `--address`).
    RemovePeer(super::operator::RemovePeerArgs),
    /// Hand leadership to another server (`--id`, else the most caught-up voter).
    TransferLeader(super::operator::TransferLeaderArgs),
}

#[derive(Debug, clap::Subcommand)]
pub enum AutopilotCommand {
    /// Print autopilot's settings.
    GetConfig(AgentAddr),
    /// Change autopilot's settings (the others are kept; refused if they changed meanwhile).
    SetConfig(super::operator::SetConfigArgs),
    /// Print each server's health and the cluster's failure tolerance (exit 2 if unhealthy).
    State(AgentAddr),
}

#[derive(Debug, Args)]
pub struct ForceLeaveArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// Name of the failed node.
    pub node: String,
    /// Also remove it from the member list at once (Consul's `-prune`).
    #[arg(long)]
    pub prune: bool,
}

fn status_name(code: u8) -> &'static str {
    match code {
        1 => "alive",
        2 => "leaving",
        3 => "left",
        4 => "failed",
        _ => "unknown",
    }
}

/// Prints a `row` for each of `items`, as left-aligned columns under a header.
fn print_table<T, const N: usize>(header: [&str; N], items: &[T], row: impl Fn(&T) -> [String; N]) {
    let rows: Vec<[String; N]> = items.iter().map(row).collect();
    let header = header.map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

/// Prints a table like `consul members`.
pub async fn members(args: MembersArgs) -> anyhow::Result<i32> {
    let members = args.agent.client()?.agent_members().await?;
    let header = ["Node", "Address", "Status", "Type", "DC"];
    print_table(header, &members, |m: &MemberJson| {
        let role = if m.tags.role == "consul" {
            "server"
        } else {
            "client"
        };
        [
            m.name.clone(),
            format!("{}:{}", m.addr, m.port),
            status_name(m.status).to_owned(),
            role.to_owned(),
            m.tags.dc.clone(),
        ]
    });
    Ok(0)
}

/// `vigil operator raft list-peers`: the raft servers, like Consul's command.
pub async fn list_peers(agent: AgentAddr) -> anyhow::Result<i32> {
    let config = agent.client()?.raft_configuration().await?;
    let header = ["Node", "ID", "Address", "State", "Voter"];
    print_table(header, &config.servers, |s: &RaftServerJson| {
        [
            s.node.clone(),
            s.id.clone(),
            s.address.clone(),
            if s.leader { "leader" } else { "follower" }.to_owned(),
            s.voter.to_string(),
        ]
    });
    Ok(0)
}

pub async fn join(args: JoinArgs) -> anyhow::Result<i32> {
    args.agent.client()?.agent_join(&args.address).await?;
    println!("Successfully joined cluster by contacting 1 nodes.");
    Ok(0)
}

pub async fn leave(agent: AgentAddr) -> anyhow::Result<i32> {
    agent.client()?.agent_leave().await?;
    println!("Graceful leave complete");
    Ok(0)
}

pub async fn force_leave(args: ForceLeaveArgs) -> anyhow::Result<i32> {
    args.agent
        .client()?
        .agent_force_leave(&args.node, args.prune)
        .await?;
    Ok(0)
}
