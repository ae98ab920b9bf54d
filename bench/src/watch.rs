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
//!   (and so the agent's) for them, and says so and skips the shape when it cannot (a quick
//!   run, a smoke test, skips it, and its first two shapes have 2,000 and 500 watchers);
//! - under write load, on the leader (Vigil, etcd and Consul, whose blocking queries Vigil's
//!   take after): 100 watchers on distinct keys plus 1,000 on one shared key, all keys written
//!   before the watchers register, while [`LOAD_RATE`] puts a second go to keys nobody watches.
//!   The keys exist because Consul answers a blocking query on a missing key with the index of
//!   the whole KV table, so any write near it returns the query.
//!
//! Measured: the watched process's RSS growth per watcher, the time to register them, the time
//! from a write to the shared key until all of its watchers have woken, and the proof that a
//! write wakes only its own key's watchers (none of the others for the shared key; exactly its
//! own for a distinct key).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail, ensure};
use etcd_client::WatchOptions;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::socket::{setsockopt, sockopt};
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};
use vigil_client::{Client, ReadOpts};

use super::etcd::connect;
use super::load::{Latency, Schedule, Tally, histogram, pace};
use super::machine::{micros, rss_kib};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, System, Systems};

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
/// Longest an agent may take to accept a batch of watchers' connections: a guard, not a
/// measured figure (the registration time is).
const ACCEPT_LIMIT: Duration = Duration::from_secs(120);
/// The largest shape: 100,000 watchers on one client agent.
const LARGE: Shape = Shape {
    prefix: "bench/watch-large/",
    keys: 9_000,
    per_key: 10,
    shared: 10_000,
    existing: false,
};
/// Open files the harness and the agent under test need for [`LARGE`], with room to spare.
const LARGE_OPEN_FILES: u64 = 131_072;
/// Connections opened from one loopback address: one address has about 28,000 ephemeral ports
/// for connections to one server port (see [`watch_on`]).
const CONNS_PER_ADDRESS: usize = 20_000;
/// Puts a second to keys nobody watches, while the shape under load is probed.
const LOAD_RATE: usize = 1_000;
/// Concurrent writers of that load.
const LOAD_WRITERS: usize = 64;
/// Where the load writes: [`LOAD_RATE`] keys, each written once a second.
const LOAD_PREFIX: &str = "bench/watch-writes/";
/// Watchers of distinct keys in the shape under load (beside the shared key's).
const LOADED_KEYS: usize = 100;

/// Beside the leader rows that have a Consul figure.
const CONSUL_KEYS_NOTE: &str = "Consul's watchers watch keys written before they register \
    (Vigil's and etcd's watch missing keys): Consul answers a blocking query on a missing key \
    with the whole KV table's index, so the write to the shared key would also return every \
    watcher of the other keys. Its figures are of the same watchers on existing keys.";

/// Beside the rows under load.
const LOADED_NOTE: &str = "Measured on the leader while 64 writers put 1,000 writes a \
    second (paced, spread evenly; the rate they reached is under \"Watch fan-out: who wakes\") \
    to keys nobody watches, through the same client as the write that wakes the watchers. \
    The watched keys exist before the watchers register: Consul answers a blocking query on a \
    missing key with the whole KV table's index, so any nearby write would return it. Vigil and \
    Consul: one blocking query, so one HTTP connection, per watcher (the same code for both); \
    etcd: one watch per key on one gRPC stream.";

/// Who watches what: `keys` distinct keys watched by `per_key` watchers each, and `shared`
/// more watchers on one shared key, all under `prefix` (each shape its own, so that no shape
/// watches a key another one wrote).
#[derive(Debug, Clone, Copy, Serialize)]
struct Shape {
    prefix: &'static str,
    keys: usize,
    per_key: usize,
    shared: usize,
    /// Every watched key is written before its watchers register (else all are missing).
    existing: bool,
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

