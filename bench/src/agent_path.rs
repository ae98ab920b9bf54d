//! The KV and lock rows through a client agent, beside the same rows on the leader: how much
//! the hop through an agent (an application's usual way in, as with Consul) costs. A Vigil
//! client agent and, where Consul runs, a Consul client agent (`consul agent` without
//! `-server`) are joined to the clusters; each row is measured through the agent and on the
//! leader one after the other, by the same code as the leader rows above (`kv_put`, `locks`):
//!
//! - KV put, 1 and 64 clients (fresh keys, deleted afterwards);
//! - the uncontended `?acquire`/`?release` cycle, 1 client, with sessions made on the agent
//!   (so bound to its node, as an application's are);
//! - the fair mutex (Vigil's server-side queue), 8 clients.
//!
//! etcd has no agent: its clients talk to its members directly, so its figure in every row is
//! the direct one (`Put`, `concurrency.Mutex`, v3lock with 8 clients), measured in the same
//! workload. Consul has no fair mutex, so that row has no Consul figure.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;
use vigil_client::Client;

use super::kv::{clean_up, etcd_puts, http_puts};
use super::load::{self, Percentile, Throughput};
use super::lock::{self, LockRun, RESYNC_NOTE, Recipe};
use super::machine::Usage;
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, System, Systems};

/// Contenders of the fair-mutex row.
const FAIR_CLIENTS: usize = 8;

/// Beside the rows.
const NOTE: &str = "Vigil and Consul: requests sent to a client agent (a non-server agent \
    joined to the cluster, on the same machine), which forwards them to the leader; etcd has \
    no agent, so its figure is its direct one (a client of the leader). The same rows on the \
    leader, measured in the same workload, and what the hop costs are under \"Through a \
    client agent\".";

/// One figure through a client agent and on the leader.
#[derive(Debug, Clone, Serialize)]
pub struct Paths<T> {
    pub leader: T,
    pub agent: T,
}

/// What one system measured on both paths.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub kv: Vec<Paths<Throughput>>,
    pub cycle: Paths<LockRun>,
    /// Vigil only.
    pub fair: Option<Paths<LockRun>>,
}

/// etcd's direct figures.
#[derive(Debug, Clone, Serialize)]
pub struct Direct {
    pub kv: Vec<Throughput>,
    pub mutex: LockRun,
    pub v3lock: LockRun,
}

/// One figure of a lock run.
type Figure = fn(&LockRun) -> f64;

/// Client counts of the KV rows.
const KV_CLIENTS: [usize; 2] = [1, 64];

/// `leaders` with Vigil's (and Consul's) HTTP address replaced by their client agent's.
fn through(leaders: &Leaders, vigil: &str, consul: Option<&str>) -> Result<Leaders> {
    let mut via = leaders.clone();
    via.vigil_addr = vigil.parse().context("the Vigil client agent's address")?;
    if let (Some((addr, _)), Some(agent)) = (via.consul.as_mut(), consul) {
        agent.clone_into(addr);
    }
    Ok(via)
}

