//! The simulation's share of CI: a few hundred seeds (shorter runs, in a debug build), the
//! seeds that failed during development as regression tests, a seed replaying the same trace,
//! and the negative controls: each planted bug is found within a bounded number of seeds.

use std::time::Duration;

use vigil_sim::{Config, Plant, Report, run, run_catching};

/// Runs `configs` on every core, and returns the reports that found violations.
fn failures(configs: Vec<Config>) -> Vec<Report> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let configs = std::sync::Mutex::new(configs);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(config) = configs.lock().unwrap().pop() {
                    let report = run_catching(config);
                    if !report.violations.is_empty() {
                        failed.lock().unwrap().push(report);
                    }
                }
            });
        }
    });
    failed.into_inner().unwrap()
}

fn describe(reports: &[Report]) -> String {
    reports
        .iter()
        .map(|r| format!("seed {}: {}", r.seed, r.violations.join("; ")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn two_hundred_short_seeds_run_clean() {
    let configs = (10_000..10_200)
        .map(|seed| Config {
            duration: Duration::from_secs(8),
            ..Config::new(seed)
        })
        .collect();
    let failed = failures(configs);
    assert!(failed.is_empty(), "{}", describe(&failed));
}

/// Seeds that found bugs while the simulation was written: a restarted leader resuming its
/// term served stale reads (5); a renewal after a long silence acknowledged just before the
/// leader died was cut short by the next leader (124); a blocking read reaching a leader that
/// took a while to confirm its lease was held for that time beyond its wait (24, 53), and for
/// as long as the confirmation hung, seconds, when it took longer than the wait (2220).
#[test]
fn the_seeds_that_found_bugs_run_clean() {
    let failed = failures([5, 124, 24, 53, 2220].map(Config::new).to_vec());
    assert!(failed.is_empty(), "{}", describe(&failed));
}

#[test]
fn a_seed_replays_the_same_trace() {
    for seed in [1, 2, 3] {
        let first = run(Config::new(seed));
        let again = run(Config::new(seed));
        assert!(first.trace.len() > 50, "seed {seed} did something");
        assert_eq!(first.trace, again.trace, "seed {seed}");
        assert_eq!(first.digest, again.digest);
    }
}

/// Asserts that a run with `plant` finds it within 20 seeds, with a violation saying `what`
/// (a planted bug may break other checks too, in other seeds: those are not counted).
fn found_within_20_seeds(plant: Plant, what: &[&str]) {
    let says = |v: &String| what.iter().any(|w| v.contains(w));
    let mut seen = Vec::new();
    for seed in 0..20 {
        let report = run_catching(Config {
            plant,
            ..Config::new(seed)
        });
        if report.violations.iter().any(says) {
            return;
        }
        seen.extend(report.violations);
    }
    panic!("{plant:?}: no violation saying {what:?} within 20 seeds; found {seen:?}");
}

#[test]
fn an_acknowledged_but_unsynced_log_is_found() {
    found_within_20_seeds(
        Plant::LyingSync,
        &["committed as", "not linearizable", "log reversion"],
    );
}

#[test]
fn reads_without_a_confirmed_leader_are_found() {
    found_within_20_seeds(Plant::StaleReads, &["not linearizable"]);
}

#[test]
fn renewals_that_reach_no_timer_are_found() {
    found_within_20_seeds(
        Plant::RenewAnywhere,
        &["was expired", "renewed by a request sent"],
    );
}

#[test]
fn blocking_reads_that_ignore_their_wait_are_found() {
    found_within_20_seeds(Plant::WaitIgnored, &["beyond wait + wait/16"]);
}

#[test]
fn blocking_reads_that_answer_unchanged_early_are_found() {
    found_within_20_seeds(Plant::EarlyWakes, &["answered unchanged"]);
}

#[test]
fn a_queue_place_given_up_with_a_release_is_found() {
    found_within_20_seeds(
        Plant::LeaveReleases,
        &["while session", "told it did not hold it"],
    );
}

#[test]
fn a_lost_lock_delay_is_found() {
    found_within_20_seeds(Plant::NoLockDelay, &["within the lock-delay"]);
}

#[test]
fn a_destroy_acknowledged_but_not_committed_is_found() {
    found_within_20_seeds(Plant::LostDestroy, &["destroy was acknowledged"]);
}

#[test]
fn sessions_that_outlive_their_checks_are_found() {
    found_within_20_seeds(
        Plant::UnboundChecks,
        &["after its invalidation", "the session contract ended"],
    );
}

#[test]
fn renewals_that_arm_too_long_a_ttl_are_found() {
    found_within_20_seeds(Plant::LongRenewals, &["outlived its TTL"]);
}
