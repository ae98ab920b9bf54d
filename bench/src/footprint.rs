//! Memory footprint, on fresh clusters so that earlier workloads' leftovers do not count: the
//! idle RSS of a Vigil client agent and of a Consul one (etcd has no agent: its clients link a
//! library), and the RSS of every server empty and then holding 100,000 keys (128-byte values,
//! written 64 per transaction) and 10,000 sessions (Vigil and Consul, by the same code: no
//! TTL; etcd: leases with a 1 h TTL), after a few idle seconds. The largest of the three
//! servers is reported.

use std::time::Duration;

use anyhow::{Result, anyhow, ensure};
use etcd_client::{Txn, TxnOp};
use futures::{FutureExt, StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::time::{Instant, sleep};
use vigil_client::{Client, SessionRequest};
use vigil_shared::kv::KvOp;

use super::etcd::connect;
use super::machine::rss_kib;
use super::report::{Better, Outcome, Row, Table, num};
use super::{Leaders, Plan, System, Systems};

const VALUE: [u8; 128] = [b'f'; 128];
const KEYS_PER_TXN: usize = 64;
/// Concurrent loading requests.
const LOADERS: usize = 16;
/// Idle time before a reading, so startup and loading garbage settles.
const SETTLE: Duration = Duration::from_secs(3);
const LEASE_TTL_SECS: i64 = 3_600;

/// Beside the rows.
const NOTE: &str = "Vigil's and Consul's servers are loaded with the same keys and sessions \
    by the same client code (transactions of 64 operations, Consul's largest; sessions without \
    a TTL), etcd's with the same keys and as many leases (1 h TTL). Each reading is taken after \
    3 idle seconds; the client agents' idle RSS is under \"Footprint\".";

/// RSS readings of one system, in MiB.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub empty_mib: Vec<f64>,
    pub loaded_mib: Vec<f64>,
    pub load_seconds: f64,
}

fn mib(pids: &[u32]) -> Result<Vec<f64>> {
    pids.iter()
        .map(|&pid| Ok(rss_kib(pid)? as f64 / 1024.0))
        .collect()
}