    /// Writes every watched key through `write`, the shared key last (so that its index is
    /// the highest), when the shape wants them to exist.
    async fn make_keys(self, write: &Writer) -> Result<()> {
        if !self.existing {
            return Ok(());
        }
        futures::stream::iter(0..self.keys)
            .map(|i| write(self.key(i), MADE.to_vec()))
            .buffer_unordered(LOAD_WRITERS)
            .try_collect::<Vec<()>>()
            .await?;
        write(self.key(self.distinct()), MADE.to_vec()).await
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
    /// The puts a second to other keys the load reached while the watchers were probed.
    pub load_writes_per_second: Option<f64>,
}

impl FanOut {
    /// The watched process's growth in MB (10⁶ bytes).
    fn growth_mb(&self) -> f64 {
        self.rss_after_kib.saturating_sub(self.rss_before_kib) as f64 * 1024.0 / 1e6
    }
}

/// One figure of a fan-out.
type Figure = fn(&FanOut) -> f64;

/// A watcher woke (its index) at an instant.
type Wake = (usize, Instant);

/// Puts a value to a key, through one system's client. The value matters: Consul leaves a key
/// whose value, flags and session a put does not change as it was (its index, its watchers).
type Writer = Arc<dyn Fn(String, Vec<u8>) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// What [`Shape::make_keys`] writes; the probe's writes differ from it.
const MADE: &[u8] = b"made";

/// A writer through Vigil's (or Consul's) HTTP API.
fn http_writer(client: &Client) -> Writer {
    let client = client.clone();
    Arc::new(move |key, value| {
        let client = client.clone();
        async move {
            ensure!(client.kv_put(&key, &value, 0).await?, "put refused");
            Ok(())
        }
        .boxed()
    })
}

/// A writer through etcd's client.
fn etcd_writer(client: &etcd_client::Client) -> Writer {
    let client = client.clone();
    Arc::new(move |key, value| {
        let mut client = client.clone();
        async move {
            client.put(key, value, None).await?;
            Ok(())
        }
        .boxed()
    })
}

/// [`LOAD_RATE`] puts a second to keys nobody watches, until stopped.
struct Load {
    writers: JoinSet<()>,
    tally: Arc<Tally>,
    started: Instant,
}

impl Load {
    fn start(write: Writer) -> Load {
        let tally = Arc::new(Tally::default());
        let counts = tally.clone();
        let schedule = Schedule {
            start: Instant::now(),
            period: Duration::from_secs(1),
            n: LOAD_RATE,
        };
        let writers = pace(schedule, LOAD_WRITERS, move |i| {
            // Each put changes its key's value: the count of puts so far.
            let value = counts.done().to_string().into_bytes();
            let (put, tally) = (write(format!("{LOAD_PREFIX}{i}"), value), counts.clone());
            Some(async move {
                match put.await {
                    Ok(()) => drop(tally.done.fetch_add(1, Ordering::Relaxed)),
                    Err(e) => tally.fail(&e),
                }
            })
        });
        Load {
            writers,
            tally,
            started: Instant::now(),
        }
    }

    /// Stops the writers; the puts a second they made.
    fn stop(self) -> Result<f64> {
        let seconds = self.started.elapsed().as_secs_f64();
        drop(self.writers);
        self.tally.verdict("the background puts")?;
        Ok(self.tally.done() as f64 / seconds)
    }
}

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
    /// What puts the load beside the probe, for a shape under load.
    load: Option<Writer>,
}

impl Probe {
    fn new(
        shape: Shape,
        pid: u32,
        rss_before: u64,
        started: Instant,
        load: Option<Writer>,
    ) -> Probe {
        Probe {
            shape,
            pid,
            rss_before,
            started,
            load,
        }
    }

