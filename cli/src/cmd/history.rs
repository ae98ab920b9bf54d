//! `vigil lock history NAME [--prefix] [--json]`: a lock's recorded events as a timeline, one
//! line each (UTC, to the millisecond), from `/v1/vigil/history`:
//!
//! ```text
//! key jobs/leader/.lock
//! 2026-11-28
//!   14:02:11.204  granted    token 1042  web-3 (session 8c1f…)
//!   14:05:40.017  lost       node web-3 failed (serfHealth)  lock-delay 15 s
//! ```
//!
//! A lost holder's lock-delay is shown on its line; `--json` prints the endpoint's answer.

use clap::Args;
use vigil_client::ReadOpts;
use vigil_shared::vigil_api::{
    HistoryCause, HistoryEvent, HistoryEventKind, HistoryKind, HistoryReport,
};

use super::AgentAddr;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The lock: a KV key (Consul's lock recipe holds `<prefix>/.lock`) or a native lock's name.
    pub name: String,
    /// Every lock whose name starts with NAME.
    #[arg(long)]
    pub prefix: bool,
    /// Print the `/v1/vigil/history` JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub addr: AgentAddr,
}

/// `vigil lock history NAME`.
pub async fn run(args: HistoryArgs) -> anyhow::Result<i32> {
    let client = args.addr.client()?;
    let name = args.name.trim_start_matches('/');
    let (reports, _) = client
        .lock_history(name, args.prefix, &ReadOpts::default())
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        print!("{}", render(&reports));
    }
    Ok(0)
}

/// The timeline of each lock in `reports`.
pub fn render(reports: &[HistoryReport]) -> String {
    if reports.is_empty() {
        return "no history recorded\n".to_owned();
    }
    let mut out = String::new();
    for report in reports {
        let kind = match report.kind {
            HistoryKind::Key => "key",
            HistoryKind::Queue => "queued lock",
        };
        out.push_str(&format!("{kind} {}\n", report.name));
        let mut day = "";
        let mut events = report.events.iter().peekable();
        while let Some(e) = events.next() {
            let (date, time) = e.time.split_once('T').unwrap_or((&e.time, ""));
            if date != day {
                out.push_str(&format!("{date}\n"));
                day = date;
            }
            let time = time.trim_end_matches('Z');
            let mut line = format!("  {time}  {:<9}  {}", label(e.event), describe(e));
            // A loss and the lock-delay it armed are one line.
            if e.event == HistoryEventKind::Lost
                && let Some(delay) = events.next_if(|d| {
                    d.event == HistoryEventKind::LockDelay
                        && d.index == e.index
                        && d.session == e.session
                })
            {
                let ms = delay.until_ms.unwrap_or(delay.time_ms);
                line.push_str(&format!(
                    "  lock-delay {}",
                    duration(ms.saturating_sub(delay.time_ms))
                ));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

fn label(kind: HistoryEventKind) -> &'static str {
    match kind {
        HistoryEventKind::Granted => "granted",
        HistoryEventKind::Released => "released",
        HistoryEventKind::Lost => "lost",
        HistoryEventKind::LockDelay => "lock-delay",
        HistoryEventKind::LockDelayEnded => "lock-delay",
        HistoryEventKind::GaveUp => "gave up",
        HistoryEventKind::Deleted => "deleted",
    }
}

/// The session's ID, shortened as a human reads it.
fn short(session: &str) -> String {
    match session.get(..4) {
        Some(head) if session.len() > 4 => format!("{head}…"),
        _ => session.to_owned(),
    }
}

/// Milliseconds as `850 ms`, `1.8 s`, `15 s`.
fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms} ms");
    }
    let tenths = (ms + 50) / 100;
    match tenths % 10 {
        0 => format!("{} s", tenths / 10),
        t => format!("{}.{t} s", tenths / 10),
    }
}

