//! Lock workloads. Every contender loops acquire → release (no work while holding) until the
//! window closes; acquisitions completing inside the window count.
//!
//! - Uncontended, 1 client: the cycle (acquire + release) with a long-lived session — Vigil's
//!   `?acquire`/`?release`, etcd's `concurrency.Mutex` and its `Lock` RPC — plus Vigil's `Lock`
//!   recipe.
//! - Contended, 8 and 32 clients on one lock: handoffs/s, acquire latency, fairness (fewest and
//!   most acquisitions of one client), requests sent and waiting requests (Vigil: blocking reads
//!   and queue acquisitions) or watch events (etcd) woken per acquisition. Vigil: the
//!   Consul-style `Lock` and the server-side queue's `FairMutex`, each contender with its own
//!   client (which counts its requests) and one long-lived session; etcd: the v3lock
//!   `Lock` RPC with a lease per contender and the `concurrency.Mutex` algorithm, each contender
//!   with its own connection. The `FairMutex` runs without a holder monitor: like etcd's
//!   recipes, a contender learns of a lost lock from its session.
//! - Shared, 32 readers on one `RwLock`: acquisitions/s against the exclusive figure.
//! - Semaphore, 16 clients on a limit of 4: the client library's Consul-style `Semaphore` on
//!   Vigil and on Consul (etcd has none), each contender with one long-lived session; a run in
//!   which more than the limit hold it at once fails ([`Occupancy`]).
//!
//! Every exclusive run also checks what a lock is for ([`Exclusion`]): no grant while another
//! contender holds the lock, no lost update of a counter each holder reads and later writes
//! back (at the end it must equal the number of acquisitions), and fencing tokens that only go
//! up (Vigil's and Consul's `LockIndex` or queue token, etcd's revisions; the raw
//! `?acquire` cycle has none to check). A violation fails the run (and `--check`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::LockOptions as EtcdLockOptions;
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;
use vigil_client::{
    Client, FairMutex, Held, Lock, LockOptions, QueueOptions, RwLock, Semaphore, SemaphoreOptions,
    SessionRequest,
};

use super::etcd::connect;
use super::etcd_concurrency::{self, Counters, Session};
use super::load::{self, Latency, Window, histogram};
use super::machine::{Meter, Usage, micros, millis};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, System, Systems};

/// Lease / session TTL of every lock contender (Consul's lock default).
const SESSION_TTL: Duration = Duration::from_secs(15);
/// How long contenders may take to finish after the window closes.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// What etcd's uncontended lock figure is made of, beside its ratios.
const UNCONTENDED_NOTE: &str = "An uncontended etcd lock cycle is two raft writes one after \
    the other (the lock's transaction puts the contender's key with its lease, the unlock \
    deletes it), and it costs what those two writes cost: the baseline \"etcd put with a lease \
    + delete\" under \"Locks, every recipe\" (the same two writes, no lock) runs at the lock's \
    rate in every run so far, so the ratio measures etcd's per-write cost, not its lock recipe. \
    Those two writes cycle at a quarter to a half of etcd's 1-client puts/s: their median is \
    about two puts, and a longer tail (p99 several times a put's) pulls the mean down. The \
    185% server CPU of the 2026-11-28 single run was not seen again on fresh clusters nor \
    after compacting etcd (31-36% in the same phase).";

/// The caveat beside every contended ratio against etcd.
pub const RESYNC_NOTE: &str = "etcd's waiters (v3lock's inside the server, concurrency.Mutex's in \
    the client) learn of a release through a watch started at the revision they last read; \
    etcd files such a watch as unsynced and catches unsynced watches up once every 100 ms. So \
    each waiter that re-queues waits for that tick, and etcd hands the lock over about once \
    per client per 100 ms (≈ 10 × N per second with N clients) however idle its servers are: \
    the ratio measures that floor, and shrinks as the client count grows.";

/// How long a holder keeps the lock in the runs with a hold (the others hold it for one yield).
const HOLDS: [Duration; 2] = [Duration::from_millis(1), Duration::from_millis(10)];
/// Contenders of the runs with a hold.
const HELD_CLIENTS: usize = 8;
/// Holders a semaphore admits at once, and its contenders.
const SEMAPHORE_LIMIT: usize = 4;
const SEMAPHORE_CLIENTS: usize = 16;

/// Beside the semaphore rows.
const SEMAPHORE_NOTE: &str = "etcd has no semaphore. Vigil and Consul run the same client code, \
    the algorithm of Consul's Go api.Semaphore: each contender writes its own key under the \
    prefix, then adds its session to the holders listed in <prefix>/.lock with a check-and-set \
    while fewer than the limit hold it, waiting in a blocking query on the prefix otherwise; \
    each contender reuses one session. A run fails if more than the limit ever hold it at once.";

/// What bounds the rows with a hold, beside the resync floor.
const HOLD_NOTE: &str = "Each holder keeps the lock for the hold (a sleep between reading and \
    writing back the shared counter), so 8 contenders hand over at most 1,000 times a second \
    with a 1 ms hold and 100 with 10 ms, whatever the system; the acquire latency is mostly \
    the other holders' time. etcd's waiters still see each release only at its 100 ms \
    unsynced-watch tick (see the contended rows), which a hold of 10 ms or more hides.";

