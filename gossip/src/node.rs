//! One gossip member without I/O: foca plus everything decided around it (datacenter filter,
//! member list, leave notices, user events, re-announce, push-pull state sync, config resizing). Input in (a
//! packet, a timer, a tick, a command, each with the caller's `now`), effects out ([`Output`]:
//! packets to send and timers to schedule). The tokio driver and the in-process simulator both
//! run exactly this, so the simulation exercises the production decisions.
//!
//! Packets are sealed and opened here too, with the node's keyring (see [`super::crypto`]), so
//! the simulation exercises key rotation as well. Inside the envelope every packet starts with a
//! kind byte: [`KIND_SWIM`] (a foca packet follows), [`KIND_SYNC`] (a chunk of our full
//! membership state, memberlist's push-pull) or [`KIND_KEY`] (a keyring request or answer, see
//! [`super::keyring`]). SWIM spreads news by piggybacking each update a bounded number of times,
//! so a few members can miss a join or a failure (more so when half the sends go to members that
//! just became unreachable); the periodic sync with one random live member closes that gap
//! within a sync interval.
//!
//! The same chunk format carries suspicion nudges (Lifeguard's "buddy system"): while we suspect
//! a member, we tell it so directly every probe period, and it answers by refuting (a bumped
//! incarnation) straight to us. Without this, a member that was paused while the news of its
//! suspicion went round never hears of it (each update is piggybacked a bounded number of times)
//! and is declared down although it is back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use bytes::{Buf as _, BufMut as _};
use foca::{
    AccumulatingRuntime, Codec as _, Foca, Header, Incarnation, Message, OwnedNotification,
    PostcardCodec, ProbeNumber, State, Timer,
};
use rand_foca::rngs::StdRng;
use rand_foca::{RngExt as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use vigil_shared::catalog::{MemberState, MemberStatus};

use super::book::{ForceLeaveRefusal, MemberBook, starts_before};
use super::crypto::{Envelope, Keyring, OpenError};
use super::event::{EventLog, UserEvent};
use super::identity::{Member, peek_datacenter};
use super::keyring::{self, KeyMessage, KeyOp, KeyResponse, KeyringStore, Query, SeenRequests};
use super::leave::{LeaveHandler, LeaveNotice};
use super::profile::{MAX_PACKET, TimingProfile};
use super::reannounce::Reannouncer;

type SwimFoca = Foca<Member, PostcardCodec, StdRng, LeaveHandler>;

/// First byte of a packet carrying a foca (SWIM) packet.
pub const KIND_SWIM: u8 = 0;
/// First byte of a packet carrying a state-sync chunk.
pub const KIND_SYNC: u8 = 1;
/// First byte of a packet carrying a keyring request or answer ([`KeyMessage`]).
pub const KIND_KEY: u8 = 2;
/// First byte of a packet carrying a [`Nack`] (a member of the first release drops it as a
/// packet of an unknown kind).
pub const KIND_NACK: u8 = 3;

/// Lifeguard's cap on the local health multiplier: timeouts stretch to at most 9 times
/// (memberlist's `AwarenessMaxMultiplier`).
const MAX_LOCAL_HEALTH: u32 = 8;

/// How often old down rows are looked for; they are kept for minutes to hours anyway.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Header of a state-sync chunk; postcard-encoded foca members follow until the end.
#[derive(Debug, Serialize, Deserialize)]
struct SyncHeader {
    from: Member,
    /// Set on the first chunk of a push: answer with our own state (the pull).
    reply: bool,
}

/// A SWIM packet in foca's layout: `header`, then `updates` (a big-endian `u16` count and the
/// members) unless there are none to carry, then `rest` (custom broadcasts) as it came.
fn rebuild(
    header: &Header<Member>,
    updates: Option<&[foca::Member<Member>]>,
    rest: &[u8],
) -> Option<Vec<u8>> {
    let mut codec = PostcardCodec;
    let mut packet = Vec::with_capacity(MAX_PACKET);
    codec.encode_header(header, &mut packet).ok()?;
    if let Some(updates) = updates {
        packet.put_u16(u16::try_from(updates.len()).ok()?);
        for update in updates {
            codec.encode_member(update, &mut packet).ok()?;
        }
    }
    packet.extend_from_slice(rest);
    Some(packet)
}

/// A random duration between `low` and `high` times `period`.
fn jitter(rng: &mut StdRng, period: Duration, low: f64, high: f64) -> Duration {
    period.mul_f64(rng.random_range(low..high))
}

/// A suspicion we started (our probe failed), until its timer fires or it is refuted.
#[derive(Debug)]
struct Suspicion {
    id: Member,
    incarnation: Incarnation,
    next_nudge: Duration,
    /// When it started.
    since: Duration,
    /// Members that confirmed it independently: asked to probe the suspect for us, they got
    /// no answer either (their nacks). Lifeguard's dynamic suspicion shortens it with each.
    confirmations: BTreeSet<SocketAddr>,
    /// foca's timer that ends it, to arm again earlier when a confirmation comes.
    timer: Timer<Member>,
    /// When the earliest armed copy of `timer` fires.
    due: Duration,
}

/// "I probed `target` for you (probe `probe`) and got no answer in time": memberlist's nack,
/// which foca's protocol lacks. Sent by a member that forwarded an indirect probe of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Nack {
    /// The member that forwarded the probe (the nack's sender).
    from: SocketAddr,
    target: SocketAddr,
    probe: ProbeNumber,
}

/// An indirect probe we forward for `asker`, until `target` answers or the nack is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Forwarded {
    asker: SocketAddr,
    target: SocketAddr,
    probe: ProbeNumber,
}

/// The indirect round of our latest probe of one member: whom we asked, who nacked.
#[derive(Debug)]
struct ProbeRound {
    probe: ProbeNumber,
    /// Nacks count until then: the probe period (stretched by our health when the probe began)
    /// and a probe RTT for the nack's way back. foca's probe number is a `u8` shared by all our
    /// probes, so an old nack may carry the number of this round; a round ends long before
    /// the number comes round again.
    nacks_until: Duration,
    asked: BTreeSet<SocketAddr>,
    nacked: BTreeSet<SocketAddr>,
    /// The target answered this probe (directly or through a member we asked): its nacks say
    /// nothing against the target.
    acked: bool,
    /// The nackers this round added to our suspicion of the target, taken back if it acks.
    confirmed: BTreeSet<SocketAddr>,
    /// The round failed before any nack came, and that worsened our local health: a nack
    /// arriving after the verdict (late, or read late because we were stalled) takes it back.
    penalized: bool,
}

