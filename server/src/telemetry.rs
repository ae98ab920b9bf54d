//! Vigil's metrics: every series name, and the few functions the seams call to record them (the
//! HTTP middleware, the proposer, the leader duties, the RPC endpoint, the read path). Names are
//! Consul's where the meaning matches, `vigil.` for what only a lock service has; the full list
//! is in `docs/design.md` ("Metrics"). Recording goes through the `metrics` facade, so a
//! process without a recorder (a unit test) records nothing; [`Sink`] is the recorder an agent
//! installs and renders as Consul's JSON or as Prometheus text. The state machine records
//! nothing: it stays free of clocks and I/O, and what it did is read from its effects here.

mod sink;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use openraft::async_runtime::WatchReceiver as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil_shared::catalog::{HealthStatus, MemberState, MemberStatus, SERF_HEALTH};
use vigil_shared::kv::{KvOp, KvOpError, TxnOutcome};
use vigil_shared::lock::{LockOp, LockOutcome};
use vigil_shared::rpc::{Op, QueryResult, Response};

pub use sink::Sink;

use crate::server::Server;

/// HTTP request durations (ms): `consul.http.<METHOD>.<route>`, the route's segments joined by
/// dots with `_` for each parameter (`consul.http.GET.v1.kv._`).
pub const HTTP_PREFIX: &str = "consul.http";
/// Entries this leader committed (counter).
pub const RAFT_APPLY: &str = "consul.raft.apply";
/// From proposing an entry to its being applied on this leader (ms).
pub const RAFT_COMMIT_TIME: &str = "consul.raft.commitTime";
/// Times this server became leader (counter).
pub const RAFT_STATE_LEADER: &str = "consul.raft.state.leader";
/// RPC requests this server's endpoint answered (counter).
pub const RPC_REQUEST: &str = "consul.rpc.request";
/// Blocking queries this server holds now (gauge).
pub const RPC_QUERIES_BLOCKING: &str = "consul.rpc.queries_blocking";
/// KV writes of one op (ms, on the leader).
pub const KVS_APPLY: &str = "consul.kvs.apply";
/// KV transactions of several ops (ms, on the leader).
pub const TXN_APPLY: &str = "consul.txn.apply";
/// Session creations and destroys (ms, on the leader).
pub const SESSION_APPLY: &str = "consul.session.apply";
/// Catalog registrations (ms, on the leader).
pub const CATALOG_REGISTER: &str = "consul.catalog.register";
/// Catalog deregistrations (ms, on the leader).
pub const CATALOG_DEREGISTER: &str = "consul.catalog.deregister";
/// Prepared query writes (ms, on the leader).
pub const QUERY_APPLY: &str = "consul.prepared-query.apply";
/// Raft figures of this server (gauges).
pub const RAFT_TERM: &str = "vigil.raft.term";
pub const RAFT_LAST_INDEX: &str = "consul.raft.last_index";
pub const RAFT_APPLIED_INDEX: &str = "consul.raft.applied_index";
pub const RAFT_IS_LEADER: &str = "vigil.raft.is_leader";
pub const RAFT_VOTERS: &str = "vigil.raft.voters";
/// Sizes of this server's state (gauges).
pub const STATE_KV_ENTRIES: &str = "consul.state.kv_entries";
pub const STATE_SESSIONS: &str = "consul.state.sessions";
pub const STATE_NODES: &str = "consul.state.nodes";
pub const STATE_SERVICES: &str = "consul.state.services";
/// KV `?acquire` outcomes, label `result` (counter, on the leader).
pub const LOCK_ACQUIRE: &str = "vigil.lock.acquire";
/// From a lock's release to its next holder's grant (ms): the server-side lock queue's handoff.
pub const LOCK_HANDOFF: &str = "vigil.lock.handoff";
/// Sessions waiting on one lock, label `lock` (gauge).
pub const LOCK_WAITERS: &str = "vigil.lock.waiters";
/// How long a hold lasted, from its grant to its release or loss (ms), label `prefix`.
pub const LOCK_HOLD: &str = "vigil.lock.hold";
/// How long a native lock's grant waited in its queue (ms), label `prefix`.
pub const LOCK_WAIT: &str = "vigil.lock.wait";
/// Keys whose lock-delay has not passed yet (gauge).
pub const LOCK_DELAY_ACTIVE: &str = "vigil.lock.delay_active";
/// Sessions invalidated, label `cause` (counter, on the leader).
pub const SESSION_INVALIDATE: &str = "vigil.session.invalidate";
/// Sequencer checks answered by this server, label `result` (counter).
pub const SEQUENCER_CHECK: &str = "vigil.sequencer.check";
/// Gossip members that failed and came back within a minute (counter).
pub const SERF_MEMBER_FLAP: &str = "consul.serf.member.flap";
/// Gossip members this agent knows, label `state` (gauge).
pub const GOSSIP_MEMBERS: &str = "vigil.gossip.members";
/// Gossip packets that failed to decrypt (a wrong or missing key), since start (gauge).
pub const GOSSIP_DECRYPT_FAILURES: &str = "vigil.gossip.decrypt_failures";
/// Gossip packets from another datacenter, dropped, since start (gauge).
pub const GOSSIP_FOREIGN_DROPS: &str = "vigil.gossip.foreign_datacenter_drops";
/// Lifeguard's local health multiplier, 0 (healthy) to 8: how far this agent stretches its own
/// probe and suspicion timeouts because its probes fail (gauge; memberlist's name).
pub const MEMBERLIST_HEALTH_SCORE: &str = "consul.memberlist.health.score";
/// Open HTTP API connections of this agent, both listeners (gauge).
pub const HTTP_CONNECTIONS: &str = "vigil.http.connections";
/// HTTP API connections closed to protect the agent, label `reason`: `client_cap` (429, the
/// client IP's cap), `agent_cap` (503, every connection busy), `evicted_idle` (the connection
/// idle the longest, closed to make room) (counter).
pub const HTTP_CONNECTIONS_SHED: &str = "vigil.http.connections_shed";
/// Snapshot writes that failed on a passing storage error (out of descriptors, space or
/// memory) and are tried again, label `error` (counter).
pub const STORAGE_RETRY: &str = "vigil.storage.retry";
/// Times this server, out of the raft configuration or without a leader for an election
/// timeout, asked to be added again (counter).
pub const RAFT_REJOIN: &str = "vigil.raft.rejoin";
/// The process's runtime, under Consul's names for the Go runtime's gauges (set when metrics are
/// read): tasks alive on the async runtime (Go's goroutines), anonymous memory resident (heap
/// and stacks: Go's bytes allocated and in use), all memory resident (Go's bytes obtained from
/// the system), its threads, and no garbage collections, since Rust has no collector.
pub const RUNTIME_NUM_GOROUTINES: &str = "consul.runtime.num_goroutines";
pub const RUNTIME_ALLOC_BYTES: &str = "consul.runtime.alloc_bytes";
pub const RUNTIME_SYS_BYTES: &str = "consul.runtime.sys_bytes";
pub const RUNTIME_THREADS: &str = "vigil.runtime.threads";
pub const RUNTIME_TOTAL_GC_RUNS: &str = "consul.runtime.total_gc_runs";
pub const RUNTIME_TOTAL_GC_PAUSE_NS: &str = "consul.runtime.total_gc_pause_ns";
/// Elections this server started at once because the leader's port was found closed (its
/// process gone) instead of waiting out the leader lease and election timeout (counter).
pub const RAFT_ELECTIONS_ON_EVIDENCE: &str = "vigil.raft.elections_on_evidence";

