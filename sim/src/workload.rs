//! The clients: each registers its node and a check of it, keeps a TTL session (with a
//! lock-delay drawn from the seed, bound to the check or not) renewed, and in a loop reads
//! (plainly or blocking on an index), writes and compare-and-sets a few KV registers, takes and
//! releases a Consul-style KV lock (waiting for its holder with a blocking read when refused)
//! and a lock of the lock queue (waiting in the queue for its grant as the agent does,
//! sometimes reconnecting mid-wait), and now and then destroys its session. Beside each client,
//! its node's health changes as its agent would report it (the check goes critical and
//! recovers, the node is deregistered and registers again), and now and then the application
//! abandons its session (stops renewing it, as a process that died would). Every request goes
//! to a server drawn from the seed; one refused before it was served (no leader, server down)
//! is retried on another after a pause, as the agent does; one whose outcome is unknown is
//! recorded as such. What they saw goes into the [`History`] the checks read; each blocking
//! read's answer is checked as it arrives.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng as _;
use tokio::time::Instant;
use vigil_server::proposer::wall_ms;
use vigil_shared::catalog::{Check, HealthStatus};
use vigil_shared::kv::{KvEntry, KvOp, TxnOutcome};
use vigil_shared::lock::{LockHold, LockMode, LockOp, LockOutcome};
use vigil_shared::rpc::{Op, QueryResult, ReadQuery, Response, ServerError};
use vigil_shared::session::Session;

use crate::gateway::{Call, Legs, Reply};
use crate::linear::{self, Input, Output};
use crate::sessions::Binding;
use crate::world::{Plant, Stream, World};

/// The registers clients read and write.
pub const REGISTERS: [&str; 3] = ["reg/a", "reg/b", "reg/c"];
/// The Consul-style lock's key and the lock queue's lock.
pub const KV_LOCK: &str = "lock/kv";
pub const QUEUE_LOCK: &str = "queue";
/// The check of each client's node that half its sessions bind.
pub const CHECK: &str = "alive";
/// Every client's session TTL, and how often it renews.
pub const TTL: Duration = Duration::from_secs(4);
const RENEW_EVERY: Duration = Duration::from_millis(1500);
/// Attempts of one request refused before it was served, before the client gives up on it.
const ATTEMPTS: u32 = 12;

/// A grant a client was told of: a KV lock's `LockIndex` or a lock queue's fencing token.
#[derive(Debug, Clone)]
pub struct Grant {
    pub client: usize,
    pub session: String,
    pub index: u64,
    pub call: Instant,
    pub ret: Instant,
    /// `ret` on the servers' clock (ms): the holder lets go only after it.
    pub ret_ms: u64,
    /// When the grant was applied, on the servers' clock (ms), as the answer tells it or
    /// no later than: a KV acquire's entry (its `ModifyIndex`, whose clock the checks look
    /// up), a queue grant's `since_ms` when the wait tells it, else the answer's arrival.
    pub applied: Applied,
}

/// When a grant was applied, as far as its client knows.
#[derive(Debug, Clone, Copy)]
pub enum Applied {
    /// By the committed entry at this index.
    AtIndex(u64),
    /// By an entry stamped with this clock.
    At(u64),
    /// By an entry applied no later than this clock.
    By(u64),
}

/// What the clients saw.
#[derive(Default)]
pub struct History {
    /// Each register's operations (times in ns since the run began).
    pub registers: BTreeMap<String, Vec<linear::Op>>,
    pub kv_grants: Vec<Grant>,
    pub queue_grants: Vec<Grant>,
    /// Per session, when (servers' clock, ms) its client sent each release of the KV lock and
    /// of the queue's lock.
    pub kv_releases: BTreeMap<String, Vec<u64>>,
    pub queue_releases: BTreeMap<String, Vec<u64>>,
    /// Each session's lock-delay, as created.
    pub lock_delays: BTreeMap<String, Duration>,
    /// What each session was created to bind: its node, and its node's check or none.
    pub bindings: BTreeMap<String, Binding>,
    /// Acknowledged destroys: the session and when (servers' clock, ms) the answer came.
    pub destroys: Vec<(String, u64)>,
    /// Grants of the queue's lock found gone when their holder released them: the session and
    /// when (servers' clock, ms) the answer came.
    pub lost: Vec<(String, u64)>,
    /// Per session, when each request that restarted its TTL (the create and every
    /// acknowledged renewal) was sent.
    pub renewals: BTreeMap<String, Vec<Instant>>,
}

