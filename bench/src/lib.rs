//! `vigil-bench`: Vigil and etcd side by side on one machine, in one run, so that every figure
//! comes with etcd's and the ratio (absolute numbers on a shared machine drift; ratios hold).
//!
//! A run probes the machine, starts a 3-server Vigil cluster (real data directories, fsync on,
//! the `lan` gossip profile) and a 3-member etcd cluster on 127.0.0.1, runs every workload
//! against both, stops everything and writes `bench/results/<date>T<HHMM>Z.json` plus, for a full run,
//! `docs/benchmarks.md`. The fan-out and footprint workloads, which read server memory, run
//! last on fresh clusters of their own, so that earlier workloads' leftovers do not count. A
//! workload that fails is recorded and the run goes on; `--check` then exits non-zero (it never
//! judges the figures themselves).
//!
//! Clients talk to each system's leader directly (Vigil's HTTP API, etcd's gRPC endpoint), each
//! concurrent client over its own reused connection.
//!
//! Everything here needs etcd's gRPC client, whose build needs `protoc`, so the library is empty
//! without the `etcd` feature (`cargo test --workspace` builds no gRPC code) and the binary then
//! only says how to rebuild it.

#![cfg(feature = "etcd")]

mod agent_path;
mod consul;
mod death;
mod etcd;
mod etcd_concurrency;
mod failover;
mod failure;
mod footprint;
mod kv;
mod load;
mod lock;
mod machine;
mod read;
mod renew;
mod report;
mod session;
mod watch;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, anyhow};
use futures::FutureExt;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use vigil_shared::go::time::Utc;

use consul::ConsulCluster;
use etcd::EtcdCluster;
use integration_tests::cluster::Cluster;
use load::Window;
use machine::{Machine, Versions};
use report::{Outcome, Report};

/// Every workload, by its report name, in the order they run.
const WORKLOADS: [&str; 11] = [
    "kv_put",
    "kv_read",
    "locks",
    "sessions",
    "idle_sessions",
    "client_agent",
    "failure_detection",
    "process_and_agent_death",
    "leader_failover",
    "watch_fanout",
    "footprint",
];

/// The systems compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum System {
    Vigil,
    Etcd,
    Consul,
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            System::Vigil => "Vigil",
            System::Etcd => "etcd",
            System::Consul => "Consul",
        })
    }
}

/// Which system the current repetition measures first: an index into [`System::ALL`].
static FIRST: AtomicUsize = AtomicUsize::new(0);

impl System {
    const ALL: [System; 3] = [System::Vigil, System::Etcd, System::Consul];

    /// The order in which this repetition measures the systems: repetition `r` starts with
    /// `ALL[r % 3]` and goes round, so over three repetitions each system goes first once
    /// (and whatever the machine does over time does not always favour the same one).
    pub fn order() -> [System; 3] {
        let first = FIRST.load(Ordering::Relaxed);
        std::array::from_fn(|i| System::ALL[(first + i) % 3])
    }

    /// Where this system comes in [`System::order`].
    pub fn turn(self) -> usize {
        System::order()
            .iter()
            .position(|s| *s == self)
            .unwrap_or_default()
    }

    fn rotate_for(repetition: usize) {
        FIRST.store(repetition % 3, Ordering::Relaxed);
    }
}

/// Command-line options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Shorter windows and fewer rounds, one repetition: about 12 minutes.
    pub quick: bool,
    /// How many times every workload runs (3 by default, 1 with `--quick`).
    pub repetitions: usize,
    /// Exit non-zero when a workload produced no figures (CI smoke test).
    pub check: bool,
    /// Root under which `bench/results/` and `docs/` are written.
    pub out: PathBuf,
    /// Run only these workloads (by their report name, e.g. `failure_detection`); all when
    /// empty. Such a partial run never rewrites `docs/benchmarks.md`.
    pub only: Vec<String>,
}