/// How a KV acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireResult {
    Granted,
    /// Another session holds the key.
    HeldByOther,
    /// The key's lock-delay has not passed.
    LockDelay,
    /// The session does not exist (or none was given).
    InvalidSession,
    /// Another op of the same transaction failed, so nothing was applied.
    Aborted,
    /// A queued lock's contender joined the queue.
    Queued,
}

impl AcquireResult {
    pub fn label(self) -> &'static str {
        match self {
            AcquireResult::Granted => "granted",
            AcquireResult::HeldByOther => "held_by_other",
            AcquireResult::LockDelay => "lock_delay",
            AcquireResult::InvalidSession => "invalid_session",
            AcquireResult::Aborted => "aborted",
            AcquireResult::Queued => "queued",
        }
    }
}

/// Why a session was invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidationCause {
    /// Its TTL passed without a renewal.
    Ttl,
    /// Gossip found its node failed (`serfHealth` critical).
    NodeFailure,
    /// Another check it is bound to went critical.
    CheckCritical,
    /// A check or service it is bound to was deregistered.
    CheckDeregistered,
    /// `/v1/session/destroy`.
    Destroy,
    /// Its node left or was deregistered.
    NodeDeregistered,
    /// A command of another kind.
    Other,
}

impl InvalidationCause {
    pub fn label(self) -> &'static str {
        match self {
            InvalidationCause::Ttl => "ttl",
            InvalidationCause::NodeFailure => "node_failure",
            InvalidationCause::CheckCritical => "check_critical",
            InvalidationCause::CheckDeregistered => "check_deregistered",
            InvalidationCause::Destroy => "destroy",
            InvalidationCause::NodeDeregistered => "node_deregistered",
            InvalidationCause::Other => "other",
        }
    }

    /// Why the sessions a command invalidated went. A TTL expiry is a destroy committed by the
    /// leader's timer; the leader duties, which know their own timers, tell it apart.
    pub fn of(op: &Op) -> InvalidationCause {
        let critical_serf = |c: &vigil_shared::catalog::Check| {
            c.status == HealthStatus::Critical && c.check_id == SERF_HEALTH
        };
        match op {
            // One entry of many ops: the first that invalidates anything names the cause.
            Op::Batch(ops) => ops
                .iter()
                .map(InvalidationCause::of)
                .find(|c| *c != InvalidationCause::Other)
                .unwrap_or(InvalidationCause::Other),
            Op::DestroySession { .. } => InvalidationCause::Destroy,
            Op::ExpireSession { .. } => InvalidationCause::Ttl,
            Op::RegisterCheck(check) if critical_serf(check) => InvalidationCause::NodeFailure,
            Op::CatalogRegister(reg) | Op::CatalogRegisterFull(reg)
                if reg.checks.iter().any(critical_serf) =>
            {
                InvalidationCause::NodeFailure
            }
            Op::RegisterCheck(_) | Op::CatalogRegister(_) | Op::CatalogRegisterFull(_) => {
                InvalidationCause::CheckCritical
            }
            Op::DeregisterCheck { .. } | Op::DeregisterService { .. } => {
                InvalidationCause::CheckDeregistered
            }
            Op::DeregisterNode { .. } => InvalidationCause::NodeDeregistered,
            _ => InvalidationCause::Other,
        }
    }
}

