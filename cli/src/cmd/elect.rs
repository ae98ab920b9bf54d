//! `vigil elect NAME -- CMD...`: campaign for leadership of the election on key NAME and run CMD
//! while leader (the same supervision and exit statuses as `vigil lock`); `--observe` instead
//! prints the leader, then every change ("no leader" included), one line each.

use std::time::Duration;

use clap::Args;
use futures::StreamExt as _;
use vigil_client::{Election, LockOptions};

use super::child::{Signals, run_while_held};
use super::lock::acquire_or_give_up;
use super::{AgentAddr, HoldArgs};

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// This candidate's identity, stored as the key's value [default: <hostname>:<pid>].
    #[arg(long)]
    pub value: Option<String>,
    /// Print leadership changes instead of campaigning.
    #[arg(long, conflicts_with = "command")]
    pub observe: bool,
    #[command(flatten)]
    pub hold: HoldArgs,
    #[command(flatten)]
    pub addr: AgentAddr,
    /// The election's KV key.
    pub name: String,
    /// The command to run while leader.
    #[arg(last = true, required_unless_present = "observe")]
    pub command: Vec<String>,
}

pub async fn run(args: ElectArgs) -> anyhow::Result<i32> {
    super::init_logging(args.hold.verbose);
    let mut signals = Signals::install()?;
    let client = args.addr.client()?;
    let name = args.name.trim_start_matches('/');
    let mut opts = LockOptions::new(name);
    opts.value = args
        .value
        .clone()
        .unwrap_or_else(|| format!("{}:{}", hostname(), std::process::id()))
        .into_bytes();
    opts.session = args.hold.session(format!("Vigil election '{name}'"));
    let election = Election::new(&client, opts)?;

    if args.observe {
        let mut changes = election.observe();
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(Ok(Some(leader))) => println!(
                        "leader {} (session {}, LockIndex {})",
                        String::from_utf8_lossy(&leader.value),
                        leader.session,
                        leader.lock_index
                    ),
                    Some(Ok(None)) => println!("no leader"),
                    Some(Err(e)) => eprintln!("vigil: {e}"),
                    None => return Ok(0),
                },
                sig = signals.recv() => return Ok(super::child::signal_status(sig)),
            }
        }
    }

    let campaign = election.campaign();
    let held = match acquire_or_give_up(campaign, args.hold.timeout, &mut signals, &client).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    tracing::info!(key = held.key(), lock_index = held.lock_index(), "elected");
    let code = run_while_held(held, &args.command, true, args.hold.grace, &mut signals).await?;
    client.drain_cleanups(Duration::from_secs(5)).await;
    Ok(code)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "vigil".to_owned())
}
