//! `vigil-demo`: the two programs of the fencing demo, `vigil-demo bank` and `vigil-demo worker`
//! (plus `vigil-demo checks`), used by the docker-compose cluster and the lock-safety checker.
//! They are not part of Vigil (the `vigil` binary does not carry them); they show how a resource
//! uses Vigil's fencing tokens, and ship beside `vigil` in the Docker image.
//!
//! A token is the holder's sequencer `(Key, LockIndex, Session)` plus the `CreateIndex` of that
//! key, and tokens are ordered by `(CreateIndex, LockIndex)`: a plain lock keeps its key and its
//! LockIndex grows with every acquisition, and a lock of the server-side queue (`vigil lock
//! --fair`) has one token growing with every grant (its `CreateIndex` counts as 0). Either way
//! the order never goes backwards from one holder to the next. The [`bank`] accepts only writes
//! whose token is not older than the newest it has accepted; the [`worker`] runs under `vigil
//! lock` and writes its token to the bank. Both talk HTTP: to the agent through
//! `vigil_client`, between worker and bank through `reqwest`.

pub mod bank;
pub mod checks;
pub mod worker;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use vigil_client::Client;
use vigil_shared::go::duration::parse_go_duration;

pub use bank::{Bank, BankWrite, Decision, Token};
pub use checks::{BANK_CHECK, WORKER_CHECK};
pub use worker::{WorkerEvent, WorkerLine};

/// Exit status for errors (agent unreachable, bad input), as `vigil` reports its own.
pub const EXIT_ERROR: i32 = 1;
/// Exit status when the worker started without holding the lock (nothing was written).
pub const EXIT_NOT_OWNER: i32 = 3;
/// Exit status when the bank turned a write away (a newer holder has written): the status
/// `vigil lock` itself exits with when its lock is lost (EX_TEMPFAIL).
pub const EXIT_LOST: i32 = 75;
/// Exit status after SIGTERM (128 + 15, as a shell reports it).
pub const EXIT_TERMINATED: i32 = 143;

#[derive(Debug, Parser)]
#[command(
    name = "vigil-demo",
    version,
    about = "The fencing demo: a bank that checks Vigil's fencing tokens, and its worker"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: DemoCommand,
}

#[derive(Debug, Subcommand)]
pub enum DemoCommand {
    /// A fencing "bank": accepts a write only if its token is not older than the newest one it
    /// has accepted, and logs every decision.
    Bank(BankArgs),
    /// The demo worker: run it under `vigil lock`; it writes its fencing token to the bank.
    Worker(WorkerArgs),
    /// Registers a demo node's health checks with its agent: `demo-bank` (HTTP: the bank
    /// answers) and `demo-worker` (TTL: the worker takes turns; `worker --check` passes it).
    Checks(ChecksArgs),
}

#[derive(Debug, Args)]
pub struct BankArgs {
    /// Address to serve on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8600")]
    pub listen: SocketAddr,
    /// Accept writes that carry no token (a resource that cannot fence: negative control only).
    #[arg(long)]
    pub allow_unfenced: bool,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The bank's address (IP:port).
    #[arg(long)]
    pub bank: SocketAddr,
    /// This worker's name in the bank's log (e.g. its node).
    #[arg(long)]
    pub name: String,
    /// How many writes to make while holding the lock.
    #[arg(long, default_value_t = 10)]
    pub writes: u64,
    /// Pause between two writes.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Write without the token (the bank cannot fence such writes). Negative control only.
    #[arg(long)]
    pub unfenced: bool,
    /// Keep writing after the lock is lost: ignore SIGTERM and the bank's rejections.
    /// Negative control only.
    #[arg(long)]
    pub ignore_loss: bool,
    /// A TTL check of the local agent to pass at every turn (e.g. `demo-worker`).
    #[arg(long)]
    pub check: Option<String>,
    #[command(flatten)]
    pub addr: AgentAddr,
}

#[derive(Debug, Args)]
pub struct ChecksArgs {
    /// The bank's address (IP:port): the `demo-bank` check asks its `/status`.
    #[arg(long)]
    pub bank: SocketAddr,
    /// How long the worker may go without a turn before `demo-worker` turns critical.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub worker_ttl: Duration,
    #[command(flatten)]
    pub addr: AgentAddr,
}

/// Where the agent is (the flags of `vigil`'s client commands).
#[derive(Debug, Clone, Args)]
pub struct AgentAddr {
    /// Address of the local agent, `host:port`, `http://…` or `https://…` [default:
    /// $VIGIL_HTTP_ADDR, $CONSUL_HTTP_ADDR, 127.0.0.1:8500; the TLS files from $CONSUL_CACERT,
    /// $CONSUL_CLIENT_CERT, $CONSUL_CLIENT_KEY as for `vigil`]
    #[arg(long = "http-addr")]
    pub http_addr: Option<String>,
    /// ACL token sent as `X-Consul-Token` [default: $VIGIL_HTTP_TOKEN, $CONSUL_HTTP_TOKEN]
    #[arg(long)]
    pub token: Option<vigil_client::Token>,
}

impl AgentAddr {
    pub fn client(&self) -> anyhow::Result<Client> {
        let config = vigil_client::ClientConfig {
            addr: self.http_addr.clone(),
            token: self.token.clone(),
            ..Default::default()
        };
        Ok(config.from_env()?.build()?)
    }
}

/// Parses a Go duration flag (`5s`, `1m30s`, `250ms`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub async fn run(cmd: DemoCommand) -> anyhow::Result<i32> {
    match cmd {
        DemoCommand::Bank(args) => bank::serve(args).await,
        DemoCommand::Worker(args) => worker::run(args).await,
        DemoCommand::Checks(args) => checks::register(args).await,
    }
}

/// The whole program, shared by the `vigil-demo` binary and the copy the integration tests
/// build: parses the command line, runs the command and exits with its status (an error prints
/// `vigil-demo: <error>` and exits 1).
#[tokio::main]
pub async fn main() {
    let code = match run(Cli::parse().command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vigil-demo: {e:#}");
            EXIT_ERROR
        }
    };
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
