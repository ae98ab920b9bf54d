//! The agent's configuration: one nested, serde-derived [`Config`], read in three layers, each
//! over the one before (a key a later layer sets wins, a table merges key by key):
//!
//! 1. the config file (`--config FILE`: TOML, or JSON, Consul's own format, for a name ending in
//!    `.json`);
//! 2. the environment: `VIGIL_AGENT_<KEY>` for each key, upper case, a table's keys after `__`
//!    (`VIGIL_AGENT_ACL__DEFAULT_POLICY=deny`); the value is a TOML value (`true`, `3`,
//!    `["10.0.0.1:8301"]`), and text that is not one is a string (`VIGIL_AGENT_DATA_DIR=/data`);
//! 3. the `vigil agent` flags, which the `vigil` binary turns into the same keys.
//!
//! Keys are Consul's where Consul has the setting (`data_dir`, `server`, `bootstrap_expect`,
//! `retry_join`, `encrypt`, `node_name`, `node_id`, `node_meta`, `ca_file`, `cert_file`,
//! `key_file`, `verify_incoming_https`, `log_level`, `log_json`, `session_ttl_min`,
//! `enable_script_checks`, `enable_local_script_checks`, `limits.http_max_conns_per_client`, the
//! `acl` block, `service`/`services` and `check`/`checks`), and Vigil's own otherwise. An unknown
//! key is an error, in the file and in the environment, as Consul refuses one in its file. Every
//! key has a default (the `default_*` functions); [`Config::agent_config`] checks the combination
//! and gives the [`AgentConfig`] that [`crate::start`] runs, as Consul's `Config` becomes its
//! `RuntimeConfig`. [`Config::for_test`] is the in-process tests' starting point.
//!
//! `ae_interval` is a test knob, not a product setting: no flag sets it and the README leaves it
//! out; the multi-process tests set it through `VIGIL_AGENT_AE_INTERVAL`.
//!
//! ```toml
//! # The gossip key (`vigil keygen`), as Consul's `encrypt`: here, in a file only the agent's user
//! # can read, it stays out of the command line that every local user sees in /proc.
//! encrypt = "cg8StVXbQJ0gPvMd9o7yrg1Ttd/ZCXtSFKgSbtXaV2k="
//! enable_script_checks = false
//! enable_local_script_checks = true
//! # The HTTP API's listeners: plain HTTP off, HTTPS with the agent's certificate, client
//! # certificates required.
//! http_addr = "off"
//! https_addr = "127.0.0.1:8501"
//! verify_incoming_https = true
//! # This node's metadata in the catalog (Consul's `node_meta`; `--node-meta key:value` adds).
//! node_meta = { rack = "r1" }
//!
//! [[service]]
//! name = "web"
//! port = 8080
//! tags = ["v1"]
//! [[service.checks]]
//! http = "http://127.0.0.1:8080/health"
//! interval = "10s"
//!
//! [[check]]
//! id = "worker"
//! name = "Worker heartbeat"
//! ttl = "30s"
//! ```
//!
//! Each `[[service]]` and `[[check]]` table takes the same fields as the HTTP API's JSON body,
//! in Consul's config-file spelling (snake_case) or the API's; `services` and `checks` are
//! accepted as well as `service` and `check`.

mod de;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use vigil_shared::acl::authz::DefaultPolicy;

use crate::acl::AclConfig;
use crate::local::definition::{CheckDefinition, ServiceDefinition, parse_check, parse_service};
use crate::{AgentConfig, AgentMode, HttpsConfig, TlsSource};
use vigil_gossip::{Key, KeyringFile, TimingProfile};

/// The environment variables of the second layer start with this.
pub const ENV_PREFIX: &str = "VIGIL_AGENT_";

