//! Backend on the in-memory double ([`MemoryServer`]), on paused time: blocking-query
//! deadlines and wakeups, and session TTL expiry, with every step of time taken explicitly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_server::ServerApi;
use vigil_server::api::QueryFuture;
use vigil_server::api::memory::MemoryServer;
use vigil_shared::kv::{KvEntry, KvOp, TxnOutcome};
use vigil_shared::operator::{OperatorError, OperatorReply, OperatorRequest};
use vigil_shared::rpc::calls::StatusInfo;
use vigil_shared::rpc::{
    Consistency, Op, QueryMeta, QueryOptions, ReadQuery, Response, ServerError, reads, writes,
};
use vigil_shared::session::Session;

use super::Backend;
use crate::testing::settle;

const WAIT: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(10);

fn backend() -> Arc<Backend> {
    Arc::new(Backend::new(Arc::new(MemoryServer::default())))
}

fn set(key: &str, value: &str) -> writes::Kv {
    writes::Kv(vec![KvOp::Set {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        flags: 0,
    }])
}

async fn get(backend: &Backend, key: &str) -> (Vec<KvEntry>, QueryMeta) {
    let query = reads::KvGet {
        key: key.to_owned(),
    };
    backend
        .read(QueryOptions::default(), query)
        .await
        .expect("read")
}

/// A blocking read of `key` above `index`, waiting up to `wait`, on its own task, which has
/// started blocking when this returns.
async fn block_on_key(
    backend: &Arc<Backend>,
    key: &str,
    index: u64,
    wait: Duration,
) -> JoinHandle<Result<(Vec<KvEntry>, QueryMeta), ServerError>> {
    let backend = Arc::clone(backend);
    let query = reads::KvGet {
        key: key.to_owned(),
    };
    let opts = QueryOptions {
        min_index: index,
        wait_ms: wait.as_millis() as u64,
        ..QueryOptions::default()
    };
    let read = tokio::spawn(async move { backend.read(opts, query).await });
    settle().await;
    read
}

