//! Leader failover: how long a cluster has no leader after its leader's process is killed, and
//! how long a client's write waits. Each round `kill -9`s the leader and measures two times:
//! until the remaining servers (members) all name one new leader among themselves, polling
//! every [`POLL`]; and until a write a client sends right after the kill succeeds (Vigil: a
//! `PUT` through a client agent, which holds it until a leader answers; etcd: a `put` from a
//! client of all three members, retried after [`WRITE_TRY`] without an answer, as etcd's
//! clients retry). Then the killed process is started again from its data directory and the
//! round ends once all three agree again. Vigil's servers use the `lan` profile; etcd its
//! defaults (1 s election timeout). Median over the rounds.

use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::time::{Instant, sleep, timeout};
use vigil_client::Client;

use super::etcd::connect;
use super::load::median;
use super::report::{Better, Outcome, Row, Table, num};
use super::{Plan, System, Systems};

/// Longest a new leader may take.
const ELECTION_LIMIT: Duration = Duration::from_secs(30);
/// How often both systems are asked who leads (the same for both).
const POLL: Duration = Duration::from_millis(20);

/// How long an etcd write may go unanswered before the client tries again.
const WRITE_TRY: Duration = Duration::from_secs(1);

/// One round's figures: kill → new agreed leader, kill → a client's first write succeeds.
struct Round {
    leader: Duration,
    write: Duration,
}

/// Kill → new agreed leader and kill → first write through a client agent, per round.
async fn vigil(systems: &mut Systems, rounds: usize) -> Result<Vec<Round>> {
    let servers = systems.vigil.running_servers();
    let c = systems.vigil.add_client(&servers).await;
    let writer = Client::new(&systems.vigil.client(c).http().base)?;
    let mut results = Vec::new();
    for round in 0..rounds {
        let old = systems.vigil.leader().await;
        systems.vigil.kill9(old).await;
        let killed = Instant::now();
        let value = format!("round {round}");
        let writer = writer.clone();
        let write = tokio::spawn(async move {
            loop {
                if matches!(
                    writer.kv_put("bench/failover", value.as_bytes(), 0).await,
                    Ok(true)
                ) {
                    return Ok(killed.elapsed());
                }
                if killed.elapsed() > ELECTION_LIMIT {
                    bail!("no write succeeded within {ELECTION_LIMIT:?} of the leader's kill");
                }
                sleep(POLL).await;
            }
        });
        // Only a running server is ever reported as the leader.
        systems.vigil.leader_within(ELECTION_LIMIT).await;
        let leader = killed.elapsed();
        let write = write.await??;
        eprintln!(
            "  Vigil: kill -9 of the leader → new leader {:.2} s, first write through a client \
             agent {:.2} s",
            leader.as_secs_f64(),
            write.as_secs_f64()
        );
        results.push(Round { leader, write });
        systems.vigil.restart(old).await;
        systems.vigil.leader().await;
    }
    systems.vigil.kill9_client(c).await;
    Ok(results)
}

/// Kill → new agreed leader and kill → first write from a client of every member, per round.
async fn etcd(systems: &mut Systems, rounds: usize) -> Result<Vec<Round>> {
    let mut results = Vec::new();
    for round in 0..rounds {
        let mut writer = connect(&systems.etcd.endpoints()).await?;
        systems.etcd.kill9_leader().await?;
        let killed = Instant::now();
        let value = format!("round {round}");
        let write = tokio::spawn(async move {
            loop {
                let put = writer.put("bench/failover", value.as_bytes(), None);
                if matches!(timeout(WRITE_TRY, put).await, Ok(Ok(_))) {
                    return Ok(killed.elapsed());
                }
                if killed.elapsed() > ELECTION_LIMIT {
                    bail!("no etcd write succeeded within {ELECTION_LIMIT:?} of the leader's kill");
                }
                sleep(POLL).await;
            }
        });
        // Only a running member is ever reported as the leader.
        let leader = loop {
            if systems.etcd.leader_endpoint().await.is_ok() {
                break killed.elapsed();
            }
            if killed.elapsed() > ELECTION_LIMIT {
                bail!("etcd elected no new leader within {ELECTION_LIMIT:?}");
            }
            sleep(POLL).await;
        };
        let write = write.await??;
        eprintln!(
            "  etcd: kill -9 of the leader → new leader {:.2} s, first write {:.2} s",
            leader.as_secs_f64(),
            write.as_secs_f64()
        );
        results.push(Round { leader, write });
        systems.etcd.restart_killed().await?;
    }
    Ok(results)
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let rounds = plan.failover_rounds;
    // In this repetition's order.
    let (v, e) = if System::Vigil.turn() < System::Etcd.turn() {
        let v = vigil(systems, rounds).await?;
        (v, etcd(systems, rounds).await?)
    } else {
        let e = etcd(systems, rounds).await?;
        (vigil(systems, rounds).await?, e)
    };
    let secs = |d: &Duration| d.as_secs_f64();
    let leaders = |r: &[Round]| r.iter().map(|r| r.leader).collect::<Vec<_>>();
    let writes = |r: &[Round]| r.iter().map(|r| r.write).collect::<Vec<_>>();
    let details = json!({
        "rounds": rounds,
        "poll_ms": POLL.as_millis(),
        "vigil_kill_to_leader_s": leaders(&v).iter().map(secs).collect::<Vec<_>>(),
        "vigil_kill_to_client_agent_write_s": writes(&v).iter().map(secs).collect::<Vec<_>>(),
        "etcd_kill_to_leader_s": leaders(&e).iter().map(secs).collect::<Vec<_>>(),
        "etcd_kill_to_write_s": writes(&e).iter().map(secs).collect::<Vec<_>>(),
        "etcd_write_retry_s": WRITE_TRY.as_secs_f64(),
    });
    let (v_leader, e_leader) = (secs(&median(leaders(&v))), secs(&median(leaders(&e))));
    let (v_write, e_write) = (secs(&median(writes(&v))), secs(&median(writes(&e))));
    let rows = vec![
        Row::new(
            "failover.new_leader",
            format!("Leader failover: leader killed, median of {rounds}"),
            "kill → new leader (s)",
            Better::Lower,
            Some(v_leader),
            Some(e_leader),
        ),
        Row::new(
            "failover.first_write",
            format!("Leader failover: a client's write, median of {rounds}"),
            "kill → first write (s)",
            Better::Lower,
            Some(v_write),
            Some(e_write),
        ),
    ];
    let table = Table {
        title: format!("Leader failover (median of {rounds})"),
        header: [
            "system",
            "election timing",
            "kill → new leader (s)",
            "kill → first write (s)",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: vec![
            vec![
                "Vigil".to_owned(),
                "`lan` profile (openraft); the write through a client agent".to_owned(),
                num(v_leader),
                num(v_write),
            ],
            vec![
                "etcd".to_owned(),
                "defaults: 100 ms heartbeat, 1 s election timeout; the write from a client of \
                 every member"
                    .to_owned(),
                num(e_leader),
                num(e_write),
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
