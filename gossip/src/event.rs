//! User events (Consul's `/v1/event/fire` and `/v1/event/list`): a name and a small payload that
//! gossip carries to every member, as Serf's user events do. Each node keeps the last
//! [`EVENT_BUFFER`] events it has seen, oldest first; an event is recorded once however often it
//! arrives.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Consul's `UserEventSizeLimit`: the name and the payload together, before encoding.
pub const EVENT_SIZE_LIMIT: usize = 512;
/// Events a node remembers (Consul's agent keeps 256).
pub const EVENT_BUFFER: usize = 256;

/// One user event as it travels and as the agent lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEvent {
    /// A UUID, also the event's identity for de-duplication.
    pub id: String,
    pub name: String,
    pub payload: Vec<u8>,
    /// Regular expressions: only nodes, services and tags matching them act on the event.
    pub node_filter: String,
    pub service_filter: String,
    pub tag_filter: String,
    /// Lamport time: one more than the newest event the firing node had seen.
    pub ltime: u64,
}

/// The events a node has seen, and its Lamport clock for the next one it fires.
#[derive(Debug, Default)]
pub struct EventLog {
    events: VecDeque<UserEvent>,
    clock: u64,
}

impl EventLog {
    /// Keeps `event` unless it is known already; returns whether it was new.
    pub fn record(&mut self, event: UserEvent) -> bool {
        if self.events.iter().any(|e| e.id == event.id) {
            return false;
        }
        self.clock = self.clock.max(event.ltime);
        if self.events.len() == EVENT_BUFFER {
            self.events.pop_front();
        }
        self.events.push_back(event);
        true
    }

    /// The Lamport time for an event fired here.
    pub fn next_ltime(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Oldest first.
    pub fn events(&self) -> Vec<UserEvent> {
        self.events.iter().cloned().collect()
    }
}

/// Consul's `uuidToUint64`: an event list's index is its last event's ID, the first 64 bits
/// of the UUID XORed with the last 64 (0 for anything that is not a UUID).
pub fn event_index(id: &str) -> u64 {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return 0;
    }
    let half = |s: &str| u64::from_str_radix(s, 16).unwrap_or(0);
    half(&hex[..16]) ^ half(&hex[16..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, ltime: u64) -> UserEvent {
        UserEvent {
            id: id.to_owned(),
            name: "deploy".to_owned(),
            payload: Vec::new(),
            node_filter: String::new(),
            service_filter: String::new(),
            tag_filter: String::new(),
            ltime,
        }
    }

    #[test]
    fn each_event_is_kept_once_and_the_oldest_go_first() {
        let mut log = EventLog::default();
        assert!(log.record(event("a", 1)));
        assert!(!log.record(event("a", 1)), "a repeat is not new");
        for i in 0..EVENT_BUFFER {
            log.record(event(&format!("e{i}"), 2));
        }
        let events = log.events();
        assert_eq!(events.len(), EVENT_BUFFER);
        assert_eq!(events[0].id, "e0", "the first event fell out");
        assert_eq!(
            events[EVENT_BUFFER - 1].id,
            format!("e{}", EVENT_BUFFER - 1)
        );
    }

    #[test]
    fn the_clock_runs_past_every_event_seen() {
        let mut log = EventLog::default();
        assert_eq!(log.next_ltime(), 1);
        log.record(event("b", 7));
        assert_eq!(log.next_ltime(), 8);
    }

    #[test]
    fn the_index_folds_the_uuid_as_consul_does() {
        let id = "00000000-0000-0001-0000-000000000003";
        assert_eq!(event_index(id), 1 ^ 3);
        assert_eq!(
            event_index("ffffffff-ffff-ffff-0000-000000000000"),
            u64::MAX
        );
        assert_eq!(event_index("not-a-uuid"), 0);
    }
}