/// Vigil's or Consul's rows on both paths, `leader` and `agent` naming the addresses; the KV
/// runs metered into `outcome` (the lock runs meter themselves).
async fn http(
    outcome: &mut Outcome,
    system: System,
    leader: &Leaders,
    agent: &Leaders,
    plan: &Plan,
) -> Result<Measured> {
    let pids = leader.pids(system).context("no Consul")?;
    let address = |l: &Leaders| match system {
        System::Consul => l.consul.as_ref().map(|(addr, _)| addr.clone()),
        _ => Some(l.vigil_addr.to_string()),
    };
    let (on_leader, on_agent) = (
        Client::new(&address(leader).context("no Consul")?)?,
        Client::new(&address(agent).context("no Consul")?)?,
    );
    let mut kv = Vec::new();
    for clients in KV_CLIENTS {
        let what = format!("KV put, {}", load::clients(clients));
        let phase = format!("{what}, on the leader, {system}");
        let leader = http_puts(&on_leader, "leader/", clients, plan);
        let leader = outcome.metered(phase, pids, leader).await?;
        let phase = format!("{what}, through a client agent, {system}");
        let agent = http_puts(&on_agent, "agent/", clients, plan);
        let agent = outcome.metered(phase, pids, agent).await?;
        kv.push(Paths { leader, agent });
    }
    let (session, fair) = match system {
        System::Consul => (Recipe::ConsulSession, None),
        _ => (Recipe::VigilSession, Some(Recipe::VigilFair)),
    };
    let none = Duration::ZERO;
    let cycle = Paths {
        leader: lock::run(session, 1, plan.lock, leader, none).await?,
        agent: lock::run(session, 1, plan.lock, agent, none).await?,
    };
    let fair = match fair {
        Some(recipe) => Some(Paths {
            leader: lock::run(recipe, FAIR_CLIENTS, plan.contended, leader, none).await?,
            agent: lock::run(recipe, FAIR_CLIENTS, plan.contended, agent, none).await?,
        }),
        None => None,
    };
    Ok(Measured { kv, cycle, fair })
}

async fn etcd(outcome: &mut Outcome, leaders: &Leaders, plan: &Plan) -> Result<Direct> {
    let mut kv = Vec::new();
    for clients in KV_CLIENTS {
        let phase = format!("KV put, {}, direct, etcd", load::clients(clients));
        let puts = etcd_puts(&leaders.etcd_endpoint, clients, plan);
        kv.push(outcome.metered(phase, &leaders.etcd_pids, puts).await?);
    }
    let none = Duration::ZERO;
    Ok(Direct {
        kv,
        mutex: lock::run(Recipe::EtcdMutex, 1, plan.lock, leaders, none).await?,
        v3lock: lock::run(
            Recipe::EtcdV3Lock,
            FAIR_CLIENTS,
            plan.contended,
            leaders,
            none,
        )
        .await?,
    })
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let servers: Vec<usize> = (0..systems.vigil.servers.len()).collect();
    let c = systems.vigil.add_client(&servers).await;
    let vigil_agent = systems
        .vigil
        .client(c)
        .base
        .strip_prefix("http://")
        .context("HTTP base URL")?
        .to_owned();
    let consul_agent = match systems.consul.as_mut() {
        Some(consul) => Some(consul.add_client().await?.0),
        None => None,
    };
    let leaders = systems.leaders().await?;
    let agents = through(&leaders, &vigil_agent, consul_agent.as_deref())?;
    let mut kv = Outcome::default();
    let (mut v, mut e, mut consul) = (None, None, None);
    for system in System::order() {
        let o = &mut kv;
        match system {
            System::Vigil => v = Some(http(o, system, &leaders, &agents, plan).await?),
            System::Etcd => e = Some(etcd(o, &leaders, plan).await?),
            System::Consul if consul_agent.is_some() => {
                consul = Some(http(o, system, &leaders, &agents, plan).await?);
            }
            System::Consul => {}
        }
    }
    let (v, e) = (v.context("Vigil's run")?, e.context("etcd's run")?);
    let (vigil, consul_client) = leaders.http_clients()?;
    clean_up(&leaders, &vigil, consul_client.as_ref()).await?;
    let mut outcome = outcome(v, e, consul);
    outcome.usage.splice(0..0, kv.usage);
    Ok(outcome)
}

/// The CPU readings of the lock runs, each phase named with its path.
fn lock_usage(m: &Measured) -> impl Iterator<Item = Usage> + '_ {
    let runs = std::iter::once(&m.cycle).chain(&m.fair);
    runs.flat_map(|paths| {
        [
            (&paths.leader, "on the leader"),
            (&paths.agent, "through a client agent"),
        ]
        .map(|(run, path)| Usage {
            phase: format!("{}, {path}", run.usage.phase),
            ..run.usage.clone()
        })
    })
}

