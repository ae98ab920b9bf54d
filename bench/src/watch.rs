//! Blocking-query fan-out: 10,000 idle watchers on distinct (missing) keys plus 1,000 on one
//! shared key, all on the leader, each in the form its system's clients use — Vigil: one
//! blocking `GET /v1/kv/<key>?index=&wait=` per watcher, so one HTTP connection each, as Consul
//! clients do; etcd: one watch per key, all multiplexed on one gRPC watch stream, as etcd's
//! clients do. Measured: the leader's RSS growth per watcher, the time from a write to the
//! shared key until all of its watchers have woken, and the proof that a write wakes only its
//! own key's watchers (none of the other 10,999 for the shared key; exactly one for a distinct
//! key).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use etcd_client::WatchOptions;
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};
use vigil_client::{Client, ReadOpts};

use super::etcd::connect;
use super::load::{Latency, histogram};
use super::machine::{micros, rss_kib};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, Systems};

const PREFIX: &str = "bench/watch/";
/// Vigil watchers block this long (far past the workload's length).
const BLOCK: Duration = Duration::from_secs(300);
/// Watchers registered before waiting for the server to have accepted them.
const BATCH: usize = 1_000;
/// Descriptors the leader may have closed meanwhile (idle connections of earlier workloads).
const FD_SLACK: usize = 64;
/// Idle time before the first memory reading.
const SETTLE: Duration = Duration::from_secs(3);
/// How long to watch for wakeups that must not happen.
const QUIET: Duration = Duration::from_secs(1);
/// Longest a wakeup may take.
const WAKE_LIMIT: Duration = Duration::from_secs(30);

/// What one system did with the watchers.
#[derive(Debug, Clone, Serialize)]
pub struct FanOut {
    pub watchers: usize,
    pub register_seconds: f64,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub rss_per_watcher_bytes: f64,
    /// Watchers that returned before any write (should be 0).
    pub early_returns: usize,
    /// From the write to the shared key until each of its watchers woke.
    pub shared_wake: Latency,
    /// Watchers on other keys woken by the write to the shared key (should be 0).
    pub others_woken_by_shared_write: usize,
    /// Watchers woken by a write to one distinct key (should be 1).
    pub woken_by_distinct_write: usize,
}

fn key(i: usize, distinct: usize) -> String {
    if i < distinct {
        format!("{PREFIX}k/{i}")
    } else {
        format!("{PREFIX}shared")
    }
}

/// A watcher woke (its index) at an instant.
type Wake = (usize, Instant);

/// Collects wakes for `limit`, or until `done` says the set is complete.
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Wake>,
    limit: Duration,
    mut done: impl FnMut(&[Wake]) -> bool,
) -> Vec<Wake> {
    let deadline = Instant::now() + limit;
    let mut wakes = Vec::new();
    while !done(&wakes) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(wake)) => wakes.push(wake),
            Ok(None) | Err(_) => break,
        }
    }
    wakes
}

/// Writes the shared key and one distinct key, and sorts out who woke.
struct Probe {
    distinct: usize,
    shared: usize,
    /// The watched server process, and its RSS before any watcher registered.
    pid: u32,
    rss_before: u64,
    /// When registering began.
    started: Instant,
}

impl Probe {
    fn new(plan: &Plan, pid: u32, rss_before: u64, started: Instant) -> Probe {
        Probe {
            distinct: plan.watchers_distinct,
            shared: plan.watchers_shared,
            pid,
            rss_before,
            started,
        }
    }