/// How a contender takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recipe {
    /// Vigil: `?acquire` / `?release` with one long-lived session.
    VigilSession,
    /// Vigil: the client library's Consul-style `Lock`, reusing one session.
    VigilLock,
    /// Vigil: the server-side queue's `FairMutex`, reusing one session.
    VigilFair,
    /// Vigil: the server-side queue's `RwLock` taken for reading, reusing one session.
    VigilShared,
    /// etcd: the server-side v3lock `Lock` / `Unlock` RPCs with one lease.
    EtcdV3Lock,
    /// Consul 1.8.7: `?acquire` / `?release` with one long-lived session, by Vigil's client.
    ConsulSession,
    /// Consul 1.8.7: the same Consul-style `Lock` as [`Recipe::VigilLock`], by Vigil's client
    /// (the algorithm of Consul's own Go client).
    ConsulLock,
    /// etcd: the `concurrency.Mutex` algorithm with one lease.
    EtcdMutex,
    /// etcd, not a lock: a put of one key with the contender's lease, then its delete — the
    /// writes of an uncontended `concurrency.Mutex` cycle without the owner read in its
    /// transaction, as a baseline for it.
    EtcdLeasePut,
    /// Vigil: the client library's Consul-style `Semaphore` ([`SEMAPHORE_LIMIT`] holders),
    /// reusing one session.
    VigilSemaphore,
    /// Consul 1.8.7: the same `Semaphore` (the algorithm of Consul's Go `api.Semaphore`).
    ConsulSemaphore,
}

impl Recipe {
    /// The system a recipe runs against.
    fn system(self) -> System {
        match self {
            Recipe::EtcdV3Lock | Recipe::EtcdMutex | Recipe::EtcdLeasePut => System::Etcd,
            Recipe::ConsulSession | Recipe::ConsulLock | Recipe::ConsulSemaphore => System::Consul,
            Recipe::VigilSession
            | Recipe::VigilLock
            | Recipe::VigilFair
            | Recipe::VigilShared
            | Recipe::VigilSemaphore => System::Vigil,
        }
    }

    /// The recipes of the systems that run, grouped by system in this repetition's order.
    fn in_turn(recipes: &[Recipe], leaders: &Leaders) -> Vec<Recipe> {
        let mut recipes: Vec<Recipe> = recipes
            .iter()
            .copied()
            .filter(|r| leaders.pids(r.system()).is_some())
            .collect();
        recipes.sort_by_key(|r| r.system().turn());
        recipes
    }

    fn label(self) -> &'static str {
        match self {
            Recipe::VigilSession => "Vigil ?acquire/?release, one session",
            Recipe::VigilLock => "Vigil Consul-style Lock, one session",
            Recipe::VigilFair => "Vigil FairMutex (server-side queue), one session",
            Recipe::VigilShared => "Vigil RwLock read (server-side queue), one session",
            Recipe::EtcdV3Lock => "etcd v3lock Lock RPC",
            Recipe::EtcdMutex => "etcd concurrency.Mutex",
            Recipe::EtcdLeasePut => "etcd put with a lease + delete (not a lock: baseline)",
            Recipe::ConsulSession => "Consul ?acquire/?release, one session",
            Recipe::ConsulLock => "Consul Consul-style Lock, one session",
            Recipe::VigilSemaphore => "Vigil Consul-style Semaphore (limit 4), one session",
            Recipe::ConsulSemaphore => "Consul Consul-style Semaphore (limit 4), one session",
        }
    }

    /// How many may hold it at once, for a semaphore.
    fn limit(self) -> Option<usize> {
        matches!(self, Recipe::VigilSemaphore | Recipe::ConsulSemaphore).then_some(SEMAPHORE_LIMIT)
    }
}

/// What one recipe measured with a number of contenders.
#[derive(Debug, Clone, Serialize)]
pub struct LockRun {
    pub recipe: Recipe,
    pub clients: usize,
    /// How long each holder kept the lock (0: one yield).
    pub hold_ms: u64,
    pub acquisitions: u64,
    pub per_second: f64,
    pub acquire: Latency,
    /// Acquire + release.
    pub cycle: Latency,
    pub min_per_client: u64,
    pub max_per_client: u64,
    pub requests_per_acquisition: Option<f64>,
    /// Blocking reads (Vigil) or watch responses with events (etcd) returned per acquisition.
    pub woken_per_acquisition: Option<f64>,
    /// Entries the leader's raft log grew by per acquisition (`None`: it could not be read).
    pub raft_entries_per_acquisition: Option<f64>,
    pub usage: Usage,
}

impl LockRun {
    /// Fewest over most acquisitions of one client (1: perfectly even).
    fn fairness(&self) -> f64 {
        if self.max_per_client == 0 {
            0.0
        } else {
            self.min_per_client as f64 / self.max_per_client as f64
        }
    }
}

/// One contender's handle on the lock.
enum Contender {
    VigilSession(KeyLock),
    /// One of the client's lock recipes, on the contender's own session.
    Vigil {
        /// Boxed: a recipe carries its options.
        recipe: Box<VigilRecipe>,
        client: Client,
        session: String,
        held: Option<Held>,
    },
    EtcdV3Lock {
        /// Boxed: an etcd client is several KiB.
        client: Box<etcd_client::Client>,
        session: Session,
        name: String,
        key: Option<Vec<u8>>,
        counters: Arc<Counters>,
    },
    EtcdMutex {
        client: Box<etcd_client::Client>,
        session: Session,
        mutex: Box<etcd_concurrency::Mutex>,
    },
    EtcdLeasePut {
        client: Box<etcd_client::Client>,
        session: Session,
        key: String,
        counters: Arc<Counters>,
    },
}

/// A key taken with `?acquire` and given back with `?release`, by one session.
struct KeyLock {
    client: Client,
    session: String,
    key: String,
}

