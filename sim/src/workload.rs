//! The clients: each registers its node, keeps a TTL session renewed, and in a loop reads,
//! writes and compare-and-sets a few KV registers, takes and releases a Consul-style KV lock
//! and a lock of the lock queue, and now and then destroys its session. Every request goes to
//! a server drawn from the seed; one refused before it was served (no leader, server down) is
//! retried on another after a pause, as the agent does; one whose outcome is unknown is
//! recorded as such. What they saw goes into the [`History`] the checks read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng as _;
use tokio::time::Instant;
use vigil_shared::kv::{KvEntry, KvOp, TxnOutcome};
use vigil_shared::lock::{LockMode, LockOp, LockOutcome};
use vigil_shared::rpc::{Op, Response, ServerError};
use vigil_shared::session::Session;

use crate::gateway::{Call, Reply};
use crate::linear::{self, Input, Output};
use crate::world::{Stream, World};

/// The registers clients read and write.
pub const REGISTERS: [&str; 3] = ["reg/a", "reg/b", "reg/c"];
/// The Consul-style lock's key and the lock queue's lock.
pub const KV_LOCK: &str = "lock/kv";
pub const QUEUE_LOCK: &str = "queue";
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
}

/// What the clients saw.
#[derive(Default)]
pub struct History {
    /// Each register's operations (times in ns since the run began).
    pub registers: BTreeMap<String, Vec<linear::Op>>,
    pub kv_grants: Vec<Grant>,
    pub queue_grants: Vec<Grant>,
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
    counter: u64,
    /// Each register's last value read, with its ModifyIndex (0: absent).
    seen: BTreeMap<String, (Option<String>, u64)>,
    holds_kv: bool,
    holds_queue: bool,
}

impl Client {
    pub fn new(id: usize, world: Arc<World>, history: Arc<Mutex<History>>) -> Client {
        Client {
            id,
            world,
            history,
            session: Arc::default(),
            counter: 0,
            seen: BTreeMap::new(),
            holds_kv: false,
            holds_queue: false,
        }
    }

    fn node_name(&self) -> String {
        format!("client-{}", self.id)
    }

    /// Draws from the client's stream (given the servers to choose from).
    fn draw<T>(&self, f: impl FnOnce(&mut rand::rngs::StdRng, &[u64]) -> T) -> T {
        self.world
            .draw(Stream::Client(self.id), |rng| f(rng, &self.world.servers))
    }

    fn ns(&self, at: Instant) -> u64 {
        at.duration_since(self.world.start).as_nanos() as u64
    }

    /// Sends `call`, retrying on another server what was refused before it was served.
    async fn send(&self, call: Call) -> Outcome {
        for _ in 0..ATTEMPTS {
            let at = self.draw(|rng, servers| servers[rng.gen_range(0..servers.len())]);
            let answer = self.world.request(self.id, at, call.clone()).await;
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
            return match answer {
                Ok(reply) => Outcome::Answered(reply),
                Err(ServerError::Indeterminate(_)) => Outcome::Unknown,
                Err(_) => Outcome::Failed,
            };
        }
        self.world
            .note(format!("client {} {call:?} -> gave up", self.id));
        Outcome::Failed
    }

    /// Runs the client until `until`.
    pub async fn run(mut self, until: Instant) {
        let register = Op::RegisterNode {
            name: self.node_name(),
            address: format!("10.0.0.{}", self.id),
        };
        while Instant::now() < until {
            if let Outcome::Answered(_) = self.send(Call::Write(Box::new(register.clone()))).await {
                break;
            }
        }
        let renewer = tokio::spawn(renew_loop(
            self.id,
            Arc::clone(&self.world),
            Arc::clone(&self.history),
            Arc::clone(&self.session),
        ));
        while Instant::now() < until {
            let think = self.draw(|rng, _| rng.gen_range(0..250_000));
            tokio::time::sleep(Duration::from_micros(think)).await;
            match self.draw(|rng, _| rng.gen_range(0..100)) {
                0..50 => self.register_op().await,
                50..72 => self.kv_lock().await,
                72..94 => self.queue_lock().await,
                _ => self.destroy_session().await,
            }
        }
        renewer.abort();
    }