    /// Once every watcher is registered: starts the load (if any), lets them settle, counts
    /// early returns, then wakes the shared key's watchers and one distinct key's through
    /// `write`, and stops the load.
    async fn run<W, Fut>(&self, rx: &mut mpsc::UnboundedReceiver<Wake>, write: W) -> Result<FanOut>
    where
        W: FnMut(String) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let register_seconds = self.started.elapsed().as_secs_f64();
        let load = self.load.clone().map(Load::start);
        sleep(QUIET).await;
        let rss_after = rss_kib(self.pid)?;
        let early_returns = collect(rx, Duration::ZERO, |_| false).await.len();
        let woken = self.wake(rx, write).await;
        let load_writes_per_second = load.map(Load::stop).transpose()?;
        let (shared_wake, others, woken) = woken?;
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
            load_writes_per_second,
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
    // The port is picked at connect time, unique per source and destination: a `bind` with
    // port 0 would reserve one of the machine's ~28,000 ephemeral ports for this watcher
    // alone, and a closed watcher's port stays reserved for a minute (TIME-WAIT, on this side,
    // which closes first). The leader shapes of Vigil and Consul left 20,000 so reserved, and
    // the shape through a client agent then ran out at about 8,300 watchers, and every other
    // new connection on the machine with it ("cannot assign requested address").
    setsockopt(&socket, sockopt::IpBindAddressNoPort, &true)?;
    socket.bind(SocketAddr::new(local, 0))?;
    let mut stream = socket.connect(server).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {server}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut status = [0; 12];
    stream.read_exact(&mut status).await?;
    if &status == b"HTTP/1.1 200" {
        return Ok(());
    }
    // What it answered instead, as far as the first few hundred bytes or a second go.
    let mut rest = [0; 512];
    let read = timeout(QUIET, stream.read(&mut rest))
        .await
        .unwrap_or(Ok(0))?;
    bail!(
        "answered {}",
        String::from_utf8_lossy(&[&status[..], &rest[..read]].concat()).replace("\r\n", " | ")
    )
}

/// Watchers whose read failed (anything but a `200`): how many, and the first one's error.
#[derive(Default)]
struct Failed(parking_lot::Mutex<Option<(usize, String)>>);

impl Failed {
    fn record(&self, error: &anyhow::Error) {
        let mut failed = self.0.lock();
        match &mut *failed {
            Some((n, _)) => *n += 1,
            None => *failed = Some((1, format!("{error:#}"))),
        }
    }

    /// `; N watchers' reads failed, the first: <error>`, or nothing when none did.
    fn describe(&self) -> String {
        self.0
            .lock()
            .as_ref()
            .map_or_else(String::new, |(n, first)| {
                format!("; {n} watchers' reads failed, the first: {first}")
            })
    }
}