    /// Once every watcher is registered: lets them settle, counts early returns, then wakes
    /// the shared key's watchers and one distinct key's through `write`.
    async fn run<W, Fut>(&self, rx: &mut mpsc::UnboundedReceiver<Wake>, write: W) -> Result<FanOut>
    where
        W: FnMut(String) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let register_seconds = self.started.elapsed().as_secs_f64();
        sleep(QUIET).await;
        let rss_after = rss_kib(self.pid)?;
        let early_returns = collect(rx, Duration::ZERO, |_| false).await.len();
        let (shared_wake, others, woken) = self.wake(rx, write).await?;
        let total = self.distinct + self.shared;
        Ok(FanOut {
            watchers: total,
            register_seconds,
            rss_before_kib: self.rss_before,
            rss_after_kib: rss_after,
            rss_per_watcher_bytes: per_watcher(self.rss_before, rss_after, total),
            early_returns,
            shared_wake,
            others_woken_by_shared_write: others,
            woken_by_distinct_write: woken,
        })
    }

    async fn wake<W, Fut>(
        &self,
        rx: &mut mpsc::UnboundedReceiver<Wake>,
        mut write: W,
    ) -> Result<(Latency, usize, usize)>
    where
        W: FnMut(String) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let distinct = self.distinct;
        let is_shared = |i: usize| i >= distinct;
        let written = Instant::now();
        write(key(distinct, distinct)).await?;
        let shared_count = self.shared;
        let mut wakes = collect(rx, WAKE_LIMIT, |w| {
            w.iter().filter(|(i, _)| is_shared(*i)).count() == shared_count
        })
        .await;
        wakes.extend(collect(rx, QUIET, |_| false).await);
        let mut hist = histogram();
        let mut others = 0;
        for (i, at) in &wakes {
            if is_shared(*i) {
                hist.record(micros(*at - written))?;
            } else {
                others += 1;
            }
        }
        ensure!(
            hist.len() == shared_count as u64,
            "{} of {shared_count} shared-key watchers woke",
            hist.len()
        );
        write(key(distinct / 2, distinct)).await?;
        let woken = collect(rx, WAKE_LIMIT, |w| !w.is_empty()).await;
        let woken = woken.len() + collect(rx, QUIET, |_| false).await.len();
        Ok((Latency::of(&hist), others, woken))
    }
}