/// A KV acquire ended with `result`.
pub fn lock_acquired(result: AcquireResult) {
    counter!(LOCK_ACQUIRE, "result" => result.label()).increment(1);
}

/// A lock passed from its releasing holder to the next waiter after `wait`.
pub fn lock_handoff(wait: Duration) {
    histogram!(LOCK_HANDOFF).record(millis(wait));
}

/// `lock` has `waiters` sessions queued now.
pub fn lock_waiters(lock: &str, waiters: usize) {
    gauge!(LOCK_WAITERS, "lock" => lock.to_owned()).set(waiters as f64);
}

/// A hold of lock `name` ended after `ms`.
pub fn lock_held(name: &str, ms: u64) {
    histogram!(LOCK_HOLD, "prefix" => lock_prefix(name)).record(ms as f64);
}

/// A grant of native lock `name` waited `ms` in its queue.
pub fn lock_waited(name: &str, ms: u64) {
    histogram!(LOCK_WAIT, "prefix" => lock_prefix(name)).record(ms as f64);
}

/// A lock's prefix, the label of its hold and wait times: its name up to the last `/`
/// (`jobs/billing` for Consul's `jobs/billing/.lock`), or the whole name without one.
pub fn lock_prefix(name: &str) -> String {
    name.rsplit_once('/')
        .map_or(name, |(prefix, _)| prefix)
        .to_owned()
}

