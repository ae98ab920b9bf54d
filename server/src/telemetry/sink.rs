//! The process's metrics recorder: a `metrics-util` registry whose counters and samples keep
//! Consul's aggregate (count, sum, min, max, mean, standard deviation) since the process
//! started, rendered as Consul's `/v1/agent/metrics` JSON or as Prometheus text (0.0.4).
//! Consul shows the last finished 10-second interval; Vigil shows everything since start, so a
//! scrape never misses what happened between two of them (Prometheus takes rates itself).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use metrics::atomics::AtomicU64;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_util::registry::{Registry, Storage};
use parking_lot::Mutex;
use serde::Serialize;
use vigil_shared::go::time::Utc;

/// Count, sum, extremes and Welford's running variance of the values recorded.
#[derive(Debug, Default)]
pub struct Aggregate(Mutex<Stats>);

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    mean: f64,
    m2: f64,
}

impl Stats {
    fn record(&mut self, value: f64) {
        if self.count == 0 {
            self.min = value;
            self.max = value;
        } else {
            self.min = self.min.min(value);
            self.max = self.max.max(value);
        }
        self.count += 1;
        self.sum += value;
        let delta = value - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (value - self.mean);
    }

    fn stddev(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            (self.m2 / (self.count - 1) as f64).sqrt()
        }
    }
}

impl Aggregate {
    fn record(&self, value: f64) {
        self.0.lock().record(value);
    }

    fn stats(&self) -> Stats {
        *self.0.lock()
    }
}

impl CounterFn for Aggregate {
    fn increment(&self, value: u64) {
        self.record(value as f64);
    }

    /// An absolute counter value: the difference to the sum so far is one increment.
    fn absolute(&self, value: u64) {
        let mut stats = self.0.lock();
        let delta = value as f64 - stats.sum;
        if delta > 0.0 {
            stats.record(delta);
        }
    }
}

impl HistogramFn for Aggregate {
    fn record(&self, value: f64) {
        Aggregate::record(self, value);
    }
}

/// Counters and samples aggregate; gauges keep their last value (f64 bits).
struct AggregateStorage;

impl Storage<Key> for AggregateStorage {
    type Counter = Arc<Aggregate>;
    type Gauge = Arc<AtomicU64>;
    type Histogram = Arc<Aggregate>;

    fn counter(&self, _: &Key) -> Self::Counter {
        Arc::default()
    }

    fn gauge(&self, _: &Key) -> Self::Gauge {
        Arc::new(AtomicU64::new(0))
    }

    fn histogram(&self, _: &Key) -> Self::Histogram {
        Arc::default()
    }
}

/// The recorder. One per process: [`Sink::install`] makes it the global one.
pub struct Sink {
    registry: Registry<Key, AggregateStorage>,
    started: Instant,
}

