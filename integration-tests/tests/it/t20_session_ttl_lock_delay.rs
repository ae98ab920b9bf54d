//! Session TTLs and lock-delay against a real dev agent (`session_ttl_min` 1s): expiry between
//! TTL and 2×TTL, renewals keeping a session alive, blocking reads waking on expiry, held keys
//! released on expiry, and lock-delay refusing acquires (`200 false` + `X-Vigil-Lock-Delay`)
//! until it passes, capped at 60 s, disabled by 0, never set by a voluntary release.
//! Mirrors docs/consul-compatibility.md#invalidation, #session-ttl, #lock-delay and
//! #consul-tests-mirrored (`TestKVS_Apply_LockDelay`).

use std::time::{Duration, Instant};

use integration_tests::{Agent, eventually};
use reqwest::StatusCode;
use serde_json::json;

use crate::common::assert_not_found;

/// The 1 s TTL used throughout: the agent's minimum here.
const TTL: Duration = Duration::from_secs(1);
/// Room for raft and scheduling on a busy machine, on top of Consul's TTL × 2.
const SLACK: Duration = Duration::from_secs(5);

/// `key` is held by `session`, granted the second time (LockIndex 2).
async fn assert_second_grant(agent: &Agent, key: &str, session: &str) {
    let entry = agent.kv_entry(key).await;
    assert_eq!(entry["Session"], json!(session), "{key}");
    assert_eq!(entry["LockIndex"], json!(2), "{key}");
}

#[tokio::test]
async fn unrenewed_ttl_session_expires_between_ttl_and_twice_ttl() {
    // A 1 s TTL session is created and echoes its TTL string.
    let agent = Agent::dev().await;
    let created = Instant::now();
    let id = agent.session(r#"{"TTL":"1s"}"#).await;
    let session = agent.session_info(&id).await;
    assert_eq!(session[0]["TTL"], json!("1s"));

    // Without renewals it disappears, within TTL × 2 plus slack …
    eventually(
        TTL * 2 + SLACK,
        "the unrenewed session to expire",
        || async { (agent.session_info(&id).await == json!([])).then_some(()) },
    )
    .await;

    // … but never before its TTL (the leader arms TTL × 2).
    assert!(
        created.elapsed() >= TTL,
        "expired after only {:?}",
        created.elapsed()
    );
    assert_eq!(agent.get("/v1/session/list").await.json(), json!([]));

    // Renewing it now is a 404.
    let reply = agent.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.text(), format!("Session id '{id}' not found"));
}

#[tokio::test]
async fn renewed_ttl_session_survives_then_expires_when_renewals_stop() {
    // Renewing every 400 ms (well under the 1 s TTL) for over 3 s, three times TTL, keeps the
    // session alive; each renew returns the session with its TTL.
    let agent = Agent::dev().await;
    let id = agent.session(r#"{"TTL":"1s","Name":"renewed"}"#).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(3200) {
        let reply = agent.put(&format!("/v1/session/renew/{id}"), "").await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "renew after {:?}: {}",
            started.elapsed(),
            reply.text()
        );
        let renewed = reply.json();
        assert_eq!(renewed[0]["ID"], json!(id));
        assert_eq!(renewed[0]["TTL"], json!("1s"));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(agent.session_info(&id).await[0]["Name"], json!("renewed"));

    // Once renewals stop, it expires like any other.
    eventually(TTL * 2 + SLACK, "the session to expire", || async {
        (agent.session_info(&id).await == json!([])).then_some(())
    })
    .await;
}