impl KeyLock {
    async fn acquire(&self) -> Result<()> {
        let (key, session) = (&self.key, &self.session);
        if !self.client.kv_acquire(key, b"", 0, session).await?.acquired {
            bail!("uncontended acquire of {key} refused");
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let (key, session) = (&self.key, &self.session);
        if !self.client.kv_release(key, b"", 0, session).await? {
            bail!("release of {key} refused");
        }
        Ok(())
    }
}

/// The Vigil client recipe a [`Contender::Vigil`] takes.
enum VigilRecipe {
    Lock(Lock),
    Fair(FairMutex),
    /// Taken for reading.
    Shared(RwLock),
    Semaphore(Semaphore),
}

impl VigilRecipe {
    async fn acquire(&self) -> Result<Held> {
        Ok(match self {
            VigilRecipe::Lock(lock) => lock.acquire().await?,
            VigilRecipe::Fair(mutex) => mutex.acquire().await?,
            VigilRecipe::Shared(lock) => lock.read().await?,
            VigilRecipe::Semaphore(semaphore) => semaphore.acquire().await?,
        })
    }
}

impl Contender {
    /// A contender taking `recipe` with `session`; the client is handed back too.
    fn vigil(recipe: VigilRecipe, client: Client, session: String) -> (Contender, Option<Client>) {
        let contender = Contender::Vigil {
            recipe: Box::new(recipe),
            client: client.clone(),
            session,
            held: None,
        };
        (contender, Some(client))
    }

    /// Takes the lock; returns the holder's fencing token where the acquisition hands one out
    /// (a raw `?acquire` answers only `true`: its `LockIndex` would take another read).
    async fn acquire(&mut self) -> Result<Option<u64>> {
        Ok(match self {
            Contender::VigilSession(lock) => {
                lock.acquire().await?;
                None
            }
            Contender::Vigil { recipe, held, .. } => {
                let h = recipe.acquire().await?;
                let token = h.lock_index();
                *held = Some(h);
                Some(token)
            }
            Contender::EtcdV3Lock {
                client,
                session,
                name,
                key,
                counters,
            } => {
                counters.request();
                let options = EtcdLockOptions::new().with_lease(session.lease());
                let response = client.lock(name.as_str(), Some(options)).await?;
                *key = Some(response.key().to_vec());
                // The store's revision when the lock was granted: later than the release of
                // the holder before.
                let revision = response.header().context("lock header")?.revision();
                Some(u64::try_from(revision)?)
            }
            Contender::EtcdMutex { mutex, .. } => Some(u64::try_from(mutex.lock().await?)?),
            Contender::EtcdLeasePut {
                client,
                session,
                key,
                counters,
            } => {
                counters.request();
                let options = etcd_client::PutOptions::new().with_lease(session.lease());
                client.put(key.as_str(), "", Some(options)).await?;
                None
            }
        })
    }

    async fn release(&mut self) -> Result<()> {
        match self {
            Contender::VigilSession(lock) => lock.release().await?,
            Contender::Vigil { held, .. } => {
                held.take().context("not held")?.release().await?;
            }
            Contender::EtcdV3Lock {
                client,
                key,
                counters,
                ..
            } => {
                counters.request();
                client.unlock(key.take().context("not held")?).await?;
            }
            Contender::EtcdMutex { mutex, .. } => mutex.unlock().await?,
            Contender::EtcdLeasePut {
                client,
                key,
                counters,
                ..
            } => {
                counters.request();
                client.delete(key.as_str(), None).await?;
            }
        }
        Ok(())
    }

