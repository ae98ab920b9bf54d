//! A running server: raft, the state machine and leader duties behind one handle that answers
//! writes, (blocking) reads and session renewals. The agent's HTTP API calls it directly when
//! the agent runs the server role.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ServerState};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_shared::rpc::{
    Consistency, Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::Session;

use crate::leader::{DutyInput, LeaderDuties, SelfNode, session_ttl};
use crate::proposer::Proposer;
use crate::raft::log_store::MemLogStore;
use crate::raft::network::SoloNetwork;
use crate::raft::state_store::{SharedState, StateStore};
use crate::raft::{NodeId, Raft};
use crate::state::Interest;

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
            heartbeat_ms: 50,
            election_min_ms: 300,
            election_max_ms: 600,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub node_id: NodeId,
    pub node_name: String,
    /// The RPC address other servers and agents use; `/v1/status/leader` reports it.
    pub rpc_addr: SocketAddr,
    /// Smallest session TTL accepted (Consul's `session_ttl_min`, 10 s by default).
    pub session_ttl_min: Duration,
    pub raft: RaftTiming,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid raft configuration: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("raft failed to start: {0}")]
    Raft(String),
    #[error("the server did not become ready within {0:?}")]
    NotReady(Duration),
}

/// How long start-up may take before it is reported as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Snapshot after this many log entries, keeping a tail for slow followers.
const SNAPSHOT_EVERY: u64 = 10_000;

pub struct Server {
    raft: Raft,
    proposer: Proposer,
    shared: Arc<SharedState>,
    config: ServerConfig,
    duties: mpsc::UnboundedSender<DutyInput>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Server {
    /// Starts a single-server cluster with an in-memory log (`vigil agent --dev`) and returns
    /// once it leads and has registered its own node.
    pub async fn start_dev(
        config: ServerConfig,
        shutdown: CancellationToken,
    ) -> Result<Arc<Server>, StartError> {
        let raft_config = openraft::Config {
            cluster_name: "vigil".to_owned(),
            heartbeat_interval: config.raft.heartbeat_ms,
            election_timeout_min: config.raft.election_min_ms,
            election_timeout_max: config.raft.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
            max_in_snapshot_log_to_keep: 1000,
            ..Default::default()
        }
        .validate()?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let shared = SharedState::new(events_tx);
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            SoloNetwork,
            MemLogStore::default(),
            StateStore::new(Arc::clone(&shared)),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let members =
            BTreeMap::from([(config.node_id, BasicNode::new(config.rpc_addr.to_string()))]);
        if let Err(e) = raft.initialize(members).await {
            tracing::debug!(error = %e, "raft already initialized");
        }

        let tasks = TaskTracker::new();
        let (duties_tx, duties_rx) = mpsc::unbounded_channel();
        let proposer = Proposer::new(raft.clone());
        let duties = LeaderDuties {
            proposer: proposer.clone(),
            shared: Arc::clone(&shared),
            self_node: SelfNode {
                name: config.node_name.clone(),
                address: config.rpc_addr.ip().to_string(),
            },
            events: events_rx,
            inputs: duties_rx,
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
        };
        tasks.spawn(duties.run());

        let server = Arc::new(Server {
            raft,
            proposer,
            shared,
            config,
            duties: duties_tx,
            shutdown,
            tasks,
        });
        server.wait_ready().await?;
        Ok(server)
    }

    /// Waits until this node is registered in the catalog with its `serfHealth` check, so a
    /// default session can be created as soon as start-up returns.
    async fn wait_ready(&self) -> Result<(), StartError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut applied = self.shared.applied_receiver();
        loop {
            let ready = {
                let state = self.shared.read();
                state
                    .catalog()
                    .check(&self.config.node_name, vigil_shared::catalog::SERF_HEALTH)
                    .is_some()
            };
            if ready {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return Err(StartError::NotReady(READY_TIMEOUT)),
                changed = applied.changed() => {
                    if changed.is_err() {
                        return Err(StartError::NotReady(READY_TIMEOUT));
                    }
                }
            }
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Commits a state change.
    pub async fn write(&self, op: Op) -> Result<Response, ServerError> {
        self.proposer.propose(op).await
    }

    fn meta(&self, index: u64) -> QueryMeta {
        let metrics = self.raft.metrics().borrow().clone();
        QueryMeta {
            index: index.max(1),
            known_leader: metrics.current_leader.is_some(),
            last_contact_ms: 0,
        }
    }

    fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    fn leader_error(&self) -> ServerError {
        match self.leader_addr() {
            Some(leader) => ServerError::NotLeader {
                leader: Some(leader),
            },
            None => ServerError::NoLeader,
        }
    }

    /// Answers a read in the requested consistency mode, blocking while the result's index is
    /// not above `opts.min_index` (up to `opts.wait_ms`).
    pub async fn query(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> Result<(QueryResult, QueryMeta), ServerError> {
        match opts.consistency {
            Consistency::Stale => {}
            Consistency::Default => {
                if !self.is_leader() {
                    return Err(self.leader_error());
                }
            }
            Consistency::Consistent => {
                self.raft
                    .ensure_linearizable()
                    .await
                    .map_err(|_| self.leader_error())?;
            }
        }
        let interest = Interest::of(&query);
        if opts.min_index == 0 || interest == Interest::None {
            let (result, index) = self.shared.read().query(&query);
            return Ok((result, self.meta(index)));
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
                return Ok((result, self.meta(index)));
            }
            was_missing = missing;
            tokio::select! {
                _ = guard.fired() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.shutdown.cancelled() => {
                    let (result, index) = self.shared.read().query(&query);
                    return Ok((result, self.meta(index)));
                }
            }
        }
    }

    /// Renews a session: resets its TTL timer on the leader. No raft write.
    pub async fn renew_session(&self, id: &str) -> Result<Session, ServerError> {
        if !self.is_leader() {
            return Err(self.leader_error());
        }
        let session = self
            .shared
            .read()
            .sessions()
            .get(id)
            .cloned()
            .ok_or_else(|| ServerError::SessionNotFound(id.to_owned()))?;
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

    /// The leader's RPC address, if a leader is known.
    pub fn leader_addr(&self) -> Option<String> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
    }

    /// RPC addresses of the raft voters.
    pub fn peers(&self) -> Vec<String> {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| n.addr.clone()))
            .collect()
    }

    /// Raft figures for `/v1/agent/self`.
    pub fn raft_stats(&self) -> RaftStats {
        let m = self.raft.metrics().borrow().clone();
        RaftStats {
            state: format!("{:?}", m.state),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            num_peers: self.peers().len().saturating_sub(1),
        }
    }

    /// Number of blocked readers (for metrics and leak checks).
    pub fn waiters(&self) -> usize {
        self.shared.watches.len()
    }

    /// Stops raft and the leader duties and waits for them.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Figures from raft's metrics, stringly reported as Consul does.
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
