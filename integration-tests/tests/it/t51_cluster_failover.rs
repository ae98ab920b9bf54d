//! Leader failover in a 3-server set of real processes: `kill -9` of the leader under
//! concurrent writes loses no acknowledged write and the killed server catches up after a
//! restart; TTL sessions renewed through a client agent and lock-delay survive the failover
//! (docs/consul-compatibility.md#deliberate-differences, 4 and 5); a blocking query through a
//! client agent survives the loss of the server it was waiting on.
//!
//! The measured failover times are printed (`cargo test -- --nocapture` shows them).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use integration_tests::cluster::{Cluster, create_session, keys};
use integration_tests::{Http, Reply, SHORT_SESSION_TTL, eventually};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::time::{Instant, sleep, timeout};

use crate::common::exclusive;

/// A new leader must be in place (every live server naming it) within this.
const FAILOVER_LIMIT: Duration = Duration::from_secs(10);

/// A write whose request may be lost with a killed server answers 5xx (its outcome is
/// unknown); writes here are idempotent, so they are repeated until they get an answer.
async fn put_until_answered(agent: &Http, path: &str, body: &str) -> Reply {
    eventually(
        Duration::from_secs(30),
        "a write to be answered",
        || async {
            let reply = agent.put(path, body).await;
            (!reply.status.is_server_error()).then_some(reply)
        },
    )
    .await
}

/// Every entry under `prefix` (`?recurse&consistent`), key to decoded value.
async fn entries(agent: &Http, prefix: &str) -> BTreeMap<String, String> {
    let reply = agent
        .get(&format!("/v1/kv/{prefix}?recurse&consistent"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply
        .json()
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let key = e["Key"].as_str().expect("Key").to_owned();
            let value = base64::engine::general_purpose::STANDARD
                .decode(e["Value"].as_str().unwrap_or_default())
                .expect("base64 value");
            (key, String::from_utf8(value).expect("UTF-8 value"))
        })
        .collect()
}

const WRITERS: usize = 8;
const KEYS_PER_WRITER: usize = 40;

/// What the writers saw: each acknowledged key with when it was acknowledged, and every answer
/// that was not `200 true`.
#[derive(Default)]
struct Log {
    acked: Vec<(String, Instant)>,
    failed: Vec<String>,
}

