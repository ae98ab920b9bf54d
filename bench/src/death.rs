//! Deaths that are not the agent's, and stops that are not deaths: the rows of the failure
//! table that only Vigil has.
//!
//! - Process crash: `vigil lock` (lock-delay 0) holds a lock through a client agent on its own
//!   host, so its session is bound to its own process (a pidfd check) as well as `serfHealth`.
//!   Each round `kill -9`s `vigil lock` (its child keeps running, as after a crash of the
//!   application) and waits on a blocking query of the lock key until no session holds it:
//!   the check goes critical the instant the process exits, and its session dies in one raft
//!   commit. etcd's nearest is the kill row: the lease lives on until it expires.
//! - Agent loss: `vigil lock` (lock-delay 0) holds a lock through a client agent that is then
//!   `kill -9`ed, while a second `vigil lock` waits for the same lock through another agent.
//!   The holder learns of the loss from the refused connection and stops its child; the row
//!   counts the rounds in which the next holder's child started before the old one was
//!   stopped (both write the wall clock in nanoseconds), which must be none, and reports the
//!   margin.
//! - A server stopped for 4 s (SIGSTOP) while the leader is healthy: once resumed it must not
//!   start an election (pre-vote, and a follower's election timer restarted by the leader's
//!   first heartbeat). The row counts the terms the leader moved on by.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use integration_tests::Http;
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

use super::load::{median, percentile};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Plan, Systems};

/// Longest any one step may take.
const LIMIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(5);
/// How long the stopped server stays stopped.
const SERVER_STOP: Duration = Duration::from_secs(4);
/// After the stopped server resumes, how long an election it caused would take to show: past
/// the `lan` election timeout, with a wide margin.
const ELECTION_WINDOW: Duration = Duration::from_secs(3);

