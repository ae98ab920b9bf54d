//! Test harness: real `vigil agent` processes on 127.0.0.1, and a small HTTP client that returns
//! status, headers and body so tests can assert Consul's exact answers. [`Agent`] runs one
//! process from any arguments (a dev agent with [`Agent::dev`]); [`cluster`] builds server sets
//! and client agents out of them.

pub mod cluster;
pub mod jepsen;
pub mod safety;

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use reqwest::{Method, StatusCode, header::HeaderMap};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};
use vigil_shared::go::duration::parse_go_duration;

/// How long an agent may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("header is ASCII").to_owned())
    }

    /// `X-Consul-Index` as a number (panics when absent).
    pub fn index(&self) -> u64 {
        self.header("X-Consul-Index")
            .expect("X-Consul-Index header")
            .parse()
            .expect("numeric index")
    }

    /// The remaining delay an acquire refusal reports (`X-Vigil-Lock-Delay`).
    pub fn lock_delay_remaining(&self) -> Duration {
        let header = self
            .header("X-Vigil-Lock-Delay")
            .unwrap_or_else(|| panic!("refusal without X-Vigil-Lock-Delay: {}", self.text()));
        parse_go_duration(&header).unwrap_or_else(|e| panic!("{header:?} is no Go duration: {e}"))
    }
}

/// The agent binary built for these tests (`vigil`'s code).
pub fn binary() -> std::path::PathBuf {
    built_binary("vigil-under-test")
}

/// The demo binary built for these tests (`vigil-demo`'s code: the bank and the worker).
pub fn demo_binary() -> std::path::PathBuf {
    built_binary("vigil-demo-under-test")
}

/// A binary of this crate: `CARGO_BIN_EXE_<name>` names it when set (`vigil-bench` sets it for
/// the agent); otherwise it sits next to the `deps/` directory holding a test executable, or
/// next to a binary of this crate (`vigil-jepsen`).
fn built_binary(name: &str) -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(format!("CARGO_BIN_EXE_{name}")) {
        return path.into();
    }
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable directory");
    if dir.file_name().is_some_and(|d| d == "deps") {
        dir.parent().expect("target directory").join(name)
    } else {
        dir.join(name)
    }
}

/// Whether `name` is one of the variables Cargo sets for a package's binaries and tests (not
/// one that configures Cargo itself).
fn is_package_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// Builds the agent binary beside the running program when it runs under Cargo (a no-op when
/// fresh: `cargo run --bin X` builds only X), in the same profile; returns its path.
pub fn build_agent() -> anyhow::Result<std::path::PathBuf> {
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut build = std::process::Command::new(cargo);
        build.args([
            "build",
            "-p",
            "integration-tests",
            "--bin",
            "vigil-under-test",
        ]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        // Cargo hands the package's own variables to what it runs; a build script that reruns
        // when one changes (ring's, on `CARGO_MANIFEST_DIR`) made this build and the next
        // outer one each rebuild ring and everything on it, every run.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(is_package_variable) {
                build.env_remove(name);
            }
        }
        let status = build.status()?;
        anyhow::ensure!(status.success(), "building vigil-under-test failed");
    }
    let agent = std::env::current_exe()?.with_file_name("vigil-under-test");
    anyhow::ensure!(
        agent.exists(),
        "no agent binary at {} (cargo build -p integration-tests --bins)",
        agent.display()
    );
    Ok(agent)
}

/// An agent's HTTP API. Cheap to clone, so concurrent tasks can each hold one.
#[derive(Clone, Debug)]
pub struct Http {
    /// `http://host:port`.
    pub base: String,
    client: reqwest::Client,
    /// Sent as `X-Consul-Token` on every request, if set.
    token: Option<String>,
}

impl Http {
    pub fn new(base: String) -> Http {
        Http {
            base,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("HTTP client"),
            token: None,
        }
    }

