//! The loopback environment: a [`Cluster`] of 3 servers and one client agent per worker on
//! 127.0.0.1, the bank as a `vigil-demo bank` process, and per client a supervisor task that
//! runs `vigil lock --fair demo/leader -- vigil-demo worker ...` again each time it exits and
//! collects the worker's lines. Faults are signals: SIGKILL (a crash) and SIGSTOP/SIGCONT (a
//! frozen node; a frozen agent alone stands in for a partition, since its worker still reaches
//! the bank).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use vigil_client::ClientConfig;
use vigil_demo::{WorkerEvent, WorkerLine};

use super::register::AgentBoard;
use super::schedule::FaultKind;
use super::{Env, LOCK_PREFIX, Plan, WorkerSpec};
use crate::cluster::Cluster;
use crate::{Http, SHORT_SESSION_TTL, binary, demo_binary};

/// How long to wait for someone to hold the lock before a holder fault.
const HOLDER_WAIT: Duration = Duration::from_secs(30);
/// How long a thawed worker gets to take its next step before its `vigil lock` thaws too.
const WORKER_STEP: Duration = Duration::from_secs(1);
/// How long a stopped worker may take to exit after SIGTERM before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Process IDs of a client node's current `vigil lock` and worker (0: none).
#[derive(Debug, Clone, Copy, Default)]
struct Procs {
    lock: u32,
    worker: u32,
}

type Lines = Arc<Mutex<Vec<WorkerLine>>>;
type ProcTable = Arc<Mutex<Vec<Procs>>>;

pub(crate) struct Loopback {
    cluster: Cluster,
    bank: SocketAddr,
    /// Killed on drop.
    _bank_process: Child,
    agents: AgentBoard,
    procs: ProcTable,
    lines: Lines,
    stop: watch::Sender<bool>,
    supervisors: Vec<JoinHandle<()>>,
}

