//! Leader duties, run only while this server leads: session TTL timers (TTL × 2, reset on renew
//! without a raft write, re-armed at full length when leadership is gained) and reaping old
//! tombstones and spent lock-delays.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use openraft::ServerState;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::time::{DelayQueue, delay_queue};
use vigil_shared::SESSION_TTL_MULTIPLIER;
use vigil_shared::catalog::MemberStatus;
use vigil_shared::duration::parse_go_duration;
use vigil_shared::rpc::Op;

use crate::proposer::Proposer;
use crate::raft::state_store::{SessionEvent, SharedState};
use crate::reconcile;

/// Tombstones older than this are reaped (Consul's `tombstone_ttl`).
const TOMBSTONE_TTL: Duration = Duration::from_secs(15 * 60);
/// How often the leader looks for tombstones to reap.
const REAP_INTERVAL: Duration = Duration::from_secs(30);
/// How often the leader re-reconciles the whole member list (Consul's `reconcile_interval`).
const RECONCILE_INTERVAL: Duration = Duration::from_secs(60);
/// Attempts to commit a TTL expiry before giving up (Consul's `maxInvalidateAttempts`).
const INVALIDATE_ATTEMPTS: u32 = 6;

/// Requests to the leader duties from request handlers.
#[derive(Debug)]
pub enum DutyInput {
    /// Restart a session's TTL timer at full length.
    Renew { id: String, ttl: Duration },
}

/// One TTL timer per session, armed only on the leader.
#[derive(Default)]
struct SessionTimers {
    queue: DelayQueue<String>,
    keys: HashMap<String, delay_queue::Key>,
}

impl SessionTimers {
    fn arm(&mut self, id: &str, ttl: Duration) {
        let deadline = ttl * SESSION_TTL_MULTIPLIER;
        match self.keys.get(id) {
            Some(key) => self.queue.reset(key, deadline),
            None => {
                let key = self.queue.insert(id.to_owned(), deadline);
                self.keys.insert(id.to_owned(), key);
            }
        }
    }

    fn clear(&mut self, id: &str) {
        if let Some(key) = self.keys.remove(id) {
            self.queue.remove(&key);
        }
    }