/// The outcome of a request as a client knows it.
enum Outcome {
    Answered(Reply),
    /// Refused: certainly not applied (or, for a read, not answered).
    Failed,
    /// It may or may not have been applied.
    Unknown,
}

pub struct Client {
    pub id: usize,
    pub world: Arc<World>,
    pub history: Arc<Mutex<History>>,
    session: Arc<Mutex<Option<String>>>,
    /// Where its choices are drawn from: the client's own stream, or its node's health's.
    stream: Stream,
    counter: u64,
    /// Each register's last value read, with its ModifyIndex (0: absent).
    seen: BTreeMap<String, (Option<String>, u64)>,
    holds_kv: bool,
    holds_queue: bool,
    /// Whether it holds the queue's lock by a grant it was told of (not merely maybe).
    granted_queue: bool,
}

impl Client {
    pub fn new(id: usize, world: Arc<World>, history: Arc<Mutex<History>>) -> Client {
        Client {
            id,
            world,
            history,
            session: Arc::default(),
            stream: Stream::Client(id),
            counter: 0,
            seen: BTreeMap::new(),
            holds_kv: false,
            holds_queue: false,
            granted_queue: false,
        }
    }

    fn node_name(&self) -> String {
        format!("client-{}", self.id)
    }

    /// Draws from the client's stream (given the servers to choose from).
    fn draw<T>(&self, f: impl FnOnce(&mut rand::rngs::StdRng, &[u64]) -> T) -> T {
        self.world
            .draw(self.stream, |rng| f(rng, &self.world.servers))
    }

    fn ns(&self, at: Instant) -> u64 {
        at.duration_since(self.world.start).as_nanos() as u64
    }

    /// Sends `call`, retrying on another server what was refused before it was served.
    async fn send(&self, call: Call) -> Outcome {
        self.send_timed(call).await.0
    }

    /// [`Client::send`], telling also how long the last attempt took and how much of it the
    /// network took.
    async fn send_timed(&self, call: Call) -> (Outcome, Duration, Duration) {
        let mut took = (Duration::ZERO, Duration::ZERO);
        for _ in 0..ATTEMPTS {
            let at = self.draw(|rng, servers| servers[rng.gen_range(0..servers.len())]);
            let legs = Legs::default();
            let sent = Instant::now();
            let answer = self.world.request(self.id, at, call.clone(), &legs).await;
            took = (sent.elapsed(), legs.total());
            if let Err(
                ServerError::NoLeader
                | ServerError::NotLeader { .. }
                | ServerError::Unavailable(_)
                | ServerError::ShuttingDown,
            ) = answer
            {
                let pause = self.draw(|rng, _| rng.gen_range(50_000..300_000));
                tokio::time::sleep(Duration::from_micros(pause)).await;
                continue;
            }
            self.world
                .note(format!("client {} {call:?} at {at} -> {answer:?}", self.id));
            let outcome = match answer {
                Ok(reply) => Outcome::Answered(reply),
                Err(ServerError::Indeterminate(_)) => Outcome::Unknown,
                Err(_) => Outcome::Failed,
            };
            return (outcome, took.0, took.1);
        }
        self.world
            .note(format!("client {} {call:?} -> gave up", self.id));
        (Outcome::Failed, took.0, took.1)
    }

    /// A blocking read (`?index=min_index&wait=`) as the agent forwards one: `wait` with the
    /// agent's jitter (under `wait/32`) on top. Its answer is checked at once: within
    /// `wait + wait/16` of the server's time (the network's aside), and not unchanged before
    /// its wait. `None` if it was not answered.
    async fn wait_on(
        &self,
        query: ReadQuery,
        min_index: u64,
        wait: Duration,
    ) -> Option<(QueryResult, u64)> {
        let wait_ms = wait.as_millis() as u64;
        let jitter = self.draw(|rng, _| rng.gen_range(0..=wait_ms / 32));
        let call = Call::Wait {
            query,
            min_index,
            wait_ms: wait_ms + jitter,
        };
        let (outcome, took, legs) = self.send_timed(call).await;
        let Outcome::Answered(Reply::Query(result, index)) = outcome else {
            return None;
        };
        let answer = crate::check::BlockingAnswer {
            min_index,
            wait,
            wait_ms: wait_ms + jitter,
            index,
            served_in: took.saturating_sub(legs),
        };
        if let Some(wrong) = answer.check() {
            self.world
                .violation(format!("client {}: a blocking read {wrong}", self.id));
        }
        Some((*result, index))
    }

