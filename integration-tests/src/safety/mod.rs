//! The lock-safety checker. Workers hand the fair lock [`LOCK_PREFIX`] around (`vigil lock
//! --fair demo/leader -- vigil-demo worker`, each turn writing its fencing token to the fencing
//! bank, `vigil-demo bank`) while a seeded schedule applies faults and a register workload
//! writes KV keys beside them. Then it checks, from what was recorded ([`check`]):
//! (a) the bank never accepted a write with a stale token, (b) no two holders' grants overlap
//! in the server's history, (c) every acknowledged KV write reads back, (d) a lock is granted
//! within a bound after the faults stop; and reports handoffs, faults, violations, recovery.
//!
//! The same scenario runs in two environments: [`run_loopback`] (agent processes on
//! 127.0.0.1 from [`crate::cluster`], faults by SIGKILL and SIGSTOP) and [`run_docker`] (the
//! repository's docker-compose.yml under another project name, faults by the scripts in
//! `docker/faults/`). [`Plan::negative_control`] breaks the setup on purpose (lock-delay 0, a
//! worker that writes without its token and ignores lock loss, a bank that accepts that): the
//! checker must then find violations, which shows it can.

pub mod check;
mod docker;
mod loopback;
pub mod register;
pub mod schedule;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::time::Instant;
use vigil_client::ClientConfig;
use vigil_demo::{Decision, WorkerLine};

use check::Violation;
pub use docker::{DockerStatus, docker_status};
use register::AgentBoard;
use schedule::{FaultKind, ScheduleSpec};

/// The lock every worker takes.
pub const LOCK_PREFIX: &str = "demo/leader";

/// How each worker holds the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Writes to the bank per turn, `interval` apart.
    pub writes: u64,
    pub interval: Duration,
    /// `vigil lock --ttl`, `--lock-delay` and `--grace`.
    pub ttl: Duration,
    pub lock_delay: Duration,
    pub grace: Duration,
    /// The negative control's broken setup: the worker writes without its token and ignores
    /// lock loss (`--unfenced --ignore-loss`), and the bank accepts writes without a token.
    pub broken: bool,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub seed: u64,
    /// Client nodes, each with one worker.
    pub workers: usize,
    /// Keep going (after the schedule) until at least this many handoffs.
    pub handoffs: usize,
    pub schedule: ScheduleSpec,
    pub worker: WorkerSpec,
    /// Writers of the register workload.
    pub register_writers: usize,
    /// (d): a lock must be granted within this long after the last fault is healed.
    pub recovery_bound: Duration,
    /// The whole run gives up after this long.
    pub time_limit: Duration,
}

/// Faults the loopback environment can apply (packet loss needs network namespaces).
const LOOPBACK_FAULTS: [FaultKind; 5] = [
    FaultKind::KillLeader,
    FaultKind::KillHolder,
    FaultKind::PauseHolder,
    FaultKind::PartitionHolder,
    FaultKind::RestartAll,
];

impl Plan {
    /// CI's loopback run: every loopback fault once, at least 200 handoffs.
    pub fn loopback(seed: u64) -> Plan {
        Plan {
            seed,
            workers: 3,
            handoffs: 200,
            schedule: ScheduleSpec {
                faults: LOOPBACK_FAULTS.len(),
                kinds: LOOPBACK_FAULTS.to_vec(),
                gap: (Duration::from_secs(1), Duration::from_secs(3)),
                hold: (Duration::from_secs(2), Duration::from_secs(5)),
            },
            worker: WorkerSpec {
                writes: 3,
                interval: Duration::from_millis(20),
                ttl: Duration::from_secs(2),
                lock_delay: Duration::from_secs(1),
                grace: Duration::from_secs(2),
                broken: false,
            },
            register_writers: 2,
            recovery_bound: Duration::from_secs(30),
            time_limit: Duration::from_secs(300),
        }
    }

    /// The Docker run: every fault once (packet loss only when running as root, which nsenter
    /// needs), at least 150 handoffs. The compose nodes use the timings set in `docker.rs`.
    pub fn docker(seed: u64) -> Plan {
        let mut kinds = LOOPBACK_FAULTS.to_vec();
        if docker::is_root() {
            kinds.push(FaultKind::LossyNetwork);
        }
        Plan {
            handoffs: 150,
            schedule: ScheduleSpec {
                faults: kinds.len(),
                kinds,
                gap: (Duration::from_secs(1), Duration::from_secs(3)),
                hold: (Duration::from_secs(3), Duration::from_secs(6)),
            },
            recovery_bound: Duration::from_secs(45),
            time_limit: Duration::from_secs(480),
            ..Plan::loopback(seed)
        }
    }

