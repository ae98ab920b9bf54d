//! Lock history (`/v1/vigil/history`, `vigil lock history`): in a 3-server cluster with a client
//! agent, a holder's node is killed, a session destroyed, a TTL left to lapse and a check
//! failed, and each cause is read back through HTTP and the CLI, from every server and after
//! the leader is killed; a blocking read wakes with the next event. On a dev agent with small
//! bounds, 10,000 grants keep the history within them, and hold times reach the metrics.
//! docs/design.md#lock-history.

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Http, SHORT_SESSION_TTL, binary, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::Command;

/// How long an invalidation (a killed node's included) may take to reach the history.
const LIMIT: Duration = Duration::from_secs(30);

/// The events of the lock `name` of `kind` (`key` or `queue`) as `agent` answers them.
async fn events(agent: &Http, name: &str, kind: &str) -> Vec<Value> {
    let reply = agent.get(&format!("/v1/vigil/history/{name}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let found = reply.json();
    found
        .as_array()
        .expect("a list")
        .iter()
        .find(|h| h["Kind"] == kind)
        .map(|h| h["Events"].as_array().expect("Events").clone())
        .unwrap_or_default()
}

/// Waits until `name`'s key history ends with a loss, and returns that loss.
async fn lost(agent: &Http, name: &str) -> Value {
    eventually(LIMIT, &format!("{name}'s holder lost"), || async {
        events(agent, name, "key")
            .await
            .into_iter()
            .rev()
            .find(|e| e["Event"] == "lost")
    })
    .await
}

/// `vigil lock history <args>` against `agent`: its stdout.
async fn cli(agent: &Http, args: &[&str]) -> String {
    let out = Command::new(binary())
        .args(["lock", "history"])
        .args(args)
        .env("VIGIL_HTTP_ADDR", &agent.base)
        .env_remove("CONSUL_HTTP_ADDR")
        .output()
        .await
        .expect("run vigil lock history");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[tokio::test]
async fn every_cause_of_a_loss_is_read_back_through_http_and_the_cli() {
    let mut cluster = Cluster::servers(3)
        .clients(1)
        .env(SHORT_SESSION_TTL)
        .start()
        .await;
    let server = cluster.server(0).http();
    let client = cluster.client(0).http();
    eventually(LIMIT, "protocol level 2", || async {
        let stats = server.get("/v1/agent/self").await.json();
        (stats["Stats"]["raft"]["protocol_level"] == json!("2")).then_some(())
    })
    .await;

    // A blocking read of a lock with no history yet wakes with its first grant.
    let first = server.get("/v1/vigil/history/t62/node").await;
    let since = first.index();
    let waiting = {
        let server = server.clone();
        tokio::spawn(async move {
            let path = format!("/v1/vigil/history/t62/node?index={since}&wait=60s");
            server.get(&path).await
        })
    };

    // The client agent's node holds t62/node (lock-delay 2 s); it will be killed.
    let on_node = create_session(&client, r#"{"Name":"worker","LockDelay":"2s"}"#).await;
    client.acquire_ok("t62/node", &on_node).await;
    let woken = waiting.await.expect("blocking read");
    assert!(woken.index() > since, "{} > {since}", woken.index());
    assert_eq!(woken.json()[0]["Events"][0]["Event"], "granted");
    assert_eq!(woken.json()[0]["Events"][0]["SessionName"], "worker");
    assert_eq!(woken.json()[0]["Events"][0]["Node"], "c0");

    // Destroyed.
    let destroyed = create_session(&server, r#"{"LockDelay":"0s"}"#).await;
    server.acquire_ok("t62/destroyed", &destroyed).await;
    server.destroy_session(&destroyed).await;

    // TTL lapsed (not renewed).
    let ttl = create_session(&server, r#"{"TTL":"1s","LockDelay":"0s"}"#).await;
    server.acquire_ok("t62/ttl", &ttl).await;

    // A check critical: the session is bound to `probe`, which is then failed.
    let registered = server
        .put(
            "/v1/agent/check/register",
            json!({"Name": "probe", "TTL": "1h", "Status": "passing"}).to_string(),
        )
        .await;
    assert_eq!(registered.status, StatusCode::OK, "{}", registered.text());
    let checked = create_session(
        &server,
        r#"{"NodeChecks":["serfHealth","probe"],"LockDelay":"0s"}"#,
    )
    .await;
    server.acquire_ok("t62/check", &checked).await;
    let failed = server.put("/v1/agent/check/fail/probe", "").await;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.text());

    // A native lock taken and released, for its own kind of history.
    let queued = create_session(&server, r#"{"LockDelay":"0s"}"#).await;
    let taken = server
        .put(&format!("/v1/vigil/lock/t62/queue?session={queued}"), "")
        .await;
    assert_eq!(taken.json()["Acquired"], true, "{}", taken.text());
    let released = server
        .delete(&format!("/v1/vigil/lock/t62/queue?session={queued}"))
        .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.text());

    cluster.kill9_client(0).await;

    let node = lost(&server, "t62/node").await;
    assert_eq!(node["Cause"], "node-failed", "{node}");
    assert_eq!(node["Node"], "c0");
    assert_eq!(node["CheckID"], "serfHealth");
    assert_eq!(node["Session"], json!(on_node));
    let node_events = events(&server, "t62/node", "key").await;
    let delay = node_events.last().expect("an event");
    assert_eq!(delay["Event"], "lock-delay", "{node_events:?}");
    assert_eq!(
        delay["UntilMs"].as_u64().expect("UntilMs"),
        node["TimeMs"].as_u64().expect("TimeMs") + 2_000
    );
    assert_eq!(lost(&server, "t62/destroyed").await["Cause"], "destroyed");
    assert_eq!(lost(&server, "t62/ttl").await["Cause"], "ttl-expired");
    let check = lost(&server, "t62/check").await;
    assert_eq!(check["Cause"], "check-critical", "{check}");
    assert_eq!(check["CheckID"], "probe");
    let queue: Vec<Value> = events(&server, "t62/queue", "queue").await;
    let kinds: Vec<&str> = queue.iter().filter_map(|e| e["Event"].as_str()).collect();
    assert_eq!(kinds, ["granted", "released"]);
    assert_eq!(queue[0]["WaitedMs"], 0);

    // The CLI: one timeline line per event, each cause in words.
    let text = cli(&server, &["t62/", "--prefix"]).await;
    for line in [
        "key t62/node",
        "node c0 failed (serfHealth)  lock-delay 2 s",
        "key t62/destroyed",
        " destroyed",
        "key t62/ttl",
        " TTL lapsed",
        "key t62/check",
        "check probe on s0 critical",
        "queued lock t62/queue",
        "granted    token ",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    let json: Value =
        serde_json::from_str(&cli(&server, &["t62/", "--prefix", "--json"]).await).expect("JSON");
    assert_eq!(json.as_array().map(Vec::len), Some(5), "{json}");

    // Every server holds the same history, and it survives the leader's death.
    let all =
        |http: Http| async move { http.get("/v1/vigil/history?prefix=t62/&stale").await.json() };
    let before = all(server.clone()).await;
    for i in 1..3 {
        eventually(LIMIT, &format!("s{i}'s history"), || async {
            (all(cluster.server(i).http()).await == before).then_some(())
        })
        .await;
    }
    let leader = cluster.leader().await;
    cluster.kill9(leader).await;
    let survivor = cluster.server(cluster.leader().await).http();
    assert_eq!(
        survivor.get("/v1/vigil/history?prefix=t62/").await.json(),
        before
    );
}

#[tokio::test]
async fn ten_thousand_grants_keep_the_history_within_its_bounds() {
    let agent = integration_tests::Agent::dev_with(&[
        "--lock-history-per-lock",
        "5",
        "--lock-history-total",
        "300",
    ])
    .await;
    eventually(LIMIT, "protocol level 2", || async {
        let stats = agent.get("/v1/agent/self").await.json();
        (stats["Stats"]["raft"]["protocol_level"] == json!("2")).then_some(())
    })
    .await;
    let session = agent.session(r#"{"LockDelay":"0s"}"#).await;
    // 100 rounds of one transaction acquiring 100 keys and one releasing them.
    let txn = |verb: &str| {
        let ops: Vec<Value> = (0..100)
            .map(|k| json!({"KV": {"Verb": verb, "Key": format!("bound/{k}"), "Session": session}}))
            .collect();
        Value::Array(ops).to_string()
    };
    let (lock, unlock) = (txn("lock"), txn("unlock"));
    for _ in 0..100 {
        for body in [&lock, &unlock] {
            let reply = agent.put("/v1/txn", body.clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        }
    }
    let last = agent.get("/v1/kv/bound/99").await.json()[0]["LockIndex"]
        .as_u64()
        .expect("LockIndex");
    assert_eq!(last, 100);
    let found = agent.get("/v1/vigil/history?prefix=bound/").await.json();
    let histories = found.as_array().expect("a list");
    let counts: Vec<usize> = histories
        .iter()
        .map(|h| h["Events"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(counts.iter().sum::<usize>(), 300, "{counts:?}");
    assert!(counts.iter().all(|n| *n <= 5), "{counts:?}");
    // What is kept is the newest: each key's last release, after its last grant.
    let newest = histories
        .iter()
        .flat_map(|h| h["Events"].as_array().expect("Events"))
        .filter(|e| e["Event"] == "granted")
        .filter_map(|e| e["Token"].as_u64())
        .min()
        .expect("a grant kept");
    assert!(newest >= 99, "oldest grant kept has LockIndex {newest}");
    let one = agent.get("/v1/vigil/history/bound/99").await.json();
    let kinds: Vec<&str> = one[0]["Events"]
        .as_array()
        .expect("Events")
        .iter()
        .filter_map(|e| e["Event"].as_str())
        .collect();
    assert_eq!(kinds.last(), Some(&"released"), "{one}");

    // Hold times are in the metrics, by the lock's prefix (one more hold each try, in case the
    // metrics' interval just turned over).
    let (lock_one, unlock_one) = (
        json!([{"KV": {"Verb": "lock", "Key": "bound/0", "Session": session}}]).to_string(),
        json!([{"KV": {"Verb": "unlock", "Key": "bound/0", "Session": session}}]).to_string(),
    );
    eventually(LIMIT, "vigil.lock.hold of prefix bound", || async {
        for body in [&lock_one, &unlock_one] {
            let reply = agent.put("/v1/txn", body.clone()).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        }
        let metrics = agent.get("/v1/agent/metrics").await.json();
        let samples = metrics["Samples"].as_array()?.clone();
        samples
            .iter()
            .find(|s| s["Name"] == "vigil.lock.hold" && s["Labels"]["prefix"] == "bound")
            .filter(|s| s["Count"].as_u64() >= Some(1))
            .map(|_| ())
    })
    .await;
}
