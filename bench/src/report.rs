//! The results of one run: the comparison rows (Vigil's figure, etcd's, and how many times
//! better Vigil is), per-workload detail tables and raw details, CPU use per phase, the issue's
//! targets evaluated against this run, and the two renderings: `bench/results/<stamp>.json` and
//! the markdown of `docs/benchmarks.md`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::future::Future;

use anyhow::{Context, Result};
use futures::future::LocalBoxFuture;
use serde::Serialize;
use serde_json::Value;

use super::machine::{DISTURBED_PERCENT, Machine, Meter, Usage, Versions};
use super::{Leaders, System};

/// The top of `docs/benchmarks.md`: what the file is, how to rerun it, what each workload does.
pub const INTRO: &str = r#"
# Benchmarks: Vigil, etcd and Consul side by side

This file is written by `vigil-bench` (the `bench/` crate): rerun it rather than edit
it. Every figure is measured on one machine, against a 3-server Vigil cluster, a 3-member etcd
cluster (Debian's etcd 3.4, default settings) and, where it speaks the same API as Vigil, a
3-server Consul 1.8.7 cluster (Debian bullseye's, default settings), all on 127.0.0.1 with real
data directories and an fsync per commit. The machine these numbers come from has 2 cores and
is shared with other builds, so absolute figures are noisy and drift between runs: read the
ratios, which compare the systems under the same conditions at nearly the same time.

Every workload runs 3 times, each time on freshly started clusters and each time measuring the
systems in another order (Vigil → etcd → Consul, then etcd → Consul → Vigil, then Consul →
Vigil → etcd), so that neither a warming machine nor a neighbour's build favours one system
throughout. Every figure below is the median of the three, with the lowest and highest in
brackets; a ratio is computed within each repetition and then its median taken. Before each
measured phase the harness waits (up to 2 s) for other processes to use less than a quarter of
a core, then records the machine's CPU (`/proc/stat`) beside the harness's and the measured
servers'; a phase during which other processes used more is marked **disturbed** under "CPU
per phase", and its figures deserve less trust.

## How to run

```sh
scripts/install-etcd.sh    # Debian's etcd-server, plus protoc for the etcd-client crate's build
scripts/install-consul.sh  # Consul 1.8.7 from Debian bullseye (optional: its column stays empty)
cargo run --release -p vigil-bench --features etcd -- --out /tmp/mine  # full run: 3 repetitions
cargo run --release -p vigil-bench --features etcd -- --quick          # 1 repetition, ~7 min
```

The `etcd` feature brings in etcd's gRPC client, whose build needs `protoc`; it is off by
default so that `cargo test --workspace` builds without `protoc` (a `vigil-bench` built without
it only says how to rebuild it).

A full run writes `bench/results/<date>T<HHMM>Z.json` (every figure with its percentiles,
per-client counts and CPU use; named by the run's start, so a rerun never overwrites an earlier
result) and this file; `--quick` writes `bench/results/<date>T<HHMM>Z-quick.json` and prints
the tables. `--out DIR` writes under `DIR` instead of the repository: to check these figures on
your own machine without touching the committed report, run with `--out /tmp/mine` and compare
`/tmp/mine/docs/benchmarks.md` with this file. `--repetitions N` runs every workload N times
instead of 3 (1 with `--quick`). `--only WORKLOAD` (repeatable: `kv_put`,
`kv_read`, `locks`, `sessions`, `idle_sessions`, `client_agent`, `failure_detection`,
`process_and_agent_death`, `leader_failover`, `watch_fanout`, `footprint`) runs
only those and writes `<date>T<HHMM>Z[-quick]-partial.json`, never this file. `--check` (CI's smoke
test: `--quick --check --out target/bench-check`) exits non-zero when a workload produced no
figures; it never judges the figures themselves.

The harness starts the Vigil servers (the `vigil-under-test` agent binary built beside it, `lan`
gossip profile), the etcd members and the Consul servers on free loopback ports, talks to each
system's leader directly, and stops everything it started, also on failure or Ctrl-C. Every
concurrent client has its own reused connection (Vigil and Consul: the async client library of
`vigil-shared`, the same code for both; etcd: the `etcd-client` crate over gRPC). The harness
reports its own CPU use per phase, next to the servers'.

Consul's column: Consul 1.8.7 is what Debian packages (bullseye), and the newest release that
can be installed here without downloading from HashiCorp; `scripts/install-consul.sh` installs
it (root, and Debian's bullseye archive reachable), and without it the run says so and leaves
the column empty. Consul is measured where it speaks Vigil's API with the same client code: KV
puts and reads (on the leader and through a client agent), sessions and their renewal cost,
the `?acquire`/`?release` and Consul-style locks and semaphore (its own Go client's
algorithms), blocking-query fan-out, failure detection of a killed client agent, leader
failover and footprint. It has no server-side lock queue, so the fair-mutex rows have no
Consul figure.

## What each workload measures

- **KV put** (Vigil, etcd, Consul): 1, 16 and 64 clients, each putting 128-byte values to new
  keys as fast as the answers come back (closed loop); puts/s and latency p50/p99 (HDR
  histogram) after a warm-up. The keys are deleted afterwards, etcd's history is compacted up
  to that delete, and the next workload waits until every server is idle again (at most 60 s).
- **KV read** (Vigil, etcd, Consul): 1 and 64 clients reading one 128-byte key on the leader,
  in each system's linearizable mode (Vigil's and Consul's `?consistent`, which confirm
  leadership with a quorum first; etcd's default linearizable `Range`, a read index) and its
  cheaper one (Vigil's and Consul's default mode, the leader answering from its own state;
  etcd's serializable `Range`, the member asked answering from its own state). The cheaper
  modes are not linearizable on any system (a deposed leader or a lagging member may answer
  with older data): only the linearizable pair compares equal guarantees.
- **Uncontended lock cycle**: one client, acquire + release of one lock with a long-lived
  session: Vigil's `?acquire`/`?release` against etcd's `concurrency.Mutex` (lock: one
  transaction; unlock: one delete) and its v3lock `Lock`/`Unlock` RPCs. The detail table adds
  Vigil's Consul-style `Lock` recipe with the same long-lived session, and a baseline that is
  not a lock: etcd putting one key with a lease and deleting it (the two writes of a
  `concurrency.Mutex` cycle, without the owner read in its transaction). Consul: the same
  `?acquire`/`?release` cycle.
- **Contended lock**: 8 and 32 clients looping acquire → release on one lock: handoffs/s
  (acquisitions per second), acquire latency, fairness (fewest ÷ most acquisitions of one
  client), requests sent per acquisition and waiting requests woken per acquisition (Vigil:
  blocking queries that returned; etcd: watch responses carrying events). Vigil: the client
  library's Consul-style `Lock` (every waiter blocks on the lock key) and the server-side
  queue's `FairMutex` (a waiter's one request returns when the release that grants it
  commits), each client with one long-lived session; the client library counts the requests
  it sends, as the harness counts etcd's. etcd: the
  server-side v3lock `Lock` RPC and the client-side `concurrency.Mutex` algorithm of etcd's Go
  client (reimplemented over `etcd-client`), each client with one lease. Consul: the same
  Consul-style `Lock` as Vigil's, so its row sits beside "Consul-style lock vs v3lock".
  Requests per acquisition are compared with both etcd recipes: the client-side
  `concurrency.Mutex` needs 6, etcd's server-side v3lock 2, as Vigil's queue does. Every
  contended ratio against etcd carries a caveat: etcd's waiters see a release through a watch
  started at a revision they already read, which etcd files as unsynced and catches up on a
  100 ms tick, so etcd hands over about once per client per 100 ms however idle its servers
  are; the ratio measures that floor and shrinks as clients are added. A full run also sweeps
  the client count (1, 2, 4, 16 besides 8 and 32, 3 s windows) for the fair mutex, v3lock and
  the Consul-style lock on Vigil and Consul, so the rows show how each rate moves with it.
- **Locks that guard work**: the same loop with 8 clients, each holder keeping the lock 1 ms
  or 10 ms (a sleep between reading and writing back the shared counter below): handoffs/s
  and acquire p50, p99 and p99.9 for the fair mutex and the Consul-style lock against
  v3lock, Consul's Consul-style lock beside them. The hold caps every system alike (8
  contenders holding 10 ms hand over at most 100 times a second), so these rows show what is
  left of each system's overhead once the lock guards real work, and its tail.
- **Semaphore** (Vigil, Consul; etcd has none): 16 clients looping acquire → release on a
  semaphore of limit 4, by the client library's `Semaphore` (the algorithm of Consul's Go
  `api.Semaphore`: a contender key per session, the holders listed in `<prefix>/.lock` and
  changed by check-and-set), each client reusing one session: acquisitions/s and acquire p50.
  A run in which more than 4 ever held it at once fails.
- **Mutual exclusion and lost updates** (every exclusive lock run, every recipe and system):
  each holder reads a counter the harness shares between contenders, yields, and writes it
  back one higher; its grant must not come while another contender holds the lock, the counter
  must equal the number of acquisitions at the end, and each grant's fencing token (Vigil's
  and Consul's `LockIndex`, the queue's token, etcd's create revision or the revision of the
  v3lock grant; the raw `?acquire` cycle returns none) must be larger than the one before. A
  violation fails the run, and `--check` with it.
