//! A 3-server Consul 1.8.7 cluster on 127.0.0.1, the benchmark's third column where Consul
//! speaks the same HTTP API as Vigil: Debian bullseye's `consul` (installed by
//! `scripts/install-consul.sh` to `/usr/local/bin/consul`), default settings (its raft log
//! fsyncs every commit), each server with its own HTTP, RPC and gossip ports (DNS and gRPC off)
//! and a data directory in a temporary directory. Servers are child processes killed when the
//! cluster is dropped; their logs go to files in the directory and are shown when start fails.
//! Vigil's client library talks to it unchanged, so every Consul figure is measured by the same
//! client code as Vigil's.

use std::path::PathBuf;
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

/// One `consul agent -server`.
struct Server {
    child: Child,
    /// `127.0.0.1:PORT` of its HTTP API.
    http: String,
    /// `127.0.0.1:PORT` of its server RPC, which `/v1/status/leader` names.
    rpc: String,
    log: PathBuf,
}

/// Three servers forming one cluster; see the module documentation.
pub struct ConsulCluster {
    servers: Vec<Server>,
    _dir: TempDir,
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
            let data_dir = dir.path().join(format!("c{i}-data"));
            let mut args: Vec<String> = [
                "agent",
                "-server",
                "-bootstrap-expect",
                &n.to_string(),
                "-node",
                &format!("c{i}"),
                "-data-dir",
                &data_dir.to_string_lossy(),
                "-bind",
                "127.0.0.1",
                "-client",
                "127.0.0.1",
                "-http-port",
                &http[i].to_string(),
                "-server-port",
                &rpc[i].to_string(),
                "-serf-lan-port",
                &lan[i].to_string(),
                "-serf-wan-port",
                &wan[i].to_string(),
                "-dns-port",
                "-1",
                "-grpc-port",
                "-1",
                "-log-level",
                "warn",
            ]
            .into_iter()
            .map(str::to_owned)
            .collect();
            for (_, port) in lan.iter().enumerate().filter(|(j, _)| *j != i) {
                args.extend(["-retry-join".to_owned(), format!("127.0.0.1:{port}")]);
            }
            let log = dir.path().join(format!("c{i}.log"));
            let output = std::fs::File::create(&log)?;
            let child = Command::new(BINARY)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(output.try_clone()?)
                .stderr(output)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("spawn {BINARY} (scripts/install-consul.sh)"))?;
            servers.push(Server {
                child,
                http: format!("127.0.0.1:{}", http[i]),
                rpc: format!("127.0.0.1:{}", rpc[i]),
                log,
            });
        }
        let cluster = ConsulCluster { servers, _dir: dir };
        if let Err(e) = cluster.wait_for_leader().await {
            let logs = cluster.servers.iter().map(|s| s.log.as_path());
            return Err(with_log_tails(e, logs));
        }
        Ok(cluster)
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

    /// The HTTP address and process ID of the server every server names as leader.
    pub async fn leader(&self) -> Result<(String, u32)> {
        let mut named = Vec::new();
        for server in &self.servers {
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
            .id()
            .context("the Consul leader is not running")?;
        Ok((server.http.clone(), pid))
    }

    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().filter_map(|s| s.child.id()).collect()
    }

    /// Kills every server and waits for them to exit; the data directories go with `self`.
    pub async fn stop(mut self) {
        for server in &mut self.servers {
            // Already gone is fine: this is cleanup.
            let _ = server.child.kill().await;
        }
    }
}
