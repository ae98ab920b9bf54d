//! A 3-server cluster on loopback (fsync on, redb logs in temp dirs): KV put throughput and
//! latency at 1, 16 and 64 concurrent writers against the leader (group commit turns concurrent
//! writes into shared appends and fsyncs), and the time from `kill -9` of the leader to a new
//! agreed leader (median of 5).
//!
//! Run: `cargo bench -p integration-tests --bench cluster` (`SECONDS` sets each phase's length).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use integration_tests::cluster::Cluster;

const VALUE: [u8; 128] = [b'v'; 128];

async fn writers(
    http: &integration_tests::Http,
    clients: usize,
    run_for: Duration,
) -> (f64, Histogram<u64>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let http = http.clone();
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new(3).expect("histogram");
                let mut n = 0u64;
                while started.elapsed() < run_for {
                    let t = Instant::now();
                    let reply = http
                        .put(&format!("/v1/kv/bench/{c}/{n}"), VALUE.to_vec())
                        .await;
                    assert_eq!(reply.text(), "true", "put failed");
                    hist.record(t.elapsed().as_micros() as u64).expect("record");
                    n += 1;
                }
                hist
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for task in tasks {
        all.add(task.await.expect("writer task")).expect("merge");
    }
    (all.len() as f64 / started.elapsed().as_secs_f64(), all)
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let http = cluster.server(leader).http();

    // Warm up connections and the log.
    writers(&http, 4, Duration::from_secs(1)).await;
    for clients in [1, 16, 64] {
        let (rate, hist) = writers(&http, clients, Duration::from_secs(seconds)).await;
        println!(
            "cluster_put: {clients:>2} writers: {rate:>7.0} writes/s, p50 {} µs, p99 {} µs",
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99)
        );
    }

    let mut failovers = Vec::new();
    for _ in 0..5 {
        let old = cluster.leader().await;
        let t = Instant::now();
        cluster.kill9(old).await;
        let new = cluster.leader_within(Duration::from_secs(30)).await;
        failovers.push(t.elapsed());
        assert_ne!(new, old);
        cluster.restart(old).await;
        cluster.leader().await;
    }
    failovers.sort();
    println!(
        "leader_failover: kill -9 of the leader → new agreed leader: median {:?} (all: {:?})",
        failovers[2], failovers
    );
}
