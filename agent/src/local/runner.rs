//! Check runners: one task per check. Interval checks (HTTP, TCP, script) first run after a
//! random stagger in `[0, Interval)` and then every `Interval` after the previous run ends; their
//! raw results pass through the success/failure thresholds ([`StatusHandler`]) before they reach
//! the check. A TTL check's task only waits for its deadline, which every update pushes back. A
//! process check's task only waits for the process to exit (a pidfd turns readable then); its
//! status at registration is known at once, so it starts passing (or critical, when the process
//! is already gone) instead of waiting for a first run.
//! The status rules and output formats are plain functions, as Consul's `agent/checks` has them.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rand::Rng as _;
use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_shared::catalog::HealthStatus;
use vigil_shared::go::duration::format_go_duration;

use super::LocalState;
use super::definition::{CheckDefinition, CheckKind, HttpCheck, MIN_INTERVAL, Thresholds};

/// HTTP and TCP checks give up after this unless `Timeout` says otherwise.
const DEFAULT_NETWORK_TIMEOUT: Duration = Duration::from_secs(10);
/// Script checks are killed after this unless `Timeout` says otherwise.
const DEFAULT_SCRIPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Consul's HTTP check identifies itself with this.
const USER_AGENT: &str = "Consul Health Check";
const ACCEPT: &str = "text/plain, text/*, */*";

/// Consul's HTTP rule: 2xx passing, 429 (Too Many Requests) warning, anything else critical.
pub fn http_status(code: u16) -> HealthStatus {
    match code {
        200..=299 => HealthStatus::Passing,
        429 => HealthStatus::Warning,
        _ => HealthStatus::Critical,
    }
}

/// Consul's script rule (Nagios plugin convention): exit 0 passing, exit 1 warning, any other
/// exit or death by a signal (`None`) critical.
pub fn script_status(code: Option<i32>) -> HealthStatus {
    match code {
        Some(0) => HealthStatus::Passing,
        Some(1) => HealthStatus::Warning,
        _ => HealthStatus::Critical,
    }
}

/// The largest index `<= at` that starts a UTF-8 character of `s`.
fn char_floor(s: &str, at: usize) -> usize {
    (0..=at.min(s.len()))
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0)
}

/// A TTL update's output beyond `max` bytes: the first `max` bytes, then
/// ` ... (captured <max> of <total> bytes)`.
pub fn truncate_output(output: &str, max: usize) -> String {
    if output.len() <= max {
        return output.to_owned();
    }
    let cut = char_floor(output, max);
    format!(
        "{} ... (captured {cut} of {} bytes)",
        &output[..cut],
        output.len()
    )
}

/// The last `cap` bytes written (Consul's `circbuf`), and how many were written in all.
#[derive(Debug)]
pub struct OutputTail {
    buf: VecDeque<u8>,
    cap: usize,
    total: usize,
}

impl OutputTail {
    pub fn new(cap: usize) -> OutputTail {
        OutputTail {
            buf: VecDeque::with_capacity(cap.min(64 * 1024)),
            cap,
            total: 0,
        }
    }

    pub fn write(&mut self, bytes: &[u8]) {
        self.total += bytes.len();
        let keep = &bytes[bytes.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + keep.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(keep);
    }

    /// The kept bytes as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        let bytes: Vec<u8> = self.buf.iter().copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A script's output as Consul reports it: prefixed by `Captured <cap> of <total> bytes`
    /// when some was dropped.
    pub fn script_output(&self) -> String {
        if self.total > self.cap {
            format!(
                "Captured {} of {} bytes\n...\n{}",
                self.cap,
                self.total,
                self.text()
            )
        } else {
            self.text()
        }
    }
}

/// Consul's `StatusHandler`: a passing or warning result is reported once
/// `SuccessBeforePassing` of them came in a row; failures are reported as warning from
/// `FailuresBeforeWarning` in a row and as critical from `FailuresBeforeCritical` in a row.
/// Until a threshold is met nothing is reported (the check keeps its status and output).
#[derive(Debug, Clone)]
pub struct StatusHandler {
    thresholds: Thresholds,
    successes: u32,
    failures: u32,
}

impl StatusHandler {
    pub fn new(thresholds: Thresholds) -> StatusHandler {
        StatusHandler {
            thresholds,
            successes: 0,
            failures: 0,
        }
    }