/// A session was invalidated (counted by the leader only).
pub fn session_invalidated(cause: InvalidationCause) {
    counter!(SESSION_INVALIDATE, "cause" => cause.label()).increment(1);
}

/// This server campaigned on evidence of the leader's death.
pub fn election_on_evidence() {
    counter!(RAFT_ELECTIONS_ON_EVIDENCE).increment(1);
}

/// This server became the leader.
pub fn became_leader() {
    counter!(RAFT_STATE_LEADER).increment(1);
}

/// The agent has `open` HTTP connections.
pub fn http_connections(open: usize) {
    gauge!(HTTP_CONNECTIONS).set(open as f64);
}

/// An HTTP connection was refused or closed for `reason` (see [`HTTP_CONNECTIONS_SHED`]).
pub fn http_connection_shed(reason: &'static str) {
    counter!(HTTP_CONNECTIONS_SHED, "reason" => reason).increment(1);
}

/// A snapshot write failed with `error` (an errno name) and will be tried again.
pub fn storage_retry(error: &'static str) {
    counter!(STORAGE_RETRY, "error" => error).increment(1);
}

/// This server asked to be added to the cluster again.
pub fn rejoin_attempt() {
    counter!(RAFT_REJOIN).increment(1);
}

/// The RPC endpoint answered a request.
pub fn rpc_request() {
    counter!(RPC_REQUEST).increment(1);
}

/// A member that failed and is alive again within this counts as a flap (Serf's flap timeout).
pub const FLAP_WINDOW: Duration = Duration::from_secs(60);

/// Tells member flaps from the gossip member list: a member seen failed, then alive again
/// within [`FLAP_WINDOW`].
#[derive(Debug, Default)]
pub struct FlapDetector {
    failed_at: HashMap<String, Instant>,
}

impl FlapDetector {
    /// Looks at the current member list; returns how many members flapped since the last look.
    pub fn observe(&mut self, members: &[MemberStatus], now: Instant) -> usize {
        let mut flaps = 0;
        for m in members {
            match m.state {
                MemberState::Failed => {
                    self.failed_at.entry(m.name.clone()).or_insert(now);
                }
                MemberState::Alive => {
                    if let Some(at) = self.failed_at.remove(&m.name)
                        && now.duration_since(at) <= FLAP_WINDOW
                    {
                        flaps += 1;
                    }
                }
                _ => {
                    self.failed_at.remove(&m.name);
                }
            }
        }
        flaps
    }
}

/// Counts `consul.serf.member.flap` from the gossip member list until `shutdown`.
pub async fn count_member_flaps(
    mut members: watch::Receiver<Vec<MemberStatus>>,
    shutdown: CancellationToken,
) {
    let mut detector = FlapDetector::default();
    loop {
        let flaps = detector.observe(&members.borrow_and_update(), Instant::now());
        if flaps > 0 {
            counter!(SERF_MEMBER_FLAP).increment(flaps as u64);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = members.changed() => if changed.is_err() { return },
        }
    }
}

/// An HTTP request was answered after `elapsed`; `route` is its matched route's pattern
/// (`/v1/kv/{*key}`), or its path when none matched.
pub fn http_request(method: &str, route: &str, elapsed: Duration) {
    histogram!(http_metric_name(method, route)).record(millis(elapsed));
}

/// `consul.http.GET.v1.kv._` for `GET /v1/kv/{*key}`.
pub fn http_metric_name(method: &str, route: &str) -> String {
    let mut name = format!("{HTTP_PREFIX}.{method}");
    for segment in route.split('/').filter(|s| !s.is_empty()) {
        name.push('.');
        name.push_str(if segment.starts_with('{') {
            "_"
        } else {
            segment
        });
    }
    name
}

/// A read was answered locally; sequencer checks are counted by result.
pub fn read_answered(result: &QueryResult) {
    if let QueryResult::Sequencer(answer) = result {
        let label = if answer.is_ok() { "valid" } else { "invalid" };
        counter!(SEQUENCER_CHECK, "result" => label).increment(1);
    }
}

/// What a proposal is, taken before it is handed to raft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The per-endpoint timing series, if the op has one.
    series: Option<&'static str>,
    /// Positions of the KV ops that acquire a lock.
    acquires: Vec<usize>,
    /// An acquire of a queued lock.
    queue_acquire: bool,
}

