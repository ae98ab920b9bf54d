//! What the numbers were measured on, and how much CPU and memory each process used: machine
//! facts (cores, RAM, CPU model, load, the disk's fsync latency measured on the spot), versions,
//! and per-process readings from `/proc` (RSS, CPU time) plus the harness's own CPU time, so a
//! report can show that the harness was not the bottleneck.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use nix::sys::resource::{UsageWho, getrusage};
use nix::unistd::{SysconfVar, sysconf};
use serde::Serialize;

/// The machine, read when the run starts.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub ram_gib: f64,
    pub kernel: String,
    /// 1-minute load average when the run started: other work on a shared machine shows here.
    pub load_at_start: f64,
    /// One 4 KiB append + `fdatasync` in the directory the data dirs live in.
    pub fsync_p50_us: u64,
    pub fsync_p99_us: u64,
}

/// Versions of what was measured.
#[derive(Debug, Clone, Serialize)]
pub struct Versions {
    /// `vigil --version` of the agent binary, plus `git describe` of the tree when available.
    pub vigil: String,
    /// `etcd --version`.
    pub etcd: String,
    /// `consul version`, or why there is no Consul column.
    pub consul: String,
}

impl Machine {
    /// Reads the facts and measures fsync latency with `samples` syncs in `dir`.
    pub fn probe(dir: &Path, samples: usize) -> Result<Machine> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").context("read /proc/cpuinfo")?;
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, m)| m.trim().to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").context("read /proc/meminfo")?;
        let ram_kib = status_field(&meminfo, "MemTotal:").context("MemTotal in /proc/meminfo")?;
        let loadavg = std::fs::read_to_string("/proc/loadavg").context("read /proc/loadavg")?;
        let fsync = fsync_latency(dir, samples)?;
        Ok(Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            ram_gib: ram_kib as f64 / (1024.0 * 1024.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            load_at_start: loadavg
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
            fsync_p50_us: fsync.value_at_quantile(0.5),
            fsync_p99_us: fsync.value_at_quantile(0.99),
        })
    }
}

impl Versions {
    pub fn probe(vigil_binary: &Path) -> Result<Versions> {
        let vigil = first_line(Command::new(vigil_binary).arg("--version"))?;
        let git = Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        let vigil = match git {
            Some(rev) => format!("{vigil} ({rev})"),
            None => vigil,
        };
        let etcd = first_line(Command::new("etcd").arg("--version"))?;
        let consul = super::consul::ConsulCluster::version()
            .unwrap_or_else(|e| format!("no Consul ({e:#})"));
        Ok(Versions {
            vigil,
            etcd,
            consul,
        })
    }
}

fn first_line(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("run {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// Latency of appending 4 KiB and `fdatasync`ing it, as a write-ahead log does per commit.
fn fsync_latency(dir: &Path, samples: usize) -> Result<Histogram<u64>> {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path).context("create the fsync probe file")?;
    let block = [0x5a_u8; 4096];
    let mut hist = Histogram::<u64>::new(3)?;
    for _ in 0..samples {
        let t = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        hist.record(micros(t.elapsed()))?;
    }
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(hist)
}

pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A `Key: <number> kB`-style field of a `/proc` status file.
fn status_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    status_field(&status, "VmRSS:").with_context(|| format!("VmRSS of process {pid}"))
}

/// User + system CPU time a process has used so far.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces; utime and stime are fields 14 and 15.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .context("short /proc/PID/stat")?
        .iter()
        .map(|f| f.parse::<u64>())
        .sum::<Result<u64, _>>()?;
    let per_second = sysconf(SysconfVar::CLK_TCK)?.unwrap_or(100);
    Ok(ticks as f64 / per_second as f64)
}

/// User + system CPU time of this process (the harness) so far.
fn own_cpu_seconds() -> Result<f64> {
    let usage = getrusage(UsageWho::RUSAGE_SELF)?;
    let secs = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    Ok(secs(usage.user_time()) + secs(usage.system_time()))
}

/// Other processes' CPU (the machine's busy time less the harness's and the measured servers'),
/// in % of one core, above which a phase counts as disturbed and a quiet machine is waited for.
pub const DISTURBED_PERCENT: f64 = 25.0;
/// How long one look at the machine's CPU lasts while waiting for it to be quiet.
const QUIET_SAMPLE: Duration = Duration::from_millis(500);
/// Longest wait for a quiet machine before a phase, in milliseconds ([`set_quiet_wait`]).
static QUIET_WAIT_MS: AtomicU64 = AtomicU64::new(0);