- **Sessions and leases** (Vigil, etcd, Consul): 16 clients creating sessions / granting
  leases (60 s TTL; a raft write each), then each renewing one (leader-only on each).
- **Idle sessions** (Vigil, etcd, Consul): what keeping 10,000 idle sessions alive costs the
  servers. Every session (etcd: lease) has a 10 s TTL (Vigil's shortest, Consul's too) and is
  kept alive as its system's clients keep one: Vigil and Consul renew each every TTL/2 (5 s,
  as Consul's Go `api` `RenewPeriodic` does) with `PUT /v1/session/renew/<id>` to the leader
  over 32 reused connections; etcd keeps each lease alive every TTL/3 (3.3 s, as `clientv3`
  does), all on one `LeaseKeepAlive` stream. Renewals are spread evenly over the period. The
  servers' CPU (user + system from `/proc/PID/stat`, the three added up) over a 20 s window
  once every session has been renewed, less their CPU over an idle 20 s window before any
  session existed: in % of one core, and per renewal answered in the window. A renewal that
  finds its session gone fails the run. (`--quick`: 2,000 sessions, 5 s windows.)
- **Through a client agent** (Vigil, Consul; etcd has no agent): a client agent (a
  non-server agent joined to the cluster) is added to each cluster, and KV puts (1 and 64
  clients), the uncontended `?acquire`/`?release` cycle (sessions made on the agent) and the
  fair mutex (8 clients; Vigil only) are measured through it and, right after, on the leader,
  by the same code as the rows above. The rows compare the agent paths with etcd's direct
  figures (measured in the same workload); the detail table shows what the hop costs each.
