//! The results of one run: the comparison rows (Vigil's figure, etcd's, and how many times
//! better Vigil is), per-workload detail tables and raw details, CPU use per phase, the issue's
//! targets evaluated against this run, and the two renderings: `bench/results/<stamp>.json` and
//! the markdown of `docs/benchmarks.md`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::future::Future;

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use super::Leaders;
use super::machine::{Machine, Meter, Usage, Versions};

/// The top of `docs/benchmarks.md`: what the file is, how to rerun it, what each workload does.
pub const INTRO: &str = r#"
# Benchmarks: Vigil, etcd and Consul side by side

This file is written by `vigil-bench` (the `bench/` crate): rerun it rather than edit
it. Every figure is measured in one run, on one machine, against a 3-server Vigil cluster, a
3-member etcd cluster (Debian's etcd 3.4, default settings) and, where it speaks the same API
as Vigil, a 3-server Consul 1.8.7 cluster (Debian bullseye's, default settings), all on
127.0.0.1 with real data directories and an fsync per commit. The machine these numbers come from has 2 cores and is
shared with other builds, so absolute figures are noisy and drift between runs: read the ratios,
which compare the two systems under the same conditions at the same time.

## How to run

```sh
scripts/install-etcd.sh    # Debian's etcd-server, plus protoc for the etcd-client crate's build
scripts/install-consul.sh  # Consul 1.8.7 from Debian bullseye (optional: its column stays empty)
cargo run --release -p vigil-bench --features etcd               # full run, < 15 min
cargo run --release -p vigil-bench --features etcd -- --quick    # < 3 min
```

The `etcd` feature brings in etcd's gRPC client, whose build needs `protoc`; it is off by
default so that `cargo test --workspace` builds without `protoc` (a `vigil-bench` built without
it only says how to rebuild it).

A full run writes `bench/results/<date>T<HHMM>Z.json` (every figure with its percentiles,
per-client counts and CPU use; named by the run's start, so a rerun never overwrites an earlier
result) and this file; `--quick` writes `bench/results/<date>T<HHMM>Z-quick.json` and prints
the tables. `--out DIR` writes under `DIR` instead of the repository: to check these figures on
your own machine without touching the committed report, run with `--out /tmp/mine` and compare
`/tmp/mine/docs/benchmarks.md` with this file. `--only WORKLOAD` (repeatable: `kv_put`,
`locks`, `sessions`, `failure_detection`, `leader_failover`, `watch_fanout`, `footprint`) runs
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
puts, sessions, and the `?acquire`/`?release` and Consul-style locks (its own Go client's
algorithm). It has no server-side lock queue, so the fair-mutex rows have no Consul figure.

## What each workload measures

- **KV put** (Vigil, etcd, Consul): 1, 16 and 64 clients, each putting 128-byte values to new keys as fast as the
  answers come back (closed loop); puts/s and latency p50/p99 (HDR histogram) after a warm-up.
- **Uncontended lock cycle**: one client, acquire + release of one lock with a long-lived
  session: Vigil's `?acquire`/`?release` against etcd's `concurrency.Mutex` (lock: one
  transaction; unlock: one delete) and its v3lock `Lock`/`Unlock` RPCs. The detail table adds
  Vigil's Consul-style `Lock` recipe with the same long-lived session. Consul: the same
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
- **Sessions and leases** (Vigil, etcd, Consul): 16 clients creating sessions / granting
  leases (60 s TTL; a raft write each), then each renewing one (leader-only on each).
- **Watch fan-out**: on fresh clusters, 10,000 idle watchers on distinct keys and 1,000 on one
  key, on the leader, each the way its system's clients watch: Vigil one blocking query, so one
  HTTP connection, per watcher; etcd one watch per key, all multiplexed on one gRPC stream. The
  leader's RSS growth per watcher, the time from a write until the last of the key's 1,000
  watchers woke, and the proof that a write wakes only its own key's watchers. The same
  watchers through a Vigil client agent (its RSS; etcd has no agent, so its figure is its
  leader's). Then 100,000 watchers on one client agent (9,000 keys watched by 10 each and
  10,000 on one key; etcd: the same watches on its leader), for which the harness raises its
  open file limit, and says so and skips them when it cannot.
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
  stopped or starved 5 s is a false invalidation. Median of 5
  rounds (3 with `--quick`); the kill row runs 30 rounds (10 with `--quick`) and also reports
  their p90 and slowest round, which stands in for a p99 (that would need a hundred rounds).
- **Leader failover**: `kill -9` of the leader (a Vigil server; an etcd member) → the remaining
  two agree on a new leader (polled every 20 ms on both), and → the first write a client sent
  right after the kill succeeds (Vigil: a `PUT` through a client agent, which holds it until a
  leader answers; etcd: a `put` from a client of all three members, tried again after 1 s
  without an answer); the killed one then restarts from its data directory. Median of 5
  rounds (3 with `--quick`).
- **Footprint**: on fresh clusters, the idle RSS of a Vigil client agent, and the largest
  server's RSS empty and with 100,000 keys (128-byte values) and 10,000 sessions / leases.
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
        let meter = Meter::start(phase, pids)?;
        let output = work.await?;
        self.usage.push(meter.stop()?);
        Ok(output)
    }

    /// Runs `vigil`, then `etcd`, each metered on its own system's servers as the phase
    /// `<what>, Vigil` or `<what>, etcd`.
    pub async fn side_by_side<V, E>(
        &mut self,
        what: &str,
        leaders: &Leaders,
        vigil: impl Future<Output = Result<V>>,
        etcd: impl Future<Output = Result<E>>,
    ) -> Result<(V, E)> {
        let (vigil_phase, etcd_phase) = (format!("{what}, Vigil"), format!("{what}, etcd"));
        let v = self
            .metered(vigil_phase, &leaders.vigil_pids, vigil)
            .await?;
        let e = self.metered(etcd_phase, &leaders.etcd_pids, etcd).await?;
        Ok((v, e))
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
    /// Vigil's own figure at most this, compared as the table shows it (two decimals): per
    /// acquisition counts are taken over a window that cuts through the cycles in flight at its
    /// ends, so they are off by up to one request per client (8 in 7,000 acquisitions).
    VigilAtMost(f64),
    /// Vigil's own figure at least this.
    VigilAtLeast(f64),
}

const TARGETS: [(&str, &str, Check); 21] = [
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
    pub rows: Vec<Row>,
    pub tables: Vec<Table>,
    pub usage: Vec<Usage>,
    pub workloads: BTreeMap<String, Value>,
    pub failures: Vec<Failure>,
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
            tables: Vec::new(),
            usage: Vec::new(),
            workloads: BTreeMap::new(),
            failures: Vec::new(),
        }
    }

    pub fn add(&mut self, workload: &str, outcome: Outcome) {
        self.rows.extend(outcome.rows);
        self.tables.extend(outcome.tables);
        self.usage.extend(outcome.usage);
        self.workloads.insert(workload.to_owned(), outcome.details);
    }

    pub fn fail(&mut self, workload: &str, error: &anyhow::Error) {
        self.failures.push(Failure {
            workload: workload.to_owned(),
            error: format!("{error:#}"),
        });
    }

    /// Evaluates the targets against the rows.
    pub fn evaluate_targets(&mut self) {
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

    /// Rows with a figure missing on either side (a workload that produced nothing).
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
        missing.extend(self.failures.iter().map(|f| f.workload.clone()));
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
        if let Some(peak) = self
            .usage
            .iter()
            .max_by(|a, b| a.harness_cpu_percent.total_cmp(&b.harness_cpu_percent))
        {
            let _ = writeln!(
                md,
                "- Harness CPU: at most {:.0}% of one core (in \"{}\"); per phase below.",
                peak.harness_cpu_percent, peak.phase
            );
        }
        for failure in &self.failures {
            let _ = writeln!(
                md,
                "- **{} failed**: {}",
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
        let times = |a: Option<f64>| a.map_or_else(|| "—".to_owned(), |a| format!("{}×", num(a)));
        for r in &self.rows {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.workload,
                r.metric,
                opt(r.vigil),
                opt(r.etcd),
                times(r.vigil_advantage),
                opt(r.consul),
                times(r.vigil_vs_consul)
            );
        }

        for table in &self.tables {
            let _ = writeln!(md, "\n### {}\n", table.title);
            let _ = writeln!(md, "| {} |", table.header.join(" | "));
            let _ = writeln!(md, "|{}", " --- |".repeat(table.header.len()));
            for row in &table.rows {
                let _ = writeln!(md, "| {} |", row.join(" | "));
            }
        }

        md.push_str(
            "\n### CPU per phase\n\nCPU time over wall time, in % of one core: the harness \
             itself, and the measured system's servers added up.\n\n\
             | phase | seconds | harness CPU | servers CPU |\n| --- | --: | --: | --: |\n",
        );
        for u in &self.usage {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.0}% | {:.0}% |",
                u.phase, u.wall_seconds, u.harness_cpu_percent, u.servers_cpu_percent
            );
        }
        md
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

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_owned(), num)
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
}
