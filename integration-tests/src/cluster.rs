//! Multi-process clusters on 127.0.0.1: a CA and certificates in a temporary directory, N
//! servers (`--server --bootstrap-expect N`, each with its own data directory and an RPC port
//! chosen up front, since every server's `--join` names them all and a restarted server must
//! come back at the same address) and client agents joined to them. HTTP ports are picked by
//! each agent (port 0) and read from its ready line. Agents are child processes killed when the
//! cluster is dropped; their logs go to files in the directory, the tail of each is printed
//! when a test fails, and `VIGIL_KEEP_CLUSTER_DIR=1` keeps the directory.
//!
//! ```ignore
//! let mut cluster = Cluster::servers(3).clients(1).start().await;
//! let leader = cluster.leader().await;
//! cluster.kill9(leader).await;
//! cluster.restart(leader).await;
//! ```

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tempfile::TempDir;
use vigil_wire::tls::{
    DEFAULT_DATACENTER, DEFAULT_DOMAIN, Role, TlsMaterial, create_ca, create_cert,
};
use vigil_wire::transport::{RpcClient, client_endpoint};

use crate::{Agent, Http, eventually, free_ports, log_tail};

/// How long a cluster may take to elect its first leader, or a new one.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an agent may take to register its node so that default sessions can be created.
const SESSION_TIMEOUT: Duration = Duration::from_secs(30);
/// Log lines shown per agent when a test fails.
const TAIL_LINES: usize = 40;

/// What to start: `Cluster::servers(3).clients(2).env(SHORT_SESSION_TTL)`.
#[derive(Debug, Clone)]
pub struct Spec {
    servers: usize,
    clients: usize,
    args: Vec<String>,
    server_args: Vec<String>,
    env: Vec<(String, String)>,
    server_env: Vec<(String, String)>,
    profile: Option<String>,
    server_nofile: Option<(u64, u64)>,
    binary: Option<PathBuf>,
}

impl Spec {
    /// The `vigil` binary every agent starts from (a previous release's, for an upgrade test;
    /// the one built for these tests unless set). [`Cluster::set_server_binary`] and
    /// [`Cluster::set_client_binary`] change it for one member's next start.
    pub fn binary(mut self, binary: &Path) -> Spec {
        self.binary = Some(binary.to_owned());
        self
    }

    /// The servers' open file limit (soft, hard), as `ulimit -Sn`/`-Hn` would set it.
    pub fn server_open_file_limit(mut self, soft: u64, hard: u64) -> Spec {
        self.server_nofile = Some((soft, hard));
        self
    }

    /// An extra flag for the servers only (e.g. `--encrypt KEY`; clients then get theirs
    /// through [`Cluster::add_client_with`]).
    pub fn server_arg(mut self, arg: &str) -> Spec {
        self.server_args.push(arg.to_owned());
        self
    }