fn outcome(v: Measured, e: Direct, c: Option<Measured>) -> Outcome {
    let mut rows = Vec::new();
    for (i, clients) in KV_CLIENTS.into_iter().enumerate() {
        let workload = format!(
            "KV put through a client agent, {} (etcd: direct)",
            load::clients(clients)
        );
        let consul = c.as_ref().map(|c| &c.kv[i].agent);
        let compared = Throughput::compare(
            &format!("agent.kv_put.c{clients}"),
            &workload,
            "puts/s",
            &[Percentile::P50, Percentile::P99],
            &v.kv[i].agent,
            &e.kv[i],
            consul,
        );
        rows.extend(compared.into_iter().map(|r| r.with_note(NOTE)));
    }
    let workload = "Uncontended lock cycle through a client agent, 1 client (etcd: \
                    concurrency.Mutex, direct)";
    let cycle: [(&str, &str, Better, Figure); 2] = [
        ("rate", "cycles/s", Better::Higher, |r| r.per_second),
        ("p50", "cycle p50 (ms)", Better::Lower, |r| r.cycle.p50_ms),
    ];
    for (name, metric, better, figure) in cycle {
        let id = format!("agent.lock_uncontended.{name}");
        let (vigil, etcd) = (figure(&v.cycle.agent), figure(&e.mutex));
        let row = Row::new(id, workload, metric, better, Some(vigil), Some(etcd));
        let consul = c.as_ref().map(|c| figure(&c.cycle.agent));
        rows.push(row.with_consul(consul).with_note(NOTE));
    }
    if let Some(fair) = &v.fair {
        let workload = format!(
            "Contended lock through a client agent, {FAIR_CLIENTS} clients: fair mutex vs \
             v3lock (etcd: direct)"
        );
        let row = Row::new(
            format!("agent.lock_contended.c{FAIR_CLIENTS}.fair_vs_v3lock.rate"),
            workload,
            "handoffs/s",
            Better::Higher,
            Some(fair.agent.per_second),
            Some(e.v3lock.per_second),
        );
        rows.push(row.with_note(&format!("{NOTE} {RESYNC_NOTE}")));
    }
    let mut table_rows = Vec::new();
    for (name, m) in [("Vigil", Some(&v)), ("Consul", c.as_ref())] {
        let Some(m) = m else { continue };
        let mut line = |what: String, leader: f64, agent: f64| {
            table_rows.push(vec![
                name.to_owned(),
                what,
                num(leader),
                num(agent),
                num(agent / leader),
            ]);
        };
        for (i, clients) in KV_CLIENTS.into_iter().enumerate() {
            let paths = &m.kv[i];
            let what = format!("KV put, {}", load::clients(clients));
            let (l, a) = (&paths.leader, &paths.agent);
            line(format!("{what}: puts/s"), l.per_second, a.per_second);
            line(
                format!("{what}: p50 ms"),
                l.latency.p50_ms,
                a.latency.p50_ms,
            );
        }
        let (l, a) = (&m.cycle.leader, &m.cycle.agent);
        line(
            "?acquire/?release cycles/s".to_owned(),
            l.per_second,
            a.per_second,
        );
        line(
            "?acquire/?release cycle p50 ms".to_owned(),
            l.cycle.p50_ms,
            a.cycle.p50_ms,
        );
        if let Some(fair) = &m.fair {
            let what = format!("fair mutex, {FAIR_CLIENTS} clients: handoffs/s");
            line(what, fair.leader.per_second, fair.agent.per_second);
        }
    }
    let usage = lock_usage(&v)
        .chain(c.iter().flat_map(lock_usage))
        .chain([&e.mutex, &e.v3lock].map(|r| r.usage.clone()))
        .collect();
    Outcome {
        rows,
        tables: vec![Table {
            title: "Through a client agent".to_owned(),
            header: [
                "system",
                "figure",
                "on the leader",
                "through a client agent",
                "agent ÷ leader",
            ]
            .map(str::to_owned)
            .to_vec(),
            rows: table_rows,
        }],
        details: json!({ "vigil": v, "etcd": e, "consul": c }),
        usage,
    }
}
