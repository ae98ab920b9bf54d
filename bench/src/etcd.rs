//! A 3-member etcd cluster on 127.0.0.1, the system Vigil is compared with: Debian's `etcd`
//! (installed by `scripts/install-etcd.sh`), default settings (fsync on every commit), each
//! member with its own client and peer ports and a data directory in a temporary directory.
//! Members are child processes killed when the cluster is dropped (also when the harness panics
//! or is interrupted); their logs go to files in the directory and are shown when start fails.
//! A member killed with [`EtcdCluster::kill9_leader`] restarts from its data directory.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{Client, ConnectOptions};
use tempfile::TempDir;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

use integration_tests::log_tail;

/// How long the members may take to elect a leader.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One `etcd` member.
struct Member {
    /// `None` while killed.
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    client_url: String,
    log: PathBuf,
    /// Its command line, to start it again.
    args: Vec<String>,
}

impl Member {
    /// Starts the process, appending to its log.
    fn spawn(&mut self) -> Result<()> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new("etcd")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("spawn etcd (run scripts/install-etcd.sh first)")?;
        self.child = Some(child);
        Ok(())
    }
}

/// Three members forming one cluster; see the module documentation.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: TempDir,
}

/// Distinct TCP ports that were free a moment ago.
pub fn free_tcp_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()?)
}

/// `error` followed by the last lines of each of `logs`: why a cluster did not start.
pub fn with_log_tails<'a>(
    error: anyhow::Error,
    logs: impl Iterator<Item = &'a std::path::Path>,
) -> anyhow::Error {
    let tails: Vec<String> = logs.map(|log| log_tail(log, 20)).collect();
    anyhow::anyhow!("{error:#}\n{}", tails.join("\n"))
}

/// A client of one endpoint (or several, balanced), with short connect timeouts.
pub async fn connect(endpoints: &[String]) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(60));
    Client::connect(endpoints, Some(options))
        .await
        .with_context(|| format!("connect to etcd at {endpoints:?}"))
}

/// `n` clients of `endpoint`, each over its own connection.
pub async fn connect_each(endpoint: &str, n: usize) -> Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(connect(&[endpoint.to_owned()]).await?);
    }
    Ok(clients)
}

impl EtcdCluster {
    /// Starts `n` members and waits until they agree on a leader.
    pub async fn start(n: usize) -> Result<EtcdCluster> {
        let dir = tempfile::Builder::new()
            .prefix("vigil-bench-etcd-")
            .tempdir()?;
        let ports = free_tcp_ports(2 * n)?;
        let (client_ports, peer_ports) = ports.split_at(n);
        let initial_cluster = peer_ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("e{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in client_ports.iter().zip(peer_ports).enumerate() {
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let data_dir = dir.path().join(format!("e{i}-data"));
            let args = [
                ["--name", &format!("e{i}")],
                ["--data-dir", &data_dir.to_string_lossy()],
                ["--listen-client-urls", &client_url],
                ["--advertise-client-urls", &client_url],
                ["--listen-peer-urls", &peer_url],
                ["--initial-advertise-peer-urls", &peer_url],
                ["--initial-cluster", &initial_cluster],
                ["--initial-cluster-token", "vigil-bench"],
                ["--initial-cluster-state", "new"],
                ["--logger", "zap"],
                ["--log-level", "warn"],
            ]
            .concat()
            .into_iter()
            .map(str::to_owned)
            .collect();
            let mut member = Member {
                child: None,
                client_url,
                log: dir.path().join(format!("e{i}.log")),
                args,
            };
            member.spawn()?;
            members.push(member);
        }
        let cluster = EtcdCluster { members, dir };
        if let Err(e) = cluster.wait_for_leader().await {
            let logs = cluster.members.iter().map(|m| m.log.as_path());
            return Err(with_log_tails(e, logs));
        }
        Ok(cluster)
    }

    async fn wait_for_leader(&self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.leader_endpoint().await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context("etcd members did not agree on a leader"));
                }
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref()?.id())
            .collect()
    }

    /// The client URL and process ID of the member every member names as leader.
    pub async fn leader(&self) -> Result<(String, u32)> {
        let endpoint = self.leader_endpoint().await?;
        let pid = self
            .members
            .iter()
            .find(|m| m.client_url == endpoint)
            .and_then(|m| m.child.as_ref()?.id())
            .context("the etcd leader is not running")?;
        Ok((endpoint, pid))
    }

    /// The client URL of the member every running member names as leader.
    pub async fn leader_endpoint(&self) -> Result<String> {
        let mut leaders = Vec::new();
        let mut leader_url = None;
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let mut client = connect(std::slice::from_ref(&member.client_url)).await?;
            let status = client.status().await?;
            let me = status.header().map(|h| h.member_id()).unwrap_or_default();
            if status.leader() == 0 {
                bail!("{} knows no leader", member.client_url);
            }
            if status.leader() == me {
                leader_url = Some(member.client_url.clone());
            }
            leaders.push(status.leader());
        }
        leaders.dedup();
        if leaders.len() != 1 {
            bail!("etcd members name different leaders: {leaders:?}");
        }
        leader_url.context("no etcd member says it leads")
    }

    /// `kill -9`s the leader and waits for it to exit.
    pub async fn kill9_leader(&mut self) -> Result<()> {
        let endpoint = self.leader_endpoint().await?;
        let member = self
            .members
            .iter_mut()
            .find(|m| m.client_url == endpoint)
            .context("the etcd leader is not a member")?;
        let mut child = member
            .child
            .take()
            .context("the etcd leader is not running")?;
        child.kill().await?;
        Ok(())
    }

    /// Starts every killed member again from its data directory and waits until all members
    /// agree on a leader.
    pub async fn restart_killed(&mut self) -> Result<()> {
        for member in self.members.iter_mut().filter(|m| m.child.is_none()) {
            member.spawn()?;
        }
        self.wait_for_leader().await
    }

    /// Kills every member and waits for them to exit, then removes the data directories.
    pub async fn stop(mut self) {
        for child in self.members.iter_mut().filter_map(|m| m.child.as_mut()) {
            // Already gone is fine: this is cleanup.
            let _ = child.kill().await;
        }
        drop(self.dir);
    }
}
