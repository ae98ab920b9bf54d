//! Named gossip timing profiles: every SWIM and driver number in one place, each with its reason.
//! `Lan` is for real deployments (memberlist's `DefaultLANConfig` numbers, as foca's
//! `Config::new_lan`, with faster probes), `Local` is for loopback tests and simulations.
//! Nothing else in the gossip subsystem hard-codes a duration.

use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{Config, PeriodicParams};

use super::crypto::MAX_OVERHEAD;

/// Largest UDP payload we send: below a 1500-byte Ethernet MTU minus IP/UDP headers with room
/// for tunnels (the same budget as memberlist and foca's presets).
pub const UDP_PAYLOAD_BUDGET: usize = 1400;

/// Largest foca packet: the UDP budget minus the envelope and the packet-kind byte. foca
/// enforces it on what it produces and on what it accepts.
pub const MAX_PACKET: usize = UDP_PAYLOAD_BUDGET - MAX_OVERHEAD - 1;

/// How many independent confirmations bring a suspicion down to its minimum (memberlist's
/// `SuspicionMult − 2` with its default multiplier of 4).
const SUSPICION_CONFIRMATIONS: usize = 2;

/// A gossip timing profile. Both profiles scale dissemination and suspicion with the cluster size
/// (see [`TimingProfile::foca_config`]) the way memberlist does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingProfile {
    /// Real networks. memberlist's LAN defaults (what Consul runs with), with probes two and a
    /// half times as often so that a silent member is declared within about 3 s:
    ///
    /// * probe every **400 ms** (memberlist: 1 s), direct-ack deadline (`probe_rtt`) **200 ms**
    ///   (memberlist: 500 ms): a LAN p99 RTT is far below 200 ms, and the rest of the period is
    ///   the indirect-probe window. Five members exchange about 25 probe packets a second in all.
    /// * suspicion **4 s × max(1, log10 n)** (memberlist's: 10 probe periods here, 4 of its
    ///   1 s periods there), shrinking to **2.2 s × max(1, log10 n)** as independent members
    ///   confirm it (see [`TimingProfile::suspicion_timeout`]): a member that is stopped
    ///   (SIGSTOP, GC pause, VM migration) for 2 s resumes at least 0.4 s before the earliest
    ///   verdict and refutes on the first suspicion nudge it reads (see `node`): it is *not*
    ///   reported failed. A crash is seen Failed by every member of a 10-node cluster ≈ 3 s
    ///   after it happens (simulated).
    /// * each update piggybacked **4 × ceil(log10(n + 1))** times (4 / 8 / 12 below 10 / 100 /
    ///   1000 members).
    /// * gossip every **200 ms** to 3 members: spreads updates in a few hops without
    ///   noticeable bandwidth (periodic gossip is skipped when nothing is pending).
    /// * full-state sync with one random live member every **30 s** (memberlist's push-pull):
    ///   repairs what bounded piggybacking missed.
    /// * periodic announce every **30 s** to 1 member: slowly completes everyone's roster.
    /// * announce to down members every **30 s** (serf's reconnect interval; foca's preset is
    ///   65 s): how two sides of a healed partition find each other again.
    /// * remember down members **24 h** (`remove_down_after`, serf's tombstone time): rejoin never
    ///   waits for it, because a restarted node comes back with a higher generation that wins the
    ///   address conflict; it only bounds how long partitions heal through announce-to-down.
    /// * while not connected, re-announce to the join list every **3 s** (retry-join); while
    ///   connected, every **30 s** to join addresses that are not members.
    /// * a graceful leave lingers at most **2 s** so the leave reaches enough members.
    /// * a node name whose holder failed or left is held for it **5 s** before another member
    ///   (a restart of that node at another address) may take it: time for the leader to see
    ///   the departure and invalidate the old process's sessions.
    Lan,
    /// Loopback tests and simulations: the same shape, probes twice as often as `Lan` and a
    /// fixed suspicion four times shorter, still with margins a busy 2-core CI machine needs.
    ///
    /// * probe every **200 ms**, `probe_rtt` **100 ms**: loopback RTT is microseconds, so 100 ms
    ///   only has to absorb scheduler delays of a loaded test machine.
    /// * suspicion **1 s × max(1, log10 n)** (5 probe periods; 2 s at 100 members): a crash is
    ///   reported in ~1.5 s on loopback, yet a scheduler stall of most of a second is refuted.
    /// * each update piggybacked as in `Lan`; gossip every **200 ms** to 3 members (once per
    ///   probe period); full-state sync every **2 s**; periodic announce every **5 s**.
    /// * announce to down members every **2 s**: a healed partition merges within seconds.
    /// * remember down members **5 min**: longer than any test, so Failed/Left stay visible.
    /// * re-announce while not connected every **1 s**; to missing join addresses every **2 s**.
    /// * a graceful leave lingers at most **500 ms**; a departed holder keeps its name **1 s**.
    Local,
}

