//! A running server: raft, the state machine, leader duties and the QUIC RPC endpoint behind one
//! handle. It answers writes, (blocking) reads and renewals locally when it leads (or for stale
//! reads), and forwards them to the leader otherwise. The agent's HTTP API calls it directly
//! when the agent runs the server role; other agents reach it over RPC.

mod acquire;
mod authorize;
#[cfg(test)]
mod cluster_tests;
mod data_dir;
mod evidence;
mod formation;
mod forward;
mod requests;
mod rpc_service;
mod status;
#[cfg(test)]
mod tests;

pub(crate) use forward::Hop;
pub use requests::{confirm_lease, leads, read_lease, read_local};
pub use status::RaftStats;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use openraft::{ChangeMembers, ServerState};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::lock::LockOp;
use vigil_shared::rpc::calls::{
    self, Call, HelloInfo, PeerInfo, RpcRequest, RpcResponse, ServerNode, StatusInfo, reply,
};
use vigil_shared::rpc::{
    Consistency, Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::{Session, check_ttl};

use crate::dial::{self, Prepared};
use crate::leader::{DutyInput, LeaderDuties, Renewal, session_ttl};
use crate::proposer::Proposer;
use crate::raft::log_store::LogStore;
use crate::raft::network::QuicNetwork;
use crate::raft::state_store::{SharedState, StateStore};
use crate::raft::{NodeId, Raft};
use crate::state::Interest;
use data_dir::{data_dir_error, load_or_create_node_id};
use rpc_service::{PeerService, RpcService};
use vigil_wire::tls::{ALPN_RAFT, ALPN_RPC, PeerIdentity, Role, TlsMaterial};
use vigil_wire::transport::{self, CallKind, RpcClient, TransportError};

/// Raft timing; `lan()` for real deployments, `local()` for one machine.
#[derive(Debug, Clone, Copy)]
pub struct RaftTiming {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
}

impl RaftTiming {
    pub fn lan() -> RaftTiming {
        RaftTiming {
            heartbeat_ms: 150,
            election_min_ms: 1000,
            election_max_ms: 2000,
        }
    }

    pub fn local() -> RaftTiming {
        RaftTiming {
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 1000,
        }
    }
}

/// How the server keeps its state and finds its peers.
#[derive(Debug, Clone)]
pub enum ServerMode {
    /// One server, log in memory (`vigil agent --dev`).
    Dev,
    /// A member of a 1, 3 or 5 server set with a durable log in `data_dir`; the other servers
    /// are found through the gossip member list (`ServerConfig::members`).
    Cluster {
        data_dir: PathBuf,
        bootstrap_expect: usize,
    },
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub node_name: String,
    /// The RPC address other servers and agents use; `/v1/status/leader` reports it.
    pub rpc_addr: SocketAddr,
    pub raft: RaftTiming,
    pub mode: ServerMode,
    /// The gossip member list the leader reconciles into the catalog (`None`: no gossip).
    pub members: Option<watch::Receiver<Vec<MemberStatus>>>,
    /// Smallest session TTL this server accepts (Consul's `session_ttl_min`, a server setting:
    /// checked where sessions are created, whichever agent the request came through).
    pub session_ttl_min: Duration,
    /// Smallest lock-delay a new session gets: the leader raises a lower request to it (an
    /// operator's floor for clients that waive lock-delay; zero keeps Consul's behaviour).
    pub lock_delay_min: Duration,
    /// Blocking queries this server holds at once at most (its own and forwarded ones);
    /// beyond it a blocking query is refused with [`ServerError::TooManyBlockingQueries`].
    pub max_blocking_queries: usize,
    /// The part of [`max_blocking_queries`](Self::max_blocking_queries) only lock waits may
    /// take: a native lock's grant wait or holder monitor, or a blocking read of a KV key a
    /// session holds (a Consul-style lock's waiters and holder). Other blocking queries are
    /// refused once they hold the rest, so a flood of them cannot starve the lock waiters.
    pub lock_wait_reserve: usize,
    /// `Some` with ACLs enabled, holding the initial management token's secret if one is
    /// configured (Consul's `acl.tokens.initial_management`): the leader creates it.
    pub acls: Option<Option<String>>,
    /// With ACLs enabled, what a token may do where no rule says (Consul's
    /// `acl.default_policy`): the client agents' requests are authorized with it.
    pub acl_default_policy: Option<vigil_shared::acl::authz::DefaultPolicy>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid raft configuration: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("raft failed to start: {0}")]
    Raft(String),
    #[error("data directory: {0}")]
    DataDir(String),
    #[error("RPC endpoint: {0}")]
    Transport(String),
    #[error("the server did not become leader within {0:?}")]
    NotReady(Duration),
}