    fn clear_all(&mut self) {
        self.queue.clear();
        self.keys.clear();
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    async fn next_expired(&mut self) -> Option<String> {
        let expired = self.queue.next().await?.into_inner();
        self.keys.remove(&expired);
        Some(expired)
    }
}

/// Parses a stored TTL; `None` for sessions without one.
pub fn session_ttl(ttl: &str) -> Option<Duration> {
    if ttl.is_empty() {
        return None;
    }
    parse_go_duration(ttl).ok().filter(|d| !d.is_zero())
}

pub struct LeaderDuties {
    pub proposer: Proposer,
    pub shared: Arc<SharedState>,
    pub events: mpsc::UnboundedReceiver<SessionEvent>,
    pub inputs: mpsc::UnboundedReceiver<DutyInput>,
    /// The gossip member list to reconcile into the catalog, and this server's node name.
    pub members: Option<(watch::Receiver<Vec<MemberStatus>>, String)>,
    pub shutdown: CancellationToken,
    pub tasks: TaskTracker,
}

impl LeaderDuties {
    /// Runs until shutdown; owns the TTL timers.
    pub async fn run(mut self) {
        let mut metrics = self.proposer.raft().metrics();
        let mut timers = SessionTimers::default();
        let mut leading: Option<CancellationToken> = None;
        let mut reap = tokio::time::interval(REAP_INTERVAL);
        reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                changed = metrics.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let is_leader = metrics.borrow_and_update().state == ServerState::Leader;
                    match (is_leader, &leading) {
                        (true, None) => {
                            let term = self.shutdown.child_token();
                            self.gain_leadership(&mut timers).await;
                            self.spawn_reconcile(term.clone());
                            leading = Some(term);
                        }
                        (false, Some(term)) => {
                            term.cancel();
                            leading = None;
                            timers.clear_all();
                            tracing::info!("lost leadership: session timers cleared");
                        }
                        _ => {}
                    }
                }
                Some(event) = self.events.recv() => {
                    if leading.is_none() {
                        continue;
                    }
                    match event {
                        SessionEvent::Created { id, ttl } => {
                            if let Some(ttl) = session_ttl(&ttl) {
                                timers.arm(&id, ttl);
                            }
                        }
                        SessionEvent::Destroyed { id } => timers.clear(&id),
                    }
                }
                Some(input) = self.inputs.recv() => {
                    let DutyInput::Renew { id, ttl } = input;
                    if leading.is_some() {
                        timers.arm(&id, ttl);
                    }
                }
                Some(expired) = timers.next_expired(), if !timers.is_empty() => {
                    tracing::info!(session = %expired, "session TTL expired");
                    self.spawn_invalidate(expired);
                }
                _ = reap.tick(), if leading.is_some() => self.spawn_reap(),
            }
        }
        if let Some(term) = leading {
            term.cancel();
        }
    }

    /// Re-arms every TTL session at full length. The barrier makes
    /// sure the state read is everything the previous leader committed.
    async fn gain_leadership(&mut self, timers: &mut SessionTimers) {
        if let Err(e) = self.proposer.raft().ensure_linearizable().await {
            tracing::warn!(error = %e, "leadership barrier failed");
            return;
        }
        timers.clear_all();
        let ttls: Vec<(String, Duration)> = {
            let state = self.shared.read();
            state
                .sessions()
                .list()
                .filter_map(|s| session_ttl(&s.ttl).map(|t| (s.id.clone(), t)))
                .collect()
        };
        for (id, ttl) in &ttls {
            timers.arm(id, *ttl);
        }
        tracing::info!(
            sessions = ttls.len(),
            "gained leadership: session timers armed"
        );
    }

    /// Keeps the catalog in line with gossip while this term lasts: at once, on every member
    /// change, and every [`RECONCILE_INTERVAL`] to repair drift.
    fn spawn_reconcile(&self, term: CancellationToken) {
        let Some((mut members, leader)) = self.members.clone() else {
            return;
        };
        let proposer = self.proposer.clone();
        let shared = Arc::clone(&self.shared);
        self.tasks.spawn(async move {
            let mut every = tokio::time::interval(RECONCILE_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let ops = {
                    let list = members.borrow_and_update().clone();
                    let state = shared.read();
                    reconcile::plan(&list, state.catalog(), &leader)
                };
                for op in ops {
                    if let Err(e) = proposer.propose(op).await {
                        tracing::warn!(error = %e, "member reconciliation write failed");
                        break;
                    }
                }
                tokio::select! {
                    biased;
                    _ = term.cancelled() => return,
                    changed = members.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    _ = every.tick() => {}
                }
            }
        });
    }

    fn spawn_invalidate(&self, id: String) {
        let proposer = self.proposer.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let mut backoff = Duration::from_secs(1);
            for attempt in 1..=INVALIDATE_ATTEMPTS {
                match proposer.propose(Op::DestroySession { id: id.clone() }).await {
                    Ok(_) => return,
                    Err(e) => tracing::warn!(session = %id, attempt, error = %e, "TTL invalidation failed"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff *= 2;
            }
            tracing::error!(session = %id, "giving up invalidating expired session");
        });
    }

    fn spawn_reap(&self) {
        let now = crate::proposer::wall_ms();
        let cutoff = now.saturating_sub(TOMBSTONE_TTL.as_millis() as u64);
        let due = self
            .shared
            .read()
            .kv()
            .oldest_tombstone_ms()
            .is_some_and(|oldest| oldest < cutoff);
        if !due {
            return;
        }
        let proposer = self.proposer.clone();
        self.tasks.spawn(async move {
            if let Err(e) = proposer
                .propose(Op::ReapTombstones { before_ms: cutoff })
                .await
            {
                tracing::warn!(error = %e, "tombstone reap failed");
            }
        });
    }
}