/// `vigil lock --lock-delay 0s <prefix> -- sh -c <script>` against the agent at `base`, `$DIR`
/// set to `dir` for the script.
fn vigil_lock(base: &str, prefix: &str, script: &str, dir: &Path) -> Result<Child> {
    Command::new(integration_tests::binary())
        .args([
            "lock",
            "--lock-delay",
            "0s",
            prefix,
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("VIGIL_HTTP_ADDR", base)
        .env_remove("CONSUL_HTTP_ADDR")
        .env("DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("spawn vigil lock")
}

/// Polls `what` until it gives a value, for at most [`LIMIT`].
pub(super) async fn until<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> Result<T> {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("{what} did not happen within {LIMIT:?}");
        }
        sleep(POLL).await;
    }
}

/// A number a script wrote to `path` (a PID, or `date +%s%N`), once the file is whole.
fn written(path: &Path) -> Option<u128> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn kill(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// The session holding `key`, with the index to block on for its release.
async fn holder(agent: &Http, key: &str) -> Option<(String, u64)> {
    let reply = agent.get(&format!("/v1/kv/{key}")).await;
    if reply.status != 200 {
        return None;
    }
    let entry = reply.json().get(0)?.clone();
    let session = entry.get("Session")?.as_str()?.to_owned();
    Some((session, reply.index()))
}

/// Blocks on `key` from `index` until no session holds it.
async fn wait_free(agent: &Http, key: &str, mut index: u64) -> Result<()> {
    let deadline = Instant::now() + LIMIT;
    while Instant::now() < deadline {
        let reply = agent
            .get(&format!("/v1/kv/{key}?index={index}&wait=5s"))
            .await;
        if reply.status == 404 || reply.json()[0]["Session"].is_null() {
            return Ok(());
        }
        index = reply.index();
    }
    bail!("{key} still held {LIMIT:?} after its holder died")
}

/// Process crash → lock free, per round.
async fn process_crash(agent: &Http, rounds: usize) -> Result<Vec<Duration>> {
    let key = "bench/process/.lock";
    let mut results = Vec::new();
    for _ in 0..rounds {
        let dir = tempfile::tempdir()?;
        let mut lock = vigil_lock(
            &agent.base,
            "bench/process",
            r#"echo $$ > "$DIR/child"; exec sleep 600"#,
            dir.path(),
        )?;
        let (_, index) = until("the lock taken", || holder(agent, key)).await?;
        let child = until("the child started", || async {
            written(&dir.path().join("child"))
        })
        .await?;
        let pid = lock.id().context("vigil lock runs")?;

        kill(pid, nix::sys::signal::Signal::SIGKILL);
        let killed = Instant::now();
        wait_free(agent, key, index).await?;
        let free = killed.elapsed();
        eprintln!(
            "  Vigil: vigil lock killed → lock free {:.1} ms",
            free.as_secs_f64() * 1e3
        );
        results.push(free);
        let _ = lock.wait().await;
        if let Ok(child) = u32::try_from(child) {
            kill(child, nix::sys::signal::Signal::SIGKILL);
        }
    }
    Ok(results)
}

/// One agent-loss round's figures.
struct Loss {
    /// From the agent's kill to the next holder's child starting.
    free: Duration,
    /// How long before that the old holder's child was stopped (negative: after, a violation).
    margin_ms: f64,
}

/// Agent loss: the old holder's child stopped before the next grant, per round.
async fn agent_loss(systems: &mut Systems, waiter: &Http, rounds: usize) -> Result<Vec<Loss>> {
    let servers = systems.vigil.running_servers();
    let server = systems.vigil.server(servers[0]).http();
    let key = "bench/agentloss/.lock";
    let holder_script = r#"
trap 'date +%s%N > "$DIR/stopped"; exit 0' TERM
echo $$ > "$DIR/pid"
while :; do sleep 0.05; done
"#;
    let mut results = Vec::new();
    for _ in 0..rounds {
        let c = systems.vigil.add_client(&servers).await;
        let agent = systems.vigil.client(c).http();
        let dir = tempfile::tempdir()?;
        let mut holding = vigil_lock(&agent.base, "bench/agentloss", holder_script, dir.path())?;
        until("the holder's lock", || holder(&server, key)).await?;
        until("the holder's child", || async {
            written(&dir.path().join("pid"))
        })
        .await?;
        let sessions = || async {
            let list = server.get("/v1/session/list").await.json();
            list.as_array().map(Vec::len)
        };
        let before = sessions().await.context("session list")?;
        let mut waiting = vigil_lock(
            &waiter.base,
            "bench/agentloss",
            r#"date +%s%N > "$DIR/granted"; exec sleep 600"#,
            dir.path(),
        )?;
        until("the contender's session", || async {
            sessions().await.filter(|&n| n > before)
        })
        .await?;

        let killed = now_ns();
        systems.vigil.kill9_client(c).await;
        timeout(LIMIT, holding.wait())
            .await
            .context("vigil lock did not exit after its agent died")??;
        let granted = until("the next grant", || async {
            written(&dir.path().join("granted"))
        })
        .await?;
        let stopped = written(&dir.path().join("stopped"))
            .context("the old holder's child was never stopped")?;
        let margin_ms = (granted as f64 - stopped as f64) / 1e6;
        let free = Duration::from_nanos(u64::try_from(granted.saturating_sub(killed))?);
        eprintln!(
            "  Vigil: agent killed → next grant {:.2} s, the old child stopped {margin_ms:.0} ms \
             before it",
            free.as_secs_f64()
        );
        results.push(Loss { free, margin_ms });
        if let Some(pid) = waiting.id() {
            kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        timeout(LIMIT, waiting.wait())
            .await
            .context("the contender did not give the lock back")??;
    }
    Ok(results)
}

/// The raft term a server reports (`/v1/agent/self`, `Stats.raft.term`).
async fn term(server: &Http) -> Result<u64> {
    let me = server.get("/v1/agent/self").await.json();
    me["Stats"]["raft"]["term"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("no raft term in /v1/agent/self: {me}"))
}

/// Elections caused by a follower stopped for [`SERVER_STOP`], summed over the rounds.
async fn server_stops(systems: &mut Systems, rounds: usize) -> Result<u64> {
    let mut elections = 0;
    for _ in 0..rounds {
        let leader = systems.vigil.leader().await;
        let Some(follower) = systems
            .vigil
            .running_servers()
            .into_iter()
            .find(|&i| i != leader)
        else {
            bail!("no follower to stop");
        };
        let server = systems.vigil.server(leader).http();
        let before = term(&server).await?;
        systems.vigil.pause(follower);
        sleep(SERVER_STOP).await;
        systems.vigil.resume(follower);
        sleep(ELECTION_WINDOW).await;
        let now = systems.vigil.leader().await;
        let after = term(&systems.vigil.server(now).http()).await?;
        eprintln!(
            "  Vigil: a follower stopped 4 s → term {before} → {after}, leader {leader} → {now}"
        );
        elections += after - before;
    }
    Ok(elections)
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let servers = systems.vigil.running_servers();
    let c = systems.vigil.add_client(&servers).await;
    let agent = systems.vigil.client(c).http();
    let crashes = process_crash(&agent, plan.kill_rounds).await?;
    let losses = agent_loss(systems, &agent, plan.failure_rounds).await?;
    let elections = server_stops(systems, plan.failure_rounds).await?;

    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let violations = losses.iter().filter(|l| l.margin_ms <= 0.0).count();
    let margins: Vec<f64> = losses.iter().map(|l| l.margin_ms).collect();
    let smallest_margin = margins.iter().copied().fold(f64::INFINITY, f64::min);
    let loss_free: Vec<Duration> = losses.iter().map(|l| l.free).collect();
    let details = json!({
        "process_crash_to_free_ms": crashes.iter().map(ms).collect::<Vec<_>>(),
        "agent_loss_to_next_grant_s": loss_free.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
        "agent_loss_margin_ms": margins,
        "server_stop_elections": elections,
    });
    let (crash_p50, crash_max) = (
        ms(&median(crashes.clone())),
        ms(&percentile(crashes.clone(), 100)),
    );
    let loss_free = median(loss_free).as_secs_f64();
    let (kills, rounds) = (plan.kill_rounds, plan.failure_rounds);
    let rows = vec![
        Row::vigil_only(
            "death.process_free",
            format!(
                "Process crash, process-bound session (`vigil lock` killed), median of {kills}"
            ),
            "kill → lock free (ms)",
            Better::Lower,
            Some(crash_p50),
        ),
        Row::vigil_only(
            "death.process_free.max",
            format!(
                "Process crash, process-bound session (`vigil lock` killed), slowest of {kills}"
            ),
            "kill → lock free (ms)",
            Better::Lower,
            Some(crash_max),
        ),
        Row::vigil_only(
            "death.agent_loss.violations",
            format!("Agent loss (holder's agent killed, lock-delay 0) × {rounds}"),
            "rounds the next holder started before the old child stopped",
            Better::Lower,
            Some(violations as f64),
        ),
        Row::vigil_only(
            "death.server_stop.elections",
            format!("A follower server stopped 4 s, leader healthy × {rounds}"),
            "elections it caused",
            Better::Lower,
            Some(elections as f64),
        ),
    ];
    let table = Table {
        title: format!(
            "Deaths and stops only Vigil tells apart (processes: of {kills}; others: of {rounds})"
        ),
        header: [
            "fault",
            "what frees the lock (or must not)",
            "median",
            "worst",
            "violations",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: vec![
            vec![
                "`vigil lock` killed (its agent lives)".to_owned(),
                "its pidfd check goes critical; the session dies in one commit".to_owned(),
                format!("{} ms", num(crash_p50)),
                format!("{} ms", num(crash_max)),
                "—".to_owned(),
            ],
            vec![
                "the holder's agent killed (lock-delay 0)".to_owned(),
                "gossip's evidence frees the lock; `vigil lock` stops its child on the refused \
                 connection first"
                    .to_owned(),
                format!("{} s to the next grant", num(loss_free)),
                format!("old child stopped ≥ {} ms before it", num(smallest_margin)),
                format!("{violations} of {rounds}"),
            ],
            vec![
                "a follower server stopped 4 s".to_owned(),
                "nothing: pre-vote keeps the leader".to_owned(),
                "—".to_owned(),
                "—".to_owned(),
                format!("{elections} elections in {rounds} rounds"),
            ],
        ],
    };
    Ok(Outcome {
        rows,
        tables: vec![table],
        details,
        usage: Vec::new(),
    })
}
