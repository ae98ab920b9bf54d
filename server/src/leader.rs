//! Leader duties, run only while this server leads. Each leadership term is one unit under its
//! own cancellation token: first a barrier (retried until it passes or the term ends), so the
//! state read is everything earlier leaders committed; then every TTL session is armed; then the
//! term serves: TTL timers (TTL × 2, reset on renew without a raft write; a renewal is
//! refused, not acknowledged, once its session's expiry is on its way), TTL checkpoints,
//! member reconciliation, reaping old tombstones. Ending the term cancels all of it, including
//! pending invalidation retries, so nothing of an old term acts on a session renewed on a newer
//! leader. Cancelling a task does not take back an op it left in the proposer's queue, so every
//! op a term proposes is bound to its raft leader ID: raft refuses it in any later term, even
//! one this same server leads (the CI caught an expiry decided before a step-down committing
//! after the server led again and acknowledged a renewal).
//!
//! TTL checkpoints bound how long elections can keep a dead client's session alive: the leader
//! commits each session's deadline (its last renewal + TTL × 2, leader wall clock) whenever it
//! moved by more than half a TTL since the last checkpoint, batched once a second. A new
//! leader arms an inherited session for min(TTL × 2, checkpointed deadline + one election
//! timeout) and never re-checkpoints the slack, so however many elections follow, a session
//! not renewed dies at most one election timeout after its deadline. No session expires before
//! TTL since its last acknowledged renewal: a new leader keeps it at least until its checkpoint
//! plus an election timeout, so a renewal that moves its deadline beyond checkpoint + TTL +
//! election timeout (one after a long silence: a client renewing every half TTL moves it by
//! less between two checkpoints) is checkpointed before it is acknowledged.
//!
//! Native locks in their lock-delay with contenders waiting get a timer too: when it ends, the
//! leader commits `LockOp::Wake`, whose apply grants whoever is due. A new leader arms these
//! timers from the state once its barrier passes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver as _;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::time::{DelayQueue, delay_queue};
use vigil_shared::acl::{ANONYMOUS_TOKEN_ACCESSOR_ID, GLOBAL_MANAGEMENT_POLICY_ID, Link, Token};
use vigil_shared::catalog::MemberStatus;
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::lock::LockOp;
use vigil_shared::rpc::{AclOp, Op, Response};
use vigil_shared::{PROTOCOL, SESSION_TTL_MULTIPLIER};

use crate::proposer::{Proposer, wall_ms};
use crate::raft::state_store::{SessionEvent, SharedState};
use crate::telemetry::{self, InvalidationCause};
use crate::{protocol, reconcile};

/// Tombstones older than this are reaped (Consul's `tombstone_ttl`).
const TOMBSTONE_TTL: Duration = Duration::from_secs(15 * 60);
/// How often the leader looks for tombstones to reap.
const REAP_INTERVAL: Duration = Duration::from_secs(30);
/// How often the leader re-reconciles the whole member list (Consul's `reconcile_interval`).
const RECONCILE_INTERVAL: Duration = Duration::from_secs(60);
/// Attempts to commit a TTL expiry before giving up (Consul's `maxInvalidateAttempts`).
const INVALIDATE_ATTEMPTS: u32 = 6;
/// How often moved TTL deadlines are checkpointed.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// Sessions per checkpoint write at most; the rest go in the next one.
const CHECKPOINT_BATCH: usize = 2048;
/// The leadership barrier is retried after this, doubling up to [`BARRIER_RETRY_MAX`].
const BARRIER_RETRY_MIN: Duration = Duration::from_millis(50);
const BARRIER_RETRY_MAX: Duration = Duration::from_secs(1);
/// How often a leader looks again whether every server can apply this build's protocol.
const PROTOCOL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Requests to the leader duties from request handlers.
#[derive(Debug)]
pub enum DutyInput {
    /// Restart a session's TTL timer at full length, and say whether it was.
    Renew {
        id: String,
        ttl: Duration,
        renewed: oneshot::Sender<Renewal>,
    },
}

/// What became of a renewal the leader duties were asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Its timer restarted at full length.
    Renewed,
    /// Its TTL already expired and its destroy is on its way: a renewal now would be
    /// acknowledged for a session about to go.
    Expiring,
    /// This server no longer leads: the renewal reached no timer.
    NotLeading,
}

