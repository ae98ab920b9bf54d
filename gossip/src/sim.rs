//! Deterministic in-process simulation of a whole gossip cluster
//! (docs/architecture.md#the-gossip-simulator): a hundred [`GossipNode`]s (the production sans-IO
//! node, with its re-announce and leave logic) in a `Vec`, a virtual clock, one min-heap of timers,
//! ticks and packets ordered by `(due, seq)` with a global sequence number as tie-breaker, seeded
//! RNGs, and switches to crash, restart, pause (SIGSTOP) and partition members. Packets are sealed
//! and opened by the nodes as on the wire, so a cluster with a keyring can rotate keys here. Same
//! seed, same trace.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use foca::OwnedNotification;
use rand_foca::rngs::StdRng;
use rand_foca::{RngExt as _, SeedableRng as _};
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};

use super::crypto::Keyring;
use super::identity::Member;
use super::keyring::{KeyOp, KeyResponse};
use super::node::{GossipNode, NodeTimer, Output};
use super::profile::TimingProfile;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Gossip address of simulated node `i`.
fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250 + 1) as u8], 8301))
}

fn identity(i: usize, generation: u64) -> Member {
    Member {
        name: format!("node-{i:03}").into(),
        addr: addr(i),
        rpc_addr: SocketAddr::new(addr(i).ip(), 8300),
        role: if i < 3 {
            MemberRole::Server
        } else {
            MemberRole::Client
        },
        datacenter: Arc::from("dc1"),
        generation,
        protocol: 2,
    }
}

enum Kind {
    Timer(NodeTimer),
    /// A sealed packet and the address it was sent from.
    Packet(Vec<u8>, SocketAddr),
    Tick,
    /// The kernel refused a packet this node sent to that address (port unreachable).
    Refused(SocketAddr),
}

struct Event {
    due: Duration,
    seq: u64,
    node: usize,
    /// The node's incarnation in the simulation when scheduled; a crash or restart bumps it,
    /// which voids everything scheduled before.
    life: u32,
    /// Boxed: heap sifts move events around, and a timer carries whole identities.
    kind: Box<Kind>,
}

// Min-heap on (due, seq): BinaryHeap is a max-heap, so the order is reversed.
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Event {}

struct SimNode {
    node: GossipNode,
    up: bool,
    life: u32,
    /// SIGSTOPped until then: its events wait, in order, and fire together on resume.
    paused_until: Option<Duration>,
    /// Killed on a live host (see [`Sim::kill`]): its port is closed, so packets to it are
    /// refused instead of lost.
    port_closed: bool,
    /// A firewall rejects every packet sent to it (see [`Sim::reject_inbound`]).
    rejecting: bool,
    /// A graceful leave stops the node at this time at the latest.
    leave_deadline: Option<Duration>,
}

/// One line of the trace: when, which node, what foca told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceLine {
    at: Duration,
    node: usize,
    what: String,
}

pub struct Sim {
    now: Duration,
    seq: u64,
    profile: TimingProfile,
    seed: u64,
    /// Network latency jitter.
    rng: StdRng,
    nodes: Vec<SimNode>,
    by_addr: HashMap<SocketAddr, usize>,
    heap: BinaryHeap<Event>,
    /// Partition side of each node; packets only flow within a side.
    sides: Option<Vec<u8>>,
    trace: Vec<TraceLine>,
    pub packets: u64,
    /// The keyring nodes boot with (`None`: clear text).
    boot_keyring: Option<Keyring>,
    /// Keyring queries that are over: (asking node, query ID, result).
    key_results: Vec<(usize, u64, KeyResponse)>,
}

impl Sim {
    /// `n` nodes that all join node 0, booting within the first tick.
    pub fn new(n: usize, profile: TimingProfile, seed: u64) -> Sim {
        Sim::with_keyring(n, profile, seed, None)
    }

    /// [`Sim::new`], every node booting with `keyring`.
    pub fn with_keyring(
        n: usize,
        profile: TimingProfile,
        seed: u64,
        keyring: Option<Keyring>,
    ) -> Sim {
        let mut sim = Sim {
            now: Duration::ZERO,
            seq: 0,
            profile,
            seed,
            rng: StdRng::seed_from_u64(seed),
            nodes: Vec::with_capacity(n),
            by_addr: HashMap::new(),
            heap: BinaryHeap::new(),
            sides: None,
            trace: Vec::new(),
            packets: 0,
            boot_keyring: keyring,
            key_results: Vec::new(),
        };
        for i in 0..n {
            let offset = sim.jitter(profile.tick_interval());
            sim.launch(identity(i, 1), offset);
        }
        sim
    }

    /// Boots a new node as `id` at the next address, its first tick at `first_tick`; returns
    /// its index.
    fn launch(&mut self, id: Member, first_tick: Duration) -> usize {
        let i = self.nodes.len();
        self.by_addr.insert(addr(i), i);
        let node = self.boot_as(i, id);
        self.nodes.push(SimNode {
            node,
            up: true,
            life: 0,
            paused_until: None,
            port_closed: false,
            rejecting: false,
            leave_deadline: None,
        });
        self.push(first_tick, i, Kind::Tick);
        i
    }