impl Options {
    /// Whether this run includes the workload `name`.
    fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }

    /// How to call the program, with the workloads `--only` takes.
    pub fn usage() -> String {
        format!(
            "usage: vigil-bench [--quick] [--check] [--repetitions N] [--out DIR] \
             [--only WORKLOAD]...\n\
             workloads: {}",
            WORKLOADS.join(", ")
        )
    }

    /// Parses the arguments after the program name.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options> {
        let mut options = Options {
            quick: false,
            repetitions: 0,
            check: false,
            out: Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .context("the workspace root")?
                .to_path_buf(),
            only: Vec::new(),
        };
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--check" => options.check = true,
                "--repetitions" => {
                    let n = args.next().context("--repetitions needs a number")?;
                    options.repetitions =
                        n.parse().ok().filter(|n| *n > 0).with_context(|| {
                            format!("--repetitions {n:?}: not a positive number")
                        })?;
                }
                "--out" => options.out = args.next().context("--out needs a directory")?.into(),
                "--only" => {
                    let name = args.next().context("--only needs a workload")?;
                    if !WORKLOADS.contains(&name.as_str()) {
                        return Err(anyhow!("unknown workload {name:?}"));
                    }
                    options.only.push(name);
                }
                other => return Err(anyhow!("unknown argument {other:?}")),
            }
        }
        if options.repetitions == 0 {
            options.repetitions = if options.quick { 1 } else { 3 };
        }
        Ok(options)
    }
}

/// How long and how big each workload is.
#[derive(Debug, Clone)]
pub struct Plan {
    pub quick: bool,
    pub fsync_samples: usize,
    pub kv: Window,
    pub lock: Window,
    pub contended: Window,
    /// Client counts of the contended sweep besides 8 and 32 (which every run measures, in the
    /// `contended` window), and the shorter window each of those runs for.
    pub sweep: Vec<usize>,
    pub sweep_window: Window,
    pub session: Window,
    /// Sessions (leases) kept alive by the idle-sessions workload, and how long its idle and
    /// its measured windows last.
    pub idle_sessions: usize,
    pub idle_window: Duration,
    /// Idle watchers on distinct keys, and on one shared key.
    pub watchers_distinct: usize,
    pub watchers_shared: usize,
    pub failure_rounds: usize,
    /// Rounds of the `kill -9` failure row, which reports a tail (p90 and the maximum), not
    /// only a median.
    pub kill_rounds: usize,
    pub failover_rounds: usize,
    pub footprint_keys: usize,
    pub footprint_sessions: usize,
    /// Longest wait for a quiet machine before each measured phase.
    pub quiet_wait: Duration,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        let window = |warmup_ms, measure_ms| Window {
            warmup: Duration::from_millis(warmup_ms),
            measure: Duration::from_millis(measure_ms),
        };
        if quick {
            Plan {
                quick,
                fsync_samples: 100,
                kv: window(300, 1_500),
                lock: window(300, 1_500),
                contended: window(300, 2_000),
                sweep: Vec::new(),
                sweep_window: window(300, 2_000),
                session: window(300, 1_500),
                idle_sessions: 2_000,
                idle_window: Duration::from_secs(5),
                // A smoke test of the harness (CI's): smaller shapes keep it to minutes.
                watchers_distinct: 2_000,
                watchers_shared: 500,
                failure_rounds: 1,
                kill_rounds: 5,
                failover_rounds: 1,
                footprint_keys: 20_000,
                footprint_sessions: 2_000,
                quiet_wait: Duration::from_secs(1),
            }
        } else {
            Plan {
                quick,
                fsync_samples: 500,
                kv: window(1_000, 5_000),
                lock: window(1_000, 6_000),
                contended: window(1_000, 6_000),
                sweep: vec![1, 2, 4, 16],
                sweep_window: window(500, 3_000),
                session: window(1_000, 5_000),
                idle_sessions: 10_000,
                idle_window: Duration::from_secs(20),
                watchers_distinct: 10_000,
                watchers_shared: 1_000,
                // Per repetition: 9 rounds (30 kills) over a run of 3.
                failure_rounds: 3,
                kill_rounds: 10,
                failover_rounds: 3,
                footprint_keys: 100_000,
                footprint_sessions: 10_000,
                quiet_wait: Duration::from_secs(2),
            }
        }
    }
}

/// The clusters under test; Consul's where it is installed (its column stays empty otherwise).
pub struct Systems {
    pub vigil: Cluster,
    pub etcd: EtcdCluster,
    pub consul: Option<ConsulCluster>,
}

