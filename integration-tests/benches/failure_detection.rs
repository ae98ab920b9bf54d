//! Failure detection through gossip, per timing profile: a 3-server + 1-client cluster; ROUNDS
//! times a session (lock-delay 0) on the client holds a key, the client is `kill -9`ed, and we
//! measure kill → its `serfHealth` critical and kill → the key acquirable by another session
//! through a server; then a fresh client is started. Prints every round and the medians.
//!
//! Run: `cargo bench -p integration-tests --bench failure_detection` (`ROUNDS` changes the
//! count, `PROFILES=lan` or `PROFILES=local` runs one profile).

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Http, eventually};
use reqwest::StatusCode;
use tokio::time::{Instant, sleep};

/// Longest a round may take to see the failure (the `lan` profile needs ~5-6 s).
const DETECT_LIMIT: Duration = Duration::from_secs(60);

async fn acquire(agent: &Http, key: &str, session: &str) -> bool {
    let reply = agent
        .put(&format!("/v1/kv/{key}?acquire={session}"), "held")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.text() == "true"
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

async fn run_profile(profile: &str, rounds: usize) -> (Duration, Duration) {
    let mut cluster = Cluster::servers(3)
        .clients(1)
        .gossip_profile(profile)
        .start()
        .await;
    let server = cluster.server(0).http();
    let other = create_session(&server, r#"{"Name":"taker","LockDelay":"0s"}"#).await;
    let key = "bench/failure-detection";
    let (mut to_critical, mut to_acquirable) = (Vec::new(), Vec::new());
    let mut client = 0;
    for round in 0..rounds {
        let http = cluster.client(client).http();
        let node = cluster.clients[client].name.clone();
        let session = create_session(&http, r#"{"Name":"victim","LockDelay":"0s"}"#).await;
        assert!(acquire(&http, key, &session).await, "victim acquires");
        eventually(Duration::from_secs(30), "serfHealth passing", || async {
            (server.serf_health(&node).await.as_deref() == Some("passing")).then_some(())
        })
        .await;

        cluster.kill9_client(client).await;
        let killed = Instant::now();
        let (mut critical, mut acquirable) = (None, None);
        while critical.is_none() || acquirable.is_none() {
            assert!(
                killed.elapsed() < DETECT_LIMIT,
                "{profile}: failure not detected"
            );
            if critical.is_none() && server.serf_health(&node).await.as_deref() == Some("critical")
            {
                critical = Some(killed.elapsed());
            }
            if acquirable.is_none() && acquire(&server, key, &other).await {
                acquirable = Some(killed.elapsed());
            }
            sleep(Duration::from_millis(10)).await;
        }
        let (critical, acquirable) = (critical.unwrap_or_default(), acquirable.unwrap_or_default());
        println!(
            "failure_detection {profile} round {round}: kill→critical {:.2} s, kill→acquirable {:.2} s",
            critical.as_secs_f64(),
            acquirable.as_secs_f64()
        );
        to_critical.push(critical);
        to_acquirable.push(acquirable);
        let release = server
            .put(&format!("/v1/kv/{key}?release={other}"), "free")
            .await;
        assert_eq!(release.text(), "true", "release");
        client = cluster.add_client(&[0, 1, 2]).await;
    }
    (median(&mut to_critical), median(&mut to_acquirable))
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let profiles = std::env::var("PROFILES").unwrap_or_else(|_| "lan,local".to_owned());
    let mut results = Vec::new();
    for profile in profiles.split(',') {
        let (critical, acquirable) = run_profile(profile, rounds).await;
        results.push((profile.to_owned(), critical, acquirable));
    }
    for (profile, critical, acquirable) in results {
        println!(
            "failure_detection {profile}: {rounds} rounds, median kill→critical {:.2} s, \
             median kill→acquirable {:.2} s",
            critical.as_secs_f64(),
            acquirable.as_secs_f64()
        );
    }
}
