//! The gossip identity: what a member *is* on the SWIM layer (name, gossip and RPC addresses,
//! role, datacenter) plus a `generation` that orders restarts of the same address. It rides in
//! every packet (twice in each header, once per member update), so it stays small and only holds
//! things that change by restarting. On the wire it is a hand-written, versioned byte string
//! (about 37 bytes for a short name): compact, and cheap to decode, which matters because every
//! received packet decodes several of them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};

/// One member's identity on the gossip layer.
///
/// foca keys members by [`foca::Identity::addr`] (the gossip address). Two identities with the
/// same address are the same node at different times; the higher `generation` is the newer one.
/// `protocol` is not part of the identity (`==` and the hash leave it out): a member of the
/// first release relays a newer member's identity without it, and that copy must still be the
/// same identity, or foca would drop the probes addressed to it and the first release's members
/// would declare the newer one down.
#[derive(Debug, Clone)]
pub struct Member {
    // Field order matters for speed only: the derived `==` (which foca uses a lot) compares the
    // cheap and most telling fields first.
    /// Gossip address: where this member's SWIM packets go, and its key in foca.
    pub addr: SocketAddr,
    /// Orders identities that share `addr`: starts at the wall clock in ms when the gossip
    /// subsystem starts (so a restart beats the identity from before the crash) and grows by
    /// one each time foca renews us after the cluster declared us down.
    pub generation: u64,
    /// Node name (the catalog's node name). `Arc<str>`, like `datacenter`, because foca clones
    /// identities all the time.
    pub name: Arc<str>,
    /// RPC address (servers answer RPC on it); lets agents find servers through gossip.
    pub rpc_addr: SocketAddr,
    pub role: MemberRole,
    /// Members of another datacenter are ignored (never reported, never counted).
    pub datacenter: Arc<str>,
    /// The state-machine protocol level this member's build applies
    /// ([`vigil_shared::PROTOCOL`]); the leader raises the cluster's level once every server
    /// has it. The first release sent none: it reads as [`FIRST_PROTOCOL`].
    pub protocol: u8,
}

/// The protocol level of a member whose identity carries none (the first release).
pub const FIRST_PROTOCOL: u8 = 1;

impl PartialEq for Member {
    fn eq(&self, other: &Member) -> bool {
        self.addr == other.addr
            && self.generation == other.generation
            && self.name == other.name
            && self.rpc_addr == other.rpc_addr
            && self.role == other.role
            && self.datacenter == other.datacenter
    }
}

impl Eq for Member {}

impl std::hash::Hash for Member {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.addr.hash(state);
        self.generation.hash(state);
        self.name.hash(state);
        self.rpc_addr.hash(state);
        self.role.hash(state);
        self.datacenter.hash(state);
    }
}

/// Version byte of the identity encoding. Version 1 decoders ignore trailing bytes, so later
/// versions may append fields.
const WIRE_VERSION: u8 = 1;
/// Longest node name or datacenter name the identity encoding carries.
pub const MAX_NAME_LEN: usize = u8::MAX as usize;
/// Longest encoding: version, generation, role, two IPv6 socket addresses, two names, the
/// protocol level.
const MAX_WIRE_LEN: usize = 1 + 8 + 1 + 2 * (1 + 16 + 2) + 2 * (1 + MAX_NAME_LEN) + 1;

/// The last generation handed out in this process, so two starts within the same millisecond
/// (tests restarting an instance on the same port) still get increasing generations.
static LAST_GENERATION: AtomicU64 = AtomicU64::new(0);

