//! A 3-server Consul 1.8.7 cluster on 127.0.0.1, the benchmark's third column where Consul
//! speaks the same HTTP API as Vigil: Debian bullseye's `consul` (installed by
//! `scripts/install-consul.sh` to `/usr/local/bin/consul`), default settings (its raft log
//! fsyncs every commit) but no cap on HTTP connections from one address, each server with its own HTTP, RPC and gossip ports (DNS and gRPC off)
//! and a data directory in a temporary directory. Servers are child processes killed when the
//! cluster is dropped; their logs go to files in the directory and are shown when start fails.
//! Vigil's client library talks to it unchanged, so every Consul figure is measured by the same
//! client code as Vigil's.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};
use vigil_client::Client;

use super::etcd::{free_tcp_ports, with_log_tails};

/// Where `scripts/install-consul.sh` puts the binary.
pub const BINARY: &str = "/usr/local/bin/consul";

/// How long the servers may take to elect a leader (Consul's first election waits for all
/// three to join, then for its own timers).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One `consul agent -server` (or a client agent, which has no RPC address).
struct Server {
    args: Vec<String>,
    /// `None` once killed by [`ConsulCluster::kill9_leader`].
    child: Option<Child>,
    /// `127.0.0.1:PORT` of its HTTP API.
    http: String,
    /// `127.0.0.1:PORT` of its server RPC, which `/v1/status/leader` names.
    rpc: String,
    log: PathBuf,
}

/// Three servers forming one cluster, and the client agents joined to it; see the module
/// documentation.
pub struct ConsulCluster {
    servers: Vec<Server>,
    /// Client agents (`consul agent` without `-server`), each joined to every server.
    clients: Vec<Server>,
    /// The servers' gossip (Serf LAN) ports, which client agents join.
    lan: Vec<u16>,
    dir: TempDir,
}

