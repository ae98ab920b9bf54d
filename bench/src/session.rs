//! Session (Vigil, and Consul by the same client code) and lease (etcd) throughput with 16
//! concurrent clients: creates/s (a raft write on each: `PUT /v1/session/create` with a 60 s
//! TTL, `LeaseGrant` with a 60 s TTL), then renews/s of one session or lease per client
//! (leader-only on each: `PUT
//! /v1/session/renew/<id>`, one `LeaseKeepAlive` request and answer on a kept-open stream).
//! Everything created is destroyed or revoked afterwards, outside the measured windows.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use serde_json::json;
use vigil_client::{Client, SessionRequest};

use super::etcd::connect_each;
use super::load::{Percentile, Throughput, closed_loop};
use super::report::{Outcome, Row};
use super::{Leaders, Plan, System, Systems};

const CLIENTS: usize = 16;
const TTL: Duration = Duration::from_secs(60);

/// IDs created by each client, in order.
type Created<T> = Arc<Mutex<Vec<Vec<T>>>>;

fn created<T>() -> Created<T> {
    Arc::new(Mutex::new((0..CLIENTS).map(|_| Vec::new()).collect()))
}

fn push<T>(created: &Created<T>, client: usize, id: T) {
    created.lock()[client].push(id);
}

fn take<T>(created: &Created<T>) -> Vec<Vec<T>> {
    std::mem::take(&mut *created.lock())
}

pub async fn workload(systems: &Systems, plan: &Plan) -> Result<Outcome> {
    let leaders = systems.leaders().await?;
    let mut outcome = Outcome::default();
    let (mut v, mut e, mut consul) = (None, None, None);
    for system in System::order() {
        let o = &mut outcome;
        match (system, &leaders.consul) {
            (System::Vigil, _) => {
                let vigil = Client::new(&leaders.vigil_addr.to_string())?;
                v = Some(http_sessions(o, system, &vigil, &leaders.vigil_pids, plan).await?);
            }
            (System::Etcd, _) => e = Some(etcd_leases(o, &leaders, plan).await?),
            (System::Consul, Some((addr, pids))) => {
                let client = Client::new(addr)?;
                consul = Some(http_sessions(o, system, &client, pids, plan).await?);
            }
            (System::Consul, None) => {}
        }
    }
    let (v_create, v_renew) = v.context("Vigil's run")?;
    let (e_create, e_renew) = e.context("etcd's run")?;
    let (c_create, c_renew) = consul.unzip();
    outcome.rows = rows(
        [&v_create, &e_create],
        [&v_renew, &e_renew],
        c_create.as_ref(),
        c_renew.as_ref(),
    );
    outcome.details = json!({
        "clients": CLIENTS,
        "ttl_seconds": TTL.as_secs(),
        "create": { "vigil": v_create, "etcd": e_create, "consul": c_create },
        "renew": { "vigil": v_renew, "etcd": e_renew, "consul": c_renew },
    });
    Ok(outcome)
}