    /// The status to report for a raw result, if any.
    pub fn apply(&mut self, result: HealthStatus) -> Option<HealthStatus> {
        if result == HealthStatus::Critical {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
            if self.failures >= self.thresholds.failures_before_critical {
                Some(HealthStatus::Critical)
            } else if self.failures >= self.thresholds.failures_before_warning {
                Some(HealthStatus::Warning)
            } else {
                None
            }
        } else {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
            (self.successes >= self.thresholds.success_before_passing).then_some(result)
        }
    }
}

/// What one run of a probe found.
enum Outcome {
    /// Goes through the thresholds.
    Result(HealthStatus, String),
    /// Reported as is, bypassing the thresholds (Consul: a script that cannot start or times
    /// out).
    Direct(HealthStatus, String),
}

/// A running check task; dropping it stops the task (and kills a script's process group).
#[derive(Debug)]
pub struct RunnerHandle {
    /// Identifies this runner's reports, so a replaced check ignores its predecessor's.
    pub id: u64,
    cancel: CancellationToken,
    /// A TTL check's deadline; every update moves it.
    ttl_deadline: Option<watch::Sender<Instant>>,
    /// The status the check has from its start, when the runner knows it at once (a process
    /// check); `None` keeps the definition's initial status.
    pub initial: Option<(HealthStatus, String)>,
}

impl RunnerHandle {
    /// Pushes a TTL check's deadline to `now + ttl`.
    pub fn reset_ttl(&self, ttl: Duration) {
        if let Some(deadline) = &self.ttl_deadline {
            deadline.send_replace(Instant::now() + ttl);
        }
    }
}

impl Drop for RunnerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts the task for `check` (`None` for maintenance checks, which have none).
pub fn spawn(local: &Arc<LocalState>, check: &CheckDefinition, id: u64) -> Option<RunnerHandle> {
    let cancel = local.shutdown.child_token();
    let check_id = check.id.clone();
    let report = Reporter {
        local: Arc::clone(local),
        check_id,
        runner: id,
    };
    let timeout = check.timeout;
    let max = check.output_max_size;
    let probe = match &check.kind {
        CheckKind::Maintenance => return None,
        CheckKind::Ttl { ttl } => {
            let (tx, rx) = watch::channel(Instant::now() + *ttl);
            local.tasks.spawn(run_ttl(report, rx, cancel.clone()));
            return Some(RunnerHandle {
                id,
                cancel,
                ttl_deadline: Some(tx),
                initial: None,
            });
        }
        CheckKind::Process { pid } => {
            let pid = *pid;
            let initial = match process::open(pid) {
                Ok(fd) => {
                    local
                        .tasks
                        .spawn(run_process(report, fd, pid, cancel.clone()));
                    (HealthStatus::Passing, format!("process {pid} is running"))
                }
                Err(e) => (HealthStatus::Critical, format!("process {pid}: {e}")),
            };
            return Some(RunnerHandle {
                id,
                cancel,
                ttl_deadline: None,
                initial: Some(initial),
            });
        }
        CheckKind::Http(http) => match http_client(http, timeout) {
            Ok(client) => Probe::Http {
                client,
                check: http.clone(),
                max,
            },
            Err(e) => Probe::Broken(format!("building the HTTP client: {e}")),
        },
        CheckKind::Tcp { addr, .. } => Probe::Tcp {
            addr: addr.clone(),
            timeout: timeout.unwrap_or(DEFAULT_NETWORK_TIMEOUT),
        },
        CheckKind::Script { args, .. } => Probe::Script {
            args: args.clone(),
            timeout: timeout.unwrap_or(DEFAULT_SCRIPT_TIMEOUT),
            max,
        },
    };
    let interval = check.interval().unwrap_or(MIN_INTERVAL).max(MIN_INTERVAL);
    let handler = StatusHandler::new(check.thresholds);
    local.tasks.spawn(run_interval(
        report,
        probe,
        interval,
        handler,
        cancel.clone(),
    ));
    Some(RunnerHandle {
        id,
        cancel,
        ttl_deadline: None,
        initial: None,
    })
}

/// Where a runner's results go.
struct Reporter {
    local: Arc<LocalState>,
    check_id: String,
    runner: u64,
}

impl Reporter {
    fn report(&self, status: HealthStatus, output: String) {
        self.local
            .runner_result(&self.check_id, self.runner, status, output);
    }
}

async fn run_ttl(
    report: Reporter,
    mut deadline: watch::Receiver<Instant>,
    cancel: CancellationToken,
) {
    loop {
        let at = *deadline.borrow_and_update();
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            changed = deadline.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(at) => {
                report.local.ttl_expired(&report.check_id, report.runner);
                // Expired once; wait for the next update to re-arm.
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    changed = deadline.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}

/// Waits for the process behind `fd` (a pidfd) to exit, then reports the check critical.
async fn run_process(
    report: Reporter,
    fd: std::os::fd::OwnedFd,
    pid: u32,
    cancel: CancellationToken,
) {
    // Deprecated for types that could close or swap their descriptor while registered; an
    // `OwnedFd` moved into the `AsyncFd` cannot, which is the sound case (and needs no
    // `unsafe`, which this workspace forbids).
    #[allow(deprecated)]
    let registered = tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE);
    let fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            report.report(
                HealthStatus::Critical,
                format!("watching process {pid}: {e}"),
            );
            return;
        }
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => {}
        ready = fd.readable() => {
            let output = match ready {
                Ok(_) => format!("process {pid} exited"),
                Err(e) => format!("watching process {pid}: {e}"),
            };
            tracing::warn!(check = %report.check_id, pid, "the process a check follows is gone; critical");
            report.report(HealthStatus::Critical, output);
        }
    }
}