/// The raft configuration of every server (and of the simulated ones) with `timing`.
pub fn raft_config(timing: RaftTiming) -> Result<openraft::Config, openraft::ConfigError> {
    openraft::Config {
        cluster_name: "vigil".to_owned(),
        heartbeat_interval: timing.heartbeat_ms,
        election_timeout_min: timing.election_min_ms,
        election_timeout_max: timing.election_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
        max_in_snapshot_log_to_keep: 1000,
        // Replication reads what the log has accepted as soon as it is accepted, so the
        // leader's sync and the followers' run side by side. Otherwise openraft tells
        // replication only on its next loop, which for a lone write is the leader's own
        // flush notification: the two syncs in series again.
        broadcast_submitted_on_append: Some(true),
        // A server that cannot win (back from a pause, restarted, or removed meanwhile)
        // does not raise its term, which would make the leader step down when it
        // comes back (see `RaftPeer::pre_vote`).
        enable_pre_vote: Some(true),
        // A leader that restarts within its term must win an election again rather than
        // resume: its state machine lives in memory and its log syncs the committed index
        // only with the next append, so it restarts knowing an older commit than the one it
        // acknowledged, and would serve reads from before writes it had acknowledged
        // (openraft's documented hazard; the simulation found it: seed 5 of vigil-sim).
        enable_leader_restore: Some(false),
        ..Default::default()
    }
    .validate()
}

/// How long a dev server may take to elect itself.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Snapshot after this many log entries, keeping a tail for slow followers.
const SNAPSHOT_EVERY: u64 = 10_000;

