//! Client commands: `vigil lock`, `vigil elect`, `vigil kv`, `vigil session`. Each talks to the
//! local agent's HTTP API (`--http-addr`, else `VIGIL_HTTP_ADDR`, else `CONSUL_HTTP_ADDR`, else
//! 127.0.0.1:8500) through the `vigil_shared::client` library and returns an exit status.

pub mod child;
pub mod demo;
pub mod elect;
pub mod kv;
pub mod lock;
pub mod members;
pub mod session;

use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use vigil_shared::client::Client;
use vigil_shared::duration::parse_go_duration;

/// Exit status for errors of `vigil` itself (agent unreachable, conflicting key, bad input).
pub const EXIT_ERROR: i32 = 1;

/// Where the agent is.
#[derive(Debug, Clone, Args)]
pub struct AgentAddr {
    /// HTTP address of the local agent [default: $VIGIL_HTTP_ADDR, $CONSUL_HTTP_ADDR, 127.0.0.1:8500]
    #[arg(long = "http-addr")]
    pub http_addr: Option<String>,
}

impl AgentAddr {
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(match &self.http_addr {
            Some(addr) => Client::new(addr)?,
            None => Client::from_env()?,
        })
    }
}

/// How `vigil lock` and `vigil elect` hold on: session, waiting and child supervision flags.
#[derive(Debug, Clone, Args)]
pub struct HoldArgs {
    /// Give up if not holding (the lock, or leadership) within this long (exit 124).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Session TTL.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Session lock-delay [default: the agent's, 15s].
    #[arg(long, value_parser = parse_duration)]
    pub lock_delay: Option<Duration>,
    /// After SIGTERM when the lock or leadership is lost, how long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Report progress on stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// Parses a Go duration flag (`5s`, `1m30s`, `250ms`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

/// Warnings from the client library go to stderr (`RUST_LOG` overrides the level).
pub fn init_logging(verbose: bool) {
    let default = if verbose { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .compact()
        .try_init();
}

/// Ends the process with a command's status; an error prints `vigil: <error>` and exits 1.
pub fn exit(result: anyhow::Result<i32>) -> ! {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vigil: {e:#}");
            EXIT_ERROR
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}