/// Opening a handle on a process that stays valid (never names a later process with a reused
/// ID) and turns readable when the process exits.
mod process {
    use std::io;
    use std::os::fd::OwnedFd;

    /// A pidfd for `pid`; `Err` when no such process runs (or pidfds are unavailable).
    #[cfg(target_os = "linux")]
    pub fn open(pid: u32) -> io::Result<OwnedFd> {
        use rustix::process::{Pid, PidfdFlags, pidfd_open};
        let pid = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::from_raw_os_error(rustix::io::Errno::SRCH.raw_os_error()))?;
        pidfd_open(pid, PidfdFlags::NONBLOCK).map_err(io::Error::from)
    }

    /// Process checks are refused at registration off Linux; this is what one would report.
    #[cfg(not(target_os = "linux"))]
    pub fn open(_pid: u32) -> io::Result<OwnedFd> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "process checks need Linux (pidfd)",
        ))
    }
}

enum Probe {
    Http {
        client: reqwest::Client,
        check: HttpCheck,
        max: usize,
    },
    Tcp {
        addr: String,
        timeout: Duration,
    },
    Script {
        args: Vec<String>,
        timeout: Duration,
        max: usize,
    },
    /// The probe could not be set up; every run reports this.
    Broken(String),
}

impl Probe {
    async fn run(&self) -> Outcome {
        match self {
            Probe::Http { client, check, max } => http_probe(client, check, *max).await,
            Probe::Tcp { addr, timeout } => tcp_probe(addr, *timeout).await,
            Probe::Script { args, timeout, max } => script_probe(args, *timeout, *max).await,
            Probe::Broken(reason) => Outcome::Direct(HealthStatus::Critical, reason.clone()),
        }
    }
}

async fn run_interval(
    report: Reporter,
    probe: Probe,
    interval: Duration,
    mut handler: StatusHandler,
    cancel: CancellationToken,
) {
    let stagger = {
        let ns = interval.as_nanos().min(u128::from(u64::MAX)) as u64;
        Duration::from_nanos(rand::thread_rng().gen_range(0..ns.max(1)))
    };
    let mut next = Instant::now() + stagger;
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        // Cancelling mid-run drops the probe's future, which kills a script's process group.
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            outcome = probe.run() => outcome,
        };
        match outcome {
            Outcome::Result(status, output) => {
                if let Some(status) = handler.apply(status) {
                    report.report(status, output);
                }
            }
            Outcome::Direct(status, output) => report.report(status, output),
        }
        next = Instant::now() + interval;
    }
}

fn http_client(check: &HttpCheck, timeout: Option<Duration>) -> reqwest::Result<reqwest::Client> {
    let redirect = if check.disable_redirects {
        reqwest::redirect::Policy::none()
    } else {
        reqwest::redirect::Policy::default()
    };
    // Consul disables keep-alives so a stale pooled connection never fails a check.
    reqwest::Client::builder()
        .timeout(timeout.unwrap_or(DEFAULT_NETWORK_TIMEOUT))
        .redirect(redirect)
        .pool_max_idle_per_host(0)
        .build()
}