/// A generation for an identity created now: wall-clock ms, strictly increasing per process.
pub fn fresh_generation() -> u64 {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let mut last = LAST_GENERATION.load(Ordering::Relaxed);
    loop {
        let next = now_ms.max(last.saturating_add(1));
        match LAST_GENERATION.compare_exchange_weak(
            last,
            next,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

impl Member {
    /// A new identity with a fresh generation (see [`fresh_generation`]).
    pub fn new(
        name: impl Into<Arc<str>>,
        addr: SocketAddr,
        rpc_addr: SocketAddr,
        role: MemberRole,
        datacenter: impl Into<Arc<str>>,
    ) -> Self {
        Member {
            name: name.into(),
            addr,
            rpc_addr,
            role,
            datacenter: datacenter.into(),
            generation: fresh_generation(),
            protocol: vigil_shared::PROTOCOL as u8,
        }
    }

    /// A stand-in for a peer we only know by gossip address (a join address). foca accepts an
    /// `Announce` whose destination has the right *address*, whatever the rest says, so this is
    /// enough to announce to a seed.
    pub(crate) fn placeholder(addr: SocketAddr, datacenter: &str) -> Self {
        Member {
            name: Arc::from(""),
            addr,
            rpc_addr: addr,
            role: MemberRole::Client,
            datacenter: Arc::from(datacenter),
            generation: 0,
            protocol: FIRST_PROTOCOL,
        }
    }

    /// This identity as a member-list row in `state`.
    pub fn status(&self, state: MemberState) -> MemberStatus {
        MemberStatus {
            name: self.name.to_string(),
            gossip_addr: self.addr,
            rpc_addr: self.rpc_addr,
            role: self.role,
            datacenter: self.datacenter.to_string(),
            state,
            pruned: false,
            protocol: u32::from(self.protocol),
        }
    }

    /// Total order used only to break a tie between two different identities with the same
    /// address and generation (a misconfiguration), so exactly one of them wins.
    fn tiebreak(&self) -> (&str, SocketAddr, &str, u8) {
        let role = match self.role {
            MemberRole::Server => 1,
            MemberRole::Client => 0,
        };
        (&self.name, self.rpc_addr, &self.datacenter, role)
    }
}

impl foca::Identity for Member {
    type Addr = SocketAddr;

    /// Declared down while still running (e.g. after a partition): come back as the next
    /// generation, which wins the address conflict against the identity the cluster buried.
    fn renew(&self) -> Option<Self> {
        let generation = self.generation.checked_add(1)?;
        Some(Member {
            generation,
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The higher generation wins.
    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        match self.generation.cmp(&adversary.generation) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => self.tiebreak() > adversary.tiebreak(),
        }
    }
}

/// Why an identity did not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated gossip identity")]
    Truncated,
    #[error("unknown gossip identity version {0}")]
    Version(u8),
    #[error("unknown address family {0} in gossip identity")]
    Family(u8),
    #[error("unknown role {0} in gossip identity")]
    Role(u8),
    #[error("gossip identity name is not UTF-8")]
    Utf8,
}

/// Writes the wire form into a stack buffer: `version | generation (u64 LE) | role | addr |
/// rpc_addr | name_len | name | dc_len | dc | protocol`, an address being `4|6 | ip | port
/// (u16 LE)`. `protocol` was appended after the first release, whose decoder ignores it.
struct WireBuf<'a> {
    buf: &'a mut [u8; MAX_WIRE_LEN],
    len: usize,
}

impl WireBuf<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn put_addr(&mut self, addr: &SocketAddr) {
        match addr {
            SocketAddr::V4(a) => {
                self.put(&[4]);
                self.put(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                self.put(&[6]);
                self.put(&a.ip().octets());
            }
        }
        self.put(&addr.port().to_le_bytes());
    }

    /// Names longer than [`MAX_NAME_LEN`] are refused when gossip starts; cut defensively.
    fn put_name(&mut self, name: &str) {
        let bytes = &name.as_bytes()[..name.len().min(MAX_NAME_LEN)];
        self.put(&[bytes.len() as u8]);
        self.put(bytes);
    }
}

/// Reads the wire form.
struct WireReader<'a>(&'a [u8]);

impl<'a> WireReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn addr(&mut self) -> Result<SocketAddr, WireError> {
        let ip: std::net::IpAddr = match self.byte()? {
            4 => {
                let b = self.take(4)?;
                std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).into()
            }
            6 => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(self.take(16)?);
                std::net::Ipv6Addr::from(octets).into()
            }
            other => return Err(WireError::Family(other)),
        };
        let p = self.take(2)?;
        Ok(SocketAddr::new(ip, u16::from_le_bytes([p[0], p[1]])))
    }

    fn name(&mut self) -> Result<Arc<str>, WireError> {
        let len = usize::from(self.byte()?);
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(Arc::from)
            .map_err(|_| WireError::Utf8)
    }
}

