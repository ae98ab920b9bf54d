//! Client commands: `vigil lock`, `vigil elect`, `vigil kv`, `vigil session`, `vigil keyring`
//! and the rest. Each talks to the local agent's HTTP(S) API (`--http-addr`, else
//! `VIGIL_HTTP_ADDR`, else `CONSUL_HTTP_ADDR`, else 127.0.0.1:8500; TLS files and the token
//! likewise, see [`AgentAddr`]) through the `vigil_client` library and returns an exit
//! status.

pub mod acl;
pub mod child;
pub mod debug;
pub mod elect;
pub mod history;
pub mod keyring;
pub mod kv;
pub mod lock;
pub mod members;
pub mod monitor;
pub mod operator;
pub mod session;
pub mod watch;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use vigil_client::{Client, ClientConfig, RecipeSession, Token};
use vigil_shared::go::duration::parse_go_duration;

/// Exit status for errors of `vigil` itself (agent unreachable, conflicting key, bad input).
pub const EXIT_ERROR: i32 = 1;

/// Where the agent is and how to reach it: every command that talks to an agent flattens
/// these flags, and [`AgentAddr::client`] is the one place they (and the `VIGIL_`/`CONSUL_`
/// environment, see `vigil_client::ClientConfig`) become a client.
#[derive(Debug, Clone, Args)]
pub struct AgentAddr {
    /// Address of the local agent, `host:port`, `http://…`, `https://…` or `unix:///path` [default:
    /// $VIGIL_HTTP_ADDR, $CONSUL_HTTP_ADDR, 127.0.0.1:8500; https when $CONSUL_HTTP_SSL=true]
    #[arg(long = "http-addr")]
    pub http_addr: Option<String>,
    /// ACL token sent as `X-Consul-Token` [default: $VIGIL_HTTP_TOKEN, $CONSUL_HTTP_TOKEN, or
    /// the file $CONSUL_HTTP_TOKEN_FILE names]
    #[arg(long)]
    pub token: Option<Token>,
    /// CA certificate (PEM) that signed the agent's HTTPS certificate [default: $VIGIL_CACERT,
    /// $CONSUL_CACERT]
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for an agent that verifies HTTPS clients [default:
    /// $VIGIL_CLIENT_CERT, $CONSUL_CLIENT_CERT]
    #[arg(long)]
    pub client_cert: Option<PathBuf>,
    /// Key of --client-cert (PEM) [default: $VIGIL_CLIENT_KEY, $CONSUL_CLIENT_KEY]
    #[arg(long)]
    pub client_key: Option<PathBuf>,
}

impl AgentAddr {
    /// The client these flags and the environment describe (a flag wins over the environment).
    pub fn client(&self) -> anyhow::Result<Client> {
        let config = ClientConfig {
            addr: self.http_addr.clone(),
            https: false,
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            token: self.token.clone(),
        };
        Ok(config.from_env()?.build()?)
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
    /// Do not bind the session to this process (by default the local agent follows it with a
    /// process check, so the session dies the moment this process does; a stopped or slow
    /// process keeps it).
    #[arg(long)]
    pub no_process_check: bool,
    /// After SIGTERM when the lock or leadership is lost, how long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Report progress on stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

impl HoldArgs {
    /// A new session per acquisition, named `name`, with these flags' TTL and lock-delay.
    pub fn session(&self, name: String) -> RecipeSession {
        RecipeSession {
            name,
            ttl: self.ttl,
            lock_delay: self.lock_delay,
            reuse: None,
            bind_process: !self.no_process_check,
        }
    }
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

/// One argument as Go's flag package reads it.
pub(crate) enum GoArg<'a> {
    /// Not a flag: flags end here.
    Positional,
    /// `--`: flags end after it.
    EndOfFlags,
    /// `-name`, `--name`, `-name=V` (`value` is `V`).
    Flag {
        name: &'a str,
        value: Option<&'a str>,
    },
}

pub(crate) fn go_arg(arg: &OsString) -> GoArg<'_> {
    let Some(flag) = arg
        .to_str()
        .and_then(|a| a.strip_prefix('-'))
        .filter(|f| !f.is_empty())
    else {
        return GoArg::Positional;
    };
    let flag = flag.strip_prefix('-').unwrap_or(flag);
    if flag.is_empty() {
        return GoArg::EndOfFlags;
    }
    match flag.split_once('=') {
        Some((name, value)) => GoArg::Flag {
            name,
            value: Some(value),
        },
        None => GoArg::Flag {
            name: flag,
            value: None,
        },
    }
}

/// A Go flag rewritten as clap reads it: `--long=V`, the value taken from the next argument
/// when it takes one and none was attached; a boolean is set by its presence, so `-flag=false`
/// gives `None` (left out).
pub(crate) fn clap_flag<'a>(
    long: &str,
    value: Option<&str>,
    takes_value: bool,
    rest: &mut impl Iterator<Item = &'a OsString>,
) -> Option<OsString> {
    let mut rewritten = OsString::from(format!("--{long}"));
    match (value, takes_value) {
        (Some(value), false) => match vigil_shared::go::strconv::parse_bool(value) {
            Some(true) => {}
            Some(false) => return None,
            None => rewritten.push(format!("={value}")),
        },
        (Some(value), true) => rewritten.push(format!("={value}")),
        (None, true) => {
            if let Some(value) = rest.next() {
                rewritten.push("=");
                rewritten.push(value);
            }
        }
        (None, false) => {}
    }
    Some(rewritten)
}

/// Commands that take only flags, which Consul's users write Go style (`vigil debug
/// -archive=false`, `vigil keyring -install KEY`).
const GO_FLAG_COMMANDS: [&str; 2] = ["debug", "keyring"];

/// For the [`GO_FLAG_COMMANDS`], rewrites each single-dash flag (`-name`, `-name=V`) as clap
/// reads it (`--name`, `--name=V`); values and other commands' arguments pass unchanged.
pub fn go_flags_argv(argv: Vec<OsString>) -> Vec<OsString> {
    if argv
        .get(1)
        .is_none_or(|c| !GO_FLAG_COMMANDS.iter().any(|g| c == *g))
    {
        return argv;
    }
    argv.into_iter()
        .enumerate()
        .map(|(i, arg)| match arg.to_str() {
            Some(a)
                if i >= 2
                    && a != "-h"
                    && a.len() > 1
                    && a.starts_with('-')
                    && a.as_bytes()[1].is_ascii_alphabetic() =>
            {
                OsString::from(format!("-{a}"))
            }
            _ => arg,
        })
        .collect()
}