    /// Sends `op` until it is answered, or until `until`.
    async fn write_until(&self, op: Op, until: Instant) {
        while Instant::now() < until {
            if let Outcome::Answered(_) = self.send(Call::Write(Box::new(op.clone()))).await {
                return;
            }
        }
    }

    /// The client's node's check, as its agent registers it with `status`.
    fn check(&self, status: HealthStatus) -> Op {
        Op::RegisterCheck(Check {
            node: self.node_name(),
            check_id: CHECK.to_owned(),
            name: CHECK.to_owned(),
            status,
            kind: "ttl".to_owned(),
            ..Check::default()
        })
    }

    /// Registers the client's node and its passing check.
    async fn register(&self, until: Instant) {
        let node = Op::RegisterNode {
            name: self.node_name(),
            address: format!("10.0.0.{}", self.id),
        };
        self.write_until(node, until).await;
        self.write_until(self.check(HealthStatus::Passing), until)
            .await;
    }

    /// Runs the client until `until`.
    pub async fn run(mut self, until: Instant) {
        self.register(until).await;
        let renewer = tokio::spawn(renew_loop(
            self.id,
            Arc::clone(&self.world),
            Arc::clone(&self.history),
            Arc::clone(&self.session),
        ));
        let health = Client {
            stream: Stream::Health(self.id),
            session: Arc::clone(&self.session),
            ..Client::new(self.id, Arc::clone(&self.world), Arc::clone(&self.history))
        };
        let health = tokio::spawn(health.change_health(until));
        while Instant::now() < until {
            let think = self.draw(|rng, _| rng.gen_range(0..250_000));
            tokio::time::sleep(Duration::from_micros(think)).await;
            // A holder of the queue's lock lets go soon: half its turns.
            if self.holds_queue && self.draw(|rng, _| rng.gen_range(0..2) == 0) {
                self.queue_lock().await;
                continue;
            }
            match self.draw(|rng, _| rng.gen_range(0..100)) {
                0..40 => self.register_op().await,
                40..62 => self.kv_lock().await,
                62..94 => self.queue_lock().await,
                _ => self.destroy_session().await,
            }
        }
        renewer.abort();
        let _ = health.await;
    }

    /// What befalls the client's node and application, every 1-6 s until `until`: its check
    /// goes critical and recovers 0.2-2 s later (45%), its node is deregistered and registers
    /// again 0.2-2 s later (20%), or the application abandons its session, which lives on
    /// until its TTL runs out (35%).
    async fn change_health(self, until: Instant) {
        let pause = |lo: u64, hi: u64| {
            Duration::from_micros(self.draw(|rng, _| rng.gen_range(lo * 1000..hi * 1000)))
        };
        loop {
            tokio::time::sleep(pause(1_000, 6_000)).await;
            if Instant::now() >= until {
                return;
            }
            match self.draw(|rng, _| rng.gen_range(0..100)) {
                0..45 => {
                    self.send(Call::Write(Box::new(self.check(HealthStatus::Critical))))
                        .await;
                    tokio::time::sleep(pause(200, 2_000)).await;
                    self.write_until(self.check(HealthStatus::Passing), until)
                        .await;
                }
                45..65 => {
                    let name = self.node_name();
                    self.send(Call::Write(Box::new(Op::DeregisterNode { name })))
                        .await;
                    tokio::time::sleep(pause(200, 2_000)).await;
                    self.register(until).await;
                }
                _ => {
                    if let Some(id) = self.session.lock().take() {
                        self.world
                            .note(format!("client {} abandons session {id}", self.id));
                    }
                }
            }
        }
    }