    /// A variable of the config's environment layer for the servers only (a test knob such as
    /// [`crate::SHORT_SESSION_TTL`]).
    pub fn server_env(mut self, (name, value): (&str, &str)) -> Spec {
        self.server_env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// A variable of the config's environment layer for every agent (servers and clients).
    pub fn env(mut self, (name, value): (&str, &str)) -> Spec {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The timing profile (gossip and raft) of every agent (`local` unless set).
    pub fn gossip_profile(mut self, profile: &str) -> Spec {
        self.profile = Some(profile.to_owned());
        self
    }

    /// Client agents joined to every server.
    pub fn clients(mut self, n: usize) -> Spec {
        self.clients = n;
        self
    }

    /// An extra flag for every agent (servers and clients), e.g. `--enable-script-checks`.
    pub fn arg(mut self, arg: &str) -> Spec {
        self.args.push(arg.to_owned());
        self
    }

    /// Starts the servers and clients and waits until every server agrees on a leader.
    pub async fn start(self) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("vigil-cluster-")
            .tempdir()
            .expect("temporary directory");
        let (ca_cert, ca_key) = create_ca(dir.path(), DEFAULT_DOMAIN).expect("create the CA");
        let mut cluster = Cluster {
            dir,
            ca_cert,
            ca_key,
            args: self.args,
            env: self.env,
            profile: self.profile.unwrap_or_else(|| "local".to_owned()),
            binary: self.binary.unwrap_or_else(crate::binary),
            servers: Vec::new(),
            clients: Vec::new(),
        };
        let ports = free_udp_ports(2 * self.servers);
        let addrs: Vec<SocketAddr> = ports
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();
        let (rpc_addrs, serf_addrs) = addrs.split_at(self.servers);
        for (i, (rpc_addr, serf_addr)) in rpc_addrs.iter().zip(serf_addrs).enumerate() {
            let name = format!("s{i}");
            let expect = self.servers.to_string().into();
            let mut args = cluster.server_args(&name, expect, *rpc_addr, *serf_addr, serf_addrs);
            args.extend(self.server_args.iter().map(OsString::from));
            let mut env = cluster.env.clone();
            env.extend(self.server_env.iter().cloned());
            cluster.servers.push(Member {
                log: cluster.dir.path().join(format!("{name}.log")),
                name,
                rpc_addr: Some(*rpc_addr),
                serf_addr: Some(*serf_addr),
                args,
                env,
                nofile: self.server_nofile,
                binary: cluster.binary.clone(),
                agent: None,
            });
        }
        let started = futures::future::join_all(
            cluster
                .servers
                .iter()
                .map(|m| Agent::spawn_binary(&m.binary, m.nofile, m.env(), &m.args, Some(&m.log))),
        )
        .await;
        for (member, agent) in cluster.servers.iter_mut().zip(started) {
            member.agent = Some(agent);
        }
        let all: Vec<usize> = (0..self.servers).collect();
        for _ in 0..self.clients {
            cluster.add_client(&all).await;
        }
        cluster.leader().await;
        cluster
    }
}

/// One agent of the cluster: how to start it, and the process while it runs.
pub struct Member {
    pub name: String,
    /// A server's RPC address (kept across restarts); `None` for a client agent.
    pub rpc_addr: Option<SocketAddr>,
    /// A server's gossip address (kept across restarts); `None` for a client agent.
    pub serf_addr: Option<SocketAddr>,
    pub log: PathBuf,
    args: Vec<OsString>,
    /// Its variables of the config's environment layer (test knobs).
    env: Vec<(String, String)>,
    /// The open file limit it runs with, if not the harness's own.
    nofile: Option<(u64, u64)>,
    /// The `vigil` binary it (next) starts from.
    binary: PathBuf,
    agent: Option<Agent>,
}

impl Member {
    fn env(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn is_running(&self) -> bool {
        self.agent.is_some()
    }
}

/// Servers and client agents sharing a CA; see the module documentation.
pub struct Cluster {
    dir: TempDir,
    ca_cert: PathBuf,
    ca_key: PathBuf,
    args: Vec<String>,
    /// Every agent's variables of the config's environment layer ([`Spec::env`]).
    env: Vec<(String, String)>,
    profile: String,
    /// The binary members added later start from.
    binary: PathBuf,
    pub servers: Vec<Member>,
    pub clients: Vec<Member>,
}

/// Sends `signal` to a running agent's process.
fn signal(agent: &Agent, signal: nix::sys::signal::Signal) {
    let pid = agent.pid().expect("a running agent has a pid");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits in i32"));
    nix::sys::signal::kill(pid, signal).expect("signal the agent");
}

/// Member `i` of `members` (the `role`s: "server" or "client"); panics when it is not running.
fn running<'a>(members: &'a [Member], role: &str, i: usize) -> &'a Agent {
    members[i]
        .agent
        .as_ref()
        .unwrap_or_else(|| panic!("{role} {i} is not running"))
}

/// Takes member `i`'s process out of the running set; panics when it is not running.
fn take(members: &mut [Member], role: &str, i: usize) -> Agent {
    members[i]
        .agent
        .take()
        .unwrap_or_else(|| panic!("{role} {i} is not running"))
}

