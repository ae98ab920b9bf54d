//! What one simulated run shares: the seed's random stream, the network's state (cuts, loss),
//! the running servers, their disks, the planted bug if any, and what the checks record as it
//! goes (the committed log seen by every server, TTL expiries, the trace).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use openraft::EntryPayload;
use openraft::async_runtime::WatchReceiver as _;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_server::leader::{DutyInput, LeaderDuties};
use vigil_server::proposer::Proposer;
use vigil_server::raft::runtime::seeded;
use vigil_server::raft::state_store::{SharedState, StateStore};
use vigil_server::raft::{Entry, LogId, NodeId, Raft};
use vigil_server::state::op_index;
use vigil_shared::rpc::{Command, Op};

use crate::disk::{Disk, SimLog};
use crate::net::SimNetwork;
use crate::sessions::{Binding, Contract};

/// A bug planted on purpose, to show the checks find it (negative controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    None,
    /// The log acknowledges an append before a sync holds it: a crash loses committed entries.
    LyingSync,
    /// Reads are answered from the state of whichever server is asked, without confirming its
    /// leadership (a deposed leader answers from its old term).
    StaleReads,
    /// Renewals are acknowledged by whichever server is asked, without forwarding them to the
    /// leader or confirming its lease: a renewal may reach no TTL timer.
    RenewAnywhere,
    /// Blocking reads ignore their wait: they block four times as long unless a write wakes
    /// them.
    WaitIgnored,
    /// Blocking reads ignore their index: they answer at once, changed or not.
    EarlyWakes,
    /// The agent gives up a place in the lock queue with a plain release (the first release's
    /// way) rather than a leave that names its request: a client that retried on a new
    /// connection and was granted loses the lock to the old request's clean-up.
    LeaveReleases,
    /// A session's lock-delay is lost on the way to raft (created with none).
    NoLockDelay,
    /// A session's destroy is acknowledged without being committed.
    LostDestroy,
    /// A session's checks are lost on the way to raft (created bound to none): it outlives
    /// its check going critical.
    UnboundChecks,
    /// A renewal restarts its session's timer for eight times its TTL: a session its client
    /// abandoned lives on long after TTL × 2.
    LongRenewals,
}

impl Plant {
    pub const ALL: [Plant; 10] = [
        Plant::LyingSync,
        Plant::StaleReads,
        Plant::RenewAnywhere,
        Plant::WaitIgnored,
        Plant::EarlyWakes,
        Plant::LeaveReleases,
        Plant::NoLockDelay,
        Plant::LostDestroy,
        Plant::UnboundChecks,
        Plant::LongRenewals,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Plant::None => "none",
            Plant::LyingSync => "lying-sync",
            Plant::StaleReads => "stale-reads",
            Plant::RenewAnywhere => "renew-anywhere",
            Plant::WaitIgnored => "wait-ignored",
            Plant::EarlyWakes => "early-wakes",
            Plant::LeaveReleases => "leave-releases",
            Plant::NoLockDelay => "no-lock-delay",
            Plant::LostDestroy => "lost-destroy",
            Plant::UnboundChecks => "unbound-checks",
            Plant::LongRenewals => "long-renewals",
        }
    }

    pub fn parse(name: &str) -> Option<Plant> {
        [Plant::None]
            .into_iter()
            .chain(Plant::ALL)
            .find(|p| p.name() == name)
    }
}

/// One independent stream of random choices. Each part of the run draws from its own, so
/// the order in which tasks woken at the same instant run (tokio wakes a watch channel's
/// receivers in an order of its own RNG, which only `tokio_unstable` can seed) does not change
/// what any of them draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stream {
    /// The fate of the messages from one party to another.
    Link(Party, Party),
    /// A server's sync latencies.
    Disk(NodeId),
    /// A client's choices, its renewals', and what befalls its node's health.
    Client(usize),
    Renewals(usize),
    Health(usize),
    /// The faults.
    Nemesis,
}

/// Who sends a message: a server (its raft id) or a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Party {
    Server(NodeId),
    Client(usize),
}

