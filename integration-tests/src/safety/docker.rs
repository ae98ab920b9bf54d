//! The Docker environment: the repository's `docker-compose.yml` as a second project
//! ([`PROJECT`]) with free ports on 127.0.0.1, its own subnets and fast timings, reached only
//! through the published ports. Faults are the user-facing scripts in `docker/faults/`, run
//! with the hold time as their argument, so CI checks that each does what it prints. Worker
//! lines come from the client containers' logs. Everything is removed (`down -v`) on drop.
//!
//! The cluster runs with ACLs on (default deny) and publishes only its HTTPS API: the checker
//! trusts the demo's CA ([`CA_FILE`]) and acts with the management token ([`MANAGEMENT_TOKEN`]),
//! both from `docker/secrets` (written by `docker/build.sh`), through the shared client.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;
use vigil_client::{Client, ClientConfig, ReadOpts, Token};
use vigil_demo::{BANK_CHECK, WORKER_CHECK, WorkerLine};

use super::register::{AgentBoard, client};
use super::schedule::FaultKind;
use super::{Env, Plan};
use crate::free_ports;

/// The image `docker/build.sh` builds.
pub const IMAGE: &str = "vigil:dev";
/// Compose project of the checker's copy (the user's demo keeps the default one).
const PROJECT: &str = "vigil-safety";
/// First two octets of the checker's subnets (the demo uses 10.213).
const NET: &str = "10.214";
/// How long the cluster may take to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(90);
/// The CA that signed every node's certificate, under the repository root.
const CA_FILE: &str = "docker/secrets/vigil-agent-ca.pem";
/// The servers' initial management token, under the repository root.
const MANAGEMENT_TOKEN: &str = "docker/secrets/acl-management.token";
/// One request of the start-up polls may take this long (a node may not answer yet).
const POLL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the Docker scenario can run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DockerStatus {
    Ready,
    /// `docker info` failed: no engine (or no access to it).
    NoDocker(String),
    /// The engine works but `docker/build.sh` has not been run.
    NotBuilt(String),
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests lives in the repository")
        .to_path_buf()
}

fn quiet(program: &str, args: &[&str]) -> std::io::Result<Output> {
    std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
}

/// Checks the engine, the image and the keys and certificates the compose file mounts.
pub fn docker_status() -> DockerStatus {
    match quiet("docker", &["info"]) {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            return DockerStatus::NoDocker(err.lines().last().unwrap_or("").trim().to_owned());
        }
        Err(e) => return DockerStatus::NoDocker(format!("cannot run docker: {e}")),
    }
    let image = quiet("docker", &["image", "inspect", IMAGE]);
    if !image.is_ok_and(|o| o.status.success()) {
        return DockerStatus::NotBuilt(format!("no image {IMAGE}"));
    }
    if !repo_root().join("docker/secrets/gossip.key").exists() {
        return DockerStatus::NotBuilt("no docker/secrets".to_owned());
    }
    if !repo_root().join(MANAGEMENT_TOKEN).exists() {
        return DockerStatus::NotBuilt(format!("no {MANAGEMENT_TOKEN}"));
    }
    DockerStatus::Ready
}

/// Whether this process runs as root (`lossy-network` needs it for nsenter).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|uids| uids.split_whitespace().next().map(|u| u == "0"))
            .unwrap_or(false)
    })
}

/// Distinct TCP ports that were free a moment ago (see [`free_ports`]).
fn free_tcp_ports(n: usize) -> Vec<u16> {
    free_ports(
        n,
        || TcpListener::bind("127.0.0.1:0"),
        TcpListener::local_addr,
    )
}

fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

pub(crate) struct Docker {
    /// `docker compose` or `docker-compose`.
    compose: Vec<String>,
    env: Vec<(String, String)>,
    servers: Vec<String>,
    agents: AgentBoard,
    /// The CA and the management token (no address).
    client_config: ClientConfig,
    bank: String,
    /// Client containers, for their logs.
    clients: Vec<String>,
    /// The fault scripts' output.
    fault_log: PathBuf,
}