#[tokio::test(start_paused = true)]
async fn a_blocking_query_nothing_answers_returns_at_its_wait_with_the_index_it_had() {
    let backend = backend();
    backend.write(set("k", "v1")).await.expect("write");
    let (_, before) = get(&backend, "k").await;
    let started = Instant::now();
    let read = block_on_key(&backend, "k", before.index, WAIT).await;

    // Just short of the wait, and after a write to another key, it still blocks.
    backend.write(set("k2", "other")).await.expect("write");
    tokio::time::advance(WAIT - Duration::from_millis(1)).await;
    settle().await;
    assert!(!read.is_finished(), "answered before its wait");

    // By the wait plus Consul's jitter margin (wait/16) it has answered, unchanged.
    tokio::time::advance(WAIT / 16).await;
    settle().await;
    assert!(read.is_finished(), "no answer by the deadline");
    let (entries, meta) = read.await.expect("join").expect("read");
    assert_eq!(meta.index, before.index);
    assert_eq!(entries[0].value, b"v1");
    assert!(started.elapsed() < WAIT + WAIT / 16 + Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn a_write_to_the_key_answers_a_blocking_query_at_once() {
    let backend = backend();
    backend.write(set("k", "v1")).await.expect("write");
    let (_, before) = get(&backend, "k").await;
    let read = block_on_key(&backend, "k", before.index, Duration::from_secs(300)).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    assert!(!read.is_finished(), "answered with nothing written");

    // The write wakes it with no time passing.
    let written_at = Instant::now();
    backend.write(set("k", "v2")).await.expect("write");
    settle().await;
    assert!(read.is_finished(), "a write to its key did not wake it");
    let (entries, meta) = read.await.expect("join").expect("read");
    assert!(meta.index > before.index, "{meta:?} after {before:?}");
    assert_eq!(entries[0].value, b"v2");
    assert_eq!(Instant::now(), written_at);
}

#[tokio::test(start_paused = true)]
async fn a_session_expires_twice_its_ttl_after_its_last_renewal_and_releases_its_lock() {
    let backend = backend();
    // A node, a session on it with a TTL, and a key it holds.
    let node = writes::RegisterNode {
        name: "n1".to_owned(),
        address: "127.0.0.1".to_owned(),
    };
    backend.write(node).await.expect("register");
    let session = Session {
        name: "ttl".to_owned(),
        ttl: format!("{}s", TTL.as_secs()),
        id: "2a1b1e6e-2c1a-4b8f-9a7e-3f2d9c0b1a55".to_owned(),
        node: "n1".to_owned(),
        ..Session::default()
    };
    let created = backend.write(writes::CreateSession(session.clone())).await;
    assert_eq!(created, Ok(Ok(session.id.clone())));
    let lock = writes::Kv(vec![KvOp::Lock {
        key: "leader".to_owned(),
        value: b"me".to_vec(),
        flags: 0,
        session: session.id.clone(),
    }]);
    backend.write(lock).await.expect("lock");
    let holder = |entries: Vec<KvEntry>| entries[0].session.clone();
    assert_eq!(
        holder(get(&backend, "leader").await.0),
        Some(session.id.clone())
    );
    let alive = async |backend: &Backend| {
        let query = reads::SessionInfo {
            id: session.id.clone(),
        };
        let (sessions, _) = backend
            .read(QueryOptions::default(), query)
            .await
            .expect("read");
        !sessions.is_empty()
    };

    // Renewed at 1.5 TTL: it would have died at 2 TTL, and lives on.
    tokio::time::advance(TTL * 3 / 2).await;
    backend.renew(&session.id).await.expect("renew");
    tokio::time::advance(TTL).await;
    settle().await;
    assert!(alive(&backend).await, "expired although renewed");

    // Just short of 2 TTL after the renewal it is still there; at 2 TTL it is gone and its
    // lock released.
    tokio::time::advance(TTL - Duration::from_millis(1)).await;
    settle().await;
    assert!(alive(&backend).await, "expired before 2 TTL");
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert!(!alive(&backend).await, "alive 2 TTL after its last renewal");
    assert_eq!(holder(get(&backend, "leader").await.0), None);
    let renewed = backend.renew(&session.id).await;
    assert!(
        matches!(renewed, Err(ServerError::SessionNotFound(_))),
        "{renewed:?}"
    );
}

/// The in-memory servers without a leader until `until`: writes, renewals and reads that need
/// a leader fail with `NoLeader` (nothing applied), stale reads are answered. Counts writes
/// tried.
struct Leaderless {
    servers: MemoryServer,
    until: Instant,
    writes: AtomicUsize,
}

impl Leaderless {
    fn new(for_: Duration) -> Arc<Leaderless> {
        Arc::new(Leaderless {
            servers: MemoryServer::default(),
            until: Instant::now() + for_,
            writes: AtomicUsize::new(0),
        })
    }

    /// `NoLeader` while there is none, for a call that `needs_leader`; else the call's answer.
    fn led<'a, T: Send + 'a>(
        &'a self,
        needs_leader: bool,
        call: impl FnOnce() -> BoxFuture<'a, Result<T, ServerError>>,
    ) -> BoxFuture<'a, Result<T, ServerError>> {
        if needs_leader && Instant::now() < self.until {
            return Box::pin(async { Err(ServerError::NoLeader) });
        }
        call()
    }
}

impl ServerApi for Leaderless {
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Response, ServerError>> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.led(true, || self.servers.write(op))
    }

    fn query(&self, opts: QueryOptions, query: ReadQuery) -> QueryFuture<'_> {
        let needs_leader = opts.consistency != Consistency::Stale;
        self.led(needs_leader, || self.servers.query(opts, query))
    }

    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Session, ServerError>> {
        self.led(true, || self.servers.renew(id))
    }

    fn operator(
        &self,
        request: OperatorRequest,
    ) -> BoxFuture<'_, Result<OperatorReply, OperatorError>> {
        self.servers.operator(request)
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusInfo, ServerError>> {
        self.servers.status()
    }

    fn is_shutting_down(&self) -> bool {
        self.servers.is_shutting_down()
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_during_an_election_is_retried_until_a_leader_takes_it() {
    let servers = Leaderless::new(Duration::from_secs(2));
    let backend = Arc::new(Backend::new(Arc::clone(&servers) as Arc<dyn ServerApi>));
    let write = {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move { backend.write(set("k", "v")).await })
    };
    settle().await;

    // While there is no leader it keeps trying, with backoff.
    tokio::time::advance(Duration::from_millis(1900)).await;
    settle().await;
    assert!(!write.is_finished(), "gave up or applied without a leader");
    let tried = servers.writes.load(Ordering::Relaxed);
    assert!(tried > 1, "tried {tried} times");

    // The next attempt after the election is applied, once.
    tokio::time::advance(Duration::from_millis(600)).await;
    settle().await;
    assert!(write.is_finished(), "not retried once a leader was there");
    let written = write.await.expect("join");
    assert!(
        matches!(written, Ok(TxnOutcome::Committed(_))),
        "{written:?}"
    );
    assert_eq!(servers.servers.index(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_blocking_query_with_no_leader_is_answered_stale_by_its_deadline() {
    // The key was written before the servers lost their leader, for longer than the wait.
    let servers = Leaderless::new(WAIT * 10);
    servers
        .servers
        .write(set("k", "v1").into())
        .await
        .expect("write");
    let index = servers.servers.index();
    let backend = Arc::new(Backend::new(servers as Arc<dyn ServerApi>));

    // It blocks (retrying the leaderless servers) through most of its wait.
    let started = Instant::now();
    let read = block_on_key(&backend, "k", index, WAIT).await;
    tokio::time::advance(WAIT - Duration::from_secs(1)).await;
    settle().await;
    assert!(!read.is_finished(), "answered long before its wait");

    // By the deadline the stale read is the answer, flagged as having no known leader.
    tokio::time::advance(Duration::from_secs(1) + WAIT / 16).await;
    settle().await;
    assert!(read.is_finished(), "no answer by the deadline");
    let (entries, meta) = read.await.expect("join").expect("stale answer");
    assert_eq!(entries[0].value, b"v1");
    assert_eq!(meta.index, index);
    assert!(!meta.known_leader);
    assert!(started.elapsed() <= WAIT + WAIT / 16);
}

/// The in-memory servers, counting the blocking queries they hold now.
#[derive(Default)]
struct Counting {
    servers: MemoryServer,
    held: Arc<AtomicUsize>,
}

/// Counts a held blocking query until dropped (the query answered, or dropped by its caller).
struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ServerApi for Counting {
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Response, ServerError>> {
        self.servers.write(op)
    }

    fn query(&self, opts: QueryOptions, query: ReadQuery) -> QueryFuture<'_> {
        if opts.min_index == 0 {
            return self.servers.query(opts, query);
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        let held = Held(Arc::clone(&self.held));
        Box::pin(async move {
            let _held = held;
            self.servers.query(opts, query).await
        })
    }

    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Session, ServerError>> {
        self.servers.renew(id)
    }

    fn operator(
        &self,
        request: OperatorRequest,
    ) -> BoxFuture<'_, Result<OperatorReply, OperatorError>> {
        self.servers.operator(request)
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusInfo, ServerError>> {
        self.servers.status()
    }

    fn is_shutting_down(&self) -> bool {
        self.servers.is_shutting_down()
    }
}

#[tokio::test(start_paused = true)]
async fn blocking_queries_of_one_read_share_one_wait_on_the_servers() {
    let servers = Arc::new(Counting::default());
    let backend = Arc::new(Backend::new(Arc::clone(&servers) as Arc<dyn ServerApi>));
    backend.write(set("k", "v1")).await.expect("write");
    let (_, before) = get(&backend, "k").await;

    // Ten readers of the key at its index: one query held by the servers.
    let mut reads = Vec::new();
    for _ in 0..10 {
        reads.push(block_on_key(&backend, "k", before.index, WAIT).await);
    }
    assert_eq!(servers.held.load(Ordering::Relaxed), 1);
    assert_eq!(backend.blocking_queries(), (10, 1));

    // Three hang up: the wait stays for the others.
    for read in reads.drain(..3) {
        read.abort();
    }
    settle().await;
    assert_eq!(servers.held.load(Ordering::Relaxed), 1);
    assert_eq!(backend.blocking_queries(), (7, 1));

    // One write answers the seven left with the new value.
    backend.write(set("k", "v2")).await.expect("write");
    settle().await;
    for read in reads {
        let (entries, meta) = read.await.expect("join").expect("read");
        assert!(meta.index > before.index);
        assert_eq!(entries[0].value, b"v2");
    }
    assert_eq!(servers.held.load(Ordering::Relaxed), 0);
    assert_eq!(backend.blocking_queries(), (0, 0));

    // The last reader of a wait hanging up ends it on the servers.
    let (_, now) = get(&backend, "k").await;
    let read = block_on_key(&backend, "k", now.index, WAIT).await;
    assert_eq!(servers.held.load(Ordering::Relaxed), 1);
    read.abort();
    settle().await;
    assert_eq!(servers.held.load(Ordering::Relaxed), 0);
    assert_eq!(backend.blocking_queries(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_reader_joining_a_wait_started_earlier_still_waits_its_whole_wait() {
    let servers = Arc::new(Counting::default());
    let backend = Arc::new(Backend::new(Arc::clone(&servers) as Arc<dyn ServerApi>));
    backend.write(set("k", "v1")).await.expect("write");
    let (_, before) = get(&backend, "k").await;
    let first = block_on_key(&backend, "k", before.index, WAIT).await;
    tokio::time::advance(WAIT / 2).await;
    let started = Instant::now();
    let second = block_on_key(&backend, "k", before.index, WAIT).await;
    assert_eq!(servers.held.load(Ordering::Relaxed), 1);

    // The first's wait ends, unchanged; the second waits on, on a wait of its own.
    tokio::time::advance(WAIT / 2 + WAIT / 16).await;
    settle().await;
    let (_, meta) = first.await.expect("join").expect("read");
    assert_eq!(meta.index, before.index);
    assert!(!second.is_finished(), "answered half way through its wait");
    assert_eq!(servers.held.load(Ordering::Relaxed), 1);
    tokio::time::advance(WAIT / 2).await;
    settle().await;
    let (_, meta) = second.await.expect("join").expect("read");
    assert_eq!(meta.index, before.index);
    assert!(started.elapsed() >= WAIT);
}

/// Queries whose requests came together may reach the shared waits in another order (each
/// handler's first run takes its own time): the one that came first still joins the wait the
/// later one started.
#[tokio::test(start_paused = true)]
async fn queries_that_reach_the_shared_waits_out_of_order_still_share_one() {
    let servers = Arc::new(Counting::default());
    let backend = Arc::new(Backend::new(Arc::clone(&servers) as Arc<dyn ServerApi>));
    backend.write(set("k", "v1")).await.expect("write");
    let (_, before) = get(&backend, "k").await;
    let opts = QueryOptions {
        min_index: before.index,
        wait_ms: WAIT.as_millis() as u64,
        ..QueryOptions::default()
    };
    let query = || -> ReadQuery {
        reads::KvGet {
            key: "k".to_owned(),
        }
        .into()
    };
    let earlier = backend.blocking(opts, query()).expect("blocking");
    tokio::time::advance(Duration::from_millis(20)).await;
    let later = backend.blocking(opts, query()).expect("blocking");
    let later = tokio::spawn(later.answer());
    settle().await;
    let earlier = tokio::spawn(earlier.answer());
    settle().await;
    assert_eq!(backend.blocking_queries(), (2, 1));
    assert_eq!(servers.held.load(Ordering::Relaxed), 1);

    backend.write(set("k", "v2")).await.expect("write");
    settle().await;
    for read in [earlier, later] {
        let (_, meta) = read.await.expect("join").expect("read");
        assert!(meta.index > before.index);
    }
    assert_eq!(backend.blocking_queries(), (0, 0));
}
