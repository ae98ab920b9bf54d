//! Gossip membership and failure detection: every agent runs SWIM (foca) over UDP so the leader
//! can turn a member's failure into a critical `serfHealth` check and a graceful leave into a
//! deregistration. One task owns foca, the socket and the timers ([`start`]); everything else
//! talks to it through a [`Gossip`] handle (typed commands, answers on oneshots, the member list
//! on a watch channel).
//!
//! Layout: [`identity`] (who a member is), [`crypto`] (packet envelope, keys and keyring),
//! [`keyring`] (key rotation across the cluster and the keyring file), `errqueue` (the
//! kernel's refusals of our datagrams: evidence that a member's process is gone), [`profile`]
//! (all timing numbers), `node` (foca plus our decisions without I/O: datacenter filter,
//! push-pull state sync, suspicion nudges, two foca 2.0 workarounds), `book` (the member list),
//! `leave` (the custom broadcasts: leave notices that tell Left from Failed, and user events),
//! [`event`] (user events and the log of those seen), `reannounce` (retry-join and partition
//! healing); the simulator in `sim` runs `node` a hundred times over in one process.
//!
//! On the wire a UDP datagram is `envelope version | [nonce] | kind | payload [| tag]`, at most
//! 1400 bytes; see [`crypto`] and `node`.
//!
//! The crate needs nothing from the agent that runs it: [`GossipConfig`] says who this node is and
//! whom to join, and the catalog's member vocabulary (`vigil_shared::catalog`: roles, states,
//! [`MemberStatus`]) is what it reports.

mod book;
pub mod crypto;
mod errqueue;
pub mod event;
pub mod identity;
pub mod keyring;
mod leave;
mod node;
pub mod profile;
mod reannounce;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use foca::OwnedNotification;
use futures::StreamExt as _;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::time::DelayQueue;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};

pub use crypto::{Key, KeyError, Keyring, generate_key};
pub use identity::Member;
pub use keyring::{KeyOp, KeyResponse, KeyringFile, KeyringFileError};
pub use profile::TimingProfile;

use book::ForceLeaveRefusal;
use event::UserEvent;
use node::{GossipNode, NodeTimer, Output, Refusal};

/// How to run this node's gossip.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// Node name (unique in the cluster).
    pub name: String,
    /// UDP address to bind; port 0 picks a free port.
    pub bind_addr: SocketAddr,
    /// The gossip address peers should use, when `bind_addr` is a wildcard (0.0.0.0). Its port
    /// may be 0, meaning "the bound port". None: the bound address.
    pub advertise_addr: Option<SocketAddr>,
    pub role: MemberRole,
    /// This node's RPC address, advertised to the cluster in its identity.
    pub rpc_addr: SocketAddr,
    pub datacenter: String,
    /// Gossip addresses to join (and keep retrying while not connected).
    pub join: Vec<SocketAddr>,
    /// The configured gossip key(s) (`--encrypt`); None sends packets in the clear unless the
    /// keyring file has keys.
    pub keyring: Option<Keyring>,
    /// Where the keyring is kept across restarts (it wins over `keyring` once it exists);
    /// None keeps it in memory.
    pub keyring_file: Option<KeyringFile>,
    pub profile: TimingProfile,
}

impl GossipConfig {
    /// A client member with no seeds, no key and the LAN profile.
    pub fn new(
        name: impl Into<String>,
        bind_addr: SocketAddr,
        rpc_addr: SocketAddr,
        datacenter: impl Into<String>,
    ) -> GossipConfig {
        GossipConfig {
            name: name.into(),
            bind_addr,
            advertise_addr: None,
            role: MemberRole::Client,
            rpc_addr,
            datacenter: datacenter.into(),
            join: Vec::new(),
            keyring: None,
            keyring_file: None,
            profile: TimingProfile::Lan,
        }
    }
}