    /// A read (plain or blocking), write or compare-and-set of a register drawn from the seed.
    pub async fn register_op(&mut self) {
        let key = self.draw(|rng, _| REGISTERS[rng.gen_range(0..REGISTERS.len())]);
        match self.draw(|rng, _| rng.gen_range(0..4)) {
            0 => {
                self.read(key).await;
            }
            3 => self.blocking_read(key).await,
            1 => {
                let value = self.fresh_value();
                let op = Op::Kv(vec![KvOp::Set {
                    key: key.to_owned(),
                    value: value.clone().into_bytes(),
                    flags: 0,
                }]);
                let call = Instant::now();
                let output = match self.send(Call::Write(Box::new(op))).await {
                    Outcome::Answered(Reply::Response(Response::Txn(TxnOutcome::Committed(_)))) => {
                        Some(Output::Written)
                    }
                    Outcome::Unknown => None,
                    _ => return,
                };
                self.record(key, Input::Write(value), output, call);
            }
            _ => {
                let (expected, index) = self.seen.get(key).cloned().unwrap_or((None, 0));
                let new = self.fresh_value();
                let op = Op::Kv(vec![KvOp::Cas {
                    key: key.to_owned(),
                    value: new.clone().into_bytes(),
                    flags: 0,
                    index,
                }]);
                let call = Instant::now();
                let output = match self.send(Call::Write(Box::new(op))).await {
                    Outcome::Answered(Reply::Response(Response::Txn(outcome))) => {
                        Some(Output::Applied(matches!(outcome, TxnOutcome::Committed(_))))
                    }
                    Outcome::Unknown => None,
                    _ => return,
                };
                self.record(key, Input::Cas { expected, new }, output, call);
            }
        }
    }

    /// A default-mode read of `key`, recorded; `None` if it was not answered.
    pub async fn read(&mut self, key: &str) -> Option<Option<KvEntry>> {
        let call = Instant::now();
        let Outcome::Answered(Reply::Entry(entry)) = self.send(Call::Read(key.to_owned())).await
        else {
            return None;
        };
        self.read_answered(key, entry.as_ref(), call);
        Some(entry)
    }

    /// Records a read of `key` sent at `call` that found `entry`, and remembers what it saw.
    fn read_answered(&mut self, key: &str, entry: Option<&KvEntry>, call: Instant) {
        let value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
        self.seen.insert(
            key.to_owned(),
            (value.clone(), entry.map_or(0, |e| e.modify_index)),
        );
        self.record(key, Input::Read, Some(Output::Value(value)), call);
    }

    /// A blocking read of `key` from the index this client last saw it at (a wait of up to
    /// 3 s), recorded like a read: its answer must be at least as new as every write
    /// acknowledged before it was sent.
    async fn blocking_read(&mut self, key: &str) {
        let min_index = self.seen.get(key).map_or(1, |(_, index)| (*index).max(1));
        let wait = Duration::from_millis(self.draw(|rng, _| rng.gen_range(20..3_000)));
        let call = Instant::now();
        let query = ReadQuery::KvGet {
            key: key.to_owned(),
        };
        let Some((QueryResult::Entries(entries), index)) =
            self.wait_on(query, min_index, wait).await
        else {
            return;
        };
        let entry = entries.into_iter().next();
        if let Some(e) = entry.as_ref().filter(|e| e.modify_index > index) {
            self.world.violation(format!(
                "client {}: a blocking read of {key} answered index {index} with an entry modified at {}",
                self.id, e.modify_index
            ));
        }
        self.read_answered(key, entry.as_ref(), call);
    }

    fn fresh_value(&mut self) -> String {
        self.counter += 1;
        format!("c{}-{}", self.id, self.counter)
    }

    fn record(&self, key: &str, input: Input, output: Option<Output>, call: Instant) {
        let ret = output.is_some().then(|| self.ns(Instant::now()));
        let op = linear::Op {
            client: self.id,
            input,
            output,
            call: self.ns(call),
            ret,
        };
        self.history
            .lock()
            .registers
            .entry(key.to_owned())
            .or_default()
            .push(op);
    }

