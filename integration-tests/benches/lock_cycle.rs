//! Uncontended lock cycle on a dev agent: one client, one session, `acquire` + `release` of one
//! key over HTTP with a reused connection. Prints the latency percentiles of the pair.
//!
//! Run: `cargo bench -p integration-tests --bench lock_cycle` (set `CYCLES` to change the count).

use std::time::Instant;

use hdrhistogram::Histogram;
use integration_tests::Agent;

const WARMUP: usize = 200;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cycles: usize = std::env::var("CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let agent = Agent::dev().await;
    let session = agent.session(r#"{"LockDelay":"0s"}"#).await;
    let acquire = format!("/v1/kv/bench/lock?acquire={session}");
    let release = format!("/v1/kv/bench/lock?release={session}");
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let started = Instant::now();
    for i in 0..WARMUP + cycles {
        let t = Instant::now();
        assert_eq!(agent.put(&acquire, "held").await.text(), "true");
        assert_eq!(agent.put(&release, "free").await.text(), "true");
        if i >= WARMUP {
            hist.record(t.elapsed().as_micros() as u64).expect("record");
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "lock_cycle: {cycles} acquire+release pairs, p50 {} µs, p90 {} µs, p99 {} µs, max {} µs, {:.0} pairs/s",
        hist.value_at_quantile(0.50),
        hist.value_at_quantile(0.90),
        hist.value_at_quantile(0.99),
        hist.max(),
        (WARMUP + cycles) as f64 / secs
    );
}