/// An error and its causes, joined as Go joins wrapped errors.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Go's `url.Error` operation name: the method with only its first letter upper-case.
fn go_op(method: &str) -> String {
    let lower = method.to_ascii_lowercase();
    let mut chars = lower.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

async fn http_probe(client: &reqwest::Client, check: &HttpCheck, max: usize) -> Outcome {
    let method = if check.method.is_empty() {
        "GET"
    } else {
        check.method.as_str()
    };
    let critical = |message: String| Outcome::Result(HealthStatus::Critical, message);
    let Ok(verb) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return critical(format!("net/http: invalid method {method:?}"));
    };
    let mut request = client.request(verb, &check.url).body(check.body.clone());
    let has = |name: &str| check.header.keys().any(|k| k.eq_ignore_ascii_case(name));
    for (name, values) in &check.header {
        for value in values {
            request = request.header(name.as_str(), value.as_str());
        }
    }
    if !has("User-Agent") {
        request = request.header(reqwest::header::USER_AGENT, USER_AGENT);
    }
    if !has("Accept") {
        request = request.header(reqwest::header::ACCEPT, ACCEPT);
    }
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            return critical(format!(
                "{} {:?}: {}",
                go_op(method),
                check.url,
                error_chain(&e)
            ));
        }
    };
    let mut body = OutputTail::new(max);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => body.write(&chunk),
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(url = %check.url, error = %e, "check error while reading body");
                break;
            }
        }
    }
    let code = response.status();
    let status_line = match code.canonical_reason() {
        Some(reason) => format!("{} {reason}", code.as_u16()),
        None => code.as_u16().to_string(),
    };
    let output = format!(
        "HTTP {method} {}: {status_line} Output: {}",
        check.url,
        body.text()
    );
    Outcome::Result(http_status(code.as_u16()), output)
}

async fn tcp_probe(addr: &str, timeout: Duration) -> Outcome {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_stream)) => Outcome::Result(
            HealthStatus::Passing,
            format!("TCP connect {addr}: Success"),
        ),
        Ok(Err(e)) => Outcome::Result(HealthStatus::Critical, format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::Result(
            HealthStatus::Critical,
            format!("dial tcp {addr}: i/o timeout"),
        ),
    }
}

/// Kills a script's whole process group when dropped while armed (a timeout, or the check
/// going away mid-run); a group already gone is fine.
struct ProcessGroup {
    pgid: Pid,
    armed: bool,
}