- **Watch fan-out**: on fresh clusters, 10,000 idle watchers on distinct keys and 1,000 on one
  key, on the leader, each the way its system's clients watch: Vigil one blocking query, so one
  HTTP connection, per watcher; etcd one watch per key, all multiplexed on one gRPC stream. The
  leader's RSS growth per watcher, the time from a write until the last of the key's 1,000
  watchers woke, and the proof that a write wakes only its own key's watchers. Consul's
  leader gets the same watchers, as Vigil's do, but on keys written first (see below). The same
  watchers through a Vigil client agent (its RSS; etcd has no agent, so its figure is its
  leader's). Then 100,000 watchers on one client agent (9,000 keys watched by 10 each and
  10,000 on one key; etcd: the same watches on its leader), for which the harness raises its
  open file limit, and says so and skips them when it cannot. Last, on the same clusters and
  with Consul too, 100 watchers on distinct keys and 1,000 on one key of each leader while 64
  writers put 1,000 writes a second (paced) to keys nobody watches: the wake times and the
  write rate reached. Those keys are written before the watchers register, because Consul
  answers a blocking query on a missing key with the whole KV table's index, so that any
  nearby write returns it. (`--quick`: 2,000 and 500 watchers, and no 100,000.)
- **Failure detection**: a lock holder dies (`kill -9` of a Vigil client agent; an etcd client
  whose keep-alives stop and whose connection closes) → the lock is free for others. Vigil
  notices through gossip (`lan` profile: a killed agent's closed port is evidence, so no
  suspicion is waited out) and invalidates the node's sessions (lock-delay 0); etcd waits for
  the lease to expire: 3 s TTL renewed every TTL/3, the shortest that survives a 2 s pause of
  the holder, as Vigil's `lan` profile does. The same with the holder's agent stopped for good
  (SIGSTOP: silent, so Vigil's suspicion must run out; etcd cannot tell it from a death, so its
  figure is the same expiry). Then stalls that are not deaths, each round: the holder's agent
  stopped 2 s, another agent stopped 5 s and then starved of CPU 5 s (1% of a core, a cgroup
  `cpu` quota; skipped with the reason where no cgroup can be made), a follower server stopped
  4 s, each followed by 8 s to settle; every session lost by a node that was not the one
  stopped or starved 5 s is a false invalidation. Median of 3
  rounds in each repetition; the kill row runs 10 rounds in each and also reports
  their p90 and slowest round (per repetition, then the median of the repetitions), which
  stand in for a p99 (that would need a hundred rounds). Consul: a Consul client agent holding
  the lock through a session bound to its `serfHealth` (lock-delay 0) is killed, at Consul's
  default gossip timing (1 s probes, then at least 4 s of suspicion); 3 rounds in each
  repetition, its median beside the kill row.
- **Leader failover**: `kill -9` of the leader (a Vigil server; an etcd member; a Consul server) → the remaining
  two agree on a new leader (polled every 20 ms on both), and → the first write a client sent
  right after the kill succeeds (Vigil: a `PUT` through a client agent, which holds it until a
  leader answers; etcd: a `put` from a client of all three members, tried again after 1 s
  without an answer; Consul: a `PUT` to a surviving server, which forwards it to the leader
  once there is one, Consul's defaults timing the election: `raft_multiplier` 5, a 5 s
  heartbeat timeout), and → the first lock a client asked for right after the kill is granted,
  on a key nobody holds, with a session (etcd: a lease) made before the kill (Vigil and
  Consul: `?acquire` through the same client as the write; etcd: a v3lock `Lock` from a client
  of all three members, tried again after 1 s); the killed one then restarts from its data
  directory. Median of 3 rounds in each repetition.
- **Footprint**: on fresh clusters, the idle RSS of a Vigil and a Consul client agent, and the
  largest server's RSS empty and with 100,000 keys (128-byte values, 64 per transaction) and
  10,000 sessions / leases (Vigil and Consul by the same code).
- **`--quick`** (CI's smoke test of the harness, on debug builds): one repetition; besides the
  shorter windows and the smaller shapes named above, 1 round of each failure, stall and
  failover (5 kill rounds), and a footprint of 20,000 keys and 2,000 sessions.
"#;

/// Which direction is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// One compared figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Stable key (targets and scripts find rows by it), e.g. `kv_put.c64.rate`.
    pub id: String,
    pub workload: String,
    pub metric: String,
    pub better: Better,
    pub vigil: Option<f64>,
    pub etcd: Option<f64>,
    /// How many times better Vigil's figure is than etcd's (> 1: Vigil is better).
    pub vigil_advantage: Option<f64>,
    /// Consul 1.8.7's figure, where Consul speaks the same API and was measured.
    pub consul: Option<f64>,
    /// How many times better Vigil's figure is than Consul's.
    pub vigil_vs_consul: Option<f64>,
    /// A figure etcd has no counterpart for (no etcd column expected).
    pub vigil_only: bool,
    /// Over several repetitions, the figures above are medians and this is their range.
    pub spread: Option<Spread>,
    /// A caveat the reader needs beside the ratio (the report numbers it under the table).
    pub note: Option<String>,
}

/// The lowest and highest of each figure of a row over the repetitions that measured it.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub repetitions: usize,
    pub vigil: Option<[f64; 2]>,
    pub etcd: Option<[f64; 2]>,
    pub vigil_advantage: Option<[f64; 2]>,
    pub consul: Option<[f64; 2]>,
    pub vigil_vs_consul: Option<[f64; 2]>,
}