/// A timer the node asks its driver for: foca's, or one of the node's own.
#[derive(Debug)]
pub enum NodeTimer {
    Swim(Timer<Member>),
    /// An indirect probe we forwarded is due its answer: nack it unless the target acked.
    Nack(Forwarded),
}

/// What one call into the node asks the caller to do.
#[derive(Debug, Default)]
pub struct Output {
    /// Packets (kind byte included, not yet sealed) and their destination gossip address.
    pub sends: Vec<(SocketAddr, Vec<u8>)>,
    /// Timers to hand back to [`GossipNode::handle_timer`] after the delay.
    pub timers: Vec<(Duration, NodeTimer)>,
    /// What foca reported, for logs and traces (already folded into the member list).
    pub notifications: Vec<OwnedNotification<Member>>,
    /// Keyring operations this node asked of the cluster that are over (every live member
    /// answered, or time ran out), by the ID [`GossipNode::key_query`] returned.
    pub key_results: Vec<(u64, KeyResponse)>,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    ForceLeave(ForceLeaveRefusal),
    /// The node has left the cluster.
    Left,
}

pub struct GossipNode {
    foca: SwimFoca,
    runtime: AccumulatingRuntime<Member>,
    notices: mpsc::Receiver<LeaveNotice>,
    /// User events from the broadcast handler, into `event_log`.
    events: mpsc::Receiver<UserEvent>,
    event_log: EventLog,
    /// Set when `event_log` got an event since [`GossipNode::take_new_events`].
    new_events: bool,
    book: MemberBook,
    reannounce: Reannouncer,
    profile: TimingProfile,
    /// Cluster size the current foca config was computed for.
    config_size: usize,
    /// After a graceful leave the node is inert except for lingering gossip: feeding it packets
    /// could tell foca "you are down", and it would renew its identity and rejoin.
    left: bool,
    /// Packets dropped because their sender belongs to another datacenter.
    foreign_dropped: u64,
    next_sync: Duration,
    next_reap: Duration,
    /// Our own incarnation, as our last packet carried it (foca keeps it to itself): a death
    /// notice about us for an older one is stale.
    incarnation: Incarnation,
    /// Lifeguard's local health multiplier (see [`GossipNode::local_health`]).
    local_health: u32,
    /// The probe whose ack last counted towards `local_health` (a probe counts once).
    last_acked_probe: Option<ProbeNumber>,
    /// Members we suspect, by address: nudged until refuted or declared down.
    suspecting: BTreeMap<SocketAddr, Suspicion>,
    /// Our latest probe of each member we probed, by its address: who nacked its indirect
    /// round.
    probes: BTreeMap<SocketAddr, ProbeRound>,
    /// Indirect probes we forward for others, until the target answers or we nack, with when
    /// the nack is due.
    forwarding: BTreeMap<Forwarded, Duration>,
    /// Addresses whose first refusal (see [`GossipNode::refused`]) awaits confirmation, with
    /// when it came: a second refusal before `when + probe_period` is the confirmation.
    refused: BTreeMap<SocketAddr, Duration>,
    /// Picks sync partners and jitters the sync period (derived from the rng given to foca, so a
    /// seeded node is deterministic).
    rng: StdRng,
    /// Seals and opens packets with the keyring (clear text without one).
    envelope: Envelope,
    /// Keeps the keyring across restarts; `None` keeps it in memory only.
    keyring_store: Option<Box<dyn KeyringStore>>,
    /// Keyring requests applied lately, so a repeated request is answered, not re-applied.
    seen_requests: SeenRequests,
    /// Keyring operations we asked of the cluster, by ID.
    queries: BTreeMap<u64, Query>,
    /// The next query's ID (random start, so a restarted node's IDs are new to everyone).
    next_query_id: u64,
}

impl GossipNode {
    pub fn new(
        identity: Member,
        join: &[SocketAddr],
        profile: TimingProfile,
        mut rng: StdRng,
    ) -> GossipNode {
        let mut own_rng = StdRng::from_rng(&mut rng);
        let next_query_id = own_rng.random();
        // The first sync somewhere in the first period, so nodes started together spread out.
        let first_sync = jitter(&mut own_rng, profile.sync_interval(), 0.0, 1.0);
        let (handler, notices, events) = LeaveHandler::new();
        let reannounce = Reannouncer::new(identity.addr, join, profile);
        let mut book = MemberBook::new(identity.datacenter.to_string(), profile.reclaim_after());
        book.refresh(&identity, Duration::ZERO);
        GossipNode {
            foca: Foca::with_custom_broadcast(
                identity,
                profile.foca_config(1),
                rng,
                PostcardCodec,
                handler,
            ),
            runtime: AccumulatingRuntime::new(),
            notices,
            events,
            event_log: EventLog::default(),
            new_events: false,
            book,
            reannounce,
            profile,
            config_size: 1,
            left: false,
            foreign_dropped: 0,
            next_sync: first_sync,
            next_reap: Duration::ZERO,
            incarnation: Incarnation::default(),
            local_health: 0,
            last_acked_probe: None,
            suspecting: BTreeMap::new(),
            probes: BTreeMap::new(),
            forwarding: BTreeMap::new(),
            refused: BTreeMap::new(),
            rng: own_rng,
            envelope: Envelope::new(None),
            keyring_store: None,
            seen_requests: SeenRequests::default(),
            queries: BTreeMap::new(),
            next_query_id,
        }
    }

    /// Seals packets with `keyring` and keeps its changes in `store` (`None`: in memory).
    pub fn with_keyring(
        mut self,
        keyring: Option<Keyring>,
        store: Option<Box<dyn KeyringStore>>,
    ) -> GossipNode {
        self.envelope = Envelope::new(keyring);
        self.keyring_store = store;
        self
    }

    /// A packet to send, sealed with the primary key (or in the clear without a keyring).
    pub fn seal(&self, packet: &[u8]) -> Vec<u8> {
        self.envelope.seal(packet)
    }

    /// Whether packets are sealed.
    pub fn is_encrypted(&self) -> bool {
        self.envelope.keyring().is_some()
    }

    /// Received packets dropped so far because they did not open.
    pub fn decrypt_failures(&self) -> u64 {
        self.envelope.failures()
    }

    /// A received packet, still sealed, and the address it came from; `Err` (and counted) when
    /// it does not open.
    pub fn handle_packet(
        &mut self,
        packet: &[u8],
        source: SocketAddr,
        now: Duration,
    ) -> Result<Output, OpenError> {
        let plain = self.envelope.open(packet)?;
        Ok(self.handle_data(&plain, source, now))
    }

    /// Our current identity (its generation grows when foca renews it).
    pub fn identity(&self) -> &Member {
        self.foca.identity()
    }