/// Sets how long each phase may wait for a quiet machine before it starts anyway.
pub fn set_quiet_wait(limit: Duration) {
    QUIET_WAIT_MS.store(
        u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// CPU use over one measured phase: the harness's, the system under test's, and the machine's.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub phase: String,
    pub wall_seconds: f64,
    /// Harness CPU time over wall time, in % of one core.
    pub harness_cpu_percent: f64,
    /// The measured servers' CPU time over wall time (all members summed), in % of one core.
    pub servers_cpu_percent: f64,
    /// Every core's busy time (`/proc/stat`) over wall time, in % of one core.
    pub machine_cpu_percent: f64,
    /// The machine's less the harness's and the measured servers': other processes (the
    /// other systems' idle servers, and whatever else runs on the machine).
    pub other_cpu_percent: f64,
    /// How long the phase waited for a quiet machine before it started.
    pub quiet_wait_seconds: f64,
    /// Other processes used more than [`DISTURBED_PERCENT`] of a core during the phase.
    pub disturbed: bool,
}

/// CPU time used so far: the harness's, the measured servers', the whole machine's.
#[derive(Debug, Clone, Copy)]
struct CpuTimes {
    at: Instant,
    harness: f64,
    servers: f64,
    machine: f64,
}

impl CpuTimes {
    fn now(pids: &[u32]) -> Result<CpuTimes> {
        Ok(CpuTimes {
            at: Instant::now(),
            harness: own_cpu_seconds()?,
            servers: servers_cpu(pids)?,
            machine: machine_busy_seconds()?,
        })
    }

    /// (wall seconds, harness %, servers %, machine %, other %) since `self`.
    fn since(&self, later: &CpuTimes) -> (f64, f64, f64, f64, f64) {
        let wall = (later.at - self.at).as_secs_f64().max(1e-9);
        let percent = |a: f64, b: f64| 100.0 * (b - a) / wall;
        let harness = percent(self.harness, later.harness);
        let servers = percent(self.servers, later.servers);
        let machine = percent(self.machine, later.machine);
        let other = (machine - harness - servers).max(0.0);
        (wall, harness, servers, machine, other)
    }
}

/// Started before a phase, stopped after it.
pub struct Meter {
    phase: String,
    pids: Vec<u32>,
    start: CpuTimes,
    quiet_wait: Duration,
}

impl Meter {
    /// `pids`: the processes of the system under test. First waits (up to the limit
    /// [`set_quiet_wait`] set) until other processes use less than [`DISTURBED_PERCENT`] of a
    /// core.
    pub async fn start(phase: impl Into<String>, pids: &[u32]) -> Result<Meter> {
        let limit = Duration::from_millis(QUIET_WAIT_MS.load(Ordering::Relaxed));
        let waited = Instant::now();
        while waited.elapsed() < limit {
            let before = CpuTimes::now(pids)?;
            tokio::time::sleep(QUIET_SAMPLE).await;
            let (.., other) = before.since(&CpuTimes::now(pids)?);
            if other < DISTURBED_PERCENT {
                break;
            }
        }
        Ok(Meter {
            phase: phase.into(),
            pids: pids.to_vec(),
            start: CpuTimes::now(pids)?,
            quiet_wait: waited.elapsed(),
        })
    }

    pub fn stop(self) -> Result<Usage> {
        let (wall, harness, servers, machine, other) =
            self.start.since(&CpuTimes::now(&self.pids)?);
        Ok(Usage {
            phase: self.phase,
            wall_seconds: wall,
            harness_cpu_percent: harness,
            servers_cpu_percent: servers,
            machine_cpu_percent: machine,
            other_cpu_percent: other,
            quiet_wait_seconds: self.quiet_wait.as_secs_f64(),
            disturbed: other > DISTURBED_PERCENT,
        })
    }
}

/// Servers whose CPU use (added up) is below this, in % of one core, are idle: heartbeats and
/// timers only.
const IDLE_PERCENT: f64 = 15.0;

/// Waits until the processes `pids` are idle (below [`IDLE_PERCENT`] of a core together over
/// half a second), at most `limit`; returns how long it took.
pub async fn settle(pids: &[u32], limit: Duration) -> Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let before = CpuTimes::now(pids)?;
        tokio::time::sleep(QUIET_SAMPLE).await;
        let (_, _, servers, ..) = before.since(&CpuTimes::now(pids)?);
        if servers < IDLE_PERCENT {
            break;
        }
    }
    Ok(started.elapsed())
}

fn servers_cpu(pids: &[u32]) -> Result<f64> {
    pids.iter().map(|&pid| cpu_seconds(pid)).sum()
}

/// Busy CPU time of every core so far (`/proc/stat`: all but idle and iowait).
fn machine_busy_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    busy_seconds(&stat)
}

fn busy_seconds(stat: &str) -> Result<f64> {
    let ticks: Vec<u64> = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let busy: u64 = ticks.iter().take(8).sum::<u64>() - ticks.get(3..5).map_or(0, |t| t[0] + t[1]);
    let per_second = sysconf(SysconfVar::CLK_TCK)?.unwrap_or(100);
    Ok(busy as f64 / per_second as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 5 50 1000 40 3 2 0 7 0\ncpu0 50 2 25 500 20 1 1 0 0 0\n";
        let per_second = sysconf(SysconfVar::CLK_TCK).unwrap().unwrap_or(100) as f64;
        let busy = busy_seconds(stat).unwrap();
        assert!((busy - 160.0 / per_second).abs() < 1e-9, "{busy}");
    }
}
