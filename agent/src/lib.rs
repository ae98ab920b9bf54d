//! The `vigil` agent: its configuration ([`config`]), the gossip cluster, the server role run
//! in-process when asked, and the Consul-compatible HTTP API. `start` returns a [`Handle`]
//! that knows the bound addresses, so tests start agents on port 0 through the same code path as
//! `main`.

pub mod acl;
pub mod backend;
pub mod config;
pub mod fds;
pub mod http;
pub mod local;
pub mod monitor;
pub mod node_id;
#[cfg(test)]
mod testing;
pub mod token;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_gossip::{Gossip, GossipConfig, Key, Keyring, KeyringFile, TimingProfile};
use vigil_server::{RaftTiming, Server, ServerConfig, ServerMode};
use vigil_shared::catalog::{HealthStatus, MemberRole, SERF_HEALTH};
use vigil_shared::rpc::{Consistency, QueryOptions, reads};
use vigil_wire::tls::TlsMaterial;
use vigil_wire::transport::RpcClient;

use backend::{Backend, RemoteServers};

/// The only datacenter a Vigil cluster has.
pub const DATACENTER: &str = "dc1";

/// How long a dev agent may take to register itself.
const DEV_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What this agent runs.
#[derive(Debug, Clone)]
pub enum AgentMode {
    /// One server, everything in memory, throwaway certificates.
    Dev,
    /// A server of a 1, 3 or 5 server set.
    Server {
        data_dir: PathBuf,
        bootstrap_expect: usize,
    },
    /// A client agent forwarding to the servers gossip reports.
    Client,
}

/// Where the agent's TLS identity comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    /// Generated in memory (dev mode only).
    Throwaway,
    Files {
        ca: PathBuf,
        cert: PathBuf,
        key: PathBuf,
    },
}

/// A validated agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    /// This node's UUID in the catalog (`--node-id`); `None` takes the one kept in
    /// `data_dir`, or a new one.
    pub node_id: Option<String>,
    /// `--data-dir`: where a server keeps its state and any agent its node ID and keyring.
    pub data_dir: Option<PathBuf>,
    /// The plain-HTTP API's address; `None` turns plain HTTP off (`--http-addr off`, Consul's
    /// `ports.http = -1`), leaving HTTPS.
    pub http_addr: Option<SocketAddr>,
    /// The plain-HTTP API on a Unix socket instead (`--http-addr unix:///path`).
    pub http_unix: Option<PathBuf>,
    /// The HTTPS API (`--https-addr`), served with this agent's certificate.
    pub https: Option<HttpsConfig>,
    pub rpc_addr: SocketAddr,
    /// Gossip (Serf) address; port 0 picks a free port.
    pub serf_addr: SocketAddr,
    /// Gossip addresses of members to join (retried while not connected).
    pub join: Vec<SocketAddr>,
    /// The cluster's gossip key (`vigil keygen`); it seeds an empty keyring.
    pub encrypt: Option<Key>,
    /// Where the gossip keyring is kept across restarts (`<data-dir>/serf/local.keyring`);
    /// None (a dev agent, or a client without `--data-dir`) keeps it in memory.
    pub keyring_file: Option<KeyringFile>,
    /// Gossip and raft timing (`--timing-profile`); a dev agent's raft is always `local`.
    pub profile: TimingProfile,
    pub mode: AgentMode,
    pub tls: TlsSource,
    /// Smallest session TTL accepted; lowered only by tests.
    pub session_ttl_min: Duration,
    /// Smallest lock-delay a session created through this server gets (`--lock-delay-min`).
    pub lock_delay_min: Duration,
    /// How many lock-history events the server role keeps (`--lock-history-per-lock`,
    /// `--lock-history-total`).
    pub lock_history: vigil_server::state::history::Limits,
    /// Whether script checks may run, from the config file and over HTTP
    /// (`--enable-script-checks`).
    pub enable_script_checks: bool,
    /// Whether script checks of the config file may run (`--enable-local-script-checks`).
    pub enable_local_script_checks: bool,
    /// Full anti-entropy period (Consul's `ae_interval`, 1 min); shortened only by tests.
    pub ae_interval: Duration,
    /// Blocking queries the server role holds at once at most; more answer 429.
    pub max_blocking_queries: usize,
    /// The part of `max_blocking_queries` only lock waits may take.
    pub lock_wait_reserve: usize,
    /// Services and checks declared in the config file (`--config`).
    pub local: config::LocalDefinitions,
    /// The config file, re-read by `PUT /v1/agent/reload`.
    pub config_file: Option<PathBuf>,
    /// Per-client connection cap and header timeout of the HTTP API.
    pub http_limits: http::serve::ConnLimits,
    /// ACL settings (`--acl-*`, the config file's `[acl]`).
    pub acl: acl::AclConfig,
}