/// Starts member `i` again with the same flags; panics when it is still running.
async fn relaunch(members: &mut [Member], role: &str, i: usize) {
    let member = &mut members[i];
    assert!(member.agent.is_none(), "{role} {i} is still running");
    member.agent = Some(
        Agent::spawn_binary(
            &member.binary,
            member.nofile,
            member.env(),
            &member.args,
            Some(&member.log),
        )
        .await,
    );
}

fn strings(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Distinct UDP ports that were free a moment ago (see [`free_ports`]).
fn free_udp_ports(n: usize) -> Vec<u16> {
    free_ports(n, || UdpSocket::bind("127.0.0.1:0"), UdpSocket::local_addr)
}

impl Cluster {
    /// The variables every agent gets ([`Spec::env`]).
    fn env(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Describes a cluster of `n` servers (1, 3 or 5) with `--bootstrap-expect n`.
    pub fn servers(n: usize) -> Spec {
        Spec {
            servers: n,
            clients: 0,
            args: Vec::new(),
            server_args: Vec::new(),
            env: Vec::new(),
            server_env: Vec::new(),
            profile: None,
            server_nofile: None,
            binary: None,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cluster CA's certificate and private key files, to sign certificates of one's own.
    pub fn ca_files(&self) -> (&Path, &Path) {
        (&self.ca_cert, &self.ca_key)
    }

    /// TLS material with a fresh certificate for `role` and `node` from the cluster's CA, to
    /// dial the servers by hand.
    pub fn tls_material(&self, role: Role, node: &str) -> TlsMaterial {
        let (cert, key) = self.cert(role, node);
        TlsMaterial::load(&self.ca_cert, &cert, &key).expect("load the certificate")
    }

    /// A fresh certificate for `role` signed by the cluster's CA.
    fn cert(&self, role: Role, node: &str) -> (PathBuf, PathBuf) {
        create_cert(
            self.dir.path(),
            &self.ca_cert,
            &self.ca_key,
            role,
            DEFAULT_DATACENTER,
            DEFAULT_DOMAIN,
            Some(node),
        )
        .expect("create a certificate")
    }

    /// An RPC client presenting `cert` and `key` (signed by the cluster's CA, or forged by a
    /// test), dialing the servers as an agent does.
    pub fn rpc_client_with(&self, cert: &Path, key: &Path) -> RpcClient {
        let tls = TlsMaterial::load(&self.ca_cert, cert, key).expect("load the certificate");
        RpcClient::new(
            client_endpoint(&tls).expect("a QUIC endpoint"),
            tls.server_name(),
        )
    }

    /// An RPC client with a fresh certificate for `role` and `node` from the cluster's CA.
    pub fn rpc_client(&self, role: Role, node: &str) -> RpcClient {
        let (cert, key) = self.cert(role, node);
        self.rpc_client_with(&cert, &key)
    }

    /// A server's flags: bootstrapping with `expect` servers, its data directory and addresses,
    /// the gossip addresses it joins, and what every member is given.
    fn server_args(
        &self,
        name: &str,
        expect: OsString,
        rpc_addr: SocketAddr,
        serf_addr: SocketAddr,
        join: &[SocketAddr],
    ) -> Vec<OsString> {
        let (cert, key) = self.cert(Role::Server, name);
        let data_dir = self.dir.path().join(format!("{name}-data"));
        let mut args = strings(&["agent", "--server", "--bootstrap-expect"]);
        args.push(expect);
        args.extend([
            "--data-dir".into(),
            data_dir.into(),
            "--rpc-addr".into(),
            rpc_addr.to_string().into(),
            "--serf-addr".into(),
            serf_addr.to_string().into(),
        ]);
        for addr in join {
            args.extend(["--join".into(), addr.to_string().into()]);
        }
        args.extend(self.common_args(name, &self.ca_cert, &cert, &key));
        args
    }

    /// Flags every agent gets: node name, HTTP on a free port, TLS files, logging, extras.
    fn common_args(&self, node: &str, ca: &Path, cert: &Path, key: &Path) -> Vec<OsString> {
        let mut args = strings(&["--node", node, "--http-addr", "127.0.0.1:0"]);
        args.extend([
            "--ca-file".into(),
            ca.into(),
            "--cert-file".into(),
            cert.into(),
            "--key-file".into(),
            key.into(),
        ]);
        args.extend(strings(&[
            "--log-level",
            "info",
            "--timing-profile",
            &self.profile,
        ]));
        args.extend(self.args.iter().map(OsString::from));
        args
    }

    fn client_args(
        &self,
        node: &str,
        join: &[usize],
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Vec<OsString> {
        // No --rpc-addr: a client agent serves no RPC.
        let mut args = strings(&["agent", "--serf-addr", "127.0.0.1:0"]);
        for &i in join {
            args.extend(["--join".into(), self.server_serf(i).to_string().into()]);
        }
        args.extend(self.common_args(node, ca, cert, key));
        args
    }

    /// Starts a client agent joined to the servers `join` (in that order: the first is tried
    /// first); returns its index in `clients`.
    pub async fn add_client(&mut self, join: &[usize]) -> usize {
        self.add_client_with(join, &[]).await
    }

    /// [`Cluster::add_client`] with extra flags for this client only (e.g. `--encrypt KEY`).
    pub async fn add_client_with(&mut self, join: &[usize], extra: &[&str]) -> usize {
        let name = format!("c{}", self.clients.len());
        let (cert, key) = self.cert(Role::Client, &name);
        let mut args = self.client_args(&name, join, &self.ca_cert, &cert, &key);
        args.extend(strings(extra));
        let log = self.dir.path().join(format!("{name}.log"));
        let agent = Agent::spawn_binary(&self.binary, None, self.env(), &args, Some(&log)).await;
        self.clients.push(Member {
            name,
            rpc_addr: None,
            serf_addr: None,
            log,
            args,
            env: self.env.clone(),
            nofile: None,
            binary: self.binary.clone(),
            agent: Some(agent),
        });
        self.clients.len() - 1
    }

    /// A CA of its own in the directory `name` (under the cluster's) and a client certificate
    /// for `node` from it: the CA's certificate, the client's certificate and its key.
    pub fn foreign_identity(&self, name: &str, node: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).expect("create the foreign CA directory");
        let (ca_cert, ca_key) = create_ca(&dir, DEFAULT_DOMAIN).expect("create a foreign CA");
        let (cert, key) = create_cert(
            &dir,
            &ca_cert,
            &ca_key,
            Role::Client,
            DEFAULT_DATACENTER,
            DEFAULT_DOMAIN,
            Some(node),
        )
        .expect("create a foreign certificate");
        (ca_cert, cert, key)
    }

    /// Starts a client agent joined to every server whose certificate comes from another CA,
    /// with a CA file naming that other CA: it must not be able to talk to the servers.
    pub async fn foreign_client(&self) -> Agent {
        let (ca_cert, cert, key) = self.foreign_identity("foreign", "rogue");
        let all: Vec<usize> = (0..self.servers.len()).collect();
        let args = self.client_args("rogue", &all, &ca_cert, &cert, &key);
        let log = self.dir.path().join("rogue.log");
        Agent::spawn_binary(&crate::binary(), None, self.env(), &args, Some(&log)).await
    }

    /// Takes client agent `i`'s process out of the cluster (it is no longer running as far
    /// as the cluster is concerned), e.g. to wait for it to exit after `PUT /v1/agent/leave`.
    pub fn take_client(&mut self, i: usize) -> Agent {
        take(&mut self.clients, "client", i)
    }

    /// Server `i`; panics when it is not running.
    pub fn server(&self, i: usize) -> &Agent {
        running(&self.servers, "server", i)
    }

    /// Client agent `i`; panics when it is not running.
    pub fn client(&self, i: usize) -> &Agent {
        running(&self.clients, "client", i)
    }

    /// Server `i`'s RPC address (what `/v1/status/leader` reports).
    /// Server `i`'s gossip address.
    pub fn server_serf(&self, i: usize) -> SocketAddr {
        self.servers[i]
            .serf_addr
            .expect("servers have a gossip address")
    }

    pub fn server_rpc(&self, i: usize) -> SocketAddr {
        self.servers[i]
            .rpc_addr
            .expect("servers have an RPC address")
    }

    /// Indexes of the servers currently running.
    pub fn running_servers(&self) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].is_running())
            .collect()
    }

    /// The leading server: polls until every running server names the same leader and that
    /// leader is one of them (so a killed leader is never reported), within [`LEADER_TIMEOUT`].
    pub async fn leader(&self) -> usize {
        self.leader_within(LEADER_TIMEOUT).await
    }

    pub async fn leader_within(&self, limit: Duration) -> usize {
        eventually(limit, "all running servers to agree on a leader", || {
            self.agreed_leader()
        })
        .await
    }

    async fn agreed_leader(&self) -> Option<usize> {
        let running = self.running_servers();
        let mut named = BTreeSet::new();
        for &i in &running {
            let reply = self.server(i).try_get("/v1/status/leader").await?;
            if reply.status != StatusCode::OK {
                return None;
            }
            named.insert(reply.json().as_str()?.to_owned());
        }
        if named.len() != 1 {
            return None;
        }
        let leader = named.pop_first()?;
        running
            .into_iter()
            .find(|&i| self.server_rpc(i).to_string() == leader)
    }

    /// `kill -9` server `i` and wait until the process is gone.
    pub async fn kill9(&mut self, i: usize) {
        take(&mut self.servers, "server", i).kill9().await;
    }

    /// If server `i` has exited on its own, takes it out of the running set and returns its
    /// exit status; `None` while it runs.
    pub fn exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        let status = self.servers[i].agent.as_mut()?.try_exit()?;
        self.servers[i].agent = None;
        Some(status)
    }

    /// Freezes server `i` (SIGSTOP) until [`Cluster::resume`]: it neither answers nor times out.
    pub fn pause(&self, i: usize) {
        self.signal(i, nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a server frozen by [`Cluster::pause`] run again (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, nix::sys::signal::Signal::SIGCONT);
    }

    /// Freezes client agent `i` (SIGSTOP) until [`Cluster::resume_client`].
    pub fn pause_client(&self, i: usize) {
        signal(self.client(i), nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a client agent frozen by [`Cluster::pause_client`] run again (SIGCONT).
    pub fn resume_client(&self, i: usize) {
        signal(self.client(i), nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, i: usize, signal_: nix::sys::signal::Signal) {
        signal(self.server(i), signal_);
    }

    /// `kill -9` client agent `i` and wait until the process is gone.
    pub async fn kill9_client(&mut self, i: usize) {
        take(&mut self.clients, "client", i).kill9().await;
    }

    /// SIGTERM server `i` and wait for its graceful exit (code 0).
    pub async fn terminate(&mut self, i: usize) {
        let agent = take(&mut self.servers, "server", i);
        assert_eq!(agent.terminate().await, Some(0), "server {i} exit code");
    }

    /// SIGTERM client agent `i` and wait for its graceful exit (code 0).
    pub async fn terminate_client(&mut self, i: usize) {
        let agent = take(&mut self.clients, "client", i);
        assert_eq!(agent.terminate().await, Some(0), "client {i} exit code");
    }

    /// Server `i` starts from `binary` from its next start on ([`Cluster::restart`]), as an
    /// operator upgrading it in place does.
    pub fn set_server_binary(&mut self, i: usize, binary: &Path) {
        self.servers[i].binary = binary.to_owned();
    }

    /// Client agent `i` starts from `binary` from its next start on.
    pub fn set_client_binary(&mut self, i: usize, binary: &Path) {
        self.clients[i].binary = binary.to_owned();
    }

    /// Starts server `i` again with its data directory and RPC port; returns once its HTTP API
    /// is up (it may not have caught up with the cluster yet).
    pub async fn restart(&mut self, i: usize) {
        relaunch(&mut self.servers, "server", i).await;
    }

    /// Starts client agent `i` again with the same flags (after [`Cluster::kill9_client`]); its
    /// HTTP and gossip ports are new, read them from [`Cluster::client`].
    pub async fn restart_client(&mut self, i: usize) {
        relaunch(&mut self.clients, "client", i).await;
    }

    /// Starts one more server (`s<n>`, a fresh data directory and ports) joined to the others'
    /// gossip addresses: it finds the running cluster and joins it (a learner, then a voter),
    /// as a replacement for a removed server does. Returns its index. Flags given with
    /// [`Spec::server_arg`] are not repeated for it.
    pub async fn add_server(&mut self) -> usize {
        let i = self.servers.len();
        let name = format!("s{i}");
        let ports = free_udp_ports(2);
        let rpc_addr = SocketAddr::from(([127, 0, 0, 1], ports[0]));
        let serf_addr = SocketAddr::from(([127, 0, 0, 1], ports[1]));
        let expect = self.servers[0]
            .args
            .iter()
            .skip_while(|a| *a != "--bootstrap-expect")
            .nth(1)
            .cloned()
            .unwrap_or_else(|| "3".into());
        let join: Vec<SocketAddr> = (0..i).map(|j| self.server_serf(j)).collect();
        let args = self.server_args(&name, expect, rpc_addr, serf_addr, &join);
        let log = self.dir.path().join(format!("{name}.log"));
        let agent = Agent::spawn_binary(&self.binary, None, self.env(), &args, Some(&log)).await;
        self.servers.push(Member {
            log,
            name,
            rpc_addr: Some(rpc_addr),
            serf_addr: Some(serf_addr),
            args,
            env: self.env.clone(),
            nofile: None,
            binary: self.binary.clone(),
            agent: Some(agent),
        });
        i
    }

    /// The raft configuration as server `i` reports it (Consul's shape).
    pub async fn raft_configuration(&self, i: usize) -> Value {
        let reply = self.server(i).get("/v1/operator/raft/configuration").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply.json()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for member in self.servers.iter().chain(&self.clients) {
                eprintln!("{}", log_tail(&member.log, TAIL_LINES));
            }
        }
        // `VIGIL_KEEP_CLUSTER_DIR=1` keeps certificates, data directories and full logs.
        if std::env::var_os("VIGIL_KEEP_CLUSTER_DIR").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("cluster directory kept: {}", self.dir.path().display());
        }
    }
}

/// The raft server IDs of a `/v1/operator/raft/configuration` answer.
pub fn raft_ids(configuration: &Value) -> BTreeSet<String> {
    configuration["Servers"]
        .as_array()
        .expect("Servers array")
        .iter()
        .map(|s| s["ID"].as_str().expect("server ID").to_owned())
        .collect()
}

/// The node names of the voters in a `/v1/operator/raft/configuration` answer.
pub fn raft_voters(configuration: &Value) -> BTreeSet<String> {
    configuration["Servers"]
        .as_array()
        .expect("Servers array")
        .iter()
        .filter(|s| s["Voter"] == true)
        .map(|s| s["Node"].as_str().expect("server Node").to_owned())
        .collect()
}

/// Creates a session through `agent`, retrying until the agent's node is registered (it does
/// that shortly after start, once a leader exists). Returns the session ID.
pub async fn create_session(agent: &Http, body: &str) -> String {
    eventually(SESSION_TIMEOUT, "a session to be created", || async {
        let reply = agent.put("/v1/session/create", body).await;
        (reply.status == StatusCode::OK)
            .then(|| reply.json()["ID"].as_str().expect("session ID").to_owned())
    })
    .await
}

/// The keys under `prefix` (`?keys`, plus `query` such as `&stale` or `&consistent`).
pub async fn keys(agent: &Http, prefix: &str, query: &str) -> Vec<String> {
    let reply = agent.get(&format!("/v1/kv/{prefix}?keys{query}")).await;
    match reply.status {
        StatusCode::NOT_FOUND => Vec::new(),
        StatusCode::OK => serde_json::from_value(reply.json()).expect("a list of keys"),
        other => panic!("listing keys under {prefix}: {other} {}", reply.text()),
    }
}

/// A raw value (`?raw`, plus `query`), `None` when the key does not exist.
pub async fn raw(agent: &Http, key: &str, query: &str) -> Option<String> {
    let reply = agent.get(&format!("/v1/kv/{key}?raw{query}")).await;
    match reply.status {
        StatusCode::NOT_FOUND => None,
        StatusCode::OK => Some(reply.text()),
        other => panic!("reading {key}: {other} {}", reply.text()),
    }
}