/// Blocking queries of `shape` on the Vigil (or Consul) agent at `addr` (process `pid`, which
/// `client` writes through), each on its own connection; `load`: whether the probe runs under
/// write load.
async fn http_watchers(
    client: &Client,
    addr: SocketAddr,
    pid: u32,
    shape: Shape,
    load: bool,
) -> Result<FanOut> {
    let writer = http_writer(client);
    shape.make_keys(&writer).await?;
    // Block past the current index (what a read of the missing shared key reports), or past
    // the shared key's, the last one written.
    let (_, meta) = client
        .kv_get(&shape.key(shape.distinct()), ReadOpts::default())
        .await?;
    let rss_before = rss_kib(pid)?;
    let fds_before = open_files(pid)?;
    let started = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let failed = Arc::new(Failed::default());
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
        let (tx, failures) = (tx.clone(), Arc::clone(&failed));
        watchers.spawn(async move {
            // A failed read is no wakeup: the probe then finds a watcher missing.
            match watch_on(addr, local.into(), path).await {
                Ok(()) => {
                    let _ = tx.send((i, Instant::now()));
                }
                Err(e) => failures.record(&e),
            }
        });
        if (i + 1) % BATCH == 0 || i + 1 == total {
            // Let the agent accept this batch before opening more connections (give or take
            // a few descriptors it opens or closes for other reasons).
            let want = (fds_before + i + 1).saturating_sub(FD_SLACK);
            let deadline = Instant::now() + ACCEPT_LIMIT;
            while open_files(pid)? < want {
                if Instant::now() >= deadline {
                    bail!(
                        "the agent accepted {} of {want} connections{}",
                        open_files(pid)?,
                        failed.describe()
                    );
                }
                sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let load = load.then(|| writer.clone());
    let fan_out = Probe::new(shape, pid, rss_before, started, load)
        .run(&mut rx, |key| writer(key, b"woken".to_vec()))
        .await
        .with_context(|| format!("watchers{}", failed.describe()))?;
    watchers.shutdown().await;
    Ok(fan_out)
}

/// etcd's watches of `shape` on its leader; `load`: whether the probe runs under write load.
async fn etcd(leaders: &Leaders, shape: Shape, load: bool) -> Result<FanOut> {
    let total = shape.total();
    let mut client = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    let writer = etcd_writer(&client);
    shape.make_keys(&writer).await?;
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
    let load = load.then(|| writer.clone());
    let fan_out = Probe::new(shape, pid, rss_before, started, load)
        .run(&mut rx, |key| writer(key, b"woken".to_vec()))
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
        existing: false,
    }
}

/// The shape probed under write load: [`LOADED_KEYS`] watchers on distinct keys and the
/// plan's on one shared key, every key written first.
fn loaded_shape(plan: &Plan) -> Shape {
    Shape {
        prefix: "bench/watch-loaded/",
        keys: LOADED_KEYS,
        per_key: 1,
        shared: plan.watchers_shared,
        existing: true,
    }
}

/// Vigil's, etcd's and (where it runs) Consul's fan-out.
type Three = (FanOut, FanOut, Option<FanOut>);

/// `shape` on each system's leader (Consul's `consul_shape`), under write load if `load`; the
/// phases are `<what>, <system>`.
async fn on_leaders(
    outcome: &mut Outcome,
    leaders: &Leaders,
    what: &str,
    [shape, consul_shape]: [Shape; 2],
    load: bool,
) -> Result<Three> {
    let (vigil, consul) = leaders.http_clients()?;
    let consul_leader = match (&leaders.consul, leaders.consul_pid) {
        (Some((addr, _)), Some(pid)) => Some((addr.parse::<SocketAddr>()?, pid)),
        _ => None,
    };
    outcome
        .each_system(what, leaders, |system| {
            match (system, &consul, consul_leader) {
                (System::Vigil, ..) => {
                    let (addr, pid) = (leaders.vigil_addr, leaders.vigil_pid);
                    http_watchers(&vigil, addr, pid, shape, load).boxed_local()
                }
                (System::Etcd, ..) => etcd(leaders, shape, load).boxed_local(),
                (System::Consul, Some(client), Some((addr, pid))) => {
                    http_watchers(client, addr, pid, consul_shape, load).boxed_local()
                }
                (System::Consul, ..) => async { Err(anyhow!("no Consul cluster")) }.boxed_local(),
            }
        })
        .await
}

/// The leader shape (Consul's with its keys written first), then the same shape through a
/// client agent (Vigil), then the shape under write load.
async fn small(plan: &Plan, outcome: &mut Outcome) -> Result<(Three, FanOut, Three)> {
    let shape = small_shape(plan, "bench/watch/");
    let systems = Systems::start(1).await?;
    sleep(SETTLE).await;
    let leaders = systems.leaders().await?;
    let consul_shape = Shape {
        existing: true,
        ..shape
    };
    let what = "Watch fan-out";
    let on_leader = on_leaders(outcome, &leaders, what, [shape, consul_shape], false).await?;
    let (addr, pid) = client_agent(&systems)?;
    let agent = outcome
        .metered(
            "Watch fan-out through a client agent, Vigil",
            &leaders.vigil_pids,
            http_watchers(
                &Client::new(&addr.to_string())?,
                addr,
                pid,
                small_shape(plan, "bench/watch-agent/"),
                false,
            ),
        )
        .await?;
    let loaded = loaded_shape(plan);
    let what = "Watch fan-out under 1,000 puts/s";
    let under_load = on_leaders(outcome, &leaders, what, [loaded; 2], true).await?;
    systems.stop().await;
    Ok((on_leader, agent, under_load))
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
            http_watchers(&client, addr, pid, LARGE, false),
            etcd(&leaders, LARGE, false),
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
        f.load_writes_per_second.map_or_else(|| "—".to_owned(), num),
    ]
}

/// The rows `<id>.all_woken` and `<id>.register` of a shape run on each system.
fn timing_rows(id: &str, workload: &str, v: &FanOut, e: &FanOut, c: Option<&FanOut>) -> [Row; 2] {
    let all_woken = |f: &FanOut| f.shared_wake.max_ms;
    let register = |f: &FanOut| f.register_seconds;
    [
        Row::new(
            format!("{id}.all_woken"),
            workload,
            "write → all its watchers woken (ms)",
            Better::Lower,
            Some(all_woken(v)),
            Some(all_woken(e)),
        )
        .with_consul(c.map(all_woken)),
        Row::new(
            format!("{id}.register"),
            workload,
            "time to register every watcher (s)",
            Better::Lower,
            Some(register(v)),
            Some(register(e)),
        )
        .with_consul(c.map(register)),
    ]
}

