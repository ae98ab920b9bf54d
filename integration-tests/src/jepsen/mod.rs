//! A Jepsen-style checker: histories recorded by real clients against a real cluster (3
//! servers and 2 client agents on loopback) while a nemesis injects faults, then checked.
//!
//! - **Registers**: clients read (default and `?consistent`), write and cas a few KV keys; each
//!   key's history must be linearizable ([`linear`]), with an operation whose outcome is unknown
//!   left open-ended, and a final linearizable read of every key after the faults heal (so an
//!   acknowledged write that was lost shows as an anomaly too).
//! - **Locks**: clients take a Consul-style KV lock or the lock queue and increment a counter
//!   behind a fence that checks their token on reads and writes ([`fence`]); a holder now and
//!   then stalls past its session's TTL. No stale token may be accepted and no increment lost.
//! - **Sessions**: TTL sessions renewed on time are never invalidated before their TTL.
//!
//! Clients behave as real ones do ([`clients`]): deadlines, dropped connections, immediate
//! retries on another agent, one session reused for two locks in two modes. The nemesis
//! ([`nemesis`]) kills, pauses, partitions and fills the disk of servers and client agents on a
//! schedule drawn from the seed; the report prints the seed, the schedule as it ran and the
//! first anomaly, and the command that runs the same schedule again. Two negative controls
//! Three negative controls show the checkers can fail: `?stale` reads from a follower that was
//! paused are not linearizable, a resource that trusts stale tokens loses updates, and sessions
//! held to a longer TTL than they were given are found invalidated early.

pub mod clients;
pub mod fence;
pub use vigil_sim::linear;
pub mod nemesis;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use vigil_client::{ClientConfig, ReadOpts};

use crate::SHORT_SESSION_TTL;
use crate::cluster::Cluster;
use crate::safety::register::AgentBoard;
use crate::safety::schedule::Rng;
use clients::{Ctx, LockKind, LockLog, Reads, SessionLog, SessionSpec};
use fence::{Fenced, Fencing, Tally};
use linear::{Anomaly, Input, Op, Output};
use nemesis::{Fault, Nemesis, Step};

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What the control run is named in the report and in the replay command.
    pub name: &'static str,
    pub seed: u64,
    /// How long the fault schedule runs.
    pub span: Duration,
    pub faults: Vec<Fault>,
    pub keys: usize,
    pub register_clients: usize,
    pub reads: Reads,
    /// Lock clients per kind of lock.
    pub lock_clients: usize,
    pub fencing: Fencing,
    /// One hold in this many stalls past its session's TTL (0: none).
    pub stall_in: u64,
    /// How long a holder keeps the lock between its read and its write.
    pub hold: Duration,
    pub session_clients: usize,
    pub sessions: SessionSpec,
    /// A request not answered within this long is dropped.
    pub deadline: Duration,
}

impl Plan {
    /// CI's run: every fault this machine can inject but the leader's refusal, for `span`.
    pub fn faults(seed: u64, span: Duration) -> Plan {
        Plan {
            name: "faults",
            seed,
            span,
            faults: Fault::ALL.to_vec(),
            keys: 3,
            register_clients: 4,
            reads: Reads::Linearizable,
            lock_clients: 3,
            fencing: Fencing::Checked,
            stall_in: 25,
            hold: Duration::from_millis(5),
            session_clients: 2,
            sessions: SessionSpec::HONEST,
            deadline: Duration::from_secs(2),
        }
    }

    /// Negative control: `?stale` reads, with followers paused; the register check must find
    /// an anomaly.
    pub fn stale_reads(seed: u64) -> Plan {
        Plan {
            name: "stale-reads",
            span: Duration::from_secs(25),
            faults: vec![Fault::PauseFollower],
            reads: Reads::Stale,
            lock_clients: 0,
            session_clients: 0,
            ..Plan::faults(seed, Duration::ZERO)
        }
    }

