//! Closed-loop load: N concurrent clients, each sending its next request as soon as the last
//! one answered, for a warm-up and then a fixed measured window. Operations that complete
//! inside the window count; their latencies go to an HDR histogram (microseconds).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;

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
