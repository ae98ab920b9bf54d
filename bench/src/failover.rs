//! Leader failover: how long a cluster has no leader after its leader's process is killed, and
//! how long a client's write waits. Each round `kill -9`s the leader and measures two times:
//! until the remaining servers (members) all name one new leader among themselves, polling
//! every [`POLL`]; and until a write a client sends right after the kill succeeds (Vigil: a
//! `PUT` through a client agent, which holds it until a leader answers; etcd: a `put` from a
//! client of all three members, retried after [`WRITE_TRY`] without an answer, as etcd's
//! clients retry). Then the killed process is started again from its data directory and the
//! round ends once all three agree again. A third time: until a lock a client asks for right
//! after the kill is granted, on a key nobody holds and with a session (etcd: a lease) made
//! before the kill (Vigil and Consul: `?acquire` through the same client as the write; etcd: a
//! v3lock `Lock` from a client of every member, retried as its write is). Vigil's servers use the `lan` profile; etcd its
//! defaults (1 s election timeout); Consul, when it runs, its defaults too (`raft_multiplier`
//! 5), with the write sent to a surviving server, which forwards it to the leader. Median over
//! the rounds.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::LockOptions;
use futures::FutureExt;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use vigil_client::{Client, SessionRequest};

use super::death::until;
use super::etcd::connect;
use super::load::median;
use super::report::{Better, Outcome, Row, Table, num};
use super::{Plan, System, Systems};

/// Longest a new leader may take.
const ELECTION_LIMIT: Duration = Duration::from_secs(30);
/// How often both systems are asked who leads (the same for both).
const POLL: Duration = Duration::from_millis(20);

/// Beside the rows: what Consul's figures are made of.
const CONSUL_NOTE: &str = "Consul runs with its default `performance.raft_multiplier` of 5, \
    which its documentation describes as suited to minimal servers (it recommends 1 for \
    production): heartbeat and election timeouts of 5 s instead of 1 s, and a follower that \
    still hears of the old leader refuses its votes until its own timeout runs out.";

/// The TTL of the lease an etcd round's first lock is taken with (it outlives the round).
const LOCK_LEASE_SECS: i64 = 60;

/// How long an etcd write may go unanswered before the client tries again.
const WRITE_TRY: Duration = Duration::from_secs(1);

/// One round's figures: kill → new agreed leader, kill → a client's first write succeeds,
/// kill → a client's first lock is granted.
struct Round {
    leader: Duration,
    write: Duration,
    lock: Duration,
}

impl Round {
    /// One round's figures, printed as they come; `system` names who was measured.
    fn logged(system: &str, leader: Duration, write: Duration, lock: Duration) -> Round {
        eprintln!(
            "  {system}: kill -9 of the leader → new leader {:.2} s, first write {:.2} s, first \
             lock {:.2} s",
            leader.as_secs_f64(),
            write.as_secs_f64(),
            lock.as_secs_f64()
        );
        Round {
            leader,
            write,
            lock,
        }
    }
}

/// The lock key of round `round`: a fresh one each round, so no lock-delay applies.
fn lock_key(round: usize) -> String {
    format!("bench/failover-lock/{round}")
}

/// Kill → new agreed leader and kill → first write through a client agent, per round.
async fn vigil(systems: &mut Systems, rounds: usize) -> Result<Vec<Round>> {
    let servers = systems.vigil.running_servers();
    let c = systems.vigil.add_client(&servers).await;
    let writer = Client::new(&systems.vigil.client(c).http().base)?;
    let mut results = Vec::new();
    for round in 0..rounds {
        let old = systems.vigil.leader().await;
        let session = writer.session_create(&lock_session()).await?;
        systems.vigil.kill9(old).await;
        let killed = Instant::now();
        let write = first_write(writer.clone(), round, killed);
        let lock = first_lock(writer.clone(), session.clone(), round, killed);
        // Only a running server is ever reported as the leader.
        systems.vigil.leader_within(ELECTION_LIMIT).await;
        let leader = killed.elapsed();
        let (write, lock) = (write.await??, lock.await??);
        results.push(Round::logged(
            "Vigil (through a client agent)",
            leader,
            write,
            lock,
        ));
        systems.vigil.restart(old).await;
        systems.vigil.leader().await;
        writer.session_destroy(&session).await?;
    }
    systems.vigil.kill9_client(c).await;
    Ok(results)
}

