//! Leadership terms under leader kills: a TTL session that is no longer renewed dies at most
//! one election timeout after its deadline however many elections happen (TTL checkpoints),
//! and a default-consistency read never returns a value older than one already acknowledged
//! (a new leader answers only once it has applied its own term's first entry), nor does a
//! leader cut off from its quorum acknowledge a session renewal.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use integration_tests::cluster::{Cluster, LEADER_TIMEOUT, create_session};
use integration_tests::{Http, SHORT_SESSION_TTL};
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
    let mut cluster = Cluster::servers(3).env(SHORT_SESSION_TTL).start().await;
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

/// Sends `GET path` to the agent behind `http` over a connection of its own and returns the
/// connection, to read the answer from later: the agent may be stopped now, and the kernel
/// queues the request until it runs again.
async fn send_get(http: &Http, path: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let url = http.url("");
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: vigil\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    stream
}

/// The whole answer on `stream` (status line, headers and body).
async fn read_answer(mut stream: tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .expect("read the answer");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A leader paused (SIGSTOP) past its lease is replaced; when it resumes, it must not answer a
/// default read from its old term, not even one that reached it while it was stopped (and so
/// is handled before it hears of the new term). Before, it answered the value replaced
/// meanwhile, with `X-Consul-KnownLeader: true`: a leader confirmed itself once per term.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_old_leader_never_answers_a_default_read_from_its_old_term() {
    let _heavy = exclusive().await;
    let cluster = Cluster::servers(3).start().await;
    for round in 0..3 {
        let old = cluster.leader().await;
        let key = format!("/v1/kv/paused-leader/{round}");
        cluster.server(old).http().put_true(&key, "before").await;
        cluster.pause(old);

        // The other two elect a leader and the value is replaced through it.
        let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
        let old_rpc = cluster.server_rpc(old).to_string();
        let new = integration_tests::eventually(LEADER_TIMEOUT, "a new leader", || async {
            let mut named = Vec::new();
            for &i in &others {
                let reply = cluster.server(i).try_get("/v1/status/leader").await?;
                named.push(reply.json().as_str()?.to_owned());
            }
            let leader = named.first()?.clone();
            (named.iter().all(|n| *n == leader) && !leader.is_empty() && leader != old_rpc)
                .then(|| {
                    others
                        .iter()
                        .copied()
                        .find(|&i| cluster.server_rpc(i).to_string() == leader)
                })
                .flatten()
        })
        .await;
        cluster.server(new).http().put_true(&key, "after").await;

        // A default read queued at the stopped leader, then it resumes.
        let queued = send_get(&cluster.server(old).http(), &format!("{key}?raw")).await;
        cluster.resume(old);
        let answer = tokio::time::timeout(Duration::from_secs(30), read_answer(queued))
            .await
            .expect("the resumed server answers");
        let body = answer.rsplit("\r\n\r\n").next().unwrap_or_default();
        assert!(
            !answer.starts_with("HTTP/1.1 200") || body == "after",
            "round {round}: the old leader answered from its old term:\n{answer}"
        );
        cluster.leader().await;
    }
}

/// A leader that has lost its quorum must not acknowledge a renewal: the others elect a leader
/// that never hears of it and expires the session on its checkpointed deadline, while the
/// client believes it renewed. Found by the Jepsen-style run: sessions gone half a second after
/// an acknowledged renewal, each right after a partition of the leader healed. Before, the
/// isolated leader answered 200 to every renewal.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_without_its_quorum_acknowledges_no_renewal() {
    let _heavy = exclusive().await;
    let cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let http = cluster.server(leader).http();
    let session = create_session(&http, r#"{"TTL":"30s","LockDelay":"0s"}"#).await;
    let renew = format!("/v1/session/renew/{session}");
    assert_eq!(http.put(&renew, "").await.status, StatusCode::OK);

    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &followers {
        cluster.pause(i);
    }
    // Past the lease (one election timeout), the leader can no longer vouch for its term.
    tokio::time::sleep(ELECTION * 2).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        http.try_request(Method::PUT, &renew, Some(Vec::new())),
    )
    .await;
    for &i in &followers {
        cluster.resume(i);
    }
    if let Ok(Ok(reply)) = answer {
        assert_ne!(
            reply.status,
            StatusCode::OK,
            "a leader without a quorum acknowledged a renewal: {}",
            reply.text()
        );
    }
    // Once the quorum is back, renewals are acknowledged again.
    integration_tests::eventually(LEADER_TIMEOUT, "a renewal after the pause", || async {
        let reply = cluster
            .server(cluster.leader().await)
            .http()
            .try_request(Method::PUT, &renew, Some(Vec::new()))
            .await
            .ok()?;
        (reply.status == StatusCode::OK).then_some(())
    })
    .await;
}