/// Every setting of an agent, as the config file spells it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// One node with the server role, everything in memory, throwaway certificates (`--dev`).
    #[serde(default, deserialize_with = "de::flag")]
    pub dev: bool,
    /// Run the server role (Consul's `server`); needs `data_dir` and `bootstrap_expect`.
    #[serde(default, deserialize_with = "de::flag")]
    pub server: bool,
    /// Servers to wait for before bootstrapping: 1, 3 or 5.
    #[serde(default, deserialize_with = "de::bootstrap_expect")]
    pub bootstrap_expect: Option<usize>,
    /// The raft log, snapshots, this node's ID and the gossip keyring.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Gossip addresses of members to join, retried until connected (`--join`).
    #[serde(default, deserialize_with = "de::addrs")]
    pub retry_join: Vec<SocketAddr>,
    /// Gossip (Serf) address, UDP; port 0 picks a free port.
    #[serde(default = "default_serf_addr", deserialize_with = "de::addr")]
    pub serf_addr: SocketAddr,
    /// A server's RPC address (QUIC); a client agent serves no RPC.
    #[serde(default = "default_rpc_addr", deserialize_with = "de::addr")]
    pub rpc_addr: SocketAddr,
    /// The plain-HTTP API: `HOST:PORT`, `off` (or Consul's `-1`), or `unix:///path`.
    #[serde(default = "default_http_addr", deserialize_with = "de::listen_addr")]
    pub http_addr: ListenAddr,
    /// The HTTPS API, served with this agent's certificate.
    #[serde(default, deserialize_with = "de::optional_addr")]
    pub https_addr: Option<SocketAddr>,
    /// HTTPS clients must present a certificate signed by the CA.
    #[serde(default, deserialize_with = "de::flag")]
    pub verify_incoming_https: bool,
    /// The gossip key (`vigil keygen`); it seeds an empty keyring.
    #[serde(default, deserialize_with = "de::key")]
    pub encrypt: Option<Key>,
    /// Gossip and raft timing: `lan`, or `local` (fast detection on one machine, for tests).
    #[serde(default = "default_timing_profile", deserialize_with = "de::profile")]
    pub timing_profile: TimingProfile,
    /// The CA certificate (PEM) that signs every agent's certificate.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// This agent's certificate (PEM).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// This agent's private key (PEM).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The node's name (`--node`); the hostname when unset.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The node's UUID; kept in `data_dir`, else new at every start, when unset.
    #[serde(default, deserialize_with = "de::node_id")]
    pub node_id: Option<String>,
    /// This node's metadata in the catalog.
    #[serde(default, deserialize_with = "de::node_meta")]
    pub node_meta: BTreeMap<String, String>,
    /// The log filter (`info`, `debug`, `vigil_server=debug`).
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// Log as JSON lines.
    #[serde(default, deserialize_with = "de::flag")]
    pub log_json: bool,
    /// The smallest session TTL a server accepts (Consul's `session_ttl_min`).
    #[serde(default = "default_session_ttl_min", deserialize_with = "de::duration")]
    pub session_ttl_min: Duration,
    /// The smallest lock-delay a new session gets from this server; at most 60s.
    #[serde(default, deserialize_with = "de::duration")]
    pub lock_delay_min: Duration,
    /// Events of each lock's history a server keeps.
    #[serde(
        default = "default_lock_history_per_lock",
        deserialize_with = "de::at_least_one"
    )]
    pub lock_history_per_lock: usize,
    /// Events of all locks' histories a server keeps.
    #[serde(
        default = "default_lock_history_total",
        deserialize_with = "de::at_least_one"
    )]
    pub lock_history_total: usize,
    /// Blocking queries a server holds at once at most; more answer 429.
    #[serde(
        default = "default_max_blocking_queries",
        deserialize_with = "de::whole"
    )]
    pub max_blocking_queries: usize,
    /// The part of `max_blocking_queries` only lock waits may take; an eighth when unset.
    #[serde(default, deserialize_with = "de::optional_whole")]
    pub lock_wait_reserve: Option<usize>,
    /// Script checks may run, from the config file and over HTTP.
    #[serde(default, deserialize_with = "de::flag")]
    pub enable_script_checks: bool,
    /// Script checks of the config file may run, not those registered over HTTP.
    #[serde(default, deserialize_with = "de::flag")]
    pub enable_local_script_checks: bool,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub acl: Acl,
    /// The full anti-entropy period (Consul's internal `ae_interval`). A test knob: see the
    /// module's doc.
    #[serde(default = "default_ae_interval", deserialize_with = "de::duration")]
    pub ae_interval: Duration,
    /// Services to register at every start (`[[service]]`).
    #[serde(default, deserialize_with = "de::tables")]
    pub service: Vec<Value>,
    /// The same, spelled `[[services]]`.
    #[serde(default, deserialize_with = "de::tables")]
    pub services: Vec<Value>,
    /// Checks to register at every start (`[[check]]`).
    #[serde(default, deserialize_with = "de::tables")]
    pub check: Vec<Value>,
    /// The same, spelled `[[checks]]`.
    #[serde(default, deserialize_with = "de::tables")]
    pub checks: Vec<Value>,
}