    /// The client's session, created if it has none.
    async fn session(&mut self) -> Option<String> {
        if let Some(id) = self.session.lock().clone() {
            return Some(id);
        }
        self.holds_kv = false;
        self.holds_queue = false;
        self.granted_queue = false;
        let n = self.fresh_value();
        let id = format!("{:016x}-{}-{n}", self.world.seed, self.id);
        let lock_delay = Duration::from_millis(self.draw(|rng, _| rng.gen_range(0..=2_000)));
        let checks = match self.draw(|rng, _| rng.gen_range(0..2)) {
            0 => vec![CHECK.to_owned()],
            _ => Vec::new(),
        };
        let session = Session {
            id: id.clone(),
            name: "sim".to_owned(),
            node: self.node_name(),
            lock_delay_ns: lock_delay.as_nanos() as u64,
            ttl: format!("{}s", TTL.as_secs()),
            node_checks: checks.clone(),
            ..Session::default()
        };
        {
            let mut history = self.history.lock();
            // The session's TTL runs from no earlier than this.
            history
                .renewals
                .entry(id.clone())
                .or_default()
                .push(Instant::now());
            history.lock_delays.insert(id.clone(), lock_delay);
            history
                .bindings
                .insert(id.clone(), (self.node_name(), checks));
        }
        match self
            .send(Call::Write(Box::new(Op::CreateSession(session))))
            .await
        {
            Outcome::Answered(Reply::Response(Response::SessionCreated { .. })) => {
                *self.session.lock() = Some(id.clone());
                Some(id)
            }
            _ => None,
        }
    }

    /// Takes the KV lock (reading back its `LockIndex` in the same transaction), or releases it.
    /// Refused, it waits for the holder to let go as a Consul lock does (a blocking read of
    /// the key from the index it stands at) and tries once more.
    async fn kv_lock(&mut self) {
        let Some(session) = self.session().await else {
            return;
        };
        if self.holds_kv {
            self.holds_kv = false;
            self.released(false, &session);
            let op = Op::Kv(vec![KvOp::Unlock {
                key: KV_LOCK.to_owned(),
                value: Vec::new(),
                flags: 0,
                session,
            }]);
            self.send(Call::Write(Box::new(op))).await;
            return;
        }
        if self.acquire_kv(&session).await {
            return;
        }
        let Outcome::Answered(Reply::Entry(Some(held))) =
            self.send(Call::Read(KV_LOCK.to_owned())).await
        else {
            return;
        };
        let wait = Duration::from_millis(self.draw(|rng, _| rng.gen_range(20..3_000)));
        let query = ReadQuery::KvGet {
            key: KV_LOCK.to_owned(),
        };
        if self.wait_on(query, held.modify_index, wait).await.is_some() {
            self.acquire_kv(&session).await;
        }
    }

    /// One acquire of the KV lock: whether it was answered (granted or refused).
    async fn acquire_kv(&mut self, session: &str) -> bool {
        let op = Op::Kv(vec![
            KvOp::Lock {
                key: KV_LOCK.to_owned(),
                value: format!("client {}", self.id).into_bytes(),
                flags: 0,
                session: session.to_owned(),
            },
            KvOp::Get {
                key: KV_LOCK.to_owned(),
            },
        ]);
        let call = Instant::now();
        match self.send(Call::Write(Box::new(op))).await {
            Outcome::Answered(Reply::Response(Response::Txn(TxnOutcome::Committed(entries)))) => {
                let Some(entry) = entries.last() else {
                    self.world
                        .violation(format!("client {}: an acquire read nothing back", self.id));
                    return true;
                };
                if entry.session.as_deref() != Some(session) {
                    self.world.violation(format!(
                        "client {}: acquired {KV_LOCK} with session {session}, read back held by {:?}",
                        self.id, entry.session
                    ));
                }
                self.holds_kv = true;
                let applied = Applied::AtIndex(entry.modify_index);
                self.grant(false, session, entry.lock_index, call, applied);
                true
            }
            // It may hold it: let it go (a release by a session that does not hold it changes
            // nothing).
            Outcome::Unknown => {
                self.holds_kv = true;
                true
            }
            Outcome::Answered(_) => false,
            Outcome::Failed => true,
        }
    }

