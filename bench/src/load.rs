//! Closed-loop load: N concurrent clients, each sending its next request as soon as the last
//! one answered, for a warm-up and then a fixed measured window. Operations that complete
//! inside the window count; their latencies go to an HDR histogram (microseconds). And
//! open-loop load ([`pace`]): operations at a fixed rate, spread evenly over time.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::machine::micros;
use super::report::{Better, Row};

/// "1 client", "16 clients".
pub fn clients(n: usize) -> String {
    if n == 1 {
        "1 client".to_owned()
    } else {
        format!("{n} clients")
    }
}

/// How long to warm up and how long to measure.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub warmup: Duration,
    pub measure: Duration,
}

impl Window {
    /// The instants at which the measured window opens and closes, from now.
    pub fn schedule(&self) -> (Instant, Instant) {
        let open = Instant::now() + self.warmup;
        (open, open + self.measure)
    }
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(hist: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50_ms: ms(hist.value_at_quantile(0.5)),
            p99_ms: ms(hist.value_at_quantile(0.99)),
            p999_ms: ms(hist.value_at_quantile(0.999)),
            max_ms: ms(hist.max()),
        }
    }
}

/// The middle value (the upper one of an even count); zero for none.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The `p`th percentile (nearest rank, 100 is the maximum).
pub fn percentile(mut values: Vec<Duration>, p: usize) -> Duration {
    values.sort();
    let rank = (values.len() * p.min(100)).div_ceil(100).max(1);
    values.get(rank - 1).copied().unwrap_or_default()
}

/// A new latency histogram: microseconds, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

/// What a closed-loop run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub clients: usize,
    pub ops: u64,
    pub per_second: f64,
    pub latency: Latency,
}

impl Throughput {
    /// Rows comparing Vigil's run `v` with etcd's `e` on `workload`: `<id>.rate` in
    /// `rate_unit`, then `<id>.p50`, `<id>.p99` for the `percentiles` asked for.
    pub fn compare(
        id: &str,
        workload: &str,
        rate_unit: &str,
        percentiles: &[Percentile],
        v: &Throughput,
        e: &Throughput,
        c: Option<&Throughput>,
    ) -> Vec<Row> {
        let (vigil, etcd) = (Some(v.per_second), Some(e.per_second));
        let rate = Row::new(
            format!("{id}.rate"),
            workload,
            rate_unit,
            Better::Higher,
            vigil,
            etcd,
        )
        .with_consul(c.map(|c| c.per_second));
        let latencies = percentiles.iter().map(|p| {
            let (vigil, etcd) = (Some(p.of(&v.latency)), Some(p.of(&e.latency)));
            let name = p.name();
            let metric = format!("{name} (ms)");
            Row::new(
                format!("{id}.{name}"),
                workload,
                metric,
                Better::Lower,
                vigil,
                etcd,
            )
            .with_consul(c.map(|c| p.of(&c.latency)))
        });
        std::iter::once(rate).chain(latencies).collect()
    }
}

/// A latency percentile a report row shows.
#[derive(Debug, Clone, Copy)]
pub enum Percentile {
    P50,
    P99,
}

impl Percentile {
    fn name(self) -> &'static str {
        match self {
            Percentile::P50 => "p50",
            Percentile::P99 => "p99",
        }
    }

    fn of(self, latency: &Latency) -> f64 {
        match self {
            Percentile::P50 => latency.p50_ms,
            Percentile::P99 => latency.p99_ms,
        }
    }
}

/// Runs `op(client, n)`, the `n`th operation of `client`, from `clients` concurrent tasks over
/// `window`; the first error stops the run.
pub async fn closed_loop<F, Fut>(clients: usize, window: Window, op: F) -> Result<Throughput>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let (open, close) = window.schedule();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut hist = histogram();
                let mut n = 0;
                while Instant::now() < close {
                    let t = Instant::now();
                    op(c, n)
                        .await
                        .with_context(|| format!("client {c}, operation {n}"))?;
                    let done = Instant::now();
                    if done >= open && done < close {
                        hist.record(micros(done - t))?;
                    }
                    n += 1;
                }
                anyhow::Ok(hist)
            })
        })
        .collect();
    let mut all = histogram();
    for task in tasks {
        all.add(task.await??)?;
    }
    Ok(Throughput {
        clients,
        ops: all.len(),
        per_second: all.len() as f64 / window.measure.as_secs_f64(),
        latency: Latency::of(&all),
    })
}

