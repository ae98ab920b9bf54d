//! The command line: the subcommands, and `vigil agent`'s flags turned into the top layer of the
//! agent's [`Config`] (the same keys as the config file; a flag not given leaves its key to the
//! file and the environment).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde::{Serialize, Serializer};
use serde_json::Value;
use vigil_agent::config::{Config, ListenAddr};
use vigil_gossip::Key;
use vigil_shared::go::duration::parse_go_duration;

#[derive(Debug, Parser)]
#[command(
    name = "vigil",
    version,
    about = "A distributed lock and session service with a Consul-compatible API"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an agent.
    Agent(AgentArgs),
    /// Print a new gossip encryption key for `--encrypt`.
    Keygen,
    /// Save, restore and inspect snapshots of the cluster's state.
    #[command(subcommand)]
    Snapshot(crate::snapshot::SnapshotCommand),
    #[command(flatten)]
    Client(vigil_cli::Command),
}

/// `vigil agent`'s flags. Each is serialized under its config key (`--node` is `node_name`,
/// `--join` is `retry_join`, `--acl-*` are in `acl`, the connection limits in `limits`).
#[derive(Debug, Args, Serialize)]
pub struct AgentArgs {
    /// Single node with the server role, everything in memory, throwaway certificates.
    #[arg(long, conflicts_with_all = ["server", "data_dir", "bootstrap_expect"])]
    pub dev: bool,
    /// Run the server role (a member of the raft server set).
    #[arg(long, requires_all = ["data_dir", "bootstrap_expect"])]
    pub server: bool,
    /// Number of servers to wait for before bootstrapping the cluster (1, 3 or 5).
    #[arg(long, value_parser = parse_bootstrap_expect)]
    pub bootstrap_expect: Option<usize>,
    /// Directory for the raft log, snapshots and this server's ID, and for the gossip keyring
    /// (`serf/local.keyring`, kept across restarts; a client agent keeps it here too when
    /// given one).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Gossip address of a member to join (repeatable); retried until connected.
    #[arg(long = "join")]
    #[serde(rename = "retry_join")]
    pub join: Vec<SocketAddr>,
    /// Gossip (Serf) address, UDP (port 0 picks a free port) [default: 127.0.0.1:8301].
    #[arg(long)]
    pub serf_addr: Option<SocketAddr>,
    /// Gossip encryption key from `vigil keygen` (base64, 32 bytes; Consul's 16 and 24 too). Every local user can read
    /// a command line: prefer `encrypt` in the --config file.
    #[arg(long)]
    pub encrypt: Option<String>,
    /// Timing of gossip and raft: `lan` (default; tolerates multi-second pauses and slow
    /// heartbeats) or `local` (fast failure detection and elections on one machine, for tests).
    /// `--gossip-profile` is the old spelling.
    #[arg(long, alias = "gossip-profile", value_parser = ["lan", "local"])]
    pub timing_profile: Option<String>,
    /// CA certificate (PEM) that signs every agent's certificate.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// This agent's certificate (PEM), from `vigil tls cert create`.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// This agent's private key (PEM).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Node name (default: the hostname).
    #[arg(long)]
    #[serde(rename = "node_name")]
    pub node: Option<String>,
    /// This node's UUID in the catalog (Consul's `-node-id`) [default: kept in --data-dir,
    /// else a new one at every start].
    #[arg(long, value_parser = vigil_agent::node_id::parse)]
    pub node_id: Option<String>,
    /// Plain-HTTP API address, or `off` to serve the API over HTTPS only (Consul's
    /// `ports.http = -1`), or `unix:///path` for a Unix socket [default: the config file's
    /// `http_addr`, else 127.0.0.1:8500].
    #[arg(long)]
    pub http_addr: Option<ListenAddr>,
    /// HTTPS API address: the same API over TLS with this agent's certificate (--cert-file)
    /// [default: the config file's `https_addr`, else none].
    #[arg(long)]
    pub https_addr: Option<SocketAddr>,
    /// Require HTTPS clients to present a certificate signed by the CA (--ca-file); Consul's
    /// `verify_incoming_https`.
    #[arg(long)]
    pub verify_incoming_https: bool,
    /// RPC address of a server (port 0 picks a free port); a client agent serves no RPC and
    /// ignores it [default: 127.0.0.1:8300].
    #[arg(long)]
    pub rpc_addr: Option<SocketAddr>,
    /// Log level filter (e.g. info, debug, vigil_server=debug) [default: info].
    #[arg(long)]
    pub log_level: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Smallest lock-delay a new session gets (servers only): a session asking for less (a
    /// client that waives it, Patroni's 1 ms) is raised to this. 0s, the default, keeps
    /// Consul's behaviour. At most 60s, the longest lock-delay.
    #[arg(long, value_parser = duration)]
    pub lock_delay_min: Option<String>,
    /// Events of each lock's history a server keeps (servers only; set it alike on every
    /// server): the oldest go first [default: 100].
    #[arg(long, value_parser = at_least_one)]
    pub lock_history_per_lock: Option<usize>,
    /// Events of all locks' histories a server keeps (servers only; set it alike on every
    /// server): the oldest of all go first, and a lock whose last event goes is forgotten
    /// [default: 50000].
    #[arg(long, value_parser = at_least_one)]
    pub lock_history_total: Option<usize>,
    /// Allow script checks (`Args`) registered over HTTP or in the config file.
    #[arg(long)]
    pub enable_script_checks: bool,
    /// Config file (TOML; JSON for a name ending in `.json`): every setting these flags have,
    /// under Consul's keys, and services and checks to register at start.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Blocking queries a server holds at once at most (its own clients' and forwarded ones);
    /// beyond it a blocking query answers 429 at once [default: 16384].
    #[arg(long)]
    pub max_blocking_queries: Option<usize>,
    /// The part of --max-blocking-queries kept for lock waits (a native lock's waiters and
    /// holders, blocking reads of a KV key a session holds): other blocking queries answer 429
    /// once they hold the rest. Default: an eighth of --max-blocking-queries.
    #[arg(long)]
    pub lock_wait_reserve: Option<usize>,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Allow script checks declared in the config file, not those registered over HTTP.
    #[arg(long)]
    pub enable_local_script_checks: bool,
    /// This node's metadata in the catalog, `key:value` (repeatable; over the config file's
    /// `node_meta`), as Consul's `-node-meta`.
    #[arg(long = "node-meta", value_parser = parse_meta_pair)]
    #[serde(serialize_with = "as_table")]
    pub node_meta: Vec<(String, String)>,
    #[command(flatten)]
    pub acl: AclArgs,
}

/// The HTTP API's connection limits (the config file's `limits` table).
#[derive(Debug, Args, Serialize)]
pub struct LimitArgs {
    /// Most open HTTP connections one client IP may have (Consul's
    /// limits.http_max_conns_per_client); more are answered 429 and closed. 0: no cap
    /// [default: 200].
    #[arg(long)]
    pub http_max_conns_per_client: Option<usize>,
    /// How long an HTTP connection may take to send a request's headers, counted from its
    /// opening or its previous response (so also how long it may sit idle) [default: 60s].
    #[arg(long, value_parser = duration)]
    pub http_header_timeout: Option<String>,
}

/// The config file's `acl` table.
#[derive(Debug, Args, Serialize)]
pub struct AclArgs {
    /// Enables ACLs with this default policy for what no rule covers (Consul's
    /// `acl.default_policy`; `acl.enabled` in the config file enables them with `allow`).
    #[arg(long, value_parser = ["allow", "deny"])]
    #[serde(rename = "default_policy")]
    pub acl_default_policy: Option<String>,
    #[command(flatten)]
    pub tokens: AclTokenArgs,
}

/// The config file's `acl.tokens` table.
#[derive(Debug, Args, Serialize)]
pub struct AclTokenArgs {
    /// The management token that exists from the first start (Consul's
    /// `acl.tokens.initial_management`); it also ends `acl bootstrap`.
    #[arg(long)]
    #[serde(rename = "initial_management")]
    pub acl_initial_management_token: Option<String>,
    /// The token this agent's own requests use (Consul's `acl.tokens.agent`).
    #[arg(long)]
    #[serde(rename = "agent")]
    pub acl_agent_token: Option<String>,
}

impl AgentArgs {
    /// The flags given, as a config layer: a flag not given (an absent value, a switch off, a
    /// repeatable flag never repeated) is left out.
    pub fn layer(&self) -> anyhow::Result<Value> {
        if let Some(key) = &self.encrypt {
            Key::from_base64(key).map_err(|e| anyhow::anyhow!("--encrypt: {e}"))?;
        }
        Ok(given(serde_json::to_value(self)?))
    }

