//! The lock-safety checker on processes on 127.0.0.1 (see `integration_tests::safety`): three
//! workers hand the fair lock `demo/leader` around through at least 200 handoffs while a seeded
//! schedule kills the leader, kills, freezes and cuts off the holder, and restarts every server;
//! the bank must never accept a stale token, grants must not overlap, no acknowledged KV write
//! may be lost, and the lock must be granted again soon after the last fault.
//!
//! Longer runs: `VIGIL_SAFETY_HANDOFFS=1000 VIGIL_SAFETY_FAULTS=25 VIGIL_SAFETY_SEED=7 cargo test
//! -p integration-tests --test it t80_safety_loopback -- --nocapture`.

use integration_tests::safety::{Plan, run_loopback};

use crate::common::{assert_safe, exclusive};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_on_loopback_never_let_a_stale_holder_write() {
    let _heavy = exclusive().await;
    let plan = Plan::loopback(80).with_env_overrides();
    let report = run_loopback(&plan).await.expect("the checker's run");
    println!("{report}");
    assert_safe(&report, &plan);
}
