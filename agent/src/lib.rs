//! The `vigil` agent: parses its configuration, runs the server role in-process, and serves the
//! Consul-compatible HTTP API. `start` returns a [`Handle`] that knows the bound addresses, so
//! tests start agents on port 0 through the same code path as `main`.

pub mod cli;
pub mod http;
pub mod run;
pub mod tls_cmd;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_server::{RaftTiming, Server, ServerConfig};

/// The only datacenter a Vigil cluster has.
pub const DATACENTER: &str = "dc1";

/// A validated agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    pub http_addr: SocketAddr,
    pub rpc_addr: SocketAddr,
    /// Smallest session TTL accepted; lowered only by tests.
    pub session_ttl_min: Duration,
}

/// A running agent.
pub struct Handle {
    pub http_addr: SocketAddr,
    pub rpc_addr: SocketAddr,
    pub server: Arc<Server>,
    /// Holds the RPC port reserved for the server-to-server transport.
    _rpc_socket: UdpSocket,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Handle {
    /// Waits for shutdown to be requested, then drains the HTTP server and stops raft.
    pub async fn wait(self) {
        self.shutdown.cancelled().await;
        self.tasks.close();
        self.tasks.wait().await;
        self.server.shutdown().await;
    }
}

/// Starts a dev agent: a single-server cluster in memory plus the HTTP API.
pub async fn start(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<Handle> {
    let rpc_socket = UdpSocket::bind(config.rpc_addr)
        .with_context(|| format!("binding the RPC address {}", config.rpc_addr))?;
    let rpc_addr = rpc_socket.local_addr()?;
    let listener = TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("binding the HTTP address {}", config.http_addr))?;
    let http_addr = listener.local_addr()?;

    let server = Server::start_dev(
        ServerConfig {
            node_id: 1,
            node_name: config.node_name.clone(),
            rpc_addr,
            session_ttl_min: config.session_ttl_min,
            raft: RaftTiming::local(),
        },
        shutdown.clone(),
    )
    .await?;

    let router = http::router(http::AppState {
        server: Arc::clone(&server),
        node_name: config.node_name.clone(),
        http_addr,
    });
    let tasks = TaskTracker::new();
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
        server,
        _rpc_socket: rpc_socket,
        shutdown,
        tasks,
    })
}
