//! One run: a seed's cluster, clients and faults on a current-thread tokio runtime with paused
//! time, then the checks. Everything random (message delays and losses, sync latencies, the
//! fault schedule, the clients' choices, raft's election timeouts) is drawn from the seed, and
//! every server's wall clock follows tokio's, so a seed replays the same run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng as _;
use tokio::time::Instant;
use vigil_shared::rpc::Op;
use vigil_shared::rpc::calls::ServerNode;

use crate::gateway::Call;
use crate::workload::{Client, History, REGISTERS, TTL};
use crate::world::{Party, Plant, Stream, World};

/// The wall clock every simulated server starts at (ms since the Unix epoch).
const EPOCH_MS: u64 = 1_800_000_000_000;

/// What a run simulates.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    pub plant: Plant,
    pub servers: usize,
    pub clients: usize,
    /// How long clients work and faults strike (simulated time); then the faults heal.
    pub duration: Duration,
}

impl Config {
    pub fn new(seed: u64) -> Config {
        Config {
            seed,
            plant: Plant::None,
            servers: 3,
            clients: 3,
            duration: Duration::from_secs(20),
        }
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    /// The digest of the run's trace: equal for every run of one seed.
    pub digest: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
}

/// Runs `config` to the end, on this thread.
pub fn run(config: Config) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(async {
        vigil_server::proposer::follow_tokio_clock(Some(EPOCH_MS));
        simulate(config).await
    });
    drop(runtime);
    vigil_server::proposer::follow_tokio_clock(None);
    report
}

/// [`run`], with a run that panics (a server's raft asserting an invariant the run broke, say)
/// reported as a violation that quotes the panic.
pub fn run_catching(config: Config) -> Report {
    std::panic::catch_unwind(|| run(config)).unwrap_or_else(|panic| {
        vigil_server::proposer::follow_tokio_clock(None);
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Report {
            seed: config.seed,
            digest: 0,
            violations: vec![format!("the run panicked: {message}")],
            trace: Vec::new(),
        }
    })
}

async fn simulate(config: Config) -> Report {
    let world = World::new(config.seed, config.plant, config.servers);
    for id in world.servers.clone() {
        world.start(id).await;
    }
    let members: BTreeMap<_, _> = world
        .servers
        .iter()
        .map(|id| {
            let node = ServerNode {
                name: format!("server-{id}"),
                rpc_addr: format!("sim:{id}"),
            };
            (*id, node)
        })
        .collect();
    if let Some(first) = world.node(world.servers[0]) {
        first
            .raft
            .initialize(members)
            .await
            .expect("a fresh server initializes");
    }
    // Every server runs this build and there is no gossip to tell the leader so: raise the
    // protocol level as the leader would.
    let history = Arc::new(Mutex::new(History::default()));
    let mut setup = Client::new(config.clients, Arc::clone(&world), Arc::clone(&history));
    setup_protocol(&world, config.clients).await;

    let base_loss = world.draw(Stream::Nemesis, |rng| rng.gen_range(0..4));
    world.set_loss(base_loss);
    world.note(format!("base loss {base_loss}%"));
    let until = Instant::now() + config.duration;
    let clients: Vec<_> = (0..config.clients)
        .map(|i| {
            let client = Client::new(i, Arc::clone(&world), Arc::clone(&history));
            tokio::spawn(client.run(until))
        })
        .collect();
    nemesis(&world, until, base_loss).await;
    for client in clients {
        let _ = client.await;
    }
    heal(&world).await;
    // Let the cluster settle, then read every register once more: an acknowledged write that
    // was lost shows as a read no order explains.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for key in REGISTERS {
        setup.read(key).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for what in crate::check::sessions_agree(&world, &history.lock()) {
        world.violation(what);
    }
    // No client renews a session any more: every one must lapse within TTL × 2 of its last
    // renewal, or of the term of the leader elected after the heal.
    tokio::time::sleep(2 * TTL + Duration::from_secs(4)).await;
    for id in world.servers.clone() {
        world.crash(id).await;
    }
    let violations = {
        let history = history.lock();
        let mut violations = world.violations();
        violations.extend(crate::check::check(&world, &history, Instant::now()));
        violations
    };
    for v in &violations {
        world.note(format!("VIOLATION {v}"));
    }
    Report {
        seed: config.seed,
        digest: world.digest(),
        violations,
        trace: world.trace(),
    }
}