    fn boot(&self, i: usize, generation: u64) -> GossipNode {
        self.boot_as(i, identity(i, generation))
    }

    fn boot_as(&self, i: usize, id: Member) -> GossipNode {
        let rng = StdRng::seed_from_u64(self.seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
        GossipNode::new(id, &[addr(0)], self.profile, rng)
            .with_keyring(self.boot_keyring.clone(), None)
    }

    /// Nodes booted from now on get `keyring`.
    pub fn set_boot_keyring(&mut self, keyring: Option<Keyring>) {
        self.boot_keyring = keyring;
    }

    /// Starts a new member (a new name and address) joining node 0; returns its index.
    pub fn add_node(&mut self) -> usize {
        self.launch(identity(self.nodes.len(), 1), self.now)
    }

    /// Node `by` asks the cluster for a keyring operation; runs until the answers are in.
    pub fn key_query(&mut self, by: usize, op: KeyOp) -> KeyResponse {
        let (id, out) = self.nodes[by]
            .node
            .key_query(op, self.now)
            .expect("a running node asks");
        self.apply(by, out);
        let step = ms(10);
        let limit = self.profile.key_query_timeout() + step;
        let over = |s: &Sim| s.key_results.iter().any(|r| (r.0, r.1) == (by, id));
        self.wait_for(limit, step, over)
            .expect("every query ends by its timeout");
        let at = self
            .key_results
            .iter()
            .position(|r| (r.0, r.1) == (by, id))
            .expect("the query's result");
        self.key_results.remove(at).2
    }

    /// Starts a new node at a new address under node `of`'s name (a later start: a higher
    /// generation), joining node 0 like everyone; returns its index. With `of` still running it
    /// is an impostor; with `of` crashed, a restart of `of` elsewhere.
    pub fn start_as(&mut self, of: usize) -> usize {
        let i = self.nodes.len();
        let real = self.nodes[of].node.identity();
        let id = Member {
            name: real.name.clone(),
            generation: real.generation + 1_000,
            ..identity(i, 0)
        };
        self.launch(id, self.now)
    }

    /// Node `i`'s member list, as its agent would report it.
    pub fn members(&self, i: usize) -> Vec<MemberStatus> {
        self.nodes[i].node.members()
    }

    fn jitter(&mut self, below: Duration) -> Duration {
        let micros = u64::try_from(below.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(self.rng.random_range(0..micros))
    }

    fn push(&mut self, due: Duration, node: usize, kind: Kind) {
        self.seq += 1;
        let life = self.nodes.get(node).map_or(0, |n| n.life);
        self.heap.push(Event {
            due,
            seq: self.seq,
            node,
            life,
            kind: Box::new(kind),
        });
    }

    fn connected(&self, a: usize, b: usize) -> bool {
        self.sides.as_ref().is_none_or(|s| s[a] == s[b])
    }

    fn apply(&mut self, from: usize, out: Output) {
        for n in &out.notifications {
            let what = match n {
                OwnedNotification::MemberUp(m) => format!("up {} g{}", m.name, m.generation),
                OwnedNotification::MemberDown(m) => format!("down {} g{}", m.name, m.generation),
                OwnedNotification::Rename(a, b) => {
                    format!("rename {} g{}->g{}", a.name, a.generation, b.generation)
                }
                other => format!("{other:?}"),
            };
            self.trace.push(TraceLine {
                at: self.now,
                node: from,
                what,
            });
        }
        for (after, timer) in out.timers {
            self.push(self.now + after, from, Kind::Timer(timer));
        }
        for (id, response) in out.key_results {
            self.key_results.push((from, id, response));
        }
        for (to, data) in out.sends {
            let Some(&dst) = self.by_addr.get(&to) else {
                continue;
            };
            if !self.connected(from, dst) {
                continue;
            }
            // LAN-ish one-way latency: 0.5 ms plus up to 1.5 ms of jitter.
            let latency = ms(0) + Duration::from_micros(500) + self.jitter(ms(1) + ms(1) / 2);
            if self.nodes[dst].port_closed || self.nodes[dst].rejecting {
                // The ICMP port unreachable comes back over the same link.
                self.push(self.now + latency * 2, from, Kind::Refused(to));
                continue;
            }
            let sealed = self.nodes[from].node.seal(&data);
            self.push(self.now + latency, dst, Kind::Packet(sealed, addr(from)));
        }
    }

    /// Runs the next event; false when there is none.
    fn step(&mut self) -> bool {
        let Some(event) = self.heap.pop() else {
            return false;
        };
        self.now = event.due;
        let i = event.node;
        let slot = &self.nodes[i];
        if !slot.up || slot.life != event.life {
            return true;
        }
        if let Some(until) = slot.paused_until {
            if until > self.now {
                self.push(until, i, *event.kind);
                return true;
            }
            self.nodes[i].paused_until = None;
        }
        let now = self.now;
        let out = match *event.kind {
            Kind::Timer(timer) => self.nodes[i].node.handle_timer(timer, now),
            Kind::Packet(data, source) => {
                self.packets += 1;
                // A packet that does not open is dropped (and counted by the node).
                self.nodes[i]
                    .node
                    .handle_packet(&data, source, now)
                    .unwrap_or_default()
            }
            Kind::Refused(to) => self.nodes[i].node.refused(to, now),
            Kind::Tick => {
                let next = now + self.profile.tick_interval();
                self.push(next, i, Kind::Tick);
                let slot = &mut self.nodes[i];
                if slot.node.has_left() {
                    let out = slot.node.linger(now);
                    if slot.node.leave_sent() || slot.leave_deadline.is_some_and(|d| now >= d) {
                        slot.up = false;
                    }
                    out
                } else {
                    slot.node.tick(now)
                }
            }
        };
        self.apply(i, out);
        true
    }

    pub fn run_until(&mut self, until: Duration) {
        while self.heap.peek().is_some_and(|e| e.due <= until) {
            self.step();
        }
        self.now = self.now.max(until);
    }

    pub fn run_for(&mut self, d: Duration) {
        self.run_until(self.now + d);
    }

    /// Runs until `cond` holds (checked every `every`) and returns how long it took, or None
    /// after `limit`.
    pub fn wait_for(
        &mut self,
        limit: Duration,
        every: Duration,
        cond: impl Fn(&Sim) -> bool,
    ) -> Option<Duration> {
        let start = self.now;
        loop {
            if cond(self) {
                return Some(self.now - start);
            }
            if self.now - start >= limit {
                return None;
            }
            self.run_for(every);
        }
    }

    pub fn now(&self) -> Duration {
        self.now
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    fn up(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].up)
    }

    /// How node `i` sees node `j`.
    pub fn view(&self, i: usize, j: usize) -> Option<MemberState> {
        self.nodes[i].node.state_of(&addr(j))
    }

    /// Every running node sees every other running node Alive.
    pub fn converged(&self) -> bool {
        let up: Vec<usize> = self.up().collect();
        let all_counted = up
            .iter()
            .all(|&i| self.nodes[i].node.live_count() == up.len() - 1);
        all_counted
            && up.iter().all(|&i| {
                up.iter()
                    .all(|&j| i == j || self.view(i, j) == Some(MemberState::Alive))
            })
    }

    /// Every running node sees the running members of its own side Alive and those of the other
    /// side Failed.
    pub fn split_seen(&self) -> bool {
        let Some(sides) = &self.sides else {
            return false;
        };
        let up: Vec<usize> = self.up().collect();
        let side_len = |s: u8| up.iter().filter(|&&j| sides[j] == s).count();
        // Cheap first: the live counts must already match.
        up.iter()
            .all(|&i| self.nodes[i].node.live_count() == side_len(sides[i]) - 1)
            && up.iter().all(|&i| {
                up.iter().all(|&j| {
                    let expected = if sides[i] == sides[j] {
                        MemberState::Alive
                    } else {
                        MemberState::Failed
                    };
                    i == j || self.view(i, j) == Some(expected)
                })
            })
    }

    /// Every running node other than `j` sees `j` in `state`.
    pub fn all_see(&self, j: usize, state: MemberState) -> bool {
        self.up().all(|i| i == j || self.view(i, j) == Some(state))
    }

    /// Node `i` goes silent (its host died, or it is cut off): packets to it are lost, so only
    /// the failure detector's timeouts find it.
    pub fn crash(&mut self, i: usize) {
        let slot = &mut self.nodes[i];
        slot.up = false;
        slot.life += 1;
    }

    /// `kill -9` of node `i` on a live host: like a crash, and its port is closed, so packets
    /// to it are refused (evidence of death) until it restarts.
    pub fn kill(&mut self, i: usize) {
        self.crash(i);
        self.nodes[i].port_closed = true;
    }

    /// A firewall in front of node `i` starts rejecting (or, with `false`, lets through) every
    /// packet sent to it, while the node runs on and its own packets go out: the others see
    /// the refusals of a dead process, and node `i` hears nothing at all (no ack, no
    /// refutation).
    pub fn reject_inbound(&mut self, i: usize, rejecting: bool) {
        self.nodes[i].rejecting = rejecting;
    }

    /// Node `by` hears that a packet to node `of` was refused, whatever the truth (a stray
    /// ICMP, or a late one for an address a new process now owns).
    pub fn inject_refusal(&mut self, by: usize, of: usize) {
        let out = self.nodes[by].node.refused(addr(of), self.now);
        self.apply(by, out);
    }

    /// Restarts a crashed node on the same address with a newer generation.
    pub fn restart(&mut self, i: usize) {
        let generation = self.nodes[i].node.identity().generation + 1_000;
        let node = self.boot(i, generation);
        let slot = &mut self.nodes[i];
        slot.node = node;
        slot.up = true;
        slot.life += 1;
        slot.paused_until = None;
        slot.port_closed = false;
        self.push(self.now, i, Kind::Tick);
    }

    pub fn pause(&mut self, i: usize, d: Duration) {
        self.nodes[i].paused_until = Some(self.now + d);
    }

    pub fn leave(&mut self, i: usize) {
        let out = self.nodes[i].node.leave(self.now);
        self.nodes[i].leave_deadline = Some(self.now + self.profile.leave_linger());
        self.apply(i, out);
    }

    pub fn force_leave(&mut self, by: usize, name: &str, prune: bool) {
        let out = self.nodes[by]
            .node
            .force_leave(name, prune, self.now)
            .expect("force-leave accepted");
        self.apply(by, out);
    }

    pub fn partition(&mut self, sides: Vec<u8>) {
        self.sides = Some(sides);
    }

    pub fn heal(&mut self) {
        self.sides = None;
    }

    pub fn trace(&self) -> &[TraceLine] {
        &self.trace
    }

    /// Whether any node ever declared `name` down.
    pub fn ever_down(&self, name: &str) -> bool {
        let needle = format!("down {name} ");
        self.trace.iter().any(|l| l.what.starts_with(&needle))
    }

    /// The nodes that ever declared `name` down.
    pub fn declared_down_by(&self, name: &str) -> BTreeSet<usize> {
        let needle = format!("down {name} ");
        self.trace
            .iter()
            .filter(|l| l.what.starts_with(&needle))
            .map(|l| l.node)
            .collect()
    }

    /// Node `i`'s incarnation, as its last packet carried it.
    pub fn incarnation(&self, i: usize) -> u16 {
        self.nodes[i].node.incarnation()
    }

    /// Node `i`'s identity generation (it grows when the node renews its identity).
    pub fn generation(&self, i: usize) -> u64 {
        self.nodes[i].node.identity().generation
    }

    pub fn name(&self, i: usize) -> String {
        self.nodes[i].node.identity().name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const N: usize = 100;
    const SEED: u64 = 0x5EED;
    const CHECK: Duration = Duration::from_millis(100);

    /// `n` members, run until every one sees every other Alive; with the virtual time it took.
    /// Every member declared down, and every identity renewal a suspicion forced, so far: what
    /// a stall that is not a death must not cause.
    fn disturbances(sim: &Sim) -> Vec<&TraceLine> {
        sim.trace()
            .iter()
            .filter(|l| l.what.starts_with("down") || l.what.starts_with("Rejoin"))
            .collect()
    }

    fn converged_cluster(n: usize, profile: TimingProfile, seed: u64) -> (Sim, Duration) {
        let mut sim = Sim::new(n, profile, seed);
        let took = sim
            .wait_for(secs(30), CHECK, Sim::converged)
            .unwrap_or_else(|| panic!("{n} members converge"));
        (sim, took)
    }

    #[test]
    fn hundred_members_converge() {
        let wall = Instant::now();
        let (sim, took) = converged_cluster(N, TimingProfile::Local, SEED);
        eprintln!(
            "sim: {N} members converged in {took:?} virtual ({} packets, {:?} wall)",
            sim.packets,
            wall.elapsed()
        );
        assert!(took < secs(10), "converged in {took:?}");
        assert!(sim.trace().iter().all(|l| !l.what.starts_with("down")));
    }

    #[test]
    fn a_crash_is_detected_by_every_survivor_and_a_restart_rejoins() {
        let wall = Instant::now();
        let (mut sim, _) = converged_cluster(N, TimingProfile::Local, SEED);

        // Crash one member: every survivor reports it Failed (not Left).
        let victim = 42;
        sim.crash(victim);
        let first = sim
            .wait_for(secs(20), CHECK, |s| {
                s.up()
                    .any(|i| s.view(i, victim) == Some(MemberState::Failed))
            })
            .expect("someone detects the crash");
        let crashed_at = sim.now() - first;
        let everyone = sim
            .wait_for(secs(20), CHECK, |s| s.all_see(victim, MemberState::Failed))
            .expect("every survivor detects the crash")
            + first;
        assert!(sim.now() - crashed_at < secs(10));

        // Nobody else was suspected into the grave on the way.
        for i in 0..sim.len() {
            if i != victim {
                assert!(!sim.ever_down(&sim.name(i)), "{} falsely down", sim.name(i));
            }
        }

        // The same address comes back with a newer generation and is Alive everywhere.
        sim.restart(victim);
        let rejoin = sim
            .wait_for(secs(20), CHECK, Sim::converged)
            .expect("the restarted member rejoins");
        eprintln!(
            "sim: crash of 1/{N} first detected after {first:?}, by all {} survivors after \
             {everyone:?}; restart rejoined everyone in {rejoin:?} ({:?} wall)",
            N - 1,
            wall.elapsed()
        );
    }

    #[test]
    fn a_full_partition_heals_into_one_cluster() {
        let wall = Instant::now();
        let (mut sim, _) = converged_cluster(N, TimingProfile::Local, SEED);
        let half = N / 2;

        // Split into two halves; each side declares the other Failed.
        sim.partition((0..N).map(|i| u8::from(i >= half)).collect());
        let split = sim
            .wait_for(secs(30), CHECK, Sim::split_seen)
            .expect("both halves see the other half failed");

        // Heal: announce-to-down, TurnUndead, renew and re-announce make one cluster again.
        sim.heal();
        let healed = sim
            .wait_for(secs(60), CHECK, Sim::converged)
            .expect("one cluster again after the heal");
        eprintln!(
            "sim: {N} members split {half}|{half}: each side saw the other failed after \
             {split:?}; healed into one cluster {healed:?} after the heal ({} packets, {:?} wall)",
            sim.packets,
            wall.elapsed()
        );
    }

    #[test]
    fn graceful_leave_is_left_and_force_leave_turns_failed_into_left() {
        let (mut sim, _) = converged_cluster(N, TimingProfile::Local, SEED);

        let leaver = 7;
        sim.leave(leaver);
        let left = sim
            .wait_for(secs(10), CHECK, |s| s.all_see(leaver, MemberState::Left))
            .expect("everyone reports the leaver Left");
        // Never reported Failed on the way: every MemberDown was classified Left.
        assert!((0..N).all(|i| sim.view(i, leaver) != Some(MemberState::Failed)));

        let dead = 8;
        sim.crash(dead);
        sim.wait_for(secs(20), CHECK, |s| s.all_see(dead, MemberState::Failed))
            .expect("crash detected");
        sim.force_leave(0, &sim.name(dead), false);
        let forced = sim
            .wait_for(secs(10), CHECK, |s| s.all_see(dead, MemberState::Left))
            .expect("force-leave spreads");
        eprintln!(
            "sim: graceful leave reported Left by all after {left:?}; force-leave spread in {forced:?}"
        );

        // Prune after the plain force-leave, from another node: every member still reports it
        // Left (so the leader deregisters it) and marks it pruned (so it is no longer listed).
        let name = sim.name(dead);
        let pruned_everywhere = |s: &Sim| {
            s.up().all(|i| {
                i == dead
                    || s.members(i)
                        .iter()
                        .any(|m| m.name == name && m.pruned && m.state == MemberState::Left)
            })
        };
        assert!(!pruned_everywhere(&sim));
        sim.force_leave(1, &name, true);
        sim.wait_for(secs(10), CHECK, pruned_everywhere)
            .expect("the prune spreads");
    }

    #[test]
    fn an_impostor_never_takes_a_live_members_name() {
        let (mut sim, _) = converged_cluster(10, TimingProfile::Local, SEED);
        let real = 4;
        let name = sim.name(real);
        // Every running node (the impostors too) lists `name` once: the real member, alive.
        let only_real = |s: &Sim| {
            s.up().all(|i| {
                let rows: Vec<_> = s
                    .members(i)
                    .into_iter()
                    .filter(|m| m.name == name)
                    .map(|m| (m.gossip_addr, m.state))
                    .collect();
                rows == [(addr(real), MemberState::Alive)]
            })
        };

        for crash in [false, true] {
            // An impostor joins: every member knows it at the SWIM level, none admits it.
            let impostor = sim.start_as(real);
            sim.wait_for(secs(10), CHECK, |s| {
                s.all_see(impostor, MemberState::Alive)
                    && s.view(impostor, real) == Some(MemberState::Alive)
            })
            .expect("the impostor joined the SWIM layer");
            assert!(only_real(&sim), "the impostor was admitted");

            // It leaves (or crashes): the real member's name is never reported left or failed.
            let gone = if crash {
                sim.crash(impostor);
                MemberState::Failed
            } else {
                sim.leave(impostor);
                MemberState::Left
            };
            let seen = sim.wait_for(secs(20), CHECK, |s| {
                !only_real(s) || s.all_see(impostor, gone)
            });
            assert!(seen.is_some(), "the impostor is never seen {gone:?}");
            assert!(
                only_real(&sim),
                "the impostor's {gone:?} reached the real member"
            );
            assert_eq!(sim.wait_for(secs(10), CHECK, |s| !only_real(s)), None);
        }
    }

    #[test]
    fn a_node_restarted_elsewhere_is_reported_failed_before_it_is_back() {
        let (mut sim, _) = converged_cluster(10, TimingProfile::Local, SEED);
        let old = 4;
        let name = sim.name(old);

        // A crash and a restart at another address, before anyone noticed the crash.
        sim.crash(old);
        let new = sim.start_as(old);
        let listed = |s: &Sim, i: usize| {
            s.members(i)
                .into_iter()
                .find(|m| m.name == name)
                .map(|m| (m.gossip_addr, m.state))
        };
        let watchers: Vec<usize> = sim.up().collect();
        let mut saw_failed = vec![false; sim.len()];
        let back = |s: &Sim| {
            watchers
                .iter()
                .all(|&i| listed(s, i) == Some((addr(new), MemberState::Alive)))
        };
        let deadline = sim.now() + secs(30);
        while !back(&sim) && sim.now() < deadline {
            for &i in &watchers {
                saw_failed[i] |= listed(&sim, i) == Some((addr(old), MemberState::Failed));
            }
            sim.run_for(CHECK);
        }
        assert!(back(&sim), "the restarted node is back everywhere");
        // Every member, the leader whoever it is, reported the old process failed on the way:
        // that is what invalidates its sessions.
        let missed: Vec<usize> = watchers
            .iter()
            .copied()
            .filter(|&i| !saw_failed[i])
            .collect();
        assert!(
            missed.is_empty(),
            "never saw the old process fail: {missed:?}"
        );
    }

    #[test]
    fn same_seed_same_trace() {
        // Boot 100 members, crash one, watch it being detected: a fixed virtual timeline.
        let run = |seed, until: Duration| {
            let mut sim = Sim::new(N, TimingProfile::Local, seed);
            sim.run_until(until.min(secs(1)));
            if until > secs(1) {
                sim.crash(13);
                sim.run_until(until);
            }
            (sim.trace().to_vec(), sim.packets)
        };
        let (a, packets_a) = run(SEED, secs(5));
        let (b, packets_b) = run(SEED, secs(5));
        assert!(a.len() > 5_000, "trace has {} lines", a.len());
        assert!(a.iter().any(|l| l.what == "down node-013 g1"));
        assert_eq!(packets_a, packets_b);
        assert!(a == b, "same seed, different traces");

        // Another seed diverges within the first half second.
        let (c, _) = run(SEED + 1, ms(500));
        let prefix: Vec<_> = a.iter().filter(|l| l.at <= ms(500)).cloned().collect();
        assert!(prefix != c, "different seeds gave identical traces");
    }

    #[test]
    fn a_killed_member_is_down_by_evidence_before_suspicion_could_end() {
        let wall = Instant::now();
        let suspicion = TimingProfile::Lan.suspect_to_down_after(10);
        let mut detections = Vec::new();
        for seed in 0..10 {
            let (mut sim, _) = converged_cluster(10, TimingProfile::Lan, seed);

            // Its port closed, the member is refused twice by whoever probes it next and
            // declared down at once; everyone hears it before a suspicion could even expire.
            sim.kill(5);
            let all = sim
                .wait_for(secs(30), ms(10), |s| s.all_see(5, MemberState::Failed))
                .expect("every survivor sees the killed member Failed");
            assert!(
                all < suspicion,
                "seed {seed}: seen Failed by all after {all:?}, not before the {suspicion:?} \
                 suspicion timeout"
            );
            for i in (0..10).filter(|&i| i != 5) {
                assert!(
                    !sim.ever_down(&sim.name(i)),
                    "seed {seed}: {i} falsely down"
                );
            }

            // The same address comes back with a newer generation and rejoins everywhere.
            sim.restart(5);
            sim.wait_for(secs(30), CHECK, Sim::converged)
                .expect("the restarted member rejoins");
            detections.push(all);
        }
        detections.sort();
        eprintln!(
            "sim: Lan, 10 members, 10 seeds: a kill -9 (port closed) was seen Failed by all after \
             {:?} (median), {:?} (max), suspicion timeout {suspicion:?} ({:?} wall)",
            detections[detections.len() / 2],
            detections[detections.len() - 1],
            wall.elapsed()
        );
    }

    #[test]
    fn a_member_that_hears_nothing_does_not_take_the_others_down_with_it() {
        // A firewall rejects everything sent to server 0 while it runs on and sends: the
        // others take it for dead (refusals), and it hears no ack and no refutation. Its every
        // probe fails, so its local health stretches its suspicions (Lifeguard): a short cut
        // ends before any of them does. A long one outlasts them, and it declares everyone
        // down; those verdicts are about incarnations the others refuted since, so they
        // change nothing anywhere (memberlist's rule), and once healed it takes the others
        // back instead of telling them to renew their identities.
        let n = 10;
        for (hold, verdicts) in [(secs(20), false), (secs(90), true)] {
            for seed in 0..5 {
                let (mut sim, _) = converged_cluster(n, TimingProfile::Lan, seed);
                let generations: Vec<u64> = (0..n).map(|i| sim.generation(i)).collect();
                sim.reject_inbound(0, true);
                sim.run_for(hold);
                assert!(
                    sim.all_see(0, MemberState::Failed),
                    "seed {seed}: 0 not failed"
                );
                sim.reject_inbound(0, false);
                sim.wait_for(secs(60), CHECK, Sim::converged)
                    .unwrap_or_else(|| panic!("seed {seed}: the cluster converges once healed"));
                let mut by_0 = 0;
                for (i, &generation) in generations.iter().enumerate().skip(1) {
                    let by = sim.declared_down_by(&sim.name(i));
                    assert!(
                        by.iter().all(|&observer| observer == 0),
                        "{hold:?}, seed {seed}: node {i} declared down by {by:?}"
                    );
                    by_0 += by.len();
                    assert_eq!(
                        sim.generation(i),
                        generation,
                        "{hold:?}, seed {seed}: node {i} had to renew its identity"
                    );
                }
                // The long cut must have made verdicts, or it proves nothing about them.
                assert_eq!(
                    by_0 > 0,
                    verdicts,
                    "{hold:?}, seed {seed}: 0 declared {by_0} members down"
                );
            }
        }
    }

    #[test]
    fn a_silent_crash_in_a_small_cluster_is_declared_on_time() {
        // With two or three members the dead one is probed again before its suspicion ends,
        // and with two every probe fails: neither may restart or stretch the suspicion (local
        // health stretches suspicions only while several members are suspected at once).
        let profile = TimingProfile::Lan;
        let limit = profile.probe_period() * 3 + profile.suspect_to_down_after(3);
        for n in [2, 3] {
            for seed in 0..5 {
                let (mut sim, _) = converged_cluster(n, profile, seed);
                sim.crash(1);
                let took = sim
                    .wait_for(secs(60), CHECK, |s| s.all_see(1, MemberState::Failed))
                    .unwrap_or_else(|| panic!("{n} members, seed {seed}: crash never declared"));
                assert!(
                    took < limit,
                    "{n} members, seed {seed}: declared after {took:?}"
                );
            }
        }
    }

    #[test]
    fn a_member_that_refuted_a_suspicion_still_leaves_cleanly() {
        // foca announces a leave as a Down at incarnation 0, which is stale for a member that
        // refuted a suspicion: its leave notice must take it down all the same, for good.
        let (mut sim, _) = converged_cluster(10, TimingProfile::Lan, SEED);
        let leaver = 7;
        sim.pause(leaver, secs(3));
        sim.wait_for(secs(30), CHECK, |s| s.incarnation(leaver) > 0)
            .expect("the paused member is suspected and refutes");
        sim.run_for(secs(5));
        sim.leave(leaver);
        let took = sim
            .wait_for(secs(10), CHECK, |s| s.all_see(leaver, MemberState::Left))
            .expect("everyone reports the leaver Left");
        // By its notice, not by a suspicion of the stopped process running out.
        let suspicion = TimingProfile::Lan.suspect_to_down_after(10);
        assert!(took < suspicion, "Left everywhere after {took:?}");
        sim.run_for(secs(20));
        assert!(sim.all_see(leaver, MemberState::Left));
    }

    #[test]
    fn a_member_force_left_while_alive_comes_back_and_later_fails_as_failed() {
        // Cut off by a rejecting firewall, a live member looks dead and an operator force-leaves
        // it; healed, it refutes and is taken back under the same identity. That force-leave
        // is then history: when it really crashes later, it is Failed, not Left.
        let (mut sim, _) = converged_cluster(10, TimingProfile::Lan, SEED);
        let member = 6;
        let generation = sim.generation(member);
        sim.reject_inbound(member, true);
        sim.wait_for(secs(30), CHECK, |s| s.all_see(member, MemberState::Failed))
            .expect("the rejecting member is taken for dead");
        sim.force_leave(0, &sim.name(member), false);
        sim.wait_for(secs(10), CHECK, |s| s.all_see(member, MemberState::Left))
            .expect("the force-leave spreads");
        sim.reject_inbound(member, false);
        sim.wait_for(secs(60), CHECK, |s| s.all_see(member, MemberState::Alive))
            .expect("healed, it is taken back");
        assert_eq!(
            sim.generation(member),
            generation,
            "it renewed its identity"
        );
        sim.crash(member);
        sim.wait_for(secs(30), CHECK, |s| s.all_see(member, MemberState::Failed))
            .expect("its crash is a failure everywhere");
    }

    #[test]
    fn one_stray_refusal_never_kills_a_live_member() {
        let (mut sim, _) = converged_cluster(10, TimingProfile::Lan, SEED);
        let window = TimingProfile::Lan.probe_period();

        // A lone refusal: the confirmation probe reaches the live member, nothing else happens.
        sim.inject_refusal(0, 5);
        sim.run_for(secs(10));
        // Two, further apart than the confirmation window: each is a lone refusal.
        sim.inject_refusal(0, 6);
        sim.run_for(window + ms(1));
        sim.inject_refusal(0, 6);
        sim.run_for(secs(10));
        let noise = disturbances(&sim);
        assert!(
            noise.is_empty(),
            "a stray refusal disturbed the cluster: {noise:#?}"
        );
        assert!(sim.converged());

        // The rule itself: a second refusal inside the window is the confirmation.
        sim.inject_refusal(0, 7);
        sim.inject_refusal(0, 7);
        assert_eq!(sim.view(0, 7), Some(MemberState::Failed));
    }

    #[test]
    fn lan_tolerates_a_two_second_stop_but_detects_a_crash() {
        let wall = Instant::now();
        let mut detections = Vec::new();
        // Small clusters: the shortest LAN suspicion (4 s), so the tightest case. Several seeds,
        // because whether the news of a suspicion reaches the paused member is down to chance
        // without the suspicion nudge.
        for seed in 0..10 {
            let (mut sim, _) = converged_cluster(10, TimingProfile::Lan, seed);
            for i in 1..10 {
                sim.pause(i, secs(2));
                sim.run_for(secs(2) + ms(777) * i as u32);
            }
            sim.run_for(secs(10));
            // Not declared down, and not even told to renew its identity.
            let noise = disturbances(&sim);
            assert!(
                noise.is_empty(),
                "seed {seed}: a 2 s stop disturbed the cluster under Lan: {noise:#?}"
            );
            assert!(sim.converged());

            sim.crash(5);
            let detect = sim
                .wait_for(secs(30), CHECK, |s| s.all_see(5, MemberState::Failed))
                .expect("Lan detects a crash");
            detections.push(detect);
        }
        detections.sort();
        eprintln!(
            "sim: Lan, 10 members, 10 seeds: 90 stops of 2 s caused no failure and no renewal; \
             a crash was seen Failed by all after {:?} (median), {:?} (max) ({:?} wall)",
            detections[detections.len() / 2],
            detections[detections.len() - 1],
            wall.elapsed()
        );
        assert!(detections.iter().all(|d| *d < secs(10)));
    }

    /// When node `i` was first declared down by anyone, from `since`.
    fn first_down_after(sim: &Sim, i: usize, since: Duration) -> Option<Duration> {
        let needle = format!("down {} ", sim.name(i));
        sim.trace()
            .iter()
            .find(|l| l.at >= since && l.what.starts_with(&needle))
            .map(|l| l.at - since)
    }

    #[test]
    fn confirmed_suspicions_end_sooner_yet_a_two_second_stop_survives() {
        // The bench's shape: five members under Lan. A 2 s stop, at every phase of the probe
        // cycle, is confirmed by every indirect prober (nobody can reach it) and still refuted
        // in time; a silent crash is declared by its first accuser at the confirmed minimum.
        let wall = Instant::now();
        let (mut firsts, mut alls) = (Vec::new(), Vec::new());
        for seed in 0..40 {
            let (mut sim, _) = converged_cluster(5, TimingProfile::Lan, seed);
            let victim = 1 + (seed as usize) % 4;
            sim.run_for(ms(37) * seed as u32);
            let stopped = sim.now();
            sim.pause(victim, secs(2));
            sim.run_for(secs(10));
            assert_eq!(
                first_down_after(&sim, victim, stopped),
                None,
                "seed {seed}: a 2 s stop was declared down"
            );
            assert!(sim.converged(), "seed {seed}");

            sim.run_for(ms(113) * seed as u32);
            let crashed = sim.now();
            sim.crash(victim);
            alls.push(
                sim.wait_for(secs(30), ms(10), |s| s.all_see(victim, MemberState::Failed))
                    .expect("the crash is declared"),
            );
            firsts.push(first_down_after(&sim, victim, crashed).expect("declared by someone"));
        }
        firsts.sort();
        alls.sort();
        let pct = |v: &[Duration], p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
        eprintln!(
            "sim: Lan, 5 members, 40 seeds: 40 stops of 2 s, none declared down; a silent \
             crash declared by its first accuser after {:?} (p50), {:?} (p90), {:?} (max), \
             seen Failed by all after {:?} (p50), {:?} (max) ({:?} wall)",
            pct(&firsts, 50),
            pct(&firsts, 90),
            pct(&firsts, 100),
            pct(&alls, 50),
            pct(&alls, 100),
            wall.elapsed()
        );
        // Unconfirmed (the 4 s maximum) the median was 5.75 s.
        assert!(pct(&firsts, 50) < secs(4), "{firsts:?}");
    }

    #[test]
    fn keys_rotate_across_the_cluster_and_lock_out_the_old_key() {
        use crate::crypto::{Key, generate_key};
        let key = || Key::from_base64(&generate_key()).expect("a key");
        let raw = |k: &Key| {
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, k.to_base64())
                .expect("base64")
        };
        let (old, new) = (key(), key());
        let n = 10;
        let mut sim = Sim::with_keyring(
            n,
            TimingProfile::Local,
            SEED,
            Some(Keyring::new(old.clone())),
        );
        sim.wait_for(secs(30), CHECK, Sim::converged)
            .expect("converged");
        let counts = |pairs: &[(&Key, usize)]| {
            pairs
                .iter()
                .map(|(k, c)| (k.to_base64(), *c))
                .collect::<std::collections::BTreeMap<_, _>>()
        };

        // Install the new key from one member, make it primary from another, remove the old
        // one from a third: every step reaches all ten.
        let installed = sim.key_query(3, KeyOp::Install(raw(&new)));
        assert_eq!((installed.error(), installed.num_nodes), (None, n));
        let listed = sim.key_query(0, KeyOp::List);
        assert_eq!(listed.keys, counts(&[(&old, n), (&new, n)]));
        assert_eq!(listed.primary_keys, counts(&[(&old, n)]));
        assert_eq!(sim.key_query(5, KeyOp::Use(raw(&new))).error(), None);
        assert_eq!(sim.key_query(7, KeyOp::Remove(raw(&old))).error(), None);
        let listed = sim.key_query(9, KeyOp::List);
        assert_eq!(listed.keys, counts(&[(&new, n)]));
        assert_eq!(listed.primary_keys, counts(&[(&new, n)]));

        // The primary key cannot be removed: every member refuses, with memberlist's text.
        let refused = sim.key_query(1, KeyOp::Remove(raw(&new)));
        assert_eq!(
            refused.error().as_deref(),
            Some("10/10 nodes reported failure")
        );
        assert_eq!(refused.messages.len(), n);
        assert!(
            refused
                .messages
                .values()
                .all(|m| m == "Removing the primary key is not allowed")
        );

        // Still one healthy cluster; a newcomer with only the old key never gets in, one with
        // the new key does.
        sim.run_for(secs(3));
        assert!(sim.converged());
        sim.set_boot_keyring(Some(Keyring::new(old)));
        let stale = sim.add_node();
        sim.set_boot_keyring(Some(Keyring::new(new)));
        let fresh = sim.add_node();
        sim.wait_for(secs(20), CHECK, |s| {
            (0..n).all(|i| s.view(i, fresh) == Some(MemberState::Alive))
        })
        .expect("the member with the new key joins");
        sim.run_for(secs(5));
        assert!(
            (0..n).all(|i| sim.view(i, stale).is_none()),
            "the old key got in"
        );
        assert!(sim.nodes[0].node.decrypt_failures() > 0);
    }
}