    /// Takes a lock of the lock queue, or releases it. Most acquires wait in the queue for
    /// their grant as the agent's `PUT` does: enqueue under a request identity, block on the
    /// session's standing from the enqueue's index, and give the place up (`Leave` naming the
    /// request) when the wait ends first; some are tries. One whose outcome is unknown is
    /// given up as the agent gives up a request whose client went away.
    async fn queue_lock(&mut self) {
        let Some(session) = self.session().await else {
            return;
        };
        if self.holds_queue {
            self.holds_queue = false;
            self.released(true, &session);
            let op = Op::Lock(LockOp::Release {
                name: QUEUE_LOCK.to_owned(),
                session: session.clone(),
            });
            let answer = self.send(Call::Write(Box::new(op))).await;
            let granted = std::mem::take(&mut self.granted_queue);
            if let Outcome::Answered(Reply::Response(Response::Lock(LockOutcome::Released {
                held: false,
                ..
            }))) = answer
                && granted
            {
                // Lost without a release of its own: only its session's end may take it.
                self.history.lock().lost.push((session, wall_ms()));
            }
            return;
        }
        let try_only = self.draw(|rng, _| rng.gen_range(0..5) == 0);
        let request = self.draw(|rng, _| rng.r#gen::<u64>() | 1);
        let call = Instant::now();
        match self.send(enqueue(&session, try_only, request)).await {
            Outcome::Answered(Reply::Response(Response::Lock(LockOutcome::Granted {
                token,
                ..
            }))) => self.granted(session, token, call, Applied::By(wall_ms())),
            Outcome::Answered(Reply::Response(Response::Lock(LockOutcome::Waiting {
                index,
                ..
            }))) if !try_only => self.wait_in_queue(session, request, index, call).await,
            Outcome::Unknown => {
                let at = self.draw(|rng, servers| servers[rng.gen_range(0..servers.len())]);
                let leave = leave(self.world.plant, &session, request);
                let answer = self
                    .world
                    .request(self.id, at, leave, &Legs::default())
                    .await;
                self.left(session, answer, call);
            }
            _ => {}
        }
    }

    /// Waits in the queue for a grant, for a wait drawn from the seed. Half the waits
    /// reconnect partway, as a client whose connection dropped asks again: a new request
    /// claims the place, and the first request's agent gives up what that request claimed, up
    /// to 3 s later (when it notices the dropped connection), while the new one waits.
    async fn wait_in_queue(&mut self, session: String, request: u64, index: u64, call: Instant) {
        let wait = Duration::from_millis(self.draw(|rng, _| rng.gen_range(500..5_000)));
        let deadline = Instant::now() + wait;
        // When a reconnecting client's connection drops: a tenth to a half into its wait.
        let mut reconnect = self
            .draw(|rng, _| rng.gen_range(0..2) == 0)
            .then(|| wait * self.draw(|rng, _| rng.gen_range(10..50)) / 100);
        let (mut request, mut index) = (request, index);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Less than a millisecond is no wait (the servers are asked in milliseconds).
            if left < Duration::from_millis(1) {
                let leave = leave(self.world.plant, &session, request);
                let answer = match self.send(leave).await {
                    Outcome::Answered(reply) => Ok(reply),
                    Outcome::Unknown => Err(ServerError::Indeterminate(String::new())),
                    Outcome::Failed => Err(ServerError::NoLeader),
                };
                return self.left(session, answer, call);
            }
            let query = ReadQuery::LockHold {
                name: QUEUE_LOCK.to_owned(),
                session: session.clone(),
            };
            let look = reconnect.map_or(left, |drops| left.min(drops));
            if let Some((QueryResult::Hold(hold), at)) = self.wait_on(query, index, look).await {
                match hold {
                    LockHold::Held {
                        token, since_ms, ..
                    } => return self.granted(session, token, call, Applied::At(since_ms)),
                    LockHold::Absent => return,
                    LockHold::Queued { .. } => index = index.max(at),
                }
            }
            if reconnect.take().is_none() {
                continue;
            }
            let old = request;
            request = self.draw(|rng, _| rng.r#gen::<u64>() | 1);
            let (at, after) = self.draw(|rng, servers| {
                let at = servers[rng.gen_range(0..servers.len())];
                (at, Duration::from_micros(rng.gen_range(0..3_000_000)))
            });
            let (world, id, leave) = (
                Arc::clone(&self.world),
                self.id,
                leave(self.world.plant, &session, old),
            );
            let again = self.send(enqueue(&session, false, request)).await;
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let answer = world.request(id, at, leave, &Legs::default()).await;
                world.note(format!(
                    "client {id}: the dropped request's agent left: {answer:?}"
                ));
            });
            match again {
                Outcome::Answered(Reply::Response(Response::Lock(LockOutcome::Granted {
                    token,
                    ..
                }))) => return self.granted(session, token, call, Applied::By(wall_ms())),
                Outcome::Answered(Reply::Response(Response::Lock(LockOutcome::Waiting {
                    index: at,
                    ..
                }))) => index = index.max(at),
                Outcome::Unknown => {
                    self.holds_queue = true;
                    return;
                }
                _ => return,
            }
        }
    }

    /// What a request that gave up its place was told: a grant that landed first is kept.
    fn left(&mut self, session: String, answer: Result<Reply, ServerError>, call: Instant) {
        match answer {
            Ok(Reply::Response(Response::Lock(LockOutcome::Stayed(LockHold::Held {
                token,
                since_ms,
                ..
            })))) => self.granted(session, token, call, Applied::At(since_ms)),
            Ok(_) => {}
            // It may hold it: let it go.
            Err(_) => self.holds_queue = true,
        }
    }

    fn granted(&mut self, session: String, token: u64, call: Instant, applied: Applied) {
        self.holds_queue = true;
        self.granted_queue = true;
        self.grant(true, &session, token, call, applied);
    }

    fn grant(&self, queue: bool, session: &str, index: u64, call: Instant, applied: Applied) {
        let grant = Grant {
            client: self.id,
            session: session.to_owned(),
            index,
            call,
            ret: Instant::now(),
            ret_ms: wall_ms(),
            applied,
        };
        let mut history = self.history.lock();
        if queue {
            history.queue_grants.push(grant);
        } else {
            history.kv_grants.push(grant);
        }
    }

    /// Notes that this client lets go of a lock it holds (the queue's or the KV one), now.
    fn released(&self, queue: bool, session: &str) {
        let mut history = self.history.lock();
        let releases = if queue {
            &mut history.queue_releases
        } else {
            &mut history.kv_releases
        };
        releases
            .entry(session.to_owned())
            .or_default()
            .push(wall_ms());
    }

    async fn destroy_session(&mut self) {
        let Some(id) = self.session.lock().take() else {
            return;
        };
        let destroy = Op::DestroySession { id: id.clone() };
        if let Outcome::Answered(_) = self.send(Call::Write(Box::new(destroy))).await {
            self.history.lock().destroys.push((id, wall_ms()));
        }
    }
}

