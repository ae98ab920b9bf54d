//! The `vigil` agent: parses its configuration, runs the server role in-process when asked, and
//! serves the Consul-compatible HTTP API. `start` returns a [`Handle`] that knows the bound
//! addresses, so tests start agents on port 0 through the same code path as `main`.

pub mod backend;
pub mod cli;
pub mod cmd;
pub mod http;
pub mod run;
pub mod sync;
pub mod tls_cmd;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_server::tls::TlsMaterial;
use vigil_server::transport::{self, RpcClient};
use vigil_server::{RaftTiming, Server, ServerConfig, ServerMode};

use backend::{Backend, RemoteServers};
use sync::NodeSync;

/// The only datacenter a Vigil cluster has.
pub const DATACENTER: &str = "dc1";

/// What this agent runs.
#[derive(Debug, Clone)]
pub enum AgentMode {
    /// One server, everything in memory, throwaway certificates.
    Dev,
    /// A server of a 1, 3 or 5 server set.
    Server {
        data_dir: PathBuf,
        bootstrap_expect: usize,
        join: Vec<SocketAddr>,
    },
    /// A client agent forwarding to the servers at these RPC addresses.
    Client { servers: Vec<SocketAddr> },
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
    pub http_addr: SocketAddr,
    pub rpc_addr: SocketAddr,
    pub mode: AgentMode,
    pub tls: TlsSource,
    /// Smallest session TTL accepted; lowered only by tests.
    pub session_ttl_min: Duration,
}

/// A running agent.
pub struct Handle {
    pub http_addr: SocketAddr,
    pub rpc_addr: SocketAddr,
    pub backend: Arc<Backend>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Handle {
    /// Waits for shutdown to be requested, then drains the HTTP server and stops the server role.
    pub async fn wait(self) {
        self.shutdown.cancelled().await;
        self.tasks.close();
        self.tasks.wait().await;
        if let Backend::Local(server) = &*self.backend {
            server.shutdown().await;
        }
    }
}

/// Starts an agent: the server role (dev or cluster) or a client, plus the HTTP API.
pub async fn start(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<Handle> {
    let tls = match &config.tls {
        TlsSource::Throwaway => TlsMaterial::dev()?,
        TlsSource::Files { ca, cert, key } => TlsMaterial::load(ca, cert, key)
            .with_context(|| "loading the TLS files (--ca-file, --cert-file, --key-file)")?,
    };
    let listener = TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("binding the HTTP address {}", config.http_addr))?;
    let http_addr = listener.local_addr()?;

    let (backend, rpc_addr) = match &config.mode {
        AgentMode::Client { servers } => {
            let endpoint = transport::client_endpoint(&tls)?;
            let rpc = RpcClient::new(endpoint, tls.server_name());
            (
                Backend::Remote(RemoteServers::new(rpc, servers.clone())),
                config.rpc_addr,
            )
        }
        AgentMode::Dev | AgentMode::Server { .. } => {
            let socket = UdpSocket::bind(config.rpc_addr)
                .with_context(|| format!("binding the RPC address {}", config.rpc_addr))?;
            let rpc_addr = socket.local_addr()?;
            let mode = match &config.mode {
                AgentMode::Server {
                    data_dir,
                    bootstrap_expect,
                    join,
                } => ServerMode::Cluster {
                    data_dir: data_dir.clone(),
                    bootstrap_expect: *bootstrap_expect,
                    join: join.clone(),
                },
                _ => ServerMode::Dev,
            };
            let server = Server::start(
                ServerConfig {
                    node_name: config.node_name.clone(),
                    rpc_addr,
                    raft: RaftTiming::local(),
                    mode,
                    members: None,
                },
                &tls,
                socket,
                shutdown.clone(),
            )
            .await?;
            (Backend::Local(server), rpc_addr)
        }
    };
    let backend = Arc::new(backend);

    let tasks = TaskTracker::new();
    let node_sync = NodeSync {
        backend: Arc::clone(&backend),
        node: config.node_name.clone(),
        address: rpc_addr.ip().to_string(),
    };
    if matches!(config.mode, AgentMode::Dev) {
        // A dev agent is ready only once sessions can be created on it.
        node_sync.sync_once().await?;
    }
    tasks.spawn(node_sync.run(shutdown.clone()));

    let router = http::router(http::AppState {
        backend: Arc::clone(&backend),
        node_name: config.node_name.clone(),
        http_addr,
        rpc_addr,
        session_ttl_min: config.session_ttl_min,
    });
    let token = shutdown.clone();
    tasks.spawn(async move {
        let serve = axum::serve(listener, router)
            .with_graceful_shutdown(async move { token.cancelled().await });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok(Handle {
        http_addr,
        rpc_addr,
        backend,
        shutdown,
        tasks,
    })
}
