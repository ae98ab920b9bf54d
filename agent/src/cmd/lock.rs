//! `vigil lock [--limit N] [--fair] [--timeout D] [--ttl D] [--lock-delay D] [--grace D] PREFIX
//! -- CMD...`: run CMD while holding a lock on PREFIX, as `consul lock` does (limit 1: an
//! `api.Lock` on `<prefix>/.lock`; limit N: an `api.Semaphore` on the prefix; `--fair`: the
//! first-come, first-served mutex), and `vigil lock status PREFIX`.
//!
//! Exit status: the child's (128+N if signal N killed it); [`EXIT_LOST`] if the lock was lost
//! and the child terminated; [`EXIT_TIMEOUT`] if `--timeout` ran out before the lock was held;
//! 128+N if signal N arrived while waiting; 126/127 if CMD could not be run; 1 for other errors.

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;
use vigil_shared::client::{
    Client, ClientError, FairMutex, FairOptions, Held, Lock, LockOptions, SEMAPHORE_KEY, Semaphore,
    SemaphoreOptions, path,
};

pub use super::child::EXIT_LOST;
use super::child::{Signals, run_while_held, signal_status};
use super::{AgentAddr, HoldArgs};

/// Exit status when `--timeout` ran out while waiting for the lock (as `timeout(1)` uses).
pub const EXIT_TIMEOUT: i32 = 124;
/// How long cleanup (leaving the queue, destroying the session) may take before exiting.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LockCommand {
    #[command(subcommand)]
    pub action: Option<LockAction>,
    #[command(flatten)]
    pub run: LockArgs,
}

#[derive(Debug, Subcommand)]
pub enum LockAction {
    /// Show who holds locks under a prefix, semaphore holders and fair-lock queues.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub prefix: String,
    /// Print the `/v1/vigil/locks` JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub addr: AgentAddr,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// How many may hold the lock at once (more than 1: a semaphore).
    #[arg(long, short = 'n', default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
    pub limit: i64,
    /// First come, first served: waiters get the lock in arrival order.
    #[arg(long)]
    pub fair: bool,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// Session name [default: "Consul lock for '<command>' at '<prefix>'"].
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub addr: AgentAddr,
    /// KV prefix of the lock.
    #[arg(required = true)]
    pub prefix: Option<String>,
    /// The command to run while holding the lock.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub async fn run(cmd: LockCommand) -> anyhow::Result<i32> {
    match cmd.action {
        Some(LockAction::Status(args)) => status(args).await,
        None => run_locked(cmd.run).await,
    }
}

/// The three ways to lock a prefix.
enum Recipe {
    Lock(Lock),
    Semaphore(Semaphore),
    Fair(FairMutex),
}

impl Recipe {
    async fn acquire(&self) -> Result<Held, ClientError> {
        match self {
            Recipe::Lock(l) => l.acquire().await,
            Recipe::Semaphore(s) => s.acquire().await,
            Recipe::Fair(f) => f.acquire().await,
        }
    }
}

async fn run_locked(args: LockArgs) -> anyhow::Result<i32> {
    super::init_logging(args.hold.verbose);
    let mut signals = Signals::install()?;
    let prefix = args.prefix.clone().unwrap_or_default();
    let prefix = prefix.trim_start_matches('/');
    if prefix.is_empty() {
        anyhow::bail!("Key prefix and child command must be specified");
    }
    if args.fair && args.limit != 1 {
        anyhow::bail!("--fair is a mutex: it cannot be combined with --limit");
    }
    let client = args.addr.client()?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("Consul lock for '{}' at '{prefix}'", args.command.join(" ")));
    let recipe = if args.fair {
        let mut opts = FairOptions::new(prefix);
        opts.session_name = name;
        opts.session_ttl = args.hold.ttl;
        opts.lock_delay = args.hold.lock_delay;
        tracing::info!(%prefix, "setting up a fair lock");
        Recipe::Fair(FairMutex::new(&client, opts)?)
    } else if args.limit == 1 {
        let key = path::join(&[prefix, SEMAPHORE_KEY]);
        tracing::info!(%key, "setting up lock");
        let mut opts = LockOptions::new(key);
        opts.session_name = name;
        opts.session_ttl = args.hold.ttl;
        opts.lock_delay = args.hold.lock_delay;
        Recipe::Lock(Lock::new(&client, opts)?)
    } else {
        tracing::info!(%prefix, limit = args.limit, "setting up semaphore");
        let mut opts = SemaphoreOptions::new(prefix, args.limit);
        opts.session_name = name;
        opts.session_ttl = args.hold.ttl;
        opts.lock_delay = args.hold.lock_delay;
        Recipe::Semaphore(Semaphore::new(&client, opts)?)
    };

    let waiting = recipe.acquire();
    let held = match acquire_or_give_up(waiting, args.hold.timeout, &mut signals, &client).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    tracing::info!(
        key = held.key(),
        lock_index = held.lock_index(),
        "lock held"
    );
    let code = run_while_held(held, &args.command, args.hold.grace, &mut signals).await?;
    client.drain_cleanups(CLEANUP_LIMIT).await;
    Ok(code)
}