impl Proposal {
    pub fn of(op: &Op) -> Proposal {
        let series = match op {
            Op::Kv(ops) if ops.len() == 1 => Some(KVS_APPLY),
            Op::Kv(_) => Some(TXN_APPLY),
            Op::CreateSession(_) | Op::DestroySession { .. } => Some(SESSION_APPLY),
            Op::RegisterNode { .. }
            | Op::RegisterCheck(_)
            | Op::CatalogRegister(_)
            | Op::CatalogRegisterFull(_) => Some(CATALOG_REGISTER),
            Op::DeregisterCheck { .. }
            | Op::DeregisterNode { .. }
            | Op::DeregisterService { .. } => Some(CATALOG_DEREGISTER),
            Op::SetQuery { .. } | Op::SetQueryFull { .. } | Op::DeleteQuery { .. } => {
                Some(QUERY_APPLY)
            }
            _ => None,
        };
        let acquires = match op {
            Op::Kv(ops) => ops
                .iter()
                .enumerate()
                .filter(|(_, op)| matches!(op, KvOp::Lock { .. }))
                .map(|(i, _)| i)
                .collect(),
            _ => Vec::new(),
        };
        let queue_acquire = matches!(op, Op::Lock(LockOp::Acquire { .. }));
        Proposal {
            series,
            acquires,
            queue_acquire,
        }
    }

    /// The proposal was committed and applied on this leader after `elapsed`.
    pub fn committed(&self, response: &Response, elapsed: Duration) {
        counter!(RAFT_APPLY).increment(1);
        histogram!(RAFT_COMMIT_TIME).record(millis(elapsed));
        if let Some(series) = self.series {
            histogram!(series).record(millis(elapsed));
        }
        for result in self.acquire_results(response) {
            lock_acquired(result);
        }
        if self.queue_acquire {
            lock_acquired(match response {
                Response::Lock(LockOutcome::Held { .. }) => AcquireResult::Granted,
                Response::Lock(LockOutcome::Queued { .. }) => AcquireResult::Queued,
                Response::Lock(LockOutcome::Busy { lock_delay_ms: 0 }) => {
                    AcquireResult::HeldByOther
                }
                Response::Lock(LockOutcome::Busy { .. }) => AcquireResult::LockDelay,
                Response::Rejected(_) => AcquireResult::InvalidSession,
                _ => AcquireResult::Aborted,
            });
        }
    }

    /// How each acquire of the proposal ended.
    pub fn acquire_results(&self, response: &Response) -> Vec<AcquireResult> {
        self.acquires
            .iter()
            .map(|&i| match response {
                Response::Txn(TxnOutcome::Committed(_)) => AcquireResult::Granted,
                Response::Txn(TxnOutcome::RolledBack(errors)) => {
                    match errors.iter().find(|e| e.op_index == i).map(|e| &e.error) {
                        Some(KvOpError::LockHeld(_)) => AcquireResult::HeldByOther,
                        Some(KvOpError::LockDelay { .. }) => AcquireResult::LockDelay,
                        Some(KvOpError::InvalidSession(_) | KvOpError::MissingSession) => {
                            AcquireResult::InvalidSession
                        }
                        _ => AcquireResult::Aborted,
                    }
                }
                _ => AcquireResult::Aborted,
            })
            .collect()
    }
}

/// Sets the gossip gauges every agent has, when metrics are read: members by state, and the
/// gossip layer's own drop counts.
pub fn record_gossip(
    members: &[MemberStatus],
    decrypt_failures: u64,
    foreign_drops: u64,
    health_score: u64,
) {
    for (state, label) in [
        (MemberState::Alive, "alive"),
        (MemberState::Leaving, "leaving"),
        (MemberState::Failed, "failed"),
        (MemberState::Left, "left"),
    ] {
        let n = members.iter().filter(|m| m.state == state).count();
        gauge!(GOSSIP_MEMBERS, "state" => label).set(n as f64);
    }
    gauge!(GOSSIP_DECRYPT_FAILURES).set(decrypt_failures as f64);
    gauge!(GOSSIP_FOREIGN_DROPS).set(foreign_drops as f64);
    gauge!(MEMBERLIST_HEALTH_SCORE).set(health_score as f64);
}

