//! The server-side lock queue (`/v1/vigil/lock/<name>`) through the HTTP API: FIFO grants with
//! exactly one waiting request answered per release and tokens that only grow (checked by the
//! sequencer); shared and exclusive holders excluding each other without writer starvation; a
//! semaphore's slots; try, timeout, cancel and a client that goes away; a waiter whose session
//! dies; a holder whose agent is killed (`kill -9`), whose successor gets the lock after the
//! lock-delay with a larger token; and a leader failover with a queue in place.

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Agent, Http, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::common::{PROMPT, assert_error};

/// `PUT /v1/vigil/lock/<name>?session=…&<extra>` in the background, answered 200. Aborting
/// the task drops the request (the client goes away).
fn acquire(http: &Http, name: &str, session: &str, extra: &str) -> JoinHandle<Value> {
    let (http, path) = (http.clone(), acquire_path(name, session, extra));
    tokio::spawn(async move {
        let (status, body) = put_acquire(&http, &path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    })
}

/// `PUT /v1/vigil/lock/<name>?session=…&<extra>` in the background: its status and body.
fn acquire_with_status(
    http: &Http,
    name: &str,
    session: &str,
    extra: &str,
) -> JoinHandle<(StatusCode, Value)> {
    let (http, path) = (http.clone(), acquire_path(name, session, extra));
    tokio::spawn(async move { put_acquire(&http, &path).await })
}

fn acquire_path(name: &str, session: &str, extra: &str) -> String {
    format!("/v1/vigil/lock/{name}?session={session}&{extra}")
}

async fn put_acquire(http: &Http, path: &str) -> (StatusCode, Value) {
    let reply = http.put(path, "").await;
    let body = serde_json::from_slice(&reply.body).unwrap_or(Value::String(reply.text()));
    (reply.status, body)
}

async fn acquired_now(http: &Http, name: &str, session: &str, extra: &str) -> Value {
    tokio::time::timeout(PROMPT, acquire(http, name, session, extra))
        .await
        .expect("answered")
        .expect("request task")
}

async fn release(http: &Http, name: &str, session: &str) -> Value {
    let reply = http
        .put(
            &format!("/v1/vigil/lock/{name}?release&session={session}"),
            "",
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()
}

/// The lock as `GET /v1/vigil/lock/<name>` shows it (`Null` when nobody uses it).
async fn lock(http: &Http, name: &str) -> Value {
    let reply = http.get(&format!("/v1/vigil/lock/{name}")).await;
    match reply.status {
        StatusCode::OK => reply.json(),
        StatusCode::NOT_FOUND => Value::Null,
        other => panic!("GET lock: {other} {}", reply.text()),
    }
}

fn sessions_of(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|e| e["Session"].as_str().expect("Session").to_owned())
        .collect()
}

/// Waits until the lock's waiters are exactly `expected`, in order.
async fn waiters_are(http: &Http, name: &str, expected: &[String]) {
    eventually(PROMPT, "the expected queue", || async {
        (sessions_of(&lock(http, name).await["Waiters"]) == expected).then_some(())
    })
    .await;
}

async fn sequencer(http: &Http, name: &str, token: u64, session: &str) -> bool {
    let query = format!("lock={name}&token={token}&session={session}");
    http.sequencer(&query).await.json()["Valid"] == json!(true)
}

/// `N` sessions with no lock-delay, so a released lock can be taken again at once.
async fn sessions_without_lock_delay<const N: usize>(http: &Http) -> [String; N] {
    let mut ids = Vec::with_capacity(N);
    for _ in 0..N {
        ids.push(create_session(http, r#"{"LockDelay":"0s"}"#).await);
    }
    ids.try_into().expect("N sessions")
}

fn token(answer: &Value) -> u64 {
    assert_eq!(answer["Acquired"], json!(true), "{answer}");
    answer["Token"].as_u64().expect("Token")
}

#[tokio::test]
async fn fifo_grants_wake_one_waiter_per_release_and_tokens_grow() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let ids: [String; 5] = sessions_without_lock_delay(&http).await;
    let first = acquired_now(&http, "q/fifo", &ids[0], "").await;
    let mut last = token(&first);
    assert!(sequencer(&http, "q/fifo", last, &ids[0]).await);

    // Four waiters queue in a known order.
    let mut pending = Vec::new();
    for (i, id) in ids.iter().enumerate().skip(1) {
        pending.push(acquire(&http, "q/fifo", id, "wait=60s"));
        waiters_are(&http, "q/fifo", &ids[1..=i]).await;
    }
    let report = lock(&http, "q/fifo").await;
    assert_eq!(report["Holders"][0]["Session"], json!(ids[0]));
    assert_eq!(report["Waiters"][3]["Position"], json!(4));

    // Each release answers exactly the next waiter's request, with a larger token; the
    // others stay blocked.
    let mut holder = ids[0].clone();
    for (i, waiting) in pending.into_iter().enumerate() {
        assert_eq!(release(&http, "q/fifo", &holder).await, json!(true));
        let answer = tokio::time::timeout(PROMPT, waiting)
            .await
            .expect("the next waiter answered")
            .unwrap();
        let next = token(&answer);
        assert!(next > last, "token {next} after {last}");
        assert!(!sequencer(&http, "q/fifo", last, &holder).await);
        assert!(sequencer(&http, "q/fifo", next, &ids[i + 1]).await);
        last = next;
        holder = ids[i + 1].clone();
        waiters_are(&http, "q/fifo", &ids[i + 2..]).await;
    }
    assert_eq!(release(&http, "q/fifo", &holder).await, json!(true));
    assert_eq!(lock(&http, "q/fifo").await, Value::Null);
    // A release by a session that holds nothing is a no-op.
    assert_eq!(release(&http, "q/fifo", &holder).await, json!(false));
}

#[tokio::test]
async fn readers_share_writers_exclude_and_a_waiting_writer_holds_back_later_readers() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let ids: [String; 4] = sessions_without_lock_delay(&http).await;
    let (r1, r2, w, r3) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    token(&acquired_now(&http, "q/rw", r1, "mode=shared").await);
    token(&acquired_now(&http, "q/rw", r2, "mode=shared").await);
    let writer = acquire(&http, "q/rw", w, "wait=60s");
    waiters_are(&http, "q/rw", std::slice::from_ref(w)).await;
    let reader = acquire(&http, "q/rw", r3, "mode=shared&wait=60s");
    waiters_are(&http, "q/rw", &[w.clone(), r3.clone()]).await;

    release(&http, "q/rw", r1).await;
    assert_eq!(
        sessions_of(&lock(&http, "q/rw").await["Holders"]),
        vec![r2.clone()]
    );
    release(&http, "q/rw", r2).await;
    let granted = tokio::time::timeout(PROMPT, writer).await.unwrap().unwrap();
    token(&granted);
    let report = lock(&http, "q/rw").await;
    assert_eq!(sessions_of(&report["Holders"]), vec![w.clone()]);
    assert_eq!(report["Holders"][0]["Mode"], json!("exclusive"));
    release(&http, "q/rw", w).await;
    token(&tokio::time::timeout(PROMPT, reader).await.unwrap().unwrap());

    // A semaphore of 2: two in, the third waits; a different limit is refused.
    let s: [String; 3] = sessions_without_lock_delay(&http).await;
    token(&acquired_now(&http, "q/sem", &s[0], "limit=2").await);
    token(&acquired_now(&http, "q/sem", &s[1], "limit=2").await);
    let busy = acquired_now(&http, "q/sem", &s[2], "limit=2&try").await;
    assert_eq!(busy["Acquired"], json!(false));
    assert_eq!(busy["Reason"], json!("held"));
    let conflict = http
        .put(
            &format!("/v1/vigil/lock/q/sem?session={}&limit=3", s[2]),
            "",
        )
        .await;
    assert_error(
        &conflict,
        StatusCode::INTERNAL_SERVER_ERROR,
        "lock limit conflict (lock: 2, local: 3)",
    );
}

#[tokio::test]
async fn try_timeout_cancel_and_a_vanished_client_leave_the_queue() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let [holder, other] = sessions_without_lock_delay(&http).await;
    token(&acquired_now(&http, "q/t", &holder, "").await);

    // Try: answered at once, not queued.
    let busy = acquired_now(&http, "q/t", &other, "try").await;
    assert_eq!(busy["Reason"], json!("held"));
    assert_eq!(lock(&http, "q/t").await["Waiters"], json!([]));

    // Timeout: answered after it, and the contender left the queue.
    let started = Instant::now();
    let timed_out = acquired_now(&http, "q/t", &other, "timeout=300ms").await;
    assert_eq!(timed_out["Reason"], json!("timeout"));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(lock(&http, "q/t").await["Waiters"], json!([]));

    // Cancel: DELETE takes a waiter out; its request answers "removed".
    let waiting = acquire(&http, "q/t", &other, "wait=60s");
    waiters_are(&http, "q/t", std::slice::from_ref(&other)).await;
    let reply = http
        .delete(&format!("/v1/vigil/lock/q/t?session={other}"))
        .await;
    assert_eq!(reply.json(), json!(true));
    let answer = tokio::time::timeout(PROMPT, waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["Reason"], json!("removed"));

    // A client that goes away mid-wait leaves the queue.
    let waiting = acquire(&http, "q/t", &other, "wait=60s");
    waiters_are(&http, "q/t", std::slice::from_ref(&other)).await;
    waiting.abort();
    waiters_are(&http, "q/t", &[]).await;
    assert_eq!(
        sessions_of(&lock(&http, "q/t").await["Holders"]),
        vec![holder]
    );
}

