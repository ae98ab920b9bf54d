//! Thousands of blocking queries through a client agent leave everything else alone: they
//! travel on watch connections of their own, so writes and pings never wait for a QUIC stream
//! behind them, and a server refuses blocking queries beyond its bound with 429 at once
//! instead of starving unrelated requests.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures::future::join_all;
use integration_tests::cluster::Cluster;
use integration_tests::{Agent, eventually};
use reqwest::StatusCode;
use tokio::time::Instant;

use crate::common::{blocking_queries, exclusive, raise_open_files};

const WATCHERS: usize = 3000;
/// Loopback source addresses the watchers come from, each carrying fewer connections than
/// Consul's default `http_max_conns_per_client` (200).
const SOURCES: usize = 16;
const WAIT: &str = "120s";
const REGISTER_LIMIT: Duration = Duration::from_secs(90);
/// What an unrelated request may take while the watchers wait.
const UNRELATED_LIMIT: Duration = Duration::from_secs(1);

/// A blocking read of `path` from loopback address `source`: (status, X-Consul-Index).
async fn watch(client: reqwest::Client, url: String) -> (StatusCode, u64) {
    let reply = client
        .get(url)
        .send()
        .await
        .expect("the blocking query is answered");
    let index = reply
        .headers()
        .get("X-Consul-Index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (reply.status(), index)
}

#[tokio::test(flavor = "multi_thread")]
async fn three_thousand_blocking_queries_leave_writes_fast() {
    let _heavy = exclusive().await;
    raise_open_files();
    // Phase 1: three servers, a client agent, and the key everybody watches.
    let cluster = Cluster::servers(3).clients(1).start().await;
    let agent = cluster.client(0).http();
    let reply = agent.put("/v1/kv/watched", "0").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let index = agent.get("/v1/kv/watched").await.index();

    // Phase 2: 3000 blocking queries through the client agent, from 16 source addresses.
    // Each lists the keys with a separator of its own: 3000 different reads of one key, which
    // the agent cannot answer with one shared wait.
    let url = |n: usize| {
        agent.url(&format!(
            "/v1/kv/watched?keys&separator=%7E{n}&index={index}&wait={WAIT}"
        ))
    };
    let clients: Vec<reqwest::Client> = (0..SOURCES)
        .map(|k| {
            let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + k as u8));
            reqwest::Client::builder()
                .local_address(source)
                .timeout(Duration::from_secs(300))
                .build()
                .unwrap()
        })
        .collect();
    let watchers: Vec<_> = (0..WATCHERS)
        .map(|n| tokio::spawn(watch(clients[n % SOURCES].clone(), url(n))))
        .collect();

    // Phase 3: the leader holds every one of them.
    let leader = cluster.server(cluster.leader().await).http();
    eventually(
        REGISTER_LIMIT,
        "the leader to hold every blocking query",
        || async { (blocking_queries(&leader).await >= WATCHERS).then_some(()) },
    )
    .await;

    // Phase 4: unrelated writes and reads through the same agent answer promptly.
    for n in 0..20 {
        let started = Instant::now();
        let reply = agent.put(&format!("/v1/kv/unrelated/{n}"), "x").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let reply = agent.get(&format!("/v1/kv/unrelated/{n}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let took = started.elapsed();
        assert!(took < UNRELATED_LIMIT, "write and read {n} took {took:?}");
    }

    // Phase 5: none of the watchers has answered; one write to the key answers them all.
    assert!(watchers.iter().all(|w| !w.is_finished()));
    let reply = agent.put("/v1/kv/watched", "1").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    for (status, new_index) in join_all(watchers).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK);
        assert!(new_index > index, "{new_index} <= {index}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn blocking_queries_beyond_the_bound_answer_429_at_once() {
    let _heavy = exclusive().await;
    // Phase 1: a dev agent that holds at most five blocking queries.
    let agent = Agent::dev_with(&["--max-blocking-queries", "5"]).await;
    let http = agent.http();
    for n in 0..6 {
        let reply = http.put(&format!("/v1/kv/k/{n}"), "v").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let index = http.get("/v1/kv/k/5").await.index();
    // Five different keys: watchers of one key would share one wait, and take one slot.
    let url = |n: usize| http.url(&format!("/v1/kv/k/{n}?index={index}&wait=60s"));
    let client = reqwest::Client::new();
    let held: Vec<_> = (0..5)
        .map(|n| tokio::spawn(watch(client.clone(), url(n))))
        .collect();
    eventually(REGISTER_LIMIT, "five blocking queries held", || async {
        (blocking_queries(&http).await == 5).then_some(())
    })
    .await;

    // Phase 2: a sixth is refused at once; a plain read still works.
    let started = Instant::now();
    let reply = http
        .get(&format!("/v1/kv/k/5?index={index}&wait=60s"))
        .await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.text()
    );
    assert!(reply.text().contains("Too many blocking queries"));
    assert!(started.elapsed() < UNRELATED_LIMIT);
    assert_eq!(http.get("/v1/kv/k/5").await.status, StatusCode::OK);

    // Phase 3: writes answer the five held ones.
    for n in 0..5 {
        assert_eq!(
            http.put(&format!("/v1/kv/k/{n}"), "w").await.status,
            StatusCode::OK
        );
    }
    for (status, _) in join_all(held).await.into_iter().map(Result::unwrap) {
        assert_eq!(status, StatusCode::OK);
    }
}