/// The HTTP API's connection limits (Consul's `limits` block).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Open HTTP connections one client IP may have; 0 for no cap.
    #[serde(
        default = "default_http_max_conns_per_client",
        deserialize_with = "de::whole"
    )]
    pub http_max_conns_per_client: usize,
    /// How long a connection may take to send a request's headers (and may stay idle).
    #[serde(
        default = "default_http_header_timeout",
        deserialize_with = "de::duration"
    )]
    pub http_header_timeout: Duration,
}

/// Consul's `acl` block: ACLs are on with a `default_policy`, or with `enabled` (policy `allow`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acl {
    #[serde(default, deserialize_with = "de::flag")]
    pub enabled: bool,
    #[serde(default, deserialize_with = "de::policy")]
    pub default_policy: Option<DefaultPolicy>,
    #[serde(default)]
    pub tokens: AclTokens,
}

/// Consul's `acl.tokens`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclTokens {
    /// The management token that exists from the first start; it also ends `acl bootstrap`.
    #[serde(default)]
    pub initial_management: Option<String>,
    /// The token this agent's own requests use.
    #[serde(default)]
    pub agent: Option<String>,
}

fn default_serf_addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8301)
}

fn default_rpc_addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8300)
}

/// Consul's plain-HTTP port.
fn default_http_addr() -> ListenAddr {
    ListenAddr::Tcp(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8500)))
}

fn default_timing_profile() -> TimingProfile {
    TimingProfile::Lan
}

fn default_log_level() -> String {
    "info".to_owned()
}

/// Consul's.
fn default_session_ttl_min() -> Duration {
    Duration::from_secs(10)
}

fn default_lock_history_per_lock() -> usize {
    vigil_server::state::history::DEFAULT_PER_LOCK
}

fn default_lock_history_total() -> usize {
    vigil_server::state::history::DEFAULT_TOTAL
}

fn default_max_blocking_queries() -> usize {
    16384
}

/// Consul's `limits.http_max_conns_per_client`.
fn default_http_max_conns_per_client() -> usize {
    200
}

fn default_http_header_timeout() -> Duration {
    Duration::from_secs(60)
}

/// Consul's.
fn default_ae_interval() -> Duration {
    Duration::from_secs(60)
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            http_max_conns_per_client: default_http_max_conns_per_client(),
            http_header_timeout: default_http_header_timeout(),
        }
    }
}

impl Default for Config {
    /// Every key at its default: a client agent with nothing to join (not runnable as it is).
    fn default() -> Config {
        decode(Value::Object(Map::new())).expect("every key has a default")
    }
}

/// A listener's address: a TCP address or off (`Tcp(None)`), or a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(Option<SocketAddr>),
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    /// `HOST:PORT`, `off` (or Consul's port `-1`), or `unix:///path` (as Consul's
    /// `addresses.http`).
    fn from_str(s: &str) -> Result<ListenAddr, String> {
        match s.trim() {
            "off" | "-1" => Ok(ListenAddr::Tcp(None)),
            addr => match addr.strip_prefix("unix://") {
                Some("") => Err(format!("{s:?} names no socket path")),
                Some(path) => Ok(ListenAddr::Unix(PathBuf::from(path))),
                None => addr
                    .parse()
                    .map(|addr| ListenAddr::Tcp(Some(addr)))
                    .map_err(|_| format!("{s:?} is neither HOST:PORT nor off")),
            },
        }
    }
}

/// As written on the command line, for the flags' layer.
impl Serialize for ListenAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(Some(addr)) => addr.fmt(f),
            ListenAddr::Tcp(None) => f.write_str("off"),
            ListenAddr::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The config file at `path`.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// A `VIGIL_AGENT_*` variable.
    #[error("the environment's {ENV_PREFIX}* variables: {0}")]
    Environment(String),
    /// The flags, as the `vigil` binary gave them.
    #[error("the command line: {0}")]
    Flags(String),
    /// Settings that each parse but cannot run together; the text names the flags and keys.
    #[error("{0}")]
    Combination(String),
}