/// Asks `leads` every [`POLL`] until it says a new leader is in place; the time since `killed`.
async fn new_leader<F: Future<Output = bool>>(
    killed: Instant,
    system: &str,
    mut leads: impl FnMut() -> F,
) -> Result<Duration> {
    loop {
        if leads().await {
            return Ok(killed.elapsed());
        }
        if killed.elapsed() > ELECTION_LIMIT {
            bail!("{system} elected no new leader within {ELECTION_LIMIT:?}");
        }
        sleep(POLL).await;
    }
}

/// A session for the first lock after a kill: no lock-delay, and a TTL no failover outlasts.
fn lock_session() -> SessionRequest {
    SessionRequest {
        name: "bench-failover".to_owned(),
        lock_delay: Some(Duration::ZERO),
        ..SessionRequest::default()
    }
}

/// Asks `locker` for round `round`'s lock with `session` until it is granted; resolves to the
/// time since `killed`.
fn first_lock(
    locker: Client,
    session: String,
    round: usize,
    killed: Instant,
) -> JoinHandle<Result<Duration>> {
    tokio::spawn(async move {
        let key = lock_key(round);
        loop {
            if let Ok(acquired) = locker.kv_acquire(&key, b"", 0, &session).await
                && acquired.acquired
            {
                return Ok(killed.elapsed());
            }
            if killed.elapsed() > ELECTION_LIMIT {
                bail!("no lock was granted within {ELECTION_LIMIT:?} of the leader's kill");
            }
            sleep(POLL).await;
        }
    })
}

/// Puts a key through `writer` until a put succeeds; resolves to the time since `killed`.
fn first_write(writer: Client, round: usize, killed: Instant) -> JoinHandle<Result<Duration>> {
    let value = format!("round {round}");
    tokio::spawn(async move {
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
    })
}

/// Kill → new agreed leader and kill → first write sent to a surviving server (which forwards
/// it to the leader once there is one), per round; `None` without a Consul cluster.
async fn consul(systems: &mut Systems, rounds: usize) -> Result<Option<Vec<Round>>> {
    let Some(consul) = systems.consul.as_mut() else {
        return Ok(None);
    };
    let mut results = Vec::new();
    for round in 0..rounds {
        let (old, _) = consul.leader().await?;
        let survivor = consul.running_http().into_iter().find(|http| *http != old);
        let writer = Client::new(&survivor.context("no other Consul server")?)?;
        // Made before the kill (not timed). The server restarted in the round before may
        // still be critical in its own gossip health for a few seconds, and Consul refuses a
        // session on a critical node ("Check 'serfHealth' is in critical state").
        let session = until("a session on a healthy Consul server", || async {
            writer.session_create(&lock_session()).await.ok()
        })
        .await?;
        consul.kill9_leader().await?;
        let killed = Instant::now();
        let write = first_write(writer.clone(), round, killed);
        let lock = first_lock(writer.clone(), session.clone(), round, killed);
        // Only a running server is ever reported as the leader.
        let leader = new_leader(killed, "Consul", || consul.leader().map(|l| l.is_ok())).await?;
        let (write, lock) = (write.await??, lock.await??);
        results.push(Round::logged("Consul", leader, write, lock));
        consul.restart_killed().await?;
        writer.session_destroy(&session).await?;
    }
    Ok(Some(results))
}