    /// A received packet, already opened.
    fn handle_data(&mut self, data: &[u8], source: SocketAddr, now: Duration) -> Output {
        if self.left {
            return Output::default();
        }
        match data.split_first() {
            Some((&KIND_SWIM, swim)) => self.handle_swim(swim, now),
            Some((&KIND_SYNC, chunk)) => self.handle_sync(chunk, now),
            Some((&KIND_KEY, message)) => self.handle_key(message, now),
            Some((&KIND_NACK, message)) => self.handle_nack(message, source, now),
            _ => {
                tracing::debug!("gossip packet of an unknown kind");
                Output::default()
            }
        }
    }

    fn handle_swim(&mut self, data: &[u8], now: Duration) -> Output {
        // The header starts with the sender's identity: peeking at its datacenter is enough to
        // drop other datacenters before foca learns of them.
        match peek_datacenter(data) {
            Some(dc) if dc == self.identity().datacenter.as_bytes() => {}
            Some(dc) => {
                self.foreign_dropped += 1;
                tracing::trace!(dc = %String::from_utf8_lossy(dc), "dropped gossip from another datacenter");
                return Output::default();
            }
            None => {
                tracing::debug!("undecodable gossip packet");
                return Output::default();
            }
        }
        let filtered = self.screen_swim(data, now);
        let result = match filtered {
            Some(filtered) => self.foca.handle_data(&filtered, &mut self.runtime),
            None => self.foca.handle_data(data, &mut self.runtime),
        };
        self.log_error("handle_data", result);
        self.settle(now)
    }

