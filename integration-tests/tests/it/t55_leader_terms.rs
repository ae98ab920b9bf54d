//! Leadership terms under leader kills: a TTL session that is no longer renewed dies at most
//! one election timeout after its deadline however many elections happen (TTL checkpoints),
//! and a default-consistency read never returns a value older than one already acknowledged
//! (a new leader answers only once it has applied its own term's first entry).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use integration_tests::Http;
use integration_tests::cluster::{Cluster, create_session};
use reqwest::{Method, StatusCode};
use tokio::time::Instant;

use crate::common::exclusive;

/// The session TTL of the checkpoint test; TTL × 2 is its deadline when never renewed.
const TTL: Duration = Duration::from_secs(5);
/// The `local` raft profile's largest election timeout.
const ELECTION: Duration = Duration::from_secs(1);
/// Room for detecting the expiry and committing the invalidation on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);

async fn session_exists(http: &Http, id: &str) -> Option<bool> {
    let reply = http
        .try_get(&format!("/v1/session/info/{id}?stale"))
        .await?;
    (reply.status == StatusCode::OK).then(|| reply.json().as_array().is_some_and(|a| !a.is_empty()))
}

/// Kills the leader, waits for a new one, and brings the old one back.
async fn kill_leader(cluster: &mut Cluster) {
    let leader = cluster.leader().await;
    cluster.kill9(leader).await;
    cluster.leader().await;
    cluster.restart(leader).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn elections_do_not_keep_an_abandoned_session_alive() {
    let _heavy = exclusive().await;
    // Phase 1: three servers; a TTL session nobody renews.
    let mut cluster = Cluster::servers(3)
        .arg("--session-ttl-min")
        .arg("1s")
        .start()
        .await;
    let leader = cluster.leader().await;
    let body = format!(r#"{{"TTL":"{}s","LockDelay":"0s"}}"#, TTL.as_secs());
    let session = create_session(&cluster.server(leader).http(), &body).await;
    let created = Instant::now();

    // Phase 2: three leader kills, three seconds apart. A new leader used to re-arm the full
    // TTL × 2, so the session outlived its deadline by nearly that much each time.
    for k in 1..=3u32 {
        tokio::time::sleep_until(created + Duration::from_secs(2 + 3 * u64::from(k - 1))).await;
        kill_leader(&mut cluster).await;
    }

    // Phase 3: it is gone by its deadline plus one election timeout (and the slack of
    // committing that), and it was never gone before its TTL.
    let bound = TTL * 2 + ELECTION + SLACK;
    loop {
        let running = cluster.running_servers();
        let mut gone = false;
        for i in running {
            if session_exists(&cluster.server(i).http(), &session).await == Some(false) {
                gone = true;
            }
        }
        let elapsed = created.elapsed();
        if gone {
            assert!(elapsed >= TTL, "expired after {elapsed:?}, before its TTL");
            break;
        }
        assert!(
            elapsed <= bound,
            "still alive after {elapsed:?} (bound {bound:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The HTTP endpoints of the running servers, updated as servers are killed and restarted.
type Endpoints = Arc<RwLock<Vec<Option<Http>>>>;

fn endpoints(cluster: &Cluster) -> Vec<Option<Http>> {
    (0..3)
        .map(|i| {
            cluster
                .running_servers()
                .contains(&i)
                .then(|| cluster.server(i).http())
        })
        .collect()
}

fn pick(endpoints: &Endpoints, n: usize) -> Option<Http> {
    let list = endpoints.read().unwrap();
    let running: Vec<&Http> = list.iter().flatten().collect();
    (!running.is_empty()).then(|| running[n % running.len()].clone())
}

/// Acknowledged writes the read-your-writes check needs across its leader kills.
const ACKNOWLEDGED: u64 = 5000;
const WRITE_LIMIT: Duration = Duration::from_secs(180);

/// One writer: increments its own key, and after each acknowledged write reads it back from
/// another server. Counts acknowledged writes into `total`; returns (acknowledged writes,
/// reads older than an acknowledged write).
async fn writer(
    w: usize,
    endpoints: Endpoints,
    stop: Arc<AtomicBool>,
    total: Arc<AtomicU64>,
) -> (u64, u64) {
    let (mut acknowledged, mut stale) = (0u64, 0u64);
    let key = format!("/v1/kv/ryw/{w}");
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let Some(http) = pick(&endpoints, w + n) else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let value = acknowledged + 1;
        let put = http
            .try_request(Method::PUT, &key, Some(value.to_string().into_bytes()))
            .await;
        if !put.is_ok_and(|r| r.status == StatusCode::OK && r.text() == "true") {
            continue;
        }
        acknowledged = value;
        total.fetch_add(1, Ordering::Relaxed);
        let Some(reader) = pick(&endpoints, w + n + 1) else {
            continue;
        };
        let Ok(read) = reader
            .try_request(Method::GET, &format!("{key}?raw"), None)
            .await
        else {
            continue;
        };
        if read.status != StatusCode::OK {
            continue;
        }
        let seen: u64 = read.text().parse().unwrap_or(0);
        if seen < acknowledged {
            stale += 1;
            eprintln!("writer {w}: acknowledged {acknowledged}, read {seen}");
        }
    }
    (acknowledged, stale)
}

#[tokio::test(flavor = "multi_thread")]
async fn default_reads_never_go_back_across_leader_kills() {
    let _heavy = exclusive().await;
    // Phase 1: three servers and 16 writers, each reading its own writes back.
    let mut cluster = Cluster::servers(3).start().await;
    cluster.leader().await;
    let shared: Endpoints = Arc::new(RwLock::new(endpoints(&cluster)));
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let writers: Vec<_> = (0..16)
        .map(|w| {
            tokio::spawn(writer(
                w,
                Arc::clone(&shared),
                Arc::clone(&stop),
                Arc::clone(&total),
            ))
        })
        .collect();

    // Phase 2: three leader kills while they write.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let leader = cluster.leader().await;
        *shared.write().unwrap() = {
            let mut list = endpoints(&cluster);
            list[leader] = None;
            list
        };
        cluster.kill9(leader).await;
        cluster.leader().await;
        cluster.restart(leader).await;
        *shared.write().unwrap() = endpoints(&cluster);
    }
    while total.load(Ordering::Relaxed) < ACKNOWLEDGED && started.elapsed() < WRITE_LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);

    // Phase 3: enough acknowledged writes to mean something, and not one stale read.
    let mut acknowledged = 0;
    let mut stale = 0;
    for w in writers {
        let (a, s) = w.await.unwrap();
        acknowledged += a;
        stale += s;
    }
    eprintln!("t55: {acknowledged} acknowledged writes, {stale} stale reads, 3 leader kills");
    assert!(
        acknowledged >= 2000,
        "only {acknowledged} acknowledged writes"
    );
    assert_eq!(stale, 0, "{stale} reads went back in time");
}