/// A cloneable handle on the global sink, registered with the `metrics` facade.
struct Installed(&'static Sink);

static SINK: OnceLock<&'static Sink> = OnceLock::new();

impl Sink {
    /// The process's sink, installed as the global recorder on first use. If another recorder
    /// was installed first (by an embedding program), this sink stays empty.
    pub fn install() -> &'static Sink {
        SINK.get_or_init(|| {
            let sink: &'static Sink = Box::leak(Box::new(Sink {
                registry: Registry::new(AggregateStorage),
                started: Instant::now(),
            }));
            if metrics::set_global_recorder(Installed(sink)).is_err() {
                tracing::warn!("another metrics recorder is installed; /v1/agent/metrics is empty");
            }
            sink
        })
    }

    /// Every series as Consul's `/v1/agent/metrics` answer.
    pub fn consul_json(&self) -> Summary {
        let elapsed = self.started.elapsed().as_secs_f64().max(1.0);
        let mut summary = Summary {
            timestamp: go_timestamp(SystemTime::now()),
            gauges: Vec::new(),
            points: Vec::new(),
            counters: Vec::new(),
            samples: Vec::new(),
        };
        self.registry.visit_gauges(|key, gauge| {
            summary.gauges.push(GaugeValue {
                name: key.name().to_owned(),
                value: f64::from_bits(gauge.load(std::sync::atomic::Ordering::Relaxed)),
                labels: labels(key),
            });
        });
        let sampled = |key: &Key, agg: &Arc<Aggregate>| {
            let s = agg.stats();
            SampledValue {
                name: key.name().to_owned(),
                count: s.count,
                rate: s.sum / elapsed,
                sum: s.sum,
                min: s.min,
                max: s.max,
                mean: s.mean,
                stddev: s.stddev(),
                labels: labels(key),
            }
        };
        self.registry
            .visit_counters(|key, c| summary.counters.push(sampled(key, c)));
        self.registry
            .visit_histograms(|key, h| summary.samples.push(sampled(key, h)));
        summary
            .gauges
            .sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        summary
            .counters
            .sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        summary
            .samples
            .sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        summary
    }

    /// Every series in the Prometheus text exposition format 0.0.4: counters as counters (their
    /// sum), gauges as gauges, samples as summaries (`_sum` and `_count`). Names are Consul's
    /// with every character Prometheus does not allow turned into `_`.
    pub fn prometheus(&self) -> String {
        let summary = self.consul_json();
        let mut families: BTreeMap<String, (&str, Vec<String>)> = BTreeMap::new();
        let mut add = |name: &str, kind: &'static str, line: String| {
            families
                .entry(prometheus_name(name))
                .or_insert_with(|| (kind, Vec::new()))
                .1
                .push(line);
        };
        for g in &summary.gauges {
            let name = prometheus_name(&g.name);
            let line = format!("{name}{} {}", prometheus_labels(&g.labels), number(g.value));
            add(&g.name, "gauge", line);
        }
        for c in &summary.counters {
            let name = prometheus_name(&c.name);
            let line = format!("{name}{} {}", prometheus_labels(&c.labels), number(c.sum));
            add(&c.name, "counter", line);
        }
        for s in &summary.samples {
            let name = prometheus_name(&s.name);
            let labels = prometheus_labels(&s.labels);
            add(
                &s.name,
                "summary",
                format!("{name}_sum{labels} {}", number(s.sum)),
            );
            add(
                &s.name,
                "summary",
                format!("{name}_count{labels} {}", s.count),
            );
        }
        let mut out = String::new();
        for (name, (kind, lines)) in families {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for line in lines {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

impl Recorder for Installed {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .registry
            .get_or_create_counter(key, |c| Counter::from_arc(Arc::clone(c)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(Arc::clone(g)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(Arc::clone(h)))
    }
}

/// Consul's `/v1/agent/metrics` body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Summary {
    pub timestamp: String,
    pub gauges: Vec<GaugeValue>,
    /// Consul's key/value points; Vigil records none.
    pub points: Vec<GaugeValue>,
    pub counters: Vec<SampledValue>,
    pub samples: Vec<SampledValue>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct GaugeValue {
    pub name: String,
    pub value: f64,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct SampledValue {
    pub name: String,
    pub count: u64,
    /// Sum per second since the process started.
    pub rate: f64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub stddev: f64,
    pub labels: BTreeMap<String, String>,
}

fn labels(key: &Key) -> BTreeMap<String, String> {
    key.labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect()
}

/// Go's `time.Time.String()` in UTC, to the second, as Consul prints `Timestamp`.
fn go_timestamp(t: SystemTime) -> String {
    let u = Utc::of(t);
    format!(
        "{} {:02}:{:02}:{:02} +0000 UTC",
        u.date(),
        u.hour,
        u.minute,
        u.second
    )
}

/// A metric or label name with every character outside `[a-zA-Z0-9_:]` (`[a-zA-Z0-9_]` for
/// labels) turned into `_`, and a leading digit prefixed with `_`.
fn sanitize(name: &str, colon: bool) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

fn prometheus_name(name: &str) -> String {
    sanitize(name, true)
}

fn prometheus_labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let value = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{}=\"{value}\"", sanitize(k, false))
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// A sample value as Prometheus writes one (`NaN`, `+Inf`, `-Inf` spelled its way).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> Sink {
        Sink {
            registry: Registry::new(AggregateStorage),
            started: Instant::now(),
        }
    }

    #[test]
    fn samples_keep_consul_aggregates() {
        let sink = sink();
        let key = Key::from_name("consul.raft.commitTime");
        let h = sink.registry.get_or_create_histogram(&key, Arc::clone);
        for v in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0] {
            HistogramFn::record(&*h, v);
        }
        let summary = sink.consul_json();
        let s = &summary.samples[0];
        assert_eq!(s.name, "consul.raft.commitTime");
        assert_eq!(
            (s.count, s.sum, s.min, s.max, s.mean),
            (8, 40.0, 2.0, 9.0, 5.0)
        );
        assert!((s.stddev - 2.138).abs() < 0.001, "{}", s.stddev);
    }

    #[test]
    fn prometheus_text_has_one_type_line_per_family() {
        let sink = sink();
        for result in ["granted", "lock_delay"] {
            let key = Key::from_parts(
                "vigil.lock.acquire",
                vec![metrics::Label::new("result", result)],
            );
            let c = sink.registry.get_or_create_counter(&key, Arc::clone);
            c.increment(2);
        }
        let g = sink
            .registry
            .get_or_create_gauge(&Key::from_name("consul.raft.last_index"), Arc::clone);
        metrics::GaugeFn::set(&*g, 12.0);
        let text = sink.prometheus();
        assert_eq!(
            text,
            "# TYPE consul_raft_last_index gauge\n\
             consul_raft_last_index 12\n\
             # TYPE vigil_lock_acquire counter\n\
             vigil_lock_acquire{result=\"granted\"} 2\n\
             vigil_lock_acquire{result=\"lock_delay\"} 2\n"
        );
    }

    #[test]
    fn timestamps_print_as_go_does() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_763_955_610);
        assert_eq!(go_timestamp(t), "2025-11-24 03:40:10 +0000 UTC");
    }

    #[test]
    fn names_and_labels_are_escaped() {
        assert_eq!(
            prometheus_name("consul.http.GET.v1.kv._"),
            "consul_http_GET_v1_kv__"
        );
        let labels = BTreeMap::from([("lock".to_owned(), "a\"b\\c".to_owned())]);
        assert_eq!(prometheus_labels(&labels), "{lock=\"a\\\"b\\\\c\"}");
    }
}
