//! The indirect-probe bookkeeping around foca, driven through the node's packet and timer
//! entry points: a probe round of ours (the `Ping` and `PingReq`s foca sends, noted as the node
//! notes them), nacks and acks as they arrive, and foca's failure verdict for the round.

use std::net::IpAddr;

use vigil_shared::catalog::MemberRole;

use super::*;

const PROBE: ProbeNumber = 7;

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

/// Node 0, which probes node 3 and asks nodes 1 and 2 to probe it indirectly.
struct Asker {
    node: GossipNode,
}

impl Asker {
    fn new() -> Asker {
        Asker {
            node: GossipNode::new(member(0), &[], TimingProfile::Lan, StdRng::seed_from_u64(0)),
        }
    }

    /// Our probe `PROBE` of node 3 begins at `now`, and nodes 1 and 2 are asked to help.
    fn probe(&mut self, now: Duration) {
        let mut out = Output::default();
        self.node
            .note_probe_sent(&member(3), &Message::Ping(PROBE), now, &mut out);
        for forwarder in [1, 2] {
            let ask = Message::PingReq {
                target: member(3),
                probe_number: PROBE,
            };
            self.node
                .note_probe_sent(&member(forwarder), &ask, now, &mut out);
        }
    }

    /// A nack from `from` about node 3, arriving from `source`.
    fn nack(&mut self, from: u8, source: SocketAddr, now: Duration) {
        let nack = Nack {
            from: addr(from),
            target: addr(3),
            probe: PROBE,
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
    let at = Duration::from_millis(900);

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
    asker.nack(2, addr(2), Duration::from_millis(900));
    assert_eq!(asker.nacked(), BTreeSet::from([addr(2)]));
}