impl Row {
    /// One row out of the same row of every repetition: each figure and each ratio is the
    /// median of the repetitions' (a ratio is taken within a repetition, then its median), and
    /// [`Row::spread`] their range.
    fn merge(runs: &[&Row]) -> Row {
        let first = runs[0].clone();
        if runs.len() == 1 {
            return first;
        }
        let of = |figure: fn(&Row) -> Option<f64>| {
            let values: Vec<f64> = runs.iter().filter_map(|r| figure(r)).collect();
            let range = values
                .iter()
                .map(|&v| [v, v])
                .reduce(|[lo, hi], [v, _]| [lo.min(v), hi.max(v)]);
            (median(values), range)
        };
        let (vigil, vigil_range) = of(|r| r.vigil);
        let (etcd, etcd_range) = of(|r| r.etcd);
        let (vigil_advantage, advantage_range) = of(|r| r.vigil_advantage);
        let (consul, consul_range) = of(|r| r.consul);
        let (vigil_vs_consul, vs_consul_range) = of(|r| r.vigil_vs_consul);
        Row {
            vigil,
            etcd,
            vigil_advantage,
            consul,
            vigil_vs_consul,
            spread: Some(Spread {
                repetitions: runs.len(),
                vigil: vigil_range,
                etcd: etcd_range,
                vigil_advantage: advantage_range,
                consul: consul_range,
                vigil_vs_consul: vs_consul_range,
            }),
            ..first
        }
    }
}

/// The middle value, or the mean of the middle two; `None` for none.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

impl Row {
    pub fn new(
        id: impl Into<String>,
        workload: impl Into<String>,
        metric: impl Into<String>,
        better: Better,
        vigil: Option<f64>,
        etcd: Option<f64>,
    ) -> Row {
        let vigil_advantage = advantage(better, vigil, etcd);
        Row {
            id: id.into(),
            workload: workload.into(),
            metric: metric.into(),
            better,
            vigil,
            etcd,
            vigil_advantage,
            consul: None,
            vigil_vs_consul: None,
            vigil_only: false,
            spread: None,
            note: None,
        }
    }

    /// The row with Consul's figure beside the others.
    pub fn with_consul(self, consul: Option<f64>) -> Row {
        Row {
            vigil_vs_consul: advantage(self.better, self.vigil, consul),
            consul,
            ..self
        }
    }

    /// The row with a caveat beside its ratios.
    pub fn with_note(self, note: &str) -> Row {
        Row {
            note: Some(note.to_owned()),
            ..self
        }
    }

    /// A Vigil figure with no etcd counterpart.
    pub fn vigil_only(
        id: impl Into<String>,
        workload: impl Into<String>,
        metric: impl Into<String>,
        better: Better,
        vigil: Option<f64>,
    ) -> Row {
        Row {
            vigil_only: true,
            ..Row::new(id, workload, metric, better, vigil, None)
        }
    }
}

/// How many times better `vigil` is than `other` (> 1: Vigil is better).
fn advantage(better: Better, vigil: Option<f64>, other: Option<f64>) -> Option<f64> {
    match (vigil, other) {
        (Some(v), Some(o)) if v > 0.0 && o > 0.0 => Some(match better {
            Better::Higher => v / o,
            Better::Lower => o / v,
        }),
        _ => None,
    }
}

/// A detail table shown under the comparison (e.g. every lock recipe's figures).
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// What one workload produced.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rows: Vec<Row>,
    pub tables: Vec<Table>,
    pub details: Value,
    pub usage: Vec<Usage>,
}

impl Outcome {
    /// Runs `work` as the phase `phase` of the processes `pids`, whose usage over it is kept.
    pub async fn metered<T>(
        &mut self,
        phase: impl Into<String>,
        pids: &[u32],
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let phase = phase.into();
        let meter = Meter::start(phase.clone(), pids).await?;
        let output = work.await.with_context(|| phase)?;
        self.usage.push(meter.stop()?);
        Ok(output)
    }

    /// Runs `measure(system)` for every system that runs, one after the other in this
    /// repetition's order ([`System::order`]), each metered on its own servers as the phase
    /// `<what>, <system>`; returns Vigil's, etcd's and (when it runs) Consul's results.
    pub async fn each_system<'a, T>(
        &mut self,
        what: &str,
        leaders: &Leaders,
        mut measure: impl FnMut(System) -> LocalBoxFuture<'a, Result<T>>,
    ) -> Result<(T, T, Option<T>)> {
        let (mut v, mut e, mut c) = (None, None, None);
        for system in System::order() {
            let Some(pids) = leaders.pids(system) else {
                continue;
            };
            let phase = format!("{what}, {system}");
            let result = self.metered(phase, pids, measure(system)).await?;
            let slot = match system {
                System::Vigil => &mut v,
                System::Etcd => &mut e,
                System::Consul => &mut c,
            };
            *slot = Some(result);
        }
        Ok((v.context("Vigil's run")?, e.context("etcd's run")?, c))
    }

    /// Runs `vigil` and `etcd` one after the other, in this repetition's order
    /// ([`System::order`]), each metered on its own system's servers as the phase
    /// `<what>, Vigil` or `<what>, etcd`.
    pub async fn side_by_side<V, E>(
        &mut self,
        what: &str,
        leaders: &Leaders,
        vigil: impl Future<Output = Result<V>>,
        etcd: impl Future<Output = Result<E>>,
    ) -> Result<(V, E)> {
        let (vigil_phase, etcd_phase) = (format!("{what}, Vigil"), format!("{what}, etcd"));
        let (v_pids, e_pids) = (&leaders.vigil_pids, &leaders.etcd_pids);
        if System::Vigil.turn() < System::Etcd.turn() {
            let v = self.metered(vigil_phase, v_pids, vigil).await?;
            let e = self.metered(etcd_phase, e_pids, etcd).await?;
            Ok((v, e))
        } else {
            let e = self.metered(etcd_phase, e_pids, etcd).await?;
            let v = self.metered(vigil_phase, v_pids, vigil).await?;
            Ok((v, e))
        }
    }
}