    /// The broken setup that must fail: lock-delay 0, workers that write without their token
    /// for 6 s and ignore losing the lock, and the holder cut off (its agent frozen) a second
    /// into its turn, so the next holder writes while it still does.
    pub fn negative_control(seed: u64) -> Plan {
        let base = Plan::loopback(seed);
        Plan {
            handoffs: 3,
            schedule: ScheduleSpec {
                faults: 1,
                kinds: vec![FaultKind::PartitionHolder],
                gap: (Duration::from_secs(1), Duration::from_secs(1)),
                hold: (Duration::from_secs(4), Duration::from_secs(4)),
            },
            worker: WorkerSpec {
                writes: 200,
                interval: Duration::from_millis(30),
                lock_delay: Duration::ZERO,
                grace: Duration::from_secs(30),
                broken: true,
                ..base.worker
            },
            time_limit: Duration::from_secs(120),
            ..base
        }
    }

    /// Overrides from the environment, for longer runs: `VIGIL_SAFETY_SEED`,
    /// `VIGIL_SAFETY_HANDOFFS`, `VIGIL_SAFETY_FAULTS` (the time limit grows with them).
    pub fn with_env_overrides(mut self) -> Plan {
        let var = |name: &str| {
            std::env::var(name).ok().map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
            })
        };
        if let Some(seed) = var("VIGIL_SAFETY_SEED") {
            self.seed = seed;
        }
        if let Some(handoffs) = var("VIGIL_SAFETY_HANDOFFS") {
            self.handoffs = handoffs as usize;
            self.time_limit = self.time_limit.max(Duration::from_millis(handoffs * 500));
        }
        if let Some(faults) = var("VIGIL_SAFETY_FAULTS") {
            self.schedule.faults = faults as usize;
            self.time_limit = self.time_limit.max(Duration::from_secs(faults * 20));
        }
        self
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub environment: &'static str,
    pub seed: u64,
    pub handoffs: usize,
    /// Workers started by `vigil lock` that found they no longer held the lock (lost before
    /// they began); they write nothing.
    pub unconfirmed_grants: usize,
    /// Each fault applied: its name and target.
    pub faults: Vec<String>,
    pub bank_accepted: usize,
    /// Writes the bank turned away (stale or missing tokens).
    pub bank_rejected: usize,
    pub registers_acked: usize,
    pub registers_in_doubt: usize,
    /// From the last fault healed to the next grant.
    pub recovery: Option<Duration>,
    pub recovery_bound: Duration,
    pub violations: Vec<Violation>,
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "lock-safety checker ({}, seed {}): {} handoffs in {:.0?}",
            self.environment, self.seed, self.handoffs, self.elapsed
        )?;
        writeln!(
            f,
            "  faults injected: {} ({})",
            self.faults.len(),
            self.faults.join(", ")
        )?;
        writeln!(
            f,
            "  bank: {} writes accepted, {} turned away; {} workers found the lock already lost at start",
            self.bank_accepted, self.bank_rejected, self.unconfirmed_grants
        )?;
        writeln!(
            f,
            "  registers: {} writes acknowledged, {} in doubt",
            self.registers_acked, self.registers_in_doubt
        )?;
        match self.recovery {
            Some(t) => writeln!(
                f,
                "  recovery: lock granted {t:.1?} after the last fault was healed (bound {:?})",
                self.recovery_bound
            )?,
            None => writeln!(
                f,
                "  recovery: no lock granted within {:?} after the last fault was healed",
                self.recovery_bound
            )?,
        }
        writeln!(f, "  violations: {}", self.violations.len())?;
        for v in self.violations.iter().take(20) {
            writeln!(f, "    {v}")?;
        }
        if self.violations.len() > 20 {
            writeln!(f, "    ... and {} more", self.violations.len() - 20)?;
        }
        Ok(())
    }
}

/// Runs `plan` on processes on 127.0.0.1.
pub async fn run_loopback(plan: &Plan) -> anyhow::Result<Report> {
    let mut env = loopback::Loopback::start(plan).await?;
    drive(&mut env, plan).await
}

/// Runs `plan` on the docker-compose cluster (image `vigil:dev`, from `docker/build.sh`).
pub async fn run_docker(plan: &Plan) -> anyhow::Result<Report> {
    let mut env = docker::Docker::start(plan).await?;
    drive(&mut env, plan).await
}