/// Sets the runtime gauges every agent has, when metrics are read: the async runtime's live
/// tasks, and what `/proc/self/status` says of memory and threads (a field it lacks is left
/// out).
pub fn record_runtime() {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        gauge!(RUNTIME_NUM_GOROUTINES).set(runtime.metrics().num_alive_tasks() as f64);
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let status = ProcStatus::parse(&status);
    if let Some(bytes) = status.rss_anon_bytes {
        gauge!(RUNTIME_ALLOC_BYTES).set(bytes as f64);
    }
    if let Some(bytes) = status.rss_bytes {
        gauge!(RUNTIME_SYS_BYTES).set(bytes as f64);
    }
    if let Some(threads) = status.threads {
        gauge!(RUNTIME_THREADS).set(threads as f64);
    }
    gauge!(RUNTIME_TOTAL_GC_RUNS).set(0.0);
    gauge!(RUNTIME_TOTAL_GC_PAUSE_NS).set(0.0);
}

/// The figures of `/proc/<pid>/status` the runtime gauges use.
#[derive(Debug, Default, PartialEq, Eq)]
struct ProcStatus {
    rss_anon_bytes: Option<u64>,
    rss_bytes: Option<u64>,
    threads: Option<u64>,
}

impl ProcStatus {
    /// Reads `Name:\tvalue` lines; memory is in kB (kibibytes, whatever the unit's name says).
    fn parse(text: &str) -> ProcStatus {
        let mut out = ProcStatus::default();
        for line in text.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let number = value
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
            let kib = || number.map(|n| n * 1024);
            match name {
                "RssAnon" => out.rss_anon_bytes = kib(),
                "VmRSS" => out.rss_bytes = kib(),
                "Threads" => out.threads = number,
                _ => {}
            }
        }
        out
    }
}

