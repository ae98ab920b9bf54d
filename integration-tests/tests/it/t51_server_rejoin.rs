//! A server away for longer than autopilot waits comes back as a voter: paused with SIGSTOP for
//! 60 s (the leader, at the worst moment), or killed with SIGKILL and restarted 60 s later on
//! its data directory, it is removed as dead meanwhile, and within 30 s of its return the
//! configuration has three voters again and the server has what was written while it was away.
//! Its return costs no election: the others' raft term does not move (Pre-Vote keeps the
//! returning server from raising its own).

use std::collections::BTreeSet;
use std::time::Duration;

use integration_tests::cluster::{Cluster, raft_voters};
use integration_tests::eventually;
use reqwest::StatusCode;
use tokio::time::Instant;

use crate::common::exclusive;

/// How long the server stays away: well past autopilot's 30 s.
const AWAY: Duration = Duration::from_secs(60);
/// How long autopilot may take to remove it (30 s of gossip `failed` plus its 5 s period).
const REMOVAL_LIMIT: Duration = Duration::from_secs(55);
/// How soon after its return it must be a voter again.
const REJOIN_LIMIT: Duration = Duration::from_secs(30);

/// The voters as server `at` reports them, `None` while it cannot say (no leader, say).
async fn voters_at(cluster: &Cluster, at: usize) -> Option<BTreeSet<String>> {
    let reply = cluster
        .server(at)
        .try_get("/v1/operator/raft/configuration")
        .await?;
    (reply.status == StatusCode::OK).then(|| raft_voters(&reply.json()))
}

/// Waits until server `at` reports exactly `expected` as the voters, within `limit`.
async fn await_voters(cluster: &Cluster, at: usize, expected: &[&str], limit: Duration) {
    let expected: BTreeSet<String> = expected.iter().map(|n| (*n).to_owned()).collect();
    eventually(limit, &format!("voters {expected:?}"), || async {
        (voters_at(cluster, at).await.as_ref() == Some(&expected)).then_some(())
    })
    .await;
}

/// Server `at`'s raft term, from `/v1/agent/self`.
async fn term(cluster: &Cluster, at: usize) -> u64 {
    let reply = cluster.server(at).get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Stats"]["raft"]["term"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("Stats.raft.term in {}", reply.text()))
}

/// Writes `key` through server `at` until it is acknowledged (an election may be under way).
async fn write(cluster: &Cluster, at: usize, key: &str) {
    eventually(
        Duration::from_secs(30),
        &format!("a write of {key}"),
        || {
            let http = cluster.server(at).http();
            async move {
                let reply = http
                    .try_request(
                        reqwest::Method::PUT,
                        &format!("/v1/kv/{key}"),
                        Some(b"v".to_vec()),
                    )
                    .await
                    .ok()?;
                (reply.status == StatusCode::OK && reply.text() == "true").then_some(())
            }
        },
    )
    .await;
}

/// Waits until server `at` has `key` in its own state (`?stale`).
async fn await_key(cluster: &Cluster, at: usize, key: &str) {
    eventually(REJOIN_LIMIT, &format!("{key} on server {at}"), || async {
        let reply = cluster
            .server(at)
            .try_get(&format!("/v1/kv/{key}?stale"))
            .await?;
        (reply.status == StatusCode::OK).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_paused_past_autopilot_rejoins_as_a_voter() {
    let _heavy = exclusive().await;
    // Phase 1: three servers; the leader is the one to freeze.
    let cluster = Cluster::servers(3).start().await;
    let paused = cluster.leader().await;
    let others: Vec<usize> = (0..3).filter(|i| *i != paused).collect();
    let names: Vec<String> = (0..3).map(|i| format!("s{i}")).collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let rest: Vec<&str> = others.iter().map(|i| all[*i]).collect();
    write(&cluster, others[0], "before").await;

    // Phase 2: frozen, it is removed as dead by the two others, which take writes meanwhile.
    cluster.pause(paused);
    let paused_at = Instant::now();
    await_voters(&cluster, others[0], &rest, REMOVAL_LIMIT).await;
    write(&cluster, others[0], "while-away").await;
    tokio::time::sleep_until(paused_at + AWAY).await;
    let before = term(&cluster, others[0]).await;

    // Phase 3: thawed, it is a voter again within the limit, and has the write it missed; no
    // election was held for it.
    cluster.resume(paused);
    await_voters(&cluster, others[0], &all, REJOIN_LIMIT).await;
    await_voters(&cluster, paused, &all, REJOIN_LIMIT).await;
    await_key(&cluster, paused, "while-away").await;
    cluster.leader().await;
    write(&cluster, paused, "after").await;
    for i in 0..3 {
        assert_eq!(term(&cluster, i).await, before, "server {i}'s term");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_and_restarted_past_autopilot_rejoins_as_a_voter() {
    let _heavy = exclusive().await;
    // Phase 1: three servers; a follower is the one to kill.
    let mut cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let killed = (0..3).find(|i| *i != leader).expect("a follower");
    let names: Vec<String> = (0..3).map(|i| format!("s{i}")).collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let rest: Vec<&str> = (0..3).filter(|i| *i != killed).map(|i| all[i]).collect();

    // Phase 2: killed, it is removed as dead; writes go on.
    cluster.kill9(killed).await;
    let killed_at = Instant::now();
    await_voters(&cluster, leader, &rest, REMOVAL_LIMIT).await;
    write(&cluster, leader, "while-away").await;
    tokio::time::sleep_until(killed_at + AWAY).await;
    let before = term(&cluster, leader).await;

    // Phase 3: restarted on its data directory (its log still names it a voter), it is one
    // again within the limit and catches up, and the leader stayed the leader throughout.
    cluster.restart(killed).await;
    await_voters(&cluster, leader, &all, REJOIN_LIMIT).await;
    await_voters(&cluster, killed, &all, REJOIN_LIMIT).await;
    await_key(&cluster, killed, "while-away").await;
    write(&cluster, killed, "after").await;
    assert_eq!(cluster.leader().await, leader);
    for i in 0..3 {
        assert_eq!(term(&cluster, i).await, before, "server {i}'s term");
    }
}