/// What the gossip subsystem can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    #[error("binding the gossip address {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} {value:?} must be 1 to {max} bytes long", max = identity::MAX_NAME_LEN)]
    BadName { what: &'static str, value: String },
    #[error("the gossip address {0} is not one peers can reach; set an advertise address")]
    Unadvertisable(SocketAddr),
    #[error("gossip is not running (shut down, or this node left the cluster)")]
    Stopped,
    #[error(
        "no gossip member answered at {addr} within {timeout:?}: unreachable, a different gossip key, or another datacenter"
    )]
    JoinTimeout { addr: SocketAddr, timeout: Duration },
    #[error("{0} is this node's own gossip address")]
    JoinSelf(SocketAddr),
    #[error("no member named {name}")]
    UnknownMember { name: String },
    #[error("member {name} is {state:?}; only a failed member can be forced to leave")]
    NotFailed { name: String, state: MemberState },
    #[error(transparent)]
    KeyringFile(#[from] KeyringFileError),
}

/// Requests to the gossip task.
enum Command {
    Announce(SocketAddr),
    Leave {
        done: oneshot::Sender<()>,
    },
    ForceLeave {
        name: String,
        prune: bool,
        reply: oneshot::Sender<Result<(), GossipError>>,
    },
    FireEvent {
        event: UserEvent,
        reply: oneshot::Sender<Result<UserEvent, GossipError>>,
    },
    Keyring {
        op: KeyOp,
        reply: oneshot::Sender<KeyResponse>,
    },
}

/// Handle to a running gossip task. Cheap to clone.
#[derive(Clone)]
pub struct Gossip {
    commands: mpsc::Sender<Command>,
    members: watch::Receiver<Vec<MemberStatus>>,
    /// The user events seen, oldest first.
    events: watch::Receiver<Vec<UserEvent>>,
    decrypt_failures: Arc<AtomicU64>,
    foreign_drops: Arc<AtomicU64>,
    health_score: Arc<AtomicU64>,
    local_addr: SocketAddr,
    gossip_addr: SocketAddr,
    profile: TimingProfile,
}

