//! The seeded fault schedule: which fault comes next, after how long a quiet gap, and how long
//! it lasts before it is healed. A SplitMix64 generator (a dozen lines, no dependency) makes
//! the same seed give the same schedule on every machine.

use std::time::Duration;

/// SplitMix64: small, fast and good enough to pick faults and durations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A duration in `[lo, hi]`, to the millisecond.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }
}

/// The faults the checker applies; the names are the fault scripts' in `docker/faults/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// SIGKILL the raft leader; start it again from its data directory.
    KillLeader,
    /// SIGKILL the node holding the lock (agent, `vigil lock` and worker); start it again.
    KillHolder,
    /// Freeze the holding node (agent, `vigil lock`, worker); thaw it later.
    PauseHolder,
    /// Cut the holding node off the cluster while it can still reach the bank (loopback: its
    /// agent is frozen while `vigil lock` and the worker run on).
    PartitionHolder,
    /// Packet loss on every agent's cluster interface (Docker only: needs network namespaces).
    LossyNetwork,
    /// Restart every server (loopback: SIGKILL them all, then start them again).
    RestartAll,
}

impl FaultKind {
    pub const ALL: [FaultKind; 6] = [
        FaultKind::KillLeader,
        FaultKind::KillHolder,
        FaultKind::PauseHolder,
        FaultKind::PartitionHolder,
        FaultKind::LossyNetwork,
        FaultKind::RestartAll,
    ];

    /// The fault script's name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillHolder => "kill-holder",
            FaultKind::PauseHolder => "pause-holder",
            FaultKind::PartitionHolder => "partition-holder",
            FaultKind::LossyNetwork => "lossy-network",
            FaultKind::RestartAll => "restart-all",
        }
    }
}

/// What to draw a schedule from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpec {
    pub faults: usize,
    pub kinds: Vec<FaultKind>,
    /// Quiet time before each fault, drawn from `[lo, hi]`.
    pub gap: (Duration, Duration),
    /// How long each fault lasts before it is healed, drawn from `[lo, hi]`.
    pub hold: (Duration, Duration),
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub gap: Duration,
    pub kind: FaultKind,
    pub hold: Duration,
}

/// Draws the schedule for `seed`: the kinds in shuffled rounds (so each appears once before
/// any appears twice), each with its gap and hold.
pub fn schedule(seed: u64, spec: &ScheduleSpec) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut kinds = Vec::with_capacity(spec.faults);
    while kinds.len() < spec.faults && !spec.kinds.is_empty() {
        let mut round = spec.kinds.clone();
        // Fisher-Yates.
        for i in (1..round.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            round.swap(i, j);
        }
        kinds.extend(round);
    }
    kinds.truncate(spec.faults);
    kinds
        .into_iter()
        .map(|kind| Step {
            gap: rng.between(spec.gap.0, spec.gap.1),
            kind,
            hold: rng.between(spec.hold.0, spec.hold.1),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(faults: usize) -> ScheduleSpec {
        ScheduleSpec {
            faults,
            kinds: FaultKind::ALL.to_vec(),
            gap: (Duration::from_secs(1), Duration::from_secs(3)),
            hold: (Duration::from_millis(500), Duration::from_secs(5)),
        }
    }

    #[test]
    fn a_seed_always_gives_the_same_schedule_and_another_seed_another() {
        assert_eq!(schedule(7, &spec(20)), schedule(7, &spec(20)));
        assert_ne!(schedule(7, &spec(20)), schedule(8, &spec(20)));
    }

    #[test]
    fn every_kind_comes_once_per_round_and_durations_stay_in_bounds() {
        let steps = schedule(42, &spec(12));
        assert_eq!(steps.len(), 12);
        for round in steps.chunks(FaultKind::ALL.len()) {
            let mut kinds: Vec<_> = round.iter().map(|s| s.kind).collect();
            kinds.sort();
            assert_eq!(kinds, FaultKind::ALL.to_vec(), "{steps:?}");
        }
        for s in &steps {
            assert!((Duration::from_secs(1)..=Duration::from_secs(3)).contains(&s.gap));
            assert!((Duration::from_millis(500)..=Duration::from_secs(5)).contains(&s.hold));
        }
    }

    #[test]
    fn splitmix_matches_its_reference_output() {
        // First outputs of SplitMix64 seeded with 0 (the published reference values).
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }
}
