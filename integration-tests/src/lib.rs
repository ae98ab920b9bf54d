//! Test harness: real `vigil agent` processes on 127.0.0.1 with OS-chosen ports, and a small
//! HTTP client that returns status, headers and body so tests can assert Consul's exact answers.

use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode, header::HeaderMap};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

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
}

/// The agent binary built for these tests: Cargo names it in the environment of test processes;
/// otherwise it sits next to the `deps/` directory holding the test executable.
pub fn binary() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_vigil-under-test") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("vigil-under-test"))
        .expect("target directory")
}

/// A `vigil agent --dev` process, killed when dropped.
pub struct Agent {
    child: Child,
    pub base: String,
    pub rpc_addr: String,
    pub node: String,
    client: reqwest::Client,
}

impl Agent {
    /// Starts a dev agent on free ports with a 1 s minimum session TTL, so TTL tests are short.
    pub async fn dev() -> Agent {
        Agent::dev_with(&["--session-ttl-min", "1s"]).await
    }

    pub async fn dev_with(extra: &[&str]) -> Agent {
        let node = "test-node".to_owned();
        let mut child = Command::new(binary())
            .args(["agent", "--dev", "--node", &node])
            .args(["--http-addr", "127.0.0.1:0", "--rpc-addr", "127.0.0.1:0"])
            .args(["--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn vigil agent");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = timeout(START_TIMEOUT, lines.next_line())
            .await
            .expect("agent did not start in time")
            .expect("read agent stdout")
            .expect("agent exited before it was ready");
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                .to_owned()
        };
        let http = field("http=");
        let rpc_addr = field("rpc=");
        // Keep draining stdout so the agent never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Agent {
            child,
            base: format!("http://{http}"),
            rpc_addr,
            node,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("HTTP client"),
        }
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    pub async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Reply {
        let mut req = self.client.request(method, self.url(path));
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req.send().await.expect("HTTP request");
        Reply {
            status: resp.status(),
            headers: resp.headers().clone(),
            body: resp.bytes().await.expect("HTTP body").to_vec(),
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, None).await
    }

    pub async fn put(&self, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        self.request(Method::PUT, path, Some(body.into())).await
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

    /// Sends SIGTERM and waits for the process to exit; returns its exit code.
    pub async fn terminate(mut self) -> Option<i32> {
        if let Some(pid) = self.child.id() {
            let status = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .expect("run kill");
            assert!(status.success());
        }
        let status = timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("agent did not exit after SIGTERM")
            .expect("wait for agent");
        status.code()
    }
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
