//! KV put throughput and latency: 1, 16 and 64 concurrent clients each putting 128-byte values
//! to fresh keys on the leader, every client over its own reused connection (Vigil and Consul:
//! `PUT /v1/kv/<key>` by the same client code; etcd: `Put`). All three commit each write to a
//! majority with an fsync, so what differs is batching (group commit) and per-request overhead.
//! The keys are deleted afterwards.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use futures::FutureExt;
use futures::future::ready;
use serde_json::json;
use vigil_client::Client;

use super::etcd::{connect, connect_each};
use super::load::{self, Percentile, Throughput, closed_loop};
use super::machine;
use super::report::{Outcome, Row};
use super::{Leaders, Plan, System, Systems};

const VALUE: [u8; 128] = [b'v'; 128];
const PREFIX: &str = "bench/kv/";
/// Longest wait for the servers to go idle after the cleanup.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

pub async fn workload(systems: &Systems, plan: &Plan) -> Result<Outcome> {
    let leaders = systems.leaders().await?;
    let (vigil, consul) = leaders.http_clients()?;
    let mut outcome = Outcome::default();
    let mut runs = Vec::new();
    for clients in [1, 16, 64] {
        let what = format!("KV put, {}", load::clients(clients));
        let endpoint = &leaders.etcd_endpoint;
        let (v, e, c) = outcome
            .each_system(&what, &leaders, |system| match (system, &consul) {
                (System::Vigil, _) => http_puts(&vigil, "", clients, plan).boxed_local(),
                (System::Consul, Some(client)) => {
                    http_puts(client, "", clients, plan).boxed_local()
                }
                (System::Consul, None) => ready(Err(anyhow!("no Consul client"))).boxed_local(),
                (System::Etcd, _) => etcd_puts(endpoint, clients, plan).boxed_local(),
            })
            .await?;
        outcome.rows.extend(rows(clients, &v, &e, c.as_ref()));
        runs.push(json!({ "clients": clients, "vigil": v, "etcd": e, "consul": c }));
    }

    let settle = clean_up(&leaders, &vigil, consul.as_ref()).await?;
    outcome.details = json!({
        "value_bytes": VALUE.len(),
        "runs": runs,
        "settle_after_cleanup_s": settle.as_secs_f64(),
    });
    Ok(outcome)
}

/// Deletes every key the puts wrote (through `vigil` and `consul`, clients of those systems'
/// servers, and from etcd), leaving the state as it was for the next workloads; waits until
/// the servers are idle again and returns how long that took.
pub async fn clean_up(
    leaders: &Leaders,
    vigil: &Client,
    consul: Option<&Client>,
) -> Result<Duration> {
    vigil.kv_delete_tree(PREFIX).await?;
    if let Some(client) = consul {
        client.kv_delete_tree(PREFIX).await?;
    }
    let mut etcd = connect(std::slice::from_ref(&leaders.etcd_endpoint)).await?;
    let deleted = etcd
        .delete(
            PREFIX,
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await?;
    // Compact etcd's history up to the delete, as a production etcd's auto-compaction would,
    // so that later workloads do not run against a store holding every revision of this one.
    let revision = deleted.header().context("delete header")?.revision();
    let physical = etcd_client::CompactionOptions::new().with_physical();
    etcd.compact(revision, Some(physical)).await?;
    // Deleting (and compacting) a few hundred thousand keys keeps servers busy after the
    // answer (followers applying it, the storage freeing pages): the next workload starts
    // once every server is idle again.
    let mut pids = leaders.vigil_pids.clone();
    pids.extend(&leaders.etcd_pids);
    pids.extend(leaders.pids(System::Consul).unwrap_or_default());
    let settle = machine::settle(&pids, SETTLE_LIMIT).await?;
    eprintln!(
        "vigil-bench: the servers settled {:.1} s after the KV cleanup",
        settle.as_secs_f64()
    );
    Ok(settle)
}

/// `clients` clients putting fresh keys to etcd, each over its own connection.
pub async fn etcd_puts(endpoint: &str, clients: usize, plan: &Plan) -> Result<Throughput> {
    let etcd_clients = connect_each(endpoint, clients).await?;
    closed_loop(clients, plan.kv, move |c, n| {
        let mut client = etcd_clients[c].clone();
        async move {
            let key = format!("{PREFIX}{clients}/{c}/{n}");
            client.put(key, VALUE.to_vec(), None).await?;
            Ok(())
        }
    })
    .await
}

/// `clients` clients putting fresh keys through the HTTP API `client` speaks (Vigil's or
/// Consul's), each over its own connection; `path` (`""` or ending in `/`) sets the keys apart
/// from those of other runs with as many clients.
pub fn http_puts(
    client: &Client,
    path: &'static str,
    clients: usize,
    plan: &Plan,
) -> impl Future<Output = Result<Throughput>> + use<> {
    let client = client.clone();
    closed_loop(clients, plan.kv, move |c, n| {
        let client = client.clone();
        async move {
            let key = format!("{PREFIX}{path}{clients}/{c}/{n}");
            ensure!(client.kv_put(&key, &VALUE, 0).await?, "put refused");
            Ok(())
        }
    })
}

fn rows(clients: usize, v: &Throughput, e: &Throughput, c: Option<&Throughput>) -> Vec<Row> {
    let workload = format!(
        "KV put, {clients} client{}",
        if clients == 1 { "" } else { "s" }
    );
    let id = format!("kv_put.c{clients}");
    Throughput::compare(
        &id,
        &workload,
        "puts/s",
        &[Percentile::P50, Percentile::P99],
        v,
        e,
        c,
    )
}