impl Member {
    /// Writes the wire form into `buf` and returns its length.
    fn to_wire(&self, buf: &mut [u8; MAX_WIRE_LEN]) -> usize {
        let mut w = WireBuf { buf, len: 0 };
        w.put(&[WIRE_VERSION]);
        w.put(&self.generation.to_le_bytes());
        w.put(&[match self.role {
            MemberRole::Client => 0,
            MemberRole::Server => 1,
        }]);
        w.put_addr(&self.addr);
        w.put_addr(&self.rpc_addr);
        w.put_name(&self.name);
        w.put_name(&self.datacenter);
        w.put(&[self.protocol]);
        w.len
    }

    fn from_wire(bytes: &[u8]) -> Result<Member, WireError> {
        let mut r = WireReader(bytes);
        let version = r.byte()?;
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        let mut generation = [0u8; 8];
        generation.copy_from_slice(r.take(8)?);
        let generation = u64::from_le_bytes(generation);
        let role = match r.byte()? {
            0 => MemberRole::Client,
            1 => MemberRole::Server,
            other => return Err(WireError::Role(other)),
        };
        let addr = r.addr()?;
        let rpc_addr = r.addr()?;
        let name = r.name()?;
        let datacenter = r.name()?;
        let protocol = r.byte().unwrap_or(FIRST_PROTOCOL);
        Ok(Member {
            name,
            addr,
            rpc_addr,
            role,
            datacenter,
            generation,
            protocol,
        })
    }
}

/// The datacenter of the identity that starts `packet` (a postcard-encoded identity: a varint
/// length, then the wire form), read without decoding the rest: lets a node drop packets from
/// other datacenters before paying for a full decode. None if it does not parse.
pub fn peek_datacenter(packet: &[u8]) -> Option<&[u8]> {
    // postcard's varint length prefix: 7 bits per byte, high bit set on all but the last.
    let mut len = 0usize;
    let mut at = 0;
    loop {
        let byte = *packet.get(at)?;
        len |= usize::from(byte & 0x7f) << (7 * at);
        at += 1;
        if byte & 0x80 == 0 {
            break;
        }
        if at >= 3 {
            return None;
        }
    }
    let mut r = WireReader(packet.get(at..at.checked_add(len)?)?);
    if r.byte().ok()? != WIRE_VERSION {
        return None;
    }
    r.take(8 + 1).ok()?;
    for _ in 0..2 {
        let ip_len = match r.byte().ok()? {
            4 => 4,
            6 => 16,
            _ => return None,
        };
        r.take(ip_len + 2).ok()?;
    }
    let name_len = usize::from(r.byte().ok()?);
    r.take(name_len).ok()?;
    let dc_len = usize::from(r.byte().ok()?);
    r.take(dc_len).ok()
}

impl Serialize for Member {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; MAX_WIRE_LEN];
        let len = self.to_wire(&mut buf);
        serializer.serialize_bytes(&buf[..len])
    }
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Member, D::Error> {
        struct WireVisitor;
        impl Visitor<'_> for WireVisitor {
            type Value = Member;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a gossip identity")
            }

            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Member, E> {
                Member::from_wire(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_bytes(WireVisitor)
    }
}

#[cfg(test)]
mod tests {
    use foca::Identity as _;

    use super::*;

    fn member(generation: u64) -> Member {
        Member {
            name: "n1".into(),
            addr: "127.0.0.1:8301".parse().unwrap(),
            rpc_addr: "127.0.0.1:8300".parse().unwrap(),
            role: MemberRole::Server,
            datacenter: "dc1".into(),
            generation,
            protocol: 2,
        }
    }

    #[test]
    fn renew_bumps_generation_and_wins() {
        let old = member(7);
        let new = old.renew().expect("renewable");
        assert_eq!(new.generation, 8);
        assert_eq!(new.addr(), old.addr());
        assert_eq!(new.name, old.name);
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
    }

    #[test]
    fn renew_at_the_end_of_the_range_gives_up() {
        assert_eq!(member(u64::MAX).renew(), None);
    }

