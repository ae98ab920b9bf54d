//! `vigil lock` as a process against a dev agent: mutual exclusion among 8 concurrent commands
//! (plain lock, `--fair` with FIFO order of arrival, `--limit 3`), lock loss (session destroyed
//! through the API → SIGTERM to the child's whole process group within 1 s; SIGKILL after the
//! grace for a child that ignores TERM; exit 75), giving up while waiting (SIGTERM → 143, session
//! gone), the sequencer environment, and `vigil lock status` / `/v1/vigil/locks`. The holder's
//! own agent: killed (a cluster's client agent), the child is stopped before a contender through
//! another agent is granted the lock, with no lock-delay; killed while serving on a Unix socket,
//! the same at once; stopped for 2 s, nothing is lost.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use integration_tests::cluster::Cluster;
use integration_tests::{Agent, binary, eventually};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::common::{PROMPT, exit_code, unix_dev_agent};

/// `vigil lock <args>` against `agent`, with extra environment for the child's script.
fn vigil_lock(agent: &Agent, args: &[&str], env: &[(&str, String)]) -> Child {
    Command::new(binary())
        .arg("lock")
        .args(args)
        .env("VIGIL_HTTP_ADDR", &agent.base)
        .env_remove("CONSUL_HTTP_ADDR")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn vigil lock")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Replays `start N`/`end N` lines: the order of starts and the most ever inside at once.
/// Panics on an `end` without its `start` or a section entered twice.
fn replay(log: &[String]) -> (Vec<String>, usize) {
    let mut inside = BTreeSet::new();
    let mut order = Vec::new();
    let mut most = 0;
    for line in log {
        match line.split_once(' ') {
            Some(("start", id)) => {
                assert!(order.iter().all(|o| o != id), "{id} ran twice: {log:?}");
                order.push(id.to_owned());
                inside.insert(id.to_owned());
                most = most.max(inside.len());
            }
            Some(("end", id)) => assert!(inside.remove(id), "end without start: {log:?}"),
            _ => {}
        }
    }
    assert!(inside.is_empty(), "unfinished sections: {log:?}");
    (order, most)
}

/// The child's script: wait for `$GO` (if set), then a short critical section logged to `$LOG`.
const SECTION: &str = r#"
echo "start $ID" >> "$LOG"
if [ -n "$GO" ]; then while [ ! -e "$GO" ]; do sleep 0.01; done; fi
sleep 0.02
echo "end $ID" >> "$LOG"
"#;

struct Run {
    dir: tempfile::TempDir,
    log: PathBuf,
    go: PathBuf,
}

impl Run {
    fn new() -> Run {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("log");
        let go = dir.path().join("go");
        Run { dir, log, go }
    }

    /// Eight `vigil lock <args>` commands started at once, IDs 0 to 7.
    fn spawn_eight(&self, agent: &Agent, args: &[&str], barrier: bool) -> Vec<Child> {
        (0..8)
            .map(|i| vigil_lock(agent, args, &self.env(i, barrier)))
            .collect()
    }

    fn env(&self, id: usize, barrier: bool) -> Vec<(&'static str, String)> {
        vec![
            ("ID", id.to_string()),
            ("LOG", self.log.display().to_string()),
            (
                "GO",
                if barrier {
                    self.go.display().to_string()
                } else {
                    String::new()
                },
            ),
        ]
    }

    fn open_barrier(&self) {
        std::fs::write(&self.go, "").expect("create the go file");
    }
}

async fn locks(agent: &Agent, prefix: &str) -> Value {
    let reply = agent.get(&format!("/v1/vigil/locks?prefix={prefix}")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

#[tokio::test]
async fn eight_plain_locks_never_overlap_and_all_run() {
    // Eight commands start at once on one prefix.
    let agent = Agent::dev().await;
    let run = Run::new();
    let mut procs = run.spawn_eight(&agent, &["mx", "--", "sh", "-c", SECTION], false);

    // Every one exits 0 (the child's status) …
    for p in &mut procs {
        assert_eq!(exit_code(p).await, 0);
    }
    // … and the log shows eight sections, one at a time.
    let (order, most) = replay(&lines(&run.log));
    assert_eq!(order.len(), 8, "{order:?}");
    assert_eq!(most, 1);
    // Every session was destroyed and the lock key is free.
    assert_eq!(agent.get("/v1/session/list").await.json(), json!([]));
    assert_eq!(locks(&agent, "mx").await["Locks"], json!([]));
    drop(run.dir);
}

#[tokio::test]
async fn eight_fair_locks_run_in_order_of_arrival() {
    // Arrivals are staggered: each command queues before the next starts. The first holds the
    // lock until the barrier opens, so all eight are queued behind it.
    let agent = Agent::dev().await;
    let run = Run::new();
    let mut procs = Vec::new();
    for i in 0..8 {
        procs.push(vigil_lock(
            &agent,
            &["--fair", "fq", "--", "sh", "-c", SECTION],
            &run.env(i, true),
        ));
        eventually(PROMPT, "the contender to queue", || async {
            let report = locks(&agent, "fq").await;
            let lock = &report["Queues"][0];
            let queued = [&lock["Holders"], &lock["Waiters"]]
                .iter()
                .map(|v| v.as_array().map_or(0, Vec::len))
                .sum::<usize>();
            (queued == i + 1).then_some(())
        })
        .await;
    }

    // The queue is observable, holder first, then the waiters in arrival order; so is `vigil
    // lock status`.
    let report = locks(&agent, "fq").await;
    let lock = &report["Queues"][0];
    assert_eq!(lock["Name"], json!("fq"));
    assert_eq!(lock["Holders"][0]["Node"], json!("test-node"));
    let waiters = lock["Waiters"].as_array().unwrap();
    let positions: Vec<u64> = waiters
        .iter()
        .map(|w| w["Position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, (1..=7).collect::<Vec<u64>>());
    let since: Vec<&str> = waiters
        .iter()
        .map(|w| w["WaitingSince"].as_str().unwrap())
        .collect();
    assert!(since.windows(2).all(|w| w[0] <= w[1]), "{since:?}");
    let status = Command::new(binary())
        .args(["lock", "status", "fq"])
        .env("VIGIL_HTTP_ADDR", &agent.base)
        .output()
        .await
        .expect("vigil lock status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("queued lock fq"), "{text}");
    assert_eq!(text.matches("exclusive session").count(), 8, "{text}");

    // Open the barrier: the sections run one at a time, first come first served.
    run.open_barrier();
    for p in &mut procs {
        assert_eq!(exit_code(p).await, 0);
    }
    let (order, most) = replay(&lines(&run.log));
    assert_eq!(most, 1);
    let expected: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    assert_eq!(order, expected);
    assert_eq!(
        agent.get("/v1/vigil/lock/fq").await.status,
        404,
        "queue left behind"
    );
}

#[tokio::test]
async fn limit_three_lets_exactly_three_in_at_once() {
    // Eight commands on a semaphore of 3; those inside wait at the barrier.
    let agent = Agent::dev().await;
    let run = Run::new();
    let mut procs = run.spawn_eight(
        &agent,
        &["--limit", "3", "sem", "--", "sh", "-c", SECTION],
        true,
    );

    // Three get in and stay in; the semaphore reports 3 holders and 5 waiting.
    eventually(PROMPT, "three holders inside", || async {
        let report = locks(&agent, "sem").await;
        let sem = &report["Semaphores"][0];
        let holders = sem["Holders"].as_array().map_or(0, Vec::len);
        let waiting = sem["Waiting"].as_array().map_or(0, Vec::len);
        let inside = lines(&run.log).len();
        (holders == 3 && waiting == 5 && inside == 3).then_some(())
    })
    .await;
    assert_eq!(
        locks(&agent, "sem").await["Semaphores"][0]["Limit"],
        json!(3)
    );

    // After the barrier opens everyone runs, never more than three at a time.
    run.open_barrier();
    for p in &mut procs {
        assert_eq!(exit_code(p).await, 0);
    }
    let (order, most) = replay(&lines(&run.log));
    assert_eq!(order.len(), 8);
    assert_eq!(most, 3);
}

/// The holder's session, read from the lock key.
async fn holder_session(agent: &Agent, key: &str) -> String {
    eventually(PROMPT, "the lock to be held", || async {
        let reply = agent.get(&format!("/v1/kv/{key}")).await;
        (reply.status == 200)
            .then(|| reply.json()[0]["Session"].as_str().map(str::to_owned))
            .flatten()
    })
    .await
}

#[tokio::test]
async fn lost_lock_terminates_child_and_grandchild_within_a_second() {
    // The child traps TERM and starts a grandchild (`sh -c`) that traps it too. The sequencer is
    // in the child's environment; CONSUL_HTTP_ADDR alone finds the agent.
    let agent = Agent::dev().await;
    let run = Run::new();
    let script = r#"
trap 'echo child-term >> "$LOG"; exit 0' TERM
sh -c 'trap "echo grandchild-term >> \"$LOG\"; exit 0" TERM; echo grandchild-ready >> "$LOG"; while :; do sleep 0.05; done' &
echo "env $VIGIL_LOCK_KEY $VIGIL_LOCK_INDEX $VIGIL_LOCK_SESSION $CONSUL_LOCK_HELD" >> "$LOG"
echo child-ready >> "$LOG"
wait
"#;
    let mut proc = Command::new(binary())
        .args(["lock", "loss", "--", "sh", "-c", script])
        .env("CONSUL_HTTP_ADDR", &agent.base)
        .env_remove("VIGIL_HTTP_ADDR")
        .env("LOG", &run.log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn vigil lock");
    eventually(PROMPT, "child and grandchild to start", || async {
        let log = lines(&run.log);
        (log.contains(&"child-ready".into()) && log.contains(&"grandchild-ready".into()))
            .then_some(())
    })
    .await;
    let session = holder_session(&agent, "loss/.lock").await;
    let env_line = lines(&run.log)
        .into_iter()
        .find(|l| l.starts_with("env "))
        .unwrap();
    assert_eq!(env_line, format!("env loss/.lock 1 {session} true"));

    // Destroying the session through the API reaches both processes within a second.
    let destroyed = Instant::now();
    agent.destroy_session(&session).await;
    eventually(
        Duration::from_secs(1),
        "SIGTERM in child and grandchild",
        || async {
            let log = lines(&run.log);
            (log.contains(&"child-term".into()) && log.contains(&"grandchild-term".into()))
                .then_some(())
        },
    )
    .await;
    println!(
        "lock loss → SIGTERM in the group: {:?}",
        destroyed.elapsed()
    );

    // vigil exits with the documented "lock lost" status.
    assert_eq!(exit_code(&mut proc).await, 75);
}

#[tokio::test]
async fn child_ignoring_sigterm_is_killed_after_the_grace() {
    // The whole group ignores TERM; the grace is 1 s.
    let agent = Agent::dev().await;
    let run = Run::new();
    let script = r#"
trap '' TERM
echo "pid $$" >> "$LOG"
while :; do sleep 0.05; done
"#;
    let mut proc = vigil_lock(
        &agent,
        &["--grace", "1s", "stubborn", "--", "sh", "-c", script],
        &[("LOG", run.log.display().to_string())],
    );
    let pid: u32 = eventually(PROMPT, "the child to start", || async {
        lines(&run.log)
            .iter()
            .find_map(|l| l.strip_prefix("pid ").and_then(|p| p.parse().ok()))
    })
    .await;
    let session = holder_session(&agent, "stubborn/.lock").await;

    // After the session is destroyed the child survives SIGTERM, and is SIGKILLed after 1 s.
    let destroyed = Instant::now();
    agent.destroy_session(&session).await;
    assert_eq!(exit_code(&mut proc).await, 75);
    let took = destroyed.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "killed before the grace: {took:?}"
    );
    assert!(took < Duration::from_secs(6), "grace overrun: {took:?}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "child {pid} still exists"
    );
}

#[tokio::test]
async fn waiting_command_can_be_stopped_and_leaves_nothing_behind() {
    // One command holds the lock behind the barrier; a second waits for it.
    let agent = Agent::dev().await;
    let run = Run::new();
    let mut holder = vigil_lock(
        &agent,
        &["wq", "--", "sh", "-c", SECTION],
        &run.env(0, true),
    );
    holder_session(&agent, "wq/.lock").await;
    let mut waiter = vigil_lock(
        &agent,
        &["wq", "--", "sh", "-c", SECTION],
        &run.env(1, false),
    );
    eventually(PROMPT, "the waiter's session", || async {
        let sessions = agent.get("/v1/session/list").await.json();
        (sessions.as_array().map_or(0, Vec::len) == 2).then_some(())
    })
    .await;

    // SIGTERM makes the waiter give up: status 128+15, its session destroyed.
    let pid = waiter.id().expect("waiter pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
    assert_eq!(exit_code(&mut waiter).await, 143);
    let sessions = agent.get("/v1/session/list").await.json();
    assert_eq!(sessions.as_array().map(Vec::len), Some(1), "{sessions}");

    // The holder is unaffected and finishes normally; only its section ran.
    run.open_barrier();
    assert_eq!(exit_code(&mut holder).await, 0);
    assert_eq!(replay(&lines(&run.log)).0, vec!["0".to_owned()]);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_killed_vigil_lock_frees_its_lock_at_once_through_its_process_check() {
    let agent = Agent::dev().await;

    // By default the session is bound to serfHealth and to `vigil lock`'s own process.
    let mut proc = vigil_lock(&agent, &["bound", "--", "sleep", "600"], &[]);
    let pid = proc.id().expect("vigil lock runs");
    let session = holder_session(&agent, "bound/.lock").await;
    let info = agent.session_info(&session).await[0].clone();
    assert_eq!(info["NodeChecks"], json!(["serfHealth"]), "{info}");
    let check = format!("service:vigil-process-{pid}");
    assert_eq!(info["ServiceChecks"][0]["ID"], check.as_str(), "{info}");

    // kill -9 of vigil lock (its child is left running): the lock is free long before the
    // session's 15 s TTL could lapse.
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    let _ = proc.wait().await;
    eventually(Duration::from_secs(5), "the lock to be free", || async {
        (!agent.session_exists(&session).await).then_some(())
    })
    .await;
    println!(
        "vigil lock kill -9 → session invalidated: {:?}",
        killed.elapsed()
    );
    let reply = agent.get("/v1/kv/bound/.lock").await;
    assert!(
        reply.status == 404 || reply.json()[0]["Session"].is_null(),
        "{}",
        reply.text()
    );

    // --no-process-check keeps Consul's binding: serfHealth alone.
    let _unbound = vigil_lock(
        &agent,
        &["unbound", "--no-process-check", "--", "sleep", "600"],
        &[],
    );
    let session = holder_session(&agent, "unbound/.lock").await;
    let info = agent.session_info(&session).await[0].clone();
    assert_eq!(info["NodeChecks"], json!(["serfHealth"]), "{info}");
    assert!(info["ServiceChecks"].is_null(), "{info}");
}

/// `vigil lock <args>` against the agent at `addr` with `$DIR` set for the child's script, its
/// stderr in `<dir>/<name>.err`.
fn vigil_lock_in(addr: &str, args: &[&str], dir: &Path, name: &str) -> Child {
    let stderr = std::fs::File::create(dir.join(format!("{name}.err"))).expect("stderr file");
    Command::new(binary())
        .arg("lock")
        .args(args)
        .env("VIGIL_HTTP_ADDR", addr)
        .env_remove("CONSUL_HTTP_ADDR")
        .env("DIR", dir)
        .stdin(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn vigil lock")
}

/// A nanosecond wall-clock time a child wrote with `date +%s%N`, once the file exists.
fn written_time(path: &Path) -> Option<u128> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_holder_whose_agent_dies_stops_its_child_before_anyone_else_is_granted() {
    // One server, two client agents. The holder locks through client 0, a contender waits
    // through client 1; neither session has a lock-delay, so only the holder's own reaction
    // keeps the two children from overlapping once the cluster frees the lock.
    let mut cluster = Cluster::servers(1).clients(2).start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let holder_script = r#"
trap 'date +%s%N > "$DIR/stopped"; exit 0' TERM
echo $$ > "$DIR/pid"
while :; do sleep 0.05; done
"#;
    let mut holder = vigil_lock_in(
        &cluster.client(0).base,
        &[
            "--lock-delay",
            "0s",
            "agentloss",
            "--",
            "sh",
            "-c",
            holder_script,
        ],
        dir.path(),
        "holder",
    );
    let server = cluster.server(0).http();
    let session = holder_session(cluster.server(0), "agentloss/.lock").await;
    eventually(PROMPT, "the holder's child to start", || async {
        dir.path().join("pid").exists().then_some(())
    })
    .await;
    let mut contender = vigil_lock_in(
        &cluster.client(1).base,
        &[
            "--lock-delay",
            "0s",
            "agentloss",
            "--",
            "sh",
            "-c",
            r#"date +%s%N > "$DIR/granted"; exec sleep 600"#,
        ],
        dir.path(),
        "contender",
    );
    eventually(PROMPT, "the contender to wait", || async {
        let sessions = server.get("/v1/session/list").await.json();
        (sessions.as_array().map_or(0, Vec::len) == 2).then_some(())
    })
    .await;

    // kill -9 of the holder's agent: vigil lock learns it from the refused connection, stops
    // its child and exits as for a lost lock.
    let killed = Instant::now();
    cluster.kill9_client(0).await;
    assert_eq!(exit_code(&mut holder).await, 75);
    println!("agent kill -9 → vigil lock exited: {:?}", killed.elapsed());
    let stderr = std::fs::read_to_string(dir.path().join("holder.err")).unwrap();
    assert!(stderr.contains("local agent is gone"), "{stderr}");
    let stopped = written_time(&dir.path().join("stopped")).expect("the child trapped SIGTERM");

    // The cluster frees the lock (the session dies with its node) and the contender gets it,
    // strictly after the holder's child was stopped.
    let granted = eventually(PROMPT, "the contender to be granted", || async {
        written_time(&dir.path().join("granted"))
    })
    .await;
    assert!(!server.session_exists(&session).await);
    assert!(
        stopped < granted,
        "the holder's child was stopped {} ms after the contender's started",
        (stopped - granted) / 1_000_000
    );
    println!(
        "holder's child stopped {} ms before the next grant",
        (granted - stopped) / 1_000_000
    );
    assert!(
        contender.try_wait().unwrap().is_none(),
        "contender holds on"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_holder_keeps_its_lock_through_a_two_second_stop_of_its_agent() {
    // The child runs until the barrier opens, and logs a SIGTERM if one comes.
    let agent = Agent::dev().await;
    let run = Run::new();
    let script = r#"
trap 'echo term >> "$LOG"; exit 0' TERM
echo "pid $$" >> "$LOG"
while [ ! -e "$GO" ]; do sleep 0.05; done
"#;
    let mut proc = vigil_lock(
        &agent,
        &["--lock-delay", "0s", "paused", "--", "sh", "-c", script],
        &run.env(0, true),
    );
    let session = holder_session(&agent, "paused/.lock").await;
    eventually(PROMPT, "the child to start", || async {
        lines(&run.log)
            .iter()
            .any(|l| l.starts_with("pid "))
            .then_some(())
    })
    .await;

    // The agent is stopped for 2 s (well within the 15 s TTL): it answers nothing and refuses
    // nothing, which is no evidence of death.
    let pid = nix::unistd::Pid::from_raw(agent.pid().expect("agent runs") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();

    // Resumed: the same session holds the lock, and the command runs to its own end (0, not
    // the 75 of a lost lock), never signalled.
    assert_eq!(holder_session(&agent, "paused/.lock").await, session);
    assert!(proc.try_wait().unwrap().is_none(), "vigil lock gave up");
    run.open_barrier();
    assert_eq!(exit_code(&mut proc).await, 0);
    assert!(
        !lines(&run.log).contains(&"term".to_owned()),
        "{:?}",
        lines(&run.log)
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_holder_learns_at_once_that_its_agent_on_a_unix_socket_died() {
    // A dev agent serving its API on a Unix socket only; vigil lock reaches it there.
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("http.sock");
    let (mut agent, _) = unix_dev_agent(&socket, "unix-holder").await;
    let addr = format!("unix://{}", socket.display());
    let mut holder = vigil_lock_in(
        &addr,
        &[
            "unixloss",
            "--",
            "sh",
            "-c",
            r#"echo $$ > "$DIR/pid"; exec sleep 600"#,
        ],
        dir.path(),
        "holder",
    );
    eventually(PROMPT, "the child to start", || async {
        dir.path().join("pid").exists().then_some(())
    })
    .await;

    // kill -9 of the agent: its socket file stays, the dial is refused, and vigil lock stops its
    // child at once, long before the 15 s TTL could tell.
    let killed = Instant::now();
    agent.start_kill().expect("kill -9 the agent");
    agent.wait().await.expect("the agent exits");
    assert_eq!(exit_code(&mut holder).await, 75);
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "vigil lock exited after {took:?}"
    );
    let stderr = std::fs::read_to_string(dir.path().join("holder.err")).unwrap();
    assert!(stderr.contains("local agent is gone"), "{stderr}");
}
