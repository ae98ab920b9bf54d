//! Leader failover: how long a cluster has no leader after its leader's process is killed.
//! Each round `kill -9`s the leader and measures the time until the remaining servers (members)
//! all name one new leader among themselves, polling every [`POLL`]; then the killed process is
//! started again from its data directory and the round ends once all three agree again.
//! Vigil's servers use the `lan` profile; etcd its defaults (1 s election timeout). Median over
//! the rounds.

use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::time::{Instant, sleep};

use super::load::median;
use super::report::{Better, Outcome, Row, Table, num};
use super::{Plan, Systems};

/// Longest a new leader may take.
const ELECTION_LIMIT: Duration = Duration::from_secs(30);
/// How often both systems are asked who leads (the same for both).
const POLL: Duration = Duration::from_millis(20);

/// Kill → new agreed leader, per round.
async fn vigil(systems: &mut Systems, rounds: usize) -> Result<Vec<Duration>> {
    let mut results = Vec::new();
    for _ in 0..rounds {
        let old = systems.vigil.leader().await;
        systems.vigil.kill9(old).await;
        let killed = Instant::now();
        // Only a running server is ever reported as the leader.
        systems.vigil.leader_within(ELECTION_LIMIT).await;
        let elapsed = killed.elapsed();
        eprintln!(
            "  Vigil: kill -9 of the leader → new leader {:.2} s",
            elapsed.as_secs_f64()
        );
        results.push(elapsed);
        systems.vigil.restart(old).await;
        systems.vigil.leader().await;
    }
    Ok(results)
}

/// Kill → new agreed leader, per round.
async fn etcd(systems: &mut Systems, rounds: usize) -> Result<Vec<Duration>> {
    let mut results = Vec::new();
    for _ in 0..rounds {
        systems.etcd.kill9_leader().await?;
        let killed = Instant::now();
        // Only a running member is ever reported as the leader.
        let elapsed = loop {
            if systems.etcd.leader_endpoint().await.is_ok() {
                break killed.elapsed();
            }
            if killed.elapsed() > ELECTION_LIMIT {
                bail!("etcd elected no new leader within {ELECTION_LIMIT:?}");
            }
            sleep(POLL).await;
        };
        eprintln!(
            "  etcd: kill -9 of the leader → new leader {:.2} s",
            elapsed.as_secs_f64()
        );
        results.push(elapsed);
        systems.etcd.restart_killed().await?;
    }
    Ok(results)
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let rounds = plan.failover_rounds;
    let v = vigil(systems, rounds).await?;
    let e = etcd(systems, rounds).await?;
    let secs = |d: &Duration| d.as_secs_f64();
    let details = json!({
        "rounds": rounds,
        "poll_ms": POLL.as_millis(),
        "vigil_kill_to_leader_s": v.iter().map(secs).collect::<Vec<_>>(),
        "etcd_kill_to_leader_s": e.iter().map(secs).collect::<Vec<_>>(),
    });
    let (v, e) = (secs(&median(v)), secs(&median(e)));
    let rows = vec![Row::new(
        "failover.new_leader",
        format!("Leader failover: leader killed, median of {rounds}"),
        "kill → new leader (s)",
        Better::Lower,
        Some(v),
        Some(e),
    )];
    let table = Table {
        title: format!("Leader failover (median of {rounds})"),
        header: ["system", "election timing", "kill → new leader (s)"]
            .map(str::to_owned)
            .to_vec(),
        rows: vec![
            vec![
                "Vigil".to_owned(),
                "`lan` profile (openraft)".to_owned(),
                num(v),
            ],
            vec![
                "etcd".to_owned(),
                "defaults: 100 ms heartbeat, 1 s election timeout".to_owned(),
                num(e),
            ],
        ],
    };
    Ok(Outcome {
        rows,
        tables: vec![table],
        details,
        usage: Vec::new(),
    })
}
