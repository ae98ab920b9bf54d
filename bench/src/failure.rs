//! Failure detection: how long a lock stays held after its holder's process is killed or goes
//! silent, and whether a stall that is not a death costs anyone a session.
//!
//! - Vigil (`lan` gossip profile): each round starts a client agent, creates a session on it
//!   (lock-delay 0, bound to the node's `serfHealth`), takes a lock, `kill -9`s the agent (or
//!   stops it for good with SIGSTOP: silent, so only suspicion finds it) and polls a server
//!   until the node's `serfHealth` is critical and another session can take the lock. Median
//!   over the rounds; the kill row runs more rounds (`Plan::kill_rounds`, 10 in each of a
//!   run's repetitions) and also reports their p90 and maximum: a p99 would need a hundred
//!   rounds of about 4 s each, so the maximum stands in for it.
//! - Stalls: two client agents hold sessions (the holder's with the lock); each round stops the
//!   holder's agent for 2 s, another agent for 5 s, then starves that other agent of CPU for
//!   5 s (1% of one core through the kernel's CFS bandwidth control, a cgroup v1 `cpu` group:
//!   the stall of an overloaded host, which still runs a little), then stops a follower server
//!   for 4 s, and after each waits out a settle window before counting the sessions
//!   invalidated that belonged to a node that was not the one stopped or starved for 5 s
//!   (whose own session may rightly die: 5 s is past the `lan` suspicion). Every one counted is
//!   a false invalidation. Where no `cpu` cgroup can be made (not root, no cgroup v1 `cpu`
//!   mount), the starvation is skipped and the report says why.
//! - etcd has no failure detector: a dead client's lock is freed when its lease expires. Each
//!   victim holds a v3lock `Lock` with a 3 s lease renewed every TTL/3 (as etcd's Go client
//!   renews), the shortest TTL that, like Vigil's `lan` profile, survives a 2 s pause of the
//!   holder. Victims die (keep-alives stop, connection closes: what a kill does to them) spread
//!   evenly over one keep-alive period; the time until the lock key is deleted is measured.
//! - Consul, where it runs: as Vigil's kill rounds, with a Consul client agent holding the lock
//!   through a session bound to its `serfHealth` (lock-delay 0), at Consul's default gossip
//!   timing; `Plan::failure_rounds` rounds (each waits out Consul's suspicion, several seconds).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{EventType, LockOptions, WatchOptions};
use serde_json::json;
use tokio::time::{Instant, sleep, sleep_until};
use vigil_client::{Client, SessionRequest};

use super::etcd::connect;
use super::etcd_concurrency::{Counters, Session};
use super::load::{median, percentile};
use super::report::{Better, Outcome, Row, Table, num};
use super::{Plan, System, Systems};
use integration_tests::Http;
use integration_tests::cluster::create_session;

/// Longest one detection may take (`lan` needs about 5 s).
const DETECT_LIMIT: Duration = Duration::from_secs(60);
/// etcd victims' lease TTL; see the module documentation.
const ETCD_TTL: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(10);

/// How the holder's agent fails.
#[derive(Debug, Clone, Copy)]
enum Death {
    /// `kill -9`: its port closes (evidence).
    Kill,
    /// SIGSTOP for good: it owns its socket and answers nothing (suspicion).
    Silent,
}

/// Settle window after a stall ends: past the `lan` suspicion (4 s) and a reconcile.
const SETTLE: Duration = Duration::from_secs(8);

/// Waits until `node`'s `serfHealth` passes, as seen by `server`.
async fn wait_passing(server: &Http, node: &str) -> Result<()> {
    let passing = Instant::now() + DETECT_LIMIT;
    while server.serf_health(node).await.as_deref() != Some("passing") {
        if Instant::now() >= passing {
            bail!("{node}'s serfHealth never passed");
        }
        sleep(POLL).await;
    }
    Ok(())
}