/// Waits for the lock; `Ok(Err(status))` when a signal or the timeout ended the wait (the
/// session and any queue entry are cleaned up first).
pub(crate) async fn acquire_or_give_up(
    waiting: impl Future<Output = Result<Held, ClientError>>,
    timeout: Option<Duration>,
    signals: &mut Signals,
    client: &Client,
) -> anyhow::Result<Result<Held, i32>> {
    let deadline = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        held = waiting => Ok(held.map_err(|e| anyhow::anyhow!("Lock acquisition failed: {e}"))?),
        sig = signals.recv() => {
            eprintln!("vigil: {sig} while waiting for the lock; giving up");
            Err(signal_status(sig))
        }
        () = deadline => {
            eprintln!("vigil: timed out waiting for the lock");
            Err(EXIT_TIMEOUT)
        }
    };
    if outcome.is_err() {
        client.drain_cleanups(CLEANUP_LIMIT).await;
    }
    Ok(outcome)
}

/// `vigil lock status PREFIX`.
async fn status(args: StatusArgs) -> anyhow::Result<i32> {
    let client = args.addr.client()?;
    let report = client
        .vigil_locks(args.prefix.trim_start_matches('/'))
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    print!("{}", render_status(&report));
    Ok(0)
}

/// The human form of a `/v1/vigil/locks` report.
fn render_status(report: &Value) -> String {
    let mut out = String::new();
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let holder = |v: &Value| {
        format!(
            "session {} ({}) on node {}",
            text(&v["Session"]),
            text(&v["SessionName"]),
            text(&v["Node"])
        )
    };
    let empty = |key: &str| report[key].as_array().is_none_or(Vec::is_empty);
    if empty("Locks") && empty("Semaphores") && empty("FairQueues") {
        out.push_str("nothing held\n");
        return out;
    }
    for lock in report["Locks"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{} {}: held by {}, LockIndex {}, held since index {}\n",
            text(&lock["Kind"]),
            text(&lock["Key"]),
            holder(lock),
            lock["LockIndex"],
            lock["HeldSinceIndex"],
        ));
    }
    for sem in report["Semaphores"].as_array().into_iter().flatten() {
        let holders = sem["Holders"].as_array().map_or(0, Vec::len);
        out.push_str(&format!(
            "semaphore {}: {holders} of {} slots held\n",
            text(&sem["Prefix"]),
            sem["Limit"],
        ));
        for h in sem["Holders"].as_array().into_iter().flatten() {
            out.push_str(&format!("  holder  {}\n", holder(h)));
        }
        for w in sem["Waiting"].as_array().into_iter().flatten() {
            out.push_str(&format!("  waiting {}\n", holder(w)));
        }
    }
    for queue in report["FairQueues"].as_array().into_iter().flatten() {
        out.push_str(&format!("fair lock {}:\n", text(&queue["Prefix"])));
        for (i, c) in queue["Queue"].as_array().into_iter().flatten().enumerate() {
            let role = if i == 0 { "owner " } else { "queued" };
            out.push_str(&format!(
                "  {i:>3} {role} {} (queued at index {})\n",
                holder(c),
                c["CreateIndex"]
            ));
        }
    }
    out
}
