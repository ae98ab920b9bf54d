//! What keeping many idle sessions alive costs the servers: `Plan::idle_sessions` sessions
//! (Vigil, Consul) or leases (etcd), all with the same [`TTL`], each kept alive the way its
//! system's clients keep one alive, while nothing else happens:
//!
//! - Vigil and Consul: every session is renewed every TTL/2 (`PUT /v1/session/renew/<id>` to
//!   the leader, by the same client code for both), as the `RenewPeriodic` of Consul's Go `api`
//!   does; the renewals are spread evenly over the period and sent over a pool of [`WORKERS`]
//!   reused connections;
//! - etcd: every lease is kept alive every TTL/3, as etcd 3.4's Go `clientv3` does (it sends a
//!   lease's next keep-alive a third of the TTL after the last answer), all leases on one
//!   `LeaseKeepAlive` stream as `clientv3` multiplexes them; spread evenly over the period too.
//!
//! Measured, on the three servers (user + system time from `/proc/PID/stat`, added up): their
//! CPU over an idle window before any session exists, and over a window of the same length
//! once every session has been renewed at least once; the difference, in % of one core and per
//! renewal answered inside the window. A renewal answered "no such session" fails the workload.
//! Everything made is destroyed or revoked afterwards, outside the windows.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use etcd_client::LeaseKeeper;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::time::{Instant, sleep};
use vigil_client::{Client, SessionRequest};

use super::etcd::connect;
use super::load::{Schedule, Tally, pace};
use super::machine::{Meter, Usage};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, System, Systems};

/// Every session's and lease's TTL: Vigil's shortest (and Consul's).
const TTL: Duration = Duration::from_secs(10);
/// Concurrent HTTP renewers (and connections), and concurrent creates and destroys.
const WORKERS: usize = 32;

/// Beside the rows.
const NOTE: &str = "Each system keeps the sessions alive the way its own clients do: Vigil \
    and Consul renew each 10 s-TTL session every 5 s (TTL/2, as Consul's api RenewPeriodic \
    does) with a PUT to the leader, over 32 reused connections; etcd keeps each 10 s-TTL lease \
    alive every 3.3 s (TTL/3, as clientv3's keep-alive loop does), all on one LeaseKeepAlive \
    stream. So etcd answers 1.5× as many renewals for the same number of sessions: the CPU row \
    compares what keeping them alive costs each system's servers, the per-renewal row what one \
    renewal costs. Renewals are spread evenly over the period. Server CPU is the three servers' \
    user + system time over the window less the same servers' over an idle window of the same \
    length before any session existed (both under \"Idle sessions\"), so it is the renewals' \
    cost alone; a difference of a few % of a core is within this shared machine's noise.";

/// What one system's servers did.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    pub sessions: usize,
    pub renew_period_s: f64,
    /// Renewals answered per second inside the window, and what the schedule asks for.
    pub renewals_per_second: f64,
    pub scheduled_per_second: f64,
    pub setup_seconds: f64,
    pub idle: Usage,
    pub renewing: Usage,
    pub renewals: u64,
}

impl Cost {
    /// The servers' CPU above idle, in % of one core.
    fn net_percent(&self) -> f64 {
        self.renewing.servers_cpu_percent - self.idle.servers_cpu_percent
    }

    /// The servers' CPU above idle per renewal answered, in µs.
    fn per_renewal_us(&self) -> Option<f64> {
        let cpu_s = self.net_percent() / 100.0 * self.renewing.wall_seconds;
        (self.renewals > 0).then(|| cpu_s * 1e6 / self.renewals as f64)
    }
}

/// The servers' CPU over an idle window, before anything is made.
async fn idle(system: System, pids: &[u32], plan: &Plan) -> Result<Usage> {
    let meter = Meter::start(format!("Idle sessions: idle servers, {system}"), pids).await?;
    sleep(plan.idle_window).await;
    meter.stop()
}

/// Once `setup` (made while renewing began) is done and one `period` has passed, the servers'
/// CPU over the window and the renewals `tally` counted in it; the set-up's seconds too.
async fn renewing(
    system: System,
    pids: &[u32],
    plan: &Plan,
    period: Duration,
    tally: &Tally,
    setup: impl Future<Output = Result<()>>,
) -> Result<(Usage, f64, u64)> {
    let started = Instant::now();
    setup.await?;
    let setup_seconds = started.elapsed().as_secs_f64();
    sleep(period).await;
    let phase = format!("Idle sessions: {} renewed, {system}", plan.idle_sessions);
    let meter = Meter::start(phase, pids).await?;
    let before = tally.done();
    sleep(plan.idle_window).await;
    let renewals = tally.done() - before;
    Ok((meter.stop()?, setup_seconds, renewals))
}