/// Fault → `serfHealth` critical and fault → lock free, per round.
async fn vigil(
    systems: &mut Systems,
    rounds: usize,
    death: Death,
) -> Result<Vec<(Duration, Duration)>> {
    let servers: Vec<usize> = (0..systems.vigil.servers.len()).collect();
    let server = systems.vigil.server(0).http();
    let observer = Client::new(&server.base)?;
    let taker = create_session(&server, r#"{"Name":"taker","LockDelay":"0s"}"#).await;
    let key = "bench/failure-detection";
    let mut results = Vec::new();
    for _ in 0..rounds {
        let c = systems.vigil.add_client(&servers).await;
        let agent = systems.vigil.client(c).http();
        let node = systems.vigil.clients[c].name.clone();
        let victim = create_session(&agent, r#"{"Name":"victim","LockDelay":"0s"}"#).await;
        if !Client::new(&agent.base)?
            .kv_acquire(key, b"held", 0, &victim)
            .await?
            .acquired
        {
            bail!("the victim could not take the lock");
        }
        wait_passing(&server, &node).await?;

        match death {
            Death::Kill => systems.vigil.kill9_client(c).await,
            Death::Silent => systems.vigil.pause_client(c),
        }
        let killed = Instant::now();
        let (mut critical, mut free) = (None, None);
        while critical.is_none() || free.is_none() {
            if killed.elapsed() > DETECT_LIMIT {
                bail!("{node}'s failure not detected within {DETECT_LIMIT:?}");
            }
            if critical.is_none() && server.serf_health(&node).await.as_deref() == Some("critical")
            {
                critical = Some(killed.elapsed());
            }
            if free.is_none()
                && observer
                    .kv_acquire(key, b"taken", 0, &taker)
                    .await?
                    .acquired
            {
                free = Some(killed.elapsed());
            }
            sleep(POLL).await;
        }
        let (critical, free) = (critical.unwrap_or_default(), free.unwrap_or_default());
        eprintln!(
            "  Vigil: {death:?} → critical {:.2} s, lock free {:.2} s",
            critical.as_secs_f64(),
            free.as_secs_f64()
        );
        if let Death::Silent = death {
            systems.vigil.kill9_client(c).await;
        }
        results.push((critical, free));
        if !observer.kv_release(key, b"free", 0, &taker).await? {
            bail!("the taker could not release the lock");
        }
    }
    Ok(results)
}

/// Where the cgroup v1 `cpu` controller is mounted.
const CPU_CGROUP: &str = "/sys/fs/cgroup/cpu";

/// A process held at 1% of one core while this lives, in a `cpu` cgroup of its own beside the
/// one it was in, where it goes back when this is dropped.
struct Starved {
    group: PathBuf,
    home: PathBuf,
    pid: u32,
}

impl Starved {
    fn start(pid: u32) -> Result<Starved> {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let home = cgroups
            .lines()
            .find_map(|line| {
                let mut fields = line.splitn(3, ':');
                let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
                controllers.split(',').any(|c| c == "cpu").then_some(path)
            })
            .context("the process is in no cgroup v1 `cpu` group")?;
        let home = Path::new(CPU_CGROUP).join(home.trim_start_matches('/'));
        let group = home.join(format!("vigil-bench-starved-{pid}"));
        std::fs::create_dir(&group)
            .with_context(|| format!("make the cgroup {} (root?)", group.display()))?;
        let starved = Starved { group, home, pid };
        std::fs::write(starved.group.join("cpu.cfs_period_us"), "100000")?;
        std::fs::write(starved.group.join("cpu.cfs_quota_us"), "1000")?;
        std::fs::write(starved.group.join("cgroup.procs"), pid.to_string())?;
        Ok(starved)
    }
}

impl Drop for Starved {
    fn drop(&mut self) {
        // Best effort: a process that exited meanwhile has left the group already.
        let _ = std::fs::write(self.home.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.group);
    }
}

/// What the stall rounds found.
struct Stalls {
    false_invalidations: usize,
    /// Why the CPU starvation was skipped, when it was.
    starvation_skipped: Option<String>,
}

/// False invalidations over `rounds` rounds of stalls (see the module documentation).
async fn vigil_stalls(systems: &mut Systems, rounds: usize) -> Result<Stalls> {
    let servers = systems.vigil.running_servers();
    let holder = systems.vigil.add_client(&servers).await;
    let other = systems.vigil.add_client(&servers).await;
    let leader = systems.vigil.leader().await;
    let server = systems.vigil.server(leader).http();
    let key = "bench/stalls";
    let mut false_invalidations = 0;
    let mut starvation_skipped = None;
    for round in 0..rounds {
        // A node whose serfHealth is critical (the other agent, after its 5 s stop) takes no
        // new session until it is back.
        for c in [holder, other] {
            wait_passing(&server, &systems.vigil.clients[c].name).await?;
        }
        let holding = create_session(
            &systems.vigil.client(holder).http(),
            r#"{"Name":"holder","LockDelay":"0s"}"#,
        )
        .await;
        let bystander = create_session(
            &systems.vigil.client(other).http(),
            r#"{"Name":"bystander","LockDelay":"0s"}"#,
        )
        .await;
        let agent = Client::new(&systems.vigil.client(holder).http().base)?;
        if !agent.kv_acquire(key, b"held", 0, &holding).await?.acquired {
            bail!("the holder could not take the lock");
        }
        let alive = |id: String| {
            let server = server.clone();
            async move {
                let reply = server.get(&format!("/v1/session/info/{id}")).await;
                reply.json().as_array().is_some_and(|a| !a.is_empty())
            }
        };
        // The holder's agent stopped 2 s: nobody may lose a session.
        systems.vigil.pause_client(holder);
        sleep(Duration::from_secs(2)).await;
        systems.vigil.resume_client(holder);
        sleep(SETTLE).await;
        let mut lost = usize::from(!alive(holding.clone()).await);
        lost += usize::from(!alive(bystander.clone()).await);
        // Another agent stopped 5 s: its own session may go, the holder's must not.
        systems.vigil.pause_client(other);
        sleep(Duration::from_secs(5)).await;
        systems.vigil.resume_client(other);
        sleep(SETTLE).await;
        lost += usize::from(!alive(holding.clone()).await);
        // The other agent starved of CPU 5 s: the same, for a stall that is not a stop.
        let pid = systems
            .vigil
            .client(other)
            .pid()
            .context("the other agent's PID")?;
        match Starved::start(pid) {
            Ok(starved) => {
                sleep(Duration::from_secs(5)).await;
                drop(starved);
                sleep(SETTLE).await;
                lost += usize::from(!alive(holding.clone()).await);
            }
            Err(e) => {
                let why = format!("{e:#}");
                if starvation_skipped.is_none() {
                    eprintln!("  Vigil: stalls: no CPU starvation: {why}");
                }
                starvation_skipped = Some(why);
            }
        }
        // A follower server stopped 4 s: nobody may lose a session that was still there.
        let bystander_before = alive(bystander.clone()).await;
        let follower = servers
            .iter()
            .copied()
            .find(|&i| i != leader)
            .context("a follower")?;
        systems.vigil.pause(follower);
        sleep(Duration::from_secs(4)).await;
        systems.vigil.resume(follower);
        sleep(SETTLE).await;
        lost += usize::from(!alive(holding.clone()).await);
        lost += usize::from(bystander_before && !alive(bystander.clone()).await);
        eprintln!("  Vigil: stalls, round {round}: {lost} false invalidations");
        false_invalidations += lost;
        for id in [&holding, &bystander] {
            server.put(&format!("/v1/session/destroy/{id}"), "").await;
        }
    }
    systems.vigil.kill9_client(holder).await;
    systems.vigil.kill9_client(other).await;
    Ok(Stalls {
        false_invalidations,
        starvation_skipped,
    })
}

/// Beside the kill row's Consul figure.
const CONSUL_NOTE: &str = "Consul: a client agent holding the lock with a session bound to its \
    serfHealth (lock-delay 0) is killed with kill -9, and a server's client polls with \
    ?acquire until it gets the lock; Consul's servers notice through gossip at its defaults (a \
    1 s probe interval, then a suspicion of at least 4 s) and invalidate the session. Its \
    figure is the median of the rounds of the silent row, not of the kill rounds: each takes \
    Consul's suspicion.";

/// Consul's kill → lock free, per round (`None` without a Consul cluster).
async fn consul(systems: &mut Systems, rounds: usize) -> Result<Option<Vec<Duration>>> {
    let Some(consul) = systems.consul.as_mut() else {
        return Ok(None);
    };
    let (server, _) = consul.leader().await?;
    let observer = Client::new(&server)?;
    let session = |name: &str| SessionRequest {
        name: name.to_owned(),
        lock_delay: Some(Duration::ZERO),
        ..SessionRequest::default()
    };
    let taker = observer.session_create(&session("taker")).await?;
    let key = "bench/failure-detection";
    let mut results = Vec::new();
    for _ in 0..rounds {
        let (http, _) = consul.add_client().await?;
        let agent = Client::new(&http)?;
        let victim = agent.session_create(&session("victim")).await?;
        if !agent.kv_acquire(key, b"held", 0, &victim).await?.acquired {
            bail!("the Consul victim could not take the lock");
        }
        consul.kill9_client(&http).await?;
        let killed = Instant::now();
        while !observer
            .kv_acquire(key, b"taken", 0, &taker)
            .await?
            .acquired
        {
            if killed.elapsed() > DETECT_LIMIT {
                bail!("Consul did not free the lock within {DETECT_LIMIT:?}");
            }
            sleep(POLL).await;
        }
        let free = killed.elapsed();
        eprintln!("  Consul: kill → lock free {:.2} s", free.as_secs_f64());
        results.push(free);
        if !observer.kv_release(key, b"free", 0, &taker).await? {
            bail!("the taker could not release the Consul lock");
        }
    }
    observer.session_destroy(&taker).await?;
    Ok(Some(results))
}

/// Kill → lock free, per victim.
async fn etcd(endpoint: &str, victims: usize) -> Result<Vec<Duration>> {
    let counters = Arc::new(Counters::default());
    let observer = connect(&[endpoint.to_owned()]).await?;
    let mut prepared = Vec::new();
    for i in 0..victims {
        let mut client = connect(&[endpoint.to_owned()]).await?;
        let session = Session::new(&client, ETCD_TTL, &counters).await?;
        let options = LockOptions::new().with_lease(session.lease());
        let key = client
            .lock(format!("bench/failure/{i}"), Some(options))
            .await?
            .key()
            .to_vec();
        let mut watch = observer
            .clone()
            .watch(key, Some(WatchOptions::new()))
            .await?;
        let created = watch.message().await?.context("watch stream ended")?;
        if !created.created() {
            bail!("expected the watch-created answer first");
        }
        prepared.push((client, session, watch));
    }
    let start = Instant::now();
    let period = ETCD_TTL / 3;
    let tasks: Vec<_> = prepared
        .into_iter()
        .enumerate()
        .map(|(i, (client, session, mut watch))| {
            let dies_at = start + period.mul_f64(i as f64 / victims as f64);
            tokio::spawn(async move {
                sleep_until(dies_at).await;
                drop((session, client));
                let killed = Instant::now();
                while let Some(resp) = tokio::time::timeout(DETECT_LIMIT, watch.message()).await?? {
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(killed.elapsed());
                    }
                }
                bail!("watch ended before the lock was freed")
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        let free: Duration = task.await??;
        eprintln!(
            "  etcd: client gone → lock free {:.2} s",
            free.as_secs_f64()
        );
        results.push(free);
    }
    Ok(results)
}

pub async fn workload(systems: &mut Systems, plan: &Plan) -> Result<Outcome> {
    let (rounds, kills) = (plan.failure_rounds, plan.kill_rounds);
    // etcd's and Consul's rounds before or after Vigil's, in this repetition's order.
    let etcd_first = System::Etcd.turn() < System::Vigil.turn();
    let consul_first = System::Consul.turn() < System::Vigil.turn();
    let mut c = if consul_first {
        consul(systems, rounds).await?
    } else {
        None
    };
    let leaders = systems.leaders().await?;
    let mut e = if etcd_first {
        etcd(&leaders.etcd_endpoint, kills).await?
    } else {
        Vec::new()
    };
    let v = vigil(systems, kills, Death::Kill).await?;
    let silent = vigil(systems, rounds, Death::Silent).await?;
    let Stalls {
        false_invalidations: stalls,
        starvation_skipped,
    } = vigil_stalls(systems, rounds).await?;
    if !etcd_first {
        let leaders = systems.leaders().await?;
        e = etcd(&leaders.etcd_endpoint, kills).await?;
    }
    if !consul_first {
        c = consul(systems, rounds).await?;
    }
    let c_free = c.as_ref().map(|c| median(c.clone()).as_secs_f64());
    let secs = |d: &Duration| d.as_secs_f64();
    let v_critical: Vec<Duration> = v.iter().map(|r| r.0).collect();
    let v_free: Vec<Duration> = v.iter().map(|r| r.1).collect();
    let silent_free: Vec<Duration> = silent.iter().map(|r| r.1).collect();
    let details = json!({
        "rounds": rounds,
        "kill_rounds": kills,
        "vigil_kill_to_critical_s": v_critical.iter().map(secs).collect::<Vec<_>>(),
        "vigil_kill_to_free_s": v_free.iter().map(secs).collect::<Vec<_>>(),
        "vigil_silent_to_free_s": silent_free.iter().map(secs).collect::<Vec<_>>(),
        "vigil_false_invalidations": stalls,
        "vigil_starvation_skipped": starvation_skipped,
        "etcd_lease_ttl_s": ETCD_TTL.as_secs(),
        "etcd_kill_to_free_s": e.iter().map(secs).collect::<Vec<_>>(),
        "consul_kill_to_free_s": c.as_ref().map(|c| c.iter().map(secs).collect::<Vec<_>>()),
    });
    let critical = secs(&median(v_critical));
    let tail = |p| {
        (
            secs(&percentile(v_free.clone(), p)),
            secs(&percentile(e.clone(), p)),
        )
    };
    let ((v_p90, e_p90), (v_max, e_max)) = (tail(90), tail(100));
    let (v_free, e_free) = (secs(&median(v_free)), secs(&median(e)));
    let silent_free = secs(&median(silent_free));
    let rows = vec![
        Row::new(
            "failure.lock_free",
            format!("Failure detection: holder killed, median of {kills}"),
            "kill → lock free (s)",
            Better::Lower,
            Some(v_free),
            Some(e_free),
        )
        .with_consul(c_free)
        .with_note(CONSUL_NOTE),
        Row::new(
            "failure.lock_free.p90",
            format!("Failure detection: holder killed, p90 of {kills}"),
            "kill → lock free (s)",
            Better::Lower,
            Some(v_p90),
            Some(e_p90),
        ),
        Row::new(
            "failure.lock_free.max",
            format!("Failure detection: holder killed, slowest of {kills}"),
            "kill → lock free (s)",
            Better::Lower,
            Some(v_max),
            Some(e_max),
        ),
        // etcd cannot tell a stopped client from a dead one: the same lease expiry frees both.
        Row::new(
            "failure.silent_lock_free",
            format!("Failure detection: holder silent for good, median of {rounds}"),
            "stop → lock free (s)",
            Better::Lower,
            Some(silent_free),
            Some(e_free),
        ),
        Row::vigil_only(
            "failure.false_invalidations",
            match &starvation_skipped {
                None => format!(
                    "Failure detection: stalls (2 s stop of the holder, 5 s stop and 5 s CPU \
                     starvation of another agent, 4 s stop of a server) × {rounds}"
                ),
                Some(why) => format!(
                    "Failure detection: stalls (2 s stop of the holder, 5 s stop of another \
                     agent, 4 s stop of a server; CPU starvation skipped: {why}) × {rounds}"
                ),
            },
            "sessions lost though alive",
            Better::Lower,
            Some(stalls as f64),
        ),
    ];
    let mut table = Table {
        title: format!("Failure detection (median of {rounds}; kills: of {kills})"),
        header: [
            "system",
            "how a dead holder is noticed",
            "kill → node critical (s)",
            "kill → lock free (s)",
            "stopped for good → lock free (s)",
            "sessions lost to stalls",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows: vec![
            vec![
                "Vigil".to_owned(),
                "gossip (`lan` profile): serfHealth critical, the node's sessions invalidated"
                    .to_owned(),
                num(critical),
                num(v_free),
                num(silent_free),
                stalls.to_string(),
            ],
            vec![
                "etcd".to_owned(),
                format!(
                    "lease expiry ({} s TTL, renewed every TTL/3)",
                    ETCD_TTL.as_secs()
                ),
                "—".to_owned(),
                num(e_free),
                format!("{} (the same expiry)", num(e_free)),
                "— (a 3 s lease outlives a 2 s stop by construction)".to_owned(),
            ],
        ],
    };
    if let Some(free) = c_free {
        table.rows.push(vec![
            "Consul".to_owned(),
            "gossip (defaults): serfHealth critical, the node's sessions invalidated".to_owned(),
            "—".to_owned(),
            num(free),
            "—".to_owned(),
            "—".to_owned(),
        ]);
    }
    Ok(Outcome {
        rows,
        tables: vec![table],
        details,
        usage: Vec::new(),
    })
}