/// What the config declares for the agent's local state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalDefinitions {
    /// Lets script checks run, from the config file and over HTTP.
    pub enable_script_checks: bool,
    /// Lets script checks of the config file run, not those registered over HTTP.
    pub enable_local_script_checks: bool,
    /// This node's metadata in the catalog (Consul's `node_meta`).
    pub node_meta: BTreeMap<String, String>,
    pub services: Vec<ServiceDefinition>,
    pub checks: Vec<CheckDefinition>,
}

/// One layer's keys decoded: a type error names its key (`` `server` must be true or false ``,
/// `encrypt: ...`), an unknown key says so.
fn decode(layer: Value) -> Result<Config, String> {
    serde_path_to_error::deserialize(layer).map_err(|e| describe(&e))
}

/// An error as the config file's errors read: `` `key` must ... ``, `key: ...`, or
/// ``unknown key `key` (expected ...)``.
fn describe(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let inner = e.inner().to_string();
    // serde's own text, "unknown field `key`, expected ...", with the path already ending
    // in the key.
    if inner.starts_with("unknown field `") {
        let expected = inner.split_once(", expected ").map_or("", |(_, e)| e);
        return format!(
            "unknown key `{path}` (expected {})",
            expected.replace('`', "")
        );
    }
    if inner.starts_with("must ") {
        format!("`{path}` {inner}")
    } else {
        format!("{path}: {inner}")
    }
}

/// Objects merge key by key (`over` wins); anything else `over` replaces.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

/// The `VIGIL_AGENT_*` variables among `vars` as one layer: `VIGIL_AGENT_ACL__DEFAULT_POLICY`
/// is `acl.default_policy`; a value that is not a TOML value is a string.
fn environment_layer(vars: impl IntoIterator<Item = (String, String)>) -> Value {
    let mut layer = Value::Object(Map::new());
    for (name, text) in vars {
        let Some(key) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let value = toml::from_str::<toml::Table>(&format!("v = {text}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .and_then(|v| serde_json::to_value(v).ok())
            .unwrap_or(Value::String(text));
        let nested = key
            .to_ascii_lowercase()
            .rsplit("__")
            .fold(value, |value, part| {
                Value::Object(Map::from_iter([(part.to_owned(), value)]))
            });
        merge(&mut layer, nested);
    }
    layer
}

/// A TOML syntax error without the quoted source line toml's `Display` adds: that line may hold
/// the gossip key, and the error ends up in the log.
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text
                .get(..span.start)
                .map_or(0, |t| t.matches('\n').count())
                + 1;
            format!("line {line}: {}", e.message())
        }
        None => e.message().to_owned(),
    }
}

/// A config file's text (TOML) as a layer.
fn toml_layer(text: &str) -> Result<Value, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
    serde_json::to_value(&doc).map_err(|e| e.to_string())
}

/// A config file's text as JSON (Consul's own config format) as a layer: an object with the keys
/// of the TOML file; empty text declares nothing. A syntax error names its line and column,
/// never the text (which may hold the gossip key).
fn json_layer(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(doc @ Value::Object(_)) => Ok(doc),
        Ok(_) => Err("a JSON config file is an object".to_owned()),
        Err(e) => Err(format!(
            "line {} column {}: invalid JSON",
            e.line(),
            e.column()
        )),
    }
}

/// The config file at `path` as a layer: JSON when its name ends in `.json`, else TOML.
fn file_layer(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let layer = if path.extension().is_some_and(|e| e == "json") {
        json_layer(&text)
    } else {
        toml_layer(&text)
    };
    layer.map_err(|message| invalid(path, message))
}

fn invalid(path: &Path, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: path.display().to_string(),
        message,
    }
}