/// A running server: raft with the real state store, the proposer and the leader duties.
pub struct Node {
    pub id: NodeId,
    pub raft: Raft,
    pub proposer: Proposer,
    pub shared: Arc<SharedState>,
    pub duties: mpsc::UnboundedSender<DutyInput>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Node {
    /// Cancelled when the server crashes: what it still serves then goes nowhere.
    pub fn stopping(&self) -> &CancellationToken {
        &self.shutdown
    }
}

/// A committed op, with the clock it was applied with (the state machine's: the largest
/// stamp so far) and when the first server committed it.
struct CommittedOp {
    op: Op,
    stamp: u64,
    at: Instant,
}

/// What the checks gather while the run goes.
#[derive(Default)]
struct Record {
    /// Every committed entry as the first server to commit it had it: index → (log id,
    /// payload digest, server).
    committed: BTreeMap<u64, (LogId, u64, NodeId)>,
    /// How far each server's committed log was compared (reset when it restarts).
    compared: HashMap<NodeId, u64>,
    /// When an entry expiring a session's TTL was first appended (by the leader proposing it).
    expiry_proposed: BTreeMap<LogId, (Vec<String>, Instant)>,
    /// Committed TTL expiries: session → when proposed.
    expired: BTreeMap<String, Instant>,
    /// Every committed op by the index the state machine applies it at: its entry's raft
    /// index, or one above the previous op's when that is higher (from protocol level 2 on,
    /// each op of a batch takes an index of its own). Indexes a client is told (a
    /// `ModifyIndex`) are these.
    ops: BTreeMap<u64, CommittedOp>,
    /// The last op index of each committed entry that has ops, by raft index.
    last_op: BTreeMap<u64, u64>,
    /// The protocol level and the last op index, as applying the committed log sets them.
    protocol: u32,
    op_index: u64,
    violations: Vec<String>,
    trace: Vec<String>,
}

pub struct World {
    pub seed: u64,
    /// Notes every request served and every change of role too (`SIM_VERBOSE` set).
    pub verbose: bool,
    pub plant: Plant,
    pub servers: Vec<NodeId>,
    pub start: Instant,
    streams: Mutex<BTreeMap<Stream, StdRng>>,
    /// Pairs of parties that cannot reach each other (both ways).
    cuts: Mutex<BTreeSet<(Party, Party)>>,
    /// Chance that a message is lost, in percent.
    loss: Mutex<u32>,
    nodes: Mutex<BTreeMap<NodeId, Arc<Node>>>,
    pub disks: BTreeMap<NodeId, Arc<Mutex<Disk>>>,
    record: Mutex<Record>,
}

/// The raft timing of the simulated servers: one machine's (`RaftTiming::local`).
pub fn timing() -> vigil_server::RaftTiming {
    vigil_server::RaftTiming::local()
}

/// 64-bit FNV-1a: the trace's and payloads' digests (the same on every platform and run).
pub fn fnv(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x100_0000_01b3);
    }
    hash
}

pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

impl World {
    pub fn new(seed: u64, plant: Plant, servers: usize) -> Arc<World> {
        let servers: Vec<NodeId> = (1..=servers as u64).collect();
        Arc::new(World {
            seed,
            verbose: std::env::var_os("SIM_VERBOSE").is_some(),
            plant,
            disks: servers
                .iter()
                .map(|id| (*id, Arc::new(Mutex::new(Disk::default()))))
                .collect(),
            servers,
            start: Instant::now(),
            streams: Mutex::new(BTreeMap::new()),
            cuts: Mutex::new(BTreeSet::new()),
            loss: Mutex::new(0),
            nodes: Mutex::new(BTreeMap::new()),
            record: Mutex::new(Record::default()),
        })
    }

    /// Draws from `stream`, seeded from the run's seed and the stream's name.
    pub fn draw<T>(&self, stream: Stream, f: impl FnOnce(&mut StdRng) -> T) -> T {
        let mut streams = self.streams.lock();
        let rng = streams.entry(stream).or_insert_with(|| {
            let name = format!("{stream:?}");
            StdRng::seed_from_u64(fnv(name.as_bytes(), self.seed))
        });
        f(rng)
    }

    /// Adds a line to the trace, stamped with the simulated time (µs since the run began).
    pub fn note(&self, line: String) {
        let line = format!("{:>10} {line}", self.start.elapsed().as_micros());
        self.record.lock().trace.push(line);
    }

    pub fn violation(&self, what: String) {
        self.note(format!("VIOLATION {what}"));
        self.record.lock().violations.push(what);
    }

    pub fn violations(&self) -> Vec<String> {
        self.record.lock().violations.clone()
    }

    pub fn trace(&self) -> Vec<String> {
        self.record.lock().trace.clone()
    }

    /// The digest of the trace: equal for two runs of one seed. Lines of one instant are
    /// taken in sorted order (two tasks woken at the same instant may note in either order).
    pub fn digest(&self) -> u64 {
        let mut trace = self.trace();
        trace.sort();
        trace
            .iter()
            .fold(FNV_START, |h, line| fnv(line.as_bytes(), fnv(b"\n", h)))
    }