async fn setup_protocol(world: &Arc<World>, client: usize) {
    let op = Op::SetProtocol {
        level: vigil_shared::PROTOCOL,
    };
    loop {
        let at = world.servers[0];
        if world
            .request(
                client,
                at,
                Call::Write(Box::new(op.clone())),
                &crate::gateway::Legs::default(),
            )
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Strikes faults drawn from the seed, one at a time, until `until`.
async fn nemesis(world: &Arc<World>, until: Instant, base_loss: u32) {
    let ms = |lo: u64, hi: u64| {
        Duration::from_micros(
            world.draw(Stream::Nemesis, |rng| rng.gen_range(lo * 1000..hi * 1000)),
        )
    };
    while Instant::now() < until {
        tokio::time::sleep(ms(200, 2_000)).await;
        let (server, fault) = world.draw(Stream::Nemesis, |rng| {
            let server = world.servers[rng.gen_range(0..world.servers.len())];
            (server, rng.gen_range(0..100))
        });
        match fault {
            0..30 => {
                world.note(format!(
                    "fault: server {server} cut off from the other servers"
                ));
                for other in world.servers.iter().filter(|s| **s != server) {
                    world.cut(Party::Server(server), Party::Server(*other));
                }
                tokio::time::sleep(ms(300, 5_000)).await;
                world.heal();
                world.note("fault healed: partition".to_owned());
            }
            30..40 => {
                let (a, b) = world.draw(Stream::Nemesis, |rng| {
                    let n = world.servers.len();
                    let a = rng.gen_range(0..n);
                    (world.servers[a], world.servers[(a + 1) % n])
                });
                world.note(format!(
                    "fault: servers {a} and {b} cannot reach each other"
                ));
                world.cut(Party::Server(a), Party::Server(b));
                tokio::time::sleep(ms(300, 4_000)).await;
                world.heal();
                world.note("fault healed: partial partition".to_owned());
            }
            40..65 => {
                world.crash(server).await;
                tokio::time::sleep(ms(50, 4_000)).await;
                world.start(server).await;
            }
            65..78 => {
                let loss = world.draw(Stream::Nemesis, |rng| rng.gen_range(10..50));
                world.note(format!("fault: {loss}% of messages lost"));
                world.set_loss(loss);
                tokio::time::sleep(ms(500, 4_000)).await;
                world.set_loss(base_loss);
                world.note("fault healed: loss".to_owned());
            }
            88..92 => {
                world.note("fault: power loss, every server crashes".to_owned());
                for id in world.servers.clone() {
                    world.crash(id).await;
                }
                tokio::time::sleep(ms(50, 2_000)).await;
                for id in world.servers.clone() {
                    world.start(id).await;
                }
            }
            78..88 => {
                world.note(format!("fault: server {server}'s disk is full"));
                world.disks[&server].lock().set_full(true);
                tokio::time::sleep(ms(200, 3_000)).await;
                world.disks[&server].lock().set_full(false);
                world.note(format!("fault healed: server {server}'s disk has room"));
                if world.failed(server) {
                    world.crash(server).await;
                    world.start(server).await;
                }
            }
            _ => {}
        }
    }
}

/// Ends every fault: the network whole and lossless, every server up with room on its disk.
async fn heal(world: &Arc<World>) {
    world.heal();
    world.set_loss(0);
    for id in world.servers.clone() {
        world.disks[&id].lock().set_full(false);
        if world.failed(id) {
            world.crash(id).await;
        }
        if world.node(id).is_none() {
            world.start(id).await;
        }
    }
    world.note("all faults healed".to_owned());
}
