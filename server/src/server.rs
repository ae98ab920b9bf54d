//! A running server: raft, the state machine, leader duties and the QUIC RPC endpoint behind one
//! handle. It answers writes, (blocking) reads and renewals locally when it leads (or for stale
//! reads), and forwards them to the leader otherwise. The agent's HTTP API calls it directly
//! when the agent runs the server role; other agents reach it over RPC.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::{ChangeMembers, ServerState};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::rpc::{
    Consistency, Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::{Session, check_ttl};

use crate::leader::{DutyInput, LeaderDuties, session_ttl};
use crate::proposer::Proposer;
use crate::raft::network::QuicNetwork;
use crate::raft::redb_log::RedbLogStore;
use crate::raft::state_store::{SharedState, StateStore};
use crate::raft::{NodeId, Raft};
use crate::rpc::{
    HelloInfo, PeerInfo, RpcRequest, RpcResponse, ServerNode, StatusInfo, unexpected,
};
use crate::state::Interest;
use crate::tls::{PeerIdentity, Role, TlsMaterial};
use crate::transport::{self, CallKind, RpcClient, TransportError};

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
    /// Blocking queries this server holds at once at most (its own and forwarded ones);
    /// beyond it a blocking query is refused with [`ServerError::TooManyBlockingQueries`].
    pub max_blocking_queries: usize,
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

/// How long a dev server may take to elect itself.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Snapshot after this many log entries, keeping a tail for slow followers.
const SNAPSHOT_EVERY: u64 = 10_000;
/// Time allowed for a forwarded request beyond its own blocking wait.
const FORWARD_SLACK: Duration = Duration::from_secs(30);
/// How long a joining server has, as a learner, to receive the log before it would become a
/// voter; one that cannot be reached (or is too slow) is removed again instead. Shorter than
/// the joiner's own call timeout, so it hears the outcome.
const JOIN_CATCH_UP: Duration = Duration::from_secs(20);
/// The first pause after a refused join; it doubles up to [`JOIN_BACKOFF_MAX`].
const JOIN_BACKOFF_MIN: Duration = Duration::from_millis(300);
const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(10);

pub struct Server {
    node_id: NodeId,
    raft: Raft,
    proposer: Proposer,
    shared: Arc<SharedState>,
    config: ServerConfig,
    duties: mpsc::UnboundedSender<DutyInput>,
    rpc: RpcClient,
    /// When this server last heard from a leader (AppendEntries), for `X-Consul-LastContact`.
    last_leader_contact: Mutex<Option<Instant>>,
    /// One permit per blocking query held ([`ServerConfig::max_blocking_queries`]).
    blocking: tokio::sync::Semaphore,
    /// The raft term in which this server, leading, last passed a read barrier; default reads
    /// are answered without another only in that term.
    confirmed_term: AtomicU64,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

fn data_dir_error(e: impl std::fmt::Display) -> StartError {
    StartError::DataDir(e.to_string())
}

/// Creates the data directory if needed and makes it private (0700): it holds every key's
/// value, as Consul's does.
fn private_data_dir(dir: &std::path::Path) -> Result<(), StartError> {
    std::fs::create_dir_all(dir).map_err(data_dir_error)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(data_dir_error)?;
    }
    Ok(())
}

