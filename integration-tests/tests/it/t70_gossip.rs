//! Gossip failure detection end to end, with real processes: a `kill -9`ed client agent's
//! `serfHealth` goes critical, which invalidates its sessions (locks released, lock-delay
//! armed); a graceful leave (`PUT /v1/agent/leave` or SIGTERM) deregisters the node; a client
//! with the wrong `--encrypt` key never joins; a client stopped (SIGSTOP) for 2 s under the `lan`
//! profile is not declared failed (the kernel refuses nothing while its socket is open), while a
//! `kill -9`ed one (its port closed) is declared down by that evidence, its session invalidated
//! before a suspicion could even expire; `/v1/agent/members` lists every agent with its role.
//!
//! The measured detection times are printed (`cargo nextest run --no-capture` shows them).

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Http, eventually, keygen};
use reqwest::StatusCode;
use tokio::time::{Instant, sleep};

/// A crash must be detected (serfHealth critical) within this under the `local` profile.
const DETECT_LIMIT: Duration = Duration::from_secs(15);
/// The `lan` profile's suspicion timeout for five members: detection by timeout alone never
/// takes less (a failed probe first, then this long for the suspect to refute).
const LAN_SUSPICION: Duration = Duration::from_secs(4);
/// Gossip membership must converge within this.
const CONVERGE_LIMIT: Duration = Duration::from_secs(20);

/// The `Status` code of member `name` in `agent`'s member list.
async fn member_status(agent: &Http, name: &str) -> Option<u64> {
    agent
        .members()
        .await
        .iter()
        .find(|m| m["Name"] == name)
        .and_then(|m| m["Status"].as_u64())
}

/// The node names in `/v1/catalog/nodes`.
async fn catalog_nodes(agent: &Http) -> Vec<String> {
    let reply = agent.get("/v1/catalog/nodes").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply
        .json()
        .as_array()
        .expect("nodes array")
        .iter()
        .map(|n| n["Node"].as_str().expect("Node").to_owned())
        .collect()
}

/// Waits for `node`, which has left, to be deregistered, and asserts its `session` went with it
/// (and the lock the session held on `key`) and the member is left. Returns how long the
/// deregistration took from `since`.
async fn assert_left(
    server: &Http,
    node: &str,
    session: &str,
    key: &str,
    since: Instant,
) -> Duration {
    let what = format!("{node} to be deregistered");
    eventually(CONVERGE_LIMIT, &what, || async {
        (!catalog_nodes(server).await.iter().any(|n| n == node)).then_some(())
    })
    .await;
    let took = since.elapsed();
    assert!(
        !server.session_exists(session).await,
        "{node}'s session invalidated"
    );
    assert_eq!(server.holder(key).await, None, "{node}'s lock released");
    assert_eq!(member_status(server, node).await, Some(3), "{node} is left");
    took
}

async fn wait_serf_health(agent: &Http, node: &str, status: &str, limit: Duration) {
    eventually(limit, &format!("{node}'s serfHealth {status}"), || async {
        (agent.serf_health(node).await.as_deref() == Some(status)).then_some(())
    })
    .await;
}