/// The HTTPS API: where it listens and whether clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpsConfig {
    pub addr: SocketAddr,
    /// Consul's `verify_incoming_https`: a client certificate signed by the CA is required.
    pub verify_incoming: bool,
}

/// A running agent.
pub struct Handle {
    /// The bound plain-HTTP address (`None`: plain HTTP is off).
    pub http_addr: Option<SocketAddr>,
    /// The Unix socket plain HTTP is served on instead, if any.
    pub http_unix: Option<PathBuf>,
    /// The bound HTTPS address (`None`: no HTTPS).
    pub https_addr: Option<SocketAddr>,
    pub rpc_addr: SocketAddr,
    pub serf_addr: SocketAddr,
    pub backend: Arc<Backend>,
    pub gossip: Gossip,
    pub local: Arc<local::LocalState>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Handle {
    /// Waits for shutdown to be requested, then drains the HTTP server and stops the server role.
    /// A server whose raft stops on a fatal error (a failed log write, e.g. a full disk) shuts
    /// the agent down and returns that error, so the process exits non-zero and a supervisor
    /// restarts it once the cause is gone (as etcd does on a failed WAL write); meanwhile the
    /// other servers elect a leader without it.
    pub async fn wait(self) -> anyhow::Result<()> {
        let failed = async {
            match self.backend.server() {
                Some(server) => server.failed().await,
                None => std::future::pending().await,
            }
        };
        let failure = tokio::select! {
            () = self.shutdown.cancelled() => None,
            fatal = failed => {
                tracing::error!(error = %fatal, "raft stopped on this server; shutting down");
                self.shutdown.cancel();
                Some(fatal)
            }
        };
        self.tasks.close();
        self.tasks.wait().await;
        if let Some(server) = self.backend.server() {
            server.shutdown().await;
        }
        match failure {
            Some(fatal) => Err(anyhow::anyhow!("raft stopped on this server: {fatal}")),
            None => Ok(()),
        }
    }
}

/// Starts an agent: gossip, the server role (dev or cluster) or a client, plus the HTTP API.
pub async fn start(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<Handle> {
    let tls = match &config.tls {
        TlsSource::Throwaway => TlsMaterial::dev()?,
        TlsSource::Files { ca, cert, key } => TlsMaterial::load(ca, cert, key)
            .with_context(|| "loading the TLS files (--ca-file, --cert-file, --key-file)")?,
    };
    vigil_server::telemetry::Sink::install();
    let fds = fds::raise_limit();
    let http_connections = http::serve::Connections::new(fds.http_connections());
    tracing::info!(
        open_file_limit = fds.soft,
        raised_from = ?fds.raised_from,
        http_connections_max = fds.http_connections(),
        "file descriptors"
    );
    let http_listener = match config.http_addr {
        Some(addr) => Some(
            http::serve::bind_tcp(addr)
                .with_context(|| format!("binding the HTTP address {addr}"))?,
        ),
        None => None,
    };
    let http_addr = http_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let unix_listener = match &config.http_unix {
        Some(path) => Some(
            http::serve::bind_unix(path)
                .with_context(|| format!("binding the HTTP socket {}", path.display()))?,
        ),
        None => None,
    };
    let https_listener = match config.https {
        Some(https) => {
            if matches!(config.tls, TlsSource::Throwaway) {
                tracing::warn!(
                    "HTTPS with --dev's throwaway certificate: no client can verify it; give \
                     --ca-file, --cert-file and --key-file from `vigil tls`"
                );
            }
            let acceptor = tokio_rustls::TlsAcceptor::from(
                tls.https_server_config(https.verify_incoming)
                    .context("building the HTTPS configuration")?,
            );
            let listener = http::serve::bind_tcp(https.addr)
                .with_context(|| format!("binding the HTTPS address {}", https.addr))?;
            Some((listener, acceptor))
        }
        None => None,
    };
    let https_addr = https_listener
        .as_ref()
        .map(|(listener, _)| listener.local_addr())
        .transpose()?;
    let is_server = !matches!(config.mode, AgentMode::Client);
    let rpc_socket = if is_server {
        Some(
            UdpSocket::bind(config.rpc_addr)
                .with_context(|| format!("binding the RPC address {}", config.rpc_addr))?,
        )
    } else {
        None
    };
    // A client agent serves no RPC: it advertises port 0 (servers are found by role, never by
    // this address), and dials from its own IP rather than from every interface.
    let rpc_addr = match &rpc_socket {
        Some(socket) => socket.local_addr()?,
        None => SocketAddr::new(config.serf_addr.ip(), 0),
    };

    let tasks = TaskTracker::new();
    let gossip = vigil_gossip::start(
        GossipConfig {
            name: config.node_name.clone(),
            bind_addr: config.serf_addr,
            advertise_addr: None,
            role: if is_server {
                MemberRole::Server
            } else {
                MemberRole::Client
            },
            rpc_addr,
            datacenter: DATACENTER.to_owned(),
            join: config.join.clone(),
            keyring: config.encrypt.clone().map(Keyring::new),
            keyring_file: config.keyring_file.clone(),
            profile: config.profile,
        },
        shutdown.clone(),
        &tasks,
    )
    .await?;

    tasks.spawn(vigil_server::telemetry::count_member_flaps(
        gossip.subscribe(),
        shutdown.clone(),
    ));
    let agent_token = token::AgentToken::new(config.acl.default_policy.is_some());
    let backend = match (rpc_socket, &config.mode) {
        (None, _) => {
            let endpoint = client_endpoint(&tls, rpc_addr)?;
            let rpc = RpcClient::new(endpoint, tls.server_name());
            Backend::new(Arc::new(RemoteServers::new(
                rpc,
                gossip.subscribe(),
                shutdown.clone(),
                agent_token.clone(),
            )))
        }
        (Some(socket), mode) => {
            let mode = match mode {
                AgentMode::Server {
                    data_dir,
                    bootstrap_expect,
                } => ServerMode::Cluster {
                    data_dir: data_dir.clone(),
                    bootstrap_expect: *bootstrap_expect,
                },
                _ => ServerMode::Dev,
            };
            let raft = match &mode {
                // One node: no election to ride out, and a dev agent should be ready at once.
                ServerMode::Dev => RaftTiming::local(),
                ServerMode::Cluster { .. } => raft_timing(config.profile),
            };
            tracing::info!(
                profile = ?config.profile,
                heartbeat_ms = raft.heartbeat_ms,
                election_timeout_ms = %format!("{}-{}", raft.election_min_ms, raft.election_max_ms),
                "raft timing"
            );
            vigil_server::state::history::set_limits(config.lock_history);
            let server = Server::start(
                ServerConfig {
                    node_name: config.node_name.clone(),
                    rpc_addr,
                    raft,
                    mode,
                    members: Some(gossip.subscribe()),
                    max_blocking_queries: config.max_blocking_queries,
                    lock_wait_reserve: config.lock_wait_reserve,
                    session_ttl_min: config.session_ttl_min,
                    lock_delay_min: config.lock_delay_min,
                    acls: config
                        .acl
                        .default_policy
                        .map(|_| config.acl.initial_management.clone()),
                    acl_default_policy: config.acl.default_policy,
                },
                &tls,
                socket,
                shutdown.clone(),
            )
            .await?;
            Backend::local(server)
        }
    };
    let backend = Arc::new(backend);
    if matches!(config.mode, AgentMode::Dev) {
        // A dev agent is ready once sessions can be created on it and it carries the `consul`
        // service.
        wait_registered(&backend, &config.node_name).await?;
    }

    let node_id = node_id::resolve(config.node_id.as_deref(), config.data_dir.as_deref())?;
    // Every Consul agent's node carries its network segment (the default one, ""), and clients
    // compare node meta with it in.
    let mut definitions = config.local.clone();
    definitions
        .node_meta
        .entry("consul-network-segment".to_owned())
        .or_default();
    let local = local::LocalState::start(
        local::LocalOptions {
            node: config.node_name.clone(),
            node_id: node_id.clone(),
            address: gossip.gossip_addr().ip().to_string(),
            enable_script_checks: config.enable_script_checks,
            enable_local_script_checks: config.enable_local_script_checks,
            ae_interval: config.ae_interval,
            definitions,
        },
        Arc::clone(&backend),
        &tasks,
        shutdown.clone(),
    )
    .with_context(|| "registering the services and checks of the config file")?;

    let reloader = Arc::new(local::reload::Reloader::new(
        config.config_file.clone(),
        config.local.clone(),
    ));
    let router = http::router(http::AppState::from(http::HttpState {
        backend: Arc::clone(&backend),
        local: Arc::clone(&local),
        gossip: gossip.clone(),
        node_name: config.node_name.clone(),
        node_id,
        http_addr,
        https_addr,
        rpc_addr,
        session_ttl_min: config.session_ttl_min,
        shutdown: shutdown.clone(),
        reloader,
        acls: Arc::new(acl::Acls::new(
            &config.acl,
            DATACENTER,
            Arc::clone(&backend),
            shutdown.clone(),
            agent_token,
        )),
        acquire_waits: Default::default(),
    }));
    if let Some(listener) = http_listener {
        tasks.spawn(http::serve::serve(
            listener,
            router.clone(),
            config.http_limits,
            None,
            Arc::clone(&http_connections),
            shutdown.clone(),
        ));
    }
    if let Some(listener) = unix_listener {
        tasks.spawn(http::serve::serve_unix(
            listener,
            router.clone(),
            config.http_limits,
            Arc::clone(&http_connections),
            shutdown.clone(),
        ));
    }
    if let Some((listener, acceptor)) = https_listener {
        tasks.spawn(http::serve::serve(
            listener,
            router,
            config.http_limits,
            Some(acceptor),
            http_connections,
            shutdown.clone(),
        ));
    }
    Ok(Handle {
        http_addr,
        http_unix: config.http_unix.clone(),
        https_addr,
        rpc_addr,
        serf_addr: gossip.gossip_addr(),
        backend,
        gossip,
        local,
        shutdown,
        tasks,
    })
}

/// The raft timing of a timing profile: `lan` rides out slow heartbeats (150 ms heartbeats,
/// 1-2 s election timeout), `local` elects fast on one machine (100 ms, 0.5-1 s).
pub fn raft_timing(profile: TimingProfile) -> RaftTiming {
    match profile {
        TimingProfile::Lan => RaftTiming::lan(),
        TimingProfile::Local => RaftTiming::local(),
    }
}

/// A client agent's dial-only QUIC endpoint, bound to `bind` (its own IP, port 0) rather than to
/// every interface; with no server config it accepts no connection.
fn client_endpoint(tls: &TlsMaterial, bind: SocketAddr) -> anyhow::Result<quinn::Endpoint> {
    let socket = UdpSocket::bind(bind)
        .with_context(|| format!("binding the outgoing RPC socket on {bind}"))?;
    let runtime = quinn::default_runtime().context("no tokio runtime for the QUIC endpoint")?;
    let mut endpoint = quinn::Endpoint::new(tls.endpoint_config(), None, socket, runtime)
        .context("setting up the outgoing RPC endpoint")?;
    endpoint.set_default_client_config(tls.client_config()?);
    Ok(endpoint)
}

/// Waits until the leader has registered this node with a passing `serfHealth` check.
async fn wait_registered(backend: &Backend, node: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEV_READY_TIMEOUT;
    let opts = QueryOptions {
        consistency: Consistency::Stale,
        ..QueryOptions::default()
    };
    loop {
        let query = reads::NodeChecks {
            node: node.to_owned(),
        };
        let (checks, _) = backend.read(opts, query).await?;
        let passing = checks
            .iter()
            .any(|c| c.check_id == SERF_HEALTH && c.status == HealthStatus::Passing);
        // And the `consul` service the leader gives a server's node, which clients look for.
        let node = reads::CatalogNode {
            node: node.to_owned(),
        };
        let (found, _) = backend.read(opts, node).await?;
        let consul = found.is_some_and(|(_, services)| {
            services
                .iter()
                .any(|s| s.id == vigil_shared::catalog::CONSUL_SERVICE)
        });
        if passing && consul {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "this node was not registered within {DEV_READY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_test_agent_starts_on_free_ports_and_stops() {
        let config = config::Config::for_test()
            .agent_config(None)
            .expect("a runnable config");
        let shutdown = CancellationToken::new();
        let handle = start(config, shutdown.clone()).await.expect("started");
        let bound = [
            handle.http_addr.expect("plain HTTP"),
            handle.serf_addr,
            handle.rpc_addr,
        ];
        assert!(bound.iter().all(|addr| addr.port() != 0), "{bound:?}");
        shutdown.cancel();
        handle.wait().await.expect("a clean stop");
    }

    #[test]
    fn the_timing_profile_sets_raft_timing_too() {
        let lan = raft_timing(TimingProfile::Lan);
        assert_eq!(
            (lan.heartbeat_ms, lan.election_min_ms, lan.election_max_ms),
            (150, 1000, 2000)
        );
        let local = raft_timing(TimingProfile::Local);
        assert_eq!(
            (
                local.heartbeat_ms,
                local.election_min_ms,
                local.election_max_ms
            ),
            (100, 500, 1000)
        );
    }
}