/// This server's raft ID: random on first start, then read back from the data directory.
fn load_or_create_node_id(dir: &std::path::Path) -> Result<NodeId, StartError> {
    private_data_dir(dir)?;
    let path = dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|e| data_dir_error(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id: NodeId = rand::random::<u64>() >> 1;
            let tmp = dir.join("node-id.tmp");
            std::fs::write(&tmp, id.to_string()).map_err(data_dir_error)?;
            std::fs::rename(&tmp, &path).map_err(data_dir_error)?;
            Ok(id)
        }
        Err(e) => Err(data_dir_error(e)),
    }
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
        let raft_config = Arc::new(
            openraft::Config {
                cluster_name: "vigil".to_owned(),
                heartbeat_interval: config.raft.heartbeat_ms,
                election_timeout_min: config.raft.election_min_ms,
                election_timeout_max: config.raft.election_max_ms,
                snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
                max_in_snapshot_log_to_keep: 1000,
                ..Default::default()
            }
            .validate()?,
        );
        let endpoint = transport::server_endpoint_from_socket(rpc_socket, tls)
            .map_err(|e| StartError::Transport(e.to_string()))?;
        let rpc = RpcClient::new(endpoint.clone(), tls.server_name());
        let network = QuicNetwork { rpc: rpc.clone() };
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let shared = SharedState::new(events_tx);
        let (node_id, raft) = match &config.mode {
            ServerMode::Dev => {
                let log = RedbLogStore::in_memory().map_err(data_dir_error)?;
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
                let log = RedbLogStore::open(data_dir.join(crate::raft::redb_log::LOG_FILE_NAME))
                    .map_err(data_dir_error)?;
                let state =
                    StateStore::open(Arc::clone(&shared), data_dir).map_err(data_dir_error)?;
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
                shutdown: shutdown.clone(),
                tasks: tasks.clone(),
            }
            .run(),
        );

        let blocking = tokio::sync::Semaphore::new(config.max_blocking_queries);
        let server = Arc::new(Server {
            node_id,
            raft,
            proposer,
            shared,
            config,
            duties: duties_tx,
            rpc,
            last_leader_contact: Mutex::new(None),
            blocking,
            confirmed_term: AtomicU64::new(0),
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
        });
        transport::serve(
            endpoint,
            tls.server_name(),
            Arc::new(RpcService(Arc::clone(&server))),
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
                    .spawn(async move { s.form_cluster(bootstrap_expect).await });
            }
        }
        Ok(server)
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    fn self_node(&self) -> ServerNode {
        ServerNode {
            name: self.config.node_name.clone(),
            rpc_addr: self.config.rpc_addr.to_string(),
        }
    }

    fn is_initialized(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .voter_ids()
            .next()
            .is_some()
    }

    /// RPC addresses of the other servers gossip reports alive.
    fn gossip_servers(&self) -> Vec<SocketAddr> {
        let me = self.config.rpc_addr;
        self.config.members.as_ref().map_or_else(Vec::new, |m| {
            m.borrow()
                .iter()
                .filter(|m| m.role == MemberRole::Server && m.state == MemberState::Alive)
                .map(|m| m.rpc_addr)
                .filter(|a| *a != me)
                .collect()
        })
    }

    /// Forms a new cluster with `bootstrap_expect` servers found through gossip, or joins the
    /// existing one they belong to. A server that already has raft state never bootstraps again.
    async fn form_cluster(self: Arc<Self>, bootstrap_expect: usize) {
        let mut pause = JOIN_BACKOFF_MIN;
        loop {
            if self.is_initialized() {
                tracing::info!("raft cluster membership known");
                return;
            }
            let join = self.gossip_servers();
            let mut known: BTreeMap<NodeId, ServerNode> =
                BTreeMap::from([(self.node_id, self.self_node())]);
            let mut existing: Option<SocketAddr> = None;
            for addr in &join {
                let hello = self
                    .rpc
                    .call_typed::<RpcRequest, RpcResponse>(
                        *addr,
                        &RpcRequest::Hello,
                        Duration::from_secs(2),
                    )
                    .await;
                match hello {
                    Ok(RpcResponse::Hello(info)) if info.initialized => existing = Some(*addr),
                    Ok(RpcResponse::Hello(info)) => {
                        known.insert(info.node_id, info.node);
                    }
                    Ok(other) => tracing::warn!(%addr, ?other, "unexpected hello answer"),
                    Err(e) => tracing::debug!(%addr, error = %e, "server not reachable yet"),
                }
            }
            if let Some(addr) = existing {
                let join = RpcRequest::Join {
                    node_id: self.node_id,
                    node: self.self_node(),
                    forwarded: false,
                };
                match self
                    .rpc
                    .call_typed::<RpcRequest, RpcResponse>(addr, &join, Duration::from_secs(30))
                    .await
                {
                    Ok(RpcResponse::Join(Ok(()))) => tracing::info!(%addr, "joined the cluster"),
                    other => {
                        // A refused joiner backs off instead of asking again every 300 ms.
                        tracing::info!(%addr, ?other, retry_in = ?pause, "join not accepted yet");
                        tokio::select! {
                            _ = self.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(JOIN_BACKOFF_MAX);
                        continue;
                    }
                }
            } else if known.len() >= bootstrap_expect && known.keys().next() == Some(&self.node_id)
            {
                tracing::info!(servers = known.len(), "bootstrapping the raft cluster");
                if let Err(e) = self.raft.initialize(known).await {
                    tracing::warn!(error = %e, "bootstrap failed");
                }
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(JOIN_BACKOFF_MIN) => {}
            }
        }
    }

    /// True once shutdown has been requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Leading, with raft running: a server whose raft stopped (a storage failure) keeps the
    /// last state in its metrics, and must not claim anything from it.
    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.running_state.is_ok() && m.state == ServerState::Leader
    }

    /// Resolves when raft on this server has stopped for good on a fatal error (a failed log
    /// write, e.g. a full disk), with what happened; never while it runs or after a shutdown.
    pub async fn failed(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state
                && !matches!(fatal, openraft::error::Fatal::Stopped)
            {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The leader's RPC address, if a leader is known (never once raft has stopped).
    pub fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.running_state.as_ref().ok()?;
        let leader = m.current_leader?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.rpc_addr.clone())
    }

    fn leader_socket(&self) -> Result<SocketAddr, ServerError> {
        self.leader_addr()
            .and_then(|a| a.parse().ok())
            .ok_or(ServerError::NoLeader)
    }

    /// Sends a request to the leader on behalf of a caller.
    async fn forward(
        &self,
        request: RpcRequest,
        wait: Duration,
    ) -> Result<RpcResponse, ServerError> {
        let mut metrics = self.raft.metrics();
        let leader_id = metrics.borrow_and_update().current_leader;
        let leader = self.leader_socket()?;
        let is_write = matches!(request, RpcRequest::Write { .. });
        let kind = if wait.is_zero() {
            CallKind::Prompt
        } else {
            CallKind::Blocking
        };
        let call = self.rpc.call_typed_as::<RpcRequest, RpcResponse>(
            kind,
            leader,
            &request,
            wait + FORWARD_SLACK,
        );
        // QUIC notices a killed leader only after its idle timeout; raft notices within an
        // election timeout. Stop waiting as soon as raft names another leader or none.
        let leader_lost = async {
            while metrics.borrow_and_update().current_leader == leader_id {
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            result = call => result.map_err(|e| match e {
                // Never delivered: the caller may safely retry.
                TransportError::Unreachable { .. } => ServerError::NoLeader,
                TransportError::Busy { .. } => ServerError::TooManyBlockingQueries,
                other => ServerError::Raft(format!("forwarding to the leader {leader}: {other}")),
            }),
            // A write may have been applied before the leader went; only reads and renewals
            // are safe to retry.
            // A forwarded read (possibly blocking for minutes) must not hold up shutdown.
            () = self.shutdown.cancelled(), if !is_write => Err(ServerError::ShuttingDown),
            () = leader_lost => Err(if is_write {
                ServerError::Raft(format!(
                    "lost the leader {leader} while forwarding a write; it may or may not have been applied"
                ))
            } else {
                ServerError::NoLeader
            }),
        }
    }

    /// Commits a state change, forwarding to the leader from a follower.
    pub async fn write(&self, op: Op) -> Result<Response, ServerError> {
        self.write_inner(op, false).await
    }

    async fn write_inner(&self, op: Op, forwarded: bool) -> Result<Response, ServerError> {
        if self.is_leader() || forwarded {
            if let Op::CreateSession(session) = &op {
                check_ttl(&session.ttl, self.config.session_ttl_min)
                    .map_err(ServerError::InvalidSessionTtl)?;
            }
            return self.proposer.propose(op).await;
        }
        match self
            .forward(
                RpcRequest::Write {
                    op,
                    forwarded: true,
                },
                Duration::ZERO,
            )
            .await?
        {
            RpcResponse::Write(result) => result,
            other => Err(unexpected(other)),
        }
    }

    fn meta(&self, index: u64) -> QueryMeta {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let last_contact_ms = if m.state == ServerState::Leader {
            0
        } else {
            self.last_leader_contact
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .map_or(0, |t| t.elapsed().as_millis() as u64)
        };
        QueryMeta {
            index: index.max(1),
            known_leader: m.current_leader.is_some(),
            last_contact_ms,
        }
    }

    /// Answers a read in the requested consistency mode, blocking while the result's index is
    /// not above `opts.min_index` (up to `opts.wait_ms`). Default and consistent reads are
    /// answered by the leader; stale ones by whichever server is asked.
    pub async fn query(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        self.query_inner(opts, query, false).await
    }

    async fn query_inner(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
        forwarded: bool,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        let local = opts.consistency == Consistency::Stale || self.is_leader();
        if !local && forwarded {
            // The leader that forwarded this lost its place meanwhile: answering from this
            // server's own state could go back in time. The caller retries on the new leader.
            return Err(ServerError::NoLeader);
        }
        if !local {
            // Only a query with an index blocks.
            let wait = if opts.min_index == 0 {
                Duration::ZERO
            } else {
                Duration::from_millis(opts.wait_ms)
            };
            let request = RpcRequest::Query {
                opts,
                query,
                forwarded: true,
            };
            return match self.forward(request, wait).await? {
                RpcResponse::Query(result) => result,
                other => Err(unexpected(other)),
            };
        }
        match opts.consistency {
            Consistency::Stale => {}
            Consistency::Default => self.confirmed_leader().await?,
            Consistency::Consistent => {
                self.raft
                    .ensure_linearizable()
                    .await
                    .map_err(|_| ServerError::NoLeader)?;
            }
        }
        let _permit = if opts.min_index > 0 && Interest::of(&query) != Interest::None {
            Some(
                self.blocking
                    .try_acquire()
                    .map_err(|_| ServerError::TooManyBlockingQueries)?,
            )
        } else {
            None
        };
        Ok(self.local_query(opts, query).await)
    }

    /// Checks that this server leads and, once per term, that it really does (a read-index
    /// barrier: a quorum confirms the term, and everything committed before is applied). A new
    /// leader's state may miss entries the previous leader committed and acknowledged, and a
    /// server restarted as the leader of a term already over may still be replaying its log:
    /// answering a default read from either could go back in time.
    async fn confirmed_leader(&self) -> Result<(), ServerError> {
        if !self.is_leader() {
            return Err(ServerError::NoLeader);
        }
        let term = self.raft.metrics().borrow().current_term;
        if self.confirmed_term.load(Ordering::Acquire) == term {
            return Ok(());
        }
        self.raft
            .ensure_linearizable()
            .await
            .map_err(|_| ServerError::NoLeader)?;
        self.confirmed_term.fetch_max(term, Ordering::AcqRel);
        Ok(())
    }

    /// Blocking queries this server holds now (its own and forwarded ones).
    pub fn blocking_queries(&self) -> usize {
        self.config.max_blocking_queries - self.blocking.available_permits()
    }

    async fn local_query(&self, opts: QueryOptions, query: ReadQuery) -> (QueryResult, QueryMeta) {
        let interest = Interest::of(&query);
        if opts.min_index == 0 || interest == Interest::None {
            let (result, index) = self.shared.read().query(&query);
            return (result, self.meta(index));
        }
        let deadline = Instant::now() + Duration::from_millis(opts.wait_ms);
        let mut min_index = opts.min_index;
        let mut was_missing = false;
        loop {
            let mut guard = self.shared.watches.register(interest.clone());
            let (result, index) = self.shared.read().query(&query);
            let missing = is_missing(&query, &result);
            // Consul: a result still missing after it was missing blocks on, rather than waking
            // for unrelated index movement.
            if missing && was_missing {
                min_index = min_index.max(index);
            }
            if index > min_index || Instant::now() >= deadline {
                return (result, self.meta(index));
            }
            was_missing = missing;
            tokio::select! {
                _ = guard.fired() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.shutdown.cancelled() => {
                    let (result, index) = self.shared.read().query(&query);
                    return (result, self.meta(index));
                }
            }
        }
    }

    /// Renews a session: resets its TTL timer on the leader. No raft write.
    pub async fn renew_session(&self, id: &str) -> Result<Session, ServerError> {
        self.renew_inner(id.to_owned(), false).await
    }

    async fn renew_inner(&self, id: String, forwarded: bool) -> Result<Session, ServerError> {
        if !self.is_leader() {
            if forwarded {
                return Err(ServerError::NoLeader);
            }
            return match self
                .forward(
                    RpcRequest::Renew {
                        id,
                        forwarded: true,
                    },
                    Duration::ZERO,
                )
                .await?
            {
                RpcResponse::Renew(result) => result,
                other => Err(unexpected(other)),
            };
        }
        let session = self
            .shared
            .read()
            .sessions()
            .get(&id)
            .cloned()
            .ok_or_else(|| ServerError::SessionNotFound(id.clone()))?;
        if let Some(ttl) = session_ttl(&session.ttl) {
            self.duties
                .send(DutyInput::Renew {
                    id: session.id.clone(),
                    ttl,
                })
                .map_err(|_| ServerError::ShuttingDown)?;
        }
        Ok(session)
    }

    /// Adds a server to the cluster: as a learner, then as a voter once it has the log
    /// (leader only; followers forward).
    async fn join(
        &self,
        node_id: NodeId,
        node: ServerNode,
        forwarded: bool,
    ) -> Result<(), ServerError> {
        if !self.is_leader() {
            if forwarded {
                return Err(ServerError::NoLeader);
            }
            let request = RpcRequest::Join {
                node_id,
                node,
                forwarded: true,
            };
            return match self.forward(request, Duration::ZERO).await? {
                RpcResponse::Join(result) => result,
                other => Err(unexpected(other)),
            };
        }
        let is_voter = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .voter_ids()
                .any(|id| id == node_id)
        };
        if is_voter {
            return Ok(());
        }
        // A learner first: it receives the log but does not count for any quorum, so an
        // unreachable or bogus address can never cost the cluster its majority.
        tracing::info!(node_id, %node, "adding server to the cluster as a learner");
        let added = self
            .raft
            .add_learner(node_id, node.clone(), false)
            .await
            .map_err(|e| ServerError::Raft(e.to_string()))?;
        let needed = added.log_id.index;
        let caught_up = self
            .raft
            .wait(Some(JOIN_CATCH_UP))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&node_id))
                        .and_then(|matched| matched.as_ref())
                        .is_some_and(|matched| matched.index >= needed)
                },
                "joining server caught up",
            )
            .await;
        if caught_up.is_err() {
            tracing::warn!(node_id, %node, "joining server did not catch up; removing it");
            if let Err(e) = self
                .raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node_id])), false)
                .await
            {
                tracing::warn!(node_id, error = %e, "removing the learner");
            }
            return Err(ServerError::Raft(format!(
                "server {node} did not receive the log within {JOIN_CATCH_UP:?}; not added"
            )));
        }
        tracing::info!(node_id, %node, "promoting caught-up server to voter");
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node_id])), false)
            .await
            .map_err(|e| ServerError::Raft(e.to_string()))?;
        Ok(())
    }

    /// Leader, raft members and the membership's index.
    pub fn status(&self) -> StatusInfo {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let peers = membership
            .nodes()
            .map(|(id, node)| PeerInfo {
                node_id: *id,
                node: node.clone(),
                leader: m.running_state.is_ok() && m.current_leader == Some(*id),
                voter: voters.contains(id),
            })
            .collect();
        let leader = m
            .current_leader
            .filter(|_| m.running_state.is_ok())
            .and_then(|l| membership.get_node(&l))
            .map(|n| n.rpc_addr.clone());
        StatusInfo {
            leader,
            peers,
            config_index: m.membership_config.log_id().map_or(0, |l| l.index),
        }
    }

    /// Raft figures for `/v1/agent/self`.
    pub fn raft_stats(&self) -> RaftStats {
        let m = self.raft.metrics().borrow().clone();
        RaftStats {
            state: format!("{:?}", m.state),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            num_peers: m
                .membership_config
                .membership()
                .voter_ids()
                .count()
                .saturating_sub(1),
        }
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

    async fn handle(&self, peer: &PeerIdentity, request: RpcRequest) -> RpcResponse {
        if let Some(why) = refusal(peer, &request) {
            return RpcResponse::Refused(why);
        }
        match request {
            RpcRequest::Hello => RpcResponse::Hello(HelloInfo {
                node_id: self.node_id,
                node: self.self_node(),
                initialized: self.is_initialized(),
                leader: self.leader_addr(),
            }),
            RpcRequest::AppendEntries(req) => {
                *self
                    .last_leader_contact
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                RpcResponse::AppendEntries(self.raft.append_entries(req).await)
            }
            RpcRequest::Vote(req) => RpcResponse::Vote(self.raft.vote(req).await),
            RpcRequest::InstallSnapshot(req) => {
                RpcResponse::InstallSnapshot(self.raft.install_snapshot(req).await)
            }
            RpcRequest::Write { op, forwarded } => {
                RpcResponse::Write(self.write_inner(op, forwarded).await)
            }
            RpcRequest::Query {
                opts,
                query,
                forwarded,
            } => RpcResponse::Query(self.query_inner(opts, query, forwarded).await),
            RpcRequest::Renew { id, forwarded } => {
                RpcResponse::Renew(self.renew_inner(id, forwarded).await)
            }
            RpcRequest::Join {
                node_id,
                node,
                forwarded,
            } => RpcResponse::Join(self.join(node_id, node, forwarded).await),
            RpcRequest::Status => RpcResponse::Status(self.status()),
        }
    }
}