    /// Negative control: a resource that trusts stale tokens, and holders that stall past
    /// their TTL often; the lock check must find lost updates.
    pub fn trusting_fence(seed: u64) -> Plan {
        Plan {
            name: "trusting-fence",
            span: Duration::from_secs(20),
            faults: Vec::new(),
            register_clients: 0,
            fencing: Fencing::Trusting,
            stall_in: 3,
            hold: Duration::from_millis(50),
            session_clients: 0,
            ..Plan::faults(seed, Duration::ZERO)
        }
    }

    /// Negative control: sessions whose TTL is shorter than the one the check holds the
    /// servers to; the session check must find early invalidations.
    pub fn shortened_ttl(seed: u64) -> Plan {
        Plan {
            name: "shortened-ttl",
            span: Duration::from_secs(15),
            faults: Vec::new(),
            register_clients: 0,
            lock_clients: 0,
            sessions: SessionSpec::SHORTENED,
            ..Plan::faults(seed, Duration::ZERO)
        }
    }

    /// The leader's ports refusing every datagram (a firewall's `REJECT`), again and again:
    /// to the others it looks dead, and a failover on evidence must still keep reads
    /// linearizable and locks safe. Not in CI's plan: its session check reports an open gap.
    /// Sessions renewed on time are found gone just after the rule is removed (2 in 71
    /// renewals, seed 7, 120 s). The likely cause, not yet confirmed: the cut-off leader's
    /// gossip hears no acknowledgement and takes every other member for failed, and its
    /// verdicts spread when the rule goes; Lifeguard's local health awareness, not built yet,
    /// would keep it from accusing anyone.
    pub fn rejecting_leader(seed: u64, span: Duration) -> Plan {
        Plan {
            name: "rejecting-leader",
            span,
            faults: vec![Fault::RejectLeader],
            ..Plan::faults(seed, Duration::ZERO)
        }
    }

    /// The plan the replay command names.
    pub fn named(name: &str, seed: u64, span: Duration) -> Option<Plan> {
        match name {
            "faults" => Some(Plan::faults(seed, span)),
            "rejecting-leader" => Some(Plan::rejecting_leader(seed, span)),
            "stale-reads" => Some(Plan {
                span,
                ..Plan::stale_reads(seed)
            }),
            "trusting-fence" => Some(Plan {
                span,
                ..Plan::trusting_fence(seed)
            }),
            "shortened-ttl" => Some(Plan {
                span,
                ..Plan::shortened_ttl(seed)
            }),
            _ => None,
        }
    }
}

/// One fault as it ran: when (since the run began), what, on whom, how long.
#[derive(Debug, Clone)]
pub struct Applied {
    pub at: Duration,
    pub step: Step,
    pub outcome: Result<String, String>,
}

impl fmt::Display for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.outcome {
            Ok(target) => target.clone(),
            Err(why) => format!("skipped: {why}"),
        };
        write!(
            f,
            "t+{:.1}s {} {target} for {:.1}s",
            self.at.as_secs_f64(),
            self.step.fault.name(),
            self.step.hold.as_secs_f64()
        )
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub plan: Plan,
    pub elapsed: Duration,
    pub faults: Vec<Applied>,
    /// Faults left out, and why (e.g. they need root).
    pub left_out: Vec<String>,
    pub register_ops: usize,
    /// Register operations whose outcome stayed unknown.
    pub indeterminate: usize,
    /// The first anomaly of each key that has one.
    pub anomalies: Vec<(String, Anomaly)>,
    pub locks: Vec<(LockKind, Tally, LockLog)>,
    pub sessions: SessionLog,
}

impl Report {
    /// Every anomaly and violation found.
    pub fn problems(&self) -> usize {
        let locks: u64 = self
            .locks
            .iter()
            .map(|(_, t, _)| t.lost_updates() + t.stale_accepted)
            .sum();
        self.anomalies.len() + locks as usize + self.sessions.early.len()
    }

