//! Leave notices: the foca custom broadcast that tells "member at addr A, generation G, left on
//! purpose". foca reports a graceful leave and a failure alike (`MemberDown`); the leader must
//! deregister the first and only mark the second critical, so a leaving node (or an operator's
//! force-leave) spreads a notice, and receivers classify that member's `MemberDown` as Left.
//!
//! User events ([`UserEvent`]) travel as the same kind of broadcast.
//!
//! foca owns the [`LeaveHandler`] and offers no accessor to it, so the handler forwards every new
//! notice and event through channels that the node drains after each foca call.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::mpsc;

use foca::{BroadcastHandler, Invalidates};
use serde::{Deserialize, Serialize};

use super::event::{EVENT_BUFFER, UserEvent, event_index};
use super::identity::Member;

/// "This member is leaving / has left on purpose."
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveNotice {
    pub addr: SocketAddr,
    pub generation: u64,
    /// Sent by `force-leave` on behalf of a failed member rather than by the member itself.
    pub forced: bool,
    /// `force-leave?prune`: besides Left, the member is no longer listed.
    pub prune: bool,
}

/// Every custom broadcast on the wire. Versioned by adding variants only.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Broadcast {
    Leave(LeaveNotice),
    Event(UserEvent),
}

impl LeaveNotice {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(&Broadcast::Leave(*self))
            .expect("postcard encodes a fixed-shape struct into a Vec")
    }
}

impl UserEvent {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(&Broadcast::Event(self.clone()))
            .expect("postcard encodes strings and bytes into a Vec")
    }
}

/// A custom broadcast that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("undecodable gossip broadcast: {0}")]
pub struct BroadcastError(#[from] postcard::Error);

/// Identifies a broadcast in foca's backlog: a newer generation of the same address replaces
/// an older leave notice; an event is only ever itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveKey {
    Leave {
        addr: SocketAddr,
        generation: u64,
    },
    /// The event's index (its folded UUID).
    Event(u64),
}

impl Invalidates for LeaveKey {
    fn invalidates(&self, other: &Self) -> bool {
        match (self, other) {
            (
                LeaveKey::Leave { addr, generation },
                LeaveKey::Leave {
                    addr: other_addr,
                    generation: other_generation,
                },
            ) => addr == other_addr && generation >= other_generation,
            (LeaveKey::Event(a), LeaveKey::Event(b)) => a == b,
            _ => false,
        }
    }
}

/// Decides which notices and events are new (foca keeps spreading those) and forwards them to
/// the node.
pub struct LeaveHandler {
    /// Newest generation seen leaving per address, and whether it was pruned; older notices
    /// are stale, and so is an equal one unless it newly prunes.
    seen: HashMap<SocketAddr, (u64, bool)>,
    notices: mpsc::Sender<LeaveNotice>,
    /// IDs of the events seen lately, oldest first (as many as a node keeps, twice over).
    seen_events: VecDeque<String>,
    events: mpsc::Sender<UserEvent>,
}

impl LeaveHandler {
    pub fn new() -> (
        LeaveHandler,
        mpsc::Receiver<LeaveNotice>,
        mpsc::Receiver<UserEvent>,
    ) {
        let (tx, rx) = mpsc::channel();
        let (events_tx, events_rx) = mpsc::channel();
        (
            LeaveHandler {
                seen: HashMap::new(),
                notices: tx,
                seen_events: VecDeque::new(),
                events: events_tx,
            },
            rx,
            events_rx,
        )
    }

    fn receive_notice(&mut self, notice: LeaveNotice) -> Option<LeaveKey> {
        if self
            .seen
            .get(&notice.addr)
            .is_some_and(|&(generation, pruned)| {
                generation > notice.generation
                    || (generation == notice.generation && (pruned || !notice.prune))
            })
        {
            return None;
        }
        self.seen
            .insert(notice.addr, (notice.generation, notice.prune));
        // The receiver lives in the same node as foca; it only disappears with it.
        let _ = self.notices.send(notice);
        Some(LeaveKey::Leave {
            addr: notice.addr,
            generation: notice.generation,
        })
    }

    fn receive_event(&mut self, event: UserEvent) -> Option<LeaveKey> {
        if self.seen_events.contains(&event.id) {
            return None;
        }
        if self.seen_events.len() == 2 * EVENT_BUFFER {
            self.seen_events.pop_front();
        }
        self.seen_events.push_back(event.id.clone());
        let key = LeaveKey::Event(event_index(&event.id));
        let _ = self.events.send(event);
        Some(key)
    }
}

impl BroadcastHandler<Member> for LeaveHandler {
    type Key = LeaveKey;
    type Error = BroadcastError;

    fn receive_item(
        &mut self,
        data: &[u8],
        _sender: Option<&Member>,
    ) -> Result<Option<LeaveKey>, BroadcastError> {
        Ok(match postcard::from_bytes(data)? {
            Broadcast::Leave(notice) => self.receive_notice(notice),
            Broadcast::Event(event) => self.receive_event(event),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(generation: u64) -> LeaveNotice {
        LeaveNotice {
            addr: "127.0.0.1:9000".parse().unwrap(),
            generation,
            forced: false,
            prune: false,
        }
    }

    #[test]
    fn new_notices_spread_and_repeats_stop() {
        let (mut handler, rx, _) = LeaveHandler::new();
        let first = handler.receive_item(&notice(5).encode(), None).unwrap();
        assert!(first.is_some());
        assert_eq!(rx.try_recv().unwrap(), notice(5));
        assert!(
            handler
                .receive_item(&notice(5).encode(), None)
                .unwrap()
                .is_none()
        );
        assert!(
            handler
                .receive_item(&notice(4).encode(), None)
                .unwrap()
                .is_none()
        );
        assert!(rx.try_recv().is_err());
        assert!(
            handler
                .receive_item(&notice(6).encode(), None)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn newer_generation_invalidates_older() {
        let addr = "127.0.0.1:9000".parse().unwrap();
        let old = LeaveKey::Leave {
            addr,
            generation: 1,
        };
        let new = LeaveKey::Leave {
            addr,
            generation: 2,
        };
        assert!(new.invalidates(&old));
        assert!(!old.invalidates(&new));
        let elsewhere = LeaveKey::Leave {
            addr: "127.0.0.1:9001".parse().unwrap(),
            generation: 9,
        };
        assert!(!elsewhere.invalidates(&old));
        assert!(LeaveKey::Event(3).invalidates(&LeaveKey::Event(3)));
        assert!(!LeaveKey::Event(3).invalidates(&LeaveKey::Event(4)));
        assert!(!LeaveKey::Event(3).invalidates(&old));
    }

    #[test]
    fn a_new_event_spreads_once() {
        let (mut handler, _notices, events) = LeaveHandler::new();
        let event = UserEvent {
            id: "00000000-0000-0000-0000-000000000001".to_owned(),
            name: "deploy".to_owned(),
            payload: b"v2".to_vec(),
            node_filter: String::new(),
            service_filter: String::new(),
            tag_filter: String::new(),
            ltime: 1,
        };
        let key = handler.receive_item(&event.encode(), None).unwrap();
        assert_eq!(key, Some(LeaveKey::Event(1)));
        assert_eq!(events.try_recv().unwrap(), event);
        assert!(
            handler
                .receive_item(&event.encode(), None)
                .unwrap()
                .is_none()
        );
        assert!(events.try_recv().is_err());
    }

    #[test]
    fn garbage_is_an_error() {
        let (mut handler, _rx, _events) = LeaveHandler::new();
        assert!(handler.receive_item(&[7, 7, 7], None).is_err());
    }
}
