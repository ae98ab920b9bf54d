//! KV reads of one 128-byte key on the leader, 1 and 64 clients, each over its own reused
//! connection, in each system's two read modes: the linearizable one (Vigil and Consul
//! `?consistent`, which confirm leadership with a quorum before answering; etcd's default
//! linearizable `Range`, a read index from the leader) and the cheaper one (Vigil's and
//! Consul's default mode, answered by the leader from its own state; etcd's serializable
//! `Range`, answered by the member asked, here the leader, from its own state). Neither
//! cheaper mode is linearizable: a deposed leader (Vigil, Consul) or a lagging member (etcd)
//! may answer with older data, so only the first pair compares equal guarantees.

use anyhow::{Context, Result, anyhow};
use futures::FutureExt;
use futures::future::ready;
use serde_json::json;
use vigil_client::{Client, ReadOpts};

use super::etcd::{connect, connect_each};
use super::load::{self, Percentile, Throughput, closed_loop};
use super::report::{Outcome, Row};
use super::{Plan, System, Systems};

const KEY: &str = "bench/read/key";
const VALUE: [u8; 128] = [b'r'; 128];

/// The two read modes of every system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Vigil and Consul `?consistent`, etcd linearizable.
    Linearizable,
    /// Vigil and Consul default, etcd serializable.
    Cheap,
}

impl Mode {
    fn name(self, system: System) -> &'static str {
        match (self, system) {
            (Mode::Linearizable, System::Etcd) => "linearizable",
            (Mode::Linearizable, _) => "?consistent",
            (Mode::Cheap, System::Etcd) => "serializable",
            (Mode::Cheap, _) => "default",
        }
    }
}

pub async fn workload(systems: &Systems, plan: &Plan) -> Result<Outcome> {
    let leaders = systems.leaders().await?;
    let (vigil, consul) = leaders.http_clients()?;
    let mut etcd = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    vigil.kv_put(KEY, &VALUE, 0).await?;
    if let Some(consul) = &consul {
        consul.kv_put(KEY, &VALUE, 0).await?;
    }
    etcd.put(KEY, VALUE.to_vec(), None).await?;

    let mut outcome = Outcome::default();
    let mut runs = Vec::new();
    for clients in [1, 64] {
        for mode in [Mode::Linearizable, Mode::Cheap] {
            let what = format!(
                "KV read {}, {}",
                mode.name(System::Vigil),
                load::clients(clients)
            );
            let endpoint = &leaders.etcd_endpoint;
            let (v, e, c) = outcome
                .each_system(&what, &leaders, |system| match (system, &consul) {
                    (System::Vigil, _) => http_reads(&vigil, clients, mode, plan).boxed_local(),
                    (System::Consul, Some(client)) => {
                        http_reads(client, clients, mode, plan).boxed_local()
                    }
                    (System::Consul, None) => ready(Err(anyhow!("no Consul client"))).boxed_local(),
                    (System::Etcd, _) => etcd_reads(endpoint, clients, mode, plan).boxed_local(),
                })
                .await?;
            outcome.rows.extend(rows(clients, mode, &v, &e, c.as_ref()));
            let mode = mode.name(System::Vigil);
            runs.push(
                json!({ "clients": clients, "mode": mode, "vigil": v, "etcd": e, "consul": c }),
            );
        }
    }

    vigil.kv_delete(KEY).await?;
    if let Some(consul) = &consul {
        consul.kv_delete(KEY).await?;
    }
    etcd.delete(KEY, None).await?;
    outcome.details = json!({ "value_bytes": VALUE.len(), "runs": runs });
    Ok(outcome)
}

/// `clients` clients reading [`KEY`] from etcd in `mode`, each over its own connection.
async fn etcd_reads(endpoint: &str, clients: usize, mode: Mode, plan: &Plan) -> Result<Throughput> {
    let etcd_clients = connect_each(endpoint, clients).await?;
    closed_loop(clients, plan.session, move |c, _| {
        let mut client = etcd_clients[c].clone();
        let options =
            (mode == Mode::Cheap).then(|| etcd_client::GetOptions::new().with_serializable());
        async move {
            let got = client.get(KEY, options).await?;
            got.kvs().first().context("the key is missing")?;
            Ok(())
        }
    })
    .await
}

/// `clients` clients reading [`KEY`] through the HTTP API `client` speaks (Vigil's or
/// Consul's) in `mode`, each over its own connection.
fn http_reads(
    client: &Client,
    clients: usize,
    mode: Mode,
    plan: &Plan,
) -> impl Future<Output = Result<Throughput>> + use<> {
    let client = client.clone();
    closed_loop(clients, plan.session, move |_, _| {
        let client = client.clone();
        let opts = match mode {
            Mode::Linearizable => ReadOpts::default().consistent(),
            Mode::Cheap => ReadOpts::default(),
        };
        async move {
            let (entry, _) = client.kv_get(KEY, opts).await?;
            entry.context("the key is missing")?;
            Ok(())
        }
    })
}

fn rows(
    clients: usize,
    mode: Mode,
    v: &Throughput,
    e: &Throughput,
    c: Option<&Throughput>,
) -> Vec<Row> {
    let workload = format!(
        "KV read, {}: Vigil {} vs etcd {}",
        load::clients(clients),
        mode.name(System::Vigil),
        mode.name(System::Etcd)
    );
    let kind = match mode {
        Mode::Linearizable => "linearizable",
        Mode::Cheap => "cheap",
    };
    let id = format!("kv_read.c{clients}.{kind}");
    let percentiles = [Percentile::P50, Percentile::P99];
    Throughput::compare(&id, &workload, "reads/s", &percentiles, v, e, c)
}
