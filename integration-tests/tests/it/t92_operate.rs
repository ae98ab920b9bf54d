//! Operating Vigil through its public interface (issue #16): metrics move as locks are taken
//! and sessions die (Consul's JSON and Prometheus text); a snapshot restore brings the state
//! back while every LockIndex keeps growing, and a damaged archive changes nothing; a killed
//! server is removed and replaced, another is lost and autopilot removes it while a quorum
//! stays; leadership moves on request; a reload picks up a new check from the config file, and
//! the agent's log can be followed over HTTP; py-consul's `snapshot`, `operator` and
//! `agent.metrics` and `operator.keyring_*` work unchanged; `vigil debug` gathers a report into a `.tar.gz` (or a
//! directory with `-archive=false`); autopilot's settings change with check-and-set; the gossip
//! key rotates across a cluster (install, use, remove) as Consul's keyring does, survives a
//! restart, and locks out the old key.

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Agent, Http, SHORT_SESSION_TTL, binary, eventually, run_py_consul};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use vigil_gossip::generate_key;

use crate::common::{assert_error, assert_error_containing, assert_error_prefix, config_file};

/// A counter's (or sample's) `Count` and `Sum` in `/v1/agent/metrics`, by name and labels.
fn counter(metrics: &Value, kind: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics[kind].as_array()?.iter().find_map(|m| {
        let matches = m["Name"] == name
            && labels
                .iter()
                .all(|(k, v)| m["Labels"][*k].as_str() == Some(*v));
        matches.then(|| m["Sum"].as_f64().unwrap_or(0.0))
    })
}

fn gauge(metrics: &Value, name: &str) -> Option<f64> {
    metrics["Gauges"]
        .as_array()?
        .iter()
        .find(|g| g["Name"] == name)
        .and_then(|g| g["Value"].as_f64())
}

async fn metrics(agent: &Http) -> Value {
    let reply = agent.get("/v1/agent/metrics").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()
}

/// Waits until the counter reaches `at_least`.
async fn counter_reaches(agent: &Http, name: &str, labels: &[(&str, &str)], at_least: f64) {
    eventually(
        Duration::from_secs(20),
        &format!("{name} {labels:?} to reach {at_least}"),
        || async {
            let m = metrics(agent).await;
            (counter(&m, "Counters", name, labels).unwrap_or(0.0) >= at_least).then_some(())
        },
    )
    .await;
}

/// `?acquire` on `key` for `session`: `true` when granted.
async fn acquire(agent: &Http, key: &str, session: &str) -> bool {
    agent.acquire(key, session).await.text() == "true"
}