    /// The command that runs this plan again.
    pub fn replay(&self) -> String {
        format!(
            "cargo run -p integration-tests --bin vigil-jepsen -- --plan {} --seed {} --seconds {}",
            self.plan.name,
            self.plan.seed,
            self.plan.span.as_secs()
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "jepsen ({}, seed {}): {:.0?}, {} faults",
            self.plan.name,
            self.plan.seed,
            self.elapsed,
            self.faults.iter().filter(|a| a.outcome.is_ok()).count()
        )?;
        for applied in &self.faults {
            writeln!(f, "  {applied}")?;
        }
        for why in &self.left_out {
            writeln!(f, "  left out: {why}")?;
        }
        writeln!(
            f,
            "  registers: {} operations ({} with unknown outcome), {} keys not linearizable",
            self.register_ops,
            self.indeterminate,
            self.anomalies.len()
        )?;
        if let Some((key, anomaly)) = self.anomalies.first() {
            write!(f, "    first, on {key}: {anomaly}")?;
        }
        for (kind, tally, log) in &self.locks {
            writeln!(
                f,
                "  {}: {} grants ({} acquires asked again, {} stalls); counter {} after {} increments: {} lost, {} stale accepted, {} refused",
                kind.name(),
                log.grants,
                log.retried,
                log.stalls,
                tally.value,
                tally.increments,
                tally.lost_updates(),
                tally.stale_accepted,
                tally.refused
            )?;
        }
        writeln!(
            f,
            "  sessions: {} renewals, {} invalidated before their TTL",
            self.sessions.renewals,
            self.sessions.early.len()
        )?;
        for early in &self.sessions.early {
            writeln!(f, "    {early}")?;
        }
        writeln!(f, "  problems: {}", self.problems())?;
        write!(f, "  replay: {}", self.replay())
    }
}