#[tokio::test]
async fn ttl_expiry_wakes_blocking_info_and_releases_held_key() {
    // A 1 s TTL session holds a key.
    let agent = Agent::dev().await;
    let id = agent.session(r#"{"TTL":"1s","LockDelay":"0s"}"#).await;
    assert_eq!(agent.acquire("ttl-held", &id).await.json(), json!(true));
    let held = agent.kv_entry("ttl-held").await;
    assert_eq!(held["Session"], json!(id));

    // A blocking info on it returns `[]` with a higher index when the TTL expires it.
    let reply = agent.get(&format!("/v1/session/info/{id}")).await;
    let index = reply.index();
    let started = Instant::now();
    let woken = agent
        .get(&format!("/v1/session/info/{id}?index={index}&wait=60s"))
        .await;
    assert_eq!(woken.status, StatusCode::OK);
    assert_eq!(woken.json(), json!([]));
    assert!(woken.index() > index);
    assert!(
        started.elapsed() < TTL * 2 + SLACK,
        "woke after {:?}",
        started.elapsed()
    );

    // The expiry released the key at the expiry's index, keeping its LockIndex.
    let released = agent.kv_entry("ttl-held").await;
    assert!(released.get("Session").is_none(), "{released}");
    assert_eq!(released["LockIndex"], json!(1));
    assert_eq!(released["ModifyIndex"], json!(woken.index()));

    // With no lock-delay, another session takes it at once.
    let other = agent.session("{}").await;
    assert_eq!(agent.acquire("ttl-held", &other).await.json(), json!(true));
    assert_eq!(agent.kv_entry("ttl-held").await["LockIndex"], json!(2));
}

#[tokio::test]
async fn ttl_expiry_applies_lock_delay() {
    // A TTL session with a 10 s lock-delay holds a key and is left to expire.
    let agent = Agent::dev().await;
    let id = agent.session(r#"{"TTL":"1s","LockDelay":"10s"}"#).await;
    assert_eq!(agent.acquire("ttl-delay", &id).await.json(), json!(true));
    eventually(TTL * 2 + SLACK, "the session to expire", || async {
        (agent.session_info(&id).await == json!([])).then_some(())
    })
    .await;

    // Invalidation by expiry sets lock-delay like a destroy does: a new session is refused.
    let other = agent.session("{}").await;
    let refused = agent.acquire("ttl-delay", &other).await;
    assert_eq!(refused.json(), json!(false));
    let remaining = refused.lock_delay_remaining();
    assert!(
        remaining > Duration::ZERO && remaining <= Duration::from_secs(10),
        "{remaining:?}"
    );
    assert!(
        agent.kv_entry("ttl-delay").await.get("Session").is_none(),
        "the key is released, not held by the new session"
    );
}

#[tokio::test]
async fn lock_delay_refuses_acquire_until_it_passes() {
    // A session with a 1 s lock-delay holds a key, then is destroyed.
    let agent = Agent::dev().await;
    let delay = Duration::from_secs(1);
    let holder = agent.session(r#"{"LockDelay":"1s"}"#).await;
    let contender = agent.session("{}").await;
    assert_eq!(agent.acquire("delayed", &holder).await.json(), json!(true));
    let destroyed_at = Instant::now();
    agent.destroy_session(&holder).await;

    // An immediate acquire by a brand-new session is `200 false`, saying how long is left.
    let refused = agent.acquire("delayed", &contender).await;
    assert_eq!(refused.json(), json!(false));
    let remaining = refused.lock_delay_remaining();
    assert!(
        remaining > Duration::ZERO && remaining <= delay,
        "{remaining:?}"
    );
    assert!(
        agent.kv_entry("delayed").await.get("Session").is_none(),
        "refused, so unheld"
    );

    // Lock-delay blocks only acquire: plain writes and reads proceed.
    let write = agent.put("/v1/kv/delayed", "plain").await;
    assert_eq!(write.json(), json!(true));
    assert_eq!(write.header("X-Vigil-Lock-Delay"), None);

    // Once the delay has passed the same acquire succeeds, never earlier.
    eventually(
        delay + Duration::from_secs(5),
        "lock-delay to pass",
        || async {
            let reply = agent.acquire("delayed", &contender).await;
            (reply.json() == json!(true)).then_some(())
        },
    )
    .await;
    assert!(
        destroyed_at.elapsed() >= delay,
        "acquired {:?} after the destroy",
        destroyed_at.elapsed()
    );
    assert_second_grant(&agent, "delayed", &contender).await;
}

#[tokio::test]
async fn delete_behaviour_sets_lock_delay_on_the_deleted_key() {
    // A delete-behaviour session with a 10 s lock-delay holds a key and is destroyed.
    let agent = Agent::dev().await;
    let holder = agent
        .session(r#"{"Behavior":"delete","LockDelay":"10s"}"#)
        .await;
    assert_eq!(agent.acquire("gone", &holder).await.json(), json!(true));
    agent.destroy_session(&holder).await;

    // The key is deleted, and an acquire that would recreate it is still refused.
    assert_not_found(&agent, "/v1/kv/gone").await;
    let contender = agent.session("{}").await;
    let refused = agent.acquire("gone", &contender).await;
    assert_eq!(refused.json(), json!(false));
    assert!(refused.lock_delay_remaining() <= Duration::from_secs(10));
    assert_not_found(&agent, "/v1/kv/gone").await;
}

#[tokio::test]
async fn zero_lock_delay_allows_immediate_reacquire() {
    // With `LockDelay: 0` a destroyed holder's key is free at once.
    let agent = Agent::dev().await;
    let holder = agent.session(r#"{"LockDelay":0}"#).await;
    assert_eq!(agent.acquire("nodelay", &holder).await.json(), json!(true));
    agent.destroy_session(&holder).await;

    // A new session acquires immediately, with no lock-delay header, and LockIndex moves on.
    let contender = agent.session("{}").await;
    let reply = agent.acquire("nodelay", &contender).await;
    assert_eq!(reply.json(), json!(true));
    assert_eq!(reply.header("X-Vigil-Lock-Delay"), None);
    assert_second_grant(&agent, "nodelay", &contender).await;
}

#[tokio::test]
async fn lock_delay_is_capped_at_sixty_seconds() {
    // A 120 s lock-delay is stored as given …
    let agent = Agent::dev().await;
    let holder = agent.session(r#"{"LockDelay":"120s"}"#).await;
    assert_eq!(
        agent.session_info(&holder).await[0]["LockDelay"],
        json!(120_000_000_000u64)
    );
    assert_eq!(agent.acquire("capped", &holder).await.json(), json!(true));
    agent.destroy_session(&holder).await;

    // … but applied as at most 60 s.
    let contender = agent.session("{}").await;
    let refused = agent.acquire("capped", &contender).await;
    assert_eq!(refused.json(), json!(false));
    let remaining = refused.lock_delay_remaining();
    assert!(
        remaining <= Duration::from_secs(60) && remaining > Duration::from_secs(30),
        "{remaining:?}"
    );
}

#[tokio::test]
async fn voluntary_release_sets_no_lock_delay() {
    // A holder with the default 15 s lock-delay releases its key itself.
    let agent = Agent::dev().await;
    let holder = agent.session("{}").await;
    assert_eq!(agent.acquire("handoff", &holder).await.json(), json!(true));
    let reply = agent
        .put(&format!("/v1/kv/handoff?release={holder}"), "")
        .await;
    assert_eq!(reply.json(), json!(true));

    // Another session acquires at once: only invalidation sets a lock-delay.
    let contender = agent.session("{}").await;
    let reply = agent.acquire("handoff", &contender).await;
    assert_eq!(reply.json(), json!(true));
    assert_eq!(reply.header("X-Vigil-Lock-Delay"), None);
    assert_eq!(agent.kv_entry("handoff").await["LockIndex"], json!(2));
}

#[tokio::test]
async fn lock_delay_min_raises_a_waived_lock_delay_and_defaults_to_consuls() {
    // By default a client may waive lock-delay (Patroni sends 1 ms): Consul's behaviour.
    let plain = Agent::dev().await;
    let waived = plain
        .session(&json!({"LockDelay": "1ms"}).to_string())
        .await;
    assert_eq!(
        plain.session_info(&waived).await[0]["LockDelay"],
        json!(1_000_000)
    );

    // With --lock-delay-min 3s the same request gets 3 s, and an invalidation holds the key
    // back for that long; a longer request keeps its own.
    let floored = Agent::dev_with(&["--lock-delay-min", "3s"]).await;
    let holder = floored
        .session(&json!({"LockDelay": "1ms"}).to_string())
        .await;
    assert_eq!(
        floored.session_info(&holder).await[0]["LockDelay"],
        json!(3_000_000_000u64)
    );
    let longer = floored
        .session(&json!({"LockDelay": "10s"}).to_string())
        .await;
    assert_eq!(
        floored.session_info(&longer).await[0]["LockDelay"],
        json!(10_000_000_000u64)
    );
    floored.acquire_ok("floor/key", &holder).await;
    floored.destroy_session(&holder).await;
    let next = floored
        .session(&json!({"LockDelay": "0s"}).to_string())
        .await;
    let refused = floored.acquire("floor/key", &next).await;
    assert_eq!(refused.text(), "false");
    let left = refused.lock_delay_remaining();
    assert!(
        left > Duration::from_secs(2) && left <= Duration::from_secs(3),
        "{left:?} left of the 3 s floor"
    );
}