/// What the scenario needs from an environment.
pub(crate) trait Env {
    fn name(&self) -> &'static str;
    /// The client agents, for the register workload.
    fn agents(&self) -> AgentBoard;
    /// HTTP addresses of the servers, for the final reads.
    fn readers(&self) -> Vec<String>;
    /// How the checker's clients reach the agents of [`Env::agents`] and [`Env::readers`]: the
    /// CA for HTTPS and the ACL token (the address is filled in per agent).
    fn client_config(&self) -> ClientConfig;
    /// `http://host:port` of the bank.
    fn bank(&self) -> String;
    /// Applies `kind`, waits `hold`, heals it; returns the target.
    async fn fault(&mut self, kind: FaultKind, hold: Duration) -> anyhow::Result<String>;
    /// Every worker line so far.
    async fn lines(&mut self) -> anyhow::Result<Vec<WorkerLine>>;
    /// Ends the workers' turns and stops them.
    async fn stop_workers(&mut self);
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn handoffs(grants: &[check::Grant]) -> usize {
    check::confirmed_in_order(grants).len().saturating_sub(1)
}

/// How often progress is polled.
const POLL: Duration = Duration::from_millis(500);

async fn drive<E: Env>(env: &mut E, plan: &Plan) -> anyhow::Result<Report> {
    let started = Instant::now();
    let give_up = started + plan.time_limit;
    let (stop, stopped) = watch::channel(false);
    let registers = tokio::spawn(register::write(
        env.agents(),
        env.client_config(),
        plan.register_writers,
        stopped,
    ));

    // The workers hand the lock around before anything breaks.
    loop {
        let grants = check::grants(&env.lines().await?);
        if !check::confirmed_in_order(&grants).is_empty() {
            break;
        }
        anyhow::ensure!(Instant::now() < give_up, "no worker ever held the lock");
        tokio::time::sleep(POLL).await;
    }

    // The fault schedule, one fault at a time.
    let mut faults = Vec::new();
    for step in schedule::schedule(plan.seed, &plan.schedule) {
        tokio::time::sleep(step.gap).await;
        let target = env
            .fault(step.kind, step.hold)
            .await
            .with_context(|| format!("applying {}", step.kind.name()))?;
        eprintln!("safety: {} {target} for {:?}", step.kind.name(), step.hold);
        faults.push(format!("{} {target}", step.kind.name()));
    }
    let healed_ms = now_ms();
    let healed = Instant::now();

    // Recovery, and enough handoffs.
    loop {
        let grants = check::grants(&env.lines().await?);
        let recovered = check::recovery_time(&grants, healed_ms).is_some();
        if recovered && handoffs(&grants) >= plan.handoffs {
            break;
        }
        if !recovered && healed.elapsed() > plan.recovery_bound {
            break;
        }
        if Instant::now() >= give_up {
            break;
        }
        tokio::time::sleep(POLL).await;
    }

    // Stop, collect, check.
    let _ = stop.send(true);
    let registers = registers.await.context("register workload")?;
    env.stop_workers().await;
    let final_state = register::read_back(&env.readers(), &env.client_config()).await;
    let decisions: Vec<Decision> = reqwest::get(format!("{}/history", env.bank()))
        .await
        .context("reading the bank's history")?
        .json()
        .await
        .context("decoding the bank's history")?;
    let grants = check::grants(&env.lines().await?);
    let recovery = check::recovery_time(&grants, healed_ms);

    let mut violations = check::check_bank(&grants, &decisions);
    violations.extend(check::check_grants(&grants));
    violations.extend(check::check_registers(
        &registers.acked,
        &registers.attempted,
        &final_state,
    ));
    violations.extend(check::check_recovery(recovery, plan.recovery_bound));
    let bank_accepted = decisions.iter().filter(|d| d.accepted).count();
    Ok(Report {
        environment: env.name(),
        seed: plan.seed,
        handoffs: handoffs(&grants),
        unconfirmed_grants: grants.iter().filter(|g| !g.confirmed).count(),
        faults,
        bank_accepted,
        bank_rejected: decisions.len() - bank_accepted,
        registers_acked: registers.acked.len(),
        registers_in_doubt: registers.in_doubt,
        recovery,
        recovery_bound: plan.recovery_bound,
        violations,
        elapsed: started.elapsed(),
    })
}