/// A workload that failed: no figures.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub workload: String,
    pub error: String,
}

/// One of the issue's targets, checked against this run.
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    pub target: String,
    pub row: String,
    /// The figure the target is about (Vigil's advantage, or Vigil's own value).
    pub value: Option<f64>,
    pub met: Option<bool>,
}

enum Check {
    /// Vigil's advantage over etcd at least this many times.
    AdvantageAtLeast(f64),
    /// Vigil's own figure at most this, as measured (not as the table rounds it). Per
    /// acquisition counts are taken over a window that cuts through the cycles in flight at its
    /// ends, so they can be over by up to one request per client (32 in a short quick window
    /// of a few thousand acquisitions: 2.00 shown, the target missed).
    VigilAtMost(f64),
    /// Vigil's own figure at least this.
    VigilAtLeast(f64),
}

const TARGETS: [(&str, &str, Check); 25] = [
    (
        "Holder's agent killed → lock free: p50 ≤ 0.5 s",
        "failure.lock_free",
        Check::VigilAtMost(0.5),
    ),
    (
        "Holder's agent killed → lock free: slowest round ≤ 1 s (in place of p99)",
        "failure.lock_free.max",
        Check::VigilAtMost(1.0),
    ),
    (
        "Holder's agent silent for good → lock free ≤ 3 s",
        "failure.silent_lock_free",
        Check::VigilAtMost(3.0),
    ),
    (
        "No session lost to a stall that is not a death",
        "failure.false_invalidations",
        Check::VigilAtMost(0.0),
    ),
    (
        "Application crash, process-bound session → lock free ≤ 100 ms",
        "death.process_free",
        Check::VigilAtMost(100.0),
    ),
    (
        "Agent loss: the old holder's child stopped before the next grant, every round",
        "death.agent_loss.violations",
        Check::VigilAtMost(0.0),
    ),
    (
        "A server stopped 4 s causes no election while the leader is healthy",
        "death.server_stop.elections",
        Check::VigilAtMost(0.0),
    ),
    (
        "KV puts, 1 client: p50 ≤ etcd's",
        "kv_put.c1.p50",
        Check::AdvantageAtLeast(1.0),
    ),
    (
        "KV puts/s at 64 clients ≥ 1.5× etcd",
        "kv_put.c64.rate",
        Check::AdvantageAtLeast(1.5),
    ),
    (
        "Uncontended lock cycle p50 ≤ 1 ms",
        "lock_uncontended.p50",
        Check::VigilAtMost(1.0),
    ),
    (
        "Uncontended lock cycles/s ≥ 3× etcd concurrency.Mutex",
        "lock_uncontended.rate",
        Check::AdvantageAtLeast(3.0),
    ),
    (
        "Session creates/s, 16 clients ≥ etcd lease grants/s",
        "session.create.rate",
        Check::AdvantageAtLeast(1.0),
    ),
    (
        "Contended exclusive lock, 8 clients: handoffs/s ≥ 10× etcd v3lock",
        "lock_contended.c8.fair_vs_v3lock.rate",
        Check::AdvantageAtLeast(10.0),
    ),
    (
        "Contended exclusive lock, 32 clients: handoffs/s ≥ 3× etcd v3lock",
        "lock_contended.c32.fair_vs_v3lock.rate",
        Check::AdvantageAtLeast(3.0),
    ),
    (
        "Contended exclusive lock, 8 clients: ≤ 2 requests per acquisition",
        "lock_contended.c8.requests",
        Check::VigilAtMost(2.0),
    ),
    (
        "Contended exclusive lock, 32 clients: ≤ 2 requests per acquisition",
        "lock_contended.c32.requests",
        Check::VigilAtMost(2.0),
    ),
    (
        "Contended exclusive lock, 32 clients: 1 waiter woken per release (≤ 1.05)",
        "lock_contended.c32.woken",
        Check::VigilAtMost(1.05),
    ),
    (
        "Consul-style lock, reused session, 8 clients: handoffs/s ≥ 3× etcd v3lock",
        "lock_contended.c8.lock_vs_v3lock.rate",
        Check::AdvantageAtLeast(3.0),
    ),
    (
        "Consul-style lock, reused session, 32 clients: handoffs/s ≥ 1× etcd v3lock",
        "lock_contended.c32.lock_vs_v3lock.rate",
        Check::AdvantageAtLeast(1.0),
    ),
    (
        "Shared lock, 32 readers: acquisitions/s ≥ 20× the exclusive figure",
        "lock_shared.c32.vs_exclusive",
        Check::VigilAtLeast(20.0),
    ),
    (
        "Idle blocking query on a client agent, 11,000 watchers: ≤ 4 KB each",
        "watch.agent.rss_per_watcher",
        Check::VigilAtMost(4_000.0),
    ),
    (
        "100,000 idle blocking queries on one client agent: ≤ 600 MB",
        "watch.large.rss",
        Check::VigilAtMost(600.0),
    ),
    (
        "Registering 11,000 watchers ≤ 1 s",
        "watch.register",
        Check::VigilAtMost(1.0),
    ),
    (
        "A write wakes all 1,000 watchers of its key ≤ 50 ms",
        "watch.all_woken",
        Check::VigilAtMost(50.0),
    ),
    (
        "Idle server RSS, empty cluster ≤ etcd's",
        "footprint.empty",
        Check::AdvantageAtLeast(1.0),
    ),
];