/// Writes `load/w<w>/k<n>` = its own key name, each until acknowledged.
async fn writer(agent: Http, w: usize, log: Arc<Mutex<Log>>) {
    for n in 0..KEYS_PER_WRITER {
        let key = format!("load/w{w}/k{n:03}");
        let deadline = Instant::now() + Duration::from_secs(45);
        loop {
            let answer = agent
                .try_request(
                    Method::PUT,
                    &format!("/v1/kv/{key}"),
                    Some(key.clone().into_bytes()),
                )
                .await;
            let failure = match answer {
                Ok(reply) if reply.status == StatusCode::OK && reply.text() == "true" => {
                    let mut log = log.lock().expect("log");
                    log.acked.push((key.clone(), Instant::now()));
                    break;
                }
                Ok(reply) => format!("{key}: {} {}", reply.status, reply.text()),
                Err(e) => format!("{key}: {e}"),
            };
            log.lock().expect("log").failed.push(failure);
            assert!(
                Instant::now() < deadline,
                "writer {w} could not write {key}"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn acknowledged_writes_survive_a_leader_kill_under_load() {
    let _heavy = exclusive().await;
    let mut cluster = Cluster::servers(3).clients(2).start().await;
    let leader = cluster.leader().await;
    let clients = [cluster.client(0).http(), cluster.client(1).http()];

    // Eight writers through the two clients; the leader is killed once a quarter is in.
    let log = Arc::new(Mutex::new(Log::default()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(clients[w % 2].clone(), w, Arc::clone(&log))))
        .collect();
    let total = WRITERS * KEYS_PER_WRITER;
    eventually(
        Duration::from_secs(30),
        "a quarter of the writes",
        || async { (log.lock().expect("log").acked.len() >= total / 4).then_some(()) },
    )
    .await;
    let killed_at = Instant::now();
    cluster.kill9(leader).await;
    let before_kill = log.lock().expect("log").acked.len();
    let new_leader = cluster.leader_within(FAILOVER_LIMIT).await;
    let failover = killed_at.elapsed();
    assert_ne!(new_leader, leader);
    assert!(before_kill < total, "the writers finished before the kill");

    for writer in writers {
        timeout(Duration::from_secs(90), writer)
            .await
            .expect("writers finish")
            .expect("writer task");
    }
    let log = Arc::into_inner(log)
        .expect("writers are done")
        .into_inner()
        .expect("log");
    assert_eq!(log.acked.len(), total);
    // The longest time without any acknowledgement after the kill: the write outage.
    let mut times: Vec<Instant> = log.acked.iter().map(|(_, at)| *at).collect();
    times.push(killed_at);
    times.sort();
    let outage = times
        .windows(2)
        .filter(|w| w[1] > killed_at)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!(
        "leader kill under load: new leader after {failover:?}; longest gap between \
         acknowledged writes {outage:?}; {} writes answered other than `true` (retried): {:?}",
        log.failed.len(),
        log.failed.iter().take(5).collect::<Vec<_>>()
    );

    // Every acknowledged write is there, read linearizably through either client.
    for client in &clients {
        let stored = entries(client, "load/").await;
        for (key, _) in &log.acked {
            assert_eq!(
                stored.get(key),
                Some(key),
                "acknowledged {key} through {}",
                client.base
            );
        }
        assert_eq!(stored.len(), total);
    }

    // The killed server restarts from its data directory and catches up.
    let restarting = Instant::now();
    cluster.restart(leader).await;
    let restarted = cluster.server(leader).http();
    let expected: Vec<String> = entries(&clients[0], "load/").await.into_keys().collect();
    eventually(
        Duration::from_secs(30),
        "the restarted server to hold every key",
        || async { (keys(&restarted, "load/", "&stale").await == expected).then_some(()) },
    )
    .await;
    let caught_up = restarting.elapsed();
    let last_leader = cluster.leader().await;
    eprintln!(
        "restarted server caught up after {caught_up:?}; leader then {}",
        if last_leader == new_leader {
            "unchanged"
        } else {
            "changed"
        }
    );
}

#[tokio::test]
async fn ttl_sessions_and_lock_delay_survive_a_leader_failover() {
    let mut cluster = Cluster::servers(3)
        .clients(1)
        .env(SHORT_SESSION_TTL)
        .start()
        .await;
    let client = cluster.client(0).http();

    // A lock held by a session with a 10 s lock-delay, and a contender without one.
    let holder = create_session(&client, r#"{"Name":"holder","LockDelay":"10s"}"#).await;
    let contender = create_session(&client, r#"{"Name":"contender","LockDelay":"0s"}"#).await;
    let acquire = |session: &str| format!("/v1/kv/lock/delayed?acquire={session}");
    assert_eq!(client.put(&acquire(&holder), "h").await.text(), "true");

    // Two 3 s TTL sessions: one renewed every second through the client, one left alone.
    let renewed = create_session(&client, r#"{"Name":"renewed","TTL":"3s"}"#).await;
    let unrenewed = create_session(&client, r#"{"Name":"unrenewed","TTL":"3s"}"#).await;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let renewer = tokio::spawn({
        let client = client.clone();
        let path = format!("/v1/session/renew/{renewed}");
        async move {
            let (mut renewals, mut failures) = (0, Vec::new());
            loop {
                match client.try_request(Method::PUT, &path, None).await {
                    Ok(reply) if reply.status == StatusCode::OK => renewals += 1,
                    Ok(reply) => failures.push(format!("{} {}", reply.status, reply.text())),
                    Err(e) => failures.push(e.to_string()),
                }
                tokio::select! {
                    _ = stopped.changed() => return (renewals, failures),
                    () = sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    });

    // Destroying the holder releases the lock and starts its lock-delay.
    let destroy = client
        .put(&format!("/v1/session/destroy/{holder}"), "")
        .await;
    assert_eq!(destroy.json(), json!(true));
    let destroyed_at = Instant::now();
    let refused = client.put(&acquire(&contender), "c").await;
    assert_eq!(refused.text(), "false");
    refused.lock_delay_remaining();

    // Kill the leader.
    let leader = cluster.leader().await;
    let killed_at = Instant::now();
    cluster.kill9(leader).await;
    cluster.leader_within(FAILOVER_LIMIT).await;
    let failover = killed_at.elapsed();

    // The new leader still refuses the lock, and says for how long...
    let refused = put_until_answered(&client, &acquire(&contender), "c").await;
    let checked_at = destroyed_at.elapsed();
    assert!(
        checked_at < Duration::from_secs(9),
        "failover took too long ({checked_at:?}) to observe the 10 s lock-delay"
    );
    assert_eq!(refused.status, StatusCode::OK);
    assert_eq!(refused.text(), "false");
    let remaining = refused.lock_delay_remaining();
    assert!(
        remaining > Duration::ZERO && remaining <= Duration::from_secs(10),
        "{remaining:?}"
    );
    // ...until the delay has passed; then the contender gets it.
    let acquired_after = loop {
        let reply = put_until_answered(&client, &acquire(&contender), "c").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        if reply.text() == "true" {
            break destroyed_at.elapsed();
        }
        assert_eq!(reply.text(), "false");
        reply.lock_delay_remaining();
        assert!(
            destroyed_at.elapsed() < Duration::from_secs(20),
            "lock-delay never ended"
        );
        sleep(Duration::from_millis(250)).await;
    };
    assert!(
        acquired_after >= Duration::from_secs(9),
        "acquired {acquired_after:?} after the destroy, before the 10 s lock-delay"
    );

    // The new leader runs TTL timers: the unrenewed session expires (within 2 × TTL of the
    // new leadership, plus slack)...
    eventually(
        Duration::from_secs(20),
        "the unrenewed session to expire",
        || async { (client.session_info(&unrenewed).await == json!([])).then_some(()) },
    )
    .await;
    // ...while the session renewed through the election is still there.
    let info = client.session_info(&renewed).await;
    assert_eq!(info[0]["ID"], json!(renewed), "{info}");
    stop.send(true).expect("renewer runs");
    let (renewals, failures) = renewer.await.expect("renewer");
    assert!(failures.is_empty(), "renewals failed: {failures:?}");
    eprintln!(
        "TTL/lock-delay failover: new leader after {failover:?}; lock-delay checked \
         {checked_at:?} and lock acquired {acquired_after:?} after the destroy; {renewals} renewals"
    );
}

#[tokio::test]
async fn a_blocking_query_through_a_client_survives_its_server_being_killed() {
    let mut cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    // The client knows two servers and talks to the first: the leader, where the query waits.
    let c = cluster.add_client(&[leader, (leader + 1) % 3]).await;
    let client = cluster.client(c).http();
    client.put_key("watch/key", "before").await;
    let index = client.get("/v1/kv/watch/key").await.index();

    let mut watcher = tokio::spawn({
        let client = client.clone();
        async move {
            let reply = client
                .get(&format!("/v1/kv/watch/key?index={index}&wait=30s"))
                .await;
            (reply, Instant::now())
        }
    });
    // It blocks...
    assert!(
        timeout(Duration::from_millis(500), &mut watcher)
            .await
            .is_err(),
        "the blocking query returned before anything changed"
    );
    // ...and keeps blocking when its server dies and another leader takes over...
    let killed_at = Instant::now();
    cluster.kill9(leader).await;
    let new_leader = cluster.leader_within(FAILOVER_LIMIT).await;
    let failover = killed_at.elapsed();
    assert!(
        !watcher.is_finished(),
        "the blocking query returned when its server was killed"
    );
    // ...and returns with the change once the key is written.
    cluster
        .server(new_leader)
        .put_key("watch/key", "after")
        .await;
    let written_at = Instant::now();
    let (reply, returned_at) = timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the blocking query did not return after the write")
        .expect("watcher task");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(reply.index() > index);
    let entry = &reply.json()[0];
    assert_eq!(entry["Value"], json!("YWZ0ZXI="), "{entry}");
    eprintln!(
        "blocking query: new leader after {failover:?}; returned {:?} after the write",
        returned_at - written_at
    );
}
