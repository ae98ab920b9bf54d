//! The command line: `vigil agent --dev` and its flags, turned into an [`AgentConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use vigil_shared::acl::authz::DefaultPolicy;
use vigil_shared::go::duration::parse_go_duration;

use crate::acl::AclConfig;
use crate::gossip::{Key, KeyringFile, TimingProfile};
use crate::config::LocalDefinitions;
use crate::{AgentConfig, AgentMode, HttpsConfig, TlsSource};

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
    /// Create the cluster CA and the certificates it signs.
    Tls(crate::tls_cmd::TlsCommand),
    /// Run a command while holding a lock on a KV prefix; `lock status PREFIX` shows holders.
    Lock(crate::cmd::lock::LockCommand),
    /// Run a command while leader of an election.
    Elect(crate::cmd::elect::ElectArgs),
    /// Read and write the KV store.
    Kv(crate::cmd::kv::KvCommand),
    /// Watch a key, a prefix, services, nodes, a service or checks, running a handler on every
    /// change (`consul watch`).
    Watch(crate::cmd::watch::WatchArgs),
    /// List, create, destroy and renew sessions.
    Session(crate::cmd::session::SessionCommand),
    /// Print a new gossip encryption key for `--encrypt`.
    Keygen,
    /// List, install, use (make primary) and remove gossip encryption keys on every member
    /// (`consul keyring`).
    Keyring(crate::cmd::keyring::KeyringArgs),
    /// List the gossip members the local agent knows.
    Members(crate::cmd::members::MembersArgs),
    /// Ask the local agent to join a member's gossip address.
    Join(crate::cmd::members::JoinArgs),
    /// Make the local agent leave the cluster gracefully and stop.
    Leave(crate::cmd::AgentAddr),
    /// Mark a failed member as left (the leader then deregisters it).
    ForceLeave(crate::cmd::members::ForceLeaveArgs),
    /// Cluster operations (`operator raft list-peers|remove-peer|transfer-leader`, `operator autopilot get-config|set-config|state`).
    #[command(subcommand)]
    Operator(crate::cmd::members::OperatorCommand),
    /// Gather the agent's log, metrics and cluster view for a bug report into `<output>.tar.gz`.
    Debug(crate::cmd::debug::DebugArgs),
    /// Follow the local agent's log.
    Monitor(crate::cmd::monitor::MonitorArgs),
    /// Print the local agent's figures (raft, agent, consul sections).
    Info(crate::cmd::AgentAddr),
    /// Re-read the local agent's config file (its services and checks).
    Reload(crate::cmd::AgentAddr),
    /// Bootstrap ACLs and manage tokens, policies and roles (`consul acl`).
    Acl(crate::cmd::acl::AclCommand),
    /// Save, restore and inspect snapshots of the cluster's state.
    #[command(subcommand)]
    Snapshot(crate::cmd::snapshot::SnapshotCommand),
}

