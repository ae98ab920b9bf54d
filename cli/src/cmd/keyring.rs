//! `vigil keyring -list | -install KEY | -use KEY | -remove KEY`: Consul's `consul keyring`,
//! through the local agent's `/v1/operator/keyring`, with its flags (Go style or `--name`) and
//! its output. Exit 0 when every live member answered and none refused, else 1 with the agent's
//! error.
//!
//! Rotating the cluster's key: `-install NEW`, then `-use NEW`, then `-remove OLD`.

use clap::Args;
use vigil_shared::api::agent::{KeyringPoolJson, KeyringRequest};

use super::AgentAddr;

/// Consul's largest relay factor.
const MAX_RELAY_FACTOR: u8 = 5;

const USAGE: &str = "Usage: vigil keyring [options]

  Manages encryption keys used for gossip messages. Gossip encryption is
  optional. When enabled, this command may be used to examine active encryption
  keys in the cluster, add new keys, and remove old ones. When combined, this
  functionality provides the ability to perform key rotation cluster-wide,
  without disrupting the cluster.

  Exactly one of -list, -install KEY, -use KEY, -remove KEY.";

#[derive(Debug, Args)]
pub struct KeyringArgs {
    #[command(flatten)]
    pub agent: AgentAddr,
    /// List the keys installed on the members, with how many hold each.
    #[arg(long)]
    pub list: bool,
    /// Install a new key on every member (it opens packets; it does not seal them yet).
    #[arg(long, value_name = "KEY")]
    pub install: Option<String>,
    /// Make an installed key the primary on every member: packets are sealed with it.
    #[arg(long = "use", value_name = "KEY")]
    pub use_key: Option<String>,
    /// Remove a key that is not the primary from every member.
    #[arg(long, value_name = "KEY")]
    pub remove: Option<String>,
    /// Consul's relay factor (0 to 5). Accepted; members' answers are made reliable by the
    /// asking agent repeating its request instead.
    #[arg(long, default_value_t = 0)]
    pub relay_factor: u8,
    /// Consul's `-local-only` (with `-list`): Vigil has one datacenter, so every list is local.
    #[arg(long)]
    pub local_only: bool,
}

/// Prints a list answer as `consul keyring -list` does: per pool, each key and on how many of
/// the pool's members it is installed.
fn print_list(pools: &[KeyringPoolJson]) {
    for pool in pools {
        let name = if pool.wan {
            "WAN".to_owned()
        } else {
            format!("{} (LAN)", pool.datacenter)
        };
        println!();
        println!("{name}:");
        for (key, count) in &pool.keys {
            println!("  {key} [{count}/{}]", pool.num_nodes);
        }
    }
}

pub async fn run(args: KeyringArgs) -> anyhow::Result<i32> {
    let changes = [
        (
            &args.install,
            reqwest::Method::POST,
            "Installing new gossip encryption key...",
        ),
        (
            &args.use_key,
            reqwest::Method::PUT,
            "Changing primary gossip encryption key...",
        ),
        (
            &args.remove,
            reqwest::Method::DELETE,
            "Removing gossip encryption key...",
        ),
    ];
    let mut actions = changes
        .into_iter()
        .filter_map(|(key, method, doing)| key.as_ref().map(|k| (Some(k), method, doing)))
        .collect::<Vec<_>>();
    if args.list {
        actions.push((
            None,
            reqwest::Method::GET,
            "Gathering installed encryption keys...",
        ));
    }
    let (key, method, doing) = match actions.len() {
        0 => {
            eprintln!("{USAGE}");
            return Ok(1);
        }
        1 => actions.remove(0),
        _ => {
            eprintln!("Only a single action is allowed");
            return Ok(1);
        }
    };
    if args.relay_factor > MAX_RELAY_FACTOR {
        eprintln!("Error parsing relay factor: Relay factor must be in range: [0, 5]");
        return Ok(1);
    }
    let mut query = Vec::new();
    if args.relay_factor > 0 {
        query.push(format!("relay-factor={}", args.relay_factor));
    }
    if args.local_only {
        query.push("local-only=true".to_owned());
    }
    let client = args.agent.client()?;
    let mut path = "/v1/operator/keyring".to_owned();
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    println!("==> {doing}");
    let mut request = client.request(method, &path);
    if let Some(key) = key {
        let body = KeyringRequest { key: key.clone() };
        request = request.body(serde_json::to_string(&body)?);
    }
    let response = request.send().await?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        eprintln!(
            "error: Unexpected response code: {} ({})",
            status.as_u16(),
            text.trim_end()
        );
        return Ok(1);
    }
    if key.is_none() {
        print_list(&serde_json::from_str::<Vec<KeyringPoolJson>>(&text)?);
    }
    Ok(0)
}
