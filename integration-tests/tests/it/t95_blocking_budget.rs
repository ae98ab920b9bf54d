//! The blocking-query budget under attack, through the HTTP API: under default deny, blocking
//! reads of what a token can never see answer at once and take no slot, so a flood of them
//! cannot use the budget up; a flood of ordinary blocking reads leaves lock waits their
//! reserve, and a lock waiter the budget refuses keeps its place in the queue, granted in
//! order when it asks again.

use std::time::Duration;

use futures::future::join_all;
use integration_tests::{Agent, Http, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_client::{Client, FairMutex, QueueOptions};

use crate::common::blocking_queries;

const ROOT: &str = "2d7d1b4c-6d0e-4e0a-9d0b-7c3c3f3f0095";
/// How long a read answered at once may take.
const AT_ONCE: Duration = Duration::from_secs(3);
const SETTLE: Duration = Duration::from_secs(30);
/// Blocking queries the agent holds itself under ACLs: its watch of the ACL tables.
const OWN: usize = 1;

async fn until_blocking(http: &Http, n: usize) {
    eventually(SETTLE, &format!("{n} blocking queries held"), || async {
        (blocking_queries(http).await == n).then_some(())
    })
    .await;
}

/// `GET path` in the background: (status, body, how long it took).
fn spawn_get(http: &Http, path: String) -> JoinHandle<(StatusCode, String, Duration)> {
    let http = http.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let reply = http.get(&path).await;
        (reply.status, reply.text(), started.elapsed())
    })
}