#[derive(Debug, Args)]
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
    pub join: Vec<SocketAddr>,
    /// Gossip (Serf) address, UDP (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8301")]
    pub serf_addr: SocketAddr,
    /// Gossip encryption key from `vigil keygen` (base64, 32 bytes; Consul's 16 and 24 too). Every local user can read
    /// a command line: prefer `encrypt` in the --config file.
    #[arg(long)]
    pub encrypt: Option<String>,
    /// Timing of gossip and raft: `lan` (default; tolerates multi-second pauses and slow
    /// heartbeats) or `local` (fast failure detection and elections on one machine, for tests).
    /// `--gossip-profile` is the old spelling.
    #[arg(long, alias = "gossip-profile", default_value = "lan", value_parser = parse_profile)]
    pub timing_profile: TimingProfile,
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
    pub node: Option<String>,
    /// This node's UUID in the catalog (Consul's `-node-id`) [default: kept in --data-dir,
    /// else a new one at every start].
    #[arg(long, value_parser = crate::node_id::parse)]
    pub node_id: Option<String>,
    /// Plain-HTTP API address, or `off` to serve the API over HTTPS only (Consul's
    /// `ports.http = -1`) [default: the config file's `http_addr`, else 127.0.0.1:8500].
    #[arg(long, value_parser = parse_listen_addr)]
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
    /// ignores it.
    #[arg(long, default_value = "127.0.0.1:8300")]
    pub rpc_addr: SocketAddr,
    /// Log level filter (e.g. info, debug, vigil_server=debug).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Smallest session TTL accepted (Consul's session_ttl_min); lower it only for tests.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub session_ttl_min: Duration,
    /// Smallest lock-delay a new session gets (servers only): a session asking for less (a
    /// client that waives it, Patroni's 1 ms) is raised to this. 0s, the default, keeps
    /// Consul's behaviour. At most 60s, the longest lock-delay.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub lock_delay_min: Duration,
    /// Events of each lock's history a server keeps (servers only; set it alike on every
    /// server): the oldest go first.
    #[arg(long, default_value_t = vigil_server::state::history::DEFAULT_PER_LOCK, value_parser = at_least_one)]
    pub lock_history_per_lock: usize,
    /// Events of all locks' histories a server keeps (servers only; set it alike on every
    /// server): the oldest of all go first, and a lock whose last event goes is forgotten.
    #[arg(long, default_value_t = vigil_server::state::history::DEFAULT_TOTAL, value_parser = at_least_one)]
    pub lock_history_total: usize,
    /// Allow script checks (`Args`) registered over HTTP or in the config file.
    #[arg(long)]
    pub enable_script_checks: bool,
    /// Config file (TOML) declaring services and checks to register at start.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Full anti-entropy sync period (Consul's ae_interval); lowered only by tests.
    #[arg(long, default_value = "1m", value_parser = parse_duration, hide = true)]
    pub ae_interval: Duration,
    /// Blocking queries a server holds at once at most (its own clients' and forwarded ones);
    /// beyond it a blocking query answers 429 at once.
    #[arg(long, default_value_t = 16384)]
    pub max_blocking_queries: usize,
    /// The part of --max-blocking-queries kept for lock waits (a native lock's waiters and
    /// holders, blocking reads of a KV key a session holds): other blocking queries answer 429
    /// once they hold the rest. Default: an eighth of --max-blocking-queries.
    #[arg(long)]
    pub lock_wait_reserve: Option<usize>,
    /// Most open HTTP connections one client IP may have (Consul's
    /// limits.http_max_conns_per_client); more are answered 429 and closed. 0: no cap.
    #[arg(long, default_value_t = 200)]
    pub http_max_conns_per_client: usize,
    /// How long an HTTP connection may take to send a request's headers, counted from its
    /// opening or its previous response (so also how long it may sit idle).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,
    /// Allow script checks declared in the config file, not those registered over HTTP.
    #[arg(long)]
    pub enable_local_script_checks: bool,
    /// This node's metadata in the catalog, `key:value` (repeatable; over the config file's
    /// `node_meta`), as Consul's `-node-meta`.
    #[arg(long = "node-meta", value_parser = parse_meta_pair)]
    pub node_meta: Vec<(String, String)>,
    /// Enables ACLs with this default policy for what no rule covers (Consul's
    /// `acl.default_policy`; `acl.enabled` in the config file enables them with `allow`).
    #[arg(long, value_parser = parse_default_policy)]
    pub acl_default_policy: Option<DefaultPolicy>,
    /// The management token that exists from the first start (Consul's
    /// `acl.tokens.initial_management`); it also ends `acl bootstrap`.
    #[arg(long)]
    pub acl_initial_management_token: Option<String>,
    /// The token this agent's own requests use (Consul's `acl.tokens.agent`).
    #[arg(long)]
    pub acl_agent_token: Option<String>,
}

fn parse_default_policy(s: &str) -> Result<DefaultPolicy, String> {
    match s {
        "allow" => Ok(DefaultPolicy::Allow),
        "deny" => Ok(DefaultPolicy::Deny),
        _ => Err(format!("must be allow or deny, not {s:?}")),
    }
}

/// The default plain-HTTP API address (Consul's).
const DEFAULT_HTTP_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8500);

/// The plain-HTTP API's listener: a TCP address or off (`None`), or a Unix socket
/// (`unix:///path`, as Consul's `addresses.http`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(Option<SocketAddr>),
    Unix(PathBuf),
}

fn parse_listen_addr(s: &str) -> Result<ListenAddr, String> {
    match s.trim().strip_prefix("unix://") {
        Some("") => Err(format!("{s:?} names no socket path")),
        Some(path) => Ok(ListenAddr::Unix(PathBuf::from(path))),
        None => crate::config::parse_listen_addr(s).map(ListenAddr::Tcp),
    }
}

