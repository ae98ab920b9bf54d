//! What several test files share and the harness (`integration_tests`) has no business
//! offering: assertions on Consul's error answers, a snapshot of the KV store, a deadline, an
//! agent that must refuse its config, the safety checker's verdict, and the lock that keeps the
//! heaviest tests from running side by side in this one process.

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use integration_tests::safety::{Plan, Report};
use integration_tests::{Agent, Http, Reply, binary};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use reqwest::StatusCode;
use serde_json::Value;
use tempfile::TempDir;
use tokio::process::Child;
use tokio::sync::{Mutex, MutexGuard};

/// Deadline for anything that should happen promptly on a busy machine.
pub const PROMPT: Duration = Duration::from_secs(30);

/// Held by the tests that load the machine so much (many processes, leader kills on a
/// schedule, hundreds of MB through raft, thousands of sockets) that two of them side by side
/// could make each other miss their deadlines: they run one at a time, beside light tests only.
static EXCLUSIVE: Mutex<()> = Mutex::const_new(());

/// Waits until no other heavy test runs; the heavy test holds the guard to its end. A tokio
/// mutex: it is held across `.await`, and a failed test (a panic) releases it for the next.
pub async fn exclusive() -> MutexGuard<'static, ()> {
    EXCLUSIVE.lock().await
}

/// Lifts this test process's soft open file limit to its hard one: for the tests that hold a
/// socket here for each of thousands of connections.
pub fn raise_open_files() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("the open file limit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("raise the open file limit");
}

/// A dev agent named `node` serving its API on the Unix socket `socket` only, started and
/// ready; with the ready line it printed.
pub async fn unix_dev_agent(socket: &std::path::Path, node: &str) -> (Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut agent = tokio::process::Command::new(binary())
        .args(["agent", "--dev", "--node", node, "--log-level", "warn"])
        .arg("--http-addr")
        .arg(format!("unix://{}", socket.display()))
        .args(["--rpc-addr", "127.0.0.1:0", "--serf-addr", "127.0.0.1:0"])
        .args(["--timing-profile", "local"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn vigil agent");
    let stdout = agent.stdout.take().expect("piped stdout");
    let line = tokio::io::BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("a ready line");
    (agent, line)
}

/// Blocking queries the server behind `http` holds now (`Stats.consul.blocking_queries` of
/// `/v1/agent/self`).
/// A dev agent with ACLs on, default deny, and `root` as its initial management token.
pub async fn deny_dev_agent(root: &str) -> Agent {
    Agent::dev_with(&[
        "--acl-default-policy",
        "deny",
        "--acl-initial-management-token",
        root,
    ])
    .await
}

pub async fn blocking_queries(http: &Http) -> usize {
    let reply = http.get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Stats"]["consul"]["blocking_queries"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("blocking_queries in {}", reply.text()))
}

pub fn b64(bytes: impl AsRef<[u8]>) -> String {
    BASE64.encode(bytes)
}

/// Asserts an error answer: `status` with exactly `message` as the body.
pub fn assert_error(reply: &Reply, status: StatusCode, message: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.text(), message);
}

/// Asserts a refusal: `status` with a body starting with `prefix`.
pub fn assert_error_prefix(reply: &Reply, status: StatusCode, prefix: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert!(reply.text().starts_with(prefix), "{}", reply.text());
}

/// Asserts a refusal: `status` with a body containing `part`.
pub fn assert_error_containing(reply: &Reply, status: StatusCode, part: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert!(reply.text().contains(part), "{}", reply.text());
}

/// Holds `key` (value `s1`) with a session of `lock_delay`, then destroys the session: the key
/// is released and its lock-delay armed.
pub async fn arm_lock_delay(agent: &Http, key: &str, lock_delay: &str) {
    let s1 = agent
        .session(&format!(r#"{{"LockDelay":"{lock_delay}"}}"#))
        .await;
    agent
        .put_true(&format!("/v1/kv/{key}?acquire={s1}"), "s1")
        .await;
    agent.destroy_session(&s1).await;
}

/// A GET of `path` answers 404 (a missing key, an empty listing).
pub async fn assert_not_found(agent: &Http, path: &str) {
    let reply = agent.get(path).await;
    assert_eq!(
        reply.status,
        StatusCode::NOT_FOUND,
        "{path}: {}",
        reply.text()
    );
}

/// [`assert_error`] for a GET of each of `paths`; returns the replies, in order.
pub async fn assert_gets_answer(
    agent: &Http,
    paths: &[&str],
    status: StatusCode,
    message: &str,
) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(paths.len());
    for path in paths {
        let reply = agent.get(path).await;
        assert_eq!(reply.status, status, "{path}: {}", reply.text());
        assert_eq!(reply.text(), message, "{path}");
        replies.push(reply);
    }
    replies
}

/// [`assert_error`] for a plain-text answer, as Consul writes its errors.
pub fn assert_plain_error(reply: &Reply, status: StatusCode, message: &str) {
    assert_error(reply, status, message);
    assert_eq!(
        reply.header("Content-Type").as_deref(),
        Some("text/plain; charset=utf-8")
    );
}

/// A blocking read of `path` at `index` with nothing changing: it waits out its 300 ms and
/// answers 200 with the same index (a 200 is not proof of a change).
pub async fn assert_waits_out(agent: &Http, path: &str, index: u64) {
    let started = Instant::now();
    let reply = agent.get(&format!("{path}?index={index}&wait=300ms")).await;
    assert!(started.elapsed() >= Duration::from_millis(300), "{path}");
    assert_eq!(reply.status, StatusCode::OK, "{path}");
    assert_eq!(reply.index(), index, "{path}");
}

/// Everything in the store and the global KV index, to prove a refused request changed nothing.
pub async fn kv_state(agent: &Http) -> (u64, Value) {
    let keys = agent.get("/v1/kv/?keys").await;
    assert_eq!(keys.status, StatusCode::OK);
    let all = agent.get("/v1/kv/?recurse").await;
    let entries = if all.status == StatusCode::OK {
        all.json()
    } else {
        Value::Null
    };
    (keys.index(), entries)
}

/// Waits (within [`PROMPT`]) for a `vigil` process and returns its exit code.
pub async fn exit_code(child: &mut Child) -> i32 {
    let status = tokio::time::timeout(PROMPT, child.wait())
        .await
        .expect("vigil did not exit in time")
        .expect("wait for vigil");
    status.code().expect("exit code")
}

/// `contents` written to `agent.toml` in a new temporary directory, which lives as long as the
/// returned handle; the file's path is for `--config`.
pub fn config_file(contents: &str) -> (TempDir, String) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, contents).expect("write the config file");
    let config = config.to_str().expect("UTF-8 path").to_owned();
    (dir, config)
}

/// Runs a dev agent with `--config <config>`, which must refuse to start; returns its stderr.
pub fn refused_config(config: impl AsRef<OsStr>) -> String {
    let output = std::process::Command::new(binary())
        .args(["agent", "--dev", "--http-addr", "127.0.0.1:0"])
        .args(["--rpc-addr", "127.0.0.1:0", "--serf-addr", "127.0.0.1:0"])
        .arg("--config")
        .arg(config)
        .output()
        .expect("run vigil");
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A lock-safety run's verdict: no violation, at least the planned handoffs, every planned
/// fault applied.
pub fn assert_safe(report: &Report, plan: &Plan) {
    assert!(report.violations.is_empty(), "{report}");
    assert!(
        report.handoffs >= plan.handoffs,
        "too few handoffs: {report}"
    );
    assert_eq!(report.faults.len(), plan.schedule.faults, "{report}");
}
