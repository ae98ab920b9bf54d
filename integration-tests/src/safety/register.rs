//! (c) The register workload that runs beside the locks: a few writers put unique keys under
//! [`PREFIX`] through whichever client agent is up, round-robin, for the whole run. A write
//! answered `true` is acknowledged (it must read back at the end); one that failed or timed out
//! is in doubt (it may or may not have been applied). Also the board of agent addresses the
//! environments keep up to date as nodes die and come back. Every client is built from the
//! environment's [`ClientConfig`] (its CA and ACL token) with the agent's address filled in.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use vigil_client::{Client, ClientConfig, ReadOpts};

/// Where the register keys live.
pub const PREFIX: &str = "safety/register/";
/// A write not answered within this long is in doubt (a frozen agent never answers).
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause between two writes of one writer, so the registers do not starve the lock traffic.
const PACE: Duration = Duration::from_millis(40);
/// How long the final read may keep retrying (through an election, say).
const READ_LIMIT: Duration = Duration::from_secs(60);

/// HTTP addresses of the client agents, `None` while one is down. Shared with the workload.
#[derive(Debug, Clone, Default)]
pub struct AgentBoard(Arc<Mutex<Vec<Option<String>>>>);

impl AgentBoard {
    pub fn new(agents: Vec<Option<String>>) -> AgentBoard {
        AgentBoard(Arc::new(Mutex::new(agents)))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<Option<String>>> {
        self.0.lock()
    }

    pub fn set(&self, i: usize, agent: Option<String>) {
        self.lock()[i] = agent;
    }

    pub fn get(&self, i: usize) -> Option<String> {
        self.lock()[i].clone()
    }

    /// The agents that are up.
    pub fn up(&self) -> Vec<String> {
        self.lock().iter().flatten().cloned().collect()
    }
}

/// What the writers did.
#[derive(Debug, Default)]
pub struct RegisterLog {
    /// Acknowledged writes: key → value.
    pub acked: BTreeMap<String, String>,
    /// Every key a write was sent for (acknowledged or in doubt).
    pub attempted: BTreeSet<String>,
    pub in_doubt: usize,
}

impl RegisterLog {
    fn merge(&mut self, other: RegisterLog) {
        self.acked.extend(other.acked);
        self.attempted.extend(other.attempted);
        self.in_doubt += other.in_doubt;
    }
}

/// A client for the agent at `base` (`http://…` or `https://…`), with `config`'s TLS files and
/// token.
pub fn client(config: &ClientConfig, base: &str) -> Client {
    ClientConfig {
        addr: Some(base.to_owned()),
        ..config.clone()
    }
    .build()
    .expect("agent address and TLS files")
}

/// Runs `writers` writers until `stop` says so.
pub async fn write(
    agents: AgentBoard,
    config: ClientConfig,
    writers: usize,
    stop: watch::Receiver<bool>,
) -> RegisterLog {
    let runs = (0..writers).map(|w| writer(w, agents.clone(), config.clone(), stop.clone()));
    let mut log = RegisterLog::default();
    for one in futures::future::join_all(runs).await {
        log.merge(one);
    }
    log
}

async fn writer(
    w: usize,
    agents: AgentBoard,
    config: ClientConfig,
    mut stop: watch::Receiver<bool>,
) -> RegisterLog {
    let mut log = RegisterLog::default();
    let mut clients: HashMap<String, Client> = HashMap::new();
    let mut turn = w;
    let mut seq = 0u64;
    while !*stop.borrow() {
        let up = agents.up();
        if !up.is_empty() {
            let base = &up[turn % up.len()];
            turn += 1;
            let client = match clients.get(base) {
                Some(c) => c.clone(),
                None => {
                    let c = client(&config, base);
                    clients.insert(base.clone(), c.clone());
                    c
                }
            };
            seq += 1;
            let key = format!("{PREFIX}w{w}/{seq:06}");
            let value = format!("{w}:{seq}");
            log.attempted.insert(key.clone());
            match timeout(WRITE_TIMEOUT, client.kv_put(&key, value.as_bytes(), 0)).await {
                Ok(Ok(true)) => {
                    log.acked.insert(key, value);
                }
                _ => log.in_doubt += 1,
            }
        }
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(PACE) => {}
        }
    }
    log
}

/// Reads every register back with a linearizable read through one of `readers`.
pub async fn read_back(readers: &[String], config: &ClientConfig) -> BTreeMap<String, String> {
    let deadline = Instant::now() + READ_LIMIT;
    let mut attempt = 0;
    loop {
        let base = &readers[attempt % readers.len()];
        attempt += 1;
        let error = match client(config, base)
            .kv_list(PREFIX, ReadOpts::default().consistent())
            .await
        {
            Ok((entries, _)) => {
                return entries
                    .into_iter()
                    .map(|e| (e.key, String::from_utf8_lossy(&e.value).into_owned()))
                    .collect();
            }
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "could not read the registers back within {READ_LIMIT:?}: {base}: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
