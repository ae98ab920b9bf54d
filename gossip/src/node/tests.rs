//! The indirect-probe bookkeeping around foca, driven through the node's packet and timer
//! entry points: a probe round of ours (the `Ping` and `PingReq`s foca sends, noted as the node
//! notes them), nacks and acks as they arrive, and foca's failure verdict for the round.

use std::net::IpAddr;

use foca::Runtime as _;
use vigil_shared::catalog::MemberRole;

use super::*;

const PROBE: ProbeNumber = 7;

/// The `Lan` probe period: foca's verdict on a probe comes this long after it began.
fn period() -> Duration {
    TimingProfile::Lan.probe_period()
}

/// Late in a probe round begun at `start`, when its nacks come: past the direct probe's
/// deadline, before the verdict.
fn late_in_round(start: Duration) -> Duration {
    start + period().mul_f64(0.9)
}

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i], 8301))
}

fn member(i: u8) -> Member {
    Member::new(
        format!("node-{i}"),
        addr(i),
        SocketAddr::from(([10, 0, 0, i], 8300)),
        MemberRole::Client,
        "dc1",
    )
}

/// Node 0, which probes node 3 and asks nodes 1, 2 and 4 to probe it indirectly.
struct Asker {
    node: GossipNode,
}

impl Asker {
    fn new() -> Asker {
        Asker {
            node: GossipNode::new(member(0), &[], TimingProfile::Lan, StdRng::seed_from_u64(0)),
        }
    }

    /// Our probe `probe` of node 3 begins at `now`, and nodes 1, 2 and 4 are asked to help.
    fn probe_numbered(&mut self, probe: ProbeNumber, now: Duration) {
        let mut out = Output::default();
        self.node
            .note_probe_sent(&member(3), &Message::Ping(probe), now, &mut out);
        for forwarder in [1, 2, 4] {
            let ask = Message::PingReq {
                target: member(3),
                probe_number: probe,
            };
            self.node
                .note_probe_sent(&member(forwarder), &ask, now, &mut out);
        }
    }

    fn probe(&mut self, now: Duration) {
        self.probe_numbered(PROBE, now);
    }

    /// foca declares our probe of node 3 failed: the suspicion timer it schedules.
    fn fail(&mut self, now: Duration) {
        let timer = Timer::ChangeSuspectToDown {
            member_id: member(3),
            incarnation: Incarnation::default(),
            token: 0,
        };
        let after = self.node.profile.suspicion_timeout(5, 0);
        self.node.runtime.submit_after(timer, after);
        self.node.settle(now);
    }

    /// Node 3's answer to probe `probe`, forwarded by `via`.
    fn forwarded_ack(&mut self, via: u8, probe: ProbeNumber, now: Duration) {
        let header = Header {
            src: member(via),
            src_incarnation: Incarnation::default(),
            dst: self.node.identity().clone(),
            message: Message::ForwardedAck {
                origin: member(3),
                probe_number: probe,
            },
        };
        let mut packet = postcard::to_extend(&header, vec![KIND_SWIM]).unwrap();
        packet.extend_from_slice(&0u16.to_be_bytes());
        let sealed = self.node.seal(&packet);
        self.node.handle_packet(&sealed, addr(via), now).unwrap();
    }

    /// The members confirming our suspicion of node 3.
    fn confirmations(&self) -> BTreeSet<SocketAddr> {
        self.node.suspecting[&addr(3)].confirmations.clone()
    }

    /// A nack from `from` about node 3, arriving from `source`.
    fn nack(&mut self, from: u8, source: SocketAddr, now: Duration) {
        self.nack_numbered(from, PROBE, source, now);
    }

    fn nack_numbered(&mut self, from: u8, probe: ProbeNumber, source: SocketAddr, now: Duration) {
        let nack = Nack {
            from: addr(from),
            target: addr(3),
            probe,
        };
        let packet = postcard::to_extend(&nack, vec![KIND_NACK]).unwrap();
        let sealed = self.node.seal(&packet);
        self.node.handle_packet(&sealed, source, now).unwrap();
    }

    /// Who nacked the current round.
    fn nacked(&self) -> BTreeSet<SocketAddr> {
        self.node.probes[&addr(3)].nacked.clone()
    }
}

#[test]
fn a_nack_counts_only_from_its_senders_own_address() {
    let mut asker = Asker::new();
    asker.probe(Duration::ZERO);
    let at = late_in_round(Duration::ZERO);

    // Phase 1: a packet claiming to be node 1's nack, sent from node 2's address.
    asker.nack(1, addr(2), at);
    assert!(asker.nacked().is_empty());

    // Phase 2: node 1's nack from node 1, also as a dual-stack socket reports it.
    let mapped = SocketAddr::new(
        match addr(1).ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().into(),
            v6 => v6,
        },
        addr(1).port(),
    );
    asker.nack(1, mapped, at);
    assert_eq!(asker.nacked(), BTreeSet::from([addr(1)]));
}