#[tokio::test]
async fn a_waiter_whose_session_dies_leaves_the_queue_at_once() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let [holder, doomed, next] = sessions_without_lock_delay(&http).await;
    token(&acquired_now(&http, "q/d", &holder, "").await);
    let doomed_wait = acquire(&http, "q/d", &doomed, "wait=60s");
    waiters_are(&http, "q/d", std::slice::from_ref(&doomed)).await;
    let next_wait = acquire(&http, "q/d", &next, "wait=60s");
    waiters_are(&http, "q/d", &[doomed.clone(), next.clone()]).await;

    http.put(&format!("/v1/session/destroy/{doomed}"), "").await;
    // Well before its 60 s wait, and while the holder still holds the lock.
    let answer = tokio::time::timeout(PROMPT, doomed_wait)
        .await
        .expect("answered before its wait ran out")
        .unwrap();
    assert_eq!(answer["Reason"], json!("removed"));
    waiters_are(&http, "q/d", std::slice::from_ref(&next)).await;
    release(&http, "q/d", &holder).await;
    token(
        &tokio::time::timeout(PROMPT, next_wait)
            .await
            .unwrap()
            .unwrap(),
    );
}

#[tokio::test]
async fn a_killed_holders_successor_waits_out_the_lock_delay_and_gets_a_larger_token() {
    let mut cluster = Cluster::servers(3).clients(2).start().await;
    let (victim, survivor) = (cluster.client(0).http(), cluster.client(1).http());
    let victim_node = cluster.client(0).node.clone();
    let held = create_session(&victim, r#"{"LockDelay":"2s"}"#).await;
    let waiter = create_session(&survivor, r#"{"LockDelay":"0s"}"#).await;
    let first = token(&acquired_now(&victim, "q/crash", &held, "").await);
    let waiting = acquire(&survivor, "q/crash", &waiter, "wait=120s");
    waiters_are(&survivor, "q/crash", std::slice::from_ref(&waiter)).await;

    cluster.kill9_client(0).await;
    eventually(PROMPT, "the holder's node to fail", || async {
        (survivor.serf_health(&victim_node).await.as_deref() == Some("critical")).then_some(())
    })
    .await;
    // The holder's session is gone, and the lock waits out its 2 s lock-delay, visibly.
    let report = eventually(PROMPT, "the holder gone", || async {
        let report = lock(&survivor, "q/crash").await;
        (report["Holders"] == json!([])).then_some(report)
    })
    .await;
    let seen = Instant::now();
    let delay = Duration::from_millis(report["LockDelayRemainingMs"].as_u64().unwrap());
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(2),
        "lock-delay left {delay:?}"
    );
    let answer = tokio::time::timeout(PROMPT, waiting)
        .await
        .unwrap()
        .unwrap();
    let next = token(&answer);
    let waited = seen.elapsed();
    assert!(
        waited + Duration::from_millis(250) >= delay,
        "granted {waited:?} after the holder went, with {delay:?} of lock-delay left"
    );
    assert!(next > first, "token {next} after {first}");
    assert!(sequencer(&survivor, "q/crash", next, &waiter).await);
}

#[tokio::test]
async fn a_leader_failover_keeps_the_queue_and_its_tokens() {
    let mut cluster = Cluster::servers(3).clients(1).start().await;
    let http = cluster.client(0).http();
    let ids: [String; 3] = sessions_without_lock_delay(&http).await;
    let first = token(&acquired_now(&http, "q/fo", &ids[0], "").await);
    let second = acquire(&http, "q/fo", &ids[1], "wait=120s");
    waiters_are(&http, "q/fo", &ids[1..2]).await;
    let third = acquire(&http, "q/fo", &ids[2], "wait=120s");
    waiters_are(&http, "q/fo", &ids[1..]).await;

    let leader = cluster.leader().await;
    cluster.kill9(leader).await;
    cluster.leader_within(PROMPT).await;
    let report = eventually(PROMPT, "the queue on the new leader", || async {
        let reply = http.try_get("/v1/vigil/lock/q/fo").await?;
        (reply.status == StatusCode::OK).then(|| reply.json())
    })
    .await;
    assert_eq!(sessions_of(&report["Holders"]), vec![ids[0].clone()]);
    assert_eq!(report["Holders"][0]["Token"], json!(first));
    assert_eq!(sessions_of(&report["Waiters"]), ids[1..].to_vec());

    // The waiting requests survived the failover: each release still answers the next one.
    assert_eq!(release(&http, "q/fo", &ids[0]).await, json!(true));
    let next = token(&tokio::time::timeout(PROMPT, second).await.unwrap().unwrap());
    assert!(next > first);
    assert_eq!(release(&http, "q/fo", &ids[1]).await, json!(true));
    let last = token(&tokio::time::timeout(PROMPT, third).await.unwrap().unwrap());
    assert!(last > next);
}

/// Holds until the lock changes or `quiet` passes (a blocking read on the lock from its current
/// index): the lock as it stands then. Tells that nothing changed the lock meanwhile.
async fn lock_after_quiet(http: &Http, name: &str, quiet: Duration) -> Value {
    let index = http.get(&format!("/v1/vigil/lock/{name}")).await.index();
    let path = format!(
        "/v1/vigil/lock/{name}?index={index}&wait={}ms",
        quiet.as_millis()
    );
    http.get(&path).await.json()
}

/// A client whose request drops mid-wait (timeout, proxy, restart) and who retries at once on a
/// new connection: the retry owns the session's place, so the dropped request's leave never
/// releases what the retry is told it holds, and no other session is granted beside it.
/// Before the fix a plain release followed the retry's grant in about a third of the rounds.
#[tokio::test]
async fn a_retry_after_a_dropped_request_is_never_double_granted() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let [holder, retrier, rival] = sessions_without_lock_delay(&http).await;
    for round in 0..20 {
        let name = format!("q/retry{round}");
        token(&acquired_now(&http, &name, &holder, "").await);
        let first = acquire(&http, &name, &retrier, "wait=60s");
        waiters_are(&http, &name, std::slice::from_ref(&retrier)).await;
        // The connection drops and the client retries at once.
        first.abort();
        let retry = acquire(&http, &name, &retrier, "wait=60s");
        release(&http, &name, &holder).await;
        let answer = tokio::time::timeout(PROMPT, retry)
            .await
            .expect("the retry is answered")
            .expect("request task");
        let granted = token(&answer);

        // Whatever the dropped request's leave does, it lands by now or changes nothing: the
        // retrier keeps the lock, its token stays valid, and the rival is refused.
        let report = lock_after_quiet(&http, &name, Duration::from_millis(300)).await;
        assert_eq!(
            sessions_of(&report["Holders"]),
            vec![retrier.clone()],
            "round {round}: {report}"
        );
        assert!(
            sequencer(&http, &name, granted, &retrier).await,
            "round {round}"
        );
        let busy = acquired_now(&http, &name, &rival, "try").await;
        assert_eq!(busy["Acquired"], json!(false), "round {round}: {busy}");
        release(&http, &name, &retrier).await;
    }
}