/// Operations of a paced load ([`pace`]) that succeeded, found their object gone (a session or
/// lease that expired), or failed, so far.
#[derive(Debug, Default)]
pub struct Tally {
    pub done: AtomicU64,
    pub gone: AtomicU64,
    /// The first operation that failed.
    error: Mutex<Option<String>>,
}

impl Tally {
    pub fn fail(&self, error: &anyhow::Error) {
        self.error
            .lock()
            .get_or_insert_with(|| format!("{error:#}"));
    }

    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// `Err` when an operation failed or found its object gone; `what` names the operations.
    pub fn verdict(&self, what: &str) -> Result<()> {
        if let Some(error) = self.error.lock().clone() {
            bail!("{what}: one failed: {error}");
        }
        let gone = self.gone.load(Ordering::Relaxed);
        if gone > 0 {
            bail!("{what}: {gone} found their session or lease gone");
        }
        Ok(())
    }
}

/// When each of `n` items is due: item `i` at `start + period × (i / n + k)` for k = 0, 1, …,
/// so that the items are spread evenly over every period.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub start: Instant,
    pub period: Duration,
    pub n: usize,
}

impl Schedule {
    /// The `k`th due time of item `i`.
    fn due(&self, i: usize, k: u32) -> Instant {
        let phase = self.period.mul_f64(i as f64 / self.n as f64);
        self.start + phase + self.period * k
    }

    /// The items `worker` of `workers` takes, in the order they come due within a period.
    fn share(&self, worker: usize, workers: usize) -> impl Iterator<Item = usize> + use<> {
        (worker..self.n).step_by(workers)
    }
}

/// An open-loop load: runs `op(i)` for every item `i` at its due times ([`Schedule`]) from
/// `workers` tasks (a worker behind its schedule goes on at once), until the returned set is
/// dropped. `op(i)` is `None` for an item that does not exist yet (a session still being
/// made), which is skipped that period.
pub fn pace<O, Fut>(schedule: Schedule, workers: usize, op: O) -> JoinSet<()>
where
    O: Fn(usize) -> Option<Fut> + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let mut set = JoinSet::new();
    for worker in 0..workers {
        let op = op.clone();
        set.spawn(async move {
            for k in 0.. {
                for i in schedule.share(worker, workers) {
                    sleep_until(schedule.due(i, k)).await;
                    if let Some(operation) = op(i) {
                        operation.await;
                    }
                }
            }
        });
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items come due spread evenly over the period, every period, and the workers share them
    /// out without leaving any out or taking one twice.
    #[test]
    fn a_schedule_spreads_items_evenly_over_the_period() {
        let start = Instant::now();
        let schedule = Schedule {
            start,
            period: Duration::from_secs(5),
            n: 10,
        };
        assert_eq!(schedule.due(0, 0), start);
        assert_eq!(schedule.due(5, 0), start + Duration::from_millis(2_500));
        assert_eq!(schedule.due(9, 2), start + Duration::from_millis(14_500));
        let mut all: Vec<usize> = (0..3).flat_map(|w| schedule.share(w, 3)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        let share: Vec<usize> = schedule.share(1, 3).collect();
        assert_eq!(share, [1, 4, 7]);
        let dues: Vec<Instant> = share.iter().map(|&i| schedule.due(i, 0)).collect();
        assert!(dues.is_sorted());
    }

    /// A paced load runs each item once a period, skipping the items not made yet.
    #[tokio::test(start_paused = true)]
    async fn a_paced_load_runs_every_made_item_once_a_period() {
        let tally = Arc::new(Tally::default());
        let schedule = Schedule {
            start: Instant::now(),
            period: Duration::from_secs(1),
            n: 10,
        };
        let counts = tally.clone();
        let load = pace(schedule, 3, move |i| {
            let tally = counts.clone();
            (i % 2 == 0).then_some(async move {
                tally.done.fetch_add(1, Ordering::Relaxed);
            })
        });
        // Three periods, and not quite the first item's fourth due time.
        tokio::time::sleep(Duration::from_millis(2_950)).await;
        drop(load);
        assert_eq!(tally.done(), 15);
        tally.verdict("test").unwrap();
        tally.gone.fetch_add(1, Ordering::Relaxed);
        assert!(tally.verdict("renewals").is_err());
    }
}