/// What one repetition of the workloads measured.
#[derive(Debug, Serialize)]
pub struct Repetition {
    /// The order in which it measured the systems.
    pub order: [System; 3],
    pub rows: Vec<Row>,
    pub tables: Vec<Table>,
    pub usage: Vec<Usage>,
    pub workloads: BTreeMap<String, Value>,
    pub failures: Vec<Failure>,
}

/// Everything one run wrote.
#[derive(Debug, Serialize)]
pub struct Report {
    /// When the run started (UTC), `YYYY-MM-DDTHH:MMZ`.
    pub date: String,
    /// `full` or `quick`.
    pub mode: String,
    pub wall_seconds: f64,
    pub machine: Machine,
    pub versions: Versions,
    pub targets: Vec<TargetResult>,
    /// Every repetition's rows merged: medians, with their range.
    pub rows: Vec<Row>,
    pub repetitions: Vec<Repetition>,
}

impl Report {
    pub fn new(date: String, mode: &str, machine: Machine, versions: Versions) -> Report {
        Report {
            date,
            mode: mode.to_owned(),
            wall_seconds: 0.0,
            machine,
            versions,
            targets: Vec::new(),
            rows: Vec::new(),
            repetitions: Vec::new(),
        }
    }

    /// Starts recording a repetition that measures the systems in `order`.
    pub fn begin_repetition(&mut self, order: [System; 3]) {
        self.repetitions.push(Repetition {
            order,
            rows: Vec::new(),
            tables: Vec::new(),
            usage: Vec::new(),
            workloads: BTreeMap::new(),
            failures: Vec::new(),
        });
    }

    fn current(&mut self) -> &mut Repetition {
        if self.repetitions.is_empty() {
            self.begin_repetition(System::order());
        }
        let last = self.repetitions.len() - 1;
        &mut self.repetitions[last]
    }

    pub fn add(&mut self, workload: &str, outcome: Outcome) {
        let repetition = self.current();
        repetition.rows.extend(outcome.rows);
        repetition.tables.extend(outcome.tables);
        repetition.usage.extend(outcome.usage);
        repetition
            .workloads
            .insert(workload.to_owned(), outcome.details);
    }

    pub fn fail(&mut self, workload: &str, error: &anyhow::Error) {
        self.current().failures.push(Failure {
            workload: workload.to_owned(),
            error: format!("{error:#}"),
        });
    }

    /// Merges the repetitions' rows (in the order they first appear) into medians and ranges,
    /// then evaluates the targets against them.
    pub fn finish(&mut self, wall_seconds: f64) {
        self.wall_seconds = wall_seconds;
        let mut ids: Vec<&str> = Vec::new();
        for row in self.repetitions.iter().flat_map(|r| &r.rows) {
            if !ids.contains(&row.id.as_str()) {
                ids.push(&row.id);
            }
        }
        self.rows = ids
            .iter()
            .map(|id| {
                let runs: Vec<&Row> = self
                    .repetitions
                    .iter()
                    .flat_map(|r| r.rows.iter().filter(|row| row.id == *id))
                    .collect();
                Row::merge(&runs)
            })
            .collect();
        self.evaluate_targets();
    }

