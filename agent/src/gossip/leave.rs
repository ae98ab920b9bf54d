//! Leave notices: the foca custom broadcast that tells "member at addr A, generation G, left on
//! purpose". foca reports a graceful leave and a failure alike (`MemberDown`); the leader must
//! deregister the first and only mark the second critical, so a leaving node (or an operator's
//! force-leave) spreads a notice, and receivers classify that member's `MemberDown` as Left.
//!
//! foca owns the [`LeaveHandler`] and offers no accessor to it, so the handler forwards every new
//! notice through a channel that the node drains after each foca call.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc;

use foca::{BroadcastHandler, Invalidates};
use serde::{Deserialize, Serialize};

use super::identity::Member;

/// "This member is leaving / has left on purpose."
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveNotice {
    pub addr: SocketAddr,
    pub generation: u64,
    /// Sent by `force-leave` on behalf of a failed member rather than by the member itself.
    pub forced: bool,
}

/// Every custom broadcast on the wire. Versioned by adding variants only.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Broadcast {
    Leave(LeaveNotice),
}

impl LeaveNotice {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(&Broadcast::Leave(*self))
            .expect("postcard encodes a fixed-shape struct into a Vec")
    }

    fn decode(data: &[u8]) -> Result<LeaveNotice, BroadcastError> {
        match postcard::from_bytes(data)? {
            Broadcast::Leave(notice) => Ok(notice),
        }
    }
}

/// A custom broadcast that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("undecodable gossip broadcast: {0}")]
pub struct BroadcastError(#[from] postcard::Error);

/// Identifies a notice in foca's broadcast backlog; a newer generation of the same address
/// replaces an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaveKey {
    addr: SocketAddr,
    generation: u64,
}

impl Invalidates for LeaveKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.addr == other.addr && self.generation >= other.generation
    }
}

/// Decides which notices are new (foca keeps spreading those) and forwards them to the node.
pub struct LeaveHandler {
    /// Newest generation seen leaving per address; older or equal notices are stale.
    seen: HashMap<SocketAddr, u64>,
    notices: mpsc::Sender<LeaveNotice>,
}

impl LeaveHandler {
    pub fn new() -> (LeaveHandler, mpsc::Receiver<LeaveNotice>) {
        let (tx, rx) = mpsc::channel();
        (
            LeaveHandler {
                seen: HashMap::new(),
                notices: tx,
            },
            rx,
        )
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
        let notice = LeaveNotice::decode(data)?;
        if self
            .seen
            .get(&notice.addr)
            .is_some_and(|&seen| seen >= notice.generation)
        {
            return Ok(None);
        }
        self.seen.insert(notice.addr, notice.generation);
        // The receiver lives in the same node as foca; it only disappears with it.
        let _ = self.notices.send(notice);
        Ok(Some(LeaveKey {
            addr: notice.addr,
            generation: notice.generation,
        }))
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
        }
    }

    #[test]
    fn new_notices_spread_and_repeats_stop() {
        let (mut handler, rx) = LeaveHandler::new();
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
        let old = LeaveKey {
            addr,
            generation: 1,
        };
        let new = LeaveKey {
            addr,
            generation: 2,
        };
        assert!(new.invalidates(&old));
        assert!(!old.invalidates(&new));
        let elsewhere = LeaveKey {
            addr: "127.0.0.1:9001".parse().unwrap(),
            generation: 9,
        };
        assert!(!elsewhere.invalidates(&old));
    }

    #[test]
    fn garbage_is_an_error() {
        let (mut handler, _rx) = LeaveHandler::new();
        assert!(handler.receive_item(&[7, 7, 7], None).is_err());
    }
}
