//! The Jepsen-style checker (`integration_tests::jepsen`) in CI: a short run with every fault
//! this machine can inject (kills, pauses, partitions and a full disk need root), which must
//! find no anomaly; and a negative control per check, which must find one: `?stale` reads from
//! followers that were paused are not linearizable, a resource that trusts stale tokens loses
//! updates, and sessions held to a longer TTL than they were given are invalidated early. A failure prints the seed, the schedule and the command that replays
//! it (`vigil-jepsen`, longer runs by `--minutes`).

use std::time::Duration;

use integration_tests::jepsen::{Plan, run};

use crate::common::exclusive;

/// The seed of CI's runs; `VIGIL_JEPSEN_SEED` picks another.
fn seed() -> u64 {
    std::env::var("VIGIL_JEPSEN_SEED")
        .ok()
        .map_or(27, |s| s.parse().expect("VIGIL_JEPSEN_SEED is a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_under_faults_finds_no_anomaly() {
    let _heavy = exclusive().await;
    let plan = Plan::faults(seed(), Duration::from_secs(75));
    let report = run(&plan).await.expect("the checker's run");
    println!("{report}");
    assert!(report.register_ops > 500, "too little traffic: {report}");
    assert!(
        report
            .locks
            .iter()
            .all(|(_, tally, _)| tally.increments > 10),
        "too few lock holds: {report}"
    );
    assert_eq!(report.problems(), 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_reads_are_caught_as_not_linearizable() {
    let _heavy = exclusive().await;
    let report = run(&Plan::stale_reads(seed()))
        .await
        .expect("the checker's run");
    println!("{report}");
    assert!(
        !report.anomalies.is_empty(),
        "?stale reads across paused followers passed as linearizable: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_that_trusts_stale_tokens_loses_updates() {
    let _heavy = exclusive().await;
    let report = run(&Plan::trusting_fence(seed()))
        .await
        .expect("the checker's run");
    println!("{report}");
    assert!(
        report
            .locks
            .iter()
            .any(|(_, tally, _)| tally.lost_updates() > 0),
        "no update was lost with a resource that trusts stale tokens: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_held_to_a_longer_ttl_than_given_are_caught() {
    let _heavy = exclusive().await;
    let report = run(&Plan::shortened_ttl(seed()))
        .await
        .expect("the checker's run");
    println!("{report}");
    assert!(
        !report.sessions.early.is_empty(),
        "no early invalidation found for sessions shorter than promised: {report}"
    );
}