/// Where each system's leader answers, and every server's process ID.
#[derive(Debug, Clone)]
pub struct Leaders {
    pub vigil_addr: SocketAddr,
    pub vigil_pid: u32,
    pub vigil_pids: Vec<u32>,
    pub etcd_endpoint: String,
    pub etcd_pid: u32,
    pub etcd_pids: Vec<u32>,
    /// Consul's leader's HTTP address and every Consul server's process ID, when it runs.
    pub consul: Option<(String, Vec<u32>)>,
    /// Consul's leader's process ID, when it runs.
    pub consul_pid: Option<u32>,
}

impl Leaders {
    /// Clients of Vigil's leader and, when it runs, Consul's, over their HTTP API.
    pub fn http_clients(&self) -> Result<(vigil_client::Client, Option<vigil_client::Client>)> {
        let vigil = vigil_client::Client::new(&self.vigil_addr.to_string())?;
        let consul = self
            .consul
            .as_ref()
            .map(|(addr, _)| vigil_client::Client::new(addr));
        Ok((vigil, consul.transpose()?))
    }

    /// The servers of `system`, if it runs.
    pub fn pids(&self, system: System) -> Option<&[u32]> {
        match system {
            System::Vigil => Some(&self.vigil_pids),
            System::Etcd => Some(&self.etcd_pids),
            System::Consul => self.consul.as_ref().map(|(_, pids)| pids.as_slice()),
        }
    }
}

impl Systems {
    /// Starts the clusters (3 servers each), Vigil's with `clients` client agents; Consul's
    /// only when it is installed, saying so when it is not.
    pub async fn start(clients: usize) -> Result<Systems> {
        // The fan-out workload opens 11,000 connections from 127.0.0.1: no per-client cap.
        let vigil = Cluster::servers(3)
            .clients(clients)
            .gossip_profile("lan")
            .arg("--http-max-conns-per-client")
            .arg("0")
            .start()
            .await;
        let etcd = EtcdCluster::start(3).await?;
        let consul = match ConsulCluster::version() {
            Ok(_) => Some(ConsulCluster::start(3).await?),
            Err(e) => {
                eprintln!("vigil-bench: no Consul column: {e:#}");
                None
            }
        };
        Ok(Systems {
            vigil,
            etcd,
            consul,
        })
    }

    /// Looks the leaders up again (an election may have moved them).
    pub async fn leaders(&self) -> Result<Leaders> {
        let leader = self.vigil.leader().await;
        let server = self.vigil.server(leader);
        let vigil_addr = server
            .base
            .strip_prefix("http://")
            .context("HTTP base URL")?
            .parse()?;
        let vigil_pids = self
            .vigil
            .running_servers()
            .into_iter()
            .filter_map(|i| self.vigil.server(i).pid())
            .collect();
        let (etcd_endpoint, etcd_pid) = self.etcd.leader().await?;
        let (consul, consul_pid) = match &self.consul {
            Some(consul) => {
                let (addr, pid) = consul.leader().await?;
                (Some((addr, consul.pids())), Some(pid))
            }
            None => (None, None),
        };
        Ok(Leaders {
            vigil_addr,
            vigil_pid: server.pid().context("Vigil leader process")?,
            vigil_pids,
            etcd_endpoint,
            etcd_pid,
            etcd_pids: self.etcd.pids(),
            consul,
            consul_pid,
        })
    }

    /// Stops every process of both clusters.
    pub async fn stop(self) {
        self.etcd.stop().await;
        if let Some(consul) = self.consul {
            consul.stop().await;
        }
        drop(self.vigil);
    }
}

/// Where [`integration_tests::binary`] looks first for the agent binary.
const AGENT_ENV: &str = "CARGO_BIN_EXE_vigil-under-test";

/// The whole program: finds (or builds) the agent binary, then runs the benchmark, stopping
/// every process it started on Ctrl-C or SIGTERM.
pub async fn main(options: &Options) -> ExitCode {
    if std::env::var_os(AGENT_ENV).is_none() {
        return match run_with_agent().await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("vigil-bench: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigil-bench: cannot handle SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = tokio::select! {
        result = run(options) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow!("terminated")),
    };
    // Dropping `run` above killed every cluster process it had started.
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("vigil-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The agents are the `vigil-under-test` binary beside this one in the target directory: build
/// it when running under Cargo (a no-op when fresh; `cargo run --bin vigil-bench` builds only
/// this binary), then run this program again with [`AGENT_ENV`] naming it, since that variable
/// is how [`integration_tests::binary`] finds an agent binary from outside a test.
async fn run_with_agent() -> Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let agent = integration_tests::build_agent()?;
    let mut child = tokio::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env(AGENT_ENV, &agent)
        .spawn()
        .context("run vigil-bench again")?;
    let pid = Pid::from_raw(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .context("child process ID")?,
    );
    let mut terminate = signal(SignalKind::terminate())?;
    loop {
        // Pass signals on, then wait while the child stops its clusters (a Ctrl-C from a
        // terminal reaches it twice, which it does not mind).
        let forward = tokio::select! {
            status = child.wait() => {
                let code = status?.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1);
                return Ok(ExitCode::from(code));
            }
            _ = tokio::signal::ctrl_c() => Signal::SIGINT,
            _ = terminate.recv() => Signal::SIGTERM,
        };
        // It may have exited meanwhile: the next turn collects its status.
        let _ = kill(pid, forward);
    }
}