/// Binds the gossip socket and spawns the task that owns foca; returns once bound. Joining is
/// asynchronous and retried forever while not connected, so an unreachable seed is not an error.
pub async fn start(
    config: GossipConfig,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> Result<Gossip, GossipError> {
    for (what, value) in [
        ("node name", &config.name),
        ("datacenter", &config.datacenter),
    ] {
        if value.is_empty() || value.len() > identity::MAX_NAME_LEN {
            return Err(GossipError::BadName {
                what,
                value: value.clone(),
            });
        }
    }
    let socket = UdpSocket::bind(config.bind_addr)
        .await
        .map_err(|source| GossipError::Bind {
            addr: config.bind_addr,
            source,
        })?;
    let local_addr = socket.local_addr().map_err(|source| GossipError::Bind {
        addr: config.bind_addr,
        source,
    })?;
    let evidence = errqueue::enable(&socket);
    let mut gossip_addr = config.advertise_addr.unwrap_or(local_addr);
    if gossip_addr.port() == 0 {
        gossip_addr.set_port(local_addr.port());
    }
    if gossip_addr.ip().is_unspecified() {
        return Err(GossipError::Unadvertisable(gossip_addr));
    }

    let identity = Member::new(
        config.name,
        gossip_addr,
        config.rpc_addr,
        config.role,
        config.datacenter,
    );
    let keyring = match &config.keyring_file {
        Some(file) => file.initial(config.keyring)?,
        None => config.keyring,
    };
    let store = config
        .keyring_file
        .map(|file| Box::new(file) as Box<dyn keyring::KeyringStore>);
    let rng: rand_foca::rngs::StdRng = rand_foca::make_rng();
    let node =
        GossipNode::new(identity, &config.join, config.profile, rng).with_keyring(keyring, store);
    let (members_tx, members_rx) = watch::channel(node.members());
    let (events_tx, events_rx) = watch::channel(Vec::new());
    let (commands_tx, commands_rx) = mpsc::channel(64);
    let decrypt_failures = Arc::new(AtomicU64::new(0));
    let foreign_drops = Arc::new(AtomicU64::new(0));
    let health_score = Arc::new(AtomicU64::new(0));

    tracing::info!(%gossip_addr, join = ?config.join, encrypted = node.is_encrypted(), "gossip started");
    let driver = Driver {
        node,
        socket,
        decrypt_failures: Arc::clone(&decrypt_failures),
        foreign_drops: Arc::clone(&foreign_drops),
        health_score: Arc::clone(&health_score),
        key_waiters: HashMap::new(),
        commands: commands_rx,
        members: members_tx,
        events: events_tx,
        timers: DelayQueue::new(),
        epoch: Instant::now(),
        profile: config.profile,
        evidence,
    };
    tasks.spawn(driver.run(shutdown));

    Ok(Gossip {
        commands: commands_tx,
        members: members_rx,
        events: events_rx,
        decrypt_failures,
        foreign_drops,
        health_score,
        local_addr,
        gossip_addr,
        profile: config.profile,
    })
}

impl Gossip {
    /// A handle with no gossip task behind it, for tests of the HTTP API: `members` is the
    /// member list for good, no event arrives, and commands fail as after a shutdown.
    #[cfg(any(test, feature = "test-double"))]
    pub fn detached(addr: SocketAddr, members: Vec<MemberStatus>) -> Gossip {
        let (commands, _) = mpsc::channel(1);
        Gossip {
            commands,
            members: watch::channel(members).1,
            events: watch::channel(Vec::new()).1,
            decrypt_failures: Arc::default(),
            foreign_drops: Arc::default(),
            health_score: Arc::default(),
            local_addr: addr,
            gossip_addr: addr,
            profile: TimingProfile::Local,
        }
    }

    /// The bound UDP address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The gossip address other members know us by.
    pub fn gossip_addr(&self) -> SocketAddr {
        self.gossip_addr
    }

    /// Every member of our datacenter we know, ourselves included: Alive, Leaving, Left (left
    /// gracefully or force-left) or Failed (declared down by the failure detector). Sorted by
    /// name.
    pub fn members(&self) -> Vec<MemberStatus> {
        self.members.borrow().clone()
    }

    /// Spreads a user event to every member (`/v1/event/fire`); the event as fired, with its
    /// ID and Lamport time.
    pub async fn fire_event(&self, event: UserEvent) -> Result<UserEvent, GossipError> {
        self.ask(|reply| Command::FireEvent { event, reply })
            .await?
    }

    /// Sends the gossip task a command that carries `reply`, and waits for its answer.
    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, GossipError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| GossipError::Stopped)?;
        answer.await.map_err(|_| GossipError::Stopped)
    }

    /// The user events this node has seen, oldest first; changes when one arrives.
    pub fn events(&self) -> watch::Receiver<Vec<UserEvent>> {
        self.events.clone()
    }

    /// A receiver that changes whenever the member list changes.
    pub fn subscribe(&self) -> watch::Receiver<Vec<MemberStatus>> {
        self.members.clone()
    }

    /// Announces to the gossip address `addr` (`/v1/agent/join`) and waits until a live member
    /// with that gossip address is in the list; the announce is repeated every probe period
    /// until the profile's join timeout. Once joined, `addr` is a member like any other (not a
    /// seed retried forever, unlike [`GossipConfig::join`]).
    pub async fn join(&self, addr: SocketAddr) -> Result<(), GossipError> {
        if addr == self.gossip_addr || addr == self.local_addr {
            return Err(GossipError::JoinSelf(addr));
        }
        let timeout = self.profile.join_timeout();
        let deadline = Instant::now() + timeout;
        let mut members = self.members.clone();
        loop {
            self.commands
                .send(Command::Announce(addr))
                .await
                .map_err(|_| GossipError::Stopped)?;
            let retry_at = (Instant::now() + self.profile.probe_period()).min(deadline);
            let joined = members.wait_for(|list| {
                list.iter()
                    .any(|m| m.gossip_addr == addr && m.state == MemberState::Alive)
            });
            match tokio::time::timeout_at(retry_at, joined).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(_)) => return Err(GossipError::Stopped),
                Err(_) if Instant::now() >= deadline => {
                    return Err(GossipError::JoinTimeout { addr, timeout });
                }
                Err(_) => {}
            }
        }
    }

    /// Graceful leave: tells the cluster we are leaving on purpose (so we are reported Left, not
    /// Failed), keeps the task running until the leave went out to enough members or the
    /// profile's linger time passed, then stops the task.
    pub async fn leave(&self) -> Result<(), GossipError> {
        self.ask(|done| Command::Leave { done }).await
    }

    /// Operator force-leave (`/v1/agent/force-leave/<node>`): a Failed member becomes Left in
    /// our list, and a leave notice on its behalf is gossiped so every member that has it
    /// Failed (or later declares it down) reports it Left too. A live member is refused: it
    /// would only come straight back.
    pub async fn force_leave(&self, name: &str, prune: bool) -> Result<(), GossipError> {
        let name = name.to_owned();
        self.ask(|reply| Command::ForceLeave { name, prune, reply })
            .await?
    }

    /// Asks every live member to apply a keyring operation (`/v1/operator/keyring`) and adds
    /// up their answers; returns once every member answered or the profile's timeout passed.
    pub async fn keyring(&self, op: KeyOp) -> Result<KeyResponse, GossipError> {
        self.ask(|reply| Command::Keyring { op, reply }).await
    }

    /// Received packets dropped because they did not open (wrong key, clear text on an
    /// encrypted cluster, garbage).
    pub fn decrypt_failures(&self) -> u64 {
        self.decrypt_failures.load(Ordering::Relaxed)
    }

    /// Received packets dropped because their sender belongs to another datacenter.
    pub fn foreign_datacenter_drops(&self) -> u64 {
        self.foreign_drops.load(Ordering::Relaxed)
    }

    /// Lifeguard's local health multiplier: 0 while our probes succeed, up to 8 while they
    /// fail (memberlist's `health.score`).
    pub fn health_score(&self) -> u64 {
        self.health_score.load(Ordering::Relaxed)
    }
}