async fn release(agent: &Http, key: &str, session: &str) {
    let reply = agent
        .put(&format!("/v1/kv/{key}?release={session}"), "")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

async fn lock_index(agent: &Http, key: &str) -> u64 {
    agent.kv_entry(key).await["LockIndex"]
        .as_u64()
        .expect("LockIndex")
}

async fn raw(agent: &Http, key: &str) -> Option<String> {
    let reply = agent.get(&format!("/v1/kv/{key}?raw")).await;
    (reply.status == StatusCode::OK).then(|| reply.text())
}

#[tokio::test]
async fn metrics_follow_locks_sessions_and_requests() {
    let agent = Agent::dev().await;

    // Consul's shape, before anything happened.
    let m = metrics(&agent).await;
    for field in ["Timestamp", "Gauges", "Points", "Counters", "Samples"] {
        assert!(!m[field].is_null(), "{field} missing in {m}");
    }
    assert!(
        m["Timestamp"]
            .as_str()
            .expect("Timestamp")
            .ends_with(" +0000 UTC")
    );
    assert_eq!(gauge(&m, "vigil.raft.is_leader"), Some(1.0));
    let alive = m["Gauges"]
        .as_array()
        .expect("Gauges")
        .iter()
        .find(|g| g["Name"] == "vigil.gossip.members" && g["Labels"]["state"] == "alive")
        .and_then(|g| g["Value"].as_f64());
    assert_eq!(alive, Some(1.0), "{m}");

    // A lock is granted, refused while held, and refused by lock-delay after its holder dies.
    let first = agent.session(r#"{"LockDelay": "10s"}"#).await;
    let second = agent.session("{}").await;
    assert!(acquire(&agent, "svc/leader", &first).await);
    assert!(!acquire(&agent, "svc/leader", &second).await);
    let destroyed = agent.put(&format!("/v1/session/destroy/{first}"), "").await;
    assert_eq!(destroyed.status, StatusCode::OK);
    assert!(!acquire(&agent, "svc/leader", &second).await);
    for result in ["granted", "held_by_other", "lock_delay"] {
        counter_reaches(&agent, "vigil.lock.acquire", &[("result", result)], 1.0).await;
    }
    counter_reaches(
        &agent,
        "vigil.session.invalidate",
        &[("cause", "destroy")],
        1.0,
    )
    .await;
    let m = metrics(&agent).await;
    assert!(
        gauge(&m, "vigil.lock.delay_active").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(counter(&m, "Counters", "consul.raft.apply", &[]).unwrap_or(0.0) >= 4.0);
    let commit = m["Samples"]
        .as_array()
        .expect("Samples")
        .iter()
        .find(|s| s["Name"] == "consul.raft.commitTime")
        .expect("commit time sample");
    for field in [
        "Count", "Rate", "Sum", "Min", "Max", "Mean", "Stddev", "Labels",
    ] {
        assert!(!commit[field].is_null(), "{field} missing in {commit}");
    }
    assert!(counter(&m, "Samples", "consul.http.PUT.v1.kv._", &[]).is_some());

    // A session whose TTL passes is counted as a TTL invalidation, not a destroy.
    let ttl = agent.session(r#"{"TTL": "1s"}"#).await;
    counter_reaches(&agent, "vigil.session.invalidate", &[("cause", "ttl")], 1.0).await;
    let gone = agent.get(&format!("/v1/session/info/{ttl}")).await;
    assert_eq!(gone.json(), serde_json::json!([]));

    // A sequencer check is counted by its result.
    let held = agent.session("{}").await;
    assert!(acquire(&agent, "svc/other", &held).await);
    let index = lock_index(&agent, "svc/other").await;
    let check = agent
        .get(&format!(
            "/v1/vigil/sequencer?key=svc/other&lock-index={index}&session={held}"
        ))
        .await;
    assert_eq!(check.status, StatusCode::OK, "{}", check.text());
    counter_reaches(&agent, "vigil.sequencer.check", &[("result", "valid")], 1.0).await;

    // The same series as Prometheus text.
    let reply = agent.get("/v1/agent/metrics?format=prometheus").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = reply.text();
    for line in [
        "# TYPE vigil_lock_acquire counter",
        "vigil_lock_acquire{result=\"lock_delay\"} 1",
        "vigil_session_invalidate{cause=\"ttl\"} 1",
        "# TYPE consul_raft_commitTime summary",
        "# TYPE vigil_raft_is_leader gauge",
        "vigil_raft_is_leader 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    assert!(text.contains("consul_http_PUT_v1_kv___count "), "{text}");
}

#[tokio::test]
async fn a_restore_brings_the_state_back_and_lock_indexes_keep_growing() {
    let agent = Agent::dev().await;
    let dir = tempfile::tempdir().expect("temporary directory");

    // The state the archive holds: a value, and a lock granted twice.
    let holder = agent.session("{}").await;
    assert_eq!(agent.put("/v1/kv/app/config", "v1").await.text(), "true");
    assert!(acquire(&agent, "locks/a", &holder).await);
    release(&agent, "locks/a", &holder).await;
    assert!(acquire(&agent, "locks/a", &holder).await);
    let reply = agent.get("/v1/snapshot").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(reply.index() > 0);
    let archive = reply.body.to_vec();
    assert_eq!(&archive[..2], &[0x1f, 0x8b], "a gzip stream");

    // After it: changes, and many more grants, on the archived key and on a new one.
    assert_eq!(agent.put("/v1/kv/app/config", "v2").await.text(), "true");
    assert_eq!(agent.put("/v1/kv/app/new", "x").await.text(), "true");
    let other = agent.session("{}").await;
    for _ in 0..4 {
        release(&agent, "locks/a", &holder).await;
        assert!(acquire(&agent, "locks/a", &holder).await);
    }
    assert!(acquire(&agent, "locks/b", &other).await);
    let highest = lock_index(&agent, "locks/a")
        .await
        .max(lock_index(&agent, "locks/b").await);

    // A truncated or damaged archive is refused and changes nothing.
    let cut = agent
        .request(
            Method::PUT,
            "/v1/snapshot",
            Some(archive[..archive.len() / 2].to_vec()),
        )
        .await;
    assert_error_containing(&cut, StatusCode::INTERNAL_SERVER_ERROR, "snapshot archive");
    let junk = agent
        .request(
            Method::PUT,
            "/v1/snapshot",
            Some(b"not a snapshot".to_vec()),
        )
        .await;
    assert_eq!(junk.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(raw(&agent, "app/config").await.as_deref(), Some("v2"));

    // The restore brings the archived state back.
    let restored = agent
        .request(Method::PUT, "/v1/snapshot", Some(archive.clone()))
        .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.text());
    assert_eq!(raw(&agent, "app/config").await.as_deref(), Some("v1"));
    assert_eq!(raw(&agent, "app/new").await, None);
    assert_eq!(raw(&agent, "locks/b").await, None);
    assert!(lock_index(&agent, "locks/a").await < highest);

    // Every lock granted after it is above anything granted before, on any key.
    release(&agent, "locks/a", &holder).await;
    assert!(acquire(&agent, "locks/a", &holder).await);
    assert!(lock_index(&agent, "locks/a").await > highest);
    let fresh = agent.session("{}").await;
    assert!(acquire(&agent, "locks/b", &fresh).await);
    assert!(lock_index(&agent, "locks/b").await > highest);

    // The CLI saves, inspects and restores the same archives.
    let file = dir.path().join("backup.snap");
    let http = agent.base.trim_start_matches("http://").to_owned();
    let run = |args: Vec<String>| {
        let output = std::process::Command::new(binary())
            .args(&args)
            .output()
            .expect("run vigil");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    };
    let path = file.to_string_lossy().into_owned();
    let (code, out) = run(vec![
        "snapshot".into(),
        "save".into(),
        "--http-addr".into(),
        http.clone(),
        path.clone(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(vec!["snapshot".into(), "inspect".into(), path.clone()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("KV entries"), "{out}");
    std::fs::write(&file, &archive[..10]).expect("truncate the file");
    let (code, out) = run(vec!["snapshot".into(), "inspect".into(), path.clone()]);
    assert_eq!(code, Some(1), "{out}");
    let (code, out) = run(vec![
        "snapshot".into(),
        "restore".into(),
        "--http-addr".into(),
        http,
        path,
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(raw(&agent, "app/config").await.as_deref(), Some("v1"));
}

/// The raft ID of the server named `node` in server `at`'s configuration.
/// A restore larger than one raft entry travels in parts, from a client agent through the
/// servers, and lands whole on every server.
#[tokio::test]
async fn a_restore_larger_than_a_raft_entry_reaches_every_server() {
    let cluster = Cluster::servers(3).clients(1).start().await;
    let client = cluster.client(0).http();
    // 24 values of 256 KiB that do not compress: a 6 MiB state and archive, three times the
    // largest raft entry.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let values: Vec<Vec<u8>> = (0..24).map(|_| noise(256 * 1024)).collect();
    for (i, value) in values.iter().enumerate() {
        let reply = client.put(&format!("/v1/kv/big/{i}"), value.clone()).await;
        assert_eq!(reply.text(), "true");
    }
    let reply = client.get("/v1/snapshot").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let archive = reply.body.to_vec();
    assert!(archive.len() > 4 * 1024 * 1024, "{} bytes", archive.len());

    let gone = client.delete("/v1/kv/big?recurse").await;
    assert_eq!(gone.text(), "true");
    let restored = client
        .request(Method::PUT, "/v1/snapshot", Some(archive))
        .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.text());
    // Every server holds every value, each answering from its own state.
    for at in 0..3 {
        let server = cluster.server(at).http();
        for (i, value) in values.iter().enumerate() {
            let path = format!("/v1/kv/big/{i}?raw&stale");
            let got = eventually(Duration::from_secs(30), "the restored value", || async {
                let reply = server.get(&path).await;
                (reply.status == StatusCode::OK).then(|| reply.body.to_vec())
            })
            .await;
            assert!(got == *value, "server {at}, key big/{i}");
        }
    }
}

async fn raft_id(cluster: &Cluster, at: usize, node: &str) -> String {
    let config = cluster.raft_configuration(at).await;
    config["Servers"]
        .as_array()
        .expect("Servers")
        .iter()
        .find(|s| s["Node"] == node)
        .and_then(|s| s["ID"].as_str())
        .unwrap_or_else(|| panic!("{node} not in {config}"))
        .to_owned()
}

async fn voters(cluster: &Cluster, at: usize) -> Vec<String> {
    let config = cluster.raft_configuration(at).await;
    let mut names: Vec<String> = config["Servers"]
        .as_array()
        .expect("Servers")
        .iter()
        .filter(|s| s["Voter"] == true)
        .map(|s| s["Node"].as_str().expect("Node").to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn servers_are_removed_replaced_and_hand_over_leadership() {
    let mut cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let follower = (0..3).find(|i| *i != leader).expect("a follower");
    let follower_name = format!("s{follower}");

    // Leadership moves to the server asked for, while writes go on; asking for itself or a
    // stranger is refused.
    let target = raft_id(&cluster, leader, &follower_name).await;
    let writer = {
        let http = cluster.server(leader).http();
        tokio::spawn(async move {
            for n in 0.. {
                let path = format!("/v1/kv/during/transfer{}", n % 10);
                // Some writes may fail while leadership moves; the transfer must not.
                let _ = http
                    .try_request(Method::PUT, &path, Some(b"x".to_vec()))
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let moved = cluster
        .server(leader)
        .request(
            Method::POST,
            &format!("/v1/operator/raft/transfer-leader?id={target}"),
            None,
        )
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.text());
    assert_eq!(moved.json()["Success"], true);
    writer.abort();
    assert_eq!(cluster.leader().await, follower);
    let leader = follower;
    let own = raft_id(&cluster, leader, &format!("s{leader}")).await;
    let on_leader = cluster.server(leader);
    let to_self = format!("/v1/operator/raft/transfer-leader?id={own}");
    let to_self = on_leader.request(Method::POST, &to_self, None).await;
    let itself = "cannot transfer leadership to itself";
    assert_error(&to_self, StatusCode::INTERNAL_SERVER_ERROR, itself);
    let unknown = on_leader
        .delete("/v1/operator/raft/peer?id=00000000000000ff")
        .await;
    let not_found = "id \"00000000000000ff\" was not found in the Raft configuration";
    assert_error(&unknown, StatusCode::INTERNAL_SERVER_ERROR, not_found);
    let neither = on_leader.delete("/v1/operator/raft/peer").await;
    assert_eq!(neither.status, StatusCode::BAD_REQUEST);

    // A killed server is removed by ID, and a fresh one takes its place.
    let dead = (0..3).find(|i| *i != leader).expect("a follower");
    let dead_id = raft_id(&cluster, leader, &format!("s{dead}")).await;
    cluster.kill9(dead).await;
    let removed = cluster
        .server(leader)
        .delete(&format!("/v1/operator/raft/peer?id={dead_id}"))
        .await;
    assert_eq!(removed.status, StatusCode::OK, "{}", removed.text());
    assert_eq!(voters(&cluster, leader).await.len(), 2);
    let fresh = cluster.add_server().await;
    eventually(
        Duration::from_secs(60),
        "the fresh server to become a voter",
        || async {
            voters(&cluster, leader)
                .await
                .contains(&format!("s{fresh}"))
                .then_some(())
        },
    )
    .await;
    let client = cluster.server(leader).http();
    create_session(&client, "{}").await;
    eventually(
        Duration::from_secs(30),
        "autopilot to find three healthy servers",
        || async {
            let health = client.get("/v1/operator/autopilot/health").await;
            (health.status == StatusCode::OK && health.json()["FailureTolerance"] == 1)
                .then_some(())
        },
    )
    .await;

    // Another server dies: autopilot reports it, then removes it, and the two left commit.
    let lost = cluster
        .running_servers()
        .into_iter()
        .find(|i| *i != leader)
        .expect("another follower");
    cluster.kill9(lost).await;
    eventually(
        Duration::from_secs(30),
        "autopilot to report the lost server",
        || async {
            let health = client.get("/v1/operator/autopilot/health").await;
            (health.status == StatusCode::TOO_MANY_REQUESTS).then_some(())
        },
    )
    .await;
    eventually(
        Duration::from_secs(90),
        "autopilot to remove the lost server",
        || async { (voters(&cluster, leader).await.len() == 2).then_some(()) },
    )
    .await;
    assert!(!voters(&cluster, leader).await.contains(&format!("s{lost}")));
    let write = client.put("/v1/kv/after/loss", "ok").await;
    assert_eq!(write.text(), "true");
    let health = client.get("/v1/operator/autopilot/health").await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
}

#[tokio::test]
async fn a_reload_picks_up_new_checks_and_the_log_can_be_followed() {
    let service = "[[service]]\nid = \"web\"\nname = \"web\"\nport = 80\n";
    let (dir, config) = config_file(service);
    let log = dir.path().join("agent.log");
    let agent =
        Agent::dev_named("reloaded", "debug", &["--config", &config], &[], Some(&log)).await;
    let checks =
        |reply: integration_tests::Reply| reply.json().as_object().cloned().unwrap_or_default();
    assert!(checks(agent.get("/v1/agent/checks").await).is_empty());

    // A new check in the file appears on reload; one the file no longer has goes.
    let with_check =
        format!("{service}\n[[check]]\nid = \"worker\"\nname = \"Worker\"\nttl = \"1m\"\n");
    std::fs::write(&config, with_check).expect("rewrite the config file");
    let reply = agent.put("/v1/agent/reload", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(checks(agent.get("/v1/agent/checks").await).contains_key("worker"));
    std::fs::write(&config, "[[service]\nbroken").expect("break the config file");
    let reply = agent.put("/v1/agent/reload", "").await;
    assert_error_prefix(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Failed reloading config",
    );
    assert!(checks(agent.get("/v1/agent/checks").await).contains_key("worker"));
    std::fs::write(&config, service).expect("rewrite the config file");
    let reply = agent.put("/v1/agent/reload", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(checks(agent.get("/v1/agent/checks").await).is_empty());

    // The monitor refuses an unknown level and streams the request log (no token in it).
    let bad = agent.get("/v1/agent/monitor?loglevel=loud").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "Unknown log level: loud");
    let mut stream = reqwest::get(agent.url("/v1/agent/monitor?loglevel=debug"))
        .await
        .expect("monitor");
    assert_eq!(stream.status(), StatusCode::OK);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let logged = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request log line"
        );
        agent.get("/v1/kv/monitored?token=secret-token").await;
        let chunk = tokio::time::timeout(Duration::from_secs(1), stream.chunk()).await;
        if let Ok(Ok(Some(chunk))) = chunk {
            let text = String::from_utf8_lossy(&chunk).into_owned();
            if text.contains("/v1/kv/monitored") {
                break text;
            }
        }
    };
    assert!(logged.contains("status=404"), "{logged}");
    assert!(!logged.contains("secret-token"), "{logged}");
}

#[tokio::test]
async fn py_consul_operates_an_agent() {
    let (key, new_key) = (generate_key(), generate_key());
    let agent = Agent::dev_with_env(&["--encrypt", &key], &[SHORT_SESSION_TTL]).await;
    run_py_consul("consul_operate.py", &agent, &[&key, &new_key]).await;
}

/// `GET /v1/operator/keyring` through `agent`: Consul's list of pools.
async fn keyring_list(agent: &Http) -> Value {
    let reply = agent.get("/v1/operator/keyring").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()
}

/// A keyring change (`POST` install, `PUT` use, `DELETE` remove) of `key` through `agent`.
async fn keyring_change(agent: &Http, method: Method, key: &str) -> integration_tests::Reply {
    let body = serde_json::json!({ "Key": key }).to_string().into_bytes();
    agent
        .request(method, "/v1/operator/keyring", Some(body))
        .await
}

/// `vigil <command> ARGS` against `agent`.
fn vigil_against(agent: &Http, command: &str, args: &[&str]) -> std::process::Command {
    let mut cli = std::process::Command::new(binary());
    let addr = agent.base.trim_start_matches("http://");
    cli.args([command, "--http-addr", addr]).args(args);
    cli
}

/// `vigil keyring ARGS` against `agent`: exit code and output (stdout, then stderr).
fn keyring_cli(agent: &Http, args: &[&str]) -> (Option<i32>, String) {
    let output = vigil_against(agent, "keyring", args)
        .output()
        .expect("run vigil keyring");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// The names of the members `agent` reports alive.
async fn alive_members(agent: &Http) -> Vec<String> {
    let reply = agent.get("/v1/agent/members").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let mut names: Vec<String> = reply
        .json()
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["Status"] == 1)
        .map(|m| m["Name"].as_str().expect("Name").to_owned())
        .collect();
    names.sort();
    names
}

/// One LAN pool in which `keys` are installed and `primary` is primary on all `n` members.
fn one_pool(keys: &[&str], primary: &str, n: usize) -> Value {
    let keys: serde_json::Map<String, Value> =
        keys.iter().map(|k| ((*k).to_owned(), n.into())).collect();
    serde_json::json!([{
        "WAN": false,
        "Datacenter": "dc1",
        "Segment": "",
        "Keys": keys,
        "PrimaryKeys": { primary: n },
        "NumNodes": n,
    }])
}

#[tokio::test]
async fn gossip_keys_rotate_across_the_cluster() {
    let (old, new) = (generate_key(), generate_key());
    let mut cluster = Cluster::servers(3)
        .server_arg("--encrypt")
        .server_arg(&old)
        .start()
        .await;
    let servers = ["s0", "s1", "s2"].map(str::to_owned);
    let s0 = cluster.server(0).http();
    // A keyring operation asks the members its server knows alive (Serf's query), and the
    // rotation below goes through s1 as well: every server must see the other two first.
    for i in 0..servers.len() {
        let http = cluster.server(i).http();
        eventually(Duration::from_secs(20), "three members alive", || async {
            (alive_members(&http).await == servers).then_some(())
        })
        .await;
    }

    // Every server holds the old key, as its primary.
    assert_eq!(keyring_list(&s0).await, one_pool(&[&old], &old, 3));

    // Refusals answer Consul's codes and texts, and change nothing.
    let refused = |rule: &str| {
        let lines: Vec<String> = servers
            .iter()
            .map(|s| format!("\t* {s}: {rule}\n"))
            .collect();
        format!(
            "4 errors occurred:\n\t* dc1 (LAN) error: 3/3 nodes reported failure\n{}\n",
            lines.concat()
        )
    };
    let reply = keyring_change(&s0, Method::DELETE, &old).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.text(),
        refused("Removing the primary key is not allowed")
    );
    let reply = keyring_change(&s0, Method::PUT, &new).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.text(), refused("Requested key is not in the keyring"));
    let short = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 20]);
    let reply = keyring_change(&s0, Method::POST, &short).await;
    assert_eq!(reply.text(), refused("key size must be 16, 24 or 32 bytes"));
    let reply = keyring_change(&s0, Method::POST, "not base64!").await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "1 error occurred:\n\t* dc1 (LAN) error: illegal base64 data at input byte 3\n\n",
    );
    let reply = s0
        .request(Method::POST, "/v1/operator/keyring", Some(b"{".to_vec()))
        .await;
    assert_error_prefix(&reply, StatusCode::BAD_REQUEST, "Request decode failed: ");
    let reply = s0.get("/v1/operator/keyring?relay-factor=9").await;
    assert_eq!(
        (reply.status, reply.text()),
        (
            StatusCode::BAD_REQUEST,
            "Invalid relay-factor: Relay factor must be in range: [0, 5]".to_owned()
        )
    );
    assert_eq!(keyring_list(&s0).await, one_pool(&[&old], &old, 3));

    // Rotation: install through the CLI (Go-style flags), use through the API of another
    // server, remove through the CLI; each step reaches all three.
    let (code, out) = keyring_cli(&s0, &[&format!("-install={new}")]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("==> Installing new gossip encryption key..."),
        "{out}"
    );
    let (code, out) = keyring_cli(&s0, &["-list"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\ndc1 (LAN):\n"), "{out}");
    for key in [&old, &new] {
        assert!(out.contains(&format!("  {key} [3/3]")), "{out}");
    }
    let s1 = cluster.server(1).http();
    let reply = keyring_change(&s1, Method::PUT, &new).await;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, String::new())
    );
    assert_eq!(keyring_list(&s0).await, one_pool(&[&old, &new], &new, 3));
    let (code, out) = keyring_cli(&s0, &["-remove", &old]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(keyring_list(&s0).await, one_pool(&[&new], &new, 3));
    let (code, out) = keyring_cli(&s0, &["-remove", &new]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("error: Unexpected response code: 500 (4 errors occurred:"),
        "{out}"
    );

    // The cluster stayed healthy: every member alive, writes commit.
    assert_eq!(alive_members(&s0).await, servers);
    assert_eq!(s0.put("/v1/kv/after/rotation", "ok").await.text(), "true");

    // The keyring survives a restart: s1 comes back with its saved ring (its --encrypt is
    // still the old key) and rejoins.
    cluster.kill9(1).await;
    cluster.restart(1).await;
    eventually(
        Duration::from_secs(60),
        "the restarted server back with the new key",
        || async {
            let reply = s0.get("/v1/operator/keyring").await;
            (reply.status == StatusCode::OK && reply.json() == one_pool(&[&new], &new, 3))
                .then_some(())
        },
    )
    .await;

    // A newcomer with only the old key never gets in; one with the new key does.
    let failures = || async { gauge(&metrics(&s0).await, "vigil.gossip.decrypt_failures") };
    let before = failures().await.unwrap_or(0.0);
    let stale = cluster
        .add_client_with(&[0, 1, 2], &["--encrypt", &old])
        .await;
    let fresh = cluster
        .add_client_with(&[0, 1, 2], &["--encrypt", &new])
        .await;
    let (stale_name, fresh_name) = (
        cluster.clients[stale].name.clone(),
        cluster.clients[fresh].name.clone(),
    );
    eventually(
        Duration::from_secs(20),
        "the new key's client to join",
        || async { alive_members(&s0).await.contains(&fresh_name).then_some(()) },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the old key's packets to be dropped",
        || async { (failures().await.unwrap_or(0.0) > before).then_some(()) },
    )
    .await;
    for i in 0..3 {
        let listed = alive_members(&cluster.server(i).http()).await;
        assert!(
            !listed.contains(&stale_name),
            "s{i} admitted the old key: {listed:?}"
        );
    }
    assert_eq!(
        alive_members(&cluster.client(stale).http()).await,
        [stale_name]
    );
}

#[tokio::test]
async fn keyring_calls_need_gossip_encryption() {
    let agent = Agent::dev().await;
    assert_error(
        &agent.get("/v1/operator/keyring").await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "2 errors occurred:\n\t* dc1 (LAN) error: 1/1 nodes reported failure\n\t* \
         test-node: Keyring is empty (encryption not enabled)\n\n",
    );
    assert_error(
        &keyring_change(&agent, Method::POST, &generate_key()).await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "2 errors occurred:\n\t* dc1 (LAN) error: 1/1 nodes reported failure\n\t* \
         test-node: No keyring to modify (encryption not enabled)\n\n",
    );
    let (code, out) = keyring_cli(&agent, &["-list", "-install", &generate_key()]);
    assert_eq!(
        (code, out.trim()),
        (Some(1), "Only a single action is allowed")
    );
}

/// Runs `vigil debug` against `agent` with `args` (Go-style flags accepted).
async fn vigil_debug(agent: &Agent, args: &[&str]) {
    let output = tokio::process::Command::from(vigil_against(agent, "debug", args))
        .output()
        .await
        .expect("run vigil debug");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn vigil_debug_gathers_a_report() {
    let agent = Agent::dev().await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = dir.path().join("report");
    let out_arg = out.to_str().expect("UTF-8 path");
    let expected = [
        "agent.json",
        "members.json",
        "raft.json",
        "metrics-0.json",
        "metrics-1.json",
    ];

    // By default the report is `<output>.tar.gz`, its files under `report/`, and no directory.
    vigil_debug(
        &agent,
        &["--duration", "2s", "--interval", "1s", "--output", out_arg],
    )
    .await;
    assert!(!out.exists(), "the directory was removed after archiving");
    let archive = std::fs::File::open(dir.path().join("report.tar.gz")).expect("the archive");
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut files = std::collections::BTreeMap::new();
    for entry in tar.entries().expect("a tar stream") {
        let mut entry = entry.expect("an entry");
        let name = entry.path().expect("a path").to_string_lossy().into_owned();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut entry, &mut text).expect("read an entry");
        files.insert(name, text);
    }
    for file in expected {
        let text = files
            .get(&format!("report/{file}"))
            .unwrap_or_else(|| panic!("no report/{file} in {:?}", files.keys()));
        serde_json::from_str::<Value>(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    assert!(files.contains_key("report/agent.log"), "{:?}", files.keys());

    // Go style `-archive=false` keeps the directory, as `consul debug` does.
    let kept = dir.path().join("kept");
    vigil_debug(
        &agent,
        &[
            "-duration=1s",
            "-interval=1s",
            "-archive=false",
            "-output",
            kept.to_str().expect("UTF-8 path"),
        ],
    )
    .await;
    assert!(!dir.path().join("kept.tar.gz").exists());
    let text = std::fs::read_to_string(kept.join("agent.json")).expect("agent.json");
    serde_json::from_str::<Value>(&text).expect("agent.json is JSON");
}

#[tokio::test]
async fn autopilot_settings_change_with_check_and_set() {
    let agent = Agent::dev().await;
    let path = "/v1/operator/autopilot/configuration";

    // Consul's defaults until set.
    let config = agent.get(path).await.json();
    assert_eq!(config["CleanupDeadServers"], true);
    assert_eq!(config["MaxTrailingLogs"], 250);
    assert_eq!(config["LastContactThreshold"], "200ms");

    // The CLI changes one setting, keeps the others, and a stale cas is refused.
    let http = agent.base.trim_start_matches("http://").to_owned();
    let output = std::process::Command::new(binary())
        .args(["operator", "autopilot", "set-config", "--http-addr", &http])
        .args(["--cleanup-dead-servers", "false"])
        .output()
        .expect("run vigil");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config = agent.get(path).await.json();
    assert_eq!(config["CleanupDeadServers"], false);
    assert_eq!(config["MaxTrailingLogs"], 250);
    let index = config["ModifyIndex"].as_u64().expect("ModifyIndex");
    assert!(index > 0);
    let stale = agent
        .put(
            &format!("{path}?cas={}", index - 1),
            r#"{"CleanupDeadServers": true}"#,
        )
        .await;
    assert_eq!(
        (stale.status, stale.text()),
        (StatusCode::OK, "false".to_owned())
    );
    let bad = agent.put(path, r#"{"LastContactThreshold": "soon"}"#).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text());
    assert_eq!(agent.get(path).await.json()["CleanupDeadServers"], false);
}
