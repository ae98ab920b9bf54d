//! Failure detection: how long a lock stays held after its holder's process is killed.
//!
//! - Vigil (`lan` gossip profile): each round starts a client agent, creates a session on it
//!   (lock-delay 0, bound to the node's `serfHealth`), takes a lock, `kill -9`s the agent and
//!   polls a server until the node's `serfHealth` is critical and another session can take the
//!   lock. Median over the rounds.
//! - etcd has no failure detector: a dead client's lock is freed when its lease expires. Each
//!   victim holds a v3lock `Lock` with a 3 s lease renewed every TTL/3 (as etcd's Go client
//!   renews), the shortest TTL that, like Vigil's `lan` profile, survives a 2 s pause of the
//!   holder. Victims die (keep-alives stop, connection closes: what a kill does to them) spread
//!   evenly over one keep-alive period; the time until the lock key is deleted is measured.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{EventType, LockOptions, WatchOptions};
use serde_json::json;
use tokio::time::{Instant, sleep, sleep_until};
use vigil_shared::client::Client;

use super::etcd::connect;
use super::etcd_concurrency::{Counters, Session};
use super::load::median;
use super::report::{Better, Outcome, Row, Table, num};
use super::{Plan, Systems};
use integration_tests::cluster::create_session;

/// Longest one detection may take (`lan` needs about 5 s).
const DETECT_LIMIT: Duration = Duration::from_secs(60);
/// etcd victims' lease TTL; see the module documentation.
const ETCD_TTL: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(10);

/// Kill → `serfHealth` critical and kill → lock free, per round.
async fn vigil(systems: &mut Systems, rounds: usize) -> Result<Vec<(Duration, Duration)>> {
    let servers: Vec<usize> = (0..systems.vigil.servers.len()).collect();
    let server = systems.vigil.server(0).http();
    let observer = Client::new(&server.base)?;
    let taker = create_session(&server, r#"{"Name":"taker","LockDelay":"0s"}"#).await;
    let key = "bench/failure-detection";
    let mut results = Vec::new();
    for _ in 0..rounds {
        let c = systems.vigil.add_client(&servers).await;
        let agent = systems.vigil.client(c).http();
        let node = systems.vigil.clients[c].name.clone();
        let victim = create_session(&agent, r#"{"Name":"victim","LockDelay":"0s"}"#).await;
        if !Client::new(&agent.base)?
            .kv_acquire(key, b"held", 0, &victim)
            .await?
            .acquired
        {
            bail!("the victim could not take the lock");
        }
        let passing = Instant::now() + DETECT_LIMIT;
        while server.serf_health(&node).await.as_deref() != Some("passing") {
            if Instant::now() >= passing {
                bail!("{node}'s serfHealth never passed");
            }
            sleep(POLL).await;
        }

        systems.vigil.kill9_client(c).await;
        let killed = Instant::now();
        let (mut critical, mut free) = (None, None);
        while critical.is_none() || free.is_none() {
            if killed.elapsed() > DETECT_LIMIT {
                bail!("{node}'s failure not detected within {DETECT_LIMIT:?}");
            }
            if critical.is_none() && server.serf_health(&node).await.as_deref() == Some("critical")
            {
                critical = Some(killed.elapsed());
            }
            if free.is_none()
                && observer
                    .kv_acquire(key, b"taken", 0, &taker)
                    .await?
                    .acquired
            {
                free = Some(killed.elapsed());
            }
            sleep(POLL).await;
        }
        let (critical, free) = (critical.unwrap_or_default(), free.unwrap_or_default());
        eprintln!(
            "  Vigil: kill -9 → critical {:.2} s, lock free {:.2} s",
            critical.as_secs_f64(),
            free.as_secs_f64()
        );
        results.push((critical, free));
        if !observer.kv_release(key, b"free", 0, &taker).await? {
            bail!("the taker could not release the lock");
        }
    }
    Ok(results)
}

/// Kill → lock free, per victim.
async fn etcd(endpoint: &str, victims: usize) -> Result<Vec<Duration>> {
    let counters = Arc::new(Counters::default());
    let observer = connect(&[endpoint.to_owned()]).await?;
    let mut prepared = Vec::new();
    for i in 0..victims {
        let mut client = connect(&[endpoint.to_owned()]).await?;
        let session = Session::new(&client, ETCD_TTL, &counters).await?;
        let options = LockOptions::new().with_lease(session.lease());
        let key = client
            .lock(format!("bench/failure/{i}"), Some(options))
            .await?
            .key()
            .to_vec();
        let mut watch = observer
            .clone()
            .watch(key, Some(WatchOptions::new()))
            .await?;
        let created = watch.message().await?.context("watch stream ended")?;
        if !created.created() {
            bail!("expected the watch-created answer first");
        }
        prepared.push((client, session, watch));
    }
    let start = Instant::now();
    let period = ETCD_TTL / 3;
    let tasks: Vec<_> = prepared
        .into_iter()
        .enumerate()
        .map(|(i, (client, session, mut watch))| {
            let dies_at = start + period.mul_f64(i as f64 / victims as f64);
            tokio::spawn(async move {
                sleep_until(dies_at).await;
                drop((session, client));
                let killed = Instant::now();
                while let Some(resp) = tokio::time::timeout(DETECT_LIMIT, watch.message()).await?? {
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(killed.elapsed());
                    }
                }
                bail!("watch ended before the lock was freed")
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        let free: Duration = task.await??;
        eprintln!(
            "  etcd: client gone → lock free {:.2} s",
            free.as_secs_f64()
        );
        results.push(free);
    }
    Ok(results)
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let rounds = plan.failure_rounds;
    let v = vigil(systems, rounds).await?;
    let leaders = systems.leaders().await?;
    let e = etcd(&leaders.etcd_endpoint, rounds).await?;
    let secs = |d: &Duration| d.as_secs_f64();
    let v_critical: Vec<Duration> = v.iter().map(|r| r.0).collect();
    let v_free: Vec<Duration> = v.iter().map(|r| r.1).collect();
    let details = json!({
        "rounds": rounds,
        "vigil_kill_to_critical_s": v_critical.iter().map(secs).collect::<Vec<_>>(),
        "vigil_kill_to_free_s": v_free.iter().map(secs).collect::<Vec<_>>(),
        "etcd_lease_ttl_s": ETCD_TTL.as_secs(),
        "etcd_kill_to_free_s": e.iter().map(secs).collect::<Vec<_>>(),
    });
    let critical = secs(&median(v_critical));
    let (v_free, e_free) = (secs(&median(v_free)), secs(&median(e)));
    let rows = vec![Row::new(
        "failure.lock_free",
        format!("Failure detection: holder killed, median of {rounds}"),
        "kill → lock free (s)",
        Better::Lower,
        Some(v_free),
        Some(e_free),
    )];
    let table = Table {
        title: format!("Failure detection (median of {rounds})"),
        header: [
            "system",
            "how a dead holder is noticed",
            "kill → node critical (s)",
            "kill → lock free (s)",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: vec![
            vec![
                "Vigil".to_owned(),
                "gossip (`lan` profile): serfHealth critical, the node's sessions invalidated"
                    .to_owned(),
                num(critical),
                num(v_free),
            ],
            vec![
                "etcd".to_owned(),
                format!(
                    "lease expiry ({} s TTL, renewed every TTL/3)",
                    ETCD_TTL.as_secs()
                ),
                "—".to_owned(),
                num(e_free),
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
