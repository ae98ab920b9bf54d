//! `vigil session list|create|destroy|renew`: sessions from the command line. Listings and renew
//! print Consul's session JSON; create prints the new ID.

use std::time::Duration;

use clap::{Args, Subcommand};
use vigil_client::{ReadOpts, SessionRequest};
use vigil_shared::session::Behavior;

use super::{AgentAddr, parse_duration};

#[derive(Debug, Args)]
pub struct SessionCommand {
    #[command(subcommand)]
    pub action: SessionAction,
    #[command(flatten)]
    pub addr: AgentAddr,
}

#[derive(Debug, Subcommand)]
pub enum SessionAction {
    /// Print every session (or one node's with --node) as JSON.
    List {
        #[arg(long)]
        node: Option<String>,
    },
    /// Create a session and print its ID.
    Create {
        #[arg(long, default_value = "")]
        name: String,
        /// Node to bind it to [default: the agent's].
        #[arg(long)]
        node: Option<String>,
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<Duration>,
        #[arg(long, value_parser = parse_duration)]
        lock_delay: Option<Duration>,
        /// What invalidation does to held keys: release or delete.
        #[arg(long, default_value = "release", value_parser = parse_behavior)]
        behavior: Behavior,
        /// No health checks at all (by default the session depends on serfHealth).
        #[arg(long)]
        no_checks: bool,
    },
    /// Destroy (invalidate) a session.
    Destroy { id: String },
    /// Renew a TTL session and print it.
    Renew { id: String },
}

fn parse_behavior(s: &str) -> Result<Behavior, String> {
    Behavior::parse(s).ok_or_else(|| format!("must be release or delete, not {s:?}"))
}

pub async fn run(cmd: SessionCommand) -> anyhow::Result<i32> {
    let client = cmd.addr.client()?;
    match cmd.action {
        SessionAction::List { node } => {
            let sessions = match node {
                Some(node) => client.session_node(&node, ReadOpts::default()).await?.0,
                None => client.session_list(ReadOpts::default()).await?.0,
            };
            println!("{}", serde_json::to_string_pretty(&sessions)?);
        }
        SessionAction::Create {
            name,
            node,
            ttl,
            lock_delay,
            behavior,
            no_checks,
        } => {
            let request = SessionRequest {
                name,
                node,
                ttl,
                lock_delay,
                behavior,
                node_checks: no_checks.then(Vec::new),
                service_checks: None,
            };
            println!("{}", client.session_create(&request).await?);
        }
        SessionAction::Destroy { id } => {
            client.session_destroy(&id).await?;
            println!("Destroyed session {id}");
        }
        SessionAction::Renew { id } => match client.session_renew(&id).await? {
            Some(session) => println!("{}", serde_json::to_string_pretty(&session)?),
            None => {
                eprintln!("Session id '{id}' not found");
                return Ok(1);
            }
        },
    }
    Ok(0)
}