/// `PUT path` in the background: (status, body).
fn spawn_put(http: &Http, path: String) -> JoinHandle<(StatusCode, Value)> {
    let http = http.clone();
    tokio::spawn(async move {
        let reply = http.put(&path, "").await;
        let body = serde_json::from_slice(reply.text().as_bytes()).unwrap_or(Value::Null);
        (reply.status, body)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_a_token_cannot_see_answer_at_once_and_leave_the_budget_alone() {
    // Phase 1: default deny, a budget of five blocking queries, none reserved.
    let agent = Agent::dev_with(&[
        "--acl-default-policy",
        "deny",
        "--acl-initial-management-token",
        ROOT,
        "--max-blocking-queries",
        "5",
        "--lock-wait-reserve",
        "0",
    ])
    .await;
    let anonymous = agent.http();
    let root = anonymous.with_token(ROOT);
    eventually(SETTLE, "the initial management token", || async {
        (root.get("/v1/acl/token/self").await.status == StatusCode::OK).then_some(())
    })
    .await;
    let reply = root.put("/v1/kv/secret/x", "s").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let reply = root
        .put(
            "/v1/session/create",
            json!({"Name": "hidden", "TTL": "60s"}).to_string(),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let index = root.get("/v1/kv/secret/x").await.index();
    assert!(index > 0);

    // A token for app/ only: it sees nothing under secret/.
    let policy = root
        .put(
            "/v1/acl/policy",
            json!({"Name": "app", "Rules": "key_prefix \"app/\" { policy = \"read\" }"})
                .to_string(),
        )
        .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.text());
    let token = root
        .put(
            "/v1/acl/token",
            json!({"Policies": [{"Name": "app"}]}).to_string(),
        )
        .await;
    assert_eq!(token.status, StatusCode::OK, "{}", token.text());
    let app = anonymous.with_token(token.json()["SecretID"].as_str().unwrap());

    // The agent's own watch of the ACL tables holds one slot once it has caught up with the
    // writes above (it lets go for a moment each time the tables change).
    until_blocking(&root, OWN).await;

    // Phase 2: twenty times the budget of blocking reads nothing they could return is
    // visible to, anonymous and from the app token, all at once with a five-minute wait.
    let blind = [
        ("/v1/kv/secret/x", StatusCode::FORBIDDEN),
        ("/v1/kv/secret/?recurse", StatusCode::NOT_FOUND),
        ("/v1/kv/secret/?keys", StatusCode::NOT_FOUND),
        ("/v1/catalog/nodes", StatusCode::OK),
        ("/v1/catalog/services", StatusCode::OK),
        ("/v1/health/state/any", StatusCode::OK),
        ("/v1/session/list", StatusCode::OK),
    ];
    let mut flood = Vec::new();
    for round in 0..10 {
        let http = if round % 2 == 0 { &anonymous } else { &app };
        for (path, status) in blind {
            let sep = if path.contains('?') { '&' } else { '?' };
            let path = format!("{path}{sep}index={index}&wait=5m");
            flood.push((path.clone(), status, spawn_get(http, path)));
        }
    }
    for (path, status, reply) in flood {
        let (got, body, took) = reply.await.unwrap();
        assert_eq!(got, status, "{path}: {body}");
        assert!(took < AT_ONCE, "{path} took {took:?}");
        if status == StatusCode::OK {
            assert!(matches!(body.trim(), "[]" | "{}"), "{path}: {body}");
        }
    }
    assert_eq!(blocking_queries(&root).await, OWN);

    // Phase 3: the budget is whole: readers that may see what they wait on hold every slot
    // left (the app token on its own prefix among them), and one more is refused.
    // An index none of the four has passed yet.
    let index = [
        root.get("/v1/kv/app/").await.index(),
        root.get("/v1/kv/secret/x").await.index(),
        root.get("/v1/session/list").await.index(),
    ]
    .into_iter()
    .max()
    .unwrap();
    let held = vec![
        spawn_get(&app, format!("/v1/kv/app/?recurse&index={index}&wait=60s")),
        spawn_get(&root, format!("/v1/kv/secret/x?index={index}&wait=60s")),
        spawn_get(
            &root,
            format!("/v1/kv/secret/?recurse&index={index}&wait=60s"),
        ),
        spawn_get(&root, format!("/v1/session/list?index={index}&wait=60s")),
    ];
    until_blocking(&root, OWN + held.len()).await;
    // A read none of them makes (the same read would share its wait, and take no slot).
    let reply = root
        .get(&format!("/v1/kv/secret/y?index={index}&wait=60s"))
        .await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.text()
    );
    // Still none for the blind ones, and they still answer at once.
    let started = Instant::now();
    let reply = anonymous
        .get(&format!("/v1/kv/secret/?recurse&index={index}&wait=60s"))
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text());
    assert_eq!(
        reply.header("X-Consul-Results-Filtered-By-ACLs").as_deref(),
        Some("true")
    );
    assert!(started.elapsed() < AT_ONCE);

    // A write under app/ and one under secret/ and a new session answer them all.
    let reply = root.put("/v1/kv/app/a", "1").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let reply = root.put("/v1/kv/secret/x", "t").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let reply = root
        .put("/v1/session/create", json!({"TTL": "60s"}).to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    for (status, body, _) in join_all(held).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

/// The lock's waiting sessions, in queue order.
async fn waiters(http: &Http, name: &str) -> Vec<String> {
    let reply = http.get(&format!("/v1/vigil/lock/{name}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Waiters"]
        .as_array()
        .expect("Waiters")
        .iter()
        .map(|w| w["Session"].as_str().unwrap().to_owned())
        .collect()
}

fn acquire(name: &str, session: &str) -> String {
    format!("/v1/vigil/lock/{name}?session={session}&wait=60s")
}

/// Asks for the lock while the budget is full: 429, the session queued all the same.
async fn refused_but_queued(http: &Http, name: &str, session: &str) {
    let reply = http.put(&acquire(name, session), "").await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.text()
    );
    assert!(
        reply.text().contains("keeps its place in the queue"),
        "{}",
        reply.text()
    );
}

async fn release(http: &Http, name: &str, session: &str) {
    let reply = http
        .put(
            &format!("/v1/vigil/lock/{name}?release&session={session}"),
            "",
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json(), json!(true));
}

async fn granted(waiter: JoinHandle<(StatusCode, Value)>, session: &str) {
    let (status, body) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{session}: {body}");
    assert_eq!(body["Acquired"], true, "{session}: {body}");
    assert_eq!(body["Session"], session);
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_waits_keep_their_reserve_and_their_place_under_a_flood() {
    // Phase 1: seven blocking slots, three of them for lock waits; a holder of the native
    // lock `q` and of the Consul-style lock key `ck`.
    let agent = Agent::dev_with(&["--max-blocking-queries", "7", "--lock-wait-reserve", "3"]).await;
    let http = agent.http();
    let session = |name: &'static str| {
        let http = http.clone();
        async move {
            http.session(&json!({"Name": name, "TTL": "120s"}).to_string())
                .await
        }
    };
    let (holder, s2, s3, s4, s5, s6) = (
        session("holder").await,
        session("s2").await,
        session("s3").await,
        session("s4").await,
        session("s5").await,
        session("s6").await,
    );
    let reply = http
        .put(&format!("/v1/vigil/lock/q?session={holder}"), "")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["Acquired"], true);
    http.acquire_ok("ck", &holder).await;
    for n in 0..5 {
        http.put_key(&format!("flood/{n}"), "0").await;
    }
    let index = http.get("/v1/kv/flood/4").await.index();

    // Phase 2: a flood of ordinary blocking reads (of different keys: reads of one key would
    // share one wait) takes every unreserved slot; one more is refused at once.
    let flood: Vec<_> = (0..4)
        .map(|n| spawn_get(&http, format!("/v1/kv/flood/{n}?index={index}&wait=60s")))
        .collect();
    until_blocking(&http, 4).await;
    let reply = http
        .get(&format!("/v1/kv/flood/4?index={index}&wait=60s"))
        .await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.text()
    );

    // Phase 3: lock waits still wait, on the reserve: a Consul-style waiter on the held key,
    // and two native waiters in order.
    let ck_index = http.get("/v1/kv/ck").await.index();
    let consul_waiter = spawn_get(&http, format!("/v1/kv/ck?index={ck_index}&wait=60s"));
    until_blocking(&http, 5).await;
    let w2 = spawn_put(&http, acquire("q", &s2));
    until_blocking(&http, 6).await;
    let w3 = spawn_put(&http, acquire("q", &s3));
    until_blocking(&http, 7).await;
    assert_eq!(waiters(&http, "q").await, [s2.clone(), s3.clone()]);

    // Phase 4: the budget is spent; the next waiters are refused for it but stay queued, and
    // a retry refused again keeps its place too. The Rust client's fair mutex, refused the
    // same way, pauses and asks again instead of giving up its place.
    refused_but_queued(&http, "q", &s4).await;
    refused_but_queued(&http, "q", &s5).await;
    let client = Client::new(&agent.base).expect("client");
    let mut options = QueueOptions::new("q");
    options.session.reuse = Some(s6.clone());
    options.monitor = false;
    let fair = FairMutex::new(&client, options).expect("fair mutex");
    let w6 = tokio::spawn(async move { fair.acquire().await });
    let all = [s2.clone(), s3.clone(), s4.clone(), s5.clone(), s6.clone()];
    eventually(SETTLE, "the client's contender queued", || async {
        (waiters(&http, "q").await == all).then_some(())
    })
    .await;
    refused_but_queued(&http, "q", &s4).await;
    assert_eq!(waiters(&http, "q").await, all);
    assert!(!w6.is_finished(), "the client's contender stopped waiting");

    // Phase 5: the flood ends; the refused waiters ask again, the later one first, and are
    // still granted in queue order as the holders release.
    for n in 0..4 {
        http.put_key(&format!("flood/{n}"), "1").await;
    }
    for (status, body, _) in join_all(flood).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let w5 = spawn_put(&http, acquire("q", &s5));
    let w4 = spawn_put(&http, acquire("q", &s4));
    until_blocking(&http, 6).await;
    assert_eq!(waiters(&http, "q").await, all);
    release(&http, "q", &holder).await;
    granted(w2, &s2).await;
    release(&http, "q", &s2).await;
    granted(w3, &s3).await;
    release(&http, "q", &s3).await;
    granted(w4, &s4).await;
    assert!(!w5.is_finished(), "s5 was granted out of turn");
    release(&http, "q", &s4).await;
    granted(w5, &s5).await;
    assert!(!w6.is_finished(), "s6 was granted out of turn");
    release(&http, "q", &s5).await;
    let held = w6
        .await
        .unwrap()
        .expect("the client's contender is granted");
    held.release().await.expect("released");
    // Nobody holds or waits for it any more.
    assert_eq!(
        http.get("/v1/vigil/lock/q").await.status,
        StatusCode::NOT_FOUND
    );

    // The Consul-style waiter was held all along and sees the key's release.
    http.release_ok("ck", &holder).await;
    let (status, body, _) = consul_waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("\"Key\":\"ck\""), "{body}");
}
