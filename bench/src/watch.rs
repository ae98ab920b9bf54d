//! Blocking-query fan-out, each watcher in the form its system's clients use — Vigil: one
//! blocking `GET /v1/kv/<key>?index=&wait=` per watcher, so one HTTP connection each, as Consul
//! clients do; etcd: one watch per key, all multiplexed on one gRPC watch stream, as etcd's
//! clients do. Three shapes, each on fresh clusters:
//!
//! - on the leader: 10,000 idle watchers on distinct (missing) keys plus 1,000 on one shared key;
//! - the same through a Vigil client agent, whose RSS is measured (etcd has no agent: its
//!   figure is the leader's of the first shape, where etcd keeps its watches);
//! - 100,000 watchers on one client agent: 9,000 keys watched by 10 each plus 10,000 on one
//!   shared key (etcd: the same watches on its leader). The harness raises its open file limit
//!   (and so the agent's) for them, and says so and skips the shape when it cannot.
//!
//! Measured: the watched process's RSS growth per watcher, the time to register them, the time
//! from a write to the shared key until all of its watchers have woken, and the proof that a
//! write wakes only its own key's watchers (none of the others for the shared key; exactly its
//! own for a distinct key).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use etcd_client::WatchOptions;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};
use vigil_client::{Client, ReadOpts};

use super::etcd::connect;
use super::load::{Latency, histogram};
use super::machine::{micros, rss_kib};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, Systems};

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
/// The largest shape: 100,000 watchers on one client agent.
const LARGE: Shape = Shape {
    prefix: "bench/watch-large/",
    keys: 9_000,
    per_key: 10,
    shared: 10_000,
};
/// Open files the harness and the agent under test need for [`LARGE`], with room to spare.
const LARGE_OPEN_FILES: u64 = 131_072;
/// Connections opened from one loopback address: one address has about 28,000 ephemeral ports
/// for connections to one server port.
const CONNS_PER_ADDRESS: usize = 20_000;

/// Who watches what: `keys` distinct keys watched by `per_key` watchers each, and `shared`
/// more watchers on one shared key, all under `prefix` (each shape its own, so that no shape
/// watches a key another one wrote).
#[derive(Debug, Clone, Copy, Serialize)]
struct Shape {
    prefix: &'static str,
    keys: usize,
    per_key: usize,
    shared: usize,
}

impl Shape {
    /// Watchers of the distinct keys, numbered before the shared key's.
    fn distinct(self) -> usize {
        self.keys * self.per_key
    }

    fn total(self) -> usize {
        self.distinct() + self.shared
    }

    /// The key watcher `i` watches.
    fn key(self, i: usize) -> String {
        if i < self.distinct() {
            format!("{}k/{}", self.prefix, i % self.keys)
        } else {
            format!("{}shared", self.prefix)
        }
    }

    fn is_shared(self, i: usize) -> bool {
        i >= self.distinct()
    }

    fn describe(self) -> String {
        if self.per_key == 1 {
            format!("{} idle watchers + {} on one key", self.keys, self.shared)
        } else {
            format!(
                "{} keys × {} idle watchers + {} on one key",
                self.keys, self.per_key, self.shared
            )
        }
    }
}

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
    /// Watchers woken by a write to one distinct key (should be that key's watchers).
    pub woken_by_distinct_write: usize,
}