    /// The same API, sending `token` as `X-Consul-Token` on every request.
    pub fn with_token(&self, token: &str) -> Http {
        Http {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    /// Sends a request; `Err` when the agent could not be reached or did not answer.
    pub async fn try_request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> reqwest::Result<Reply> {
        let mut req = self.client.request(method, self.url(path));
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req.send().await?;
        Ok(Reply {
            status: resp.status(),
            headers: resp.headers().clone(),
            body: resp.bytes().await?.to_vec(),
        })
    }

    /// Sends a request; panics when the agent does not answer.
    pub async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Reply {
        self.try_request(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("HTTP request to {}{path}: {e}", self.base))
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, None).await
    }

    /// A GET that reports an unreachable agent as `None` instead of panicking.
    pub async fn try_get(&self, path: &str) -> Option<Reply> {
        self.try_request(Method::GET, path, None).await.ok()
    }

    /// `node`'s check `id` as this agent reads it from the catalog (`None`: no such check, the
    /// node is not in the catalog, or the agent is unreachable).
    pub async fn catalog_check(&self, node: &str, id: &str) -> Option<Value> {
        let reply = self.try_get(&format!("/v1/health/node/{node}")).await?;
        if reply.status != StatusCode::OK {
            return None;
        }
        reply
            .json()
            .as_array()?
            .iter()
            .find(|c| c["CheckID"] == id)
            .cloned()
    }

    /// The `Status` of `node`'s `serfHealth` check as this agent reports it.
    pub async fn serf_health(&self, node: &str) -> Option<String> {
        let check = self.catalog_check(node, "serfHealth").await?;
        check["Status"].as_str().map(str::to_owned)
    }

    pub async fn put(&self, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        self.request(Method::PUT, path, Some(body.into())).await
    }

    pub async fn post_json(&self, path: &str, body: Value) -> Reply {
        self.request(Method::POST, path, Some(body.to_string().into_bytes()))
            .await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.request(Method::DELETE, path, None).await
    }

    /// Creates a session from a JSON body and returns its ID.
    pub async fn session(&self, body: &str) -> String {
        let reply = self.put("/v1/session/create", body).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply.json()["ID"].as_str().expect("session ID").to_owned()
    }

    /// A write that must answer `200 true`.
    pub async fn put_true(&self, path: &str, body: impl Into<Vec<u8>>) {
        let reply = self.put(path, body).await;
        let base = &self.base;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "PUT {path} through {base}: {}",
            reply.text()
        );
        assert_eq!(reply.json(), json!(true), "PUT {path} through {base}");
    }

    /// A write that must be refused with `200 false`; the reply, for its headers.
    pub async fn put_false(&self, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        let reply = self.put(path, body).await;
        assert_eq!(reply.status, StatusCode::OK, "PUT {path}: {}", reply.text());
        assert_eq!(reply.json(), json!(false), "PUT {path}");
        reply
    }

    /// A plain `PUT /v1/kv/<key>` that must answer `200 true`.
    pub async fn put_key(&self, key: &str, value: &str) {
        self.put_true(&format!("/v1/kv/{key}"), value).await;
    }

    /// The single entry stored at `key` (a GET must answer a one-element array).
    pub async fn kv_entry(&self, key: &str) -> Value {
        let reply = self.get(&format!("/v1/kv/{key}")).await;
        assert_eq!(reply.status, StatusCode::OK, "GET {key}: {}", reply.text());
        let list = reply.json();
        assert_eq!(list.as_array().map(Vec::len), Some(1), "GET {key}: {list}");
        list[0].clone()
    }

    /// The session holding `key` (`None`: not held, or no such key).
    pub async fn holder(&self, key: &str) -> Option<String> {
        let reply = self.get(&format!("/v1/kv/{key}")).await;
        match reply.status {
            StatusCode::NOT_FOUND => None,
            StatusCode::OK => reply.json()[0]["Session"].as_str().map(str::to_owned),
            other => panic!("reading {key}: {other} {}", reply.text()),
        }
    }