/// An enqueue on the queue's lock, as the agent's `PUT` makes it.
fn enqueue(session: &str, try_only: bool, request: u64) -> Call {
    Call::Write(Box::new(Op::Lock(LockOp::Enqueue {
        name: QUEUE_LOCK.to_owned(),
        session: session.to_owned(),
        mode: LockMode::Exclusive,
        limit: 1,
        try_only,
        request,
    })))
}

/// How the agent gives up the place `request` claimed (with `leave-releases` planted, a plain
/// release of whatever the session has).
fn leave(plant: Plant, session: &str, request: u64) -> Call {
    let op = if plant == Plant::LeaveReleases {
        LockOp::Release {
            name: QUEUE_LOCK.to_owned(),
            session: session.to_owned(),
        }
    } else {
        LockOp::Leave {
            name: QUEUE_LOCK.to_owned(),
            session: session.to_owned(),
            request,
        }
    };
    Call::Write(Box::new(Op::Lock(op)))
}

/// Renews the client's session every [`RENEW_EVERY`]; a session found gone is forgotten (the
/// client creates another when it next needs one).
async fn renew_loop(
    client: usize,
    world: Arc<World>,
    history: Arc<Mutex<History>>,
    session: Arc<Mutex<Option<String>>>,
) {
    let mut every = tokio::time::interval(RENEW_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(id) = session.lock().clone() else {
            continue;
        };
        let at = world.draw(Stream::Renewals(client), |rng| {
            world.servers[rng.gen_range(0..world.servers.len())]
        });
        let call = Instant::now();
        let answer = world
            .request(client, at, Call::Renew(id.clone()), &Legs::default())
            .await;
        world.note(format!("client {client} renew {id} at {at} -> {answer:?}"));
        match answer {
            Ok(_) => history.lock().renewals.entry(id).or_default().push(call),
            Err(ServerError::SessionNotFound(_)) => {
                let mut current = session.lock();
                if current.as_deref() == Some(id.as_str()) {
                    *current = None;
                }
            }
            Err(_) => {}
        }
    }
}