impl FanOut {
    /// The watched process's growth in MB (10⁶ bytes).
    fn growth_mb(&self) -> f64 {
        self.rss_after_kib.saturating_sub(self.rss_before_kib) as f64 * 1024.0 / 1e6
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
    shape: Shape,
    /// The watched process, and its RSS before any watcher registered.
    pid: u32,
    rss_before: u64,
    /// When registering began.
    started: Instant,
}

impl Probe {
    fn new(shape: Shape, pid: u32, rss_before: u64, started: Instant) -> Probe {
        Probe {
            shape,
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
        let total = self.shape.total();
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
        let shape = self.shape;
        let written = Instant::now();
        write(shape.key(shape.distinct())).await?;
        let mut wakes = collect(rx, WAKE_LIMIT, |w| {
            w.iter().filter(|(i, _)| shape.is_shared(*i)).count() == shape.shared
        })
        .await;
        wakes.extend(collect(rx, QUIET, |_| false).await);
        let mut hist = histogram();
        let mut others = 0;
        for (i, at) in &wakes {
            if shape.is_shared(*i) {
                hist.record(micros(*at - written))?;
            } else {
                others += 1;
            }
        }
        ensure!(
            hist.len() == shape.shared as u64,
            "{} of {} shared-key watchers woke",
            hist.len(),
            shape.shared
        );
        write(shape.key(shape.keys / 2)).await?;
        let woken = collect(rx, WAKE_LIMIT, |w| w.len() >= shape.per_key).await;
        let woken = woken.len() + collect(rx, QUIET, |_| false).await.len();
        Ok((Latency::of(&hist), others, woken))
    }
}

/// One blocking `GET` written on a connection of its own from the loopback address `local`,
/// as a Consul client sends it; `Ok` when it is answered `200` (its key was written).
async fn watch_on(server: SocketAddr, local: IpAddr, path: String) -> Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(local, 0))?;
    let mut stream = socket.connect(server).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {server}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut status = [0; 12];
    stream.read_exact(&mut status).await?;
    ensure!(&status == b"HTTP/1.1 200", "answered {status:?}");
    Ok(())
}