/// `kill -SIG pid` (`group`: the process group `pid`); false when nothing was signalled.
fn signal(pid: u32, sig: &str, group: bool) -> bool {
    if pid == 0 {
        return false;
    }
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    std::process::Command::new("kill")
        .args([sig, "--", &target])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Loopback {
    pub(crate) async fn start(plan: &Plan) -> anyhow::Result<Loopback> {
        let cluster = Cluster::servers(3)
            .clients(plan.workers)
            .gossip_profile("local")
            .env(SHORT_SESSION_TTL)
            .start()
            .await;
        let (bank_process, bank) = start_bank(&cluster, plan.worker.broken).await?;
        let agents = AgentBoard::new(
            (0..plan.workers)
                .map(|i| Some(cluster.client(i).base.clone()))
                .collect(),
        );
        let procs: ProcTable = Arc::new(Mutex::new(vec![Procs::default(); plan.workers]));
        let lines: Lines = Arc::default();
        let (stop, stopped) = watch::channel(false);
        let supervisors = (0..plan.workers)
            .map(|i| {
                let supervisor = Supervisor {
                    node: i,
                    spec: plan.worker.clone(),
                    bank,
                    agents: agents.clone(),
                    procs: Arc::clone(&procs),
                    lines: Arc::clone(&lines),
                    log: cluster.dir().join(format!("worker-c{i}.log")),
                };
                tokio::spawn(supervisor.run(stopped.clone()))
            })
            .collect();
        Ok(Loopback {
            cluster,
            bank,
            _bank_process: bank_process,
            agents,
            procs,
            lines,
            stop,
            supervisors,
        })
    }

    fn procs(&self, i: usize) -> Procs {
        self.procs.lock()[i]
    }

    /// The client node whose worker holds the lock, per `/v1/vigil/locks` on a server.
    async fn holder(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + HOLDER_WAIT;
        loop {
            for s in self.cluster.running_servers() {
                let server: &Http = self.cluster.server(s);
                let Some(reply) = server
                    .try_get(&format!("/v1/vigil/locks?prefix={LOCK_PREFIX}"))
                    .await
                else {
                    continue;
                };
                if reply.status != 200 {
                    continue;
                }
                let report = reply.json();
                let node = report["Queues"][0]["Holders"][0]["Node"].as_str();
                if let Some(i) = node.and_then(|n| n.strip_prefix('c')?.parse().ok()) {
                    return Ok(i);
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "nobody held {LOCK_PREFIX} for {HOLDER_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for a worker in the middle of its turn (confirmed, not yet released) and freezes
    /// its node (agent, `vigil lock`, worker): a frozen holder that still has writes to make.
    /// Returns the node and the processes frozen.
    async fn freeze_writing_holder(&self) -> anyhow::Result<(usize, Procs)> {
        let deadline = Instant::now() + HOLDER_WAIT;
        loop {
            let writing = {
                let lines = self.lines.lock();
                let mut last: BTreeMap<&str, &WorkerEvent> = BTreeMap::new();
                for line in lines.iter() {
                    last.insert(&line.node, &line.event);
                }
                last.into_iter().find_map(|(node, event)| match event {
                    WorkerEvent::Grant { owner: true, .. } | WorkerEvent::Write { .. } => {
                        node.strip_prefix('c')?.parse::<usize>().ok()
                    }
                    _ => None,
                })
            };
            if let Some(i) = writing {
                let procs = self.procs(i);
                if procs.worker != 0 {
                    for pid in [
                        self.cluster.client(i).pid().unwrap_or(0),
                        procs.lock,
                        procs.worker,
                    ] {
                        signal(pid, "-STOP", false);
                    }
                    return Ok((i, procs));
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no worker was in the middle of its turn for {HOLDER_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How many lines client node `i`'s workers have printed.
    fn worker_lines(&self, i: usize) -> usize {
        let node = format!("c{i}");
        self.lines.lock().iter().filter(|l| l.node == node).count()
    }
}

/// Starts `vigil-demo bank` on a free port; returns the process and its address.
async fn start_bank(cluster: &Cluster, broken: bool) -> anyhow::Result<(Child, SocketAddr)> {
    let mut command = Command::new(demo_binary());
    command.args(["bank", "--listen", "127.0.0.1:0"]);
    if broken {
        command.arg("--allow-unfenced");
    }
    let log = std::fs::File::create(cluster.dir().join("bank.log"))?;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting vigil-demo bank")?;
    let mut lines = BufReader::new(child.stdout.take().context("bank stdout")?).lines();
    let first = timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the bank did not start")??
        .context("the bank exited")?;
    let addr = first
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("no address in {first:?}"))?;
    // Its log of decisions, kept beside the agents' logs.
    let mut log = std::fs::File::create(cluster.dir().join("bank.out"))?;
    tokio::spawn(async move {
        use std::io::Write as _;
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = writeln!(log, "{line}");
        }
    });
    Ok((child, addr))
}

/// Keeps one client node's worker taking turns.
struct Supervisor {
    node: usize,
    spec: WorkerSpec,
    bank: SocketAddr,
    agents: AgentBoard,
    procs: ProcTable,
    lines: Lines,
    log: std::path::PathBuf,
}

impl Supervisor {
    fn set_procs(&self, update: impl FnOnce(&mut Procs)) {
        update(&mut self.procs.lock()[self.node]);
    }

    /// `vigil lock --fair ... demo/leader -- vigil-demo worker ...` against `agent`.
    fn command(&self, agent: &str) -> anyhow::Result<Command> {
        let spec = &self.spec;
        let mut command = Command::new(binary());
        command
            .arg("lock")
            .arg("--fair")
            .arg("--http-addr")
            .arg(agent);
        for (flag, d) in [
            ("--ttl", spec.ttl),
            ("--lock-delay", spec.lock_delay),
            ("--grace", spec.grace),
        ] {
            command.arg(flag).arg(format!("{}ms", d.as_millis()));
        }
        command.arg(LOCK_PREFIX).arg("--").arg(demo_binary());
        command.args(["worker", "--name", &format!("c{}", self.node)]);
        command.arg("--bank").arg(self.bank.to_string());
        command.arg("--http-addr").arg(agent);
        command.arg("--writes").arg(spec.writes.to_string());
        command
            .arg("--interval")
            .arg(format!("{}ms", spec.interval.as_millis()));
        if spec.broken {
            command.args(["--unfenced", "--ignore-loss"]);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        Ok(command)
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let Some(agent) = self.agents.get(self.node) else {
                // The node is down (killed); wait until it is back.
                tokio::select! {
                    _ = stop.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                continue;
            };
            let mut child = match self.command(&agent).and_then(|mut c| Ok(c.spawn()?)) {
                Ok(child) => child,
                Err(e) => panic!("starting vigil lock for c{}: {e:#}", self.node),
            };
            let lock_pid = child.id().unwrap_or(0);
            self.set_procs(|p| {
                *p = Procs {
                    lock: lock_pid,
                    worker: 0,
                }
            });
            let stdout = child.stdout.take().expect("piped stdout");
            let mut out = BufReader::new(stdout).lines();
            let mut stopping = false;
            loop {
                tokio::select! {
                    line = out.next_line() => match line {
                        Ok(Some(line)) => self.record(&line),
                        _ => break,
                    },
                    _ = stop.changed(), if !stopping => {
                        stopping = true;
                        // vigil lock forwards SIGTERM to the worker's group.
                        signal(lock_pid, "-TERM", false);
                        let procs = self.procs.lock()[self.node];
                        tokio::spawn(kill_after(STOP_WAIT, procs));
                    }
                }
            }
            let status = child.wait().await;
            self.set_procs(|p| *p = Procs::default());
            if !status.is_ok_and(|s| s.success()) {
                // Not a clean turn (agent down, lock lost): do not spin.
                tokio::select! {
                    _ = stop.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    }

    fn record(&self, line: &str) {
        let Ok(parsed) = serde_json::from_str::<WorkerLine>(line) else {
            return;
        };
        if let WorkerEvent::Grant { pid, .. } = parsed.event {
            self.set_procs(|p| p.worker = pid);
        }
        self.lines.lock().push(parsed);
    }
}

/// SIGKILLs what is left of a stopped turn after `wait` (a worker that ignores SIGTERM).
async fn kill_after(wait: Duration, procs: Procs) {
    tokio::time::sleep(wait).await;
    signal(procs.worker, "-KILL", true);
    signal(procs.lock, "-KILL", true);
}

impl Env for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn agents(&self) -> AgentBoard {
        self.agents.clone()
    }

    fn readers(&self) -> Vec<String> {
        self.cluster
            .running_servers()
            .into_iter()
            .map(|i| self.cluster.server(i).base.clone())
            .collect()
    }

    fn client_config(&self) -> ClientConfig {
        // Plain HTTP, ACLs off.
        ClientConfig::default()
    }

    fn bank(&self) -> String {
        format!("http://{}", self.bank)
    }

    async fn fault(&mut self, kind: FaultKind, hold: Duration) -> anyhow::Result<String> {
        match kind {
            FaultKind::KillLeader => {
                let leader = self.cluster.leader().await;
                self.cluster.kill9(leader).await;
                tokio::time::sleep(hold).await;
                self.cluster.restart(leader).await;
                Ok(self.cluster.servers[leader].name.clone())
            }
            FaultKind::KillHolder => {
                let i = self.holder().await?;
                let procs = self.procs(i);
                self.agents.set(i, None);
                signal(procs.worker, "-KILL", true);
                signal(procs.lock, "-KILL", true);
                self.cluster.kill9_client(i).await;
                tokio::time::sleep(hold).await;
                self.cluster.restart_client(i).await;
                self.agents
                    .set(i, Some(self.cluster.client(i).base.clone()));
                Ok(format!("c{i}"))
            }
            FaultKind::PauseHolder => {
                let (i, procs) = self.freeze_writing_holder().await?;
                let agent = self.cluster.client(i).pid().unwrap_or(0);
                tokio::time::sleep(hold).await;
                // The worker thaws first, as if its `vigil lock` were slower to notice that the
                // lock is gone: its next write carries a token that may be stale by now, and
                // the bank must turn it away. Then `vigil lock` thaws too.
                let seen = self.worker_lines(i);
                signal(agent, "-CONT", false);
                signal(procs.worker, "-CONT", false);
                let deadline = Instant::now() + WORKER_STEP;
                while procs.worker != 0 && self.worker_lines(i) == seen && Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                signal(procs.lock, "-CONT", false);
                Ok(format!("c{i}"))
            }
            FaultKind::PartitionHolder => {
                let i = self.holder().await?;
                let agent = self.cluster.client(i).pid().unwrap_or(0);
                signal(agent, "-STOP", false);
                tokio::time::sleep(hold).await;
                signal(agent, "-CONT", false);
                Ok(format!("c{i}"))
            }
            FaultKind::RestartAll => {
                let servers = self.cluster.running_servers();
                for &s in &servers {
                    self.cluster.kill9(s).await;
                }
                tokio::time::sleep(hold).await;
                for &s in &servers {
                    self.cluster.restart(s).await;
                }
                let names: Vec<&str> = servers
                    .iter()
                    .map(|&s| self.cluster.servers[s].name.as_str())
                    .collect();
                Ok(names.join(" "))
            }
            FaultKind::LossyNetwork => {
                anyhow::bail!("packet loss needs network namespaces: Docker only")
            }
        }
    }

    async fn lines(&mut self) -> anyhow::Result<Vec<WorkerLine>> {
        Ok(self.lines.lock().clone())
    }

    async fn stop_workers(&mut self) {
        let _ = self.stop.send(true);
        for supervisor in self.supervisors.drain(..) {
            if let Err(e) = supervisor.await {
                panic!("a worker supervisor failed: {e}");
            }
        }
    }
}