/// The task that owns foca (inside [`GossipNode`]), the socket and foca's timers.
struct Driver {
    node: GossipNode,
    socket: UdpSocket,
    /// Mirrors the node's count for [`Gossip::decrypt_failures`].
    decrypt_failures: Arc<AtomicU64>,
    /// Mirrors the node's count for [`Gossip::foreign_datacenter_drops`].
    foreign_drops: Arc<AtomicU64>,
    /// Mirrors [`GossipNode::local_health`] for [`Gossip::health_score`].
    health_score: Arc<AtomicU64>,
    /// Callers of [`Gossip::keyring`] waiting for their query, by its ID.
    key_waiters: HashMap<u64, oneshot::Sender<KeyResponse>>,
    commands: mpsc::Receiver<Command>,
    members: watch::Sender<Vec<MemberStatus>>,
    events: watch::Sender<Vec<UserEvent>>,
    timers: DelayQueue<NodeTimer>,
    /// Origin of the node's clock.
    epoch: Instant,
    profile: TimingProfile,
    /// The kernel reports refused datagrams on the socket ([`errqueue`]): evidence of death.
    evidence: bool,
}

/// A graceful leave in progress.
struct Leaving {
    deadline: Instant,
    waiters: Vec<oneshot::Sender<()>>,
}

