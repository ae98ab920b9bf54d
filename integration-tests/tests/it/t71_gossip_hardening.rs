//! Hardening of gossip and of the agent process, end to end with real processes: a member that
//! takes a live node's name (it has the gossip key, not the cluster's CA) is refused and its
//! departure never touches the real node; the gossip key can live in the config file instead of
//! the command line; a client agent neither serves nor advertises RPC and dials from its own IP;
//! script checks can be allowed from the config file only; one timing profile sets gossip and
//! raft timing; log files carry no colour codes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Agent, Http, eventually, keygen, log_tail};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep};

use crate::common::{config_file, refused_config};

/// Gossip news (a join, a leave, a crash) must reach every member within this.
const CONVERGE_LIMIT: Duration = Duration::from_secs(20);
/// How long the real node is watched after an impostor left or died: many gossip rounds, and
/// every member change the leader sees is a reconcile pass.
const WATCH: Duration = Duration::from_secs(4);

/// `(Addr, Port, Status)` of every member named `name` in `agent`'s member list.
async fn named(agent: &Http, name: &str) -> Vec<(String, u64, u64)> {
    agent
        .members()
        .await
        .iter()
        .filter(|m| m["Name"] == name)
        .map(|m| {
            (
                m["Addr"].as_str().unwrap_or_default().to_owned(),
                m["Port"].as_u64().unwrap_or_default(),
                m["Status"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

/// `/v1/agent/self`'s `Member` of `agent`, once the agent found a server (it asks one).
async fn own_member(agent: &Http) -> Value {
    eventually(CONVERGE_LIMIT, "/v1/agent/self to answer", || async {
        let reply = agent.get("/v1/agent/self").await;
        (reply.status == StatusCode::OK).then(|| reply.json()["Member"].clone())
    })
    .await
}

fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until a line of the log at `path` contains every one of `needles`.
async fn wait_log_line(path: &Path, needles: &[&str]) {
    let what = format!("a line with {needles:?} in {}", path.display());
    eventually(CONVERGE_LIMIT, &what, || async {
        log_text(path)
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
            .then_some(())
    })
    .await;
}

/// A client agent named `node`, joined to every server with the gossip `key`, whose certificate
/// comes from a CA of its own (it has the gossip key, not the cluster's CA).
async fn impostor(cluster: &Cluster, node: &str, key: &str, tag: &str) -> (Agent, PathBuf) {
    let (ca, cert, cert_key) = cluster.foreign_identity(&format!("impostor-{tag}"), node);
    let mut args: Vec<OsString> = ["agent", "--node", node, "--http-addr", "127.0.0.1:0"]
        .iter()
        .map(OsString::from)
        .collect();
    args.extend(["--serf-addr", "127.0.0.1:0", "--timing-profile", "local"].map(OsString::from));
    args.extend(["--encrypt", key, "--log-level", "info"].map(OsString::from));
    for i in 0..cluster.servers.len() {
        args.extend(["--join".into(), cluster.server_serf(i).to_string().into()]);
    }
    for (flag, path) in [
        ("--ca-file", ca),
        ("--cert-file", cert),
        ("--key-file", cert_key),
    ] {
        args.extend([OsString::from(flag), path.into()]);
    }
    let log = cluster.dir().join(format!("impostor-{tag}.log"));
    (Agent::spawn(&args, Some(&log)).await, log)
}

/// The node whose name an impostor takes: where it is, and the session holding `t71/lock`.
struct RealNode {
    name: String,
    /// `(Addr, Port, Status)` in a member list.
    at: (String, u64, u64),
    session: String,
}

impl RealNode {
    /// Its session holds the lock, its serfHealth passes, and every server lists its name once,
    /// alive at its own address.
    async fn intact(&self, servers: &[Http]) -> Result<(), String> {
        let leader_side = &servers[0];
        if !leader_side.session_exists(&self.session).await {
            return Err("the real node's session is gone".to_owned());
        }
        if leader_side.holder("t71/lock").await.as_deref() != Some(&*self.session) {
            return Err("the real node's lock was released".to_owned());
        }
        let health = leader_side.serf_health(&self.name).await;
        if health.as_deref() != Some("passing") {
            return Err(format!("the real node's serfHealth is {health:?}"));
        }
        for (i, server) in servers.iter().enumerate() {
            let listed = named(server, &self.name).await;
            if listed != [self.at.clone()] {
                return Err(format!("server {i} lists {} as {listed:?}", self.name));
            }
        }
        Ok(())
    }
}

/// Asserts `check` holds at every poll for `WATCH`.
async fn holds_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let end = Instant::now() + WATCH;
    let mut polls = 0;
    while Instant::now() < end {
        if let Err(e) = check().await {
            panic!("{what}, after {polls} good polls: {e}");
        }
        polls += 1;
        sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_impostor_with_the_gossip_key_cannot_take_a_live_nodes_name() {
    let key = keygen();
    let mut cluster = Cluster::servers(3)
        .server_arg("--encrypt")
        .server_arg(&key)
        .start()
        .await;
    let all = [0, 1, 2];
    let real = cluster.add_client_with(&all, &["--encrypt", &key]).await;
    let name = cluster.clients[real].name.clone();
    let real_http = cluster.client(real).http();
    let server = cluster.server(0).http();
    let me = own_member(&real_http).await;
    let real_at = (
        me["Addr"].as_str().expect("Addr").to_owned(),
        me["Port"].as_u64().expect("Port"),
        1,
    );

    // Phase 1: the real node holds a lock through a session.
    let session = create_session(&real_http, r#"{"Name":"real","LockDelay":"0s"}"#).await;
    let reply = real_http
        .put(&format!("/v1/kv/t71/lock?acquire={session}"), "held")
        .await;
    assert_eq!(reply.text(), "true", "acquire");
    for i in all {
        let s = cluster.server(i).http();
        eventually(
            CONVERGE_LIMIT,
            "every server lists the real node",
            || async { (named(&s, &name).await == [real_at.clone()]).then_some(()) },
        )
        .await;
    }

    let servers: Vec<Http> = all.iter().map(|&i| cluster.server(i).http()).collect();
    let real_node = RealNode {
        name: name.clone(),
        at: real_at.clone(),
        session,
    };
    let intact = || real_node.intact(&servers);

    for (round, crash) in [("leave", false), ("crash", true)] {
        // Phase 2: an impostor with the gossip key joins under the real node's name. It is
        // refused: every member, the impostor included, lists the name once, at the real node,
        // and each side logs the conflict.
        let (fake, fake_log) = impostor(&cluster, &name, &key, round).await;
        // Its own /v1/agent/self needs a server, which its certificate cannot reach.
        let fake_port = log_text(&fake_log)
            .lines()
            .find_map(|l| l.split_once("gossip started gossip_addr=127.0.0.1:"))
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<u16>().ok())
            .expect("the impostor logs its gossip address");
        eventually(CONVERGE_LIMIT, "the impostor to join", || async {
            let mut servers_alive = true;
            for i in all {
                servers_alive &=
                    named(&fake, &format!("s{i}")).await.first().map(|m| m.2) == Some(1);
            }
            (servers_alive && named(&fake, &name).await == [real_at.clone()]).then_some(())
        })
        .await;
        wait_log_line(
            &fake_log,
            &["node name conflict", "this node is not admitted"],
        )
        .await;
        let other = format!("other=127.0.0.1:{fake_port}");
        let real_log = &cluster.clients[real].log;
        wait_log_line(
            real_log,
            &["node name conflict", "another member claims", &other],
        )
        .await;
        let refused = format!("refused=127.0.0.1:{fake_port}");
        for member in &cluster.servers {
            wait_log_line(&member.log, &["node name conflict", &refused]).await;
        }
        if let Err(e) = intact().await {
            panic!("after the impostor joined: {e}");
        }

        // Phase 3: it leaves gracefully (or is killed); once every server has seen it go, the
        // real node keeps its session, its lock and its passing serfHealth.
        if crash {
            fake.kill9().await;
        } else {
            assert_eq!(fake.terminate().await, Some(0), "impostor exit code");
        }
        let gone = format!("addr=127.0.0.1:{fake_port}");
        for member in &cluster.servers {
            wait_log_line(&member.log, &["gossip: member down", &gone]).await;
        }
        holds_for(&format!("after the impostor's {round}"), intact).await;

        // Two more reconcile passes on the leader: a member joins, then leaves.
        let extra = cluster.add_client_with(&all, &["--encrypt", &key]).await;
        let extra_name = cluster.clients[extra].name.clone();
        eventually(CONVERGE_LIMIT, "the extra client registered", || async {
            (server.serf_health(&extra_name).await.as_deref() == Some("passing")).then_some(())
        })
        .await;
        cluster.terminate_client(extra).await;
        eventually(CONVERGE_LIMIT, "the extra client deregistered", || async {
            server
                .serf_health(&extra_name)
                .await
                .is_none()
                .then_some(())
        })
        .await;
        if let Err(e) = intact().await {
            panic!("after more reconcile passes ({round}): {e}");
        }
    }
}

#[tokio::test]
async fn a_client_restarted_at_a_new_address_still_loses_its_old_sessions() {
    let mut cluster = Cluster::servers(1).clients(1).start().await;
    let server = cluster.server(0).http();
    let client = cluster.client(0).http();
    let session = create_session(&client, r#"{"Name":"old","LockDelay":"0s"}"#).await;
    client.acquire_ok("t71/restart", &session).await;

    // kill -9, then the same node name again at once on a new gossip port, before the crash
    // is detected: the new process may not take the name until the old one was seen failed.
    cluster.kill9_client(0).await;
    cluster.restart_client(0).await;
    eventually(
        CONVERGE_LIMIT,
        "the old process's lock to be released",
        || async { server.holder("t71/restart").await.is_none().then_some(()) },
    )
    .await;
    assert!(
        !server.session_exists(&session).await,
        "old session invalidated"
    );

    // Then the restarted node is admitted and works.
    let client = cluster.client(0).http();
    let fresh = create_session(&client, r#"{"Name":"new","LockDelay":"0s"}"#).await;
    client.acquire_ok("t71/restart", &fresh).await;
    let port = own_member(&client).await["Port"].as_u64().expect("Port");
    // Polled by hand so that a timeout says what the server listed and what both logged.
    let deadline = Instant::now() + CONVERGE_LIMIT;
    loop {
        let listed = named(&server, "c0").await;
        if listed.len() == 1 && listed[0].1 == port && listed[0].2 == 1 {
            break;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out waiting for the server to list the new process (port {port}) alone \
                 and alive; it lists c0 as {listed:?}, all members: {}\n--- server log\n{}\n\
                 --- client log\n{}",
                Value::from(server.members().await),
                log_tail(&cluster.servers[0].log, 60),
                log_tail(&cluster.clients[0].log, 60),
            );
        }
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_gossip_key_can_come_from_the_config_file() {
    let key = keygen();
    let (_secrets, config) = config_file(&format!("encrypt = \"{key}\"\n"));
    let mut cluster = Cluster::servers(1)
        .server_arg("--config")
        .server_arg(&config)
        .start()
        .await;
    let client = cluster.add_client_with(&[0], &["--config", &config]).await;
    let (name, http) = (
        cluster.clients[client].name.clone(),
        cluster.client(client).http(),
    );

    // The client joins the encrypted cluster and works through it.
    let server = cluster.server(0).http();
    eventually(CONVERGE_LIMIT, "the client to join", || async {
        (named(&server, &name).await.first().map(|m| m.2) == Some(1)).then_some(())
    })
    .await;
    create_session(&http, r#"{"LockDelay":"0s"}"#).await;
    for member in cluster.servers.iter().chain(&cluster.clients) {
        wait_log_line(&member.log, &["gossip started", "encrypted=true"]).await;
    }

    // The key is neither on a command line (readable by every local user) nor in a log.
    let agents = [cluster.server(0), cluster.client(client)];
    for agent in agents {
        let pid = agent.pid().expect("running");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(cmdline.contains("--config"), "{cmdline}");
        assert!(!cmdline.contains(&key), "the key is on the command line");
    }
    for member in cluster.servers.iter().chain(&cluster.clients) {
        assert!(
            !log_text(&member.log).contains(&key),
            "the key is in {}",
            member.log.display()
        );
    }
}

/// The local addresses of the UDP sockets process `pid` has open, as `(hex IP, port)` from
/// `/proc/net/udp` and `/proc/net/udp6`.
fn udp_sockets(pid: u32) -> Vec<(String, u16)> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list the agent's file descriptors")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?.to_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut found = Vec::new();
    for table in ["udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 9 && inodes.iter().any(|i| i == fields[9]) {
                let (ip, port) = fields[1].split_once(':').expect("address:port");
                let port = u16::from_str_radix(port, 16).expect("hex port");
                found.push((ip.to_owned(), port));
            }
        }
    }
    found
}

#[tokio::test]
async fn a_client_agent_neither_serves_nor_advertises_rpc_and_dials_from_its_own_ip() {
    // The harness starts client agents without --rpc-addr: the default is 127.0.0.1:8300.
    let cluster = Cluster::servers(1).clients(1).start().await;
    let (server, client) = (cluster.server(0).http(), cluster.client(0).http());
    create_session(&client, r#"{"LockDelay":"0s"}"#).await;

    // No RPC port in its gossip identity (Consul's `port` tag), as the servers see it and as it
    // describes itself; a server advertises its own.
    let tags = |list: Vec<Value>, name: &str| {
        list.into_iter()
            .find(|m| m["Name"] == name)
            .map(|m| m["Tags"].clone())
            .unwrap_or_else(|| panic!("{name} is not a member"))
    };
    assert_eq!(tags(server.members().await, "c0")["port"], "0");
    assert_eq!(own_member(&client).await["Tags"]["port"], "0");
    let server_port = cluster.server_rpc(0).port().to_string();
    assert_eq!(
        tags(client.members().await, "s0")["port"],
        server_port.as_str()
    );

    // Its sockets, the gossip one and the one it dials servers from, are bound to its own IP
    // (127.0.0.1 is 0100007F in /proc), not to every interface.
    let sockets = udp_sockets(cluster.client(0).pid().expect("running"));
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    for (ip, port) in &sockets {
        assert_eq!(
            ip, "0100007F",
            "UDP socket on port {port} is not bound to 127.0.0.1"
        );
        assert_ne!(*port, 8300, "a client agent listens on the RPC port");
    }
}

/// A config file declaring one script check (`local-script`).
fn script_config(dir: &Path, file: &str, extra: &str) -> String {
    let path = dir.join(file);
    let text = format!(
        "{extra}\n[[check]]\nid = \"local-script\"\nname = \"local script\"\n\
         args = [\"/bin/sh\", \"-c\", \"exit 0\"]\ninterval = \"1s\"\n"
    );
    std::fs::write(&path, text).expect("write the config file");
    path.to_str().expect("UTF-8 path").to_owned()
}

async fn wait_passing(agent: &Http, id: &str) {
    eventually(CONVERGE_LIMIT, &format!("{id} passing"), || async {
        let checks = agent.get("/v1/agent/checks").await.json();
        (checks[id]["Status"] == "passing").then_some(())
    })
    .await;
}

/// Registers a script check and a service with one over HTTP; returns both statuses and bodies.
async fn register_scripts(agent: &Http) -> Vec<(StatusCode, String)> {
    let check = json!({"Name": "remote", "Args": ["/bin/true"], "Interval": "10s"});
    let service = json!({"Name": "web", "Port": 80, "Check": check.clone()});
    let mut out = Vec::new();
    for (path, body) in [
        ("/v1/agent/check/register", check),
        ("/v1/agent/service/register", service),
    ] {
        let reply = agent.put(path, body.to_string()).await;
        out.push((reply.status, reply.text()));
    }
    out
}

#[tokio::test]
async fn local_script_checks_run_from_the_config_file_only() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let remote_refused = "Scripts are disabled on this agent from remote calls; to enable, \
                          configure 'enable_script_checks' to true";
    let local_refused = "Scripts are disabled on this agent; to enable, configure \
                         'enable_script_checks' or 'enable_local_script_checks' to true";
    let plain = script_config(dir.path(), "plain.toml", "");
    let keyed = script_config(
        dir.path(),
        "keyed.toml",
        "enable_local_script_checks = true",
    );

    // The flag, or the config key: the config file's script runs, HTTP may not add one.
    for extra in [
        vec!["--enable-local-script-checks", "--config", plain.as_str()],
        vec!["--config", keyed.as_str()],
    ] {
        let agent = Agent::dev_with(&extra).await;
        wait_passing(&agent, "local-script").await;
        for (status, body) in register_scripts(&agent).await {
            assert_eq!(
                status,
                StatusCode::INTERNAL_SERVER_ERROR,
                "{extra:?}: {body}"
            );
            assert!(body.contains(remote_refused), "{extra:?}: {body}");
        }
        assert!(
            agent
                .get("/v1/agent/checks")
                .await
                .json()
                .get("remote")
                .is_none()
        );
    }

    // --enable-script-checks allows both.
    let agent = Agent::dev_with(&["--enable-script-checks", "--config", &plain]).await;
    wait_passing(&agent, "local-script").await;
    for (status, body) in register_scripts(&agent).await {
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    // Neither: the config file's script check keeps the agent from starting, with Consul's text.
    let stderr = refused_config(&plain);
    assert!(stderr.contains(local_refused), "{stderr}");
}

#[tokio::test]
async fn the_timing_profile_sets_the_raft_timing() {
    for (profile, heartbeat, election) in [("lan", 150, "1000-2000"), ("local", 100, "500-1000")] {
        let cluster = Cluster::servers(1).gossip_profile(profile).start().await;
        let log = &cluster.servers[0].log;
        let heartbeat = format!("heartbeat_ms={heartbeat}");
        let election = format!("election_timeout_ms={election}");
        wait_log_line(log, &["raft timing", &heartbeat, &election]).await;
    }
}

#[tokio::test]
async fn a_log_file_gets_no_colour_codes() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = dir.path().join("agent.log");
    // Agent::spawn keeps NO_COLOR out of the agent's environment.
    let agent = Agent::dev_named("plain", "info", &[], &[], Some(&log)).await;
    agent.kill9().await;

    let text = log_text(&log);
    assert!(text.contains("gossip started"), "{text}");
    assert!(
        !text.contains("\x1b["),
        "colour codes in the log file: {text:?}"
    );
}
