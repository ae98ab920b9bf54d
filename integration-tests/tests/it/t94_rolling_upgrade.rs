//! A rolling upgrade from the previous release (`v0.1.0`, built from its git tag by
//! `scripts/build-release.sh` and cached under `target/release-builds/`): three servers and two
//! client agents start from it; while clients write keys and contend for a native lock
//! continuously, and two sessions hold a native lock and a KV lock each, the servers are
//! replaced by this build one at a time (followers first, the leader last), then the clients.
//! Checked: no acknowledged write is lost, no live holder loses a lock, no lock is granted to
//! two sessions at once (and fencing tokens only grow), every server is back in the raft
//! configuration as a voter after its replacement, the protocol level stays at the first
//! release's while an old server remains, and the leader raises it to 2 once none does. The
//! log is filled past the snapshot threshold first, so every server is replaced while its data
//! directory holds a snapshot file of the previous release's format (3).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use integration_tests::cluster::{Cluster, raft_voters};
use integration_tests::{Http, binary, eventually};
use parking_lot::{Mutex, RwLock};
use reqwest::StatusCode;
use tokio::task::JoinHandle;

use crate::common::exclusive;

/// The release upgraded from.
const PREVIOUS: &str = "v0.1.0";
/// How long a replaced server may take to be a caught-up voter again.
const REJOIN_LIMIT: Duration = Duration::from_secs(60);
/// How long the workload runs against each mixed cluster before the next replacement.
const SOAK: Duration = Duration::from_secs(4);
const MUTEX: &str = "upgrade/mutex";

/// The previous release's `vigil`, built once (about 10 minutes on 2 cores) and cached.
fn previous_release() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let out = std::process::Command::new(root.join("scripts/build-release.sh"))
        .arg(PREVIOUS)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/build-release.sh");
    assert!(out.status.success(), "scripts/build-release.sh {PREVIOUS}");
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

/// Raft entries written before the upgrade: past the servers' snapshot threshold (10,000),
/// so each replaced server starts on a snapshot file of the previous release.
const FILL_ENTRIES: u64 = 10_500;

/// The first byte (the format) of server `i`'s `snapshot.bin`, once it has one.
fn snapshot_format(cluster: &Cluster, i: usize) -> Option<u8> {
    fn find(dir: &Path) -> Option<PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if path.file_name().is_some_and(|n| n == "snapshot.bin") {
                return Some(path);
            }
            if path.is_dir()
                && let Some(found) = find(&path)
            {
                return Some(found);
            }
        }
        None
    }
    let file = find(&cluster.dir().join(format!("s{i}-data")))?;
    std::fs::read(file).ok()?.first().copied()
}

/// Server `i`'s last raft log index, from `/v1/agent/self`.
async fn last_log_index(cluster: &Cluster, i: usize) -> Option<u64> {
    let reply = cluster.server(i).try_get("/v1/agent/self").await?;
    reply.json()["Stats"]["raft"]["last_log_index"]
        .as_str()?
        .parse()
        .ok()
}