/// One TTL session as this term tracks it.
struct Tracked {
    key: delay_queue::Key,
    ttl: Duration,
    /// When it expires unless renewed: last renewal + TTL × 2 (leader wall clock, ms), or for
    /// an inherited session the checkpointed deadline.
    deadline_ms: u64,
    /// The deadline last committed in a checkpoint, if any.
    checkpointed_ms: Option<u64>,
}

/// One TTL timer per session, armed only on the leader, with the deadlines to checkpoint.
#[derive(Default)]
pub(crate) struct SessionTimers {
    queue: DelayQueue<String>,
    sessions: HashMap<String, Tracked>,
}

/// What a new leader arms for a session it inherits: TTL × 2 at most (what a renewal now
/// would give), and no more than one election timeout past the checkpointed deadline.
pub fn inherited_delay(
    ttl: Duration,
    checkpoint_ms: Option<u64>,
    now_ms: u64,
    election: Duration,
) -> Duration {
    let full = ttl * SESSION_TTL_MULTIPLIER;
    match checkpoint_ms {
        Some(deadline) => {
            full.min(Duration::from_millis(deadline.saturating_sub(now_ms)) + election)
        }
        None => full,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SessionTimers {
    /// Arms `id` to fire after `delay`, replacing any timer it had.
    pub(crate) fn arm(&mut self, id: &str, ttl: Duration, delay: Duration, deadline_ms: u64) {
        let checkpointed_ms = match self.sessions.remove(id) {
            Some(old) => {
                self.queue.remove(&old.key);
                old.checkpointed_ms
            }
            None => None,
        };
        let key = self.queue.insert(id.to_owned(), delay);
        self.sessions.insert(
            id.to_owned(),
            Tracked {
                key,
                ttl,
                deadline_ms,
                checkpointed_ms,
            },
        );
    }

    /// Created or renewed now: TTL × 2 from now.
    pub(crate) fn renew(&mut self, id: &str, ttl: Duration, now_ms: u64) {
        let full = ttl * SESSION_TTL_MULTIPLIER;
        self.arm(id, ttl, full, now_ms.saturating_add(millis(full)));
    }

    /// Taken over from an earlier term, with its last checkpointed deadline if any.
    fn inherit(
        &mut self,
        id: &str,
        ttl: Duration,
        checkpoint_ms: Option<u64>,
        now_ms: u64,
        election: Duration,
    ) {
        let delay = inherited_delay(ttl, checkpoint_ms, now_ms, election);
        let deadline_ms = checkpoint_ms.unwrap_or(now_ms.saturating_add(millis(delay)));
        self.arm(id, ttl, delay, deadline_ms);
        if let Some(tracked) = self.sessions.get_mut(id) {
            tracked.checkpointed_ms = checkpoint_ms;
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.sessions.contains_key(id)
    }

    pub(crate) fn clear(&mut self, id: &str) {
        if let Some(tracked) = self.sessions.remove(id) {
            self.queue.remove(&tracked.key);
        }
    }

    fn clear_all(&mut self) {
        self.queue.clear();
        self.sessions.clear();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Deadlines never checkpointed, or moved by more than half a TTL since; at most `max`.
    fn due_checkpoints(&self, max: usize) -> Vec<(String, u64)> {
        self.sessions
            .iter()
            .filter(|(_, t)| {
                t.checkpointed_ms
                    .is_none_or(|c| t.deadline_ms > c.saturating_add(millis(t.ttl / 2)))
            })
            .take(max)
            .map(|(id, t)| (id.clone(), t.deadline_ms))
            .collect()
    }

    /// `id`'s deadline, if it lies beyond its last checkpoint plus TTL plus `election`: a new
    /// leader would keep the session only until that checkpoint plus `election`, less than a
    /// TTL after the renewal that set it. (Never checkpointed, a new leader gives it TTL × 2.)
    fn outruns_checkpoint(&self, id: &str, election: Duration) -> Option<u64> {
        let t = self.sessions.get(id)?;
        let keeps = t.checkpointed_ms? + millis(t.ttl) + millis(election);
        (t.deadline_ms > keeps).then_some(t.deadline_ms)
    }

    /// Records a committed checkpoint (sessions renewed since keep their newer deadline).
    fn checkpointed(&mut self, done: &[(String, u64)]) {
        for (id, deadline_ms) in done {
            if let Some(tracked) = self.sessions.get_mut(id) {
                tracked.checkpointed_ms = Some(*deadline_ms);
            }
        }
    }

    pub(crate) async fn next_expired(&mut self) -> Option<String> {
        let expired = self.queue.next().await?.into_inner();
        self.sessions.remove(&expired);
        Some(expired)
    }
}

/// One timer per native lock whose lock-delay holds up waiters, armed only on the leader.
#[derive(Default)]
pub(crate) struct LockDelayTimers {
    queue: DelayQueue<String>,
    locks: HashMap<String, delay_queue::Key>,
}

impl LockDelayTimers {
    /// Wakes `name` at `until_ms` (leader wall clock); a later deadline replaces an earlier one.
    pub(crate) fn arm(&mut self, name: &str, until_ms: u64, now_ms: u64) {
        let delay = Duration::from_millis(until_ms.saturating_sub(now_ms));
        match self.locks.get(name) {
            Some(key) => self.queue.reset(key, delay),
            None => {
                let key = self.queue.insert(name.to_owned(), delay);
                self.locks.insert(name.to_owned(), key);
            }
        }
    }

    fn clear_all(&mut self) {
        self.queue.clear();
        self.locks.clear();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    pub(crate) async fn next_due(&mut self) -> Option<String> {
        let due = self.queue.next().await?.into_inner();
        self.locks.remove(&due);
        Some(due)
    }
}

/// Parses a stored TTL; `None` for sessions without one.
pub fn session_ttl(ttl: &str) -> Option<Duration> {
    if ttl.is_empty() {
        return None;
    }
    parse_go_duration(ttl).ok().filter(|d| !d.is_zero())
}

/// The leadership term in progress on this server.
struct Term {
    /// Counts terms on this server, to tell a late message of an old term from the current.
    number: u64,
    /// The raft leader ID (term and node) this server leads under: leadership lost and won
    /// again between two looks at the metrics (which may merge changes) shows as a new one,
    /// so as a new term.
    leader_id: openraft::type_config::alias::LeaderIdOf<crate::raft::TypeConfig>,
    scope: TermScope,
    /// The barrier passed and the sessions are armed.
    serving: bool,
    /// A checkpoint write is in flight (at most one at a time).
    checkpointing: bool,
}

/// What a term's tasks share: the token that ends them with the term, and a proposer whose
/// ops commit only under the term's leader ID (see [`Proposer::bound_to`]).
#[derive(Clone)]
struct TermScope {
    token: CancellationToken,
    proposer: Proposer,
}

/// What tasks of a term report back to the duties loop.
enum TermEvent {
    BarrierPassed {
        term: u64,
    },
    Checkpointed {
        term: u64,
        done: Option<Vec<(String, u64)>>,
    },
    /// The checkpoint of one renewal, made before it was acknowledged, committed (or not).
    RenewalCheckpointed {
        term: u64,
        done: Option<Vec<(String, u64)>>,
    },
    /// A TTL invalidation gave up ([`INVALIDATE_ATTEMPTS`]).
    InvalidationAbandoned {
        term: u64,
        id: String,
    },
}

pub struct LeaderDuties {
    pub proposer: Proposer,
    pub shared: Arc<SharedState>,
    pub events: mpsc::UnboundedReceiver<SessionEvent>,
    pub inputs: mpsc::UnboundedReceiver<DutyInput>,
    /// The gossip member list to reconcile into the catalog, and this server's node name.
    pub members: Option<(watch::Receiver<Vec<MemberStatus>>, String)>,
    /// With ACLs enabled: the initial management token's secret, if one is configured.
    pub acls: Option<Option<String>>,
    pub shutdown: CancellationToken,
    pub tasks: TaskTracker,
}

impl LeaderDuties {
    /// Runs until shutdown; owns the TTL timers.
    pub async fn run(mut self) {
        // The server metrics change with the role, not with every entry: this loop wakes on a
        // change of leadership only.
        let mut metrics = self.proposer.raft().server_metrics();
        let mut timers = SessionTimers::default();
        let mut lock_delays = LockDelayTimers::default();
        // Sessions whose TTL expired and whose destroy this term proposed: their invalidation
        // is counted as a TTL expiry, not a destroy.
        let mut expiring: HashSet<String> = HashSet::new();
        let mut term: Option<Term> = None;
        let mut terms = 0u64;
        let (term_tx, mut term_rx) = mpsc::unbounded_channel();
        let mut reap = tokio::time::interval(REAP_INTERVAL);
        reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut checkpoint = tokio::time::interval(CHECKPOINT_EVERY);
        checkpoint.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let serving = |term: &Option<Term>| term.as_ref().is_some_and(|t| t.serving);
        let election = Duration::from_millis(self.proposer.raft().config().election_timeout_max);
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                changed = metrics.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let (is_leader, leader_id) = {
                        let m = metrics.borrow_and_update();
                        (m.state == ServerState::Leader, *m.vote.leader_id())
                    };
                    // Not leading any more, or leading under another leader ID (lost and won
                    // again between two looks): the term this loop holds is over.
                    if let Some(t) = term.take_if(|t| !is_leader || t.leader_id != leader_id) {
                        t.scope.token.cancel();
                        timers.clear_all();
                        lock_delays.clear_all();
                        expiring.clear();
                        tracing::info!("lost leadership: session timers cleared");
                    }
                    if is_leader && term.is_none() {
                        terms += 1;
                        let token = self.shutdown.child_token();
                        self.spawn_barrier(terms, token.clone(), term_tx.clone());
                        // The adv leader ID is its own committed form.
                        let proposer = self.proposer.bound_to(leader_id);
                        term = Some(Term {
                            number: terms,
                            leader_id,
                            scope: TermScope { token, proposer },
                            serving: false,
                            checkpointing: false,
                        });
                        telemetry::became_leader();
                        tracing::info!("gained leadership: waiting for the barrier");
                    }
                }
                Some(event) = term_rx.recv() => match (event, &mut term) {
                    (TermEvent::BarrierPassed { term: n }, Some(t)) if t.number == n => {
                        t.serving = true;
                        self.arm_inherited(&mut timers);
                        let now = wall_ms();
                        for (name, until_ms) in self.shared.read().locks().pending_delays() {
                            lock_delays.arm(name, until_ms, now);
                        }
                        self.spawn_reconcile(t.scope.clone());
                        self.spawn_acl_init(t.scope.clone());
                        self.spawn_protocol_upgrade(t.scope.clone());
                    }
                    (TermEvent::Checkpointed { term: n, done }, Some(t)) if t.number == n => {
                        t.checkpointing = false;
                        if let Some(done) = done {
                            timers.checkpointed(&done);
                        }
                    }
                    (TermEvent::RenewalCheckpointed { term: n, done: Some(done) }, Some(t)) if t.number == n => {
                        timers.checkpointed(&done);
                    }
                    (TermEvent::InvalidationAbandoned { term: n, id }, Some(t)) if t.number == n => {
                        // Still there: it takes renewals again, and without them its timer
                        // tries once more after a full TTL × 2.
                        expiring.remove(&id);
                        let ttl = self.shared.read().sessions().get(&id).and_then(|s| session_ttl(&s.ttl));
                        if let Some(ttl) = ttl {
                            timers.renew(&id, ttl, wall_ms());
                        }
                    }
                    _ => {}
                },
                Some(event) = self.events.recv() => {
                    if term.is_none() {
                        continue;
                    }
                    match event {
                        SessionEvent::Created { id, ttl } => {
                            if let Some(ttl) = session_ttl(&ttl) {
                                timers.renew(&id, ttl, wall_ms());
                            }
                        }
                        SessionEvent::LockDelay { name, until_ms } => {
                            lock_delays.arm(&name, until_ms, wall_ms());
                        }
                        SessionEvent::Destroyed { id, cause } => {
                            timers.clear(&id);
                            let cause = if expiring.remove(&id) { InvalidationCause::Ttl } else { cause };
                            telemetry::session_invalidated(cause);
                        }
                    }
                }
                Some(input) = self.inputs.recv() => {
                    let DutyInput::Renew { id, ttl, renewed } = input;
                    // A destroy applied since the request read the session clears `expiring`
                    // before this runs (events first): the state says it is gone.
                    let outcome = match &term {
                        None => Renewal::NotLeading,
                        Some(_) if expiring.contains(&id) || self.shared.read().sessions().get(&id).is_none() => {
                            Renewal::Expiring
                        }
                        Some(t) => {
                            if !timers.contains(&id) {
                                // Not armed yet this term (its barrier has not passed): what
                                // an earlier term checkpointed still bounds what a successor
                                // would give it, so the checkpoint rule below needs it.
                                let checkpoint = self.shared.read().ttl_deadline(&id);
                                timers.inherit(&id, ttl, checkpoint, wall_ms(), election);
                            }
                            timers.renew(&id, ttl, wall_ms());
                            if let Some(deadline) = timers.outruns_checkpoint(&id, election) {
                                let report = term_tx.clone();
                                self.spawn_renewal_checkpoint(t.number, (id, deadline), t.scope.clone(), report, renewed);
                                continue;
                            }
                            Renewal::Renewed
                        }
                    };
                    let _ = renewed.send(outcome);
                }
                Some(expired) = timers.next_expired(), if !timers.is_empty() => {
                    tracing::info!(session = %expired, "session TTL expired");
                    if let Some(t) = &term {
                        expiring.insert(expired.clone());
                        self.spawn_invalidate(expired, t.number, t.scope.clone(), term_tx.clone());
                    }
                }
                Some(name) = lock_delays.next_due(), if !lock_delays.is_empty() => {
                    if let Some(t) = &term {
                        self.spawn_wake(name, t.scope.clone());
                    }
                }
                _ = checkpoint.tick(), if serving(&term) => {
                    if let Some(t) = term.as_mut().filter(|t| !t.checkpointing) {
                        let due = timers.due_checkpoints(CHECKPOINT_BATCH);
                        if !due.is_empty() {
                            t.checkpointing = true;
                            self.spawn_checkpoint(t.number, due, t.scope.clone(), term_tx.clone());
                        }
                    }
                }
                _ = reap.tick(), if serving(&term) => {
                    if let Some(t) = &term {
                        self.spawn_reap(t.scope.clone());
                    }
                }
            }
        }
        if let Some(t) = term {
            t.scope.token.cancel();
        }
    }

    /// Runs the leadership barrier until it passes (then tells the loop) or the term ends: a
    /// term never serves on a state that may miss what earlier leaders committed.
    fn spawn_barrier(
        &self,
        number: u64,
        token: CancellationToken,
        done: mpsc::UnboundedSender<TermEvent>,
    ) {
        let raft = self.proposer.raft().clone();
        self.tasks.spawn(async move {
            let mut pause = BARRIER_RETRY_MIN;
            loop {
                tokio::select! {
                    biased;
                    _ = token.cancelled() => return,
                    result = raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex) => match result {
                        Ok(_) => {
                            let _ = done.send(TermEvent::BarrierPassed { term: number });
                            return;
                        }
                        Err(e) => tracing::warn!(error = %e, retry_in = ?pause, "leadership barrier failed"),
                    },
                }
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(BARRIER_RETRY_MAX);
            }
        });
    }

    /// Arms every TTL session not armed yet this term (created or renewed since it began are
    /// armed already), from its checkpoint when there is one.
    fn arm_inherited(&self, timers: &mut SessionTimers) {
        let election = Duration::from_millis(self.proposer.raft().config().election_timeout_max);
        let now = wall_ms();
        let inherited: Vec<(String, Duration, Option<u64>)> = {
            let state = self.shared.read();
            state
                .sessions()
                .list()
                .filter(|s| !timers.contains(&s.id))
                .filter_map(|s| {
                    session_ttl(&s.ttl).map(|ttl| (s.id.clone(), ttl, state.ttl_deadline(&s.id)))
                })
                .collect()
        };
        for (id, ttl, checkpoint) in &inherited {
            timers.inherit(id, *ttl, *checkpoint, now, election);
        }
        tracing::info!(
            sessions = inherited.len(),
            "gained leadership: session timers armed"
        );
    }

    /// Commits a batch of TTL deadlines and reports the outcome to the loop.
    fn spawn_checkpoint(
        &self,
        number: u64,
        deadlines: Vec<(String, u64)>,
        TermScope { token, proposer }: TermScope,
        report: mpsc::UnboundedSender<TermEvent>,
    ) {
        self.tasks.spawn(async move {
            let op = Op::CheckpointTtls {
                deadlines: deadlines.clone(),
            };
            let done = tokio::select! {
                _ = token.cancelled() => return,
                result = proposer.propose(op) => match result {
                    Ok(_) => Some(deadlines),
                    Err(e) => {
                        tracing::warn!(error = %e, "TTL checkpoint failed");
                        None
                    }
                },
            };
            let _ = report.send(TermEvent::Checkpointed { term: number, done });
        });
    }

    /// Commits the checkpoint of one renewal, then acknowledges it (`renewed`); a renewal whose
    /// checkpoint did not commit reached no leader that could keep it: the caller retries. A
    /// session invalidated before its checkpoint applied (the checkpoint then changes nothing)
    /// is answered as gone.
    fn spawn_renewal_checkpoint(
        &self,
        number: u64,
        deadline: (String, u64),
        TermScope { token, proposer }: TermScope,
        report: mpsc::UnboundedSender<TermEvent>,
        renewed: oneshot::Sender<Renewal>,
    ) {
        let shared = Arc::clone(&self.shared);
        self.tasks.spawn(async move {
            let id = deadline.0.clone();
            let deadlines = vec![deadline];
            let op = Op::CheckpointTtls {
                deadlines: deadlines.clone(),
            };
            let done = tokio::select! {
                _ = token.cancelled() => None,
                result = proposer.propose(op) => result.ok().map(|_| deadlines),
            };
            let outcome = match &done {
                Some(_) if shared.read().sessions().get(&id).is_none() => Renewal::Expiring,
                Some(_) => Renewal::Renewed,
                None => Renewal::NotLeading,
            };
            let _ = report.send(TermEvent::RenewalCheckpointed { term: number, done });
            let _ = renewed.send(outcome);
        });
    }

    /// Raises the cluster's protocol level to this build's once every server in the raft
    /// configuration advertises it (without gossip, once this server is the only one), checking
    /// on every member change and every [`PROTOCOL_CHECK_INTERVAL`] while this term lasts.
    fn spawn_protocol_upgrade(&self, scope: TermScope) {
        let TermScope {
            token: term,
            proposer,
        } = scope;
        let shared = Arc::clone(&self.shared);
        let mut members = self.members.clone().map(|(members, _)| members);
        self.tasks.spawn(async move {
            let mut every = tokio::time::interval(PROTOCOL_CHECK_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while shared.read().protocol() < PROTOCOL {
                let ready = {
                    let metrics = proposer.raft().metrics();
                    let metrics = metrics.borrow_watched();
                    let servers = metrics.membership_config.membership().nodes();
                    match &mut members {
                        Some(members) => protocol::every_server_at(
                            PROTOCOL,
                            servers.map(|(_, node)| node),
                            &members.borrow_and_update(),
                        ),
                        None => servers.count() == 1,
                    }
                };
                if ready {
                    match proposer.propose(Op::SetProtocol { level: PROTOCOL }).await {
                        Ok(_) => {
                            tracing::info!(level = PROTOCOL, "raised the protocol level");
                            continue;
                        }
                        Err(e) => tracing::warn!(error = %e, "raising the protocol level failed"),
                    }
                }
                let changed = async {
                    match &mut members {
                        Some(members) => {
                            if members.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    _ = term.cancelled() => return,
                    () = changed => {}
                    _ = every.tick() => {}
                }
            }
        });
    }

    /// Keeps the catalog in line with gossip while this term lasts: at once, on every member
    /// change, and every [`RECONCILE_INTERVAL`] to repair drift.
    fn spawn_reconcile(&self, scope: TermScope) {
        let Some((mut members, leader)) = self.members.clone() else {
            return;
        };
        let TermScope {
            token: term,
            proposer,
        } = scope;
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

    /// Commits a TTL expiry, retrying with backoff while this term lasts.
    fn spawn_invalidate(
        &self,
        id: String,
        number: u64,
        TermScope {
            token: term,
            proposer,
        }: TermScope,
        report: mpsc::UnboundedSender<TermEvent>,
    ) {
        let shared = Arc::clone(&self.shared);
        self.tasks.spawn(async move {
            let mut backoff = Duration::from_secs(1);
            for attempt in 1..=INVALIDATE_ATTEMPTS {
                // As the cluster's level takes it (a plain destroy below level 2).
                let level = shared.read().protocol();
                let expire = crate::protocol::downgrade(Op::ExpireSession { id: id.clone() }, level)
                    .map(|(op, _)| op);
                let result = match expire {
                    Ok(op) => tokio::select! {
                        _ = term.cancelled() => return,
                        result = proposer.propose(op) => result,
                    },
                    Err(e) => Err(e),
                };
                match result {
                    Ok(_) => return,
                    Err(e) => tracing::warn!(session = %id, attempt, error = %e, "TTL invalidation failed"),
                }
                tokio::select! {
                    _ = term.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff *= 2;
            }
            tracing::error!(session = %id, "giving up invalidating expired session");
            let _ = report.send(TermEvent::InvalidationAbandoned { term: number, id });
        });
    }

    /// Commits a wake-up of a lock whose lock-delay has ended, retrying until it commits or the
    /// term ends (a new leader re-arms the timer from the state).
    fn spawn_wake(&self, name: String, scope: TermScope) {
        let TermScope {
            token: term,
            proposer,
        } = scope;
        self.tasks.spawn(async move {
            let mut backoff = BARRIER_RETRY_MIN;
            loop {
                let wake = proposer.propose(Op::Lock(LockOp::Wake { name: name.clone() }));
                let result = tokio::select! {
                    _ = term.cancelled() => return,
                    result = wake => result,
                };
                match result {
                    Ok(_) => return,
                    Err(e) => tracing::warn!(lock = %name, error = %e, "waking a lock after its lock-delay failed"),
                }
                tokio::select! {
                    _ = term.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BARRIER_RETRY_MAX);
            }
        });
    }

    /// With ACLs enabled, writes the built-in policy, the anonymous token and the initial
    /// management token if the state lacks any of them, retrying until it commits or the term
    /// ends.
    fn spawn_acl_init(&self, scope: TermScope) {
        let Some(initial) = &self.acls else {
            return;
        };
        let needed = {
            let state = self.shared.read();
            let acl = state.acl();
            acl.policy(GLOBAL_MANAGEMENT_POLICY_ID, false).is_none()
                || acl.token(ANONYMOUS_TOKEN_ACCESSOR_ID).is_none()
                || initial.as_ref().is_some_and(|s| acl.resolve(s).is_none())
        };
        if !needed {
            return;
        }
        let op = Op::Acl(AclOp::Init {
            initial_management: initial.as_ref().map(|secret| Token {
                description: "Initial Management Token".to_owned(),
                policies: vec![Link {
                    id: GLOBAL_MANAGEMENT_POLICY_ID.to_owned(),
                    name: String::new(),
                }],
                create_time_ms: wall_ms(),
                ..Token::new(uuid::Uuid::new_v4().to_string(), secret.clone())
            }),
        });
        let TermScope {
            token: term,
            proposer,
        } = scope;
        self.tasks.spawn(async move {
            let mut pause = BARRIER_RETRY_MIN;
            loop {
                tokio::select! {
                    biased;
                    _ = term.cancelled() => return,
                    result = proposer.propose(op.clone()) => match result {
                        Ok(Response::Done) => {
                            tracing::info!("ACLs initialized");
                            return;
                        }
                        other => tracing::warn!(result = ?other, retry_in = ?pause, "ACL initialization failed"),
                    },
                }
                tokio::select! {
                    _ = term.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(BARRIER_RETRY_MAX);
            }
        });
    }

    fn spawn_reap(&self, scope: TermScope) {
        let now = wall_ms();
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
        let TermScope {
            token: term,
            proposer,
        } = scope;
        self.tasks.spawn(async move {
            tokio::select! {
                _ = term.cancelled() => {}
                result = proposer.propose(Op::ReapTombstones { before_ms: cutoff }) => {
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "tombstone reap failed");
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const ELECTION: Duration = Duration::from_secs(2);

    #[test]
    fn an_inherited_session_gets_what_is_left_plus_one_election_at_most_ttl_twice() {
        let now = 100_000;
        let cases = [
            // (checkpointed deadline, armed for)
            (None, TTL * 2),
            (Some(now + 30_000), TTL * 2),
            (Some(now + 5_000), Duration::from_secs(7)),
            (Some(now - 60_000), ELECTION),
        ];
        for (checkpoint, expected) in cases {
            assert_eq!(
                inherited_delay(TTL, checkpoint, now, ELECTION),
                expected,
                "{checkpoint:?}"
            );
        }
    }

    /// Wall clock of the simulated leaders: `base` plus paused tokio time elapsed.
    fn now_ms(base: u64, start: tokio::time::Instant) -> u64 {
        base + millis(start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn elections_never_extend_a_session_past_its_deadline_plus_one_election() {
        let base = 1_000_000;
        let start = tokio::time::Instant::now();
        // Term 1: the session is created (deadline = now + TTL × 2) and checkpointed.
        let mut timers = SessionTimers::default();
        timers.renew("s", TTL, now_ms(base, start));
        let due = timers.due_checkpoints(CHECKPOINT_BATCH);
        assert_eq!(due, vec![("s".to_owned(), base + 20_000)]);
        timers.checkpointed(&due);
        assert!(timers.due_checkpoints(CHECKPOINT_BATCH).is_empty());
        let mut checkpoint = due[0].1;

        // Three elections, 3 s apart: each new leader inherits the session from the last
        // checkpoint and never checkpoints the election slack it adds.
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(3)).await;
            timers = SessionTimers::default();
            timers.inherit("s", TTL, Some(checkpoint), now_ms(base, start), ELECTION);
            assert!(timers.due_checkpoints(CHECKPOINT_BATCH).is_empty());
            checkpoint = timers.sessions["s"].deadline_ms;
        }

        // It expires one election timeout after its deadline (22 s), not later.
        let expired = timers.next_expired().await;
        assert_eq!(expired.as_deref(), Some("s"));
        assert_eq!(start.elapsed(), TTL * 2 + ELECTION);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_renewal_after_a_long_silence_outruns_what_a_new_leader_would_keep() {
        let now = 1_000_000;
        let mut timers = SessionTimers::default();
        timers.renew("s", TTL, now);
        assert_eq!(
            timers.outruns_checkpoint("s", ELECTION),
            None,
            "never checkpointed"
        );
        let due = timers.due_checkpoints(CHECKPOINT_BATCH);
        timers.checkpointed(&due);
        // Renewed every half TTL: the deadline moves by half a TTL at a time.
        timers.renew("s", TTL, now + 5_000);
        assert_eq!(timers.outruns_checkpoint("s", ELECTION), None);
        // Silent for 13 s, then renewed: the deadline moved by 13 s > TTL + election.
        timers.renew("s", TTL, now + 13_000);
        assert_eq!(
            timers.outruns_checkpoint("s", ELECTION),
            Some(now + 13_000 + 20_000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_the_old_leader_did_not_checkpoint_still_gets_its_ttl() {
        let base = 5_000_000;
        let start = tokio::time::Instant::now();
        let mut timers = SessionTimers::default();
        timers.renew("s", TTL, now_ms(base, start));
        let due = timers.due_checkpoints(CHECKPOINT_BATCH);
        timers.checkpointed(&due);

        // Renewed 4 s later: under half a TTL moved, so no checkpoint is due yet.
        tokio::time::advance(Duration::from_secs(4)).await;
        timers.renew("s", TTL, now_ms(base, start));
        assert!(timers.due_checkpoints(CHECKPOINT_BATCH).is_empty());
        // Renewed again 2 s later: moved by 6 s > TTL / 2, so due.
        tokio::time::advance(Duration::from_secs(2)).await;
        let renewed_at = start.elapsed();
        timers.renew("s", TTL, now_ms(base, start));
        assert_eq!(timers.due_checkpoints(CHECKPOINT_BATCH).len(), 1);

        // The leader dies before checkpointing; the next one inherits the old checkpoint, and
        // still keeps the session at least TTL past the last renewal it knows nothing of.
        let checkpoint = due[0].1;
        let mut timers = SessionTimers::default();
        timers.inherit("s", TTL, Some(checkpoint), now_ms(base, start), ELECTION);
        timers.next_expired().await;
        assert!(start.elapsed() >= renewed_at + TTL, "{:?}", start.elapsed());
    }
}