    fn failures(&self) -> impl Iterator<Item = (usize, &Failure)> {
        self.repetitions
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.failures.iter().map(move |f| (i + 1, f)))
    }

    fn usage(&self) -> impl Iterator<Item = (usize, &Usage)> {
        self.repetitions
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.usage.iter().map(move |u| (i + 1, u)))
    }

    /// Evaluates the targets against the rows.
    fn evaluate_targets(&mut self) {
        self.targets = TARGETS
            .iter()
            .map(|(target, id, check)| {
                let row = self.rows.iter().find(|r| r.id == *id);
                let (value, met) = match check {
                    Check::AdvantageAtLeast(min) => {
                        let v = row.and_then(|r| r.vigil_advantage);
                        (v, v.map(|v| v >= *min))
                    }
                    Check::VigilAtMost(max) => {
                        let v = row.and_then(|r| r.vigil);
                        // The value as measured: 0.504 s does not meet "at most 0.5 s".
                        (v, v.map(|v| v <= *max + 1e-9))
                    }
                    Check::VigilAtLeast(min) => {
                        let v = row.and_then(|r| r.vigil);
                        (v, v.map(|v| v >= *min))
                    }
                };
                TargetResult {
                    target: (*target).to_owned(),
                    row: (*id).to_owned(),
                    value,
                    met,
                }
            })
            .collect();
    }

    /// Rows with a figure missing on either side (a workload that produced nothing), and the
    /// workloads that failed, each with its error (so that a CI log's last lines say why).
    pub fn missing(&self) -> Vec<String> {
        let mut missing: Vec<String> = self
            .rows
            .iter()
            .filter(|r| {
                // A rate of 0 means the workload did nothing.
                let ok = |v: Option<f64>| {
                    v.is_some_and(|v| v.is_finite() && (v > 0.0 || !r.id.ends_with(".rate")))
                };
                !ok(r.vigil) || (!r.vigil_only && !ok(r.etcd))
            })
            .map(|r| r.id.clone())
            .collect();
        missing.extend(
            self.failures()
                .map(|(run, f)| format!("{} (run {run}: {})", f.workload, f.error)),
        );
        missing
    }

    /// The results section of `docs/benchmarks.md`.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.machine;
        let _ = writeln!(
            md,
            "## Results: {} ({} run, {:.0} s)\n",
            self.date, self.mode, self.wall_seconds
        );
        let _ = writeln!(
            md,
            "- Machine: {} cores ({}), {:.1} GiB RAM, Linux {}, load average {:.2} at start; \
             disk fsync (4 KiB append + fdatasync) p50 {} µs, p99 {} µs.",
            m.cores,
            m.cpu_model,
            m.ram_gib,
            m.kernel,
            m.load_at_start,
            m.fsync_p50_us,
            m.fsync_p99_us
        );
        let _ = writeln!(
            md,
            "- Versions: {}; {}; {}.",
            self.versions.vigil, self.versions.etcd, self.versions.consul
        );
        let repetitions = self.repetitions.len();
        if repetitions > 1 {
            let orders: Vec<String> = self
                .repetitions
                .iter()
                .map(|r| {
                    let names: Vec<String> = r.order.iter().map(ToString::to_string).collect();
                    names.join(" → ")
                })
                .collect();
            let _ = writeln!(
                md,
                "- {repetitions} repetitions of every workload, each on fresh clusters, each \
                 measuring the systems in another order ({}). Every figure and ratio below is \
                 the median of the repetitions, with their range (lowest–highest) in \
                 brackets; a ratio is taken within a repetition, then its median.",
                orders.join("; ")
            );
        }
        let phases = self.usage().count();
        let disturbed = self.usage().filter(|(_, u)| u.disturbed).count();
        let waited = self
            .usage()
            .map(|(_, u)| u.quiet_wait_seconds)
            .fold(0.0, f64::max);
        let _ = writeln!(
            md,
            "- Quiet machine: before each measured phase the harness waits (at most {waited:.0} \
             s here) until other processes use less than {DISTURBED_PERCENT:.0}% of a core; \
             {disturbed} of {phases} phases were disturbed all the same (other processes above \
             that during the phase: **disturbed** under CPU per phase)."
        );
        if let Some((run, peak)) = self
            .usage()
            .max_by(|a, b| a.1.harness_cpu_percent.total_cmp(&b.1.harness_cpu_percent))
        {
            let _ = writeln!(
                md,
                "- Harness CPU: at most {:.0}% of one core (in \"{}\", run {run}); per phase \
                 below.",
                peak.harness_cpu_percent, peak.phase
            );
        }
        for (run, failure) in self.failures() {
            let _ = writeln!(
                md,
                "- **{} failed** (run {run}): {}",
                failure.workload,
                failure.error.replace('\n', " ")
            );
        }

        md.push_str("\n### Targets\n\n| target | this run | met |\n| --- | --: | :-: |\n");
        for t in &self.targets {
            let value = match (t.value, t.row.ends_with(".rate")) {
                (None, _) => "—".to_owned(),
                (Some(v), true) => format!("{}×", num(v)),
                (Some(v), false) => num(v),
            };
            let met = match t.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            let _ = writeln!(md, "| {} | {value} | {met} |", t.target);
        }

        md.push_str(
            "\n### Vigil, etcd and Consul\n\n\"Vigil ÷ etcd\" and \"Vigil ÷ Consul\" are how many \
             times better Vigil's figure is (higher throughput, or lower latency and memory): above \
             1 Vigil is better. Consul 1.8.7 has a figure where it speaks the same API as Vigil \
             and this run measured it.\n\n\
             | workload | metric | Vigil | etcd | Vigil ÷ etcd | Consul | Vigil ÷ Consul |\n\
             | --- | --- | --: | --: | --: | --: | --: |\n",
        );
        let mut notes: Vec<&str> = Vec::new();
        for r in &self.rows {
            let spread = r.spread.as_ref();
            let marker = match r.note.as_deref() {
                Some(note) => {
                    let n = match notes.iter().position(|n| *n == note) {
                        Some(i) => i + 1,
                        None => {
                            notes.push(note);
                            notes.len()
                        }
                    };
                    format!(" [{n}]")
                }
                None => String::new(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {}{marker} | {} | {} |",
                r.workload,
                r.metric,
                figure(r.vigil, spread.and_then(|s| s.vigil), ""),
                figure(r.etcd, spread.and_then(|s| s.etcd), ""),
                figure(
                    r.vigil_advantage,
                    spread.and_then(|s| s.vigil_advantage),
                    "×"
                ),
                figure(r.consul, spread.and_then(|s| s.consul), ""),
                figure(
                    r.vigil_vs_consul,
                    spread.and_then(|s| s.vigil_vs_consul),
                    "×"
                ),
            );
        }

        if !notes.is_empty() {
            md.push('\n');
        }
        for (i, note) in notes.iter().enumerate() {
            let _ = writeln!(md, "[{}] {note}\n", i + 1);
        }

        for table in self.tables() {
            let _ = writeln!(md, "\n### {}\n", table.title);
            let _ = writeln!(md, "| {} |", table.header.join(" | "));
            let _ = writeln!(md, "|{}", " --- |".repeat(table.header.len()));
            for row in &table.rows {
                let _ = writeln!(md, "| {} |", row.join(" | "));
            }
        }

        let _ = write!(
            md,
            "\n### CPU per phase\n\nCPU time over wall time, in % of one core: the harness \
             itself, the measured system's servers added up, the whole machine (`/proc/stat`), \
             and other processes (the machine less the harness and the measured servers: the \
             other systems' idle servers, and anything else running). A phase is **disturbed** \
             when other processes used more than {DISTURBED_PERCENT:.0}% of a core.\n\n\
             | run | phase | seconds | waited for quiet (s) | harness | servers | machine | \
             other |\n| --: | --- | --: | --: | --: | --: | --: | --: |\n"
        );
        for (run, u) in self.usage() {
            let other = if u.disturbed {
                format!("**{:.0}%, disturbed**", u.other_cpu_percent)
            } else {
                format!("{:.0}%", u.other_cpu_percent)
            };
            let _ = writeln!(
                md,
                "| {run} | {} | {:.1} | {:.1} | {:.0}% | {:.0}% | {:.0}% | {other} |",
                u.phase,
                u.wall_seconds,
                u.quiet_wait_seconds,
                u.harness_cpu_percent,
                u.servers_cpu_percent,
                u.machine_cpu_percent
            );
        }
        md
    }

    /// The detail tables, each once: over several repetitions, with every repetition's rows
    /// under a leading `run` column.
    fn tables(&self) -> Vec<Table> {
        let several = self.repetitions.len() > 1;
        let mut tables: Vec<Table> = Vec::new();
        for (i, repetition) in self.repetitions.iter().enumerate() {
            for table in &repetition.tables {
                let rows = table.rows.iter().map(|row| {
                    let run = several.then(|| (i + 1).to_string());
                    run.into_iter().chain(row.iter().cloned()).collect()
                });
                match tables.iter_mut().find(|t| t.title == table.title) {
                    Some(merged) => merged.rows.extend(rows),
                    None => {
                        let run = several.then(|| "run".to_owned());
                        tables.push(Table {
                            title: table.title.clone(),
                            header: run.into_iter().chain(table.header.clone()).collect(),
                            rows: rows.collect(),
                        });
                    }
                }
            }
        }
        tables
    }
}