    /// The config file, then the `VIGIL_AGENT_*` variables among `env`, then these flags.
    pub fn load(&self, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<Config> {
        Ok(Config::load(self.config.as_deref(), env, self.layer()?)?)
    }

    /// The config file named by `--config`, if any.
    pub fn config_file(&self) -> Option<&Path> {
        self.config.as_deref()
    }
}

/// `value` without what no flag set: nulls, `false`, and empty lists and tables.
fn given(value: Value) -> Value {
    match value {
        Value::Object(table) => Value::Object(
            table
                .into_iter()
                .map(|(key, value)| (key, given(value)))
                .filter(|(_, value)| match value {
                    Value::Null | Value::Bool(false) => false,
                    Value::Array(items) => !items.is_empty(),
                    Value::Object(table) => !table.is_empty(),
                    _ => true,
                })
                .collect(),
        ),
        other => other,
    }
}

fn as_table<S: Serializer>(pairs: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    pairs
        .iter()
        .cloned()
        .collect::<BTreeMap<_, _>>()
        .serialize(s)
}

/// Consul's `-node-meta key:value` (no `:`: an empty value).
fn parse_meta_pair(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once(':').unwrap_or((s, ""));
    if key.is_empty() {
        return Err(format!("{s:?} has no key (expected key:value)"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

fn parse_bootstrap_expect(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!("must be 1, 3 or 5, not {s:?}")),
    }
}

/// A Go duration, kept as written (the config decodes it).
fn duration(s: &str) -> Result<String, String> {
    parse_go_duration(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1")),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::time::Duration;

    use vigil_agent::{AgentConfig, HttpsConfig};
    use vigil_cli::cmd::go_flags_argv;
    use vigil_cli::cmd::lock::{LockCommand, consul_argv};
    use vigil_gossip::TimingProfile;
    use vigil_shared::acl::authz::DefaultPolicy;

    use super::*;

    fn agent(args: &[&str]) -> AgentArgs {
        let argv = ["vigil", "agent", "--dev"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .expect("valid command line")
            .command
        {
            Command::Agent(args) => args,
            other => panic!("not an agent command: {other:?}"),
        }
    }

    /// What a dev agent started with `args` (after `--dev`) and the environment `env` runs.
    fn config_with(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<AgentConfig> {
        let args = agent(args);
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        let config = args.load(env)?;
        Ok(config.agent_config(args.config_file().map(Into::into))?)
    }

    fn config(args: &[&str]) -> anyhow::Result<AgentConfig> {
        config_with(args, &[])
    }

    /// A config file holding `text`, in a directory that lives as long as the guard.
    fn config_file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap().to_owned();
        (dir, path)
    }

    fn parse(args: &[&str]) -> Command {
        let argv = std::iter::once("vigil").chain(args.iter().copied());
        let argv = go_flags_argv(argv.map(OsString::from).collect());
        Cli::try_parse_from(argv).expect("valid").command
    }

    #[test]
    fn the_http_api_may_listen_on_a_unix_socket() {
        let config = config(&["--http-addr", "unix:///tmp/vigil.sock"]).expect("valid");
        assert_eq!(config.http_addr, None);
        assert_eq!(
            config.http_unix.as_deref(),
            Some(std::path::Path::new("/tmp/vigil.sock"))
        );
        let refused = Cli::try_parse_from(["vigil", "agent", "--dev", "--http-addr", "unix://"]);
        assert!(refused.is_err());
    }

    #[test]
    fn node_meta_flags_repeat_and_split_at_the_first_colon() {
        let meta = config(&[
            "--node-meta",
            "rack:r1",
            "--node-meta",
            "url:http://x",
            "--node-meta",
            "bare",
        ])
        .expect("valid")
        .local
        .node_meta;
        let pairs: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pairs, [("bare", ""), ("rack", "r1"), ("url", "http://x")]);
        let refused = Cli::try_parse_from(["vigil", "agent", "--dev", "--node-meta", ":v"]);
        assert!(refused.is_err());
    }

    #[test]
    fn one_timing_profile_flag_with_the_old_spelling_kept() {
        assert_eq!(config(&[]).unwrap().profile, TimingProfile::Lan);
        for flag in ["--timing-profile", "--gossip-profile"] {
            assert_eq!(
                config(&[flag, "local"]).unwrap().profile,
                TimingProfile::Local
            );
            assert_eq!(config(&[flag, "lan"]).unwrap().profile, TimingProfile::Lan);
        }
        assert!(Cli::try_parse_from(["vigil", "agent", "--timing-profile", "wan"]).is_err());
    }

    #[test]
    fn http_can_be_off_only_with_https_and_flags_win_over_the_config_file() {
        let (_dir, path) = config_file(
            "http_addr = \"off\"\nhttps_addr = \"127.0.0.1:8501\"\nverify_incoming_https = true\n",
        );
        let path = path.as_str();

        // Defaults: plain HTTP on Consul's port, no HTTPS.
        let defaults = config(&[]).unwrap();
        assert_eq!(defaults.http_addr, Some("127.0.0.1:8500".parse().unwrap()));
        assert_eq!(defaults.https, None);

        // The file alone: HTTPS only, client certificates required.
        let from_file = config(&["--config", path]).unwrap();
        assert_eq!(from_file.http_addr, None);
        assert_eq!(
            from_file.https,
            Some(HttpsConfig {
                addr: "127.0.0.1:8501".parse().unwrap(),
                verify_incoming: true
            })
        );

        // Flags win.
        let http = config(&["--config", path, "--http-addr", "127.0.0.1:1"]).unwrap();
        assert_eq!(http.http_addr, Some("127.0.0.1:1".parse().unwrap()));
        let https = config(&["--config", path, "--https-addr", "127.0.0.1:2"]).unwrap();
        assert_eq!(https.https.unwrap().addr, "127.0.0.1:2".parse().unwrap());

        // Nothing to serve on, or client verification without HTTPS: refused.
        let err = config(&["--http-addr", "off"]).unwrap_err();
        assert!(err.to_string().contains("--https-addr"), "{err}");
        let err = config(&["--verify-incoming-https"]).unwrap_err();
        assert!(err.to_string().contains("--https-addr"), "{err}");
        assert!(
            Cli::try_parse_from(["vigil", "agent", "--dev", "--http-addr", "nowhere"]).is_err()
        );
    }

    #[test]
    fn the_gossip_key_comes_from_the_flag_or_else_the_config_file() {
        let (_dir, path) =
            config_file(&format!("encrypt = \"{}\"\n", vigil_gossip::generate_key()));
        let path = path.as_str();
        assert!(config(&["--config", path]).unwrap().encrypt.is_some());
        assert!(config(&[]).unwrap().encrypt.is_none());
        // The flag wins: a bad flag is an error even with a good key in the file.
        let err = config(&["--config", path, "--encrypt", "c2hvcnQ="]).unwrap_err();
        assert!(err.to_string().starts_with("--encrypt: "), "{err}");
    }

    #[test]
    fn the_file_then_the_environment_then_the_flags() {
        let (_dir, path) = config_file(
            "node_name = \"file\"\nlog_level = \"debug\"\nsession_ttl_min = \"5s\"\n\
             node_meta = { a = \"file\", b = \"file\" }\n[acl]\nenabled = true\n",
        );
        let path = path.as_str();
        let env = [
            ("VIGIL_AGENT_NODE_NAME", "env"),
            ("VIGIL_AGENT_SESSION_TTL_MIN", "2s"),
            ("VIGIL_AGENT_NODE_META", "{ b = \"env\", c = \"env\" }"),
            ("VIGIL_AGENT_ACL__DEFAULT_POLICY", "deny"),
        ];

        // The file alone.
        let file = config(&["--config", path]).unwrap();
        assert_eq!(file.node_name, "file");
        assert_eq!(file.session_ttl_min, Duration::from_secs(5));
        assert_eq!(file.acl.default_policy, Some(DefaultPolicy::Allow));

        // The environment over it: a key it sets wins, a table merges key by key.
        let env_over_file = config_with(&["--config", path], &env).unwrap();
        assert_eq!(env_over_file.node_name, "env");
        assert_eq!(env_over_file.session_ttl_min, Duration::from_secs(2));
        assert_eq!(env_over_file.acl.default_policy, Some(DefaultPolicy::Deny));
        let meta = |c: &AgentConfig| -> Vec<(String, String)> {
            c.local.node_meta.clone().into_iter().collect()
        };
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            meta(&env_over_file),
            pairs(&[("a", "file"), ("b", "env"), ("c", "env")])
        );

        // The flags over both.
        let flags = config_with(
            &["--config", path, "--node", "flag", "--node-meta", "c:flag"],
            &env,
        )
        .unwrap();
        assert_eq!(flags.node_name, "flag");
        assert_eq!(
            meta(&flags),
            pairs(&[("a", "file"), ("b", "env"), ("c", "flag")])
        );
        // What no flag set stays the environment's.
        assert_eq!(flags.session_ttl_min, Duration::from_secs(2));
    }

    #[test]
    fn unknown_keys_are_refused_and_other_variables_ignored() {
        let (_dir, path) = config_file("servce = 1\n");
        let err = config(&["--config", path.as_str()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown key `servce`"), "{err}");

        let err = config_with(&[], &[("VIGIL_AGENT_SERVCE", "1")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("VIGIL_AGENT_") && err.contains("unknown key `servce`"),
            "{err}"
        );
        let err = config_with(&[], &[("VIGIL_AGENT_LOG_JSON", "yes")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`log_json` must be true or false"), "{err}");

        // The client commands' variables (an agent's URL here) are not the agent's settings.
        let config = config_with(
            &[],
            &[
                ("VIGIL_HTTP_ADDR", "https://127.0.0.1:8501"),
                ("CONSUL_HTTP_ADDR", "https://127.0.0.1:8501"),
            ],
        )
        .unwrap();
        assert_eq!(config.http_addr, Some("127.0.0.1:8500".parse().unwrap()));
    }

    #[test]
    fn every_flag_still_parses() {
        let (_dir, path) = config_file("");
        let argv = [
            "vigil",
            "agent",
            "--server",
            "--bootstrap-expect",
            "3",
            "--data-dir",
            "/d",
            "--join",
            "127.0.0.1:1",
            "--join",
            "127.0.0.1:2",
            "--serf-addr",
            "127.0.0.1:3",
            "--encrypt",
            "cg8StVXbQJ0gPvMd9o7yrg1Ttd/ZCXtSFKgSbtXaV2k=",
            "--timing-profile",
            "local",
            "--ca-file",
            "ca",
            "--cert-file",
            "cert",
            "--key-file",
            "key",
            "--node",
            "n1",
            "--node-id",
            "5f2a9c1e-3b7d-4e8f-9a06-1c2d3e4f5a6b",
            "--http-addr",
            "127.0.0.1:4",
            "--https-addr",
            "127.0.0.1:5",
            "--verify-incoming-https",
            "--rpc-addr",
            "127.0.0.1:6",
            "--log-level",
            "debug",
            "--log-json",
            "--lock-delay-min",
            "2s",
            "--lock-history-per-lock",
            "7",
            "--lock-history-total",
            "70",
            "--enable-script-checks",
            "--config",
            &path,
            "--max-blocking-queries",
            "80",
            "--lock-wait-reserve",
            "9",
            "--http-max-conns-per-client",
            "11",
            "--http-header-timeout",
            "12s",
            "--enable-local-script-checks",
            "--node-meta",
            "k:v",
            "--acl-default-policy",
            "deny",
            "--acl-initial-management-token",
            "root",
            "--acl-agent-token",
            "agent",
        ];
        let Command::Agent(args) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("not an agent command");
        };
        let config = args.load(std::iter::empty()).unwrap();
        assert_eq!(
            (config.log_level.as_str(), config.log_json),
            ("debug", true)
        );
        let c = config.agent_config(Some(path.into())).unwrap();
        assert!(matches!(
            c.mode,
            vigil_agent::AgentMode::Server { bootstrap_expect: 3, ref data_dir } if data_dir == std::path::Path::new("/d")
        ));
        let addr = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(c.join, [addr(1), addr(2)]);
        assert_eq!(
            (c.serf_addr, c.http_addr, c.rpc_addr),
            (addr(3), Some(addr(4)), addr(6))
        );
        assert_eq!(
            c.https,
            Some(HttpsConfig {
                addr: addr(5),
                verify_incoming: true
            })
        );
        assert!(c.encrypt.is_some());
        assert_eq!(c.profile, TimingProfile::Local);
        assert!(matches!(c.tls, vigil_agent::TlsSource::Files { .. }));
        assert_eq!(c.node_name, "n1");
        assert_eq!(
            c.node_id.as_deref(),
            Some("5f2a9c1e-3b7d-4e8f-9a06-1c2d3e4f5a6b")
        );
        assert_eq!(c.lock_delay_min, Duration::from_secs(2));
        assert_eq!((c.lock_history.per_lock, c.lock_history.total), (7, 70));
        assert!(c.enable_script_checks && c.enable_local_script_checks);
        assert_eq!((c.max_blocking_queries, c.lock_wait_reserve), (80, 9));
        assert_eq!(c.http_limits.max_conns_per_client, 11);
        assert_eq!(c.http_limits.header_timeout, Duration::from_secs(12));
        assert_eq!(c.local.node_meta["k"], "v");
        assert_eq!(c.acl.default_policy, Some(DefaultPolicy::Deny));
        assert_eq!(c.acl.initial_management.as_deref(), Some("root"));
        assert_eq!(c.acl.agent_token.as_deref(), Some("agent"));

        // The test knobs are config keys now, not flags.
        for knob in ["--session-ttl-min", "--ae-interval"] {
            assert!(
                Cli::try_parse_from(["vigil", "agent", "--dev", knob, "1s"]).is_err(),
                "{knob}"
            );
        }
    }

    #[test]
    fn debug_and_keyring_take_go_style_flags() {
        let Command::Client(vigil_cli::Command::Debug(debug)) =
            parse(&["debug", "-archive=false", "-output", "out"])
        else {
            panic!("not debug");
        };
        assert!(!debug.archive);
        assert_eq!(debug.output.as_deref(), Some(std::path::Path::new("out")));
        for archive in [
            &["debug"][..],
            &["debug", "--archive"],
            &["debug", "-archive=true"],
        ] {
            let Command::Client(vigil_cli::Command::Debug(debug)) = parse(archive) else {
                panic!("not debug");
            };
            assert!(debug.archive, "{archive:?}");
        }
        let Command::Client(vigil_cli::Command::Keyring(keyring)) =
            parse(&["keyring", "-install", "a2V5", "-relay-factor=2"])
        else {
            panic!("not keyring");
        };
        assert_eq!(
            (keyring.install.as_deref(), keyring.relay_factor),
            (Some("a2V5"), 2)
        );
        // Other commands' arguments pass unchanged.
        let argv: Vec<OsString> = ["vigil", "kv", "put", "-x"].map(OsString::from).to_vec();
        assert_eq!(go_flags_argv(argv.clone()), argv);
    }

    #[test]
    fn consuls_lock_flags_parse() {
        let argv = consul_argv(
            "vigil lock -n=2 -timeout=1m -shell=false -child-exit-code -monitor-retry=4 p a b"
                .split(' ')
                .map(OsString::from)
                .collect(),
        );
        let cli = Cli::try_parse_from(argv).expect("parses");
        let Command::Client(vigil_cli::Command::Lock(LockCommand { run: args, .. })) = cli.command
        else {
            panic!("not lock: {:?}", cli.command);
        };
        assert_eq!(args.limit, 2);
        assert_eq!(args.hold.timeout, Some(Duration::from_secs(60)));
        assert!(!args.shell && args.child_exit_code && !args.pass_stdin);
        assert_eq!(args.monitor_retry, Some(4));
        assert_eq!(args.prefix.as_deref(), Some("p"));
        assert_eq!(args.command, ["a", "b"]);
    }
}