/// Sets the gauges only a server has: raft figures, state sizes, blocking queries, active
/// lock-delays. Called when metrics are read, so nothing runs between scrapes.
pub fn record_server(server: &Server) {
    let metrics = server.raft().metrics().borrow_watched().clone();
    gauge!(RAFT_TERM).set(metrics.current_term as f64);
    gauge!(RAFT_LAST_INDEX).set(metrics.last_log_index.unwrap_or(0) as f64);
    gauge!(RAFT_APPLIED_INDEX).set(metrics.last_applied.map_or(0, |l| l.index) as f64);
    let leading = metrics.running_state.is_ok() && metrics.state == openraft::ServerState::Leader;
    gauge!(RAFT_IS_LEADER).set(if leading { 1.0 } else { 0.0 });
    gauge!(RAFT_VOTERS).set(metrics.membership_config.membership().voter_ids().count() as f64);
    gauge!(RPC_QUERIES_BLOCKING).set(server.blocking_queries() as f64);
    let now_ms = crate::proposer::wall_ms();
    let state = server.shared().read();
    gauge!(STATE_KV_ENTRIES).set(state.kv().len() as f64);
    gauge!(STATE_SESSIONS).set(state.sessions().len() as f64);
    gauge!(STATE_NODES).set(state.catalog().nodes().count() as f64);
    gauge!(STATE_SERVICES).set(state.catalog().services().count() as f64);
    gauge!(LOCK_DELAY_ACTIVE).set(state.kv().lock_delays_active(now_ms) as f64);
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_shared::kv::TxnError;

    fn lock(key: &str) -> KvOp {
        KvOp::Lock {
            key: key.to_owned(),
            value: Vec::new(),
            flags: 0,
            session: "s".to_owned(),
        }
    }

    #[test]
    fn proc_status_figures_are_read_in_bytes() {
        let text = "Name:\tvigil\nVmRSS:\t   20480 kB\nRssAnon:\t    8192 kB\nThreads:\t7\n";
        assert_eq!(
            ProcStatus::parse(text),
            ProcStatus {
                rss_anon_bytes: Some(8 << 20),
                rss_bytes: Some(20 << 20),
                threads: Some(7),
            }
        );
        assert_eq!(
            ProcStatus::parse("garbage\nVmRSS:\tlots\n"),
            ProcStatus::default()
        );
    }

    #[test]
    fn a_member_failed_and_back_within_a_minute_flapped() {
        let member = |name: &str, state| MemberStatus {
            name: name.to_owned(),
            gossip_addr: "127.0.0.1:1".parse().expect("address"),
            rpc_addr: "127.0.0.1:2".parse().expect("address"),
            role: vigil_shared::catalog::MemberRole::Client,
            datacenter: "dc1".to_owned(),
            state,
            pruned: false,
            protocol: vigil_shared::PROTOCOL,
        };
        let mut d = FlapDetector::default();
        let t0 = Instant::now();
        let alive = [
            member("a", MemberState::Alive),
            member("b", MemberState::Alive),
        ];
        assert_eq!(d.observe(&alive, t0), 0);
        let failed = [
            member("a", MemberState::Failed),
            member("b", MemberState::Failed),
        ];
        assert_eq!(d.observe(&failed, t0), 0);
        let back = [
            member("a", MemberState::Alive),
            member("b", MemberState::Failed),
        ];
        assert_eq!(d.observe(&back, t0 + Duration::from_secs(5)), 1);
        let late = [
            member("a", MemberState::Alive),
            member("b", MemberState::Alive),
        ];
        assert_eq!(d.observe(&late, t0 + FLAP_WINDOW * 2), 0);
    }

    #[test]
    fn http_names_follow_the_route() {
        assert_eq!(
            http_metric_name("GET", "/v1/kv/{*key}"),
            "consul.http.GET.v1.kv._"
        );
        assert_eq!(
            http_metric_name("PUT", "/v1/session/create"),
            "consul.http.PUT.v1.session.create"
        );
    }

    #[test]
    fn acquires_are_classified_by_the_error_on_their_own_op() {
        let proposal = Proposal::of(&Op::Kv(vec![
            KvOp::Get {
                key: "a".to_owned(),
            },
            lock("b"),
            lock("c"),
        ]));
        assert_eq!(proposal.series, Some(TXN_APPLY));
        let committed = Response::Txn(TxnOutcome::Committed(Vec::new()));
        assert_eq!(
            proposal.acquire_results(&committed),
            [AcquireResult::Granted, AcquireResult::Granted]
        );
        let refused = Response::Txn(TxnOutcome::RolledBack(vec![TxnError {
            op_index: 2,
            error: KvOpError::LockDelay {
                key: "c".to_owned(),
                remaining_ms: 10,
            },
        }]));
        assert_eq!(
            proposal.acquire_results(&refused),
            [AcquireResult::Aborted, AcquireResult::LockDelay]
        );
        let held = Proposal::of(&Op::Kv(vec![lock("b")]));
        let refused = Response::Txn(TxnOutcome::RolledBack(vec![TxnError {
            op_index: 0,
            error: KvOpError::LockHeld("b".to_owned()),
        }]));
        assert_eq!(held.acquire_results(&refused), [AcquireResult::HeldByOther]);
    }

    #[test]
    fn invalidation_causes_come_from_the_command() {
        let check = |id: &str| vigil_shared::catalog::Check {
            check_id: id.to_owned(),
            status: HealthStatus::Critical,
            ..Default::default()
        };
        let cases = [
            (
                Op::DestroySession { id: "s".to_owned() },
                InvalidationCause::Destroy,
            ),
            (
                Op::RegisterCheck(check(SERF_HEALTH)),
                InvalidationCause::NodeFailure,
            ),
            (
                Op::RegisterCheck(check("web")),
                InvalidationCause::CheckCritical,
            ),
            (
                Op::DeregisterNode {
                    name: "n".to_owned(),
                },
                InvalidationCause::NodeDeregistered,
            ),
            (
                Op::DeregisterCheck {
                    node: "n".to_owned(),
                    check_id: "web".to_owned(),
                },
                InvalidationCause::CheckDeregistered,
            ),
        ];
        for (op, cause) in cases {
            assert_eq!(InvalidationCause::of(&op), cause, "{op:?}");
        }
    }
}