/// Kill → new agreed leader and kill → first write from a client of every member, per round.
async fn etcd(systems: &mut Systems, rounds: usize) -> Result<Vec<Round>> {
    let mut results = Vec::new();
    for round in 0..rounds {
        let mut writer = connect(&systems.etcd.endpoints()).await?;
        let mut locker = writer.clone();
        let lease = writer.lease_grant(LOCK_LEASE_SECS, None).await?.id();
        systems.etcd.kill9_leader().await?;
        let killed = Instant::now();
        let lock = tokio::spawn(async move {
            let options = LockOptions::new().with_lease(lease);
            loop {
                let lock = locker.lock(lock_key(round), Some(options.clone()));
                if matches!(timeout(WRITE_TRY, lock).await, Ok(Ok(_))) {
                    return Ok(killed.elapsed());
                }
                if killed.elapsed() > ELECTION_LIMIT {
                    bail!(
                        "no etcd lock was granted within {ELECTION_LIMIT:?} of the leader's kill"
                    );
                }
                sleep(POLL).await;
            }
        });
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
        let etcd = &systems.etcd;
        let leader =
            new_leader(killed, "etcd", || etcd.leader_endpoint().map(|l| l.is_ok())).await?;
        let (write, lock) = (write.await??, lock.await??);
        results.push(Round::logged("etcd", leader, write, lock));
        systems.etcd.restart_killed().await?;
    }
    Ok(results)
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let rounds = plan.failover_rounds;
    let (mut v, mut e, mut c) = (None, None, None);
    for system in System::order() {
        match system {
            System::Vigil => v = Some(vigil(systems, rounds).await?),
            System::Etcd => e = Some(etcd(systems, rounds).await?),
            System::Consul => c = consul(systems, rounds).await?,
        }
    }
    let (v, e) = (v.context("Vigil's rounds")?, e.context("etcd's rounds")?);
    let secs = |d: &Duration| d.as_secs_f64();
    let leaders = |r: &[Round]| r.iter().map(|r| r.leader).collect::<Vec<_>>();
    let writes = |r: &[Round]| r.iter().map(|r| r.write).collect::<Vec<_>>();
    let locks = |r: &[Round]| r.iter().map(|r| r.lock).collect::<Vec<_>>();
    let details = json!({
        "rounds": rounds,
        "poll_ms": POLL.as_millis(),
        "vigil_kill_to_leader_s": leaders(&v).iter().map(secs).collect::<Vec<_>>(),
        "vigil_kill_to_client_agent_write_s": writes(&v).iter().map(secs).collect::<Vec<_>>(),
        "etcd_kill_to_leader_s": leaders(&e).iter().map(secs).collect::<Vec<_>>(),
        "etcd_kill_to_write_s": writes(&e).iter().map(secs).collect::<Vec<_>>(),
        "etcd_write_retry_s": WRITE_TRY.as_secs_f64(),
        "consul_kill_to_leader_s": c.as_deref().map(|c| leaders(c).iter().map(secs).collect::<Vec<_>>()),
        "consul_kill_to_write_s": c.as_deref().map(|c| writes(c).iter().map(secs).collect::<Vec<_>>()),
        "vigil_kill_to_client_agent_lock_s": locks(&v).iter().map(secs).collect::<Vec<_>>(),
        "etcd_kill_to_lock_s": locks(&e).iter().map(secs).collect::<Vec<_>>(),
        "consul_kill_to_lock_s": c.as_deref().map(|c| locks(c).iter().map(secs).collect::<Vec<_>>()),
    });
    let c_lock = c.as_deref().map(|c| secs(&median(locks(c))));
    let (v_lock, e_lock) = (secs(&median(locks(&v))), secs(&median(locks(&e))));
    let c_leader = c.as_deref().map(|c| secs(&median(leaders(c))));
    let c_write = c.as_deref().map(|c| secs(&median(writes(c))));
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
        )
        .with_consul(c_leader)
        .with_note(CONSUL_NOTE),
        Row::new(
            "failover.first_write",
            format!("Leader failover: a client's write, median of {rounds}"),
            "kill → first write (s)",
            Better::Lower,
            Some(v_write),
            Some(e_write),
        )
        .with_consul(c_write)
        .with_note(CONSUL_NOTE),
        Row::new(
            "failover.first_lock",
            format!("Leader failover: a client's lock, median of {rounds}"),
            "kill → first lock granted (s)",
            Better::Lower,
            Some(v_lock),
            Some(e_lock),
        )
        .with_consul(c_lock)
        .with_note(CONSUL_NOTE),
    ];
    let table = Table {
        title: format!("Leader failover (median of {rounds})"),
        header: [
            "system",
            "election timing",
            "kill → new leader (s)",
            "kill → first write (s)",
            "kill → first lock (s)",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: vec![
            vec![
                "Vigil".to_owned(),
                "`lan` profile (openraft); the write through a client agent".to_owned(),
                num(v_leader),
                num(v_write),
                num(v_lock),
            ],
            vec![
                "etcd".to_owned(),
                "defaults: 100 ms heartbeat, 1 s election timeout; the write from a client of \
                 every member"
                    .to_owned(),
                num(e_leader),
                num(e_write),
                num(e_lock),
            ],
        ]
        .into_iter()
        .chain(
            c_leader
                .zip(c_write)
                .zip(c_lock)
                .map(|((leader, write), lock)| {
                    vec![
                        "Consul".to_owned(),
                        "defaults (`raft_multiplier` 5: 5 s heartbeat and election timeouts); the \
                 write sent to a surviving server, which forwards it to the leader"
                            .to_owned(),
                        num(leader),
                        num(write),
                        num(lock),
                    ]
                }),
        )
        .collect(),
    };
    Ok(Outcome {
        rows,
        tables: vec![table],
        details,
        usage: Vec::new(),
    })
}