impl Docker {
    pub(crate) async fn start(plan: &Plan) -> anyhow::Result<Docker> {
        anyhow::ensure!(
            plan.workers == 3,
            "docker-compose.yml has 3 client nodes, not {}",
            plan.workers
        );
        anyhow::ensure!(
            !plan.worker.broken,
            "the negative control runs on loopback only"
        );
        match docker_status() {
            DockerStatus::Ready => {}
            other => anyhow::bail!("the Docker scenario cannot run: {other:?}"),
        }
        let compose = if quiet("docker", &["compose", "version"]).is_ok_and(|o| o.status.success())
        {
            vec!["docker".to_owned(), "compose".to_owned()]
        } else {
            vec!["docker-compose".to_owned()]
        };
        let ports = free_tcp_ports(7);
        let names = ["S1", "S2", "S3", "C1", "C2", "C3", "BANK"];
        let w = &plan.worker;
        let mut env: Vec<(String, String)> = names
            .iter()
            .zip(&ports)
            .map(|(n, p)| (format!("VIGIL_{n}_PORT"), p.to_string()))
            .collect();
        env.extend(
            [
                ("COMPOSE_PROJECT_NAME", PROJECT.to_owned()),
                ("VIGIL_NET", NET.to_owned()),
                ("VIGIL_GOSSIP_PROFILE", "local".to_owned()),
                ("VIGIL_SESSION_TTL_MIN", "1s".to_owned()),
                ("VIGIL_LOCK_TTL", go_duration(w.ttl)),
                ("VIGIL_LOCK_DELAY", go_duration(w.lock_delay)),
                ("VIGIL_WORKER_WRITES", w.writes.to_string()),
                ("VIGIL_WORKER_INTERVAL", go_duration(w.interval)),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let https = |p: &u16| format!("https://127.0.0.1:{p}");
        let token = std::fs::read_to_string(repo_root().join(MANAGEMENT_TOKEN))
            .with_context(|| format!("reading {MANAGEMENT_TOKEN}"))?;
        let client_config = ClientConfig {
            ca_file: Some(repo_root().join(CA_FILE)),
            token: Some(
                Token::new(&token).with_context(|| format!("{MANAGEMENT_TOKEN} is empty"))?,
            ),
            ..ClientConfig::default()
        };
        let fault_log = std::env::temp_dir().join(format!("{PROJECT}-faults.log"));
        let mut docker = Docker {
            compose,
            env,
            servers: ports[..3].iter().map(https).collect(),
            agents: AgentBoard::new(ports[3..6].iter().map(|p| Some(https(p))).collect()),
            client_config,
            bank: format!("http://127.0.0.1:{}", ports[6]),
            clients: Vec::new(),
            fault_log,
        };
        std::fs::write(&docker.fault_log, "")?;
        // Leftovers of an interrupted run would hold the subnets.
        docker.compose_sync(&["down", "-v", "--remove-orphans"])?;
        let up = docker.compose_sync(&["up", "-d", "--no-build"])?;
        anyhow::ensure!(
            up.status.success(),
            "compose up failed: {}",
            String::from_utf8_lossy(&up.stderr)
        );
        for node in ["c1", "c2", "c3"] {
            let out = docker.compose_sync(&["ps", "-q", node])?;
            let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            anyhow::ensure!(!id.is_empty(), "no container for {node}");
            docker.clients.push(id);
        }
        docker.check_secrets()?;
        docker.wait_for_leader().await?;
        docker.wait_for_checks().await?;
        Ok(docker)
    }

    fn compose_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.compose[0]);
        command
            .args(&self.compose[1..])
            .current_dir(repo_root())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null());
        command
    }

    /// Each container holds only its own secrets: the gossip key, the CA certificate, its own
    /// certificate and key and the demo-worker token, the servers also the management token;
    /// never the CA key or another node's key. The bank holds none.
    fn check_secrets(&self) -> anyhow::Result<()> {
        for node in ["s1", "s2", "s3", "c1", "c2", "c3", "bank"] {
            let out = self.compose_sync(&["ps", "-q", node])?;
            let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            anyhow::ensure!(!id.is_empty(), "no container for {node}");
            let listed = std::process::Command::new("docker")
                .args(["exec", &id, "sh", "-c", "ls /secrets 2>/dev/null || true"])
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("listing /secrets in {node}"))?;
            let mut held: Vec<String> = String::from_utf8_lossy(&listed.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            held.sort();
            let mut expected: Vec<String> = match node {
                "bank" => Vec::new(),
                _ => ["gossip.key", "vigil-agent-ca.pem", "acl-demo-worker.token"]
                    .into_iter()
                    .map(str::to_owned)
                    .chain([format!("{node}.pem"), format!("{node}-key.pem")])
                    .chain(
                        node.starts_with('s')
                            .then(|| "acl-management.token".to_owned()),
                    )
                    .collect(),
            };
            expected.sort();
            anyhow::ensure!(
                held == expected,
                "{node} holds the secrets {held:?}, not only its own {expected:?}"
            );
        }
        Ok(())
    }

    /// A short compose command (up, ps, stop, down), run to completion.
    fn compose_sync(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.compose_command()
            .args(args)
            .output()
            .with_context(|| format!("running compose {args:?}"))
    }

    /// A client of `base` with the checker's CA and token.
    fn client(&self, base: &str) -> Client {
        client(&self.client_config, base)
    }

    /// GET `path` as JSON, `None` when the node does not answer with one in time.
    async fn poll(client: &Client, path: &str) -> Option<serde_json::Value> {
        let read = client.get_json(path, &[], ReadOpts::default());
        match tokio::time::timeout(POLL_TIMEOUT, read).await {
            Ok(Ok((body, _))) => body,
            _ => None,
        }
    }

    /// Every client node registered its health checks through its agent's API: the catalog
    /// shows `demo-bank` passing (the node reaches the bank) and `demo-worker` passing (its
    /// worker has had a turn).
    async fn wait_for_checks(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + UP_TIMEOUT;
        let server = self.client(&self.servers[0]);
        for node in ["c1", "c2", "c3"] {
            loop {
                let passing = |checks: &serde_json::Value, id: &str| {
                    checks.as_array().is_some_and(|checks| {
                        checks
                            .iter()
                            .any(|c| c["CheckID"] == id && c["Status"] == "passing")
                    })
                };
                if let Some(checks) = Self::poll(&server, &format!("/v1/health/node/{node}")).await
                    && passing(&checks, BANK_CHECK)
                    && passing(&checks, WORKER_CHECK)
                {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "{node}'s checks {BANK_CHECK} and {WORKER_CHECK} did not pass within {UP_TIMEOUT:?}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(())
    }

    async fn wait_for_leader(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            for server in &self.servers {
                if let Some(leader) = Self::poll(&self.client(server), "/v1/status/leader").await
                    && leader.as_str().is_some_and(|l| !l.is_empty())
                {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the compose cluster elected no leader within {UP_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        match self.compose_sync(&["down", "-v", "--remove-orphans", "--timeout", "5"]) {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "compose down failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("compose down failed: {e:#}"),
        }
    }
}

impl Env for Docker {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn agents(&self) -> AgentBoard {
        self.agents.clone()
    }

    fn readers(&self) -> Vec<String> {
        self.servers.clone()
    }

    fn client_config(&self) -> ClientConfig {
        self.client_config.clone()
    }

    fn bank(&self) -> String {
        self.bank.clone()
    }

    async fn fault(&mut self, kind: FaultKind, hold: Duration) -> anyhow::Result<String> {
        let script = repo_root().join("docker/faults").join(kind.name());
        let secs = hold.as_secs_f64().ceil().max(1.0) as u64;
        let out = tokio::process::Command::new(&script)
            .arg(secs.to_string())
            .current_dir(repo_root())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running {}", script.display()))?;
        let text = format!(
            "$ {} {secs}\n{}{}",
            kind.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        {
            use std::io::Write as _;
            let mut log = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.fault_log)?;
            writeln!(log, "{text}")?;
        }
        anyhow::ensure!(out.status.success(), "{} failed:\n{text}", kind.name());
        let target = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("fault: {} ", kind.name())))
            .with_context(|| format!("{} printed no `fault:` line:\n{text}", kind.name()))?;
        Ok(target.to_owned())
    }

    async fn lines(&mut self) -> anyhow::Result<Vec<WorkerLine>> {
        let mut lines = Vec::new();
        for id in &self.clients {
            let out = tokio::process::Command::new("docker")
                .args(["logs", id])
                .stdin(Stdio::null())
                .output()
                .await
                .context("docker logs")?;
            anyhow::ensure!(
                out.status.success(),
                "docker logs {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            lines.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| serde_json::from_str::<WorkerLine>(l).ok()),
            );
        }
        Ok(lines)
    }

    async fn stop_workers(&mut self) {
        match self.compose_sync(&["stop", "--timeout", "10", "c1", "c2", "c3"]) {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "compose stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => panic!("compose stop failed: {e:#}"),
        }
    }
}