/// The same with etcd's leases: grants by [`CLIENTS`] clients, each over its own connection,
/// then keep-alives of one lease per client, then every lease revoked.
async fn etcd_leases(
    outcome: &mut Outcome,
    leaders: &Leaders,
    plan: &Plan,
) -> Result<(Throughput, Throughput)> {
    let etcd_clients = Arc::new(connect_each(&leaders.etcd_endpoint, CLIENTS).await?);
    let leases = created::<i64>();
    let (clients, ids) = (etcd_clients.clone(), leases.clone());
    let grants = closed_loop(CLIENTS, plan.session, move |c, _| {
        let (mut client, ids) = (clients[c].clone(), ids.clone());
        async move {
            let ttl = i64::try_from(TTL.as_secs())?;
            push(&ids, c, client.lease_grant(ttl, None).await?.id());
            Ok(())
        }
    });
    let e_create = outcome
        .metered("Lease grant, etcd", &leaders.etcd_pids, grants)
        .await?;
    let leases = take(&leases);
    let mut keepers = Vec::new();
    for (c, ids) in leases.iter().enumerate() {
        let id = *ids.first().context("a client granted no lease")?;
        let mut client = etcd_clients[c].clone();
        keepers.push(tokio::sync::Mutex::new(client.lease_keep_alive(id).await?));
    }
    let keepers: Arc<Vec<tokio::sync::Mutex<(LeaseKeeper, LeaseKeepAliveStream)>>> =
        Arc::new(keepers);
    let keep_alives = closed_loop(CLIENTS, plan.session, move |c, _| {
        let keepers = keepers.clone();
        async move {
            let mut guard = keepers[c].lock().await;
            let (keeper, responses) = &mut *guard;
            keeper.keep_alive().await?;
            let answer = responses.message().await?;
            ensure!(
                answer.context("keep-alive stream ended")?.ttl() > 0,
                "lease gone"
            );
            Ok(())
        }
    });
    let e_renew = outcome
        .metered("Lease keep-alive, etcd", &leaders.etcd_pids, keep_alives)
        .await?;
    futures::stream::iter(leases.into_iter().flatten())
        .map(|id| {
            let mut client = etcd_clients[0].clone();
            async move { client.lease_revoke(id).await.map(drop) }
        })
        .buffer_unordered(CLIENTS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((e_create, e_renew))
}

/// Sessions over the HTTP API `client` speaks (Vigil's or Consul's, `system`): creates by
/// [`CLIENTS`] clients, then renewals of one session per client, then every session destroyed;
/// metered on the servers `pids`.
async fn http_sessions(
    outcome: &mut Outcome,
    system: System,
    client: &Client,
    pids: &[u32],
    plan: &Plan,
) -> Result<(Throughput, Throughput)> {
    let sessions = created::<String>();
    let (creator, ids) = (client.clone(), sessions.clone());
    let creates = closed_loop(CLIENTS, plan.session, move |c, _| {
        let (client, ids) = (creator.clone(), ids.clone());
        async move {
            let request = SessionRequest {
                name: "bench".to_owned(),
                ttl: Some(TTL),
                ..SessionRequest::default()
            };
            push(&ids, c, client.session_create(&request).await?);
            Ok(())
        }
    });
    let create = outcome
        .metered(format!("Session create, {system}"), pids, creates)
        .await?;
    let sessions = take(&sessions);
    let renewed: Arc<Vec<String>> = Arc::new(
        sessions
            .iter()
            .map(|ids| ids.first().cloned().context("a client created no session"))
            .collect::<Result<_>>()?,
    );
    let renewer = client.clone();
    let renewals = closed_loop(CLIENTS, plan.session, move |c, _| {
        let (client, renewed) = (renewer.clone(), renewed.clone());
        async move {
            let renewal = client.session_renew(&renewed[c]).await?;
            ensure!(renewal.is_some(), "session gone");
            Ok(())
        }
    });
    let renew = outcome
        .metered(format!("Session renew, {system}"), pids, renewals)
        .await?;
    futures::stream::iter(sessions.into_iter().flatten())
        .map(|id| {
            let client = client.clone();
            async move { client.session_destroy(&id).await }
        })
        .buffer_unordered(CLIENTS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((create, renew))
}

/// The rows of creates and renewals: Vigil's and etcd's figures, and Consul's when measured.
fn rows(
    [v_create, e_create]: [&Throughput; 2],
    [v_renew, e_renew]: [&Throughput; 2],
    c_create: Option<&Throughput>,
    c_renew: Option<&Throughput>,
) -> Vec<Row> {
    let create = format!("Session create / lease grant, {CLIENTS} clients");
    let renew = format!("Session renew / lease keep-alive, {CLIENTS} clients");
    let (rate, p99) = ("per second", &[Percentile::P99]);
    let mut rows = Throughput::compare(
        "session.create",
        &create,
        rate,
        p99,
        v_create,
        e_create,
        c_create,
    );
    rows.extend(Throughput::compare(
        "session.renew",
        &renew,
        rate,
        p99,
        v_renew,
        e_renew,
        c_renew,
    ));
    rows
}
