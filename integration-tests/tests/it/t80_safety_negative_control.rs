//! The checker's negative control: a deliberately broken setup (lock-delay 0, workers that
//! write without their fencing token and ignore losing the lock, a bank that accepts such
//! writes) with the holder cut off from the cluster mid-turn. The next holder writes while the
//! cut-off one still does, so the checker must report stale writes: proof that it can fail.

use integration_tests::safety::check::Property;
use integration_tests::safety::{Plan, run_loopback};

use crate::common::exclusive;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_setup_is_caught() {
    let _heavy = exclusive().await;
    let plan = Plan::negative_control(81);
    let report = run_loopback(&plan).await.expect("the checker's run");
    println!("{report}");
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.property == Property::StaleWrite),
        "the checker found no stale write in a setup without fencing: {report}"
    );
}