    /// `?acquire` of `key` for `session` (value `held`); the answer must be a 200, whose body
    /// says whether the lock was granted.
    pub async fn acquire(&self, key: &str, session: &str) -> Reply {
        let reply = self
            .put(&format!("/v1/kv/{key}?acquire={session}"), "held")
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply
    }

    /// An `?acquire` that must be granted.
    pub async fn acquire_ok(&self, key: &str, session: &str) {
        let reply = self.acquire(key, session).await;
        assert_eq!(reply.text(), "true", "acquire {key}");
    }

    /// A `?release` of `key` by `session` (value `held`) that must answer `200 true`.
    pub async fn release_ok(&self, key: &str, session: &str) {
        self.put_true(&format!("/v1/kv/{key}?release={session}"), "held")
            .await;
    }

    /// `/v1/session/info/<id>`: a one-element array, `[]` once the session is gone.
    pub async fn session_info(&self, id: &str) -> Value {
        let reply = self.get(&format!("/v1/session/info/{id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply.json()
    }

    /// Whether session `id` still exists.
    pub async fn session_exists(&self, id: &str) -> bool {
        let info = self.session_info(id).await;
        !info.as_array().expect("session list").is_empty()
    }

    /// Destroys session `id`, which must answer `200 true`.
    pub async fn destroy_session(&self, id: &str) {
        self.put_true(&format!("/v1/session/destroy/{id}"), "")
            .await;
    }

    /// `GET /v1/vigil/sequencer?<query>`, which must answer 200 (its body is the verdict).
    pub async fn sequencer(&self, query: &str) -> Reply {
        let reply = self.get(&format!("/v1/vigil/sequencer?{query}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply
    }

    /// `/v1/agent/members`.
    pub async fn members(&self) -> Vec<Value> {
        let reply = self.get("/v1/agent/members").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply.json().as_array().expect("members array").clone()
    }
}

/// A new gossip encryption key from `vigil keygen`.
pub fn keygen() -> String {
    let out = std::process::Command::new(binary())
        .arg("keygen")
        .output()
        .expect("run vigil keygen");
    assert!(out.status.success(), "vigil keygen failed: {out:?}");
    String::from_utf8(out.stdout)
        .expect("UTF-8 key")
        .trim()
        .to_owned()
}

/// A running `vigil` process (killed when dropped) and its HTTP API (through `Deref`).
pub struct Agent {
    child: Child,
    http: Http,
    /// The RPC address from the ready line (a client agent reports its unused `--rpc-addr`).
    pub rpc_addr: String,
    /// The node name from the ready line.
    pub node: String,
    /// The HTTPS API's address from the ready line (`--https-addr`), if it serves one. With
    /// `--http-addr off` the plain [`Http`] handle reaches nothing.
    pub https_addr: Option<String>,
}

impl Deref for Agent {
    type Target = Http;

    fn deref(&self) -> &Http {
        &self.http
    }
}

/// The test knobs: settings that are no `vigil agent` flag, given to an agent as a variable of
/// the config's environment layer (docs/design.md, "Configuration"). A 1 s minimum session TTL
/// (the config key `session_ttl_min`, Consul's, 10 s by default), so TTL tests are short.
pub const SHORT_SESSION_TTL: (&str, &str) = ("VIGIL_AGENT_SESSION_TTL_MIN", "1s");
/// A 1 s full anti-entropy period (`ae_interval`, a key only tests set; 1 min otherwise).
pub const SHORT_AE_INTERVAL: (&str, &str) = ("VIGIL_AGENT_AE_INTERVAL", "1s");

/// No variables for [`Agent::spawn_binary`].
pub const NO_ENV: [(&str, &str); 0] = [];

impl Agent {
    /// Starts a dev agent on free ports with a 1 s minimum session TTL, so TTL tests are short.
    pub async fn dev() -> Agent {
        Agent::dev_with_env(&[], &[SHORT_SESSION_TTL]).await
    }

    pub async fn dev_with(extra: &[&str]) -> Agent {
        Agent::dev_with_env(extra, &[]).await
    }

    /// [`Agent::dev_with`] with test knobs ([`SHORT_SESSION_TTL`], [`SHORT_AE_INTERVAL`]).
    pub async fn dev_with_env(extra: &[&str], env: &[(&str, &str)]) -> Agent {
        Agent::dev_named("test-node", "warn", extra, env, None).await
    }

    /// A dev agent named `node` on free ports with `extra` flags and the variables `env`,
    /// logging at `level` into `log` (or onto the test's stderr).
    pub async fn dev_named(
        node: &str,
        level: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Agent {
        let mut args = vec!["agent", "--dev", "--node", node];
        args.extend(["--http-addr", "127.0.0.1:0", "--rpc-addr", "127.0.0.1:0"]);
        args.extend(["--serf-addr", "127.0.0.1:0", "--gossip-profile", "local"]);
        args.extend(["--log-level", level]);
        args.extend(extra);
        Agent::spawn_binary(&binary(), None, env.iter().copied(), args, log).await
    }

    /// Runs `vigil <args>` and waits for its `vigil agent running: ...` line. Its stderr goes
    /// to `log` (appended, so restarts accumulate) or is inherited.
    pub async fn spawn<I, S>(args: I, log: Option<&Path>) -> Agent
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Agent::spawn_with_limit(None, args, log).await
    }

    /// [`Agent::spawn`] with the open file limit (`RLIMIT_NOFILE`, soft and hard) set to
    /// `nofile` for the agent (by `prlimit`, from util-linux), if given.
    pub async fn spawn_with_limit<I, S>(
        nofile: Option<(u64, u64)>,
        args: I,
        log: Option<&Path>,
    ) -> Agent
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Agent::spawn_binary(&binary(), nofile, NO_ENV, args, log).await
    }

    /// [`Agent::spawn_with_limit`] of another `vigil` binary (a previous release's, say), with
    /// the variables `env` added to the environment.
    pub async fn spawn_binary<E, K, V, I, S>(
        binary: &Path,
        nofile: Option<(u64, u64)>,
        env: E,
        args: I,
        log: Option<&Path>,
    ) -> Agent
    where
        E: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let stderr = match log {
            Some(path) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
                .into(),
            None => Stdio::inherit(),
        };
        // No NO_COLOR: the agent must write plain text to a log file by itself.
        let mut command = match nofile {
            None => Command::new(binary),
            Some((soft, hard)) => {
                let mut command = Command::new("prlimit");
                command.arg(format!("--nofile={soft}:{hard}")).arg(binary);
                command
            }
        };
        let mut child = command
            .env_remove("NO_COLOR")
            .envs(env)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn vigil agent");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let log_tail = || log.map(|p| log_tail(p, 20)).unwrap_or_default();
        let line = match timeout(START_TIMEOUT, lines.next_line()).await {
            Err(_) => panic!("agent did not start in time\n{}", log_tail()),
            Ok(Err(e)) => panic!("read agent stdout: {e}"),
            Ok(Ok(None)) => panic!("agent exited before it was ready\n{}", log_tail()),
            Ok(Ok(Some(line))) => line,
        };
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                .to_owned()
        };
        let http = field("http=");
        let rpc_addr = field("rpc=");
        let node = field("node=");
        let https_addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("https="))
            .map(str::to_owned);
        // Keep draining stdout so the agent never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Agent {
            child,
            http: Http::new(format!("http://{http}")),
            rpc_addr,
            node,
            https_addr,
        }
    }

    /// A handle on the HTTP API that outlives borrows of the agent (for spawned tasks).
    pub fn http(&self) -> Http {
        self.http.clone()
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.id() {
            let status = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {signal} {pid} failed");
        }
    }

    /// The process ID while it runs (for `kill -STOP` / `kill -CONT`).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits up to `limit` for the process to exit on its own (e.g. after
    /// `PUT /v1/agent/leave`); returns its exit code, `None` when killed by a signal.
    pub async fn wait_exit(mut self, limit: Duration) -> Option<i32> {
        timeout(limit, self.child.wait())
            .await
            .expect("agent did not exit")
            .expect("wait for agent")
            .code()
    }

    /// The exit status if the process has exited on its own (`None` while it runs).
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("poll the agent process")
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit code.
    pub async fn terminate(mut self) -> Option<i32> {
        self.signal("-TERM");
        let status = timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("agent did not exit after SIGTERM")
            .expect("wait for agent");
        status.code()
    }

    /// `kill -9`: no chance to clean up, as in a crash or power loss. Returns once it is gone.
    pub async fn kill9(mut self) {
        self.signal("-KILL");
        timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("agent did not exit after SIGKILL")
            .expect("wait for agent");
    }
}