impl ProcessGroup {
    /// The script finished by itself: leave whatever it started alone, as Consul does.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.armed {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

async fn script_probe(args: &[String], timeout: Duration, max: usize) -> Outcome {
    let critical = |message: String| Outcome::Direct(HealthStatus::Critical, message);
    let Some((program, rest)) = args.split_first() else {
        return critical("no script to run".to_owned());
    };
    // stdout and stderr share one pipe, so the output interleaves as the script wrote it.
    let (reader, writer) = match std::io::pipe() {
        Ok(pair) => pair,
        Err(e) => return critical(format!("creating the output pipe: {e}")),
    };
    let stdout = match writer.try_clone() {
        Ok(w) => w,
        Err(e) => return critical(format!("creating the output pipe: {e}")),
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(writer)
        .process_group(0)
        .kill_on_drop(true);
    let spawned = command.spawn();
    // The parent's copies of the pipe's write end must go, or the read never ends.
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return critical(e.to_string()),
    };
    let group = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(|pid| ProcessGroup {
            pgid: Pid::from_raw(pid),
            armed: true,
        });
    let mut reader = match tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into()) {
        Ok(r) => r,
        Err(e) => return critical(format!("reading the script's output: {e}")),
    };
    let mut output = OutputTail::new(max);
    let run = async {
        let mut chunk = [0u8; 4096];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => output.write(&chunk[..n]),
            }
        }
        child.wait().await
    };
    let finished = tokio::time::timeout(timeout, run).await;
    match finished {
        Ok(Ok(status)) => {
            if let Some(group) = group {
                group.disarm();
            }
            Outcome::Result(script_status(status.code()), output.script_output())
        }
        Ok(Err(e)) => critical(e.to_string()),
        Err(_) => {
            drop(group);
            // Reap it, so another run never overlaps this one.
            let _ = child.wait().await;
            let mut message = format!("Timed out ({}) running check", format_go_duration(timeout));
            let text = output.script_output();
            if !text.is_empty() {
                message.push_str("\n\n");
                message.push_str(&text);
            }
            critical(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthStatus::{Critical, Passing, Warning};

    #[test]
    fn http_codes() {
        assert_eq!(http_status(200), Passing);
        assert_eq!(http_status(204), Passing);
        assert_eq!(http_status(299), Passing);
        assert_eq!(http_status(429), Warning);
        assert_eq!(http_status(300), Critical);
        assert_eq!(http_status(404), Critical);
        assert_eq!(http_status(500), Critical);
        assert_eq!(http_status(199), Critical);
    }

    #[test]
    fn script_exit_codes() {
        assert_eq!(script_status(Some(0)), Passing);
        assert_eq!(script_status(Some(1)), Warning);
        assert_eq!(script_status(Some(2)), Critical);
        assert_eq!(script_status(Some(127)), Critical);
        assert_eq!(script_status(None), Critical, "killed by a signal");
    }

    #[test]
    fn ttl_output_truncation() {
        assert_eq!(truncate_output("short", 10), "short");
        assert_eq!(truncate_output("0123456789", 10), "0123456789");
        assert_eq!(
            truncate_output("0123456789ab", 10),
            "0123456789 ... (captured 10 of 12 bytes)"
        );
        // Never splits a character.
        assert_eq!(truncate_output("ééé", 3), "é ... (captured 2 of 6 bytes)");
        let big = "x".repeat(5000);
        assert!(truncate_output(&big, 4096).ends_with(" ... (captured 4096 of 5000 bytes)"));
    }

    #[test]
    fn output_tail_keeps_the_last_bytes() {
        let mut t = OutputTail::new(4);
        t.write(b"ab");
        assert_eq!(t.script_output(), "ab");
        t.write(b"cdef");
        t.write(b"g");
        assert_eq!(t.text(), "defg");
        assert_eq!(t.script_output(), "Captured 4 of 7 bytes\n...\ndefg");
        let mut big = OutputTail::new(3);
        big.write(b"0123456789");
        assert_eq!(big.text(), "789");
    }

    #[test]
    fn thresholds_zero_report_everything() {
        let mut h = StatusHandler::new(Thresholds::default());
        assert_eq!(h.apply(Passing), Some(Passing));
        assert_eq!(h.apply(Critical), Some(Critical));
        assert_eq!(h.apply(Warning), Some(Warning));
    }

    #[test]
    fn success_before_passing() {
        let mut h = StatusHandler::new(Thresholds {
            success_before_passing: 2,
            ..Thresholds::default()
        });
        assert_eq!(h.apply(Passing), None);
        assert_eq!(h.apply(Passing), Some(Passing));
        assert_eq!(
            h.apply(Critical),
            Some(Critical),
            "a failure resets the count"
        );
        assert_eq!(h.apply(Warning), None, "warning counts as a success");
        assert_eq!(h.apply(Passing), Some(Passing));
    }

    #[test]
    fn failures_before_warning_and_critical() {
        let mut h = StatusHandler::new(Thresholds {
            success_before_passing: 0,
            failures_before_warning: 1,
            failures_before_critical: 3,
        });
        assert_eq!(h.apply(Critical), Some(Warning));
        assert_eq!(h.apply(Critical), Some(Warning));
        assert_eq!(h.apply(Critical), Some(Critical));
        assert_eq!(h.apply(Passing), Some(Passing));
        assert_eq!(
            h.apply(Critical),
            Some(Warning),
            "a success resets the count"
        );

        let mut silent = StatusHandler::new(Thresholds {
            success_before_passing: 0,
            failures_before_warning: 2,
            failures_before_critical: 2,
        });
        assert_eq!(silent.apply(Critical), None);
        assert_eq!(silent.apply(Critical), Some(Critical));
    }

    #[test]
    fn go_operation_names() {
        assert_eq!(go_op("GET"), "Get");
        assert_eq!(go_op("post"), "Post");
    }

    #[tokio::test]
    async fn scripts_map_exit_codes_and_time_out() {
        let run = |args: &[&str], timeout: Duration| {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            async move { script_probe(&args, timeout, 4096).await }
        };
        let second = Duration::from_secs(5);
        let Outcome::Result(Passing, out) =
            run(&["sh", "-c", "echo hi; echo err >&2"], second).await
        else {
            panic!("exit 0 is passing")
        };
        assert_eq!(out, "hi\nerr\n");
        assert!(matches!(
            run(&["sh", "-c", "exit 1"], second).await,
            Outcome::Result(Warning, _)
        ));
        assert!(matches!(
            run(&["sh", "-c", "exit 2"], second).await,
            Outcome::Result(Critical, _)
        ));
        let Outcome::Direct(Critical, out) = run(&["/nonexistent/script"], second).await else {
            panic!("a script that cannot start is critical at once")
        };
        assert!(out.contains("No such file"), "{out}");
        // The timeout kills the whole group: the background sleep holding the pipe open too.
        let started = Instant::now();
        let Outcome::Direct(Critical, out) = run(
            &["sh", "-c", "echo begun; sleep 30 & sleep 30"],
            Duration::from_millis(300),
        )
        .await
        else {
            panic!("a timeout is critical at once")
        };
        assert_eq!(out, "Timed out (300ms) running check\n\nbegun\n");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