impl TimingProfile {
    /// How often a random member is probed.
    pub fn probe_period(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_millis(400),
            TimingProfile::Local => Duration::from_millis(200),
        }
    }

    /// How long a direct probe waits for its ack before asking others to probe indirectly.
    pub fn probe_rtt(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_millis(200),
            TimingProfile::Local => Duration::from_millis(100),
        }
    }

    /// Suspicion multiplier, in probe periods (memberlist's `SuspicionMult`).
    fn suspicion_mult(self) -> f64 {
        match self {
            TimingProfile::Lan => 10.0,
            TimingProfile::Local => 5.0,
        }
    }

    /// How long a suspect member has to refute before it is declared down, for `cluster_size`
    /// members: `mult × max(1, log10 n) × probe_period` (memberlist's `suspicionTimeout`).
    pub fn suspect_to_down_after(self, cluster_size: usize) -> Duration {
        let n = cluster_size.max(1) as f64;
        self.probe_period()
            .mul_f64(self.suspicion_mult() * n.log10().max(1.0))
    }

    /// The shortest a suspicion may last once enough members confirmed it, in probe periods:
    /// what a member stopped right as a probe of it started (so suspected one probe period
    /// later) must still have to refute, after the stop the profile tolerates.
    ///
    /// * `Lan`: **5.5** (2.2 s): a nack proves the target silent only from the moment the
    ///   indirect probe reached it, up to `probe_rtt` (0.2 s) after the direct probe began
    ///   (whose ack may have been lost, or left unread by a starved agent), so a 2 s stop
    ///   resumes at most 2.2 s after the failed probe started; the suspicion ends a probe
    ///   period (0.4 s) plus this minimum after it, 2.6 s at the earliest: 0.4 s to be
    ///   scheduled again, read the nudges queued while stopped and refute straight to each
    ///   suspecter (milliseconds on a LAN).
    /// * `Local`: **5**, as the maximum: loopback tests keep a fixed suspicion.
    fn suspicion_min_mult(self) -> f64 {
        match self {
            TimingProfile::Lan => 5.5,
            TimingProfile::Local => 5.0,
        }
    }

    /// Lifeguard's dynamic suspicion (memberlist's `suspicion.go`): a suspicion we start
    /// lasts [`TimingProfile::suspect_to_down_after`] without confirmation and shrinks towards
    /// `suspicion_min_mult × max(1, log10 n) × probe_period` as `confirmations` independent
    /// members confirm it, `max − (max − min) × ln(c + 1) / ln(k + 1)`, floored at the
    /// minimum, with `k = min(2, n − 2)` confirmations expected (memberlist's
    /// `SuspicionMult − 2`). With nobody to confirm (`k = 0`, two members) it stays at the
    /// maximum: memberlist's minimum is its usual timeout, ours is shorter than that.
    pub fn suspicion_timeout(self, cluster_size: usize, confirmations: usize) -> Duration {
        let max = self.suspect_to_down_after(cluster_size);
        let n = cluster_size.max(1) as f64;
        let min = self
            .probe_period()
            .mul_f64(self.suspicion_min_mult() * n.log10().max(1.0))
            .min(max);
        let k = SUSPICION_CONFIRMATIONS.min(cluster_size.saturating_sub(2));
        if k == 0 {
            return max;
        }
        let c = confirmations.min(k) as f64;
        let frac = (c + 1.0).ln() / (k as f64 + 1.0).ln();
        max.saturating_sub((max - min).mul_f64(frac)).max(min)
    }

    /// How long a member that forwarded an indirect probe waits for the target's answer before
    /// it tells the asker that it got none (a nack, memberlist's `nackResp`): within the
    /// asker's indirect window (`probe_period − probe_rtt`), with room for the way back.
    pub fn nack_after(self) -> Duration {
        self.probe_rtt().mul_f64(0.8)
    }

    /// How many times each update is piggybacked: `4 × ceil(log10(n + 1))`, memberlist's
    /// `RetransmitMult` 4 with its rounding: 4 below 10 members, 8 below 100, 12 below 1000.
    /// foca's preset rounds down instead, which gives 2 at n = 3 and 4 at n = 10: in the
    /// simulator that left a crash unknown to some member of a 10-node cluster for up to ~15 s.
    pub fn max_transmissions(cluster_size: usize) -> NonZeroU8 {
        let hops = ((cluster_size as f64) + 1.0).log10().ceil().max(1.0);
        let tx = (4.0 * hops).min(f64::from(u8::MAX)) as u8;
        NonZeroU8::new(tx).unwrap_or(NonZeroU8::MIN)
    }

    /// How long down members are remembered (foca's `remove_down_after`; the member list drops
    /// Failed/Left rows after the same time).
    pub fn reap_after(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(24 * 3600),
            TimingProfile::Local => Duration::from_secs(300),
        }
    }

    /// The driver's housekeeping tick: re-announce decisions, reaping, leave lingering. Equal to
    /// `probe_rtt`, fine enough for every interval below.
    pub fn tick_interval(self) -> Duration {
        self.probe_rtt()
    }

    /// While foca is not connected: announce to the join list and known members this often.
    /// This is retry-join, and what heals a full partition
    /// (docs/architecture.md#rejoining-after-a-partition).
    pub fn reannounce_interval(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(3),
            TimingProfile::Local => Duration::from_secs(1),
        }
    }

    /// While connected: announce to join addresses that are not members this often, so a
    /// cluster split for longer than `reap_after` (when announce-to-down has forgotten the
    /// other side) still merges through its seeds.
    pub fn seed_check_interval(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(30),
            TimingProfile::Local => Duration::from_secs(2),
        }
    }

    /// How often a connected member exchanges its full membership state with one live member
    /// (memberlist's push-pull): closes the gaps SWIM's bounded piggybacking leaves.
    pub fn sync_interval(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(30),
            TimingProfile::Local => Duration::from_secs(2),
        }
    }

    /// Longest time a graceful leave keeps the loop running so the leave goes out.
    pub fn leave_linger(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(2),
            TimingProfile::Local => Duration::from_millis(500),
        }
    }

    /// How long a node name stays with a holder that failed or left before another member at
    /// another address may take it (memberlist's `DeadNodeReclaimTime`, which Consul sets to
    /// 30 s; ours only has to outlast the leader's reaction, since a member wrongly declared
    /// down comes back at its own address, not as a rival).
    pub fn reclaim_after(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(5),
            TimingProfile::Local => Duration::from_secs(1),
        }
    }

    /// How long a keyring operation (install, use, remove, list) waits for every live member's
    /// answer before it reports the missing ones: serf's query timeout for a small cluster
    /// (16 gossip intervals × ceil(log10(n + 1))), which is 3.2 s on a LAN.
    pub fn key_query_timeout(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_millis(3200),
            TimingProfile::Local => Duration::from_secs(3),
        }
    }

    /// How often a keyring request is sent again to members that have not answered: UDP may
    /// drop a request or its answer, and members apply an operation once however often it
    /// arrives. One direct-ack deadline, a round trip with a wide margin.
    pub fn key_query_retry(self) -> Duration {
        self.probe_rtt()
    }

    /// How long `join(addr)` waits for `addr` to show up as a live member.
    pub fn join_timeout(self) -> Duration {
        match self {
            TimingProfile::Lan => Duration::from_secs(5),
            TimingProfile::Local => Duration::from_secs(2),
        }
    }

    /// The foca configuration for a cluster of `cluster_size` live members (ourselves
    /// included). Probe timing and the `periodic_*` switches never depend on the size, so the
    /// driver can `set_config` whenever the size changes.
    pub fn foca_config(self, cluster_size: usize) -> Config {
        let (gossip_every, announce_every, announce_down_every) = match self {
            TimingProfile::Lan => (
                Duration::from_millis(200),
                Duration::from_secs(30),
                Duration::from_secs(30),
            ),
            TimingProfile::Local => (
                Duration::from_millis(200),
                Duration::from_secs(5),
                Duration::from_secs(2),
            ),
        };
        let periodic = |frequency, members| {
            Some(PeriodicParams {
                frequency,
                num_members: NonZeroUsize::new(members).unwrap_or(NonZeroUsize::MIN),
            })
        };
        Config {
            probe_period: self.probe_period(),
            probe_rtt: self.probe_rtt(),
            // Enough indirect probers that one bad link does not get a healthy member suspected.
            num_indirect_probes: NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN),
            max_transmissions: Self::max_transmissions(cluster_size),
            suspect_to_down_after: self.suspect_to_down_after(cluster_size),
            remove_down_after: Some(self.reap_after()),
            max_packet_size: NonZeroUsize::new(MAX_PACKET).unwrap_or(NonZeroUsize::MIN),
            // Tell a member we declared down, so it renews its identity and rejoins at once.
            notify_down_members: true,
            periodic_announce: periodic(announce_every, 1),
            periodic_announce_to_down_members: periodic(announce_down_every, 2),
            periodic_gossip: periodic(gossip_every, 3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lan_keeps_memberlist_suspicion_with_faster_probes() {
        let lan = TimingProfile::Lan;
        assert_eq!(lan.suspect_to_down_after(3), Duration::from_secs(4));
        assert_eq!(lan.suspect_to_down_after(10), Duration::from_secs(4));
        assert_eq!(lan.suspect_to_down_after(100), Duration::from_secs(8));
        let c = lan.foca_config(3);
        assert_eq!(c.probe_period, Duration::from_millis(400));
        assert_eq!(c.probe_rtt, Duration::from_millis(200));
        assert_eq!(c.max_transmissions.get(), 4);
        assert_eq!(c.max_packet_size.get(), 1400 - MAX_OVERHEAD - 1);
    }

    #[test]
    fn lan_survives_a_two_second_stop() {
        // Worst case: the member stops right after being pinged. It is suspected one probe
        // period later and declared down `suspicion` after that; resuming 2 s after the stop
        // must leave time to refute.
        let lan = TimingProfile::Lan;
        let declared_down = lan.probe_period() + lan.suspect_to_down_after(3);
        assert!(declared_down >= Duration::from_secs(2) + Duration::from_secs(2));
    }

    #[test]
    fn suspicion_shrinks_with_confirmations_as_memberlist_does() {
        let lan = TimingProfile::Lan;
        let ms = |n, c| lan.suspicion_timeout(n, c).as_millis();
        // Unconfirmed: the full suspicion; two confirmations: the minimum; one: in between.
        assert_eq!(
            (ms(5, 0), ms(5, 1), ms(5, 2), ms(5, 9)),
            (4000, 2864, 2200, 2200)
        );
        // Three members expect one confirmation; two expect none and never shrink.
        assert_eq!((ms(3, 0), ms(3, 1)), (4000, 2200));
        assert_eq!((ms(2, 0), ms(2, 5)), (4000, 4000));
        // Both ends scale with log10 n.
        assert_eq!((ms(100, 0), ms(100, 2)), (8000, 4400));
        // Local keeps a fixed suspicion.
        let local = TimingProfile::Local;
        assert_eq!(
            local.suspicion_timeout(5, 2),
            local.suspect_to_down_after(5)
        );
    }

    #[test]
    fn lan_survives_a_two_second_stop_even_when_confirmed() {
        // The stop begins at the latest when the indirect probes reach the member, a probe
        // round trip after the failed probe's start; the confirmed suspicion ends a probe
        // period plus the minimum after that start, 0.4 s after the stop ends.
        let lan = TimingProfile::Lan;
        let earliest_down = lan.probe_period() + lan.suspicion_timeout(10, 10);
        assert_eq!(earliest_down, Duration::from_millis(2600));
        let refute = Duration::from_millis(400);
        assert!(earliest_down >= lan.probe_rtt() + Duration::from_secs(2) + refute);
        assert!(lan.nack_after() < lan.probe_period() - lan.probe_rtt());
    }

    #[test]
    fn transmissions_scale_with_log_of_size() {
        let tx = |n| TimingProfile::max_transmissions(n).get();
        assert_eq!((tx(1), tx(3), tx(9)), (4, 4, 4));
        assert_eq!((tx(10), tx(99)), (8, 8));
        assert_eq!((tx(100), tx(999)), (12, 12));
    }

    #[test]
    fn resizing_never_touches_what_foca_forbids_changing() {
        for profile in [TimingProfile::Lan, TimingProfile::Local] {
            let mut foca = foca::Foca::new(
                super::super::identity::Member::placeholder("127.0.0.1:1".parse().unwrap(), "dc1"),
                profile.foca_config(1),
                <rand_foca::rngs::StdRng as rand_foca::SeedableRng>::seed_from_u64(1),
                foca::PostcardCodec,
            );
            for n in [2, 10, 100, 1000] {
                foca.set_config(profile.foca_config(n)).unwrap();
            }
        }
    }
}