impl Config {
    /// The file at `file` (if any), then the `VIGIL_AGENT_*` variables among `env`, then
    /// `flags` (keys as the file spells them), each over the one before.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: Value,
    ) -> Result<Config, ConfigError> {
        // Each layer is checked on its own first, so that an error names where it is.
        let mut merged = match file {
            Some(path) => {
                let layer = file_layer(path)?;
                decode(layer.clone())
                    .and_then(|config| config.local_definitions())
                    .map_err(|message| invalid(path, message))?;
                layer
            }
            None => Value::Object(Map::new()),
        };
        let env = environment_layer(env);
        decode(env.clone()).map_err(ConfigError::Environment)?;
        merge(&mut merged, env);
        merge(&mut merged, flags);
        decode(merged).map_err(ConfigError::Flags)
    }

    /// The services and checks of the config file at `path` alone: what `PUT /v1/agent/reload`
    /// re-reads.
    pub fn file_definitions(path: &Path) -> Result<LocalDefinitions, ConfigError> {
        decode(file_layer(path)?)
            .and_then(|config| config.local_definitions())
            .map_err(|message| invalid(path, message))
    }

    /// A dev agent for in-process tests: every listener on 127.0.0.1 port 0, `local` timing,
    /// and the test knobs turned down (a 1 s session TTL floor, a 1 s anti-entropy period).
    #[cfg(test)]
    pub fn for_test() -> Config {
        let any_port = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        Config {
            dev: true,
            node_name: Some("test-node".to_owned()),
            serf_addr: any_port,
            rpc_addr: any_port,
            http_addr: ListenAddr::Tcp(Some(any_port)),
            timing_profile: TimingProfile::Local,
            session_ttl_min: Duration::from_secs(1),
            ae_interval: Duration::from_secs(1),
            log_level: "warn".to_owned(),
            ..Config::default()
        }
    }

    /// The services, checks, node metadata and script switches it declares; an error names the
    /// entry (`check #1: ...`).
    pub fn local_definitions(&self) -> Result<LocalDefinitions, String> {
        let mut services = Vec::new();
        for (key, tables) in [("service", &self.service), ("services", &self.services)] {
            for (i, table) in tables.iter().enumerate() {
                let service =
                    parse_service(table.clone()).map_err(|e| format!("{key} #{}: {e}", i + 1))?;
                services.push(service);
            }
        }
        let mut checks = Vec::new();
        for (key, tables) in [("check", &self.check), ("checks", &self.checks)] {
            for (i, table) in tables.iter().enumerate() {
                let check =
                    parse_check(table.clone()).map_err(|e| format!("{key} #{}: {e}", i + 1))?;
                checks.push(check);
            }
        }
        Ok(LocalDefinitions {
            enable_script_checks: self.enable_script_checks,
            enable_local_script_checks: self.enable_local_script_checks,
            node_meta: self.node_meta.clone(),
            services,
            checks,
        })
    }

    /// Checks the combination and builds what the agent runs. `config_file` is kept for
    /// `PUT /v1/agent/reload`.
    pub fn agent_config(self, config_file: Option<PathBuf>) -> Result<AgentConfig, ConfigError> {
        let refuse = |text: &str| Err(ConfigError::Combination(text.to_owned()));
        let mode = if self.dev {
            if self.server || self.data_dir.is_some() || self.bootstrap_expect.is_some() {
                return refuse(
                    "--dev (dev) cannot be used with --server, --data-dir or --bootstrap-expect",
                );
            }
            AgentMode::Dev
        } else if self.server {
            match (&self.data_dir, self.bootstrap_expect) {
                (Some(data_dir), Some(bootstrap_expect)) => AgentMode::Server {
                    data_dir: data_dir.clone(),
                    bootstrap_expect,
                },
                _ => {
                    return refuse(
                        "a server (--server, server) needs --data-dir (data_dir) and \
                         --bootstrap-expect (bootstrap_expect)",
                    );
                }
            }
        } else if self.retry_join.is_empty() {
            return refuse(
                "a client agent needs at least one --join (retry_join: a member's gossip \
                 address), or use --dev or --server",
            );
        } else {
            AgentMode::Client
        };
        let tls = match (&self.ca_file, &self.cert_file, &self.key_file) {
            (Some(ca), Some(cert), Some(key)) => TlsSource::Files {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            },
            (None, None, None) if self.dev => TlsSource::Throwaway,
            _ => {
                return refuse(
                    "--ca-file, --cert-file and --key-file are required together (only --dev \
                     generates throwaway certificates)",
                );
            }
        };
        let (http_addr, http_unix) = match &self.http_addr {
            ListenAddr::Tcp(addr) => (*addr, None),
            ListenAddr::Unix(path) => (None, Some(path.clone())),
        };
        let https = match self.https_addr {
            Some(addr) => Some(HttpsConfig {
                addr,
                verify_incoming: self.verify_incoming_https,
            }),
            None if self.verify_incoming_https => {
                return refuse(
                    "--verify-incoming-https needs an HTTPS address (--https-addr, https_addr)",
                );
            }
            None => None,
        };
        if http_addr.is_none() && http_unix.is_none() && https.is_none() {
            return refuse(
                "--http-addr off needs --https-addr (https_addr): the agent must serve its API \
                 somewhere",
            );
        }
        if self.lock_delay_min > Duration::from_millis(vigil_shared::MAX_LOCK_DELAY_MS) {
            return refuse(
                "--lock-delay-min (lock_delay_min) must be at most 60s (the longest lock-delay)",
            );
        }
        if self.ae_interval.is_zero() {
            return refuse("ae_interval must be greater than 0");
        }
        if self.limits.http_header_timeout.is_zero() {
            return refuse(
                "--http-header-timeout (limits.http_header_timeout) must be greater than 0",
            );
        }
        let local = self.local_definitions().map_err(ConfigError::Environment)?;
        Ok(AgentConfig {
            node_name: self.node_name.unwrap_or_else(hostname),
            node_id: self.node_id,
            keyring_file: self.data_dir.as_deref().map(KeyringFile::in_data_dir),
            data_dir: self.data_dir,
            http_addr,
            http_unix,
            https,
            rpc_addr: self.rpc_addr,
            serf_addr: self.serf_addr,
            join: self.retry_join,
            encrypt: self.encrypt,
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
            local,
            config_file,
            http_limits: crate::http::serve::ConnLimits {
                max_conns_per_client: self.limits.http_max_conns_per_client,
                header_timeout: self.limits.http_header_timeout,
            },
            acl: AclConfig {
                default_policy: self
                    .acl
                    .default_policy
                    .or(self.acl.enabled.then_some(DefaultPolicy::Allow)),
                initial_management: self.acl.tokens.initial_management,
                agent_token: self.acl.tokens.agent,
            },
        })
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "vigil".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::definition::CheckKind;

    /// A config file's text (TOML), checked as `Config::load` checks a file.
    fn parse(text: &str) -> Result<Config, String> {
        let config = decode(toml_layer(text)?)?;
        config.local_definitions()?;
        Ok(config)
    }

    fn parse_json(text: &str) -> Result<Config, String> {
        let config = decode(json_layer(text)?)?;
        config.local_definitions()?;
        Ok(config)
    }

    fn local(config: Config) -> LocalDefinitions {
        config.local_definitions().expect("checked by parse")
    }

    /// The ACL settings a dev agent gets from `text`.
    fn acl(text: &str) -> AclConfig {
        let config = Config {
            dev: true,
            ..parse(text).unwrap()
        };
        config.agent_config(None).unwrap().acl
    }

    #[test]
    fn consuls_json_config_declares_the_same() {
        let json = parse_json(
            r#"{"service": {"name": "redis", "port": 1234, "Meta": {"some": "meta"}},
                "node_meta": {"rack": "r1"}}"#,
        )
        .expect("parses");
        let toml = parse(
            "node_meta = { rack = \"r1\" }\n[service]\nname = \"redis\"\nport = 1234\n\
             Meta = { some = \"meta\" }\n",
        )
        .expect("parses");
        let (json, toml) = (local(json), local(toml));
        assert_eq!(json, toml);
        assert_eq!(json.services[0].service.port, 1234);
        assert_eq!(
            local(parse_json(" \n").expect("empty")),
            LocalDefinitions::default()
        );
        let err = parse_json("{\"encrypt\": \"secret\",").unwrap_err();
        assert!(
            err.starts_with("line 1 column") && !err.contains("secret"),
            "{err}"
        );
        assert!(parse_json("[1]").is_err());
    }

    #[test]
    fn the_shipped_example_config_parses() {
        let defs = local(parse(include_str!("../../docs/vigil.example.toml")).unwrap());
        assert!(!defs.enable_script_checks);
        assert_eq!(defs.services.len(), 1);
        assert_eq!(defs.checks.len(), 2);
    }

    #[test]
    fn the_acl_table_is_consuls_acl_block() {
        assert_eq!(
            acl(
                "[acl]\ndefault_policy = \"deny\"\n[acl.tokens]\ninitial_management = \"root\"\nagent = \"a\"\n"
            ),
            AclConfig {
                default_policy: Some(DefaultPolicy::Deny),
                initial_management: Some("root".into()),
                agent_token: Some("a".into()),
            }
        );
        assert_eq!(
            acl("[acl]\nenabled = true\n").default_policy,
            Some(DefaultPolicy::Allow)
        );
        assert_eq!(acl(""), AclConfig::default());
        assert!(parse("[acl]\ndefault_policy = \"maybe\"\n").is_err());
        let err = parse("[acl]\ntokens = { master = \"x\" }\n").unwrap_err();
        assert!(err.contains("acl.tokens.master"), "{err}");
    }

    #[test]
    fn services_and_checks_in_config_spelling() {
        let defs = local(
            parse(
                r#"
            enable_script_checks = true

            [[service]]
            name = "web"
            port = 8080
            tags = ["v1"]
            meta = { Team = "core" }
            [[service.checks]]
            http = "http://127.0.0.1:8080/health"
            interval = "10s"
            deregister_critical_service_after = "5m"

            [[check]]
            id = "worker"
            name = "Worker heartbeat"
            ttl = "30s"

            [[checks]]
            name = "disk"
            args = ["/bin/true"]
            interval = "1m"
            "#,
            )
            .unwrap(),
        );
        assert!(defs.enable_script_checks);
        assert_eq!(defs.services.len(), 1);
        let web = &defs.services[0];
        assert_eq!((web.service.id.as_str(), web.service.port), ("web", 8080));
        assert_eq!(web.service.meta["Team"], "core");
        assert_eq!(web.checks[0].id, "service:web");
        assert_eq!(
            web.checks[0].deregister_critical_after,
            Some(Duration::from_secs(300))
        );
        assert_eq!(defs.checks.len(), 2);
        assert_eq!(defs.checks[0].id, "worker");
        assert!(matches!(defs.checks[1].kind, CheckKind::Script { .. }));
    }

    #[test]
    fn errors_name_the_entry() {
        assert_eq!(
            parse("[[check]]\nname = \"x\"\n").unwrap_err(),
            "check #1: Invalid check: TTL must be > 0 for TTL checks"
        );
        assert_eq!(
            parse("[[service]]\nport = 1\n").unwrap_err(),
            "service #1: Missing service name"
        );
        assert!(
            parse("servce = 1")
                .unwrap_err()
                .contains("unknown key `servce`")
        );
        assert!(parse("[[check]\n").is_err(), "TOML syntax error");
    }

    #[test]
    fn the_gossip_key_and_the_script_switches() {
        let key = vigil_gossip::generate_key();
        let file = parse(&format!(
            "encrypt = \"{key}\"\nenable_local_script_checks = true\n"
        ))
        .unwrap();
        assert!(file.encrypt.is_some());
        assert!(file.enable_local_script_checks);
        assert!(!file.enable_script_checks);
        assert!(parse("").unwrap().encrypt.is_none());
        assert_eq!(
            parse("enable_local_script_checks = 1").unwrap_err(),
            "`enable_local_script_checks` must be true or false"
        );
        let err = parse("encrypt = \"c2hvcnQ=\"").unwrap_err();
        assert!(
            err.starts_with("encrypt: the gossip key must decode to 16, 24 or 32 bytes"),
            "{err}"
        );
    }

    #[test]
    fn errors_never_quote_the_gossip_key() {
        let key = vigil_gossip::generate_key();
        for text in [
            format!("encrypt = \"{key}"),
            format!("encrypt = \"{key}\" x"),
            format!("encrypt = \"{key}!\""),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(!err.contains(&key), "{err}");
            assert!(!err.contains(&key[..8]), "{err}");
        }
        assert!(
            parse(&format!("[[check]]\nname = \"x\"\nencrypt = \"{key}\" x\n"))
                .unwrap_err()
                .starts_with("line 3: "),
        );
    }
}