    /// What we read in a SWIM packet before foca does, in foca's layout (a header, then, unless
    /// the message is a broadcast, a big-endian `u16` count of member updates and the updates,
    /// then custom broadcasts): an ack for our probe (local health), members foca holds down
    /// that now speak for a newer incarnation ([`GossipNode::resurrect_refuted`]), and death
    /// notices that are stale ([`GossipNode::is_stale_death`]). Returns the packet rebuilt
    /// without the stale notices, or `None` to hand it to foca as it is (nothing stale, or
    /// nothing foca would decode either).
    fn screen_swim(&mut self, data: &[u8], now: Duration) -> Option<Vec<u8>> {
        let mut codec = PostcardCodec;
        let mut rest = data;
        let mut header: Header<Member> = codec.decode_header(&mut rest).ok()?;
        self.book.heard_from(&header.src);
        self.note_ack(&header, now);
        if let Message::IndirectAck {
            target: asker,
            probe_number,
        } = &header.message
        {
            // The target answered an indirect probe we forward: no nack.
            self.forwarding.remove(&Forwarded {
                asker: asker.addr,
                target: header.src.addr,
                probe: *probe_number,
            });
        }
        // What foca will not read (addressed to another identity) resurrects nobody.
        let for_us = header.dst == *self.identity()
            || (header.message == Message::Announce && header.dst.addr == self.identity().addr);
        if for_us {
            self.resurrect_refuted(&header.src, header.src_incarnation);
        }
        let turn_undead = header.message == Message::TurnUndead && header.dst == *self.identity();
        if turn_undead {
            // "You are down", from a member that holds us down at some incarnation it does
            // not say. foca would renew our identity, declaring the old one down everywhere;
            // memberlist refutes instead. So do we: a newer incarnation, told to that member
            // at once, which takes us back if its verdict was older (see `resurrect_refuted`).
            tracing::debug!(from = %header.src.name, "gossip: told we are down; refuting");
            let me = foca::Member::new(self.identity().clone(), self.incarnation, State::Suspect);
            let result = self
                .foca
                .apply_many(std::iter::once(me), true, &mut self.runtime);
            self.log_error("apply_many", result);
            self.announce_to(header.src.addr);
            header.message = Message::Gossip;
        }
        if header.message == Message::Broadcast || rest.remaining() < 2 {
            return if turn_undead {
                rebuild(&header, None, rest)
            } else {
                None
            };
        }
        let count = rest.get_u16();
        let mut updates = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            updates.push(codec.decode_member(&mut rest).ok()?);
        }
        // foca distrusts the news of a sender it holds down; so do we.
        if for_us && !self.held_down(&header.src) {
            for update in updates.iter().filter(|u| u.state() != State::Down) {
                self.resurrect_refuted(update.id(), update.incarnation());
            }
        }
        let before = updates.len();
        updates.retain(|update| !self.is_stale_death(update));
        if updates.len() == before && !turn_undead {
            return None;
        }
        if updates.len() < before {
            tracing::debug!(
                from = %header.src.name,
                dropped = before - updates.len(),
                "gossip: ignored death notices older than the incarnation we know"
            );
        }
        rebuild(&header, Some(&updates), rest)
    }

    /// Members that announced their own leave are down at the incarnation we know them at.
    /// foca's leave announces the Down at incarnation 0, which [`GossipNode::is_stale_death`]
    /// rightly drops for a member that ever refuted a suspicion; the notice (addressed, with
    /// its generation) says it is no stale verdict.
    fn down_leavers(&mut self, leaving: &[(SocketAddr, u64)]) {
        if leaving.is_empty() {
            return;
        }
        let downs: Vec<foca::Member<Member>> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() != State::Down)
            .filter(|m| leaving.contains(&(m.id().addr, m.id().generation)))
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), State::Down))
            .collect();
        if downs.is_empty() {
            return;
        }
        let result = self
            .foca
            .apply_many(downs.into_iter(), true, &mut self.runtime);
        self.log_error("apply_many", result);
    }

    /// Lifeguard: an ack for one of our probes, direct or forwarded by an indirect prober, is
    /// a probe that succeeded, and our local health improves (once per probe). The target
    /// answered that round, so its nacks confirm no suspicion of the target.
    fn note_ack(&mut self, header: &Header<Member>, now: Duration) {
        let (target, probe) = match &header.message {
            Message::Ack(probe) => (header.src.addr, *probe),
            Message::ForwardedAck {
                origin,
                probe_number,
            } => (origin.addr, *probe_number),
            _ => return,
        };
        if header.dst != *self.identity() {
            return;
        }
        if let Some(round) = self
            .probes
            .get_mut(&target)
            .filter(|round| round.probe == probe && now <= round.nacks_until)
        {
            round.acked = true;
            if let Some(s) = self.suspecting.get_mut(&target) {
                for nacker in std::mem::take(&mut round.confirmed) {
                    s.confirmations.remove(&nacker);
                }
            }
        }
        if self.last_acked_probe == Some(probe) {
            return;
        }
        self.last_acked_probe = Some(probe);
        self.local_health = self.local_health.saturating_sub(1);
    }

    /// Whether foca holds any member down (cheap: the usual answer is no, and then no row
    /// need be looked at).
    fn holds_down_rows(&self) -> bool {
        self.foca.iter_membership_state().len() > self.foca.num_members()
    }

    /// Whether foca holds `id` down.
    fn held_down(&self, id: &Member) -> bool {
        self.holds_down_rows()
            && self
                .foca
                .iter_membership_state()
                .any(|known| known.id() == id && known.state() == State::Down)
    }

    /// The other half of memberlist's rule: a member we hold down that speaks for (or is
    /// reported at) a newer incarnation than the one we declared down had refuted before our
    /// verdict could reach it, so the verdict was stale (we heard nothing for a while: the
    /// refutation never reached us). memberlist brings such a member back alive; foca never
    /// lifts a Down, so the row is forgotten (what its `RemoveDown` timer does) and foca takes
    /// the member as new and alive. Without this we would answer its packets with
    /// `TurnUndead`, and it would renew its identity: its old one declared down everywhere.
    fn resurrect_refuted(&mut self, id: &Member, incarnation: Incarnation) {
        if !self.holds_down_rows() {
            return;
        }
        let stale = self.foca.iter_membership_state().any(|known| {
            known.id() == id && known.state() == State::Down && known.incarnation() < incarnation
        });
        if stale {
            tracing::info!(member = %id.name, incarnation, "gossip: a member we declared down had refuted our suspicion; taking it back");
            let result = self
                .foca
                .handle_timer(Timer::RemoveDown(id.clone()), &mut self.runtime);
            self.log_error("handle_timer", result);
        }
    }

    /// memberlist's rule for a death notice: one about an older incarnation than the one we
    /// know is stale (the member refuted a suspicion since) and changes nothing. foca applies
    /// a Down whatever its incarnation, so a member that hears nothing (a firewall rejecting
    /// what is sent to it, a one-way partition) would suspect everyone, never hear their
    /// refutations, and take every member it can still talk to down with it.
    fn is_stale_death(&self, update: &foca::Member<Member>) -> bool {
        if update.state() != State::Down {
            return false;
        }
        if update.id() == self.identity() {
            return update.incarnation() < self.incarnation;
        }
        self.foca.iter_membership_state().any(|known| {
            known.id() == update.id()
                && known.state() != State::Down
                && known.incarnation() > update.incarnation()
        })
    }

    fn same_datacenter(&mut self, src: &Member) -> bool {
        let same = src.datacenter == self.identity().datacenter;
        if !same {
            self.foreign_dropped += 1;
            tracing::trace!(from = %src.addr, dc = %src.datacenter, "dropped gossip from another datacenter");
        }
        same
    }

    /// A state-sync chunk: merge it into foca (news about failures is re-broadcast, plain
    /// liveness is not: the sender's peers already know it), and answer a push with our state.
    fn handle_sync(&mut self, chunk: &[u8], now: Duration) -> Output {
        let (header, mut rest) = match postcard::take_from_bytes::<SyncHeader>(chunk) {
            Ok(decoded) => decoded,
            Err(e) => {
                tracing::debug!(error = %e, "undecodable sync chunk");
                return Output::default();
            }
        };
        if !self.same_datacenter(&header.from) {
            return Output::default();
        }
        let mut news = Vec::new();
        let mut alive = Vec::new();
        let mut suspected = false;
        while !rest.is_empty() {
            match postcard::take_from_bytes::<foca::Member<Member>>(rest) {
                Ok((member, tail)) => {
                    rest = tail;
                    if member.id().datacenter != self.identity().datacenter {
                        continue;
                    }
                    suspected |= member.id() == self.identity() && member.state() == State::Suspect;
                    if member.state() != State::Down {
                        self.resurrect_refuted(member.id(), member.incarnation());
                    }
                    if member.state() == State::Alive {
                        alive.push(member);
                    } else if !self.is_stale_death(&member) {
                        news.push(member);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "undecodable member in sync chunk");
                    break;
                }
            }
        }
        let result = self
            .foca
            .apply_many(news.into_iter(), true, &mut self.runtime);
        self.log_error("apply_many", result);
        let result = self
            .foca
            .apply_many(alive.into_iter(), false, &mut self.runtime);
        self.log_error("apply_many", result);
        if suspected {
            // foca just refuted (bumped our incarnation); an Announce carries the new
            // incarnation straight to whoever told us, which clears its suspicion.
            self.announce_to(header.from.addr);
        }
        let mut out = self.settle(now);
        if header.reply {
            out.sends.extend(self.sync_chunks(
                header.from.addr,
                false,
                self.foca.iter_membership_state(),
            ));
        }
        out
    }

    /// `members` (our full membership state, or one suspicion) as chunks that each fit a
    /// packet.
    fn sync_chunks<'a>(
        &'a self,
        to: SocketAddr,
        reply: bool,
        members: impl Iterator<Item = &'a foca::Member<Member>>,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        let limit = MAX_PACKET;
        let mut chunks = Vec::new();
        let start = |reply: bool| {
            let chunk = vec![KIND_SYNC];
            let header = SyncHeader {
                from: self.identity().clone(),
                reply,
            };
            match postcard::to_extend(&header, chunk) {
                Ok(chunk) => chunk,
                Err(_) => vec![KIND_SYNC],
            }
        };
        let mut chunk = start(reply);
        let empty = chunk.len();
        for member in members {
            let Ok(encoded) = postcard::to_allocvec(member) else {
                continue;
            };
            if chunk.len() + encoded.len() > limit && chunk.len() > empty {
                chunks.push((to, std::mem::replace(&mut chunk, start(false))));
            }
            chunk.extend_from_slice(&encoded);
        }
        if chunk.len() > empty || chunks.is_empty() {
            chunks.push((to, chunk));
        }
        chunks
    }

    pub fn handle_timer(&mut self, timer: NodeTimer, now: Duration) -> Output {
        if self.left {
            return Output::default();
        }
        let timer = match timer {
            NodeTimer::Swim(timer) => timer,
            NodeTimer::Nack(forwarded) => return self.nack_due(forwarded, now),
        };
        let suspect = match &timer {
            Timer::ChangeSuspectToDown {
                member_id,
                incarnation,
                ..
            } => {
                let ours = self
                    .suspecting
                    .get(&member_id.addr)
                    .is_some_and(|s| s.id == *member_id && s.incarnation == *incarnation);
                if ours && let Some(end) = self.suspicion_end(&member_id.addr) {
                    // Our health may have worsened since the suspicion started: its end moves
                    // with it, so a member that hears nothing does not declare everyone down.
                    if now < end {
                        if let Some(s) = self.suspecting.get_mut(&member_id.addr) {
                            s.due = end;
                        }
                        return Output {
                            timers: vec![(end - now, NodeTimer::Swim(timer))],
                            ..Output::default()
                        };
                    }
                    self.suspecting.remove(&member_id.addr);
                }
                Some(member_id.clone())
            }
            _ => None,
        };
        let result = self.foca.handle_timer(timer, &mut self.runtime);
        self.log_error("handle_timer", result);
        let mut out = self.settle(now);
        // foca 2.0 workaround: when a suspicion timer fires for a member that refuted the
        // suspicion meanwhile, foca does not declare it down (right) but still sends it a
        // TurnUndead (wrong), which makes it renew its identity: a healthy member that merely
        // paused would churn through a new generation, and members that hear of the old one's
        // Down first would report it Failed for a moment. The TurnUndead is the only packet this
        // timer sends, so drop it unless the member really went down.
        if let Some(member) = suspect {
            let declared_down = out
                .notifications
                .iter()
                .any(|n| matches!(n, OwnedNotification::MemberDown(m) if *m == member));
            if !declared_down {
                out.sends.retain(|(to, _)| *to != member.addr);
            }
        }
        out
    }

    /// Housekeeping, every [`TimingProfile::tick_interval`]: re-announce when due, reap old
    /// down rows.
    pub fn tick(&mut self, now: Duration) -> Output {
        if now >= self.next_reap {
            self.next_reap = now + REAP_EVERY;
            self.book.reap(now, self.profile.reap_after());
            let window = self.profile.probe_period();
            self.refused.retain(|_, first| now <= *first + window);
            // A probe round of a member reaped from the book is no longer asked about.
            let book = &self.book;
            self.probes.retain(|addr, _| book.knows(addr));
        }
        let known: Vec<SocketAddr> = self.book.known_addrs().collect();
        let book = &self.book;
        let targets = self.reannounce.due(now, &known, |a| book.is_live(a));
        if !targets.is_empty() {
            tracing::debug!(
                ?targets,
                active = self.reannounce.is_active(),
                "re-announcing"
            );
        }
        for addr in targets {
            self.announce_to(addr);
        }
        let mut out = self.settle(now);
        if self.reannounce.is_active() && now >= self.next_sync {
            self.next_sync = now + jitter(&mut self.rng, self.profile.sync_interval(), 0.5, 1.5);
            let live: Vec<SocketAddr> = self.book.live_addrs().collect();
            if !live.is_empty() {
                let partner = live[self.rng.random_range(0..live.len())];
                out.sends.extend(self.sync_chunks(
                    partner,
                    true,
                    self.foca.iter_membership_state(),
                ));
            }
        }
        self.nudge_suspects(now, &mut out);
        self.drive_queries(now, &mut out);
        out
    }

    /// Tells every member we suspect, once per probe period, that we do (see the module docs).
    fn nudge_suspects(&mut self, now: Duration, out: &mut Output) {
        if self.suspecting.is_empty() {
            return;
        }
        // Forget suspicions that were refuted or replaced meanwhile.
        let foca = &self.foca;
        self.suspecting.retain(|addr, s| {
            foca.iter_membership_state().any(|m| {
                m.id().addr == *addr
                    && *m.id() == s.id
                    && m.state() == State::Suspect
                    && m.incarnation() == s.incarnation
            })
        });
        let due: Vec<foca::Member<Member>> = self
            .suspecting
            .values_mut()
            .filter(|s| s.next_nudge <= now)
            .map(|s| {
                s.next_nudge = now + self.profile.probe_period();
                foca::Member::new(s.id.clone(), s.incarnation, State::Suspect)
            })
            .collect();
        for suspect in &due {
            let to = suspect.id().addr;
            out.sends
                .extend(self.sync_chunks(to, false, std::iter::once(suspect)));
        }
    }

    /// Evidence of death: the kernel reported that a packet we sent to `addr` was refused (an
    /// ICMP port unreachable: the host is up and nothing listens on the port, so the member's
    /// process is gone). A stopped or slow process still owns its socket and is never refused,
    /// so this path cannot accuse it.
    ///
    /// One refusal proves little (a stray or late ICMP), so the first only sends a
    /// confirmation probe, a packet a live member ignores. A second refusal within a probe
    /// period declares the member at `addr` down at once, skipping suspicion: the Down is
    /// gossiped like any other, and a new process at that address joins with a new identity (an
    /// old identity cannot refute a Down). Refusals for an address that is no live member (a
    /// seed not yet joined, a member already down) are ignored.
    pub fn refused(&mut self, addr: SocketAddr, now: Duration) -> Output {
        if self.left {
            return Output::default();
        }
        let member = self
            .foca
            .iter_membership_state()
            .find(|m| m.id().addr == addr && m.state() != State::Down)
            .map(|m| (m.id().clone(), m.incarnation()));
        let Some((id, incarnation)) = member else {
            self.refused.remove(&addr);
            return Output::default();
        };
        let window = self.profile.probe_period();
        match self.refused.get(&addr) {
            Some(&first) if now <= first + window => {
                self.refused.remove(&addr);
                tracing::info!(member = %id.name, %addr, "gossip: member refused probes twice (port closed), declaring it down");
                let result = self.foca.apply_many(
                    std::iter::once(foca::Member::new(id, incarnation, State::Down)),
                    true,
                    &mut self.runtime,
                );
                self.log_error("apply_many", result);
                self.suspecting.remove(&addr);
                self.settle(now)
            }
            _ => {
                self.refused.insert(addr, now);
                tracing::debug!(member = %id.name, %addr, "gossip: member refused a probe, confirming");
                Output {
                    sends: self.sync_chunks(addr, false, std::iter::empty()),
                    ..Output::default()
                }
            }
        }
    }

    /// Announce to a gossip address (an operator's join). One-shot: unlike the configured join
    /// list it is not retried forever (the caller retries until its own deadline).
    pub fn announce(&mut self, addr: SocketAddr, now: Duration) -> Result<Output, Refusal> {
        if self.left {
            return Err(Refusal::Left);
        }
        self.announce_to(addr);
        Ok(self.settle(now))
    }

    fn announce_to(&mut self, addr: SocketAddr) {
        let dst = Member::placeholder(addr, &self.identity().datacenter);
        let result = self.foca.announce(dst, &mut self.runtime);
        self.log_error("announce", result);
    }

    /// Graceful leave: spread a leave notice for our identity, then foca's own leave (our
    /// identity as Down) to a few members. Call [`GossipNode::linger`] afterwards until
    /// [`GossipNode::leave_sent`] or a deadline.
    pub fn leave(&mut self, now: Duration) -> Output {
        if self.left {
            return Output::default();
        }
        let me = self.identity().clone();
        let notice = LeaveNotice {
            addr: me.addr,
            generation: me.generation,
            forced: false,
            prune: false,
        };
        // Added first, so the same Gossip packets that carry "we are down" carry the notice.
        if let Err(e) = self.foca.add_broadcast(&notice.encode()) {
            tracing::warn!(error = %e, "could not queue the leave notice");
        }
        let result = self.foca.leave_cluster(&mut self.runtime);
        self.log_error("leave_cluster", result);
        self.reannounce.stop();
        let out = self.settle(now);
        self.left = true;
        out
    }

    /// While lingering after a leave: gossip the pending updates (our Down, the notice) to more
    /// members.
    pub fn linger(&mut self, now: Duration) -> Output {
        if !self.left || self.leave_sent() {
            return Output::default();
        }
        let result = self.foca.gossip(&mut self.runtime);
        self.log_error("gossip", result);
        self.settle(now)
    }

    /// Whether every pending update went out `max_transmissions` times (or nobody is left to
    /// tell).
    pub fn leave_sent(&self) -> bool {
        self.foca.num_members() == 0
            || (self.foca.updates_backlog() == 0 && self.foca.custom_broadcast_backlog() == 0)
    }

    pub fn has_left(&self) -> bool {
        self.left
    }

    /// Operator force-leave: a Failed member becomes Left here (with `prune`, also unlisted),
    /// and a notice asks everyone else to do the same.
    pub fn force_leave(
        &mut self,
        name: &str,
        prune: bool,
        now: Duration,
    ) -> Result<Output, Refusal> {
        if self.left {
            return Err(Refusal::Left);
        }
        let notice = self
            .book
            .force_leave(name, prune, now)
            .map_err(Refusal::ForceLeave)?;
        match self.foca.add_broadcast(&notice.encode()) {
            // Spread it right away instead of waiting for the next probe or gossip round.
            Ok(true) => {
                let result = self.foca.broadcast(&mut self.runtime);
                self.log_error("broadcast", result);
            }
            Ok(false) => {} // already known everywhere we told
            Err(e) => tracing::warn!(error = %e, "could not queue the force-leave notice"),
        }
        Ok(self.settle(now))
    }

    /// The member list, ourselves included (Alive, or Left after a leave).
    pub fn members(&self) -> Vec<MemberStatus> {
        let state = if self.left {
            MemberState::Left
        } else {
            MemberState::Alive
        };
        self.book.snapshot(self.identity(), state)
    }

    /// The state of the member at `addr`, as this node sees it.
    #[cfg(test)]
    pub fn state_of(&self, addr: &SocketAddr) -> Option<MemberState> {
        self.book.state_of(addr)
    }

    /// Live members (excluding ourselves) in the member list.
    #[cfg(test)]
    pub fn live_count(&self) -> usize {
        self.book.live_addrs().count()
    }

    /// Whether the member list changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        self.book.take_changed()
    }

    /// Spreads a user event (its ID and Lamport time are set here) and records it; the event
    /// as fired.
    pub fn fire(
        &mut self,
        mut event: UserEvent,
        now: Duration,
    ) -> Result<(UserEvent, Output), Refusal> {
        if self.left {
            return Err(Refusal::Left);
        }
        event.ltime = self.event_log.next_ltime();
        match self.foca.add_broadcast(&event.encode()) {
            Ok(_) => {
                let result = self.foca.broadcast(&mut self.runtime);
                self.log_error("broadcast", result);
            }
            Err(e) => tracing::warn!(error = %e, "could not queue the user event"),
        }
        Ok((event, self.settle(now)))
    }

    /// The user events seen, oldest first.
    pub fn events(&self) -> Vec<UserEvent> {
        self.event_log.events()
    }

    /// Whether an event arrived since the last call.
    pub fn take_new_events(&mut self) -> bool {
        std::mem::take(&mut self.new_events)
    }

    /// Asks every live member (ourselves first) to apply a keyring operation; the ID its
    /// result will carry in [`Output::key_results`].
    pub fn key_query(&mut self, op: KeyOp, now: Duration) -> Result<(u64, Output), Refusal> {
        if self.left {
            return Err(Refusal::Left);
        }
        let id = self.next_query_id;
        self.next_query_id = self.next_query_id.wrapping_add(1);
        let own = keyring::apply(&mut self.envelope, &mut self.keyring_store, &op);
        let me = self.identity().clone();
        let members = self
            .members()
            .into_iter()
            .filter(|m| m.state == MemberState::Alive && m.gossip_addr != me.addr)
            .map(|m| (m.gossip_addr, m.name))
            .collect();
        let query = Query::new(op, members, me.name.to_string(), own, now, self.profile);
        self.queries.insert(id, query);
        let mut out = Output::default();
        self.drive_queries(now, &mut out);
        Ok((id, out))
    }

    /// A keyring request (apply it once, answer the asker) or an answer to one of our queries.
    fn handle_key(&mut self, message: &[u8], now: Duration) -> Output {
        let mut out = Output::default();
        match postcard::from_bytes::<KeyMessage>(message) {
            Ok(KeyMessage::Request { id, from, op }) => {
                let answer = match self.seen_requests.get(from, id) {
                    Some(answer) => answer.clone(),
                    None => {
                        tracing::info!(op = op.name(), %from, "keyring request");
                        let answer =
                            keyring::apply(&mut self.envelope, &mut self.keyring_store, &op);
                        self.seen_requests.insert(from, id, answer.clone());
                        answer
                    }
                };
                let me = self.identity();
                let reply = KeyMessage::Answer {
                    id,
                    addr: me.addr,
                    node: me.name.to_string(),
                    answer,
                };
                out.sends.push((from, key_packet(&reply)));
            }
            Ok(KeyMessage::Answer {
                id,
                addr,
                node,
                answer,
            }) => {
                if let Some(query) = self.queries.get_mut(&id) {
                    query.answered(addr, node, answer);
                }
                self.drive_queries(now, &mut out);
            }
            Err(e) => tracing::debug!(error = %e, "undecodable keyring packet"),
        }
        out
    }

    /// Sends our pending keyring requests again to members that have not answered, and
    /// reports the queries that are over.
    fn drive_queries(&mut self, now: Duration, out: &mut Output) {
        let from = self.identity().addr;
        let retry = self.profile.key_query_retry();
        let mut over = Vec::new();
        for (&id, query) in &mut self.queries {
            if query.done(now) {
                over.push(id);
            } else if now >= query.next_send {
                query.next_send = now + retry;
                let packet = key_packet(&KeyMessage::Request {
                    id,
                    from,
                    op: query.op.clone(),
                });
                out.sends
                    .extend(query.waiting.keys().map(|&addr| (addr, packet.clone())));
            }
        }
        for id in over {
            if let Some(query) = self.queries.remove(&id) {
                out.key_results.push((id, query.response));
            }
        }
    }

    /// Packets dropped so far because their sender belongs to another datacenter.
    pub fn foreign_dropped(&self) -> u64 {
        self.foreign_dropped
    }

    /// Drains foca's runtime and the leave-notice channel into the member list and an
    /// [`Output`], then resizes foca's config if the cluster size changed.
    fn settle(&mut self, now: Duration) -> Output {
        let mut out = Output::default();
        // Notices first: a notice and the MemberDown it explains may come out of one packet.
        let mut leaving = Vec::new();
        while let Ok(notice) = self.notices.try_recv() {
            if notice.addr != self.identity().addr {
                if !notice.forced {
                    leaving.push((notice.addr, notice.generation));
                }
                self.book.leave_notice(notice, now);
            }
        }
        self.down_leavers(&leaving);
        while let Ok(event) = self.events.try_recv() {
            self.new_events |= self.event_log.record(event);
        }
        while let Some(n) = self.runtime.to_notify() {
            self.reannounce.observe(&n, now);
            if !self.about_ourselves(&n) {
                self.book.apply(&n, now);
                self.log_name_conflict(&n);
            }
            out.notifications.push(n);
        }
        self.book.refresh(self.foca.identity(), now);
        // Timers first: a failed probe's suspicion reads that probe's nacks before a new probe
        // of the same member (in the same batch) starts a new round.
        while let Some((after, timer)) = self.runtime.to_schedule() {
            let after = match &timer {
                Timer::ChangeSuspectToDown {
                    member_id,
                    incarnation,
                    ..
                } => {
                    // foca schedules this only when a probe of ours failed, again for a
                    // member it already suspects: that suspicion keeps its start.
                    let nacked = self
                        .probes
                        .get(&member_id.addr)
                        .map(|round| round.nacked.clone())
                        .unwrap_or_default();
                    // Lifeguard: a failed probe counts against our own health unless a member
                    // we asked to probe indirectly answered that it got no answer either (the
                    // failure is the target's, not ours). memberlist counts each missing nack;
                    // members of the first release never nack, so only "none came" counts.
                    if nacked.is_empty()
                        && self.worse_health()
                        && let Some(round) = self.probes.get_mut(&member_id.addr)
                    {
                        round.penalized = true;
                    }
                    let same = self
                        .suspecting
                        .get(&member_id.addr)
                        .is_some_and(|s| s.id == *member_id && s.incarnation == *incarnation);
                    if !same {
                        self.suspecting.insert(
                            member_id.addr,
                            Suspicion {
                                id: member_id.clone(),
                                incarnation: *incarnation,
                                next_nudge: now,
                                since: now,
                                confirmations: BTreeSet::new(),
                                timer: timer.clone(),
                                due: now + after,
                            },
                        );
                    }
                    if let Some(s) = self.suspecting.get_mut(&member_id.addr) {
                        let added: Vec<SocketAddr> = nacked
                            .into_iter()
                            .filter(|nacker| s.confirmations.insert(*nacker))
                            .collect();
                        if let Some(round) = self.probes.get_mut(&member_id.addr) {
                            round.confirmed.extend(added);
                        }
                    }
                    let end = self.suspicion_end(&member_id.addr).unwrap_or(now + after);
                    if let Some(s) = self.suspecting.get_mut(&member_id.addr) {
                        s.due = end;
                    }
                    end.saturating_sub(now)
                }
                Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. } => {
                    self.stretched(after)
                }
                _ => after,
            };
            out.timers.push((after, NodeTimer::Swim(timer)));
        }
        while let Some((to, data)) = self.runtime.to_send() {
            if let Ok((header, _)) = postcard::take_from_bytes::<Header<Member>>(&data)
                && header.src == *self.identity()
            {
                if header.src_incarnation > self.incarnation {
                    // We refuted a suspicion of ourselves: Lifeguard counts it against our
                    // local health (others could not hear us in time).
                    self.worse_health();
                }
                self.incarnation = header.src_incarnation;
                self.note_probe_sent(&to, &header.message, now, &mut out);
            }
            let mut packet = Vec::with_capacity(1 + data.len());
            packet.push(KIND_SWIM);
            packet.extend_from_slice(&data);
            out.sends.push((to.addr, packet));
        }
        debug_assert_eq!(self.runtime.backlog(), 0);

        let size = self.foca.num_members() + 1;
        if size != self.config_size {
            match self.foca.set_config(self.profile.foca_config(size)) {
                Ok(()) => self.config_size = size,
                Err(e) => tracing::warn!(error = %e, "could not resize the gossip config"),
            }
        }
        out
    }

    /// Serf's name-conflict log lines, when a member comes up with a name a live member at
    /// another address (we, or someone else) already claims. The one that started first keeps
    /// the name (see [`MemberBook::refresh`]); the member list only ever reports the holder.
    fn log_name_conflict(&self, n: &OwnedNotification<Member>) {
        let OwnedNotification::MemberUp(id) = n else {
            return;
        };
        let me = self.identity();
        if id.name == me.name {
            if starts_before(me, id) {
                tracing::error!(node = %me.name, other = %id.addr,
                    "node name conflict: another member claims this node's name; it is not admitted (names must be unique)");
            } else {
                tracing::error!(node = %me.name, holder = %id.addr,
                    "node name conflict: a live member that started earlier holds this node's name; this node is not admitted while it lives (names must be unique)");
            }
        } else if let Some(rival) = self.book.rival(id) {
            let (holder, refused) = if starts_before(rival, id) {
                (rival, id)
            } else {
                (id, rival)
            };
            tracing::warn!(node = %id.name, holder = %holder.addr, refused = %refused.addr,
                "node name conflict: two members claim the name; the one that started first keeps it");
        }
    }

    /// A member notification naming our own address (an identity of ours from before a renew).
    /// Lifeguard: a probe of ours failed, or we had to refute a suspicion of ourselves. Returns
    /// whether the score grew (it stops at [`MAX_LOCAL_HEALTH`]).
    fn worse_health(&mut self) -> bool {
        let worse = (self.local_health + 1).min(MAX_LOCAL_HEALTH);
        std::mem::replace(&mut self.local_health, worse) < worse
    }

    /// A probe timeout or period stretched by our local health (memberlist's `ScaleTimeout`):
    /// a member that misses acks (starved, or cut off from what is sent to it) probes less
    /// often and waits longer for answers, instead of accusing members that are fine.
    fn stretched(&self, timeout: Duration) -> Duration {
        timeout * (self.local_health + 1)
    }

    /// A suspicion's timeout, stretched by our local health while we suspect several members
    /// at once: one dead member (or two members, one of them dead) is declared down on time
    /// whatever our score, while a member whose probes of everyone fail holds its suspicions
    /// up to [`MAX_LOCAL_HEALTH`] times longer (our addition to Lifeguard: such a member gets
    /// no confirmations either, since nacks cannot reach it).
    fn stretched_suspicion(&self, timeout: Duration) -> Duration {
        if self.suspecting.len() < 2 {
            return timeout;
        }
        timeout * self.local_health.max(1)
    }

    /// When our suspicion of the member at `addr` ends: Lifeguard's dynamic timeout for its
    /// confirmations so far ([`TimingProfile::suspicion_timeout`]), stretched by our health.
    fn suspicion_end(&self, addr: &SocketAddr) -> Option<Duration> {
        let s = self.suspecting.get(addr)?;
        let size = self.foca.num_members() + 1;
        let timeout = self.profile.suspicion_timeout(size, s.confirmations.len());
        Some(s.since + self.stretched_suspicion(timeout))
    }

    /// Notes what our own SWIM packets start: a probe of a member (a new indirect round), a
    /// member asked to probe it for us, or an indirect probe we forward for another member
    /// (answered by the target, or nacked when [`NodeTimer::Nack`] fires).
    fn note_probe_sent(
        &mut self,
        to: &Member,
        message: &Message<Member>,
        now: Duration,
        out: &mut Output,
    ) {
        match message {
            Message::Ping(probe) => {
                let nacks_until =
                    now + self.stretched(self.profile.probe_period()) + self.profile.probe_rtt();
                self.probes.insert(
                    to.addr,
                    ProbeRound {
                        probe: *probe,
                        nacks_until,
                        asked: BTreeSet::new(),
                        nacked: BTreeSet::new(),
                        acked: false,
                        confirmed: BTreeSet::new(),
                        penalized: false,
                    },
                );
            }
            Message::PingReq {
                target,
                probe_number,
            } => {
                if let Some(round) = self
                    .probes
                    .get_mut(&target.addr)
                    .filter(|round| round.probe == *probe_number)
                {
                    round.asked.insert(to.addr);
                }
            }
            Message::IndirectPing {
                origin,
                probe_number,
            } => {
                let forwarded = Forwarded {
                    asker: origin.addr,
                    target: to.addr,
                    probe: *probe_number,
                };
                let after = self.profile.nack_after();
                self.forwarding.insert(forwarded, now + after);
                out.timers.push((after, NodeTimer::Nack(forwarded)));
            }
            _ => {}
        }
    }

    /// An indirect probe we forwarded got no answer in time: tell the asker. Unless the timer
    /// fires late (beyond the slack the asker's indirect window leaves a nack): then we were
    /// stalled (stopped, or starved of CPU), the target's answer may be waiting unread in our
    /// socket, and our silence says nothing about the target.
    fn nack_due(&mut self, forwarded: Forwarded, now: Duration) -> Output {
        let Some(due) = self.forwarding.remove(&forwarded) else {
            return Output::default();
        };
        let slack = self.profile.probe_rtt() - self.profile.nack_after();
        if now > due + slack {
            tracing::debug!(target = %forwarded.target, late = ?(now - due),
                "gossip: no nack from a stalled forwarder");
            return Output::default();
        }
        let nack = Nack {
            from: self.identity().addr,
            target: forwarded.target,
            probe: forwarded.probe,
        };
        let packet = postcard::to_extend(&nack, vec![KIND_NACK])
            .expect("postcard encodes a fixed-shape struct into a Vec");
        Output {
            sends: vec![(forwarded.asker, packet)],
            ..Output::default()
        }
    }

    /// A nack for an indirect round of ours: a confirmation of our suspicion of the target
    /// (now or once the probe is declared failed), which may end it sooner. It counts only from
    /// a member we asked, sent from that member's address, while the round lasts.
    fn handle_nack(&mut self, message: &[u8], source: SocketAddr, now: Duration) -> Output {
        let Ok(nack) = postcard::from_bytes::<Nack>(message) else {
            tracing::debug!("undecodable nack");
            return Output::default();
        };
        if !same_host_port(nack.from, source) {
            tracing::debug!(from = %nack.from, %source, "gossip: nack from another address than its sender's");
            return Output::default();
        }
        let Some(round) = self.probes.get_mut(&nack.target).filter(|round| {
            round.probe == nack.probe
                && now <= round.nacks_until
                && !round.acked
                && round.asked.contains(&nack.from)
        }) else {
            return Output::default();
        };
        round.nacked.insert(nack.from);
        if std::mem::take(&mut round.penalized) {
            // Lifeguard's exemption, for a nack that came after foca's verdict: the failure
            // was the target's, not ours.
            self.local_health = self.local_health.saturating_sub(1);
        }
        let Some(s) = self.suspecting.get_mut(&nack.target) else {
            return Output::default();
        };
        if !s.confirmations.insert(nack.from) {
            return Output::default();
        }
        round.confirmed.insert(nack.from);
        let Some(end) = self.suspicion_end(&nack.target) else {
            return Output::default();
        };
        let Some(s) = self.suspecting.get_mut(&nack.target) else {
            return Output::default();
        };
        if end >= s.due {
            return Output::default();
        }
        s.due = end;
        Output {
            timers: vec![(end.saturating_sub(now), NodeTimer::Swim(s.timer.clone()))],
            ..Output::default()
        }
    }

    /// Our incarnation, as our last packet carried it.
    #[cfg(test)]
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Lifeguard's local health multiplier: 0 when our probes succeed, up to
    /// [`MAX_LOCAL_HEALTH`] when they fail (memberlist's `health.score`).
    pub fn local_health(&self) -> u32 {
        self.local_health
    }

    fn about_ourselves(&self, n: &OwnedNotification<Member>) -> bool {
        let me = self.identity().addr;
        match n {
            OwnedNotification::MemberUp(id)
            | OwnedNotification::MemberDown(id)
            | OwnedNotification::Rename(_, id) => id.addr == me,
            _ => false,
        }
    }

    fn log_error(&self, call: &'static str, result: Result<(), foca::Error>) {
        // Mostly benign: stray or stale packets, a member we do not know any more.
        if let Err(e) = result {
            tracing::debug!(call, error = %e, "foca");
        }
    }
}

/// Whether two addresses are one socket, an IPv4 address and its IPv4-mapped IPv6 form alike
/// (what a dual-stack socket reports).
fn same_host_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
}

/// A keyring packet: the kind byte and the message.
fn key_packet(message: &KeyMessage) -> Vec<u8> {
    postcard::to_extend(message, vec![KIND_KEY])
        .expect("postcard encodes a keyring message into a Vec")
}

#[cfg(test)]
mod tests;