/// Consul's `-node-meta key:value` (no `:`: an empty value).
fn parse_meta_pair(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once(':').unwrap_or((s, ""));
    if key.is_empty() {
        return Err(format!("{s:?} has no key (expected key:value)"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

fn parse_profile(s: &str) -> Result<TimingProfile, String> {
    match s {
        "lan" => Ok(TimingProfile::Lan),
        "local" => Ok(TimingProfile::Local),
        _ => Err(format!("must be lan or local, not {s:?}")),
    }
}

fn parse_bootstrap_expect(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!("must be 1, 3 or 5, not {s:?}")),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "vigil".to_owned())
}

impl AgentArgs {
    /// Checks the flag combination and builds the agent's configuration.
    pub fn config(&self) -> anyhow::Result<AgentConfig> {
        let mode = if self.dev {
            AgentMode::Dev
        } else if self.server {
            AgentMode::Server {
                data_dir: self.data_dir.clone().expect("clap requires --data-dir"),
                bootstrap_expect: self
                    .bootstrap_expect
                    .expect("clap requires --bootstrap-expect"),
            }
        } else if self.join.is_empty() {
            anyhow::bail!(
                "a client agent needs at least one --join (a member's gossip address), or use --dev or --server"
            );
        } else {
            AgentMode::Client
        };
        let file = match &self.config {
            Some(path) => crate::config::load(path)?,
            None => crate::config::ConfigFile::default(),
        };
        // A flag wins over the config file, as in Consul.
        let encrypt = match self.encrypt.as_deref() {
            Some(key) => {
                Some(Key::from_base64(key).map_err(|e| anyhow::anyhow!("--encrypt: {e}"))?)
            }
            None => file.encrypt,
        };
        let tls = match (&self.ca_file, &self.cert_file, &self.key_file) {
            (Some(ca), Some(cert), Some(key)) => TlsSource::Files {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            },
            (None, None, None) if self.dev => TlsSource::Throwaway,
            _ => anyhow::bail!(
                "--ca-file, --cert-file and --key-file are required together (only --dev generates throwaway certificates)"
            ),
        };
        // A flag wins over the config file.
        let (http_addr, http_unix) = match &self.http_addr {
            Some(ListenAddr::Tcp(addr)) => (*addr, None),
            Some(ListenAddr::Unix(path)) => (None, Some(path.clone())),
            None => (file.http_addr.unwrap_or(Some(DEFAULT_HTTP_ADDR)), None),
        };
        let verify_incoming_https = self.verify_incoming_https || file.verify_incoming_https;
        let https = match self.https_addr.or(file.https_addr) {
            Some(addr) => Some(HttpsConfig {
                addr,
                verify_incoming: verify_incoming_https,
            }),
            None => {
                anyhow::ensure!(
                    !verify_incoming_https,
                    "--verify-incoming-https needs an HTTPS address (--https-addr)"
                );
                None
            }
        };
        anyhow::ensure!(
            http_addr.is_some() || http_unix.is_some() || https.is_some(),
            "--http-addr off needs --https-addr: the agent must serve its API somewhere"
        );
        anyhow::ensure!(
            self.lock_delay_min <= Duration::from_millis(vigil_shared::MAX_LOCK_DELAY_MS),
            "--lock-delay-min must be at most 60s (the longest lock-delay)"
        );
        anyhow::ensure!(
            !self.ae_interval.is_zero(),
            "--ae-interval must be greater than 0"
        );
        anyhow::ensure!(
            !self.http_header_timeout.is_zero(),
            "--http-header-timeout must be greater than 0"
        );
        Ok(AgentConfig {
            node_name: self.node.clone().unwrap_or_else(hostname),
            node_id: self.node_id.clone(),
            data_dir: self.data_dir.clone(),
            http_addr,
            http_unix,
            https,
            rpc_addr: self.rpc_addr,
            serf_addr: self.serf_addr,
            join: self.join.clone(),
            encrypt,
            keyring_file: self.data_dir.as_deref().map(KeyringFile::in_data_dir),
            profile: self.timing_profile,
            mode,
            tls,
            session_ttl_min: self.session_ttl_min,
            lock_delay_min: self.lock_delay_min,
            lock_history: vigil_server::state::history::Limits {
                per_lock: self.lock_history_per_lock,
                total: self.lock_history_total,
            },
            enable_script_checks: self.enable_script_checks,
            enable_local_script_checks: self.enable_local_script_checks,
            ae_interval: self.ae_interval,
            max_blocking_queries: self.max_blocking_queries,
            lock_wait_reserve: self
                .lock_wait_reserve
                .unwrap_or(self.max_blocking_queries / 8)
                .min(self.max_blocking_queries),
            local: LocalDefinitions {
                node_meta: file
                    .local
                    .node_meta
                    .into_iter()
                    .chain(self.node_meta.iter().cloned())
                    .collect(),
                ..file.local
            },
            config_file: self.config.clone(),
            http_limits: crate::http::serve::ConnLimits {
                max_conns_per_client: self.http_max_conns_per_client,
                header_timeout: self.http_header_timeout,
            },
            acl: AclConfig {
                default_policy: self.acl_default_policy.or(file.acl.default_policy),
                initial_management: self
                    .acl_initial_management_token
                    .clone()
                    .or(file.acl.initial_management),
                agent_token: self.acl_agent_token.clone().or(file.acl.agent_token),
            },
        })
    }
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

    /// A config file holding `text`, in a directory that lives as long as the guard.
    fn config_file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap().to_owned();
        (dir, path)
    }

    #[test]
    fn the_http_api_may_listen_on_a_unix_socket() {
        let config = agent(&["--http-addr", "unix:///tmp/vigil.sock"])
            .config()
            .expect("valid");
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
        let args = agent(&[
            "--node-meta",
            "rack:r1",
            "--node-meta",
            "url:http://x",
            "--node-meta",
            "bare",
        ]);
        let meta = args.config().expect("valid").local.node_meta;
        let pairs: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pairs, [("bare", ""), ("rack", "r1"), ("url", "http://x")]);
        let refused = Cli::try_parse_from(["vigil", "agent", "--dev", "--node-meta", ":v"]);
        assert!(refused.is_err());
    }

    #[test]
    fn one_timing_profile_flag_with_the_old_spelling_kept() {
        assert_eq!(agent(&[]).timing_profile, TimingProfile::Lan);
        for flag in ["--timing-profile", "--gossip-profile"] {
            assert_eq!(agent(&[flag, "local"]).timing_profile, TimingProfile::Local);
            assert_eq!(agent(&[flag, "lan"]).timing_profile, TimingProfile::Lan);
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
        let config = agent(&[]).config().unwrap();
        assert_eq!(config.http_addr, Some("127.0.0.1:8500".parse().unwrap()));
        assert_eq!(config.https, None);

        // The file alone: HTTPS only, client certificates required.
        let config = agent(&["--config", path]).config().unwrap();
        assert_eq!(config.http_addr, None);
        assert_eq!(
            config.https,
            Some(HttpsConfig {
                addr: "127.0.0.1:8501".parse().unwrap(),
                verify_incoming: true
            })
        );

        // Flags win.
        let config = agent(&["--config", path, "--http-addr", "127.0.0.1:1"])
            .config()
            .unwrap();
        assert_eq!(config.http_addr, Some("127.0.0.1:1".parse().unwrap()));
        let config = agent(&["--config", path, "--https-addr", "127.0.0.1:2"])
            .config()
            .unwrap();
        assert_eq!(config.https.unwrap().addr, "127.0.0.1:2".parse().unwrap());

        // Nothing to serve on, or client verification without HTTPS: refused.
        let err = agent(&["--http-addr", "off"]).config().unwrap_err();
        assert!(err.to_string().contains("--https-addr"), "{err}");
        let err = agent(&["--verify-incoming-https"]).config().unwrap_err();
        assert!(err.to_string().contains("--https-addr"), "{err}");
        assert!(
            Cli::try_parse_from(["vigil", "agent", "--dev", "--http-addr", "nowhere"]).is_err()
        );
    }

    #[test]
    fn the_gossip_key_comes_from_the_flag_or_else_the_config_file() {
        let (_dir, path) = config_file(&format!(
            "encrypt = \"{}\"\n",
            crate::gossip::generate_key()
        ));
        let path = path.as_str();
        assert!(
            agent(&["--config", path])
                .config()
                .unwrap()
                .encrypt
                .is_some()
        );
        assert!(agent(&[]).config().unwrap().encrypt.is_none());
        // The flag wins: a bad flag is an error even with a good key in the file.
        let err = agent(&["--config", path, "--encrypt", "c2hvcnQ="])
            .config()
            .unwrap_err();
        assert!(err.to_string().starts_with("--encrypt: "), "{err}");
    }
}