async fn vigil(leaders: &Leaders, plan: &Plan) -> Result<FanOut> {
    let (distinct, total) = (
        plan.watchers_distinct,
        plan.watchers_distinct + plan.watchers_shared,
    );
    let client = Client::new(&leaders.vigil_addr.to_string())?;
    // Block past the current index (what a read of the missing shared key reports).
    let (_, meta) = client
        .kv_get(&key(distinct, distinct), ReadOpts::default())
        .await?;
    let pid = leaders.vigil_pid;
    let rss_before = rss_kib(pid)?;
    let fds_before = open_files(pid)?;
    let started = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watchers = JoinSet::new();
    for i in 0..total {
        let (client, tx, key) = (client.clone(), tx.clone(), key(i, distinct));
        watchers.spawn(async move {
            // A failed read is no wakeup: the probe then finds a watcher missing.
            let read = client.kv_get(&key, ReadOpts::blocking(meta.index, BLOCK));
            if read.await.is_ok() {
                let _ = tx.send((i, Instant::now()));
            }
        });
        if (i + 1) % BATCH == 0 || i + 1 == total {
            // Let the server accept this batch before opening more connections (give or take
            // a few descriptors the server opens or closes for other reasons).
            let want = (fds_before + i + 1).saturating_sub(FD_SLACK);
            let deadline = Instant::now() + WAKE_LIMIT;
            while open_files(pid)? < want {
                if Instant::now() >= deadline {
                    bail!(
                        "the Vigil leader accepted {} of {want} connections",
                        open_files(pid)?
                    );
                }
                sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let fan_out = Probe::new(plan, pid, rss_before, started)
        .run(&mut rx, |key| {
            let client = client.clone();
            async move {
                ensure!(client.kv_put(&key, b"x", 0).await?, "put refused");
                Ok(())
            }
        })
        .await?;
    watchers.shutdown().await;
    Ok(fan_out)
}

async fn etcd(leaders: &Leaders, plan: &Plan) -> Result<FanOut> {
    let (distinct, total) = (
        plan.watchers_distinct,
        plan.watchers_distinct + plan.watchers_shared,
    );
    let mut client = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    let pid = leaders.etcd_pid;
    let rss_before = rss_kib(pid)?;
    let started = Instant::now();
    let stream = client.watch(key(0, distinct), None).await?;
    let (mut requests, mut responses) = stream.split();
    // Watch IDs are handed out in the order the watches were created on the stream.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (created_tx, mut created_rx) = mpsc::unbounded_channel::<i64>();
    let reader = tokio::spawn(async move {
        let mut index_of: HashMap<i64, usize> = HashMap::new();
        while let Ok(Some(resp)) = responses.message().await {
            if resp.created() {
                index_of.insert(resp.watch_id(), index_of.len());
                let _ = created_tx.send(resp.watch_id());
            }
            if !resp.events().is_empty()
                && let Some(&i) = index_of.get(&resp.watch_id())
            {
                let _ = tx.send((i, Instant::now()));
            }
        }
    });
    for i in 1..total {
        requests
            .watch(key(i, distinct), Some(WatchOptions::new()))
            .await?;
    }
    for _ in 0..total {
        timeout(WAKE_LIMIT, created_rx.recv())
            .await
            .context("etcd did not create every watch in time")?
            .context("the watch stream ended")?;
    }
    let fan_out = Probe::new(plan, pid, rss_before, started)
        .run(&mut rx, |key| {
            let mut client = client.clone();
            async move {
                client.put(key, "x", None).await?;
                Ok(())
            }
        })
        .await?;
    drop(requests);
    reader.abort();
    Ok(fan_out)
}

fn per_watcher(before_kib: u64, after_kib: u64, watchers: usize) -> f64 {
    after_kib.saturating_sub(before_kib) as f64 * 1024.0 / watchers as f64
}

/// Open file descriptors of a process (its accepted connections among them).
fn open_files(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("list /proc/{pid}/fd"))?
        .count())
}

/// Runs on fresh clusters: a server's RSS is only comparable from a settled, empty start (Go's
/// heap in particular still holds earlier workloads' garbage).
pub async fn workload(plan: &Plan) -> Result<Outcome> {
    let systems = Systems::start(0).await?;
    sleep(SETTLE).await;
    let leaders = systems.leaders().await?;
    let mut outcome = Outcome::default();
    let (v, e) = outcome
        .side_by_side(
            "Watch fan-out",
            &leaders,
            vigil(&leaders, plan),
            etcd(&leaders, plan),
        )
        .await?;
    systems.stop().await;
    let workload = format!(
        "Watch fan-out: {} idle watchers + {} on one key",
        plan.watchers_distinct, plan.watchers_shared
    );
    let rows = vec![
        Row::new(
            "watch.rss_per_watcher",
            &workload,
            "leader RSS per watcher (bytes)",
            Better::Lower,
            Some(v.rss_per_watcher_bytes),
            Some(e.rss_per_watcher_bytes),
        ),
        Row::new(
            "watch.all_woken",
            &workload,
            "write → all its watchers woken (ms)",
            Better::Lower,
            Some(v.shared_wake.max_ms),
            Some(e.shared_wake.max_ms),
        ),
        Row::new(
            "watch.register",
            &workload,
            "time to register every watcher (s)",
            Better::Lower,
            Some(v.register_seconds),
            Some(e.register_seconds),
        ),
    ];
    let line = |name: &str, f: &FanOut| {
        vec![
            name.to_owned(),
            f.watchers.to_string(),
            num(f.rss_per_watcher_bytes),
            num(f.shared_wake.p50_ms),
            num(f.shared_wake.max_ms),
            f.early_returns.to_string(),
            f.others_woken_by_shared_write.to_string(),
            f.woken_by_distinct_write.to_string(),
        ]
    };
    let table = Table {
        title: "Watch fan-out: who wakes".to_owned(),
        header: [
            "system",
            "watchers",
            "RSS / watcher (bytes)",
            "shared-key wake p50 ms",
            "all woken ms",
            "woke before any write",
            "others woken by the shared write (want 0)",
            "woken by a write to one distinct key (want 1)",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: vec![line("Vigil", &v), line("etcd", &e)],
    };
    Ok(Outcome {
        rows,
        tables: vec![table],
        details: json!({ "vigil": v, "etcd": e }),
        ..outcome
    })
}