    #[test]
    fn higher_generation_wins_whatever_else_differs() {
        let restarted = Member {
            name: "a-renamed".into(),
            ..member(100)
        };
        let before = member(99);
        assert!(restarted.win_addr_conflict(&before));
        assert!(!before.win_addr_conflict(&restarted));
    }

    #[test]
    fn equal_generations_have_exactly_one_winner() {
        let a = member(5);
        let b = Member {
            name: "n2".into(),
            ..member(5)
        };
        assert_ne!(a.win_addr_conflict(&b), b.win_addr_conflict(&a));
    }

    #[test]
    fn fresh_generations_increase_and_follow_the_clock() {
        let a = fresh_generation();
        let b = fresh_generation();
        assert!(b > a);
        // Milliseconds since 1970: far above anything a renew chain reaches.
        assert!(a > 1_600_000_000_000);
    }

    #[test]
    fn identity_stays_small_on_the_wire() {
        let bytes = postcard::to_allocvec(&member(fresh_generation())).unwrap();
        assert!(bytes.len() <= 40, "identity is {} bytes", bytes.len());
    }

    #[test]
    fn wire_form_round_trips_v4_and_v6() {
        let v4 = member(fresh_generation());
        let bytes = postcard::to_allocvec(&v4).unwrap();
        assert_eq!(postcard::from_bytes::<Member>(&bytes).unwrap(), v4);

        let v6 = Member {
            name: "ü-node".repeat(36).into(), // 252 bytes of UTF-8
            addr: "[::1]:8301".parse().unwrap(),
            rpc_addr: "[fe80::1]:8300".parse().unwrap(),
            role: MemberRole::Client,
            datacenter: "eu-west".into(),
            generation: u64::MAX,
            protocol: 7,
        };
        let bytes = postcard::to_allocvec(&v6).unwrap();
        assert_eq!(postcard::from_bytes::<Member>(&bytes).unwrap(), v6);
    }

    #[test]
    fn the_datacenter_can_be_read_without_decoding() {
        let mut packet = postcard::to_allocvec(&member(42)).unwrap();
        packet.extend_from_slice(b"rest of the packet");
        assert_eq!(peek_datacenter(&packet), Some(&b"dc1"[..]));
        let long = Member {
            name: "x".repeat(200).into(), // a two-byte length prefix
            ..member(1)
        };
        let packet = postcard::to_allocvec(&long).unwrap();
        assert_eq!(peek_datacenter(&packet), Some(&b"dc1"[..]));
        assert_eq!(peek_datacenter(&packet[..packet.len() - 1]), None);
        assert_eq!(peek_datacenter(&[]), None);
    }

    #[test]
    fn bad_wire_forms_are_errors() {
        let mut buf = [0u8; MAX_WIRE_LEN];
        let len = member(1).to_wire(&mut buf);
        let good = &buf[..len];
        // Cut inside the datacenter name (the protocol level after it may be missing).
        assert_eq!(
            Member::from_wire(&good[..good.len() - 2]),
            Err(WireError::Truncated)
        );
        let mut bad = good.to_vec();
        bad[0] = 9;
        assert_eq!(Member::from_wire(&bad), Err(WireError::Version(9)));
        let mut bad = good.to_vec();
        bad[9] = 7;
        assert_eq!(Member::from_wire(&bad), Err(WireError::Role(7)));
        let mut bad = good.to_vec();
        bad[10] = 5;
        assert_eq!(Member::from_wire(&bad), Err(WireError::Family(5)));
        // Fields appended by a later version are ignored.
        let mut longer = good.to_vec();
        longer.extend_from_slice(b"future");
        assert_eq!(Member::from_wire(&longer), Ok(member(1)));
        // The first release's identity has no protocol level.
        let first = &good[..good.len() - 1];
        let decoded = Member::from_wire(first).expect("decodes");
        assert_eq!(decoded.protocol, FIRST_PROTOCOL);
        assert_eq!(member(1).protocol, 2);
        // It is the same identity as the one it was relayed from: foca takes a probe addressed
        // to either as addressed to the member.
        assert_eq!(decoded, member(1));
        use std::hash::BuildHasher as _;
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(state.hash_one(&decoded), state.hash_one(member(1)));
    }
}
