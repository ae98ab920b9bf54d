//! The herd without its cost, through the HTTP API: a KV `?acquire` refused because another
//! session holds the key, or because of its lock-delay, changes nothing and is answered as a
//! read on the leader, with no raft entry. Many acquirers at once: exactly one wins. Acquires
//! racing a release: never two winners.

use futures::future::join_all;
use integration_tests::{Agent, Http};
use reqwest::StatusCode;
use serde_json::json;

const ACQUIRERS: usize = 20;
/// Rounds a measurement may take: another raft entry (a leader's duty) may land in one.
const ROUNDS: usize = 5;

/// The last index of the raft log of the server behind `http`.
async fn last_log_index(http: &Http) -> u64 {
    let reply = http.get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Stats"]["raft"]["last_log_index"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("Stats.raft.last_log_index in {}", reply.text()))
}

async fn sessions(http: &Http, n: usize, body: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(http.session(body).await);
    }
    ids
}

/// `?acquire` of `key` by each of `sessions` at once: whether each was granted.
async fn acquire_all(http: &Http, key: &str, sessions: &[String]) -> Vec<bool> {
    let tries = sessions.iter().map(|s| {
        let http = http.clone();
        let path = format!("/v1/kv/{key}?acquire={s}");
        tokio::spawn(async move {
            let reply = http.put(&path, "held").await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            reply.json() == json!(true)
        })
    });
    join_all(tries)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// Runs `refusals` (acquires that must all be refused) until a round of them leaves the raft
/// log where it was; panics if none of [`ROUNDS`] does.
async fn refused_without_raft_entries<F, Fut>(http: &Http, mut refusals: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut moved = Vec::new();
    for _ in 0..ROUNDS {
        let before = last_log_index(http).await;
        refusals().await;
        let after = last_log_index(http).await;
        if after == before {
            return;
        }
        moved.push(after - before);
    }
    panic!("refused acquires moved the raft log by {moved:?} entries");
}

#[tokio::test(flavor = "multi_thread")]
async fn of_many_acquirers_at_once_one_wins_and_the_refused_write_nothing() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let ids = sessions(&http, ACQUIRERS, "{}").await;

    // All at once: exactly one is granted, and holds the key.
    let granted = acquire_all(&http, "herd", &ids).await;
    let winners: Vec<&String> = ids
        .iter()
        .zip(&granted)
        .filter_map(|(id, won)| won.then_some(id))
        .collect();
    assert_eq!(winners.len(), 1, "{granted:?}");
    let winner = winners[0].clone();
    assert_eq!(http.holder("herd").await.as_deref(), Some(winner.as_str()));
    let entry = http.kv_entry("herd").await;

    // While it holds the key, the others are refused without a raft entry, and nothing
    // about the key changes.
    let others: Vec<String> = ids.iter().filter(|id| **id != winner).cloned().collect();
    refused_without_raft_entries(&http, || async {
        let granted = acquire_all(&http, "herd", &others).await;
        assert!(granted.iter().all(|won| !won), "{granted:?}");
    })
    .await;
    assert_eq!(http.kv_entry("herd").await, entry);

    // The holder acquiring again is a write, as in Consul: value and flags change.
    http.put_true(&format!("/v1/kv/herd?acquire={winner}&flags=7"), "again")
        .await;
    let again = http.kv_entry("herd").await;
    assert_eq!(again["Flags"], 7);
    assert!(again["ModifyIndex"].as_u64() > entry["ModifyIndex"].as_u64());
    assert_eq!(again["LockIndex"], entry["LockIndex"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_during_lock_delay_is_refused_without_a_raft_entry() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let holder = http.session(r#"{"LockDelay":"60s"}"#).await;
    let other = http.session("{}").await;
    http.acquire_ok("delayed", &holder).await;
    http.destroy_session(&holder).await;
    assert_eq!(http.holder("delayed").await, None);

    refused_without_raft_entries(&http, || async {
        let reply = http.acquire("delayed", &other).await;
        assert_eq!(reply.json(), json!(false));
        assert!(!reply.lock_delay_remaining().is_zero());
    })
    .await;
    assert_eq!(http.holder("delayed").await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn acquires_racing_a_release_never_grant_two_sessions() {
    let agent = Agent::dev().await;
    let http = agent.http();
    // No lock-delay: a release hands the key straight on.
    let ids = sessions(&http, 8, r#"{"LockDelay":"0s"}"#).await;
    let mut holder = ids[0].clone();
    http.acquire_ok("race", &holder).await;
    for round in 0..10 {
        let others: Vec<String> = ids.iter().filter(|id| **id != holder).cloned().collect();
        let release = {
            let http = http.clone();
            let path = format!("/v1/kv/race?release={holder}");
            tokio::spawn(async move { http.put(&path, "free").await })
        };
        let granted = acquire_all(&http, "race", &others).await;
        assert_eq!(release.await.unwrap().json(), json!(true), "round {round}");
        let winners: Vec<&String> = others
            .iter()
            .zip(&granted)
            .filter_map(|(id, won)| won.then_some(id))
            .collect();
        assert!(winners.len() <= 1, "round {round}: {winners:?}");
        let now = http.holder("race").await;
        assert_eq!(now.as_ref(), winners.first().copied(), "round {round}");
        holder = match now {
            Some(id) => id,
            None => {
                http.acquire_ok("race", &ids[round % ids.len()]).await;
                ids[round % ids.len()].clone()
            }
        };
    }
}
