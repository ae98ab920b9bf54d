//! Vigil's own HTTP contract: the JSON bodies the `/v1/vigil/*` endpoints answer, for the agent
//! that writes them and the clients and CLI that read them. Plain serde types, without the
//! `client` feature.

use serde::{Deserialize, Serialize};

use crate::lock::LockMode;

/// Why an acquire answers without the lock (`Reason` in [`AcquireReply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotAcquired {
    /// A try found the lock taken.
    Held,
    /// A try found the lock in its lock-delay.
    LockDelay,
    /// The request's wait ended first: the session is still in the queue, and asking again
    /// resumes the wait (HTTP 202).
    Queued,
    /// The request's `timeout` passed: the session left the queue.
    Timeout,
    /// The session left the queue meanwhile (released, or invalidated).
    Removed,
}

/// The answer to an acquire, `PUT /v1/vigil/lock/<name>?session=S`, for the agent that writes it
/// and the clients that read it. The mode is the one the session holds or waits for, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AcquireReply {
    pub lock: String,
    pub session: String,
    pub mode: LockMode,
    pub acquired: bool,
    /// The fencing token, when acquired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Still waiting in the queue (the request's wait ended first); never with `acquired`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<NotAcquired>,
    /// The place in the queue while queued (1: next in line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// With reason `lock-delay`: how long it has left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_remaining_ms: Option<u64>,
}