/// Waits until `agent` sees exactly `expected` (name, role) members, all alive (Status 1).
async fn wait_all_alive(agent: &Http, expected: &[(String, &str)]) {
    eventually(CONVERGE_LIMIT, "every member alive", || async {
        let list = agent.members().await;
        let mut seen: Vec<(String, String, u64)> = list
            .iter()
            .map(|m| {
                (
                    m["Name"].as_str().unwrap_or_default().to_owned(),
                    m["Tags"]["role"].as_str().unwrap_or_default().to_owned(),
                    m["Status"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
        seen.sort();
        let mut want: Vec<(String, String, u64)> = expected
            .iter()
            .map(|(n, r)| (n.clone(), (*r).to_owned(), 1))
            .collect();
        want.sort();
        (seen == want).then_some(())
    })
    .await;
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

#[tokio::test]
async fn members_crash_and_graceful_leave() {
    let mut cluster = Cluster::servers(3).clients(2).start().await;
    let server = cluster.server(0).http();

    // Phase 1: every server and client agent sees all five, alive, with the right roles.
    let mut expected: Vec<(String, &str)> = (0..3).map(|i| (format!("s{i}"), "consul")).collect();
    expected.extend((0..2).map(|i| (format!("c{i}"), "node")));
    for i in 0..3 {
        wait_all_alive(&cluster.server(i).http(), &expected).await;
    }
    for i in 0..2 {
        wait_all_alive(&cluster.client(i).http(), &expected).await;
    }
    for m in server.members().await {
        let name = m["Name"].as_str().expect("Name");
        assert!(
            m["Port"].as_u64().unwrap_or(0) > 0,
            "{name} has a gossip port"
        );
        assert_eq!(m["Tags"]["dc"], "dc1", "{name}'s dc");
    }

    // Phase 2: kill -9 of the client whose session holds a lock.
    let (c0, c1) = (cluster.client(0).http(), cluster.client(1).http());
    let victim = create_session(&c1, r#"{"Name":"victim","LockDelay":"2s"}"#).await;
    c1.acquire_ok("t70/crash", &victim).await;
    let other = create_session(&c0, r#"{"Name":"other","LockDelay":"0s"}"#).await;
    wait_serf_health(&server, "c1", "passing", CONVERGE_LIMIT).await;
    assert_eq!(server.holder("t70/crash").await.as_deref(), Some(&*victim));

    cluster.kill9_client(1).await;
    let killed = Instant::now();
    wait_serf_health(&server, "c1", "critical", DETECT_LIMIT).await;
    let critical = killed.elapsed();
    eventually(
        Duration::from_secs(5),
        "the lock to be released",
        || async { server.holder("t70/crash").await.is_none().then_some(()) },
    )
    .await;
    let released = killed.elapsed();
    assert!(!server.session_exists(&victim).await, "victim invalidated");

    // The lock-delay (2 s from the invalidation) refuses the other session for a while.
    let refused = c0.acquire("t70/crash", &other).await;
    assert_eq!(refused.text(), "false", "acquire right after the release");
    assert!(
        refused.header("X-Vigil-Lock-Delay").is_some(),
        "refusal carries X-Vigil-Lock-Delay"
    );
    let refusals = std::cell::Cell::new(1);
    eventually(
        Duration::from_secs(10),
        "the lock-delay to pass",
        || async {
            let reply = c0.acquire("t70/crash", &other).await;
            if reply.text() == "true" {
                return Some(());
            }
            assert!(
                reply.header("X-Vigil-Lock-Delay").is_some(),
                "refusal header"
            );
            refusals.set(refusals.get() + 1);
            None
        },
    )
    .await;
    let refusals = refusals.get();
    let acquirable = killed.elapsed();
    assert!(
        acquirable >= critical + Duration::from_millis(1500),
        "lock-delay honoured: critical at {critical:?}, acquired at {acquirable:?}"
    );
    assert_eq!(server.holder("t70/crash").await.as_deref(), Some(&*other));
    println!(
        "t70 kill -9 (local profile): kill→critical {critical:?}, kill→released {released:?}, \
         kill→acquirable {acquirable:?} (lock-delay 2s, {refusals} refusals)"
    );

    // Phase 3a: PUT /v1/agent/leave on c0: it exits 0, its node is deregistered, its session
    // (which holds a lock) is invalidated.
    c0.acquire_ok("t70/leave0", &other).await;
    let reply = c0.put("/v1/agent/leave", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let left_at = Instant::now();
    let code = cluster
        .take_client(0)
        .wait_exit(Duration::from_secs(20))
        .await;
    assert_eq!(code, Some(0), "c0 exit code after /v1/agent/leave");
    let deregistered = assert_left(&server, "c0", &other, "t70/leave0", left_at).await;

    // Phase 3b: SIGTERM to a fresh client c2 (exit 0 is asserted by terminate_client).
    let c2_index = cluster.add_client(&[0, 1, 2]).await;
    let c2 = cluster.client(c2_index).http();
    let s2 = create_session(&c2, r#"{"Name":"c2","LockDelay":"0s"}"#).await;
    c2.acquire_ok("t70/leave2", &s2).await;
    cluster.terminate_client(c2_index).await;
    let terminated_at = Instant::now();
    let deregistered2 = assert_left(&server, "c2", &s2, "t70/leave2", terminated_at).await;
    // The crashed c1 is still in the catalog (failed, not left), critical.
    assert!(catalog_nodes(&server).await.iter().any(|n| n == "c1"));
    assert_eq!(server.serf_health("c1").await.as_deref(), Some("critical"));
    assert_eq!(member_status(&server, "c1").await, Some(4), "c1 is failed");

    // Phase 4: force-leave?prune of the crashed c1 on a server: the leader deregisters it
    // (Left), and no agent lists it any more.
    let reply = server.put("/v1/agent/force-leave/c1?prune", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    eventually(CONVERGE_LIMIT, "c1 to be deregistered", || async {
        (!catalog_nodes(&server).await.iter().any(|n| n == "c1")).then_some(())
    })
    .await;
    for agent in [&server, &cluster.server(1).http()] {
        eventually(CONVERGE_LIMIT, "c1 no longer listed", || async {
            member_status(agent, "c1").await.is_none().then_some(())
        })
        .await;
    }
    println!(
        "t70 graceful leave: /v1/agent/leave→deregistered {deregistered:?}, \
         SIGTERM→deregistered {deregistered2:?}"
    );
}

#[tokio::test]
async fn a_client_with_the_wrong_gossip_key_never_joins() {
    let (k1, k2) = (keygen(), keygen());
    assert_ne!(k1, k2);
    let mut cluster = Cluster::servers(3)
        .server_arg("--encrypt")
        .server_arg(&k1)
        .start()
        .await;
    let server = cluster.server(0).http();
    let all = [0, 1, 2];
    let bad = cluster.add_client_with(&all, &["--encrypt", &k2]).await;
    let good = cluster.add_client_with(&all, &["--encrypt", &k1]).await;
    let (bad_name, good_name) = (
        cluster.clients[bad].name.clone(),
        cluster.clients[good].name.clone(),
    );
    let (bad_http, good_http) = (cluster.client(bad).http(), cluster.client(good).http());

    // The client with the right key joins and can use the cluster.
    eventually(CONVERGE_LIMIT, "the good client to join", || async {
        (member_status(&server, &good_name).await == Some(1)).then_some(())
    })
    .await;
    let session = create_session(&good_http, r#"{"LockDelay":"0s"}"#).await;
    good_http.acquire_ok("t70/encrypted", &session).await;

    // The one with the wrong key never shows up, for several re-announce rounds (1 s each).
    let window = Instant::now() + Duration::from_secs(4);
    let mut polls = 0;
    while Instant::now() < window {
        for i in all {
            let list = cluster.server(i).http().members().await;
            assert!(
                !list.iter().any(|m| m["Name"] == bad_name.as_str()),
                "server {i} lists the client with the wrong key: {list:?}"
            );
        }
        let own = bad_http.members().await;
        assert!(
            own.iter().all(|m| m["Name"] == bad_name.as_str()),
            "the wrong-key client knows only itself: {own:?}"
        );
        polls += 1;
        sleep(Duration::from_millis(200)).await;
    }
    assert!(!catalog_nodes(&server).await.contains(&bad_name));
    // The client agent retries for its whole retry deadline before giving up.
    let asked = Instant::now();
    let reply = bad_http.get("/v1/catalog/nodes").await;
    let answered = asked.elapsed();
    assert!(
        !reply.status.is_success(),
        "API through the wrong-key client must fail: {} {}",
        reply.status,
        reply.text()
    );
    assert!(
        reply.text().contains("No known Consul servers"),
        "error names the cause: {} {}",
        reply.status,
        reply.text()
    );
    println!(
        "t70 wrong key: {polls} polls, never joined; API answered after {answered:?}: {} {:?}",
        reply.status,
        reply.text()
    );
}

#[tokio::test]
async fn a_two_second_sigstop_is_not_a_failure_under_the_lan_profile() {
    let cluster = Cluster::servers(3)
        .clients(2)
        .gossip_profile("lan")
        .start()
        .await;
    let server = cluster.server(0).http();
    let mut expected: Vec<(String, &str)> = (0..3).map(|i| (format!("s{i}"), "consul")).collect();
    expected.extend((0..2).map(|i| (format!("c{i}"), "node")));
    for i in 0..3 {
        wait_all_alive(&cluster.server(i).http(), &expected).await;
    }
    let c1 = cluster.client(1).http();
    let session = create_session(&c1, r#"{"Name":"paused","LockDelay":"2s"}"#).await;
    c1.acquire_ok("t70/paused", &session).await;
    wait_serf_health(&server, "c1", "passing", CONVERGE_LIMIT).await;

    let pid = cluster.client(1).pid().expect("c1 is running");
    let mut false_invalidations = 0;
    let mut observations = Vec::new();
    let stopped = Instant::now();
    signal(pid, "-STOP");
    // Watch during the 2 s pause, then for 8 s after SIGCONT (longer than the suspicion
    // timeout of 4 s plus a probe period), through every server.
    let mut resumed = false;
    while stopped.elapsed() < Duration::from_secs(10) {
        if !resumed && stopped.elapsed() >= Duration::from_secs(2) {
            signal(pid, "-CONT");
            resumed = true;
        }
        for i in 0..3 {
            let s = cluster.server(i).http();
            let health = s.serf_health("c1").await;
            if health.as_deref() != Some("passing") {
                false_invalidations += 1;
                observations.push(format!(
                    "{:?}: s{i} serfHealth {health:?}",
                    stopped.elapsed()
                ));
            }
        }
        if !server.session_exists(&session).await {
            false_invalidations += 1;
            observations.push(format!("{:?}: session gone", stopped.elapsed()));
        }
        if server.holder("t70/paused").await.as_deref() != Some(&*session) {
            false_invalidations += 1;
            observations.push(format!("{:?}: lock not held", stopped.elapsed()));
        }
        sleep(Duration::from_millis(100)).await;
    }
    if !resumed {
        signal(pid, "-CONT");
    }
    let status = member_status(&server, "c1").await;
    println!(
        "t70 SIGSTOP 2s (lan profile): {false_invalidations} false invalidations, \
         c1 member status {status:?} {observations:?}"
    );
    assert_eq!(false_invalidations, 0, "{observations:#?}");
    assert_eq!(status, Some(1));
    // c1 works again.
    let reply = c1.get(&format!("/v1/session/info/{session}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_killed_agent_is_down_by_evidence_before_the_suspicion_timeout() {
    let mut cluster = Cluster::servers(3)
        .clients(2)
        .gossip_profile("lan")
        .start()
        .await;
    let server = cluster.server(0).http();
    let mut expected: Vec<(String, &str)> = (0..3).map(|i| (format!("s{i}"), "consul")).collect();
    expected.extend((0..2).map(|i| (format!("c{i}"), "node")));
    for i in 0..3 {
        wait_all_alive(&cluster.server(i).http(), &expected).await;
    }
    let (c0, c1) = (cluster.client(0).http(), cluster.client(1).http());
    let victim = create_session(&c1, r#"{"Name":"victim","LockDelay":"0s"}"#).await;
    c1.acquire_ok("t70/evidence", &victim).await;
    let next = create_session(&c0, r#"{"Name":"next","LockDelay":"0s"}"#).await;
    wait_serf_health(&server, "c1", "passing", CONVERGE_LIMIT).await;

    // kill -9 of c1: its gossip port is closed, the next probe is refused twice, and the
    // Down reaches the leader, which fails serfHealth and invalidates the session.
    cluster.kill9_client(1).await;
    let killed = Instant::now();
    eventually(DETECT_LIMIT, "the victim's session invalidated", || async {
        (!server.session_exists(&victim).await).then_some(())
    })
    .await;
    let invalidated = killed.elapsed();
    assert_eq!(server.serf_health("c1").await.as_deref(), Some("critical"));
    c0.acquire_ok("t70/evidence", &next).await;
    let acquired = killed.elapsed();
    println!(
        "t70 kill -9 (lan profile, evidence): kill→session invalidated {invalidated:?}, \
         kill→next holder {acquired:?} (suspicion timeout alone {LAN_SUSPICION:?})"
    );
    assert!(
        invalidated < LAN_SUSPICION,
        "invalidated after {invalidated:?}: not by evidence"
    );

    // Every server hears of the Down (the one asked may not be the one that saw it first);
    // the survivors are untouched.
    eventually(DETECT_LIMIT, "s0 to list c1 failed", || async {
        (member_status(&server, "c1").await == Some(4)).then_some(())
    })
    .await;
    for i in 0..3 {
        assert_eq!(member_status(&server, &format!("s{i}")).await, Some(1));
    }
    assert_eq!(member_status(&server, "c0").await, Some(1));
}
