//! Server sets of real agent processes on loopback: 3 servers and client agents forming one
//! keyspace, a 5-server set losing two servers, restarts of one server and of the whole set
//! from their data directories (same raft IDs: nothing bootstraps twice), a single server with
//! `--bootstrap-expect 1`, and a client agent whose certificate comes from another CA. Agents
//! stop promptly on SIGTERM even with a blocking query waiting in them.

use std::collections::BTreeMap;
use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session, keys, raft_ids, raw};
use integration_tests::{Http, eventually};
use serde_json::{Value, json};
use tokio::time::Instant;

/// How long a restarted or lagging server may take to catch up.
const CATCH_UP: Duration = Duration::from_secs(30);
/// How long a SIGTERM may take to stop an agent with a blocking query in flight.
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// Checks that a blocking query has not returned within half a second (so it is waiting).
async fn assert_still_blocked<T>(query: &mut tokio::task::JoinHandle<T>) {
    assert!(
        tokio::time::timeout(Duration::from_millis(500), query)
            .await
            .is_err(),
        "the blocking query returned early"
    );
}

/// Waits until `agent` answers `?stale` reads of every key in `expected` with its value.
async fn await_stale_values(agent: &Http, expected: &BTreeMap<String, String>) {
    eventually(CATCH_UP, "a server to hold every key", || async {
        for (key, value) in expected {
            if raw(agent, key, "&stale").await.as_ref() != Some(value) {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Writes `(key, value)` through server `writer` while server `down` is stopped, then restarts
/// `down` and waits until it serves every `expected` key, the new one included.
async fn write_while_down(
    cluster: &mut Cluster,
    writer: usize,
    down: usize,
    (key, value): (&str, &str),
    expected: &mut BTreeMap<String, String>,
) {
    cluster.server(writer).put_key(key, value).await;
    expected.insert(key.to_owned(), value.to_owned());
    cluster.restart(down).await;
    await_stale_values(cluster.server(down), expected).await;
}

/// Every key in `expected` read back with `?consistent` through `agent`.
async fn assert_consistent_values(agent: &Http, expected: &BTreeMap<String, String>) {
    for (key, value) in expected {
        assert_eq!(
            raw(agent, key, "&consistent").await.as_ref(),
            Some(value),
            "{key} through {}",
            agent.base
        );
    }
}

fn sorted(values: Value) -> Vec<String> {
    let mut list: Vec<String> = serde_json::from_value(values).expect("a list of strings");
    list.sort();
    list
}

#[tokio::test]
async fn three_servers_and_two_clients_share_one_keyspace() {
    let mut cluster = Cluster::servers(3).clients(2).start().await;
    let leader = cluster.leader().await;
    let leader_addr = cluster.server_rpc(leader).to_string();
    let mut all_rpc: Vec<String> = (0..3).map(|i| cluster.server_rpc(i).to_string()).collect();
    all_rpc.sort();

    // Every agent, server or client, names the same leader and the three voters.
    let agents: Vec<Http> = (0..3)
        .map(|i| cluster.server(i).http())
        .chain((0..2).map(|i| cluster.client(i).http()))
        .collect();
    for agent in &agents {
        assert_eq!(
            agent.get("/v1/status/leader").await.json(),
            json!(leader_addr)
        );
        assert_eq!(sorted(agent.get("/v1/status/peers").await.json()), all_rpc);
    }
    // The raft configuration in Consul's shape: three voters, one of them the leader.
    let config = cluster.raft_configuration(leader).await;
    let servers = config["Servers"].as_array().expect("Servers");
    assert_eq!(servers.len(), 3, "{config}");
    assert!(
        servers.iter().all(|s| s["Voter"] == json!(true)),
        "{config}"
    );
    let leaders: Vec<&Value> = servers
        .iter()
        .filter(|s| s["Leader"] == json!(true))
        .collect();
    assert_eq!(leaders.len(), 1, "{config}");
    assert_eq!(leaders[0]["Address"], json!(leader_addr));
    assert_eq!(raft_ids(&config).len(), 3);

    // A write through either client is readable through the other at once (default reads go
    // to the leader)...
    let (c0, c1) = (cluster.client(0).http(), cluster.client(1).http());
    c0.put_key("shared/from-c0", "zero").await;
    assert_eq!(
        raw(&c1, "shared/from-c0", "").await.as_deref(),
        Some("zero")
    );
    c1.put_key("shared/from-c1", "one").await;
    assert_eq!(raw(&c0, "shared/from-c1", "").await.as_deref(), Some("one"));

    // ...and, once replicated, from every server's own copy (`?stale`).
    let expected = BTreeMap::from([
        ("shared/from-c0".to_owned(), "zero".to_owned()),
        ("shared/from-c1".to_owned(), "one".to_owned()),
    ]);
    for i in 0..3 {
        await_stale_values(cluster.server(i), &expected).await;
    }

    // A session created through one client (bound to that client's node) holds a lock that the
    // other client sees, and the other client's session cannot take it.
    let s0 = create_session(&c0, r#"{"Name":"c0-lock"}"#).await;
    let s1 = create_session(&c1, r#"{"Name":"c1-lock"}"#).await;
    let info = c1.get(&format!("/v1/session/info/{s0}")).await.json();
    assert_eq!(info[0]["Node"], json!(cluster.clients[0].name), "{info}");
    let acquired = c0
        .put(&format!("/v1/kv/shared/lock?acquire={s0}"), "c0")
        .await;
    assert_eq!(acquired.text(), "true");
    let entry = c1.get("/v1/kv/shared/lock").await.json();
    assert_eq!(entry[0]["Session"], json!(s0), "{entry}");
    let refused = c1
        .put(&format!("/v1/kv/shared/lock?acquire={s1}"), "c1")
        .await;
    assert_eq!(refused.text(), "false");

    // A client agent stops promptly on SIGTERM even while a blocking query waits in it.
    let index = c1.get("/v1/kv/shared/lock").await.index();
    let mut blocked = tokio::spawn(async move {
        c1.try_request(
            reqwest::Method::GET,
            &format!("/v1/kv/shared/lock?index={index}&wait=60s"),
            None,
        )
        .await
    });
    assert_still_blocked(&mut blocked).await;
    let stopping = Instant::now();
    cluster.terminate_client(1).await;
    assert!(stopping.elapsed() < STOP_LIMIT, "{:?}", stopping.elapsed());
    blocked.await.expect("blocked query task").ok();
}

#[tokio::test]
async fn five_servers_tolerate_the_loss_of_two() {
    let mut cluster = Cluster::servers(5).clients(1).start().await;
    let client = cluster.client(0).http();
    client.put_key("five/before", "0").await;

    // Kill the leader and a follower, the one the client talks to first (or its second server
    // when the leader is the first): three of five remain, a majority.
    let leader = cluster.leader().await;
    let follower = if leader == 0 { 1 } else { 0 };
    cluster.kill9(leader).await;
    cluster.kill9(follower).await;
    let new_leader = cluster.leader().await;
    assert!(![leader, follower].contains(&new_leader));
    // The new leader can be in place before the client agent has noticed the loss (a leader
    // found dead by its closed port is replaced within a few hundred milliseconds): a write
    // sent meanwhile to a server that just died has an unknown outcome (500). Once gossip
    // reports both failed, the agent no longer sends anything there.
    let gone = [format!("s{leader}"), format!("s{follower}")];
    eventually(
        Duration::from_secs(30),
        "the client agent to see both servers failed",
        || async {
            let members = client.members().await;
            let failed = |name: &str| {
                members
                    .iter()
                    .any(|m| m["Name"] == name && m["Status"].as_u64() == Some(4))
            };
            gone.iter().all(|name| failed(name)).then_some(())
        },
    )
    .await;

    // Writes through the client still commit, and every remaining server gets them.
    let mut expected = BTreeMap::from([("five/before".to_owned(), "0".to_owned())]);
    for n in 1..=10 {
        let (key, value) = (format!("five/after-{n:02}"), n.to_string());
        client.put_key(&key, &value).await;
        expected.insert(key, value);
    }
    assert_consistent_values(&client, &expected).await;
    for i in cluster.running_servers() {
        await_stale_values(cluster.server(i), &expected).await;
    }
    // Nobody was removed from the configuration: the lost servers are still voters.
    let config = cluster.raft_configuration(new_leader).await;
    assert_eq!(raft_ids(&config).len(), 5, "{config}");
}

#[tokio::test]
async fn restarted_servers_keep_their_keys_and_the_cluster_its_identity() {
    let mut cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let ids = raft_ids(&cluster.raft_configuration(leader).await);
    assert_eq!(ids.len(), 3);
    let mut expected = BTreeMap::new();
    // Writes through any server (followers forward to the leader).
    for n in 0..5 {
        let (key, value) = (format!("keep/initial-{n}"), format!("v{n}"));
        cluster.server(n % 3).put_key(&key, &value).await;
        expected.insert(key, value);
    }

    // A follower stopped gracefully (promptly, although a blocking query forwarded to the
    // leader waits in it) misses a write, then restarts from its data directory and has
    // everything.
    let follower = (leader + 1) % 3;
    let index = cluster
        .server(follower)
        .get("/v1/kv/keep/initial-0")
        .await
        .index();
    let mut blocked = tokio::spawn({
        let follower = cluster.server(follower).http();
        async move {
            let path = format!("/v1/kv/keep/initial-0?index={index}&wait=60s");
            follower
                .try_request(reqwest::Method::GET, &path, None)
                .await
        }
    });
    assert_still_blocked(&mut blocked).await;
    let stopping = Instant::now();
    cluster.terminate(follower).await;
    assert!(stopping.elapsed() < STOP_LIMIT, "{:?}", stopping.elapsed());
    blocked.await.expect("blocked query task").ok();
    let written = ("keep/while-terminated", "t");
    write_while_down(&mut cluster, leader, follower, written, &mut expected).await;

    // The leader killed with -9 likewise.
    cluster.kill9(leader).await;
    let second = cluster.leader().await;
    let written = ("keep/while-killed", "k");
    write_while_down(&mut cluster, second, leader, written, &mut expected).await;
    cluster.leader().await;

    // The whole set down at once (no graceful leave), then up again: one leader, the same
    // three raft IDs (no second bootstrap), every key.
    for i in 0..3 {
        cluster.kill9(i).await;
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    let third = cluster.leader().await;
    for i in 0..3 {
        assert_eq!(raft_ids(&cluster.raft_configuration(i).await), ids);
    }
    assert_consistent_values(cluster.server(third), &expected).await;
    cluster
        .server(third)
        .put_key("keep/after-restart", "r")
        .await;
    expected.insert("keep/after-restart".to_owned(), "r".to_owned());
    for i in 0..3 {
        await_stale_values(cluster.server(i), &expected).await;
    }
}

#[tokio::test]
async fn single_server_with_bootstrap_expect_1_survives_restarts() {
    let mut cluster = Cluster::servers(1).start().await;
    assert_eq!(cluster.leader().await, 0);
    let rpc = cluster.server_rpc(0).to_string();
    let server = cluster.server(0).http();
    assert_eq!(server.get("/v1/status/peers").await.json(), json!([rpc]));
    let ids = raft_ids(&cluster.raft_configuration(0).await);

    server.put_key("solo/a", "1").await;
    let session = create_session(&server, r#"{"Name":"solo","LockDelay":"0s"}"#).await;
    let acquired = server
        .put(&format!("/v1/kv/solo/lock?acquire={session}"), "held")
        .await;
    assert_eq!(acquired.text(), "true");

    // Graceful restart, then a crash: keys, the session and its lock are still there.
    cluster.terminate(0).await;
    cluster.restart(0).await;
    assert_eq!(cluster.leader().await, 0);
    let server = cluster.server(0).http();
    assert_eq!(raw(&server, "solo/a", "").await.as_deref(), Some("1"));
    server.put_key("solo/b", "2").await;
    cluster.kill9(0).await;
    cluster.restart(0).await;
    assert_eq!(cluster.leader().await, 0);
    let server = cluster.server(0).http();
    assert_eq!(raw(&server, "solo/a", "").await.as_deref(), Some("1"));
    assert_eq!(
        raw(&server, "solo/b", "&consistent").await.as_deref(),
        Some("2")
    );
    let lock = server.get("/v1/kv/solo/lock").await.json();
    assert_eq!(lock[0]["Session"], json!(session), "{lock}");
    assert_eq!(raft_ids(&cluster.raft_configuration(0).await), ids);
    server.put_key("solo/c", "3").await;
}

#[tokio::test]
async fn a_client_agent_with_a_certificate_from_another_ca_cannot_use_the_servers() {
    let cluster = Cluster::servers(1).clients(1).start().await;
    let rogue = cluster.foreign_client().await;
    let legit = cluster.client(0).http();

    // The rogue agent's API is up, but nothing it asks reaches a server: status at once, a
    // read and a write after the client's retry window.
    let leader = rogue.get("/v1/status/leader").await;
    assert!(leader.status.is_server_error(), "{leader:?}");
    assert!(
        leader.text().contains("No known Consul servers"),
        "{}",
        leader.text()
    );
    let (read, write, ()) = tokio::join!(
        rogue.get("/v1/kv/rogue/x"),
        rogue.put("/v1/kv/rogue/y", "nope"),
        async {
            // Meanwhile the legitimate client works normally.
            legit.put_key("legit/x", "ok").await;
            assert_eq!(raw(&legit, "legit/x", "").await.as_deref(), Some("ok"));
        }
    );
    for reply in [&read, &write] {
        assert!(reply.status.is_server_error(), "{reply:?}");
        assert!(
            reply.text().contains("No known Consul servers"),
            "{}",
            reply.text()
        );
    }
    assert_eq!(raw(&legit, "rogue/y", "").await, None);
    assert_eq!(keys(&legit, "legit/", "").await, ["legit/x"]);
}