/// Open files the watch fan-out needs: 11,000 connections, and the rest of the process.
const OPEN_FILES_WANTED: u64 = 12_000;

/// 11,000 watchers need as many connections: lift the soft limit on open files to the hard one
/// (the agents and etcd members inherit it), and say so when even that is too low for the
/// watch fan-out, whose failure then has its reason beside it.
fn raise_open_files_limit() -> Result<()> {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    if hard < OPEN_FILES_WANTED {
        eprintln!(
            "vigil-bench: the hard limit on open files is {hard}, below the {OPEN_FILES_WANTED} \
             the watch fan-out needs; it will fail (raise it with `ulimit -Hn` as root)"
        );
    }
    Ok(())
}

/// Runs a workload, turning a panic into an error so the run goes on.
async fn guarded<F: Future<Output = Result<Outcome>>>(workload: F) -> Result<Outcome> {
    match AssertUnwindSafe(workload).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(anyhow!("panicked: {message}"))
        }
    }
}

/// Runs the workload `name` (announced as `what`) when this run includes it, and records what
/// it measured.
async fn step(
    options: &Options,
    report: &mut Report,
    name: &str,
    what: &str,
    workload: impl Future<Output = Result<Outcome>>,
) {
    if options.runs(name) {
        eprintln!("vigil-bench: {what}");
        match guarded(workload).await {
            Ok(outcome) => report.add(name, outcome),
            Err(e) => {
                eprintln!("vigil-bench: {name} failed: {e:#}");
                report.fail(name, &e);
            }
        }
    }
}

/// Runs the benchmark; returns whether `--check` found every figure present.
async fn run(options: &Options) -> Result<bool> {
    let started = Instant::now();
    raise_open_files_limit()?;
    let plan = Plan::new(options.quick);
    let mode = if plan.quick { "quick" } else { "full" };
    let scratch = tempfile::tempdir()?;
    let machine = Machine::probe(scratch.path(), plan.fsync_samples)?;
    let versions = Versions::probe(&integration_tests::binary())?;
    eprintln!("vigil-bench ({mode}): {machine:?}\n{versions:?}");
    let mut report = Report::new(start_stamp(), mode, machine, versions);
    machine::set_quiet_wait(plan.quiet_wait);
    for repetition in 0..options.repetitions {
        System::rotate_for(repetition);
        report.begin_repetition(System::order());
        eprintln!(
            "vigil-bench: repetition {} of {}, in the order {}",
            repetition + 1,
            options.repetitions,
            System::order().map(|s| s.to_string()).join(", ")
        );
        repeat(options, &plan, &mut report).await?;
    }
    report.finish(started.elapsed().as_secs_f64());
    let markdown = report.markdown();
    println!("{markdown}");
    write(&options.out, &report, &markdown, options.only.is_empty())?;
    eprintln!("vigil-bench: done in {:.0} s", report.wall_seconds);
    let missing = report.missing();
    if options.check && !missing.is_empty() {
        eprintln!("vigil-bench --check: no figures for {}", missing.join("; "));
        return Ok(false);
    }
    Ok(true)
}