/// The RPC endpoint's view of the server.
struct RpcService(Arc<Server>);

impl transport::RpcHandler for RpcService {
    fn handle(
        &self,
        peer: &PeerIdentity,
        request: Vec<u8>,
    ) -> futures::future::BoxFuture<'static, Vec<u8>> {
        let server = Arc::clone(&self.0);
        let peer = peer.clone();
        Box::pin(async move {
            let response = match postcard::from_bytes::<RpcRequest>(&request) {
                Ok(request) => server.handle(&peer, request).await,
                Err(e) => RpcResponse::Refused(format!("undecodable request: {e}")),
            };
            postcard::to_allocvec(&response).unwrap_or_else(|e| {
                tracing::error!(error = %e, "encoding an RPC response");
                Vec::new()
            })
        })
    }
}

/// Why `peer` may not make `request`, if it may not. Raft messages, joins, forwarding and
/// leader-internal writes are for servers only; a server certificate issued for a node may
/// join only as that node.
fn refusal(peer: &PeerIdentity, request: &RpcRequest) -> Option<String> {
    if peer.role == Role::Server {
        return match (request, &peer.node) {
            (
                RpcRequest::Join {
                    node,
                    forwarded: false,
                    ..
                },
                Some(certified),
            ) if *certified != node.name => Some(format!(
                "the certificate is for server {certified:?}; it cannot join as {:?}",
                node.name
            )),
            _ => None,
        };
    }
    match request {
        RpcRequest::AppendEntries(_)
        | RpcRequest::Vote(_)
        | RpcRequest::InstallSnapshot(_)
        | RpcRequest::Join { .. } => Some("raft requests need a server certificate".to_owned()),
        RpcRequest::Write {
            forwarded: true, ..
        }
        | RpcRequest::Query {
            forwarded: true, ..
        }
        | RpcRequest::Renew {
            forwarded: true, ..
        } => Some("only servers forward requests".to_owned()),
        RpcRequest::Write {
            op: Op::ReapTombstones { .. } | Op::CheckpointTtls { .. },
            ..
        } => Some("leader-internal operations need a server certificate".to_owned()),
        _ => None,
    }
}

/// Figures from raft's metrics, reported as strings the way Consul does.
#[derive(Debug, Clone)]
pub struct RaftStats {
    pub state: String,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub num_peers: usize,
}

fn is_missing(query: &ReadQuery, result: &QueryResult) -> bool {
    match (query, result) {
        (ReadQuery::KvGet { .. }, QueryResult::Entries(e)) => e.is_empty(),
        (ReadQuery::SessionInfo { .. }, QueryResult::Sessions(s)) => s.is_empty(),
        _ => false,
    }
}