/// Runs on fresh clusters: a server's RSS is only comparable from a settled, empty start (Go's
/// heap in particular still holds earlier workloads' garbage).
pub async fn workload(plan: &Plan) -> Result<Outcome> {
    // Before any cluster starts, so that the agents inherit it.
    let large_limit = if plan.quick {
        Err(anyhow!("not in a quick run"))
    } else {
        raise_open_files(LARGE_OPEN_FILES)
    };
    let mut outcome = Outcome::default();
    let ((v, e, c), agent, (lv, le, lc)) = small(plan, &mut outcome).await?;
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
        )
        .with_consul(c.as_ref().map(|c| c.rss_per_watcher_bytes)),
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
    rows.extend(timing_rows("watch", &workload, &v, &e, c.as_ref()));
    if c.is_some() {
        for row in rows.iter_mut().filter(|r| r.consul.is_some()) {
            row.note = Some(CONSUL_KEYS_NOTE.to_owned());
        }
    }
    let under_load = loaded_shape(plan);
    let loaded_workload = format!(
        "Watch fan-out under {LOAD_RATE} puts/s to other keys: {}",
        under_load.describe()
    );
    let figures: [(&str, &str, Figure); 2] = [
        ("all_woken", "write → all its watchers woken (ms)", |f| {
            f.shared_wake.max_ms
        }),
        ("p50", "write → a watcher woken, p50 (ms)", |f| {
            f.shared_wake.p50_ms
        }),
    ];
    for (name, metric, figure) in figures {
        let id = format!("watch.loaded.{name}");
        let row = Row::new(
            id,
            &loaded_workload,
            metric,
            Better::Lower,
            Some(figure(&lv)),
            Some(figure(&le)),
        );
        rows.push(
            row.with_consul(lc.as_ref().map(figure))
                .with_note(LOADED_NOTE),
        );
    }
    let mut table_rows = vec![
        line("Vigil, on the leader", shape, &v),
        line("Vigil, through a client agent", shape, &agent),
        line("etcd", shape, &e),
    ];
    table_rows.extend(
        c.as_ref()
            .map(|c| line("Consul, on the leader (keys written first)", shape, c)),
    );
    table_rows.extend([
        line("Vigil, on the leader, under load", under_load, &lv),
        line("etcd, under load", under_load, &le),
    ]);
    table_rows.extend(
        lc.as_ref()
            .map(|c| line("Consul, on the leader, under load", under_load, c)),
    );
    let mut details = json!({
        "shape": shape,
        "vigil": v,
        "vigil_client_agent": agent,
        "etcd": e,
        "consul": c,
        "under_load": { "shape": under_load, "vigil": lv, "etcd": le, "consul": lc },
    });
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
            rows.extend(timing_rows("watch.large", &workload, &v, &e, None));
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
            "puts/s to other keys meanwhile",
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The load puts [`LOAD_RATE`] a second to its own keys, and every put changes its key's
    /// value (Consul would skip a put that does not, and wake nobody).
    #[tokio::test(start_paused = true)]
    async fn the_load_puts_its_rate_and_changes_every_value() {
        let values: Arc<parking_lot::Mutex<HashMap<String, Vec<Vec<u8>>>>> = Arc::default();
        let seen = values.clone();
        let writer: Writer = Arc::new(move |key, value| {
            seen.lock().entry(key).or_default().push(value);
            async { Ok(()) }.boxed()
        });
        let load = Load::start(writer);
        sleep(Duration::from_millis(2_500)).await;
        let rate = load.stop().unwrap();
        assert!((rate - LOAD_RATE as f64).abs() < 50.0, "{rate}");
        let values = values.lock();
        assert_eq!(values.len(), LOAD_RATE);
        for (key, written) in values.iter() {
            assert!(key.starts_with(LOAD_PREFIX), "{key}");
            assert!(
                written.windows(2).all(|w| w[0] != w[1]),
                "{key}: {written:?}"
            );
        }
    }

    /// A put that fails stops nothing but fails the probe's load.
    #[tokio::test(start_paused = true)]
    async fn a_failed_put_fails_the_load() {
        let writer: Writer = Arc::new(|_, _| async { Err(anyhow!("refused")) }.boxed());
        let load = Load::start(writer);
        sleep(Duration::from_millis(100)).await;
        let error = load.stop().unwrap_err().to_string();
        assert!(error.contains("refused"), "{error}");
    }
}