/// One repetition of every workload the run includes: on fresh clusters, the shared ones, then
/// the fan-out and footprint on clusters of their own.
async fn repeat(options: &Options, plan: &Plan, r: &mut Report) -> Result<()> {
    let shared = [
        "kv_put",
        "kv_read",
        "locks",
        "sessions",
        "idle_sessions",
        "client_agent",
        "failure_detection",
        "process_and_agent_death",
        "leader_failover",
    ];
    if shared.iter().any(|w| options.runs(w)) {
        eprintln!("vigil-bench: starting the clusters");
        let mut systems = Systems::start(0).await?;
        let s = &mut systems;
        step(options, r, "kv_put", "KV puts", kv::workload(s, plan)).await;
        step(options, r, "kv_read", "KV reads", read::workload(s, plan)).await;
        step(options, r, "locks", "locks", lock::workload(s, plan)).await;
        let sessions = session::workload(s, plan);
        step(options, r, "sessions", "sessions and leases", sessions).await;
        let idle = renew::workload(s, plan);
        let what = "the renewal cost of idle sessions";
        step(options, r, "idle_sessions", what, idle).await;
        let through_agents = agent_path::workload(s, plan);
        let what = "KV and locks through a client agent";
        step(options, r, "client_agent", what, through_agents).await;
        let detection = failure::workload(s, plan);
        let what = "failure detection";
        step(options, r, "failure_detection", what, detection).await;
        let deaths = death::workload(s, plan);
        let what = "process crash, agent loss, server stop";
        step(options, r, "process_and_agent_death", what, deaths).await;
        let election = failover::workload(s, plan);
        step(options, r, "leader_failover", "leader failover", election).await;
        systems.stop().await;
    }
    let fanout = "blocking-query fan-out (fresh clusters)";
    step(options, r, "watch_fanout", fanout, watch::workload(plan)).await;
    let memory = footprint::workload(plan);
    let what = "footprint (fresh clusters)";
    step(options, r, "footprint", what, memory).await;
    Ok(())
}

/// `bench/results/<date>T<HHMM>Z[-quick][-partial].json` (a rerun never overwrites an earlier
/// result), and `docs/benchmarks.md` for a full run of every workload.
fn write(out: &Path, report: &Report, markdown: &str, every_workload: bool) -> Result<()> {
    let results = out.join("bench/results");
    std::fs::create_dir_all(&results)?;
    let suffix = if report.mode == "quick" { "-quick" } else { "" };
    let partial = if every_workload { "" } else { "-partial" };
    let stem = report.date.replace(':', "");
    let json_path = results.join(format!("{stem}{suffix}{partial}.json"));
    let mut json = serde_json::to_string_pretty(report)?;
    json.push('\n');
    std::fs::write(&json_path, json).with_context(|| format!("write {}", json_path.display()))?;
    eprintln!("vigil-bench: wrote {}", json_path.display());
    if report.mode == "full" && every_workload {
        let docs = out.join("docs");
        std::fs::create_dir_all(&docs)?;
        let doc_path = docs.join("benchmarks.md");
        let doc = format!("{}\n{markdown}", report::INTRO.trim_start());
        std::fs::write(&doc_path, doc).with_context(|| format!("write {}", doc_path.display()))?;
        eprintln!("vigil-bench: wrote {}", doc_path.display());
    }
    Ok(())
}

/// When the run started (UTC), as `YYYY-MM-DDTHH:MMZ`.
fn start_stamp() -> String {
    let now = Utc::of(SystemTime::now());
    format!("{}T{:02}:{:02}Z", now.date(), now.hour, now.minute)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let args = ["--quick", "--check", "--out", "/tmp/x"].map(String::from);
        let options = Options::parse(args.into_iter()).unwrap();
        assert!(options.quick && options.check);
        assert_eq!(options.out, PathBuf::from("/tmp/x"));
        assert!(Options::parse(["--fast".to_owned()].into_iter()).is_err());
        assert!(options.runs("footprint"));
        let only = ["--only", "failure_detection"].map(String::from);
        let options = Options::parse(only.into_iter()).unwrap();
        assert!(options.runs("failure_detection") && !options.runs("kv_put"));
        let unknown = ["--only", "failures"].map(String::from);
        assert!(Options::parse(unknown.into_iter()).is_err());
        assert_eq!(options.repetitions, 3);
        let quick = Options::parse(["--quick".to_owned()].into_iter()).unwrap();
        assert_eq!(quick.repetitions, 1);
        let twice = ["--quick", "--repetitions", "2"].map(String::from);
        assert_eq!(Options::parse(twice.into_iter()).unwrap().repetitions, 2);
        let none = ["--repetitions", "0"].map(String::from);
        assert!(Options::parse(none.into_iter()).is_err());
    }
}