pub struct Server {
    node_id: NodeId,
    raft: Raft,
    proposer: Proposer,
    shared: Arc<SharedState>,
    config: ServerConfig,
    duties: mpsc::UnboundedSender<DutyInput>,
    rpc: RpcClient,
    /// Dials the other servers with raft's protocol (the raft network's own client).
    peers: RpcClient,
    /// When this server last heard from a leader (AppendEntries), for `X-Consul-LastContact`
    /// and to tell when it is stranded outside the cluster.
    last_leader_contact: Mutex<Option<Instant>>,
    /// The leader this follower found dead, in its term (see [`evidence`]).
    dead_leader: Mutex<Option<evidence::DeadLeader>>,
    /// When this server started: before any leader contact, how long it has gone without.
    started: Instant,
    /// One permit per blocking query held, lock waits' reserve aside
    /// ([`ServerConfig::max_blocking_queries`]).
    blocking: tokio::sync::Semaphore,
    /// The permits only lock waits take ([`ServerConfig::lock_wait_reserve`]).
    lock_waits: tokio::sync::Semaphore,
    /// The KV acquires being decided on this leader, by key (see [`acquire`]).
    acquires: crate::turns::KeyTurns,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Server {
    /// Starts the server role on an already-bound RPC socket. A dev server returns once it leads;
    /// a cluster server returns once it serves RPC, and forms or joins its cluster in the
    /// background.
    pub async fn start(
        config: ServerConfig,
        tls: &TlsMaterial,
        rpc_socket: std::net::UdpSocket,
        shutdown: CancellationToken,
    ) -> Result<Arc<Server>, StartError> {
        let raft_config = Arc::new(raft_config(config.raft)?);
        let endpoint = transport::server_endpoint_from_socket(rpc_socket, tls)
            .map_err(|e| StartError::Transport(e.to_string()))?;
        let rpc = RpcClient::new(endpoint.clone(), tls.server_name());
        let raft_dialing = tls
            .raft_client_config()
            .map_err(|e| StartError::Transport(e.to_string()))?;
        let peers = RpcClient::with_config(endpoint.clone(), tls.server_name(), raft_dialing);
        let network = QuicNetwork { rpc: peers.clone() };
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let shared = SharedState::new(events_tx);
        let (node_id, raft) = match &config.mode {
            ServerMode::Dev => {
                let log = LogStore::temporary().map_err(data_dir_error)?;
                let raft = Raft::new(
                    1,
                    raft_config,
                    network,
                    log,
                    StateStore::new(Arc::clone(&shared)),
                )
                .await;
                (1, raft)
            }
            ServerMode::Cluster { data_dir, .. } => {
                let node_id = load_or_create_node_id(data_dir)?;
                let log = LogStore::open(data_dir).map_err(data_dir_error)?;
                let state = StateStore::open(Arc::clone(&shared), data_dir)
                    .map_err(data_dir_error)?
                    .stopping_with(shutdown.clone());
                let raft = Raft::new(node_id, raft_config, network, log, state).await;
                (node_id, raft)
            }
        };
        let raft = raft.map_err(|e| StartError::Raft(e.to_string()))?;

        let tasks = TaskTracker::new();
        let (duties_tx, duties_rx) = mpsc::unbounded_channel();
        let proposer = Proposer::new(raft.clone());
        tasks.spawn(
            LeaderDuties {
                proposer: proposer.clone(),
                shared: Arc::clone(&shared),
                events: events_rx,
                inputs: duties_rx,
                members: config
                    .members
                    .clone()
                    .map(|m| (m, config.node_name.clone())),
                acls: config.acls.clone(),
                shutdown: shutdown.clone(),
                tasks: tasks.clone(),
            }
            .run(),
        );

        let reserve = config.lock_wait_reserve.min(config.max_blocking_queries);
        let blocking = tokio::sync::Semaphore::new(config.max_blocking_queries - reserve);
        let lock_waits = tokio::sync::Semaphore::new(reserve);
        let server = Arc::new(Server {
            node_id,
            raft,
            proposer,
            shared,
            config,
            duties: duties_tx,
            rpc,
            peers,
            last_leader_contact: Mutex::new(None),
            dead_leader: Mutex::new(None),
            started: Instant::now(),
            blocking,
            lock_waits,
            acquires: crate::turns::KeyTurns::default(),
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
        });
        transport::serve(
            endpoint,
            tls.server_name(),
            vec![
                transport::Protocol {
                    alpn: ALPN_RPC,
                    servers_only: false,
                    limits: transport::RequestLimits::RPC,
                    handler: Arc::new(RpcService(Arc::clone(&server))),
                },
                transport::Protocol {
                    alpn: ALPN_RAFT,
                    servers_only: true,
                    limits: transport::RequestLimits::RAFT,
                    handler: Arc::new(PeerService(Arc::clone(&server))),
                },
            ],
            shutdown,
            tasks,
        );

        match server.config.mode.clone() {
            ServerMode::Dev => {
                let members = BTreeMap::from([(server.node_id, server.self_node())]);
                if let Err(e) = server.raft.initialize(members).await {
                    tracing::debug!(error = %e, "raft already initialized");
                }
                server
                    .raft
                    .wait(Some(READY_TIMEOUT))
                    .state(ServerState::Leader, "dev server leads")
                    .await
                    .map_err(|_| StartError::NotReady(READY_TIMEOUT))?;
            }
            ServerMode::Cluster {
                bootstrap_expect, ..
            } => {
                let s = Arc::clone(&server);
                server
                    .tasks
                    .spawn(async move { s.stay_in_cluster(bootstrap_expect).await });
                let s = Arc::clone(&server);
                server.tasks.spawn(crate::operator::cleanup_dead_servers(s));
                let s = Arc::clone(&server);
                server.tasks.spawn(s.campaign_on_evidence());
            }
        }
        Ok(server)
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub(crate) fn raft(&self) -> &Raft {
        &self.raft
    }

    pub(crate) fn shared(&self) -> &SharedState {
        &self.shared
    }

    pub(crate) fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub(crate) fn node_id(&self) -> NodeId {
        self.node_id
    }

    pub(crate) fn peers(&self) -> &RpcClient {
        &self.peers
    }

    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// True once shutdown has been requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Leading, with raft running (see [`leads`]).
    pub(crate) fn is_leader(&self) -> bool {
        leads(&self.raft)
    }

    /// Resolves when raft on this server has stopped for good on a fatal error (a failed log
    /// write, e.g. a full disk), with what happened; never while it runs or after a shutdown.
    ///
    /// It waits on the server metrics, which change with the role, not with every entry, and
    /// whose sender goes away only when raft's core stops, after it has recorded why.
    pub async fn failed(&self) -> String {
        let mut server = self.raft.server_metrics();
        while server.changed().await.is_ok() {}
        match &self.raft.metrics().borrow_watched().running_state {
            Err(fatal) if !matches!(fatal, openraft::error::Fatal::Stopped) => fatal.to_string(),
            _ => std::future::pending().await,
        }
    }

    /// The leader's RPC address, if a leader is known (never once raft has stopped).
    pub fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        m.running_state.as_ref().ok()?;
        let leader = m.current_leader?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.rpc_addr.clone())
    }

    /// Stops raft, the RPC endpoint and the leader duties, and waits for them.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}