/// Writes `w/fill/<task>/<n>` through the leader from 8 tasks until its log has
/// [`FILL_ENTRIES`] entries, recording every acknowledged write.
async fn fill(cluster: &Cluster, record: &Arc<Record>) {
    let leader = cluster.leader().await;
    let http = cluster.server(leader).http();
    let done = Arc::new(AtomicBool::new(false));
    let tasks: Vec<JoinHandle<()>> = (0..8)
        .map(|t| {
            let (http, record, done) = (http.clone(), Arc::clone(record), Arc::clone(&done));
            tokio::spawn(async move {
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    n += 1;
                    let key = format!("w/fill/{t}/{n:06}");
                    let value = format!("f{n}");
                    let reply = http.put(&format!("/v1/kv/{key}"), value.clone()).await;
                    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
                    record.acked.lock().insert(key, value);
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(300), "the log filled", || async {
        let index = last_log_index(cluster, leader).await?;
        (index >= FILL_ENTRIES).then_some(())
    })
    .await;
    done.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("fill task");
    }
}

/// The client agents' HTTP APIs, which move when a client restarts.
type Clients = Arc<RwLock<Vec<Http>>>;

/// What the workload saw.
#[derive(Default)]
struct Record {
    /// Keys whose write was acknowledged, with their values.
    acked: Mutex<BTreeMap<String, String>>,
    /// Every grant of the contended mutex: (session, token), in the order they were seen.
    grants: Mutex<Vec<(String, u64)>>,
    /// Broken promises: grants while another contender held the mutex, tokens going back.
    violations: Mutex<Vec<String>>,
}

/// Writes `w/c<client>/<n>` through client `client` until `stop`, recording what was
/// acknowledged; a failed write (its agent or the leader away) is retried under the next key.
fn writer(
    clients: Clients,
    client: usize,
    record: Arc<Record>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let key = format!("w/c{client}/{n:06}");
            let value = format!("v{n}");
            let http = clients.read()[client].clone();
            let path = format!("/v1/kv/{key}");
            match http
                .try_request(
                    reqwest::Method::PUT,
                    &path,
                    Some(value.clone().into_bytes()),
                )
                .await
            {
                Ok(reply) if reply.status == StatusCode::OK && reply.text() == "true" => {
                    record.acked.lock().insert(key, value);
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
}

/// A session of no checks (it lives until destroyed) through `http`, retried until created.
async fn session(http: &Http, name: &str) -> String {
    let body = format!(r#"{{"Name":"{name}","NodeChecks":[],"LockDelay":"0s"}}"#);
    eventually(Duration::from_secs(30), "a session", || async {
        let reply = http
            .try_request(
                reqwest::Method::PUT,
                "/v1/session/create",
                Some(body.clone().into()),
            )
            .await
            .ok()?;
        (reply.status == StatusCode::OK).then(|| reply.json()["ID"].as_str().map(str::to_owned))?
    })
    .await
}

/// Contends for [`MUTEX`] through client `client` with its own session until `stop`: takes
/// it (waiting up to 1 s per request), marks itself the holder, holds it briefly, unmarks
/// itself and releases it (retrying until the release is acknowledged). A grant while another
/// contender is marked is a double grant.
fn contender(
    clients: Clients,
    client: usize,
    session: String,
    holder: Arc<AtomicUsize>,
    record: Arc<Record>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let me = client + 1;
    tokio::spawn(async move {
        let acquire = format!("/v1/vigil/lock/{MUTEX}?session={session}&wait=1s");
        let release = format!("/v1/vigil/lock/{MUTEX}?release&session={session}");
        while !stop.load(Ordering::Relaxed) {
            let http = clients.read()[client].clone();
            let reply = match http.try_request(reqwest::Method::PUT, &acquire, None).await {
                Ok(reply) if reply.status == StatusCode::OK => reply.json(),
                _ => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if reply["Acquired"] != true {
                continue;
            }
            let token = reply["Token"].as_u64().expect("a grant has a token");
            if let Err(other) = holder.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
                record.violations.lock().push(format!(
                    "{session} granted token {token} while contender {other} held the mutex"
                ));
            }
            {
                let mut grants = record.grants.lock();
                if let Some((last_session, last)) = grants.last()
                    && (token < *last || (token == *last && *last_session != session))
                {
                    record.violations.lock().push(format!(
                        "token {token} for {session} after token {last} for {last_session}"
                    ));
                }
                grants.push((session.clone(), token));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = holder.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
            loop {
                let http = clients.read()[client].clone();
                match http.try_request(reqwest::Method::PUT, &release, None).await {
                    Ok(reply) if reply.status == StatusCode::OK => break,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    })
}

/// One session's long-held locks: the native lock `upgrade/held-<name>` and the KV lock
/// `upgrade/kv-<name>`, with the fencing token of the native one.
struct Holder {
    name: String,
    session: String,
    token: u64,
}

impl Holder {
    async fn take(http: &Http, name: &str) -> Holder {
        let session = session(http, &format!("holder-{name}")).await;
        let reply = http
            .put(
                &format!("/v1/vigil/lock/upgrade/held-{name}?session={session}"),
                "",
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let token = reply.json()["Token"].as_u64().expect("granted");
        http.put_true(&format!("/v1/kv/upgrade/kv-{name}?acquire={session}"), name)
            .await;
        Holder {
            name: name.to_owned(),
            session,
            token,
        }
    }

    /// Asserts through `http` (a consistent read) that the session still holds both locks,
    /// the native one with its first token.
    async fn assert_holds(&self, http: &Http, when: &str) {
        let name = &self.name;
        let lock = eventually(Duration::from_secs(30), "the held lock", || async {
            let reply = http
                .try_get(&format!("/v1/vigil/lock/upgrade/held-{name}?consistent"))
                .await?;
            (reply.status == StatusCode::OK).then(|| reply.json())
        })
        .await;
        let holders = lock["Holders"].as_array().expect("Holders");
        assert_eq!(holders.len(), 1, "{when}: {lock}");
        assert_eq!(
            holders[0]["Session"],
            self.session.as_str(),
            "{when}: {lock}"
        );
        assert_eq!(holders[0]["Token"], self.token, "{when}: {lock}");
        let kv = eventually(Duration::from_secs(30), "the KV lock", || async {
            let reply = http
                .try_get(&format!("/v1/kv/upgrade/kv-{name}?consistent"))
                .await?;
            (reply.status == StatusCode::OK).then(|| reply.json())
        })
        .await;
        assert_eq!(kv[0]["Session"], self.session.as_str(), "{when}: {kv}");
    }
}

/// What server `i` reports in `/v1/agent/self` as `Stats.raft.protocol_level` (the previous
/// release reports none).
async fn protocol_level(cluster: &Cluster, i: usize) -> Option<String> {
    let reply = cluster.server(i).try_get("/v1/agent/self").await?;
    reply.json()["Stats"]["raft"]["protocol_level"]
        .as_str()
        .map(str::to_owned)
}

/// Waits until server `i` reports the three servers as voters and has applied what the
/// leader wrote after its return (a marker key, read stale from `i`).
async fn await_rejoined(cluster: &Cluster, i: usize, marker: &str) {
    eventually(REJOIN_LIMIT, &format!("s{i} a voter again"), || async {
        let reply = cluster
            .server(i)
            .try_get("/v1/operator/raft/configuration")
            .await?;
        (reply.status == StatusCode::OK && raft_voters(&reply.json()).len() == 3).then_some(())
    })
    .await;
    let leader = cluster.leader().await;
    eventually(REJOIN_LIMIT, "the marker written", || async {
        let reply = cluster
            .server(leader)
            .try_request(
                reqwest::Method::PUT,
                &format!("/v1/kv/{marker}"),
                Some(b"m".to_vec()),
            )
            .await
            .ok()?;
        (reply.status == StatusCode::OK && reply.text() == "true").then_some(())
    })
    .await;
    eventually(REJOIN_LIMIT, &format!("s{i} caught up"), || async {
        let reply = cluster
            .server(i)
            .try_get(&format!("/v1/kv/{marker}?stale"))
            .await?;
        (reply.status == StatusCode::OK).then_some(())
    })
    .await;
}

/// Every key under `w/` as server `i` has it (stale, from its own state).
async fn written(cluster: &Cluster, i: usize) -> Option<BTreeMap<String, String>> {
    let reply = cluster.server(i).try_get("/v1/kv/w/?recurse&stale").await?;
    if reply.status != StatusCode::OK {
        return None;
    }
    let entries = reply.json();
    Some(
        entries
            .as_array()?
            .iter()
            .map(|e| {
                let value = BASE64
                    .decode(e["Value"].as_str().unwrap_or_default())
                    .unwrap_or_default();
                let value = String::from_utf8_lossy(&value).into_owned();
                (e["Key"].as_str().unwrap_or_default().to_owned(), value)
            })
            .collect(),
    )
}

/// Ignored in the default run: with the previous release's first build it takes about 13
/// minutes on 2 cores. Run it with `scripts/upgrade-test.sh`.
#[tokio::test]
#[ignore = "builds the previous release (about 10 minutes once); scripts/upgrade-test.sh runs it"]
async fn a_rolling_upgrade_from_the_previous_release_loses_nothing() {
    let previous = tokio::task::spawn_blocking(previous_release)
        .await
        .expect("build the previous release");
    let _heavy = exclusive().await;
    let current = binary();
    let mut cluster = Cluster::servers(3)
        .clients(2)
        .binary(&previous)
        .start()
        .await;
    for i in 0..3 {
        assert_eq!(
            protocol_level(&cluster, i).await,
            None,
            "s{i} runs {PREVIOUS}"
        );
    }
    let clients: Clients = Arc::new(RwLock::new(vec![
        cluster.client(0).http(),
        cluster.client(1).http(),
    ]));

    let started = std::time::Instant::now();
    let record = Arc::new(Record::default());
    fill(&cluster, &record).await;
    for i in 0..3 {
        eventually(
            Duration::from_secs(60),
            &format!("s{i}'s snapshot"),
            || async { (snapshot_format(&cluster, i) == Some(3)).then_some(()) },
        )
        .await;
    }
    eprintln!("t94: filled the log in {:?}", started.elapsed());
    let (c0, c1) = (clients.read()[0].clone(), clients.read()[1].clone());
    let holders = [Holder::take(&c0, "c0").await, Holder::take(&c1, "c1").await];
    let stop = Arc::new(AtomicBool::new(false));
    let holder = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..2 {
        tasks.push(writer(
            Arc::clone(&clients),
            c,
            Arc::clone(&record),
            Arc::clone(&stop),
        ));
        let http = clients.read()[c].clone();
        let s = session(&http, &format!("contender-c{c}")).await;
        tasks.push(contender(
            Arc::clone(&clients),
            c,
            s,
            Arc::clone(&holder),
            Arc::clone(&record),
            Arc::clone(&stop),
        ));
    }
    tokio::time::sleep(SOAK).await;

    // The servers, one at a time: the followers first, the leader last.
    let leader = cluster.leader().await;
    let order: Vec<usize> = (0..3).filter(|&i| i != leader).chain([leader]).collect();
    for (step, &i) in order.iter().enumerate() {
        cluster.terminate(i).await;
        cluster.set_server_binary(i, &current);
        // It starts on the previous release's snapshot file.
        cluster.restart(i).await;
        await_rejoined(&cluster, i, &format!("marker/s{i}")).await;
        eprintln!("t94: s{i} replaced at {:?}", started.elapsed());
        tokio::time::sleep(SOAK).await;
        let when = format!("after replacing s{i}");
        let at = cluster.leader().await;
        for h in &holders {
            h.assert_holds(&cluster.server(at).http(), &when).await;
        }
        if step < 2 {
            // An old server remains: the level stays where the first release applies.
            for &j in &order[..=step] {
                assert_eq!(
                    protocol_level(&cluster, j).await.as_deref(),
                    Some("0"),
                    "{when}"
                );
            }
        }
    }
    // Every server runs this build: the leader raises the level.
    for i in 0..3 {
        eventually(
            Duration::from_secs(60),
            &format!("s{i} at level 2"),
            || async { (protocol_level(&cluster, i).await.as_deref() == Some("2")).then_some(()) },
        )
        .await;
    }
    eprintln!("t94: level 2 at {:?}", started.elapsed());
    tokio::time::sleep(SOAK).await;

    // Then the clients, one at a time. A client leaving gracefully takes its node's sessions
    // with it (as Consul's does), so the contenders stop first and the other client's holder
    // must keep its locks.
    stop.store(true, Ordering::Relaxed);
    for task in tasks.drain(..) {
        task.await.expect("workload task");
    }
    eprintln!("t94: workload stopped at {:?}", started.elapsed());
    stop.store(false, Ordering::Relaxed);
    for c in 0..2 {
        tasks.push(writer(
            Arc::clone(&clients),
            c,
            Arc::clone(&record),
            Arc::clone(&stop),
        ));
    }
    // c0 first, while c1's holder keeps its locks; then a holder through the upgraded c0 (this
    // build's lock queue) keeps its locks while c1 is replaced.
    cluster.terminate_client(0).await;
    cluster.set_client_binary(0, &current);
    cluster.restart_client(0).await;
    clients.write()[0] = cluster.client(0).http();
    tokio::time::sleep(SOAK).await;
    let at = cluster.leader().await;
    holders[1]
        .assert_holds(&cluster.server(at).http(), "after replacing c0")
        .await;
    eprintln!("t94: c0 replaced at {:?}", started.elapsed());
    let c0 = clients.read()[0].clone();
    let upgraded = Holder::take(&c0, "c0-upgraded").await;
    cluster.terminate_client(1).await;
    cluster.set_client_binary(1, &current);
    cluster.restart_client(1).await;
    clients.write()[1] = cluster.client(1).http();
    tokio::time::sleep(SOAK).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("workload task");
    }
    let at = cluster.leader().await;
    upgraded
        .assert_holds(&cluster.server(at).http(), "at the end")
        .await;

    eprintln!("t94: clients replaced at {:?}", started.elapsed());

    // Nothing acknowledged is lost, on any server; every server is a voter.
    let acked = record.acked.lock().clone();
    let during = acked.keys().filter(|k| !k.starts_with("w/fill/")).count();
    assert!(
        during > 100,
        "only {during} writes acknowledged during the upgrade"
    );
    for i in 0..3 {
        let voters = raft_voters(&cluster.raft_configuration(i).await);
        assert_eq!(voters.len(), 3, "s{i}: {voters:?}");
        eventually(
            REJOIN_LIMIT,
            &format!("every acknowledged write on s{i}"),
            || async {
                let have = written(&cluster, i).await?;
                acked
                    .iter()
                    .all(|(k, v)| have.get(k) == Some(v))
                    .then_some(())
            },
        )
        .await;
    }
    let violations = record.violations.lock().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    let grants = record.grants.lock().len();
    assert!(grants > 20, "only {grants} grants of the contended mutex");
    eprintln!(
        "t94: {} writes acknowledged ({during} during the upgrade), {grants} grants, {:?} in all",
        acked.len(),
        started.elapsed()
    );
}