/// Runs `plan` on a fresh cluster.
pub async fn run(plan: &Plan) -> anyhow::Result<Report> {
    let mut cluster = Cluster::servers(3)
        .clients(2)
        .env(SHORT_SESSION_TTL)
        .start()
        .await;
    let servers = cluster.servers.len();
    let urls: Vec<Option<String>> = (0..servers)
        .map(|i| Some(cluster.server(i).http().url("")))
        .chain((0..cluster.clients.len()).map(|c| Some(cluster.client(c).http().url(""))))
        .collect();
    let board = AgentBoard::new(urls);
    let root = nemesis::is_root();
    let mut left_out = Vec::new();
    let faults: Vec<Fault> = plan
        .faults
        .iter()
        .copied()
        .filter(|f| {
            let possible = root || !f.needs_root();
            if !possible {
                left_out.push(format!("{} (needs root)", f.name()));
            }
            possible
        })
        .collect();
    let wants_disk = faults.contains(&Fault::FullDisk);
    let mut nemesis = Nemesis::new(&mut cluster, board.clone(), wants_disk).await;
    let faults: Vec<Fault> = faults
        .into_iter()
        .filter(|f| {
            let possible = *f != Fault::FullDisk || nemesis.has_tmpfs();
            if !possible {
                left_out.push("full-disk (cannot mount a tmpfs here)".to_owned());
            }
            possible
        })
        .collect();

    let started = Instant::now();
    let (stop, stopped) = watch::channel(false);
    let cx = Ctx {
        board: board.clone(),
        config: ClientConfig::default(),
        started,
        stop: stopped,
        deadline: plan.deadline,
    };
    let mut seeds = Rng::new(plan.seed ^ 0x5eed);
    let histories: Arc<Vec<clients::History>> = Arc::new(
        (0..plan.keys)
            .map(|_| Arc::new(Mutex::new(Vec::new())))
            .collect(),
    );
    // Stale readers go to the servers only (a client agent would forward to the leader).
    let pinned: Vec<usize> = match plan.reads {
        Reads::Stale => (0..servers).collect(),
        Reads::Linearizable => Vec::new(),
    };
    let registers: Vec<_> = (0..plan.register_clients)
        .map(|id| {
            tokio::spawn(clients::register_client(
                id,
                cx.clone(),
                Arc::clone(&histories),
                plan.reads,
                pinned.clone(),
                seeds.next_u64(),
            ))
        })
        .collect();
    let mut lockers = Vec::new();
    for kind in [LockKind::Kv, LockKind::Queue] {
        let counter = Arc::new(Fenced::new(plan.fencing));
        let tasks: Vec<_> = (0..plan.lock_clients)
            .map(|id| {
                tokio::spawn(clients::lock_client(
                    id,
                    kind,
                    cx.clone(),
                    Arc::clone(&counter),
                    plan.stall_in,
                    plan.hold,
                    seeds.next_u64(),
                ))
            })
            .collect();
        if !tasks.is_empty() {
            lockers.push((kind, counter, tasks));
        }
    }
    let sessions: Vec<_> = (0..plan.session_clients)
        .map(|id| tokio::spawn(clients::session_client(id, cx.clone(), plan.sessions)))
        .collect();

    // The schedule; without faults, the clients just run for the span.
    let mut applied = Vec::new();
    if faults.is_empty() {
        tokio::time::sleep(plan.span).await;
    }
    for step in nemesis::schedule(plan.seed, &faults, plan.span) {
        tokio::time::sleep(step.gap).await;
        let at = started.elapsed();
        let outcome = nemesis.apply(&step).await;
        let one = Applied { at, step, outcome };
        eprintln!("jepsen: {one}");
        applied.push(one);
    }
    nemesis.heal().await;
    nemesis.cluster().leader().await;
    // A little quiet time for the clients to see a healthy cluster, then stop them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop.send(true);
    for task in registers {
        task.await?;
    }
    let mut locks = Vec::new();
    for (kind, counter, tasks) in lockers {
        let mut total = LockLog::default();
        for task in tasks {
            let log = task.await?;
            total.grants += log.grants;
            total.retried += log.retried;
            total.stalls += log.stalls;
        }
        locks.push((kind, counter.tally(), total));
    }
    let mut session_log = SessionLog::default();
    for task in sessions {
        let log = task.await?;
        session_log.renewals += log.renewals;
        session_log.early.extend(log.early);
    }

    // Every key read once more, linearizably, once the faults are over.
    for (k, history) in histories.iter().enumerate() {
        if plan.register_clients == 0 {
            break;
        }
        let op = final_read(&board, &cx, k).await?;
        history.lock().push(op);
    }
    let mut register_ops = 0;
    let mut indeterminate = 0;
    let mut anomalies = Vec::new();
    for (k, history) in histories.iter().enumerate() {
        let ops = history.lock().clone();
        register_ops += ops.len();
        indeterminate += ops.iter().filter(|o| o.output.is_none()).count();
        if let Err(anomaly) = linear::check(&ops) {
            anomalies.push((clients::register_key(k), anomaly));
        }
    }
    drop(nemesis);
    Ok(Report {
        plan: plan.clone(),
        elapsed: started.elapsed(),
        faults: applied,
        left_out,
        register_ops,
        indeterminate,
        anomalies,
        locks,
        sessions: session_log,
    })
}

/// A linearizable read of register `k`, retried through the agents until one answers.
async fn final_read(board: &AgentBoard, cx: &Ctx, k: usize) -> anyhow::Result<Op> {
    let key = clients::register_key(k);
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        for base in board.up() {
            let client = crate::safety::register::client(&cx.config, &base);
            let call = cx.now();
            let read = tokio::time::timeout(
                cx.deadline,
                client.kv_get(&key, ReadOpts::default().consistent()),
            )
            .await;
            if let Ok(Ok((entry, _))) = read {
                let value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
                return Ok(Op {
                    client: usize::MAX,
                    input: Input::Read,
                    output: Some(Output::Value(value)),
                    call,
                    ret: Some(cx.now()),
                });
            }
        }
        anyhow::ensure!(
            Instant::now() < give_up,
            "no agent answered the final read of {key}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
