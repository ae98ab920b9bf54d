//! The re-announce rule, shared by the real driver and the simulator: foca never rejoins by itself
//! after a full partition (docs/architecture.md#rejoining-after-a-partition), so while it is not
//! connected we keep announcing to the join list and a few known members, forever; while connected
//! we still announce, slowly, to join addresses that are not members. Pure: it only decides *whom*
//! to announce to and *when*.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use foca::OwnedNotification;

use super::identity::Member;
use super::profile::TimingProfile;

/// Known (non-seed) members announced to per round while not connected: enough to find the
/// cluster when the seeds are gone, few enough not to flood a large cluster after a partition.
pub const KNOWN_PER_ROUND: usize = 3;

#[derive(Debug)]
pub struct Reannouncer {
    me: SocketAddr,
    /// Join (seed) addresses, deduplicated, without our own address.
    seeds: Vec<SocketAddr>,
    /// foca said Active and has not said Idle/Defunct/Rejoin since.
    active: bool,
    /// After a graceful leave nothing is announced any more.
    stopped: bool,
    next_inactive: Duration,
    next_seed_check: Duration,
    inactive_every: Duration,
    seed_check_every: Duration,
    /// Round-robin position over known members, so every one is tried in turn.
    cursor: usize,
}

impl Reannouncer {
    pub fn new(me: SocketAddr, join: &[SocketAddr], profile: TimingProfile) -> Reannouncer {
        let seeds: BTreeSet<SocketAddr> = join.iter().copied().filter(|a| *a != me).collect();
        Reannouncer {
            me,
            seeds: seeds.into_iter().collect(),
            active: false,
            stopped: false,
            next_inactive: Duration::ZERO,
            next_seed_check: profile.seed_check_interval(),
            inactive_every: profile.reannounce_interval(),
            seed_check_every: profile.seed_check_interval(),
            cursor: 0,
        }
    }

    /// Tracks foca's connection state: Active sets it, Idle/Defunct/Rejoin clear it (and make
    /// the next [`Reannouncer::due`] announce at once).
    pub fn observe(&mut self, notification: &OwnedNotification<Member>, now: Duration) {
        match notification {
            OwnedNotification::Active => self.active = true,
            OwnedNotification::Idle | OwnedNotification::Defunct | OwnedNotification::Rejoin(_) => {
                if self.active {
                    self.next_inactive = now;
                }
                self.active = false;
            }
            _ => {}
        }
    }

    pub fn is_active(&self) -> bool {
        self.active
    }

    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// The addresses to announce to now, if any. `known` lists every member we know (live or
    /// down, in a stable order); `is_live` says whether an address is a live member.
    pub fn due(
        &mut self,
        now: Duration,
        known: &[SocketAddr],
        is_live: impl Fn(&SocketAddr) -> bool,
    ) -> Vec<SocketAddr> {
        if self.stopped {
            return Vec::new();
        }
        if !self.active {
            if now < self.next_inactive {
                return Vec::new();
            }
            self.next_inactive = now + self.inactive_every;
            let mut targets = self.seeds.clone();
            let others: Vec<SocketAddr> = known
                .iter()
                .copied()
                .filter(|a| *a != self.me && !self.seeds.contains(a))
                .collect();
            for _ in 0..KNOWN_PER_ROUND.min(others.len()) {
                targets.push(others[self.cursor % others.len()]);
                self.cursor = self.cursor.wrapping_add(1);
            }
            targets
        } else {
            if now < self.next_seed_check {
                return Vec::new();
            }
            self.next_seed_check = now + self.seed_check_every;
            self.seeds.iter().copied().filter(|a| !is_live(a)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    const LOCAL: TimingProfile = TimingProfile::Local;

    #[test]
    fn inactive_announces_to_seeds_at_once_and_then_every_interval() {
        let mut r = Reannouncer::new(addr(1), &[addr(1), addr(2), addr(2)], LOCAL);
        assert_eq!(r.due(Duration::ZERO, &[], |_| false), [addr(2)]);
        assert!(r.due(Duration::from_millis(500), &[], |_| false).is_empty());
        assert_eq!(r.due(Duration::from_secs(1), &[], |_| false), [addr(2)]);
    }

    #[test]
    fn inactive_also_walks_known_members_round_robin() {
        let mut r = Reannouncer::new(addr(1), &[addr(2)], LOCAL);
        let known = [addr(1), addr(2), addr(3), addr(4), addr(5), addr(6)];
        let first = r.due(Duration::ZERO, &known, |_| false);
        assert_eq!(first, [addr(2), addr(3), addr(4), addr(5)]);
        let second = r.due(Duration::from_secs(1), &known, |_| false);
        assert_eq!(second, [addr(2), addr(6), addr(3), addr(4)]);
    }

    #[test]
    fn active_only_checks_missing_seeds_slowly() {
        let mut r = Reannouncer::new(addr(1), &[addr(2), addr(3)], LOCAL);
        r.observe(&OwnedNotification::Active, Duration::ZERO);
        assert!(r.due(Duration::from_secs(1), &[], |_| true).is_empty());
        let live = |a: &SocketAddr| *a == addr(2);
        assert_eq!(r.due(Duration::from_secs(2), &[], live), [addr(3)]);
        assert!(r.due(Duration::from_secs(3), &[], live).is_empty());
    }

    #[test]
    fn losing_the_cluster_announces_immediately() {
        let mut r = Reannouncer::new(addr(1), &[addr(2)], LOCAL);
        r.observe(&OwnedNotification::Active, Duration::ZERO);
        assert!(r.due(Duration::from_millis(100), &[], |_| true).is_empty());
        let renewed = Member::placeholder(addr(1), "dc1");
        r.observe(
            &OwnedNotification::Rejoin(renewed),
            Duration::from_millis(700),
        );
        assert_eq!(r.due(Duration::from_millis(700), &[], |_| false), [addr(2)]);
        r.stop();
        assert!(r.due(Duration::from_secs(60), &[], |_| false).is_empty());
    }
}