/// Sessions on the HTTP API `client` speaks (Vigil's or Consul's), renewed every TTL/2.
async fn http(system: System, client: &Client, pids: &[u32], plan: &Plan) -> Result<Cost> {
    let n = plan.idle_sessions;
    let period = TTL / 2;
    let idle = idle(system, pids, plan).await?;
    let ids: Arc<Vec<OnceLock<String>>> = Arc::new((0..n).map(|_| OnceLock::new()).collect());
    let tally = Arc::new(Tally::default());
    let schedule = Schedule {
        start: Instant::now(),
        period,
        n,
    };
    let (renewer, made, counts) = (client.clone(), ids.clone(), tally.clone());
    // Renewing starts with the first create, so that no session waits out its TTL while the
    // others are made.
    let renewers = pace(schedule, WORKERS, move |i| {
        let id = made[i].get()?.clone();
        let (client, tally) = (renewer.clone(), counts.clone());
        Some(async move {
            match client.session_renew(&id).await {
                Ok(Some(_)) => drop(tally.done.fetch_add(1, Ordering::Relaxed)),
                Ok(None) => drop(tally.gone.fetch_add(1, Ordering::Relaxed)),
                Err(e) => tally.fail(&e.into()),
            }
        })
    });
    let creates = futures::stream::iter(0..n)
        .map(|i| {
            let (client, ids) = (client.clone(), ids.clone());
            async move {
                let request = SessionRequest {
                    name: "idle".to_owned(),
                    ttl: Some(TTL),
                    ..SessionRequest::default()
                };
                let id = client.session_create(&request).await?;
                ids[i]
                    .set(id)
                    .map_err(|_| anyhow!("session {i} made twice"))
            }
        })
        .buffer_unordered(WORKERS)
        .try_collect::<Vec<()>>();
    let measured = renewing(system, pids, plan, period, &tally, async {
        creates.await.map(drop)
    })
    .await;
    drop(renewers);
    let (renewing, setup_seconds, renewals) = measured?;
    tally.verdict(&format!("{system}'s renewals"))?;
    futures::stream::iter(ids.iter().filter_map(OnceLock::get))
        .map(|id| client.session_destroy(id))
        .buffer_unordered(WORKERS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(cost(plan, period, setup_seconds, idle, renewing, renewals))
}

/// Leases kept alive every TTL/3 on one stream, as etcd's Go client keeps them.
async fn etcd(leaders: &Leaders, plan: &Plan) -> Result<Cost> {
    let n = plan.idle_sessions;
    let period = TTL / 3;
    let pids = &leaders.etcd_pids;
    let idle = idle(System::Etcd, pids, plan).await?;
    let client = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    let ttl = i64::try_from(TTL.as_secs())?;
    // The stream is opened with a lease of its own, kept alive with the others.
    let first = client.lease_client().grant(ttl, None).await?.id();
    let (keeper, mut responses) = client.lease_client().keep_alive(first).await?;
    let tally = Arc::new(Tally::default());
    let counts = tally.clone();
    let reader = tokio::spawn(async move {
        loop {
            match responses.message().await {
                Ok(Some(answer)) if answer.ttl() > 0 => counts.done.fetch_add(1, Ordering::Relaxed),
                Ok(Some(_)) => counts.gone.fetch_add(1, Ordering::Relaxed),
                Ok(None) => return counts.fail(&anyhow!("the keep-alive stream ended")),
                Err(e) => return counts.fail(&e.into()),
            };
        }
    });
    let leases: Arc<Vec<OnceLock<i64>>> = Arc::new((0..n).map(|_| OnceLock::new()).collect());
    leases[0]
        .set(first)
        .map_err(|_| anyhow!("lease 0 made twice"))?;
    let schedule = Schedule {
        start: Instant::now(),
        period,
        n,
    };
    let (made, sender, counts) = (leases.clone(), keeper.sender.clone(), tally.clone());
    // One task sends every keep-alive, as clientv3's one send loop does.
    let keepers = pace(schedule, 1, move |i| {
        let id = *made[i].get()?;
        let (sender, tally) = (sender.clone(), counts.clone());
        // A keeper of lease `id` on the stream's sender: its request goes out on the stream.
        let mut keeper = LeaseKeeper { id, sender };
        Some(async move {
            if let Err(e) = keeper.keep_alive().await {
                tally.fail(&e.into());
            }
        })
    });
    let grants = futures::stream::iter(1..n)
        .map(|i| {
            let (mut lessor, leases) = (client.lease_client(), leases.clone());
            async move {
                let id = lessor.grant(ttl, None).await?.id();
                leases[i]
                    .set(id)
                    .map_err(|_| anyhow!("lease {i} made twice"))
            }
        })
        .buffer_unordered(WORKERS)
        .try_collect::<Vec<()>>();
    let measured = renewing(System::Etcd, pids, plan, period, &tally, async {
        grants.await.map(drop)
    })
    .await;
    drop(keepers);
    reader.abort();
    let (renewing, setup_seconds, renewals) = measured?;
    tally.verdict("etcd's keep-alives")?;
    futures::stream::iter(leases.iter().filter_map(OnceLock::get).copied())
        .map(|id| {
            let mut lessor = client.lease_client();
            async move { lessor.revoke(id).await.map(drop) }
        })
        .buffer_unordered(WORKERS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(cost(plan, period, setup_seconds, idle, renewing, renewals))
}

fn cost(
    plan: &Plan,
    period: Duration,
    setup_seconds: f64,
    idle: Usage,
    renewing: Usage,
    renewals: u64,
) -> Cost {
    Cost {
        sessions: plan.idle_sessions,
        renew_period_s: period.as_secs_f64(),
        renewals_per_second: renewals as f64 / renewing.wall_seconds,
        scheduled_per_second: plan.idle_sessions as f64 / period.as_secs_f64(),
        setup_seconds,
        idle,
        renewing,
        renewals,
    }
}

pub async fn workload(systems: &Systems, plan: &Plan) -> Result<Outcome> {
    let leaders = systems.leaders().await?;
    let (vigil, consul) = leaders.http_clients()?;
    let (mut v, mut e, mut c) = (None, None, None);
    for system in System::order() {
        match (system, &consul, leaders.pids(system)) {
            (System::Vigil, ..) => v = Some(http(system, &vigil, &leaders.vigil_pids, plan).await?),
            (System::Etcd, ..) => e = Some(etcd(&leaders, plan).await?),
            (System::Consul, Some(client), Some(pids)) => {
                c = Some(http(system, client, pids, plan).await?);
            }
            (System::Consul, ..) => {}
        }
    }
    let (v, e) = (v.context("Vigil's run")?, e.context("etcd's run")?);
    Ok(outcome(plan, v, e, c))
}

fn outcome(plan: &Plan, v: Cost, e: Cost, c: Option<Cost>) -> Outcome {
    let workload = format!(
        "{} idle sessions / leases, {} s TTL",
        plan.idle_sessions,
        TTL.as_secs()
    );
    let rows = vec![
        Row::new(
            "idle_sessions.cpu",
            &workload,
            "server CPU above idle (% of one core)",
            Better::Lower,
            Some(v.net_percent()),
            Some(e.net_percent()),
        )
        .with_consul(c.as_ref().map(Cost::net_percent))
        .with_note(NOTE),
        Row::new(
            "idle_sessions.per_renewal",
            &workload,
            "server CPU per renewal (µs)",
            Better::Lower,
            v.per_renewal_us(),
            e.per_renewal_us(),
        )
        .with_consul(c.as_ref().and_then(Cost::per_renewal_us))
        .with_note(NOTE),
    ];
    let line = |name: &str, cost: &Cost| {
        vec![
            name.to_owned(),
            cost.sessions.to_string(),
            num(cost.renew_period_s),
            format!(
                "{} of {}",
                num(cost.renewals_per_second),
                num(cost.scheduled_per_second)
            ),
            num(cost.setup_seconds),
            format!("{}%", num(cost.idle.servers_cpu_percent)),
            format!("{}%", num(cost.renewing.servers_cpu_percent)),
            format!("{}%", num(cost.net_percent())),
            cost.per_renewal_us().map_or_else(|| "—".to_owned(), num),
        ]
    };
    let mut lines = vec![line("Vigil", &v), line("etcd", &e)];
    lines.extend(c.as_ref().map(|c| line("Consul", c)));
    let table = Table {
        title: "Idle sessions: the servers' CPU while they are kept alive".to_owned(),
        header: [
            "system",
            "sessions",
            "renewed every (s)",
            "renewals/s answered (of scheduled)",
            "set-up s",
            "servers idle",
            "servers renewing",
            "above idle",
            "µs per renewal",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: lines,
    };
    let usage = [Some(&v), Some(&e), c.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|cost| [cost.idle.clone(), cost.renewing.clone()])
        .collect();
    Outcome {
        rows,
        tables: vec![table],
        details: json!({
            "ttl_seconds": TTL.as_secs(),
            "http_connections": WORKERS,
            "vigil": v,
            "etcd": e,
            "consul": c,
        }),
        usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_subtracts_the_idle_servers() {
        let usage = |servers_cpu_percent: f64| Usage {
            phase: String::new(),
            wall_seconds: 20.0,
            harness_cpu_percent: 0.0,
            servers_cpu_percent,
            machine_cpu_percent: 0.0,
            other_cpu_percent: 0.0,
            quiet_wait_seconds: 0.0,
            disturbed: false,
        };
        let plan = Plan::new(false);
        let cost = cost(&plan, TTL / 2, 1.0, usage(3.0), usage(13.0), 40_000);
        assert!((cost.net_percent() - 10.0).abs() < 1e-9);
        // 10% of a core over 20 s is 2 s of CPU, over 40,000 renewals.
        assert!((cost.per_renewal_us().unwrap() - 50.0).abs() < 1e-9);
        assert!((cost.renewals_per_second - 2_000.0).abs() < 1e-9);
        assert!((cost.scheduled_per_second - 2_000.0).abs() < 1e-9);
        let none = super::cost(&plan, TTL / 2, 1.0, usage(3.0), usage(3.0), 0);
        assert_eq!(none.per_renewal_us(), None);
    }
}