/// The last `n` lines of a log file (empty when it cannot be read).
///
/// A panic's or a fatal error's message comes first when the log has one: a backtrace after it
/// would push it out of the last `n` lines.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let failure = lines
        .iter()
        .position(|line| line.contains("panicked at") || line.starts_with("Error: "))
        .map(|at| {
            format!(
                "--- the failure in {} ---\n{}\n",
                path.display(),
                lines[at..(at + 4).min(lines.len())].join("\n")
            )
        })
        .unwrap_or_default();
    let tail = lines[lines.len().saturating_sub(n)..].join("\n");
    format!("{failure}--- last lines of {} ---\n{tail}", path.display())
}

/// The workspace's root directory.
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `python3 <args>` with py-consul importable (from `target/pydeps`, which
/// `scripts/install-test-deps.sh` fills), for at most `limit`.
pub async fn python_with_py_consul<S: AsRef<OsStr>>(args: &[S], limit: Duration) -> Output {
    let pydeps = workspace().join("target/pydeps");
    assert!(
        pydeps.join("consul").is_dir(),
        "py-consul is missing: run scripts/install-test-deps.sh"
    );
    let python = Command::new("python3")
        .args(args)
        .env("PYTHONPATH", &pydeps)
        .output();
    timeout(limit, python)
        .await
        .expect("python3 finished in time")
        .expect("run python3")
}

/// Runs `integration-tests/py/<script>` with py-consul against `agent` (host, port and
/// `extra` arguments) and returns its stdout; panics unless it exits 0 having printed its
/// `checks passed` line.
pub async fn run_py_consul(script: &str, agent: &Agent, extra: &[&str]) -> String {
    let script = workspace().join("integration-tests/py").join(script);
    let addr = agent.base.trim_start_matches("http://").to_owned();
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let mut args = vec![script.as_os_str(), OsStr::new(host), OsStr::new(port)];
    args.extend(extra.iter().map(OsStr::new));
    let output = python_with_py_consul(&args, Duration::from_secs(60)).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("checks passed"),
        "py-consul script failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// `n` distinct ports on 127.0.0.1 that were free a moment ago: `bind` takes them all at once
/// (so none comes twice), `local_addr` reads them, and they are released on return. The small
/// window before a process binds them is harmless in practice (the OS hands out ephemeral ports
/// at random).
pub fn free_ports<S>(
    n: usize,
    bind: impl Fn() -> std::io::Result<S>,
    local_addr: impl Fn(&S) -> std::io::Result<std::net::SocketAddr>,
) -> Vec<u16> {
    let held: Vec<S> = (0..n).map(|_| bind().expect("bind a free port")).collect();
    held.iter()
        .map(|s| local_addr(s).expect("bound address").port())
        .collect()
}

/// Polls `check` until it returns `Some`, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
