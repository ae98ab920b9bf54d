//! Blocking queries coalesced in the agent, through the HTTP API: local watchers of the same
//! read share one wait on the servers, and one write answers them all with the new value and
//! index. A watcher that hangs up leaves the others waiting, and the shared wait ends with the
//! last of them; watchers with different tokens each see only what their token may; a
//! watcher at another index, or with a shorter wait, is never answered for another's; and
//! `?consistent` watchers, whose leader confirms itself for each request, are not shared.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::future::join_all;
use integration_tests::cluster::Cluster;
use integration_tests::{Agent, Http, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::common::{PROMPT, blocking_queries};

const WATCHERS: usize = 100;
const ROOT: &str = "2d7d1b4c-6d0e-4e0a-9d0b-7c3c3f3f0096";

/// `Stats.agent.<name>` of `/v1/agent/self`: this agent's clients' blocking queries
/// (`blocking_queries`) and the waits on the servers they share (`server_waits`).
async fn agent_stat(http: &Http, name: &str) -> usize {
    let reply = http.get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Stats"]["agent"][name]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("Stats.agent.{name} in {}", reply.text()))
}

/// What the agent behind `http` and the server behind `server` wait on: the agent's clients'
/// blocking queries, the shared waits they make on the servers, and the blocking queries the
/// server holds.
async fn waiting(http: &Http, server: &Http) -> [usize; 3] {
    [
        agent_stat(http, "blocking_queries").await,
        agent_stat(http, "server_waits").await,
        blocking_queries(server).await,
    ]
}

/// [`waiting`] before a test's watchers: the agent's own watches. One lets go of its wait for a
/// moment each time what it watches changes, so a single look can miss it: the most seen of
/// ten looks over 200 ms.
async fn own_waits(http: &Http, server: &Http) -> [usize; 3] {
    let mut most = [0; 3];
    for _ in 0..10 {
        let seen = waiting(http, server).await;
        most = [0, 1, 2].map(|i| most[i].max(seen[i]));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    most
}

/// Waits until [`waiting`] is `base` plus `more` (the agent's own watches are in `base`).
async fn until_waiting(http: &Http, server: &Http, base: [usize; 3], more: [usize; 3]) {
    let want = [0, 1, 2].map(|i| base[i] + more[i]);
    let mut seen = [0; 3];
    let what = format!("[watchers, shared waits, held by the server] = {want:?}");
    let found = tokio::time::timeout(PROMPT, async {
        loop {
            seen = waiting(http, server).await;
            if seen == want {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(found.is_ok(), "timed out waiting for {what}; last {seen:?}");
}

/// A blocking `GET path` on a connection of its own: (status, X-Consul-Index, body).
fn spawn_watch(http: &Http, path: String) -> JoinHandle<(StatusCode, u64, Value)> {
    let http = http.clone();
    tokio::spawn(async move {
        let reply = http.get(&path).await;
        let body = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        (reply.status, reply.index(), body)
    })
}

/// The value of the single entry in a KV answer.
fn value(body: &Value) -> String {
    let encoded = body[0]["Value"].as_str().unwrap_or_default();
    String::from_utf8(BASE64.decode(encoded).expect("base64")).expect("utf-8")
}

/// A blocking `GET path` written by hand on a socket of its own, so the test can hang up.
async fn raw_watch(http: &Http, path: &str) -> TcpStream {
    let addr = http.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    stream
}

/// Keys the KV answer lists.
fn keys_of(body: &Value) -> Vec<String> {
    body.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["Key"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_watchers_of_one_key_share_one_wait_and_all_wake_on_a_write() {
    let agent = Agent::dev().await;
    let http = agent.http();
    http.put_key("watched", "v1").await;
    let index = http.get("/v1/kv/watched").await.index();
    let own = own_waits(&http, &http).await;

    // A hundred watchers of the key at its index: one wait held by the server.
    let path = format!("/v1/kv/watched?index={index}&wait=60s");
    let watchers: Vec<_> = (0..WATCHERS)
        .map(|_| spawn_watch(&http, path.clone()))
        .collect();
    until_waiting(&http, &http, own, [WATCHERS, 1, 1]).await;
    assert!(watchers.iter().all(|w| !w.is_finished()));

    // One write answers every one of them with the new value and index.
    http.put_key("watched", "v2").await;
    let written = http.get("/v1/kv/watched").await.index();
    assert!(written > index);
    for (status, got, body) in join_all(watchers).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(got, written);
        assert_eq!(value(&body), "v2");
    }
    until_waiting(&http, &http, own, [0, 0, 0]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_that_hangs_up_leaves_the_others_waiting_and_the_last_ends_the_wait() {
    let agent = Agent::dev().await;
    let http = agent.http();
    http.put_key("k", "v1").await;
    let index = http.get("/v1/kv/k").await.index();
    let own = own_waits(&http, &http).await;
    let path = format!("/v1/kv/k?index={index}&wait=60s");

    // Three watchers that will hang up, and one that stays.
    let mut leaving = Vec::new();
    for _ in 0..3 {
        leaving.push(raw_watch(&http, &path).await);
    }
    let staying = spawn_watch(&http, path.clone());
    until_waiting(&http, &http, own, [4, 1, 1]).await;

    // Two hang up, then the third: the wait stays, for the one left.
    drop(leaving.split_off(1));
    until_waiting(&http, &http, own, [2, 1, 1]).await;
    drop(leaving);
    until_waiting(&http, &http, own, [1, 1, 1]).await;
    assert!(!staying.is_finished());

    // A write wakes the one that stayed.
    http.put_key("k", "v2").await;
    let (status, got, body) = staying.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(got > index);
    assert_eq!(value(&body), "v2");

    // A watcher alone on a wait hangs up: the agent and the server hold nothing for it any
    // more.
    let last = raw_watch(&http, &format!("/v1/kv/k?index={got}&wait=60s")).await;
    until_waiting(&http, &http, own, [1, 1, 1]).await;
    drop(last);
    until_waiting(&http, &http, own, [0, 0, 0]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watchers_with_different_tokens_share_a_wait_but_see_only_their_own_keys() {
    let agent = Agent::dev_with(&[
        "--acl-default-policy",
        "deny",
        "--acl-initial-management-token",
        ROOT,
    ])
    .await;
    let anonymous = agent.http();
    let root = anonymous.with_token(ROOT);
    eventually(PROMPT, "the initial management token", || async {
        (root.get("/v1/acl/token/self").await.status == StatusCode::OK).then_some(())
    })
    .await;
    // A token for shared/a only and one for shared/b only.
    let mut tokens = Vec::new();
    for name in ["a", "b"] {
        let rules = format!("key \"shared/{name}\" {{ policy = \"read\" }}");
        let reply = root
            .put(
                "/v1/acl/policy",
                json!({"Name": name, "Rules": rules}).to_string(),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let reply = root
            .put(
                "/v1/acl/token",
                json!({"Policies": [{"Name": name}]}).to_string(),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        tokens.push(anonymous.with_token(reply.json()["SecretID"].as_str().unwrap()));
    }
    root.put_key("shared/a", "a1").await;
    root.put_key("shared/b", "b1").await;
    let index = root.get("/v1/kv/shared/?recurse").await.index();
    let own = own_waits(&root, &root).await;

    // Five watchers of the prefix with each token: one wait. A token that sees nothing under
    // it is answered at once, and never joins.
    let path = format!("/v1/kv/shared/?recurse&index={index}&wait=60s");
    let a: Vec<_> = (0..5)
        .map(|_| spawn_watch(&tokens[0], path.clone()))
        .collect();
    let b: Vec<_> = (0..5)
        .map(|_| spawn_watch(&tokens[1], path.clone()))
        .collect();
    until_waiting(&root, &root, own, [10, 1, 1]).await;
    let reply = anonymous.get(&path).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text());

    // A write under the prefix wakes them all; each sees only its token's key.
    root.put_key("shared/b", "b2").await;
    for (status, got, body) in join_all(a).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(got > index);
        assert_eq!(keys_of(&body), ["shared/a"]);
        assert_eq!(value(&body), "a1");
    }
    for (status, got, body) in join_all(b).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(got > index);
        assert_eq!(keys_of(&body), ["shared/b"]);
        assert_eq!(value(&body), "b2");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn watchers_at_another_index_or_with_a_shorter_wait_get_their_own_answer() {
    let agent = Agent::dev().await;
    let http = agent.http();
    http.put_key("k", "v1").await;
    let first = http.get("/v1/kv/k").await.index();
    let own = own_waits(&http, &http).await;

    // Five watchers at the first index; a write answers them.
    let at_first: Vec<_> = (0..5)
        .map(|_| spawn_watch(&http, format!("/v1/kv/k?index={first}&wait=60s")))
        .collect();
    until_waiting(&http, &http, own, [5, 1, 1]).await;
    http.put_key("k", "v2").await;
    let second = http.get("/v1/kv/k").await.index();
    for (status, got, body) in join_all(at_first).await.into_iter().map(Result::unwrap) {
        assert_eq!(
            (status, got, value(&body)),
            (StatusCode::OK, second, "v2".into())
        );
    }

    // Watchers at the new index wait for the next change, not the one already seen; one at
    // the old index is answered at once with the current value.
    let at_second: Vec<_> = (0..5)
        .map(|_| spawn_watch(&http, format!("/v1/kv/k?index={second}&wait=60s")))
        .collect();
    until_waiting(&http, &http, own, [5, 1, 1]).await;
    let reply = http.get(&format!("/v1/kv/k?index={first}&wait=60s")).await;
    assert_eq!((reply.index(), value(&reply.json())), (second, "v2".into()));
    assert!(at_second.iter().all(|w| !w.is_finished()));

    // A watcher with a shorter wait cannot share theirs: it waits on its own, and answers
    // unchanged when its wait is over while theirs go on.
    let short = spawn_watch(&http, format!("/v1/kv/k?index={second}&wait=1s"));
    let (status, got, body) = short.await.unwrap();
    assert_eq!(
        (status, got, value(&body)),
        (StatusCode::OK, second, "v2".into())
    );
    until_waiting(&http, &http, own, [5, 1, 1]).await;
    assert!(at_second.iter().all(|w| !w.is_finished()));

    http.put_key("k", "v3").await;
    for (status, got, body) in join_all(at_second).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(got > second);
        assert_eq!(value(&body), "v3");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_watchers_on_a_client_agent_hold_one_query_on_the_leader() {
    let cluster = Cluster::servers(3).clients(1).start().await;
    let client = cluster.client(0).http();
    client.put_key("watched", "v1").await;
    let index = client.get("/v1/kv/watched").await.index();
    let leader = cluster.server(cluster.leader().await).http();
    let own = own_waits(&client, &leader).await;

    let path = format!("/v1/kv/watched?index={index}&wait=60s");
    let watchers: Vec<_> = (0..WATCHERS)
        .map(|_| spawn_watch(&client, path.clone()))
        .collect();
    until_waiting(&client, &leader, own, [WATCHERS, 1, 1]).await;

    client.put_key("watched", "v2").await;
    for (status, got, body) in join_all(watchers).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(got > index);
        assert_eq!(value(&body), "v2");
    }
    until_waiting(&client, &leader, own, [0, 0, 0]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn consistent_watchers_each_wait_on_their_own() {
    let agent = Agent::dev().await;
    let http = agent.http();
    http.put_key("k", "v1").await;
    let index = http.get("/v1/kv/k").await.index();
    let own = own_waits(&http, &http).await;
    let path = format!("/v1/kv/k?consistent&index={index}&wait=60s");
    let watchers: Vec<_> = (0..3).map(|_| spawn_watch(&http, path.clone())).collect();
    until_waiting(&http, &http, own, [3, 0, 3]).await;
    http.put_key("k", "v2").await;
    for (status, got, body) in join_all(watchers).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(got > index);
        assert_eq!(value(&body), "v2");
    }
}
