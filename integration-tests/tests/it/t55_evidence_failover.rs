//! Leader failover on evidence of death, `lan` timing, 3 servers and a client agent: after a
//! `kill -9` of the leader a follower finds the leader's port closed and campaigns at once
//! (`vigil.raft.elections_on_evidence`), and a write through the client agent succeeds; a
//! follower frozen for 4 s (SIGSTOP) and resumed finds no evidence, and the leader keeps its
//! term; a leader frozen for 1.5 s still owns its port, and nobody campaigns against it.
//!
//! The failover's times are printed (`cargo test -- --nocapture` shows them); they are the
//! benchmark's business, not asserted here.

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Http, eventually};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use crate::common::exclusive;

const ON_EVIDENCE: &str = "vigil.raft.elections_on_evidence";

async fn metrics(agent: &Http) -> Option<Value> {
    let reply = agent.try_get("/v1/agent/metrics").await?;
    (reply.status == StatusCode::OK).then(|| reply.json())
}

/// A counter's sum (0 when it was never incremented).
fn counter(metrics: &Value, name: &str) -> f64 {
    metrics["Counters"]
        .as_array()
        .and_then(|all| all.iter().find(|m| m["Name"] == name))
        .and_then(|m| m["Sum"].as_f64())
        .unwrap_or(0.0)
}

fn gauge(metrics: &Value, name: &str) -> Option<f64> {
    metrics["Gauges"]
        .as_array()?
        .iter()
        .find(|g| g["Name"] == name)
        .and_then(|g| g["Value"].as_f64())
}

/// The raft term server `i` reports.
async fn term(cluster: &Cluster, i: usize) -> f64 {
    eventually(Duration::from_secs(10), "the raft term", || async {
        gauge(
            &metrics(&cluster.server(i).http()).await?,
            "vigil.raft.term",
        )
    })
    .await
}

/// Evidence-driven campaigns counted by the running servers.
async fn campaigns_on_evidence(cluster: &Cluster) -> f64 {
    let mut sum = 0.0;
    for i in cluster.running_servers() {
        let m = eventually(Duration::from_secs(10), "the metrics", || async {
            metrics(&cluster.server(i).http()).await
        })
        .await;
        sum += counter(&m, ON_EVIDENCE);
    }
    sum
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_leader_is_replaced_on_evidence_and_writes_resume() {
    let _heavy = exclusive().await;
    let mut cluster = Cluster::servers(3)
        .gossip_profile("lan")
        .clients(1)
        .start()
        .await;
    let client = cluster.client(0).http();
    client.put_true("/v1/kv/failover/before", "1").await;
    let leader = cluster.leader().await;
    let old_term = term(&cluster, leader).await;
    assert_eq!(campaigns_on_evidence(&cluster).await, 0.0);

    let survivors: Vec<Http> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| cluster.server(i).http())
        .collect();
    let dead = cluster.server_rpc(leader).to_string();
    cluster.kill9(leader).await;
    let killed = Instant::now();
    eprintln!("leader killed at {:?}", std::time::SystemTime::now());
    // When the survivors agree on a new leader, measured beside the writes.
    let elected = tokio::spawn(async move {
        eventually(
            Duration::from_secs(30),
            "the survivors to agree on a new leader",
            || {
                let survivors = survivors.clone();
                let dead = dead.clone();
                async move {
                    let mut named = Vec::new();
                    for s in &survivors {
                        let reply = s.try_get("/v1/status/leader").await?;
                        named.push(reply.json().as_str()?.to_owned());
                    }
                    let agreed = named
                        .iter()
                        .all(|n| *n == named[0] && !n.is_empty() && *n != dead);
                    agreed.then(|| killed.elapsed())
                }
            },
        )
        .await
    });
    // Each attempt waits for its answer: a write the agent could not place answers 5xx.
    let written = eventually(
        Duration::from_secs(30),
        "a write through the client agent",
        || {
            let client = client.clone();
            async move {
                let reply = client.put("/v1/kv/failover/after", "2").await;
                (reply.status == StatusCode::OK && reply.text().trim() == "true")
                    .then(|| killed.elapsed())
            }
        },
    )
    .await;
    let elected = elected.await.expect("the leader poll");
    let new_leader = cluster.leader().await;
    eprintln!(
        "kill -9 of the leader → new leader agreed {:.3} s, first write through the client agent {:.3} s",
        elected.as_secs_f64(),
        written.as_secs_f64(),
    );
    assert_ne!(new_leader, leader);
    assert!(term(&cluster, new_leader).await > old_term);
    // A follower found the leader's port closed and campaigned, rather than wait out its lease
    // and election timeout.
    assert!(
        campaigns_on_evidence(&cluster).await >= 1.0,
        "no server campaigned on evidence of the leader's death"
    );
    assert_eq!(
        client.get("/v1/kv/failover/after?raw").await.text(),
        "2",
        "the write is readable"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_paused_and_resumed_does_not_disturb_a_healthy_leader() {
    let _heavy = exclusive().await;
    let cluster = Cluster::servers(3).gossip_profile("lan").start().await;
    let leader = cluster.leader().await;
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let before = term(&cluster, leader).await;

    cluster.pause(follower);
    // Longer than the follower's leader lease plus its largest election timeout (2 s + 2 s with
    // `lan`): on waking it finds its election timer long expired.
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.resume(follower);

    // It catches up with the same leader in the same term...
    eventually(
        Duration::from_secs(10),
        "the resumed follower to follow the leader",
        || async {
            let named = cluster
                .server(follower)
                .try_get("/v1/status/leader")
                .await?;
            let same = named.json().as_str()? == cluster.server_rpc(leader).to_string();
            let term = gauge(
                &metrics(&cluster.server(follower).http()).await?,
                "vigil.raft.term",
            )?;
            (same && term == before).then_some(())
        },
    )
    .await;
    // ...and for the longest an election it might start could take (its lease plus election
    // timeout again), the leader keeps its term and nobody claims evidence.
    let watch_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < watch_until {
        assert_eq!(cluster.leader().await, leader, "leadership changed");
        assert_eq!(
            term(&cluster, leader).await,
            before,
            "the leader's term changed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(campaigns_on_evidence(&cluster).await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_leader_is_not_taken_for_dead() {
    let _heavy = exclusive().await;
    let cluster = Cluster::servers(3)
        .gossip_profile("lan")
        .clients(1)
        .start()
        .await;
    let leader = cluster.leader().await;
    let before = term(&cluster, leader).await;

    // Stopped for 1.5 s: its followers miss ten heartbeats and check its port, which the
    // stopped process still owns (no refusal), and their lease plus election timeout (at
    // least 3 s under `lan`) does not run out.
    cluster.pause(leader);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.resume(leader);

    // It leads on in the same term, and writes go through it again.
    cluster
        .client(0)
        .http()
        .put_true("/v1/kv/stopped/after", "1")
        .await;
    assert_eq!(cluster.leader().await, leader, "leadership changed");
    assert_eq!(
        term(&cluster, leader).await,
        before,
        "the leader's term changed"
    );
    assert_eq!(campaigns_on_evidence(&cluster).await, 0.0);
}