/// A figure, with its range over the repetitions when there were several.
fn figure(v: Option<f64>, range: Option<[f64; 2]>, unit: &str) -> String {
    match (v, range) {
        (None, _) => "—".to_owned(),
        (Some(v), Some([lo, hi])) if lo != hi => {
            format!("{}{unit} ({}–{})", num(v), num(lo), num(hi))
        }
        (Some(v), _) => format!("{}{unit}", num(v)),
    }
}

/// A figure with as many decimals as its size deserves.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consul_figures_get_their_own_ratio() {
        let row = Row::new(
            "kv.rate",
            "KV",
            "puts/s",
            Better::Higher,
            Some(300.0),
            Some(100.0),
        )
        .with_consul(Some(150.0));
        assert_eq!(row.vigil_advantage, Some(3.0));
        assert_eq!(row.vigil_vs_consul, Some(2.0));
        let latency = Row::new(
            "kv.p50",
            "KV",
            "p50 (ms)",
            Better::Lower,
            Some(2.0),
            Some(4.0),
        )
        .with_consul(None);
        assert_eq!(latency.vigil_advantage, Some(2.0));
        assert_eq!(latency.vigil_vs_consul, None);
    }

    /// An empty report of a made-up machine.
    fn report() -> Report {
        let machine = Machine {
            cores: 2,
            cpu_model: "test".to_owned(),
            ram_gib: 1.0,
            kernel: "test".to_owned(),
            load_at_start: 0.0,
            fsync_p50_us: 1,
            fsync_p99_us: 1,
        };
        let versions = Versions {
            vigil: "v".to_owned(),
            etcd: "e".to_owned(),
            consul: "c".to_owned(),
        };
        Report::new("d".to_owned(), "full", machine, versions)
    }

    /// `--check` prints what `missing` lists: a failed workload comes with its error, so that
    /// the last lines of a CI log say why.
    #[test]
    fn a_failed_workload_is_missing_with_its_error() {
        let mut report = report();
        report.begin_repetition(System::order());
        report.fail(
            "watch_fanout",
            &anyhow::anyhow!("the agent accepted 8302 of 8951"),
        );
        report.finish(1.0);
        assert_eq!(
            report.missing(),
            ["watch_fanout (run 1: the agent accepted 8302 of 8951)"]
        );
    }

    /// Three repetitions' rows become their medians, with each figure's and ratio's range; a
    /// ratio's median is the median of the repetitions' ratios, not a ratio of medians.
    #[test]
    fn repetitions_merge_into_medians_and_ranges() {
        let mut report = report();
        for (v, e) in [(300.0, 100.0), (200.0, 200.0), (900.0, 150.0)] {
            report.begin_repetition(System::order());
            let row = Row::new("r.rate", "W", "ops/s", Better::Higher, Some(v), Some(e));
            let outcome = Outcome {
                rows: vec![row],
                ..Outcome::default()
            };
            report.add("w", outcome);
        }
        report.finish(1.0);
        let row = &report.rows[0];
        assert_eq!((row.vigil, row.etcd), (Some(300.0), Some(150.0)));
        assert_eq!(row.vigil_advantage, Some(3.0));
        let spread = row.spread.as_ref().unwrap();
        assert_eq!(spread.vigil, Some([200.0, 900.0]));
        assert_eq!(spread.vigil_advantage, Some([1.0, 6.0]));
        assert_eq!(spread.consul, None);
        let md = report.markdown();
        assert!(
            md.contains("| 300 (200–900) | 150 (100–200) | 3.00× (1.00–6.00) |"),
            "{md}"
        );
    }
}
