//! The `vigil` command: parse the command line; for `vigil agent` set up logging, start the
//! agent and stop it on SIGINT/SIGTERM; hand the client commands to `vigil_cli`.

use std::io::{IsTerminal as _, Write as _};

use crate::cli::{AgentArgs, Cli, Command};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use vigil_agent::monitor::MonitorLayer;

fn init_logging(level: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},openraft=warn")));
    // Colours only for a terminal: a log file or pipe gets plain text (NO_COLOR also works).
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr is a pipe its reader closed) is dropped.
        // Reporting it would print to that same stderr, which panics: the task that logged,
        // such as the one that stops the agent on SIGTERM, would die with it.
        .log_internal_errors(false);
    // Every line also goes to `/v1/agent/monitor` while someone follows it.
    if json {
        builder.json().finish().with(MonitorLayer).init();
    } else {
        builder.compact().finish().with(MonitorLayer).init();
    }
}

async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    // Everything an agent writes (the raft log's segments, snapshots, the keyring) holds data or
    // secrets: readable by the agent's user only, whatever the library creating it asks for.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let config = args.load(environment())?;
    init_logging(&config.log_level, config.log_json);
    let config = config.agent_config(args.config_file().map(Into::into))?;
    let shutdown = CancellationToken::new();
    let handle = vigil_agent::start(config.clone(), shutdown.clone()).await?;
    // Before the ready line: a supervisor (or a test) that stops the agent as soon as it reads
    // that line gets a graceful leave, not the default action's kill.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // One stable line on stdout that scripts and tests read for the bound addresses: `http=off`
    // when plain HTTP is off, `http=unix:///path` on a socket, and `https=ADDR` appended when
    // HTTPS is on.
    let http = match (&handle.http_addr, &handle.http_unix) {
        (Some(addr), _) => addr.to_string(),
        (None, Some(path)) => format!("unix://{}", path.display()),
        (None, None) => "off".to_owned(),
    };
    let https = handle
        .https_addr
        .map(|a| format!(" https={a}"))
        .unwrap_or_default();
    // Not `println!`, which panics when stdout is a closed pipe: a lost ready line must not
    // stop the agent.
    let _ = writeln!(
        std::io::stdout(),
        "vigil agent running: node={} http={http} rpc={} serf={}{https}",
        config.node_name,
        handle.rpc_addr,
        handle.serf_addr
    );
    tracing::info!(
        http = %http,
        https = %handle.https_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
        verify_incoming_https = config.https.is_some_and(|h| h.verify_incoming),
        rpc = %handle.rpc_addr,
        serf = %handle.serf_addr,
        node = %config.node_name,
        "agent started"
    );
    let token = shutdown.clone();
    let gossip = handle.gossip.clone();
    let local = std::sync::Arc::clone(&handle.local);
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            // Stopped another way (`/v1/agent/leave`): nothing left to do here.
            _ = token.cancelled() => return,
        }
        tracing::info!("leaving the cluster and shutting down");
        // A graceful leave: the leader deregisters this node and invalidates its sessions.
        local.stop();
        if let Err(e) = gossip.leave().await {
            tracing::warn!(error = %e, "graceful leave failed");
        }
        token.cancel();
    });
    handle.wait().await
}

/// The process's environment variables that are text (the config reads only `VIGIL_AGENT_*`).
fn environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
}

/// Entry point shared by the `vigil` binary and the test binary that runs the same code.
#[tokio::main]
pub async fn main() -> anyhow::Result<()> {
    let argv = vigil_cli::argv(std::env::args_os().collect());
    match Cli::parse_from(argv).command {
        Command::Agent(args) => run_agent(args).await,
        Command::Keygen => {
            println!("{}", vigil_gossip::generate_key());
            Ok(())
        }
        Command::Snapshot(cmd) => vigil_cli::cmd::exit(crate::snapshot::run(cmd).await),
        Command::Client(command) => vigil_cli::run(command).await,
    }
}