#[test]
fn a_nack_after_its_round_is_over_does_not_count() {
    let mut asker = Asker::new();
    asker.probe(Duration::ZERO);

    // Phase 1: long after the round (its probe number comes round again every 256 probes), a
    // nack with the round's number is an old round's.
    asker.nack(1, addr(1), Duration::from_secs(300));
    assert!(asker.nacked().is_empty());

    // Phase 2: within the round it counts.
    asker.nack(2, addr(2), late_in_round(Duration::ZERO));
    assert_eq!(asker.nacked(), BTreeSet::from([addr(2)]));
}

#[test]
fn nacks_of_a_round_the_target_answered_confirm_nothing() {
    let mut asker = Asker::new();
    let period = period();

    // Phase 1: our first probe fails, nobody nacks: a suspicion nobody confirms.
    asker.probe_numbered(PROBE, Duration::ZERO);
    asker.fail(period);
    assert!(asker.confirmations().is_empty());

    // Phase 2: in the next probe of the suspect, node 1 nacks before node 2's forwarded ack
    // comes: the target answered this round, so node 1's nack is taken back.
    let next = PROBE + 1;
    asker.probe_numbered(next, period * 2);
    asker.nack_numbered(1, next, addr(1), late_in_round(period * 2));
    assert_eq!(asker.confirmations(), BTreeSet::from([addr(1)]));
    asker.forwarded_ack(
        2,
        next,
        late_in_round(period * 2) + Duration::from_millis(10),
    );
    assert!(asker.confirmations().is_empty());

    // Phase 3: node 4's nack, after the ack, counts neither.
    asker.nack_numbered(
        4,
        next,
        addr(4),
        late_in_round(period * 2) + Duration::from_millis(20),
    );
    assert!(asker.confirmations().is_empty());
}

/// A SWIM packet from `from` to `node`, sealed as `node` opens it.
fn swim(node: &GossipNode, from: u8, message: Message<Member>) -> Vec<u8> {
    let header = Header {
        src: member(from),
        src_incarnation: Incarnation::default(),
        dst: node.identity().clone(),
        message,
    };
    let mut packet = postcard::to_extend(&header, vec![KIND_SWIM]).unwrap();
    packet.extend_from_slice(&0u16.to_be_bytes());
    node.seal(&packet)
}

/// Node 0 asks `forwarder` to probe node 3 (probe `probe`) at `now`; the nack timer it arms.
fn ask_to_forward(forwarder: &mut GossipNode, probe: ProbeNumber, now: Duration) -> NodeTimer {
    let ask = Message::PingReq {
        target: member(3),
        probe_number: probe,
    };
    let packet = swim(forwarder, 0, ask);
    let out = forwarder.handle_packet(&packet, addr(0), now).unwrap();
    assert!(
        out.sends.iter().any(|(to, _)| *to == addr(3)),
        "probes node 3"
    );
    let (after, timer) = out
        .timers
        .into_iter()
        .find(|(_, timer)| matches!(timer, NodeTimer::Nack(_)))
        .expect("a nack timer");
    assert_eq!(after, TimingProfile::Lan.nack_after());
    timer
}

fn nacks_sent(out: &Output) -> usize {
    out.sends
        .iter()
        .filter(|(to, packet)| *to == addr(0) && packet.first() == Some(&KIND_NACK))
        .count()
}

#[test]
fn a_forwarder_resumed_after_a_stall_does_not_nack_for_it() {
    let mut forwarder =
        GossipNode::new(member(1), &[], TimingProfile::Lan, StdRng::seed_from_u64(1));
    let nack_after = TimingProfile::Lan.nack_after();

    // Phase 1: the target stays silent and the timer fires on time: a nack.
    let start = Duration::from_secs(1);
    let timer = ask_to_forward(&mut forwarder, PROBE, start);
    let out = forwarder.handle_timer(timer, start + nack_after);
    assert_eq!(nacks_sent(&out), 1);

    // Phase 2: stopped for 2 s right after forwarding, the forwarder resumes with the overdue
    // timer first and the target's answer still unread: no nack.
    let start = Duration::from_secs(5);
    let timer = ask_to_forward(&mut forwarder, PROBE + 1, start);
    let out = forwarder.handle_timer(timer, start + Duration::from_secs(2));
    assert_eq!(nacks_sent(&out), 0);
}

#[test]
fn a_nack_read_after_the_verdict_still_spares_our_health() {
    let mut asker = Asker::new();
    let period = period();

    // Phase 1: a nack before foca's verdict: the failure is the target's, our health holds.
    asker.probe_numbered(PROBE, Duration::ZERO);
    asker.nack_numbered(1, PROBE, addr(1), late_in_round(Duration::ZERO));
    asker.fail(period);
    assert_eq!(asker.node.local_health(), 0);

    // Phase 2: with our health already down to 3, the next round's verdict comes before its
    // nack (sent late, or read late by a stalled asker): the point it cost comes back when the
    // nack is read, and only once.
    asker.node.local_health = 3;
    let next = PROBE + 1;
    asker.probe_numbered(next, period * 2);
    asker.fail(period * 3);
    assert_eq!(asker.node.local_health(), 4);
    asker.nack_numbered(1, next, addr(1), period * 3 + Duration::from_millis(10));
    assert_eq!(asker.node.local_health(), 3);
    asker.nack_numbered(2, next, addr(2), period * 3 + Duration::from_millis(20));
    assert_eq!(asker.node.local_health(), 3);
}
