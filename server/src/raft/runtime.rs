//! The async runtime raft runs on: openraft's tokio runtime, except for where raft's random
//! draws (each election timeout, the first wait of its ticks) come from. By default they come
//! from the OS's entropy, as openraft's own; a thread that [`seed_thread_rng`] seeded draws
//! them from that seed instead, so a deterministic simulation that runs every server on one
//! thread (a current-thread tokio runtime with paused time) replays its elections exactly.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand_raft::SeedableRng as _;
use rand_raft::rngs::SmallRng;

thread_local! {
    /// The seed of the next draw on this thread, when seeded.
    static SEED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes raft's random draws on this thread follow `seed` (`None`: the OS's entropy again).
pub fn seed_thread_rng(seed: Option<u64>) {
    SEED.with(|s| s.set(seed));
}

/// The next seed of a seeded thread, advancing it (SplitMix64), or `None`.
fn next_seed() -> Option<u64> {
    SEED.with(|s| {
        let seed = s.get()?;
        let next = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(Some(next));
        let z = (next ^ (next >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Some(z ^ (z >> 31))
    })
}

/// openraft's [`TokioRuntime`] with seedable random draws; see the module comment.
#[derive(Debug)]
pub struct Runtime(TokioRuntime);

type Tokio = TokioRuntime;

impl AsyncRuntime for Runtime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        Tokio::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        match next_seed() {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_rng(&mut rand_raft::rng()),
        }
    }

    type Mpsc = <Tokio as AsyncRuntime>::Mpsc;
    type Watch = <Tokio as AsyncRuntime>::Watch;
    type Oneshot = <Tokio as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        Runtime(Tokio::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use rand_raft::RngExt as _;

    use super::*;

    fn draws() -> Vec<u64> {
        (0..4)
            .map(|_| Runtime::thread_rng().random_range(0..1_000_000))
            .collect()
    }

    #[test]
    fn a_seeded_thread_draws_the_same_sequence_again_and_an_unseeded_one_does_not() {
        seed_thread_rng(Some(7));
        let first = draws();
        seed_thread_rng(Some(7));
        assert_eq!(draws(), first);
        seed_thread_rng(Some(8));
        assert_ne!(draws(), first);
        seed_thread_rng(None);
        assert_ne!(draws(), draws());
    }
}