    pub fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        self.nodes.lock().get(&id).cloned()
    }

    // The network.

    pub fn set_loss(&self, percent: u32) {
        *self.loss.lock() = percent;
    }

    pub fn cut(&self, a: Party, b: Party) {
        let mut cuts = self.cuts.lock();
        cuts.insert((a, b));
        cuts.insert((b, a));
    }

    pub fn heal(&self) {
        self.cuts.lock().clear();
    }

    /// The fate of one message from `from` to `to`: delivered after the delay returned, or lost
    /// (`None`). Most arrive within a few milliseconds, some late enough to overtake each
    /// other.
    pub fn leg(&self, from: Party, to: Party) -> Option<Duration> {
        if self.cuts.lock().contains(&(from, to)) {
            return None;
        }
        let loss = *self.loss.lock();
        self.draw(Stream::Link(from, to), |rng| {
            if rng.gen_range(0..100) < loss {
                return None;
            }
            let us = match rng.gen_range(0..100) {
                0..90 => rng.gen_range(500..8_000),
                90..99 => rng.gen_range(8_000..100_000),
                _ => rng.gen_range(100_000..600_000),
            };
            Some(Duration::from_micros(us))
        })
    }

    /// How long a sync of server `node`'s disk takes.
    pub fn fsync_latency(&self, node: NodeId) -> Duration {
        self.draw(Stream::Disk(node), |rng| {
            let us = match rng.gen_range(0..100) {
                0..97 => rng.gen_range(200..5_000),
                _ => rng.gen_range(20_000..200_000),
            };
            Duration::from_micros(us)
        })
    }

    // Servers.

    /// Starts (or restarts) server `id` on its disk.
    pub async fn start(self: &Arc<World>, id: NodeId) {
        let config = vigil_server::raft_config(timing()).expect("a valid raft config");
        let disk = Arc::clone(&self.disks[&id]);
        let log = SimLog::open(id, disk, Arc::clone(self));
        let (events_tx, events) = mpsc::unbounded_channel();
        let shared = SharedState::new(events_tx);
        let network = SimNetwork {
            from: id,
            world: Arc::clone(self),
        };
        // Each run of each server draws its election timeouts from a seed of its own.
        let runs = self.disks[&id].lock().runs();
        let raft_seed = fnv(format!("raft {id} run {runs}").as_bytes(), self.seed);
        let raft = seeded(
            raft_seed,
            Raft::new(
                id,
                Arc::new(config),
                network,
                log,
                StateStore::new(Arc::clone(&shared)),
            ),
        )
        .await
        .expect("raft starts");
        let proposer = Proposer::new(raft.clone());
        let (duties, inputs) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(
            LeaderDuties {
                proposer: proposer.clone(),
                shared: Arc::clone(&shared),
                events,
                inputs,
                members: None,
                acls: None,
                shutdown: shutdown.clone(),
                tasks: tasks.clone(),
            }
            .run(),
        );
        if self.verbose {
            let world = Arc::clone(self);
            let mut metrics = raft.server_metrics();
            let stop = shutdown.clone();
            tasks.spawn(async move {
                loop {
                    let m = metrics.borrow_watched().clone();
                    world.note(format!(
                        "node {id}: {:?}, leader {:?}, vote {}",
                        m.state, m.current_leader, m.vote
                    ));
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        changed = metrics.changed() => if changed.is_err() { return },
                    }
                }
            });
        }
        self.record.lock().compared.remove(&id);
        self.nodes.lock().insert(
            id,
            Arc::new(Node {
                id,
                raft,
                proposer,
                shared,
                duties,
                shutdown,
                tasks,
            }),
        );
        self.note(format!("node {id}: started"));
    }

    /// Crashes server `id`: it is gone from the network at once, and its disk keeps only what
    /// a sync covered.
    pub async fn crash(&self, id: NodeId) {
        let Some(node) = self.nodes.lock().remove(&id) else {
            return;
        };
        self.disks[&id].lock().crash();
        self.note(format!("node {id}: crashed"));
        node.shutdown.cancel();
        let _ = node.raft.shutdown().await;
        node.tasks.close();
        node.tasks.wait().await;
    }

    /// Whether raft on server `id` stopped on a fatal error (a failed sync).
    pub fn failed(&self, id: NodeId) -> bool {
        self.node(id)
            .is_some_and(|n| n.raft.metrics().borrow_watched().running_state.is_err())
    }

    // What the checks record.

    /// Server `node` has committed everything up to `upto` in `entries`: each must be what
    /// every other server committed at its index (raft's state machine safety).
    pub fn committed(&self, node: NodeId, entries: &BTreeMap<u64, Entry>, upto: u64) {
        let mut record = self.record.lock();
        let from = record.compared.get(&node).map_or(0, |c| c + 1);
        let mut found = Vec::new();
        let mut expired = Vec::new();
        for (index, entry) in entries.range(from..=upto) {
            let bytes = postcard::to_allocvec(&entry.payload).unwrap_or_default();
            let digest = fnv(&bytes, FNV_START);
            match record.committed.get(index) {
                Some((id, d, first)) if (*id, *d) != (entry.log_id, digest) => {
                    found.push(format!(
                        "index {index} was committed as {id} on node {first} and as {} on node {node}",
                        entry.log_id
                    ));
                }
                Some(_) => {}
                None => {
                    record
                        .committed
                        .insert(*index, (entry.log_id, digest, node));
                    if let Some((sessions, at)) = record.expiry_proposed.get(&entry.log_id) {
                        expired.extend(sessions.iter().map(|s| (s.clone(), *at)));
                    }
                    if let EntryPayload::Normal(cmd) = &entry.payload {
                        let noted = self.record_ops(&mut record, *index, cmd);
                        if self.verbose {
                            let at = self.start.elapsed().as_micros();
                            record
                                .trace
                                .push(format!("{at:>10} commit {index}: {noted}"));
                        }
                    }
                }
            }
        }
        record.compared.insert(node, upto);
        for (session, at) in expired {
            record.expired.entry(session).or_insert(at);
        }
        drop(record);
        for what in found {
            self.violation(what);
        }
    }

    /// Records the ops of the committed entry at raft `index` at the indexes the state machine
    /// applies them at (`StateMachine::apply` splits a batch from level 2 on, and numbers its
    /// ops by [`op_index`]), and describes them.
    fn record_ops(&self, record: &mut Record, index: u64, cmd: &Command) -> String {
        let last = record.ops.values().next_back().map_or(0, |c| c.stamp);
        let stamp = cmd.now_ms.max(last);
        let ops: Vec<&Op> = match &cmd.op {
            Op::Batch(ops) if record.protocol >= 2 => ops.iter().collect(),
            op => vec![op],
        };
        let mut noted = Vec::new();
        for op in ops {
            let at = op_index(record.protocol, record.op_index, index);
            record.op_index = at;
            record.protocol = record.protocol.max(protocol_raised(op));
            if self.verbose {
                noted.push(format!("{at} {op:?}"));
            }
            let committed = CommittedOp {
                op: op.clone(),
                stamp,
                at: Instant::now(),
            };
            record.ops.insert(at, committed);
            record.last_op.insert(index, at);
        }
        noted.join(", ")
    }

    /// A server appended `entry`: a TTL expiry is timed by its first append (the leader's).
    pub fn appended(&self, entry: &Entry) {
        let EntryPayload::Normal(cmd) = &entry.payload else {
            return;
        };
        let mut ids = Vec::new();
        expiries(&cmd.op, &mut ids);
        if !ids.is_empty() {
            let mut record = self.record.lock();
            record
                .expiry_proposed
                .entry(entry.log_id)
                .or_insert((ids, Instant::now()));
        }
    }

    /// Sessions whose TTL expiry committed, with when the leader proposed it.
    pub fn expired(&self) -> BTreeMap<String, Instant> {
        self.record.lock().expired.clone()
    }

    /// The clock the committed op at op index `index` was applied with (ms, the servers' wall
    /// clock), if it committed.
    pub fn stamp(&self, index: u64) -> Option<u64> {
        self.record.lock().ops.get(&index).map(|c| c.stamp)
    }

    /// The session contract replayed over the committed log up to the entry at raft index
    /// `upto` (all of it: `None`), `bindings` being what each session was created to bind.
    pub fn contract(&self, bindings: &BTreeMap<String, Binding>, upto: Option<u64>) -> Contract {
        let record = self.record.lock();
        let upto = upto.map_or(u64::MAX, |raft| {
            record
                .last_op
                .range(..=raft)
                .next_back()
                .map_or(0, |(_, op)| *op)
        });
        let ops = record.ops.range(..=upto).map(|(i, c)| (*i, &c.op, c.stamp));
        Contract::replay(ops, bindings)
    }

    /// When the first server committed the op at op index `index`, if one did.
    pub fn committed_at(&self, index: u64) -> Option<Instant> {
        self.record.lock().ops.get(&index).map(|c| c.at)
    }
}

/// The protocol level `op` raises the state machine to (0: none).
fn protocol_raised(op: &Op) -> u32 {
    match op {
        Op::SetProtocol { level } => *level,
        Op::Batch(ops) => ops.iter().map(protocol_raised).max().unwrap_or(0),
        _ => 0,
    }
}

/// The sessions `op` expires for their TTL.
fn expiries(op: &Op, out: &mut Vec<String>) {
    match op {
        Op::ExpireSession { id } => out.push(id.clone()),
        Op::Batch(ops) => ops.iter().for_each(|op| expiries(op, out)),
        _ => {}
    }
}