/// Vigil's watchers of `shape` on the agent at `addr` (process `pid`, which `client` writes
/// through), each blocking on its own connection.
async fn vigil(client: &Client, addr: SocketAddr, pid: u32, shape: Shape) -> Result<FanOut> {
    // Block past the current index (what a read of the missing shared key reports).
    let (_, meta) = client
        .kv_get(&shape.key(shape.distinct()), ReadOpts::default())
        .await?;
    let rss_before = rss_kib(pid)?;
    let fds_before = open_files(pid)?;
    let started = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watchers = JoinSet::new();
    let total = shape.total();
    for i in 0..total {
        let path = format!(
            "/v1/kv/{}?index={}&wait={}s",
            shape.key(i),
            meta.index,
            BLOCK.as_secs()
        );
        // 127.0.0.2 and on: the next address once one has given this many ports.
        let local = Ipv4Addr::new(127, 0, 0, 2 + u8::try_from(i / CONNS_PER_ADDRESS)?);
        let tx = tx.clone();
        watchers.spawn(async move {
            // A failed read is no wakeup: the probe then finds a watcher missing.
            if watch_on(addr, local.into(), path).await.is_ok() {
                let _ = tx.send((i, Instant::now()));
            }
        });
        if (i + 1) % BATCH == 0 || i + 1 == total {
            // Let the agent accept this batch before opening more connections (give or take
            // a few descriptors it opens or closes for other reasons).
            let want = (fds_before + i + 1).saturating_sub(FD_SLACK);
            let deadline = Instant::now() + WAKE_LIMIT;
            while open_files(pid)? < want {
                if Instant::now() >= deadline {
                    bail!(
                        "the Vigil agent accepted {} of {want} connections",
                        open_files(pid)?
                    );
                }
                sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let fan_out = Probe::new(shape, pid, rss_before, started)
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

async fn etcd(leaders: &Leaders, shape: Shape) -> Result<FanOut> {
    let total = shape.total();
    let mut client = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    let pid = leaders.etcd_pid;
    let rss_before = rss_kib(pid)?;
    let started = Instant::now();
    let stream = client.watch(shape.key(0), None).await?;
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
            .watch(shape.key(i), Some(WatchOptions::new()))
            .await?;
    }
    for _ in 0..total {
        timeout(WAKE_LIMIT, created_rx.recv())
            .await
            .context("etcd did not create every watch in time")?
            .context("the watch stream ended")?;
    }
    let fan_out = Probe::new(shape, pid, rss_before, started)
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

/// Raises this process's open file limit (soft and hard, which the clusters it starts inherit)
/// to `wanted`; `Err` says why it cannot (raising the hard limit takes root).
fn raise_open_files(wanted: u64) -> Result<()> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= wanted {
        return Ok(());
    }
    setrlimit(Resource::RLIMIT_NOFILE, wanted, hard.max(wanted)).with_context(|| {
        format!("the open file limit is {soft} (hard {hard}) and cannot be raised to {wanted}")
    })
}

/// The address and process of client agent 0 of `systems`.
fn client_agent(systems: &Systems) -> Result<(SocketAddr, u32)> {
    let agent = systems.vigil.client(0);
    let addr = agent
        .base
        .strip_prefix("http://")
        .context("HTTP base URL")?
        .parse()?;
    Ok((addr, agent.pid().context("the client agent's process")?))
}

/// The plan's watchers on distinct keys and on one shared key, under `prefix`.
fn small_shape(plan: &Plan, prefix: &'static str) -> Shape {
    Shape {
        prefix,
        keys: plan.watchers_distinct,
        per_key: 1,
        shared: plan.watchers_shared,
    }
}

/// The leader shape (Vigil and etcd), then the same shape through a client agent (Vigil).
async fn small(plan: &Plan, outcome: &mut Outcome) -> Result<(FanOut, FanOut, FanOut)> {
    let shape = small_shape(plan, "bench/watch/");
    let systems = Systems::start(1).await?;
    sleep(SETTLE).await;
    let leaders = systems.leaders().await?;
    let client = Client::new(&leaders.vigil_addr.to_string())?;
    let (v, e) = outcome
        .side_by_side(
            "Watch fan-out",
            &leaders,
            vigil(&client, leaders.vigil_addr, leaders.vigil_pid, shape),
            etcd(&leaders, shape),
        )
        .await?;
    let (addr, pid) = client_agent(&systems)?;
    let agent = outcome
        .metered(
            "Watch fan-out through a client agent, Vigil",
            &leaders.vigil_pids,
            vigil(
                &Client::new(&addr.to_string())?,
                addr,
                pid,
                small_shape(plan, "bench/watch-agent/"),
            ),
        )
        .await?;
    systems.stop().await;
    Ok((v, e, agent))
}

/// [`LARGE`] on a client agent (Vigil) and on the leader (etcd), on fresh clusters.
async fn large(outcome: &mut Outcome) -> Result<(FanOut, FanOut)> {
    let systems = Systems::start(1).await?;
    sleep(SETTLE).await;
    let leaders = systems.leaders().await?;
    let (addr, pid) = client_agent(&systems)?;
    let client = Client::new(&addr.to_string())?;
    let result = outcome
        .side_by_side(
            "Watch fan-out, 100,000 watchers",
            &leaders,
            vigil(&client, addr, pid, LARGE),
            etcd(&leaders, LARGE),
        )
        .await;
    systems.stop().await;
    result
}

/// The "who wakes" line of one system in one shape.
fn line(name: &str, shape: Shape, f: &FanOut) -> Vec<String> {
    vec![
        name.to_owned(),
        f.watchers.to_string(),
        num(f.register_seconds),
        num(f.rss_per_watcher_bytes),
        num(f.shared_wake.p50_ms),
        num(f.shared_wake.max_ms),
        f.early_returns.to_string(),
        f.others_woken_by_shared_write.to_string(),
        format!("{} of {}", f.woken_by_distinct_write, shape.per_key),
    ]
}

/// The rows `<id>.all_woken` and `<id>.register` of a shape run on both systems.
fn timing_rows(id: &str, workload: &str, v: &FanOut, e: &FanOut) -> [Row; 2] {
    [
        Row::new(
            format!("{id}.all_woken"),
            workload,
            "write → all its watchers woken (ms)",
            Better::Lower,
            Some(v.shared_wake.max_ms),
            Some(e.shared_wake.max_ms),
        ),
        Row::new(
            format!("{id}.register"),
            workload,
            "time to register every watcher (s)",
            Better::Lower,
            Some(v.register_seconds),
            Some(e.register_seconds),
        ),
    ]
}

/// Runs on fresh clusters: a server's RSS is only comparable from a settled, empty start (Go's
/// heap in particular still holds earlier workloads' garbage).
pub async fn workload(plan: &Plan) -> Result<Outcome> {
    // Before any cluster starts, so that the agents inherit it.
    let large_limit = raise_open_files(LARGE_OPEN_FILES);
    let mut outcome = Outcome::default();
    let (v, e, agent) = small(plan, &mut outcome).await?;
    let shape = small_shape(plan, "bench/watch/");
    let workload = format!("Watch fan-out: {}", shape.describe());
    let through_agent = format!("Watch fan-out through a client agent: {}", shape.describe());
    let mut rows = vec![
        Row::new(
            "watch.rss_per_watcher",
            &workload,
            "leader RSS per watcher (bytes)",
            Better::Lower,
            Some(v.rss_per_watcher_bytes),
            Some(e.rss_per_watcher_bytes),
        ),
        Row::new(
            "watch.agent.rss_per_watcher",
            &through_agent,
            "client agent RSS per watcher (bytes; etcd: its leader's)",
            Better::Lower,
            Some(agent.rss_per_watcher_bytes),
            Some(e.rss_per_watcher_bytes),
        ),
        Row::new(
            "watch.agent.all_woken",
            &through_agent,
            "write → all its watchers woken (ms; etcd: on its leader)",
            Better::Lower,
            Some(agent.shared_wake.max_ms),
            Some(e.shared_wake.max_ms),
        ),
    ];
    rows.extend(timing_rows("watch", &workload, &v, &e));
    let mut table_rows = vec![
        line("Vigil, on the leader", shape, &v),
        line("Vigil, through a client agent", shape, &agent),
        line("etcd", shape, &e),
    ];
    let mut details = json!({ "shape": shape, "vigil": v, "vigil_client_agent": agent, "etcd": e });
    // The smaller shapes' figures stand whatever becomes of the largest.
    let largest = match large_limit {
        Ok(()) => large(&mut outcome).await,
        Err(e) => Err(e),
    };
    match largest {
        Ok((v, e)) => {
            let workload = format!("Watch fan-out on a client agent: {}", LARGE.describe());
            rows.push(Row::new(
                "watch.large.rss",
                &workload,
                "client agent RSS growth (MB; etcd: its leader's)",
                Better::Lower,
                Some(v.growth_mb()),
                Some(e.growth_mb()),
            ));
            rows.extend(timing_rows("watch.large", &workload, &v, &e));
            table_rows.push(line("Vigil, through a client agent", LARGE, &v));
            table_rows.push(line("etcd", LARGE, &e));
            details["large"] = json!({ "shape": LARGE, "vigil_client_agent": v, "etcd": e });
        }
        Err(e) => {
            eprintln!("vigil-bench: no {}-watcher row: {e:#}", LARGE.total());
            details["large"] = json!({ "skipped": format!("{e:#}") });
        }
    }
    let table = Table {
        title: "Watch fan-out: who wakes".to_owned(),
        header: [
            "system",
            "watchers",
            "register s",
            "RSS / watcher (bytes)",
            "shared-key wake p50 ms",
            "all woken ms",
            "woke before any write",
            "others woken by the shared write (want 0)",
            "woken by a write to one distinct key (want all of its)",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: table_rows,
    };
    Ok(Outcome {
        rows,
        tables: vec![table],
        details,
        ..outcome
    })
}