fn describe(e: &HistoryEvent) -> String {
    let session = format!("session {}", short(&e.session));
    match e.event {
        HistoryEventKind::Granted => {
            let mut text = format!(
                "token {}  {} ({session})",
                e.token.unwrap_or_default(),
                e.node.as_deref().unwrap_or("-"),
            );
            if let Some(name) = e.session_name.as_deref().filter(|n| !n.is_empty()) {
                text.push_str(&format!(" \"{name}\""));
            }
            if let Some(waited) = e.waited_ms.filter(|w| *w > 0) {
                text.push_str(&format!("  waited {}", duration(waited)));
            }
            text
        }
        HistoryEventKind::Released => session,
        HistoryEventKind::Lost => cause(e).unwrap_or(session),
        HistoryEventKind::LockDelay => {
            let until = e.until.as_deref().unwrap_or_default();
            let until = until.split_once('T').map_or(until, |(_, t)| t);
            format!("until {}", until.trim_end_matches('Z'))
        }
        HistoryEventKind::LockDelayEnded => "ended".to_owned(),
        HistoryEventKind::GaveUp => match cause(e) {
            Some(why) => format!("waiter {session}: {why}"),
            None => format!("waiter {session}: its request ended"),
        },
        HistoryEventKind::Deleted => format!("key deleted while held by {session}"),
    }
}

/// Why the session was invalidated, in words.
fn cause(e: &HistoryEvent) -> Option<String> {
    let node = e.node.as_deref().unwrap_or("-");
    let check = e.check_id.as_deref().unwrap_or("-");
    let session = short(&e.session);
    Some(match e.cause? {
        HistoryCause::Destroyed => format!("session {session} destroyed"),
        HistoryCause::TtlExpired => format!("session {session} TTL lapsed"),
        HistoryCause::NodeFailed => format!("node {node} failed ({check})"),
        HistoryCause::CheckCritical => format!("check {check} on {node} critical"),
        HistoryCause::CheckDeregistered => format!("check {check} on {node} deregistered"),
        HistoryCause::NodeDeregistered => format!("node {node} deregistered"),
    })
}

#[cfg(test)]
mod tests {
    use vigil_shared::history::{Cause, Event, LockEvent, LockHistory, LockKind};
    use vigil_shared::lock::LockMode;

    use super::*;

    #[test]
    fn a_timeline_reads_as_the_issue_shows_it() {
        let day = 1_795_860_000_000; // 2026-11-28T10:00:00Z
        let time = |ms: u64| {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            vigil_shared::go::time::rfc3339_millis(at)
        };
        let event = |at: u64, session: &str, event: Event| LockEvent {
            index: at,
            at_ms: day + at,
            session: session.to_owned(),
            event,
        };
        let s1 = "8c1f2a3b-0000-4000-8000-000000000001";
        let s2 = "77aa0000-0000-4000-8000-000000000002";
        let history = LockHistory {
            name: "jobs".to_owned(),
            kind: LockKind::Queue,
            events: vec![
                event(
                    204,
                    s1,
                    Event::Granted {
                        node: "web-3".to_owned(),
                        session_name: String::new(),
                        token: 1042,
                        mode: LockMode::Exclusive,
                        waited_ms: Some(1_800),
                    },
                ),
                event(
                    1_017,
                    s1,
                    Event::Lost {
                        cause: Cause::CheckCritical {
                            node: "web-3".to_owned(),
                            check_id: "serfHealth".to_owned(),
                        },
                    },
                ),
                event(
                    1_017,
                    s1,
                    Event::LockDelay {
                        until_ms: day + 16_017,
                    },
                ),
                event(16_020, "", Event::LockDelayEnded),
                event(16_500, s2, Event::GaveUp { cause: None }),
                event(
                    17_000,
                    s2,
                    Event::Lost {
                        cause: Cause::TtlExpired,
                    },
                ),
            ],
        };
        let text = render(&[HistoryReport::new(&history, &time)]);
        assert_eq!(
            text,
            concat!(
                "queued lock jobs\n",
                "2026-11-28\n",
                "  10:00:00.204  granted    token 1042  web-3 (session 8c1f…)  waited 1.8 s\n",
                "  10:00:01.017  lost       node web-3 failed (serfHealth)  lock-delay 15 s\n",
                "  10:00:16.020  lock-delay  ended\n",
                "  10:00:16.500  gave up    waiter session 77aa…: its request ended\n",
                "  10:00:17.000  lost       session 77aa… TTL lapsed\n",
            )
        );
        assert_eq!(render(&[]), "no history recorded\n");
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(60_000), "60 s");
    }
}