impl Driver {
    async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.profile.tick_interval());
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut buf = vec![0u8; 64 * 1024];
        let mut leaving: Option<Leaving> = None;
        let mut commands_open = true;
        loop {
            let out = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                Some(expired) = self.timers.next(), if !self.timers.is_empty() => {
                    let now = self.epoch.elapsed();
                    self.node.handle_timer(expired.into_inner(), now)
                }
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((len, from)) => self.received(&buf[..len], from),
                    Err(e) => {
                        tracing::debug!(error = %e, "gossip socket receive failed");
                        Output::default()
                    }
                },
                refusal = errqueue::next(&self.socket), if self.evidence => match refusal {
                    Ok(Some(to)) => self.node.refused(to, self.epoch.elapsed()),
                    Ok(None) => Output::default(),
                    Err(e) => {
                        tracing::debug!(error = %e, "gossip error queue read failed");
                        Output::default()
                    }
                },
                command = self.commands.recv(), if commands_open => match command {
                    Some(command) => self.command(command, &mut leaving),
                    // Every handle is gone: keep gossiping until shutdown.
                    None => {
                        commands_open = false;
                        Output::default()
                    }
                },
                _ = tick.tick() => {
                    let now = self.epoch.elapsed();
                    if self.node.has_left() { self.node.linger(now) } else { self.node.tick(now) }
                }
            };
            self.flush(out).await;
            if let Some(l) = &leaving
                && (self.node.leave_sent() || Instant::now() >= l.deadline)
            {
                break;
            }
        }
        // Refuse further commands before anyone learns we stopped.
        self.commands.close();
        self.members.send_replace(self.node.members());
        if let Some(l) = leaving {
            tracing::info!("left the gossip cluster");
            for waiter in l.waiters {
                let _ = waiter.send(());
            }
        }
        tracing::debug!(addr = %self.node.identity().addr, "gossip task stopped");
    }

    fn received(&mut self, packet: &[u8], from: SocketAddr) -> Output {
        let now = self.epoch.elapsed();
        let out = self
            .node
            .handle_packet(packet, from, now)
            .unwrap_or_else(|e| {
                tracing::debug!(%from, error = %e, "dropped gossip packet");
                Output::default()
            });
        self.decrypt_failures
            .store(self.node.decrypt_failures(), Ordering::Relaxed);
        self.foreign_drops
            .store(self.node.foreign_dropped(), Ordering::Relaxed);
        out
    }

    fn command(&mut self, command: Command, leaving: &mut Option<Leaving>) -> Output {
        let now = self.epoch.elapsed();
        match command {
            Command::Announce(addr) => self.node.announce(addr, now).unwrap_or_default(),
            Command::Leave { done } => match leaving {
                Some(l) => {
                    l.waiters.push(done);
                    Output::default()
                }
                None => {
                    tracing::info!("leaving the gossip cluster");
                    *leaving = Some(Leaving {
                        deadline: Instant::now() + self.profile.leave_linger(),
                        waiters: vec![done],
                    });
                    self.node.leave(now)
                }
            },
            Command::ForceLeave { name, prune, reply } => {
                let (out, answer) = match self.node.force_leave(&name, prune, now) {
                    Ok(out) => (out, Ok(())),
                    Err(refusal) => (Output::default(), Err(refusal_error(refusal, name))),
                };
                // The caller reads the member list next: it must already say Left.
                self.publish();
                let _ = reply.send(answer);
                out
            }
            Command::FireEvent { event, reply } => {
                let (out, answer) = match self.node.fire(event, now) {
                    Ok((event, out)) => (out, Ok(event)),
                    Err(_) => (Output::default(), Err(GossipError::Stopped)),
                };
                // The caller may list events next: the fired one must be there.
                self.publish();
                let _ = reply.send(answer);
                out
            }
            // A refusal (we left) drops `reply`: the caller sees Stopped.
            Command::Keyring { op, reply } => match self.node.key_query(op, now) {
                Ok((id, out)) => {
                    self.key_waiters.insert(id, reply);
                    out
                }
                Err(_) => Output::default(),
            },
        }
    }

    /// Sends the node's packets, arms its timers and publishes the member list if it changed.
    async fn flush(&mut self, out: Output) {
        for notification in &out.notifications {
            match notification {
                OwnedNotification::MemberUp(m) => {
                    tracing::info!(member = %m.name, addr = %m.addr, "gossip: member up");
                }
                OwnedNotification::MemberDown(m) => {
                    tracing::info!(member = %m.name, addr = %m.addr, "gossip: member down");
                }
                other => tracing::debug!(notification = ?other, "gossip"),
            }
        }
        for (after, timer) in out.timers {
            self.timers.insert(timer, after);
        }
        for (id, response) in out.key_results {
            if let Some(waiter) = self.key_waiters.remove(&id) {
                let _ = waiter.send(response);
            }
        }
        for (to, data) in out.sends {
            let packet = self.node.seal(&data);
            if let Err(e) = self.socket.send_to(&packet, to).await {
                tracing::debug!(%to, error = %e, "gossip send failed");
            }
        }
        self.publish();
    }

    /// Publishes the member list if it changed, and our local health.
    fn publish(&mut self) {
        self.health_score
            .store(u64::from(self.node.local_health()), Ordering::Relaxed);
        if self.node.take_changed() {
            self.members.send_replace(self.node.members());
        }
        if self.node.take_new_events() {
            self.events.send_replace(self.node.events());
        }
    }
}

fn refusal_error(refusal: Refusal, name: String) -> GossipError {
    match refusal {
        Refusal::Left => GossipError::Stopped,
        Refusal::ForceLeave(ForceLeaveRefusal::Unknown) => GossipError::UnknownMember { name },
        Refusal::ForceLeave(ForceLeaveRefusal::NotFailed(state)) => {
            GossipError::NotFailed { name, state }
        }
    }
}