    /// A read, write or compare-and-set of a register drawn from the seed.
    pub async fn register_op(&mut self) {
        let key = self.draw(|rng, _| REGISTERS[rng.gen_range(0..REGISTERS.len())]);
        match self.draw(|rng, _| rng.gen_range(0..3)) {
            0 => {
                self.read(key).await;
            }
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
        let value = entry
            .as_ref()
            .map(|e| String::from_utf8_lossy(&e.value).into_owned());
        self.seen.insert(
            key.to_owned(),
            (value.clone(), entry.as_ref().map_or(0, |e| e.modify_index)),
        );
        self.record(key, Input::Read, Some(Output::Value(value)), call);
        Some(entry)
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
        let n = self.fresh_value();
        let id = format!("{:016x}-{}-{n}", self.world.seed, self.id);
        let session = Session {
            id: id.clone(),
            name: "sim".to_owned(),
            node: self.node_name(),
            lock_delay_ns: 1_000_000_000,
            ttl: format!("{}s", TTL.as_secs()),
            ..Session::default()
        };
        // The session's TTL runs from no earlier than this.
        self.history
            .lock()
            .renewals
            .entry(id.clone())
            .or_default()
            .push(Instant::now());
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
    async fn kv_lock(&mut self) {
        let Some(session) = self.session().await else {
            return;
        };
        if self.holds_kv {
            self.holds_kv = false;
            let op = Op::Kv(vec![KvOp::Unlock {
                key: KV_LOCK.to_owned(),
                value: Vec::new(),
                flags: 0,
                session,
            }]);
            self.send(Call::Write(Box::new(op))).await;
            return;
        }
        let op = Op::Kv(vec![
            KvOp::Lock {
                key: KV_LOCK.to_owned(),
                value: format!("client {}", self.id).into_bytes(),
                flags: 0,
                session: session.clone(),
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
                    return;
                };
                if entry.session.as_deref() != Some(session.as_str()) {
                    self.world.violation(format!(
                        "client {}: acquired {KV_LOCK} with session {session}, read back held by {:?}",
                        self.id, entry.session
                    ));
                }
                self.holds_kv = true;
                self.grant(false, session, entry.lock_index, call);
            }
            // It may hold it: let it go (a release by a session that does not hold it changes
            // nothing).
            Outcome::Unknown => self.holds_kv = true,
            _ => {}
        }
    }

    /// Takes a lock of the lock queue (a try, so it never waits), or releases it.
    async fn queue_lock(&mut self) {
        let Some(session) = self.session().await else {
            return;
        };
        if self.holds_queue {
            self.holds_queue = false;
            let op = Op::Lock(LockOp::Release {
                name: QUEUE_LOCK.to_owned(),
                session,
            });
            self.send(Call::Write(Box::new(op))).await;
            return;
        }
        let op = Op::Lock(LockOp::Acquire {
            name: QUEUE_LOCK.to_owned(),
            session: session.clone(),
            mode: LockMode::Exclusive,
            limit: 1,
            try_only: true,
        });
        let call = Instant::now();
        match self.send(Call::Write(Box::new(op))).await {
            Outcome::Answered(Reply::Response(Response::Lock(LockOutcome::Held { token }))) => {
                self.holds_queue = true;
                self.grant(true, session, token, call);
            }
            Outcome::Unknown => self.holds_queue = true,
            _ => {}
        }
    }

    fn grant(&self, queue: bool, session: String, index: u64, call: Instant) {
        let grant = Grant {
            client: self.id,
            session,
            index,
            call,
            ret: Instant::now(),
        };
        let mut history = self.history.lock();
        if queue {
            history.queue_grants.push(grant);
        } else {
            history.kv_grants.push(grant);
        }
    }

    async fn destroy_session(&mut self) {
        let Some(id) = self.session.lock().take() else {
            return;
        };
        self.send(Call::Write(Box::new(Op::DestroySession { id })))
            .await;
    }
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
        let answer = world.request(client, at, Call::Renew(id.clone())).await;
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
