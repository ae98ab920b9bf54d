//! The async runtime raft runs on: openraft's tokio runtime, except for where raft's random
//! draws (each election timeout, the first wait of its ticks) come from. By default they come
//! from the OS's entropy, as openraft's own; in a future run with [`seeded`] they come from
//! that seed instead, and so in every task raft spawns from it (each derives its own seed from
//! its parent's as it is spawned). A deterministic simulation starts each server's raft
//! seeded, so its elections replay exactly, whatever order tasks woken at the same instant run
//! in.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand_raft::SeedableRng as _;
use rand_raft::rngs::SmallRng;

tokio::task_local! {
    /// The seed of the task's next draw.
    static SEED: Cell<u64>;
}

/// Runs `future` with raft's random draws in it, and in the tasks raft spawns from it,
/// following `seed`.
pub fn seeded<F: Future>(seed: u64, future: F) -> impl Future<Output = F::Output> {
    SEED.scope(Cell::new(seed), future)
}

/// SplitMix64: a bijective mixer; two gammas give two independent sequences.
fn mix(seed: u64, gamma: u64) -> u64 {
    let z = seed.wrapping_add(gamma);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Advances the task's seed and returns what it was; `None` outside [`seeded`].
fn take_seed() -> Option<u64> {
    SEED.try_with(|s| {
        let seed = s.get();
        s.set(mix(seed, 0x6a09_e667_f3bc_c908));
        seed
    })
    .ok()
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
        match take_seed() {
            Some(seed) => Tokio::spawn(seeded(mix(seed, 0x9e37_79b9_7f4a_7c15), future)),
            None => Tokio::spawn(future),
        }
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
        match take_seed() {
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

    /// What a seeded task draws, then what a task it spawns draws.
    async fn family(seed: u64) -> (Vec<u64>, Vec<u64>) {
        seeded(seed, async {
            let own = draws();
            let child = Runtime::spawn(async { draws() }).await.unwrap();
            (own, child)
        })
        .await
    }

    #[tokio::test]
    async fn a_seeded_task_and_its_children_draw_the_same_again_and_unseeded_ones_do_not() {
        let first = family(7).await;
        assert_eq!(family(7).await, first);
        assert_ne!(first.0, first.1, "a child draws its own sequence");
        assert_ne!(family(8).await, first);
        assert_ne!(draws(), draws());
    }
}