/// One session, one standing, one mode: a reader asking for exclusive while others read is
/// refused (Consul-style 500) and keeps its shared hold; asking for shared again answers that
/// hold; alone, it is upgraded to exclusive with a new token, and the shared token is no longer
/// valid.
#[tokio::test]
async fn exclusive_is_never_granted_beside_readers() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let [r1, r2] = sessions_without_lock_delay(&http).await;
    let shared = token(&acquired_now(&http, "q/up", &r1, "mode=shared").await);
    token(&acquired_now(&http, "q/up", &r2, "mode=shared").await);

    let refused = http
        .put(&format!("/v1/vigil/lock/q/up?session={r1}"), "")
        .await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        refused.text().contains("shared with other sessions"),
        "{}",
        refused.text()
    );
    let report = lock(&http, "q/up").await;
    let modes: Vec<&Value> = report["Holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| &h["Mode"])
        .collect();
    assert_eq!(modes, [&json!("shared"), &json!("shared")], "{report}");
    assert!(sequencer(&http, "q/up", shared, &r1).await);

    let again = acquired_now(&http, "q/up", &r1, "mode=shared").await;
    assert_eq!((token(&again), &again["Mode"]), (shared, &json!("shared")));

    release(&http, "q/up", &r2).await;
    let upgraded = acquired_now(&http, "q/up", &r1, "").await;
    assert_eq!(upgraded["Mode"], json!("exclusive"), "{upgraded}");
    let exclusive = token(&upgraded);
    assert!(exclusive > shared);
    assert!(!sequencer(&http, "q/up", shared, &r1).await);
    assert!(sequencer(&http, "q/up", exclusive, &r1).await);
    // A reader asking now waits behind the writer.
    let waiting = acquire_with_status(&http, "q/up", &r2, "mode=shared&wait=200ms");
    let (status, body) = waiting.await.expect("request task");
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

/// A wait that ends before the grant is not a refusal: 202, `Queued:true` and the position,
/// the place kept; asking again resumes it. A try from a session that already waits answers
/// at once, wherever it stands.
#[tokio::test]
async fn a_wait_that_ends_answers_queued_and_a_try_answers_at_once() {
    let agent = Agent::dev().await;
    let http = agent.http();
    let [holder, waiter] = sessions_without_lock_delay(&http).await;
    token(&acquired_now(&http, "q/w", &holder, "").await);

    let (status, body) = acquire_with_status(&http, "q/w", &waiter, "wait=300ms")
        .await
        .expect("request task");
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (
            &body["Acquired"],
            &body["Queued"],
            &body["Position"],
            &body["Reason"]
        ),
        (&json!(false), &json!(true), &json!(1), &json!("queued")),
        "{body}"
    );
    waiters_are(&http, "q/w", std::slice::from_ref(&waiter)).await;

    // A try from the waiting session: answered well before its wait would end.
    let started = Instant::now();
    let (status, body) = tokio::time::timeout(
        PROMPT,
        acquire_with_status(&http, "q/w", &waiter, "try&wait=120s"),
    )
    .await
    .expect("answered")
    .expect("request task");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["Queued"], json!(true));
    waiters_are(&http, "q/w", std::slice::from_ref(&waiter)).await;

    // Asking again resumes the wait, and the release answers it.
    let resumed = acquire(&http, "q/w", &waiter, "wait=60s");
    release(&http, "q/w", &holder).await;
    let answer = tokio::time::timeout(PROMPT, resumed)
        .await
        .expect("answered")
        .expect("request task");
    token(&answer);
}