    /// Ends the contender's session (etcd leases are revoked rather than left to expire
    /// during later workloads).
    async fn close(self) -> Result<()> {
        match self {
            Contender::VigilSession(KeyLock {
                client, session, ..
            })
            | Contender::Vigil {
                client, session, ..
            } => client.session_destroy(&session).await?,
            Contender::EtcdV3Lock {
                mut client,
                session,
                ..
            }
            | Contender::EtcdMutex {
                mut client,
                session,
                ..
            }
            | Contender::EtcdLeasePut {
                mut client,
                session,
                ..
            } => {
                client.lease_revoke(session.lease()).await?;
            }
        }
        Ok(())
    }
}

/// Where contenders connect and what counts their requests.
struct Setup {
    recipe: Recipe,
    /// `key` for single-key recipes, prefix for the others.
    lock: String,
    vigil_addr: SocketAddr,
    etcd_endpoint: String,
    /// Consul's leader's HTTP address, for the Consul recipes.
    consul_addr: Option<String>,
    counters: Arc<Counters>,
}

impl Setup {
    async fn contender(&self) -> Result<(Contender, Option<Client>)> {
        let addr = match self.recipe {
            Recipe::ConsulSession | Recipe::ConsulLock | Recipe::ConsulSemaphore => self
                .consul_addr
                .clone()
                .context("no Consul cluster for a Consul recipe")?,
            _ => self.vigil_addr.to_string(),
        };
        // Every Vigil (or Consul) contender has its own client and one session (no TTL, no
        // lock-delay).
        let vigil = || async {
            let client = Client::new(&addr)?;
            let session = client
                .session_create(&SessionRequest {
                    name: "bench".to_owned(),
                    lock_delay: Some(Duration::ZERO),
                    ..SessionRequest::default()
                })
                .await?;
            anyhow::Ok((client, session))
        };
        let queue = |session: &str| {
            let mut options = QueueOptions::new(self.lock.clone());
            options.session.reuse = Some(session.to_owned());
            options.session.ttl = SESSION_TTL;
            options.monitor = false;
            options
        };
        Ok(match self.recipe {
            Recipe::VigilSession | Recipe::ConsulSession => {
                let (client, session) = vigil().await?;
                let contender = Contender::VigilSession(KeyLock {
                    client: client.clone(),
                    session,
                    key: self.lock.clone(),
                });
                (contender, Some(client))
            }
            Recipe::VigilLock | Recipe::ConsulLock => {
                let (client, session) = vigil().await?;
                let mut options = LockOptions::new(self.lock.clone());
                options.session.reuse = Some(session.clone());
                options.session.ttl = SESSION_TTL;
                let lock = Lock::new(&client, options)?;
                Contender::vigil(VigilRecipe::Lock(lock), client, session)
            }
            Recipe::VigilFair => {
                let (client, session) = vigil().await?;
                let mutex = FairMutex::new(&client, queue(&session))?;
                Contender::vigil(VigilRecipe::Fair(mutex), client, session)
            }
            Recipe::VigilShared => {
                let (client, session) = vigil().await?;
                let lock = RwLock::new(&client, queue(&session))?;
                Contender::vigil(VigilRecipe::Shared(lock), client, session)
            }
            Recipe::VigilSemaphore | Recipe::ConsulSemaphore => {
                let (client, session) = vigil().await?;
                let limit = i64::try_from(SEMAPHORE_LIMIT)?;
                let mut options = SemaphoreOptions::new(self.lock.clone(), limit);
                options.session.reuse = Some(session.clone());
                options.session.ttl = SESSION_TTL;
                let semaphore = Semaphore::new(&client, options)?;
                Contender::vigil(VigilRecipe::Semaphore(semaphore), client, session)
            }
            Recipe::EtcdV3Lock => {
                let client = connect(std::slice::from_ref(&self.etcd_endpoint)).await?;
                let session = Session::new(&client, SESSION_TTL, &self.counters).await?;
                let contender = Contender::EtcdV3Lock {
                    client: Box::new(client),
                    session,
                    name: self.lock.clone(),
                    key: None,
                    counters: self.counters.clone(),
                };
                (contender, None)
            }
            Recipe::EtcdMutex => {
                let client = connect(std::slice::from_ref(&self.etcd_endpoint)).await?;
                let session = Session::new(&client, SESSION_TTL, &self.counters).await?;
                let mutex =
                    etcd_concurrency::Mutex::new(&client, &self.lock, &session, &self.counters);
                let contender = Contender::EtcdMutex {
                    client: Box::new(client),
                    session,
                    mutex: Box::new(mutex),
                };
                (contender, None)
            }
            Recipe::EtcdLeasePut => {
                let client = connect(std::slice::from_ref(&self.etcd_endpoint)).await?;
                let session = Session::new(&client, SESSION_TTL, &self.counters).await?;
                let contender = Contender::EtcdLeasePut {
                    client: Box::new(client),
                    key: format!("{}/{:x}", self.lock, session.lease()),
                    session,
                    counters: self.counters.clone(),
                };
                (contender, None)
            }
        })
    }
}

/// What the contenders of an exclusive lock see of each other: who holds the lock by their
/// grants, a counter every holder reads, yields, then writes back one higher, and the fencing
/// tokens of successive grants. Two holders at once show as a grant while `holder` is set, and
/// lose an increment unless their reads and writes happen not to interleave; a token no larger
/// than the one before it is a grant a fenced resource would refuse (a holder that lost the
/// lock still writing, or a grant out of order).
#[derive(Default)]
struct Exclusion {
    /// The holding contender's number plus one; 0 when nobody holds the lock.
    holder: AtomicUsize,
    counter: AtomicU64,
    /// Grants that came while another contender held the lock.
    overlaps: AtomicU64,
    /// The last grant's fencing token.
    token: AtomicU64,
    /// Grants whose token was not larger than the one before.
    stale_tokens: AtomicU64,
}

impl Exclusion {
    /// Contender `c`, just granted the lock with the fencing token `token` (where its recipe
    /// hands one out), does its work under it, which takes `work` (or one yield).
    async fn hold(&self, c: usize, token: Option<u64>, work: Duration) {
        if self.holder.swap(c + 1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(token) = token
            && self.token.swap(token, Ordering::SeqCst) >= token
        {
            self.stale_tokens.fetch_add(1, Ordering::SeqCst);
        }
        let seen = self.counter.load(Ordering::SeqCst);
        if work.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(work).await;
        }
        self.counter.store(seen + 1, Ordering::SeqCst);
        let _ = self
            .holder
            .compare_exchange(c + 1, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Fails when a grant overlapped another, the counter lost an update of `cycles`, or a
    /// fencing token went backwards.
    fn verdict(&self, recipe: Recipe, cycles: u64) -> Result<()> {
        let overlaps = self.overlaps.load(Ordering::SeqCst);
        let counter = self.counter.load(Ordering::SeqCst);
        let stale = self.stale_tokens.load(Ordering::SeqCst);
        if overlaps > 0 || counter != cycles || stale > 0 {
            bail!(
                "{recipe:?} broke mutual exclusion: {overlaps} grants while held, counter \
                 {counter} after {cycles} increments, {stale} fencing tokens not above the one \
                 before"
            );
        }
        Ok(())
    }
}

/// How many contenders of a semaphore hold it at once: never more than its limit.
#[derive(Default)]
struct Occupancy {
    holding: AtomicUsize,
    most: AtomicUsize,
}

impl Occupancy {
    /// A contender, just granted a slot, holds it for one yield.
    async fn hold(&self) {
        let now = self.holding.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.holding.fetch_sub(1, Ordering::SeqCst);
    }

    /// Fails when more than `limit` held it at once.
    fn verdict(&self, recipe: Recipe, limit: usize) -> Result<()> {
        let most = self.most.load(Ordering::SeqCst);
        if most > limit {
            bail!("{recipe:?} let {most} contenders hold it at once, above its limit of {limit}");
        }
        Ok(())
    }
}

/// Requests sent and wakeups so far, for the recipe's system.
#[derive(Clone)]
struct Tally {
    vigil_clients: Vec<Client>,
    counters: Arc<Counters>,
    etcd: bool,
}

impl Tally {
    fn read(&self) -> (u64, u64) {
        if self.etcd {
            return (self.counters.requests(), self.counters.wakeups());
        }
        let sum = |count: fn(&Client) -> u64| self.vigil_clients.iter().map(count).sum();
        (sum(Client::requests_sent), sum(Client::blocking_returns))
    }
}

/// Runs one recipe with `clients` contenders on a fresh lock, each holding it for `hold`.
pub async fn run(
    recipe: Recipe,
    clients: usize,
    window: Window,
    leaders: &Leaders,
    hold: Duration,
) -> Result<LockRun> {
    let etcd = recipe.system() == System::Etcd;
    let hold_ms = millis(hold);
    let setup = Setup {
        recipe,
        lock: format!("bench/lock/{recipe:?}/{clients}/{hold_ms}"),
        vigil_addr: leaders.vigil_addr,
        etcd_endpoint: leaders.etcd_endpoint.clone(),
        consul_addr: leaders.consul.as_ref().map(|(addr, _)| addr.clone()),
        counters: Arc::new(Counters::default()),
    };
    let mut contenders = Vec::new();
    let mut vigil_clients = Vec::new();
    for _ in 0..clients {
        let (contender, client) = setup.contender().await?;
        contenders.push(contender);
        vigil_clients.extend(client);
    }
    let tally = Tally {
        vigil_clients: vigil_clients.clone(),
        counters: setup.counters.clone(),
        etcd,
    };
    let pids = leaders
        .pids(recipe.system())
        .with_context(|| format!("no {} cluster for {recipe:?}", recipe.system()))?;
    let held = if hold_ms == 0 {
        String::new()
    } else {
        format!(", {hold_ms} ms hold")
    };
    let meter = Meter::start(
        format!("{}, {}{held}", recipe.label(), load::clients(clients)),
        pids,
    )
    .await?;
    let (exclusion, occupancy) = (
        Arc::new(Exclusion::default()),
        Arc::new(Occupancy::default()),
    );
    let exclusive =
        !matches!(recipe, Recipe::VigilShared | Recipe::EtcdLeasePut) && recipe.limit().is_none();
    let (open, close) = window.schedule();
    let leader = leaders.clone();
    let snapshots = tokio::spawn(async move {
        tokio::time::sleep_until(open).await;
        let first = (tally.read(), raft_index(recipe.system(), &leader).await);
        tokio::time::sleep_until(close).await;
        (
            first,
            (tally.read(), raft_index(recipe.system(), &leader).await),
        )
    });
    let workers: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(c, mut contender)| {
            let (exclusion, occupancy) = (exclusion.clone(), occupancy.clone());
            tokio::spawn(async move {
                let (mut acquire, mut cycle) = (histogram(), histogram());
                let (mut count, mut cycles) = (0u64, 0u64);
                while Instant::now() < close {
                    let t0 = Instant::now();
                    let token = contender.acquire().await?;
                    let t1 = Instant::now();
                    if exclusive {
                        exclusion.hold(c, token, hold).await;
                    } else if recipe.limit().is_some() {
                        occupancy.hold().await;
                    }
                    cycles += 1;
                    contender.release().await?;
                    if t1 >= open && t1 < close {
                        count += 1;
                        acquire.record(micros(t1 - t0))?;
                        cycle.record(micros(t0.elapsed()))?;
                    }
                }
                anyhow::Ok((count, cycles, acquire, cycle, contender))
            })
        })
        .collect();
    let deadline = close + DRAIN_LIMIT;
    let (mut acquire, mut cycle) = (histogram(), histogram());
    let mut counts = Vec::new();
    let mut finished = Vec::new();
    let mut all_cycles = 0;
    for worker in workers {
        let (count, cycles, a, c, contender) = tokio::time::timeout_at(deadline, worker)
            .await
            .context("a contender did not finish")???;
        counts.push(count);
        all_cycles += cycles;
        acquire.add(a)?;
        cycle.add(c)?;
        finished.push(contender);
    }
    let usage = meter.stop()?;
    if exclusive {
        exclusion.verdict(recipe, all_cycles)?;
    }
    if let Some(limit) = recipe.limit() {
        occupancy.verdict(recipe, limit)?;
    }
    let (((requests_0, wakeups_0), raft_0), ((requests_1, wakeups_1), raft_1)) = snapshots.await?;
    for contender in finished {
        contender.close().await?;
    }
    for client in &vigil_clients {
        client.drain_cleanups(Duration::from_secs(10)).await;
    }
    let acquisitions = acquire.len();
    let per_acquisition = |before: u64, after: u64| {
        (acquisitions > 0).then(|| after.saturating_sub(before) as f64 / acquisitions as f64)
    };
    Ok(LockRun {
        recipe,
        clients,
        hold_ms,
        acquisitions,
        per_second: acquisitions as f64 / window.measure.as_secs_f64(),
        acquire: Latency::of(&acquire),
        cycle: Latency::of(&cycle),
        min_per_client: counts.iter().copied().min().unwrap_or(0),
        max_per_client: counts.iter().copied().max().unwrap_or(0),
        requests_per_acquisition: per_acquisition(requests_0, requests_1),
        woken_per_acquisition: if recipe == Recipe::EtcdV3Lock {
            // The waiting happens inside the server: nothing to observe from outside.
            None
        } else {
            per_acquisition(wakeups_0, wakeups_1)
        },
        raft_entries_per_acquisition: raft_0
            .zip(raft_1)
            .and_then(|(before, after)| per_acquisition(before, after)),
        usage,
    })
}

/// The last index of the raft log of `system`'s leader (etcd's from its status, Vigil's and
/// Consul's from `Stats.raft.last_log_index` of `/v1/agent/self`); `None` when it cannot be
/// read, which leaves the figure out rather than failing the run, and, silently, when the runs
/// go through a client agent (`agent_path`), which has no raft.
async fn raft_index(system: System, leaders: &Leaders) -> Option<u64> {
    let read = async {
        if system == System::Etcd {
            let mut etcd = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
            return Ok(Some(etcd.status().await?.raft_index()));
        }
        let (vigil, consul) = leaders.http_clients()?;
        let client = match system {
            System::Consul => consul.context("Consul does not run")?,
            _ => vigil,
        };
        let reply = client
            .request(reqwest::Method::GET, "/v1/agent/self")
            .send()
            .await?
            .json::<serde_json::Value>()
            .await?;
        // A client agent has none: Consul's leaves `raft` out, Vigil's answers it empty.
        let raft = &reply["Stats"]["raft"];
        if raft.as_object().is_none_or(serde_json::Map::is_empty) {
            return Ok(None);
        }
        raft["last_log_index"]
            .as_str()
            .and_then(|n| n.parse().ok())
            .map(Some)
            .context("Stats.raft.last_log_index")
    };
    let index: Result<Option<u64>> = read.await;
    index
        .inspect_err(|e| eprintln!("vigil-bench: the raft index of {system:?}: {e:#}"))
        .ok()
        .flatten()
}

/// Uncontended cycles, then contention with 8 and 32 clients.
pub async fn workload(systems: &Systems, plan: &Plan) -> Result<Outcome> {
    let leaders = systems.leaders().await?;
    let mut runs = Vec::new();
    let uncontended = [
        Recipe::VigilSession,
        Recipe::EtcdMutex,
        Recipe::EtcdV3Lock,
        Recipe::EtcdLeasePut,
        Recipe::VigilLock,
        Recipe::ConsulSession,
    ];
    for recipe in Recipe::in_turn(&uncontended, &leaders) {
        runs.push(run(recipe, 1, plan.lock, &leaders, Duration::ZERO).await?);
    }
    let contended = [
        Recipe::VigilLock,
        Recipe::VigilFair,
        Recipe::EtcdV3Lock,
        Recipe::EtcdMutex,
        Recipe::ConsulLock,
    ];
    for clients in [8, 32] {
        for recipe in Recipe::in_turn(&contended, &leaders) {
            runs.push(run(recipe, clients, plan.contended, &leaders, Duration::ZERO).await?);
        }
    }
    // The sweep: how the handoff rates move with the client count (concurrency.Mutex, whose
    // rate follows v3lock's, only at 8 and 32).
    let swept = [
        Recipe::VigilFair,
        Recipe::EtcdV3Lock,
        Recipe::VigilLock,
        Recipe::ConsulLock,
    ];
    for &clients in &plan.sweep {
        for recipe in Recipe::in_turn(&swept, &leaders) {
            let window = plan.sweep_window;
            runs.push(run(recipe, clients, window, &leaders, Duration::ZERO).await?);
        }
    }
    // Locks that guard work: each holder keeps the lock for a while.
    let held = [
        Recipe::VigilFair,
        Recipe::EtcdV3Lock,
        Recipe::VigilLock,
        Recipe::ConsulLock,
    ];
    for hold in HOLDS {
        for recipe in Recipe::in_turn(&held, &leaders) {
            runs.push(run(recipe, HELD_CLIENTS, plan.contended, &leaders, hold).await?);
        }
    }
    let shared = run(
        Recipe::VigilShared,
        32,
        plan.contended,
        &leaders,
        Duration::ZERO,
    );
    runs.push(shared.await?);
    let semaphores = [Recipe::VigilSemaphore, Recipe::ConsulSemaphore];
    for recipe in Recipe::in_turn(&semaphores, &leaders) {
        let window = plan.contended;
        runs.push(run(recipe, SEMAPHORE_CLIENTS, window, &leaders, Duration::ZERO).await?);
    }
    Ok(outcome(runs))
}

/// The run of `recipe` with `clients` contenders holding the lock `hold_ms` (0: one yield).
fn find(runs: &[LockRun], recipe: Recipe, clients: usize, hold_ms: u64) -> Option<&LockRun> {
    runs.iter()
        .find(|r| r.recipe == recipe && r.clients == clients && r.hold_ms == hold_ms)
}

/// The runs being compared: a Vigil recipe's, an etcd recipe's and Consul's run of the Vigil
/// recipe's algorithm (none where Consul has no such recipe).
type Trio<'a> = (
    Option<&'a LockRun>,
    Option<&'a LockRun>,
    Option<&'a LockRun>,
);

/// One figure of a run, where it has one.
type Figure = fn(&LockRun) -> Option<f64>;

/// A row comparing one figure of a pair of runs, with Consul's run of the same recipe when
/// there is one.
fn compare(
    id: String,
    workload: &str,
    metric: &str,
    better: Better,
    (vigil, etcd, consul): Trio<'_>,
    figure: Figure,
) -> Row {
    let vigil = vigil.and_then(figure);
    let etcd = etcd.and_then(figure);
    Row::new(id, workload, metric, better, vigil, etcd).with_consul(consul.and_then(figure))
}

fn outcome(runs: Vec<LockRun>) -> Outcome {
    let consul_of = |vigil: Recipe| match vigil {
        Recipe::VigilSession => Some(Recipe::ConsulSession),
        Recipe::VigilLock => Some(Recipe::ConsulLock),
        _ => None,
    };
    let held = |vigil: Recipe, etcd: Recipe, clients: usize, hold_ms: u64| -> Trio<'_> {
        (
            find(&runs, vigil, clients, hold_ms),
            find(&runs, etcd, clients, hold_ms),
            consul_of(vigil).and_then(|c| find(&runs, c, clients, hold_ms)),
        )
    };
    let pair = |vigil: Recipe, etcd: Recipe, clients: usize| held(vigil, etcd, clients, 0);
    let rate: Figure = |r| Some(r.per_second);
    let (higher, lower) = (Better::Higher, Better::Lower);
    let mut rows = Vec::new();
    let uncontended = pair(Recipe::VigilSession, Recipe::EtcdMutex, 1);
    let workload = "Uncontended lock cycle, 1 client (vs concurrency.Mutex)";
    let id = |metric: &str| format!("lock_uncontended.{metric}");
    rows.push(compare(
        id("rate"),
        workload,
        "cycles/s",
        higher,
        uncontended,
        rate,
    ));
    rows.push(compare(
        id("p50"),
        workload,
        "cycle p50 (ms)",
        lower,
        uncontended,
        |r| Some(r.cycle.p50_ms),
    ));
    rows.push(compare(
        id("p99"),
        workload,
        "cycle p99 (ms)",
        lower,
        uncontended,
        |r| Some(r.cycle.p99_ms),
    ));
    rows.push(compare(
        id("v3lock.rate"),
        "Uncontended lock cycle, 1 client (vs v3lock)",
        "cycles/s",
        higher,
        pair(Recipe::VigilSession, Recipe::EtcdV3Lock, 1),
        rate,
    ));
    for clients in [8, 32] {
        let id = |metric: &str| format!("lock_contended.c{clients}.{metric}");
        let pairings = [
            (
                "lock_vs_v3lock",
                Recipe::VigilLock,
                Recipe::EtcdV3Lock,
                "Consul-style lock vs v3lock",
            ),
            (
                "fair_vs_v3lock",
                Recipe::VigilFair,
                Recipe::EtcdV3Lock,
                "fair mutex vs v3lock",
            ),
            (
                "fair_vs_mutex",
                Recipe::VigilFair,
                Recipe::EtcdMutex,
                "fair mutex vs concurrency.Mutex",
            ),
        ];
        for (name, vigil, etcd, what) in pairings {
            let workload = format!("Contended lock, {clients} clients: {what}");
            let runs = pair(vigil, etcd, clients);
            rows.push(compare(
                id(&format!("{name}.rate")),
                &workload,
                "handoffs/s",
                higher,
                runs,
                rate,
            ));
            rows.push(compare(
                id(&format!("{name}.raft_entries")),
                &workload,
                "raft entries per acquisition",
                lower,
                runs,
                |r| r.raft_entries_per_acquisition,
            ));
        }
        let workload = format!("Contended lock, {clients} clients: fair mutex vs v3lock");
        let runs = pair(Recipe::VigilFair, Recipe::EtcdV3Lock, clients);
        rows.push(compare(
            id("fair_vs_v3lock.p50"),
            &workload,
            "acquire p50 (ms)",
            lower,
            runs,
            |r| Some(r.acquire.p50_ms),
        ));
        rows.push(compare(
            id("fair_vs_v3lock.p99"),
            &workload,
            "acquire p99 (ms)",
            lower,
            runs,
            |r| Some(r.acquire.p99_ms),
        ));
        rows.push(compare(
            id("fair_vs_v3lock.fairness"),
            &workload,
            "fairness (fewest ÷ most acquisitions of a client)",
            higher,
            runs,
            |r| Some(r.fairness()),
        ));
        // etcd's server-side recipe needs one request to acquire and one to release, as
        // Vigil's queue does: the client-side recipe's count below is not the only one.
        rows.push(compare(
            id("requests_vs_v3lock"),
            &workload,
            "requests sent per acquisition",
            lower,
            runs,
            |r| r.requests_per_acquisition,
        ));
        let workload =
            format!("Contended lock, {clients} clients: fair mutex vs concurrency.Mutex");
        let runs = pair(Recipe::VigilFair, Recipe::EtcdMutex, clients);
        rows.push(compare(
            id("requests"),
            &workload,
            "requests sent per acquisition",
            lower,
            runs,
            |r| r.requests_per_acquisition,
        ));
        rows.push(compare(
            id("woken"),
            &workload,
            "waiting requests woken per acquisition",
            lower,
            runs,
            |r| r.woken_per_acquisition,
        ));
    }
    for hold in HOLDS.map(millis) {
        let id = |metric: &str| format!("lock_held.h{hold}.{metric}");
        let workload = format!("Lock with a {hold} ms hold, {HELD_CLIENTS} clients");
        let fair = held(Recipe::VigilFair, Recipe::EtcdV3Lock, HELD_CLIENTS, hold);
        let consul_style = held(Recipe::VigilLock, Recipe::EtcdV3Lock, HELD_CLIENTS, hold);
        let figures: [(&str, &str, Better, Figure); 4] = [
            ("rate", "handoffs/s", higher, rate),
            ("p50", "acquire p50 (ms)", lower, |r| Some(r.acquire.p50_ms)),
            ("p99", "acquire p99 (ms)", lower, |r| Some(r.acquire.p99_ms)),
            ("p999", "acquire p99.9 (ms)", lower, |r| {
                Some(r.acquire.p999_ms)
            }),
        ];
        for (name, metric, better, figure) in figures {
            let metric = |what: &str| format!("{what} vs v3lock: {metric}");
            let vs_fair = (
                id(&format!("fair_vs_v3lock.{name}")),
                metric("fair mutex"),
                fair,
            );
            let vs_lock = (
                id(&format!("lock_vs_v3lock.{name}")),
                metric("Consul-style lock"),
                consul_style,
            );
            for (id, metric, runs) in [vs_fair, vs_lock] {
                let row = compare(id, &workload, &metric, better, runs, figure);
                rows.push(row.with_note(HOLD_NOTE));
            }
        }
    }
    let mut counts: Vec<usize> = runs
        .iter()
        .filter(|r| r.recipe == Recipe::EtcdV3Lock && r.hold_ms == 0)
        .map(|r| r.clients)
        .collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() > 3 {
        for clients in counts {
            let workload = format!("Contended lock sweep, {}", load::clients(clients));
            let id = |name: &str| format!("lock_sweep.c{clients}.{name}.rate");
            let pairings = [
                ("fair_vs_v3lock", Recipe::VigilFair, "fair mutex"),
                ("lock_vs_v3lock", Recipe::VigilLock, "Consul-style lock"),
            ];
            for (name, vigil, what) in pairings {
                let metric = format!("{what} vs v3lock: handoffs/s");
                let runs = pair(vigil, Recipe::EtcdV3Lock, clients);
                rows.push(compare(id(name), &workload, &metric, higher, runs, rate));
            }
        }
    }
    for row in &mut rows {
        let timing = [".rate", ".p50", ".p99"]
            .iter()
            .any(|m| row.id.ends_with(m));
        let contended = ["lock_contended.", "lock_sweep."]
            .iter()
            .any(|p| row.id.starts_with(p));
        // One client contends with nobody: no waiter, no watch.
        if contended && timing && !row.id.starts_with("lock_sweep.c1.") {
            row.note = Some(RESYNC_NOTE.to_owned());
        }
        if row.id.starts_with("lock_uncontended.") {
            row.note = Some(UNCONTENDED_NOTE.to_owned());
        }
    }
    let shared = find(&runs, Recipe::VigilShared, 32, 0).map(|r| r.per_second);
    let exclusive = find(&runs, Recipe::VigilFair, 32, 0).map(|r| r.per_second);
    let semaphore = |recipe| find(&runs, recipe, SEMAPHORE_CLIENTS, 0);
    let (v, c) = (
        semaphore(Recipe::VigilSemaphore),
        semaphore(Recipe::ConsulSemaphore),
    );
    let workload = format!(
        "Semaphore, limit {SEMAPHORE_LIMIT}, {SEMAPHORE_CLIENTS} clients (Consul's api.Semaphore \
         algorithm)"
    );
    let figures: [(&str, &str, Better, Figure); 2] = [
        ("rate", "acquisitions/s", higher, rate),
        ("p50", "acquire p50 (ms)", lower, |r| Some(r.acquire.p50_ms)),
    ];
    for (name, metric, better, figure) in figures {
        let id = format!("lock_semaphore.c{SEMAPHORE_CLIENTS}.{name}");
        let row = Row::vigil_only(id, &workload, metric, better, v.and_then(figure));
        rows.push(
            row.with_consul(c.and_then(figure))
                .with_note(SEMAPHORE_NOTE),
        );
    }
    rows.push(Row::vigil_only(
        "lock_shared.c32.vs_exclusive",
        "Shared lock, 32 readers (RwLock read vs FairMutex, 32 clients each)",
        "shared ÷ exclusive acquisitions/s",
        higher,
        shared.zip(exclusive).map(|(s, e)| s / e),
    ));
    let opt = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), num);
    let table = Table {
        title: "Locks, every recipe".to_owned(),
        header: [
            "clients",
            "hold ms",
            "recipe",
            "acquisitions/s",
            "acquire p50 ms",
            "acquire p99 ms",
            "cycle p50 ms",
            "per client (min–max)",
            "requests / acq.",
            "woken / acq.",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: runs
            .iter()
            .map(|r| {
                vec![
                    r.clients.to_string(),
                    r.hold_ms.to_string(),
                    r.recipe.label().to_owned(),
                    num(r.per_second),
                    num(r.acquire.p50_ms),
                    num(r.acquire.p99_ms),
                    num(r.cycle.p50_ms),
                    format!("{}–{}", r.min_per_client, r.max_per_client),
                    opt(r.requests_per_acquisition),
                    opt(r.woken_per_acquisition),
                ]
            })
            .collect(),
    };
    Outcome {
        rows,
        tables: vec![table],
        usage: runs.iter().map(|r| r.usage.clone()).collect(),
        details: json!({ "runs": runs }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_at_a_time_passes() {
        let exclusion = Exclusion::default();
        for c in 0..5 {
            let token = (c % 3 != 1).then_some(10 + c as u64);
            exclusion.hold(c % 2, token, Duration::ZERO).await;
        }
        exclusion.verdict(Recipe::VigilFair, 5).unwrap();
    }

    /// The check's negative control: two contenders granted at once are caught, by the grant
    /// that overlapped and by the increment one of them lost.
    #[tokio::test]
    async fn two_holders_at_once_fail_the_run() {
        let exclusion = Arc::new(Exclusion::default());
        let (a, b) = (exclusion.clone(), exclusion.clone());
        // Each holds the lock for a millisecond, as the runs with a hold do.
        let work = HOLDS[0];
        tokio::join!(a.hold(0, Some(1), work), b.hold(1, Some(2), work));
        let error = exclusion.verdict(Recipe::ConsulLock, 2).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("1 grants while held"), "{text}");
        assert!(text.contains("counter 1 after 2 increments"), "{text}");
        assert!(text.contains("0 fencing tokens"), "{text}");
    }

    /// A semaphore's holders are counted while they hold it: as many as its limit at once
    /// pass, one more fails the run.
    #[tokio::test]
    async fn more_holders_than_the_limit_fail_a_semaphore_run() {
        let occupancy = Occupancy::default();
        tokio::join!(occupancy.hold(), occupancy.hold());
        occupancy.verdict(Recipe::VigilSemaphore, 2).unwrap();
        let text = occupancy
            .verdict(Recipe::ConsulSemaphore, 1)
            .unwrap_err()
            .to_string();
        assert!(text.contains("2 contenders hold it at once"), "{text}");
        occupancy.hold().await;
        assert_eq!(occupancy.holding.load(Ordering::SeqCst), 0);
    }

    /// A grant whose fencing token is not above the last one fails the run, though the grants
    /// themselves never overlapped.
    #[tokio::test]
    async fn a_token_going_backwards_fails_the_run() {
        let exclusion = Exclusion::default();
        for (c, token) in [(0, 5), (1, 7), (0, 7), (1, 6)] {
            exclusion.hold(c, Some(token), Duration::ZERO).await;
        }
        let text = exclusion
            .verdict(Recipe::EtcdMutex, 4)
            .unwrap_err()
            .to_string();
        assert!(text.contains("0 grants while held"), "{text}");
        assert!(
            text.contains("2 fencing tokens not above the one before"),
            "{text}"
        );
    }
}
