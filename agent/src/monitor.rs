//! The agent's log as a stream for `/v1/agent/monitor`: a `tracing` layer that formats each
//! event the agent logs (what its `--log-level` lets through) as one line, in text and as JSON
//! (Consul's `?logjson`), and hands it to the monitors listening, if any. Nothing is formatted while nobody listens; a monitor that falls
//! behind loses lines rather than slowing the agent (a bounded broadcast channel).

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use tokio::sync::broadcast;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines a slow monitor may lag behind before it loses some.
const BACKLOG: usize = 1024;

/// One log line and its level.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub level: Level,
    pub text: Arc<str>,
    /// The same line as hclog's JSON (`@timestamp`, `@level`, `@module`, `@message`, then the
    /// fields).
    pub json: Arc<str>,
}

fn channel() -> &'static broadcast::Sender<LogLine> {
    static CHANNEL: OnceLock<broadcast::Sender<LogLine>> = OnceLock::new();
    CHANNEL.get_or_init(|| broadcast::channel(BACKLOG).0)
}

/// Follows the agent's log from now on.
pub fn subscribe() -> broadcast::Receiver<LogLine> {
    channel().subscribe()
}

/// The layer to add to the agent's subscriber.
pub struct MonitorLayer;

impl<S: Subscriber> Layer<S> for MonitorLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let tx = channel();
        if tx.receiver_count() == 0 {
            return;
        }
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let time = vigil_shared::go::time::rfc3339_millis(std::time::SystemTime::now());
        let text = format!(
            "{time} [{}] {}: {}{}",
            meta.level(),
            meta.target(),
            fields.message,
            fields.rest
        );
        let mut json = serde_json::Map::new();
        json.insert("@timestamp".into(), time.into());
        json.insert(
            "@level".into(),
            meta.level().as_str().to_ascii_lowercase().into(),
        );
        json.insert("@module".into(), meta.target().into());
        json.insert("@message".into(), fields.message.into());
        for (name, value) in fields.pairs {
            json.insert(name, value.into());
        }
        // No monitor listening any more is not an error.
        let _ = tx.send(LogLine {
            level: *meta.level(),
            text: text.into(),
            json: serde_json::Value::Object(json).to_string().into(),
        });
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    /// The fields other than the message, as (name, text).
    pairs: Vec<(String, String)>,
}

impl Fields {
    fn field(&mut self, name: &str, value: String) {
        let _ = write!(self.rest, " {name}={value}");
        self.pairs.push((name.to_owned(), value));
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.field(field.name(), format!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.field(field.name(), value.to_owned());
        }
    }
}

/// Consul's `?loglevel=` names (`err` is `error`); `None` for anything else.
pub fn parse_level(name: &str) -> Option<Level> {
    match name.to_ascii_lowercase().as_str() {
        "trace" => Some(Level::TRACE),
        "debug" => Some(Level::DEBUG),
        "info" => Some(Level::INFO),
        "warn" => Some(Level::WARN),
        "err" | "error" => Some(Level::ERROR),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[test]
    fn events_reach_monitors_as_lines() {
        let mut rx = subscribe();
        let subscriber = tracing_subscriber::registry().with(MonitorLayer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(peer = "s1", "raft peer removed");
        });
        let line = rx.try_recv().expect("a line");
        assert_eq!(line.level, Level::WARN);
        assert!(
            line.text.ends_with("raft peer removed peer=s1"),
            "{}",
            line.text
        );
        assert!(line.text.contains(" [WARN] "), "{}", line.text);
        // The same line as hclog's JSON, which `?logjson` monitors get.
        let json: serde_json::Value = serde_json::from_str(&line.json).expect("JSON");
        assert_eq!(json["@level"], "warn");
        assert_eq!(json["@message"], "raft peer removed");
        assert_eq!(json["peer"], "s1");
        assert!(json["@timestamp"].is_string() && json["@module"].is_string());
    }

    #[test]
    fn levels_are_consuls() {
        assert_eq!(parse_level("err"), Some(Level::ERROR));
        assert_eq!(parse_level("DEBUG"), Some(Level::DEBUG));
        assert_eq!(parse_level("verbose"), None);
    }
}