/// The arguments every agent takes: its node name, data directory and loopback ports (DNS and
/// gRPC off), and no cap on HTTP connections from one address (Consul's default is 200; the
/// watch fan-out opens a connection per watcher from 127.0.0.2).
fn agent_args(dir: &Path, node: &str, http: u16, lan: u16) -> Vec<String> {
    let data_dir = dir.join(format!("{node}-data"));
    [
        "agent",
        "-node",
        node,
        "-data-dir",
        &data_dir.to_string_lossy(),
        "-bind",
        "127.0.0.1",
        "-client",
        "127.0.0.1",
        "-http-port",
        &http.to_string(),
        "-serf-lan-port",
        &lan.to_string(),
        "-dns-port",
        "-1",
        "-grpc-port",
        "-1",
        "-log-level",
        "warn",
        "-hcl",
        "limits { http_max_conns_per_client = 0 }",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

impl ConsulCluster {
    /// The version line of the installed Consul, or why there is none.
    pub fn version() -> Result<String> {
        let out = std::process::Command::new(BINARY)
            .arg("version")
            .output()
            .with_context(|| format!("run {BINARY} (scripts/install-consul.sh installs it)"))?;
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        if !line.starts_with("Consul v") {
            bail!("{BINARY} version printed {line:?}");
        }
        Ok(line)
    }

    /// Starts `n` servers and waits until they agree on a leader.
    pub async fn start(n: usize) -> Result<ConsulCluster> {
        let dir = tempfile::Builder::new()
            .prefix("vigil-bench-consul-")
            .tempdir()?;
        let ports = free_tcp_ports(4 * n)?;
        let (http, rest) = ports.split_at(n);
        let (rpc, rest) = rest.split_at(n);
        let (lan, wan) = rest.split_at(n);
        let mut servers = Vec::new();
        for i in 0..n {
            let mut args = agent_args(dir.path(), &format!("c{i}"), http[i], lan[i]);
            args.extend(
                [
                    "-server",
                    "-bootstrap-expect",
                    &n.to_string(),
                    "-server-port",
                    &rpc[i].to_string(),
                    "-serf-wan-port",
                    &wan[i].to_string(),
                ]
                .map(str::to_owned),
            );
            for (_, port) in lan.iter().enumerate().filter(|(j, _)| *j != i) {
                args.extend(["-retry-join".to_owned(), format!("127.0.0.1:{port}")]);
            }
            let mut server = Server {
                args,
                child: None,
                http: format!("127.0.0.1:{}", http[i]),
                rpc: format!("127.0.0.1:{}", rpc[i]),
                log: dir.path().join(format!("c{i}.log")),
            };
            server.spawn()?;
            servers.push(server);
        }
        let cluster = ConsulCluster {
            servers,
            clients: Vec::new(),
            lan: lan.to_vec(),
            dir,
        };
        if let Err(e) = cluster.wait_for_leader().await {
            let logs = cluster.servers.iter().map(|s| s.log.as_path());
            return Err(with_log_tails(e, logs));
        }
        Ok(cluster)
    }

    /// Starts a client agent joined to every server and waits until a write through it
    /// succeeds; its HTTP address and process ID.
    pub async fn add_client(&mut self) -> Result<(String, u32)> {
        let [http, lan] = free_tcp_ports(2)?[..] else {
            bail!("two free ports");
        };
        let node = format!("cc{}", self.clients.len());
        let mut args = agent_args(self.dir.path(), &node, http, lan);
        for port in &self.lan {
            args.extend(["-retry-join".to_owned(), format!("127.0.0.1:{port}")]);
        }
        let mut client = Server {
            args,
            child: None,
            http: format!("127.0.0.1:{http}"),
            rpc: String::new(),
            log: self.dir.path().join(format!("{node}.log")),
        };
        client.spawn()?;
        let (http, log) = (client.http.clone(), client.log.clone());
        let pid = client.child.as_ref().and_then(Child::id);
        self.clients.push(client);
        let deadline = Instant::now() + START_TIMEOUT;
        let agent = Client::new(&http)?;
        loop {
            match agent.kv_put("bench/ready", b"1", 0).await {
                Ok(true) => break,
                Ok(false) => bail!("Consul's client agent refused a plain put"),
                Err(e) if Instant::now() >= deadline => {
                    let e = anyhow::Error::new(e).context("Consul's client agent took no write");
                    return Err(with_log_tails(e, std::iter::once(log.as_path())));
                }
                Err(_) => sleep(Duration::from_millis(200)).await,
            }
        }
        Ok((http, pid.context("the Consul client agent is not running")?))
    }

    /// `kill -9`s the client agent whose HTTP address is `http`, and waits for it to exit.
    pub async fn kill9_client(&mut self, http: &str) -> Result<()> {
        let agent = self
            .clients
            .iter_mut()
            .find(|c| c.http == http)
            .with_context(|| format!("no Consul client agent at {http}"))?;
        agent.kill9("the client agent").await
    }

    async fn wait_for_leader(&self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.leader().await {
                // A write proves the leader has established itself (its barrier committed).
                Ok((http, _)) => match Client::new(&http)?.kv_put("bench/ready", b"1", 0).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => bail!("Consul refused a plain put"),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(anyhow::Error::new(e).context("Consul's leader took no write"));
                    }
                    Err(_) => sleep(Duration::from_millis(200)).await,
                },
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context("Consul servers did not agree on a leader"));
                }
                Err(_) => sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The HTTP address and process ID of the server every running server names as leader.
    pub async fn leader(&self) -> Result<(String, u32)> {
        let mut named = Vec::new();
        for server in self.servers.iter().filter(|s| s.child.is_some()) {
            let url = format!("http://{}/v1/status/leader", server.http);
            let leader: String = reqwest::get(&url).await?.error_for_status()?.json().await?;
            named.push(leader);
        }
        named.dedup();
        let [leader] = named.as_slice() else {
            bail!("Consul servers name different leaders: {named:?}");
        };
        let server = self
            .servers
            .iter()
            .find(|s| &s.rpc == leader)
            .with_context(|| format!("no server has the leader's RPC address {leader:?}"))?;
        let pid = server
            .child
            .as_ref()
            .and_then(Child::id)
            .context("the Consul leader is not running")?;
        Ok((server.http.clone(), pid))
    }

    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter_map(|s| s.child.as_ref().and_then(Child::id))
            .collect()
    }

    /// HTTP addresses of the running servers.
    pub fn running_http(&self) -> Vec<String> {
        let running = self.servers.iter().filter(|s| s.child.is_some());
        running.map(|s| s.http.clone()).collect()
    }

    /// `kill -9`s the leader and waits for it to exit.
    pub async fn kill9_leader(&mut self) -> Result<()> {
        let (http, _) = self.leader().await?;
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.http == http)
            .context("the Consul leader is not a server")?;
        server.kill9("the Consul leader").await
    }

    /// Starts every killed server again from its data directory and waits until all servers
    /// agree on a leader that takes writes.
    pub async fn restart_killed(&mut self) -> Result<()> {
        for server in self.servers.iter_mut().filter(|s| s.child.is_none()) {
            server.spawn()?;
        }
        self.wait_for_leader().await
    }

    /// Kills every server and waits for them to exit; the data directories go with `self`.
    pub async fn stop(mut self) {
        let agents = self.servers.iter_mut().chain(&mut self.clients);
        for child in agents.filter_map(|s| s.child.as_mut()) {
            // Already gone is fine: this is cleanup.
            let _ = child.kill().await;
        }
    }
}

impl Server {
    /// `kill -9`s the process and waits for it to exit; `what` names it in the error.
    async fn kill9(&mut self, what: &str) -> Result<()> {
        let mut child = self
            .child
            .take()
            .with_context(|| format!("{what} is not running"))?;
        child.kill().await?;
        Ok(())
    }

    /// Starts the server process, its output appended to its log.
    fn spawn(&mut self) -> Result<()> {
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(BINARY)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {BINARY} (scripts/install-consul.sh)"))?;
        self.child = Some(child);
        Ok(())
    }
}