/// Runs `load(i)` for every `i` in `0..n`, [`LOADERS`] at a time.
async fn load_all<F, Fut, E>(n: usize, load: F) -> Result<()>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    anyhow::Error: From<E>,
{
    futures::stream::iter(0..n)
        .map(load)
        .buffer_unordered(LOADERS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The readings once loading that began at `started` is done and the servers (`pids`) have
/// settled; `empty`: their RSS before.
async fn loaded(pids: &[u32], empty: Vec<f64>, started: Instant) -> Result<Memory> {
    let load_seconds = started.elapsed().as_secs_f64();
    sleep(SETTLE).await;
    Ok(Memory {
        empty_mib: empty,
        loaded_mib: mib(pids)?,
        load_seconds,
    })
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

/// Loads Vigil's (or Consul's) servers `pids` through `client`, a client of their leader.
async fn http(client: &Client, pids: &[u32], plan: &Plan) -> Result<Memory> {
    let empty = mib(pids)?;
    let started = Instant::now();
    let batches = plan.footprint_keys.div_ceil(KEYS_PER_TXN);
    load_all(batches, |b| {
        let client = client.clone();
        let keys = (b * KEYS_PER_TXN)..((b + 1) * KEYS_PER_TXN).min(plan.footprint_keys);
        async move {
            let ops: Vec<KvOp> = keys
                .map(|k| KvOp::Set {
                    key: format!("bench/footprint/{k}"),
                    value: VALUE.to_vec(),
                    flags: 0,
                })
                .collect();
            let reply = client.txn(&ops).await?;
            ensure!(reply.committed, "txn rolled back: {:?}", reply.errors);
            Ok(())
        }
    })
    .await?;
    load_all(plan.footprint_sessions, |_| {
        let client = client.clone();
        async move {
            let request = SessionRequest {
                name: "footprint".to_owned(),
                ..SessionRequest::default()
            };
            client.session_create(&request).await.map(drop)
        }
    })
    .await?;
    loaded(pids, empty, started).await
}

async fn etcd(leaders: &Leaders, plan: &Plan) -> Result<Memory> {
    let empty = mib(&leaders.etcd_pids)?;
    let client = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    let started = Instant::now();
    let batches = plan.footprint_keys.div_ceil(KEYS_PER_TXN);
    load_all(batches, |b| {
        let mut client = client.clone();
        let keys = (b * KEYS_PER_TXN)..((b + 1) * KEYS_PER_TXN).min(plan.footprint_keys);
        async move {
            let puts: Vec<TxnOp> = keys
                .map(|k| TxnOp::put(format!("bench/footprint/{k}"), VALUE.to_vec(), None))
                .collect();
            client.txn(Txn::new().and_then(puts)).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    load_all(plan.footprint_sessions, |_| {
        let mut client = client.clone();
        async move { client.lease_grant(LEASE_TTL_SECS, None).await.map(drop) }
    })
    .await?;
    loaded(&leaders.etcd_pids, empty, started).await
}

pub async fn workload(plan: &Plan) -> Result<Outcome> {
    let mut systems = Systems::start(1).await?;
    sleep(SETTLE).await;
    let client_pid = systems.vigil.client(0).pid();
    let client_mib = client_pid
        .map(rss_kib)
        .transpose()?
        .map(|kib| kib as f64 / 1024.0);
    let consul_client_mib = match systems.consul.as_mut() {
        Some(consul) => {
            let (_, pid) = consul.add_client().await?;
            sleep(SETTLE).await;
            Some(rss_kib(pid)? as f64 / 1024.0)
        }
        None => None,
    };
    let leaders = systems.leaders().await?;
    let (vigil, consul) = leaders.http_clients()?;
    let mut outcome = Outcome::default();
    let (v, e, c) = outcome
        .each_system("Footprint load", &leaders, |system| {
            match (system, &consul, leaders.pids(system)) {
                (System::Vigil, ..) => http(&vigil, &leaders.vigil_pids, plan).boxed_local(),
                (System::Etcd, ..) => etcd(&leaders, plan).boxed_local(),
                (System::Consul, Some(client), Some(pids)) => {
                    http(client, pids, plan).boxed_local()
                }
                (System::Consul, ..) => async { Err(anyhow!("no Consul cluster")) }.boxed_local(),
            }
        })
        .await?;
    systems.stop().await;

    let loaded = format!(
        "Footprint: {} keys + {} sessions",
        plan.footprint_keys, plan.footprint_sessions
    );
    let rows = vec![
        Row::new(
            "footprint.loaded",
            &loaded,
            "largest server RSS (MiB)",
            Better::Lower,
            Some(max(&v.loaded_mib)),
            Some(max(&e.loaded_mib)),
        )
        .with_consul(c.as_ref().map(|c| max(&c.loaded_mib)))
        .with_note(NOTE),
        Row::new(
            "footprint.empty",
            "Footprint: empty cluster",
            "largest server RSS (MiB)",
            Better::Lower,
            Some(max(&v.empty_mib)),
            Some(max(&e.empty_mib)),
        )
        .with_consul(c.as_ref().map(|c| max(&c.empty_mib)))
        .with_note(NOTE),
    ];
    let list = |values: &[f64]| {
        values
            .iter()
            .map(|v| num(*v))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let agent = |mib: Option<f64>| mib.map_or_else(|| "—".to_owned(), num);
    let table = Table {
        title: "Footprint (RSS in MiB)".to_owned(),
        header: [
            "system",
            "client agent, idle",
            "servers, empty",
            "servers, loaded",
            "load time (s)",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: [
            Some((&v, "Vigil", agent(client_mib))),
            Some((&e, "etcd", "— (no agent)".to_owned())),
            c.as_ref().map(|c| (c, "Consul", agent(consul_client_mib))),
        ]
        .into_iter()
        .flatten()
        .map(|(m, name, agent)| {
            vec![
                name.to_owned(),
                agent,
                list(&m.empty_mib),
                list(&m.loaded_mib),
                num(m.load_seconds),
            ]
        })
        .collect(),
    };
    Ok(Outcome {
        rows,
        tables: vec![table],
        details: json!({
            "keys": plan.footprint_keys,
            "sessions": plan.footprint_sessions,
            "value_bytes": VALUE.len(),
            "vigil_client_agent_idle_mib": client_mib,
            "consul_client_agent_idle_mib": consul_client_mib,
            "vigil": v,
            "etcd": e,
            "consul": c,
        }),
        ..outcome
    })
}
