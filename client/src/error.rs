//! What can go wrong talking to an agent or running a recipe. Recipe errors keep the texts of
//! Consul's Go client (`Existing key does not match lock use`, …) so scripts can match on them.

use super::Reply;
use super::lost::LossReason;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent did not answer (connection refused, timeout): retry later or elsewhere.
    #[error("agent at {addr} unreachable: {source}")]
    Unreachable {
        addr: String,
        #[source]
        source: reqwest::Error,
    },
    /// The agent answered with an error status; `body` is its plain-text message.
    #[error("agent answered {status}: {body}")]
    Api { status: u16, body: String },
    /// The agent's answer could not be decoded.
    #[error("unexpected answer from the agent: {0}")]
    Decode(String),
    #[error("invalid agent address {0:?}")]
    BadAddress(String),
    /// The client's settings (TLS files, `CONSUL_HTTP_SSL`, the token file) are unusable.
    #[error("client configuration: {0}")]
    BadConfig(String),
    #[error("missing key")]
    MissingKey,
    #[error("missing prefix")]
    MissingPrefix,
    #[error("semaphore limit must be positive")]
    BadLimit,
    /// The key exists with flags of another recipe (a semaphore's `.lock`, a plain key).
    #[error("Existing key does not match lock use")]
    LockConflict,
    #[error("Existing key does not match semaphore use")]
    SemaphoreConflict,
    /// A plain lock or a semaphore already uses the fair mutex's prefix.
    #[error("Existing key does not match fair lock use")]
    FairConflict,
    #[error("semaphore limit conflict (lock: {lock}, local: {local})")]
    LimitConflict { lock: i64, local: i64 },
    #[error("failed to make contender entry: acquire refused")]
    ContenderEntry,
    #[error("Lock in use")]
    LockInUse,
    #[error("Semaphore in use")]
    SemaphoreInUse,
    /// The lock was not granted within the requested timeout (the contender left the queue).
    #[error("timed out waiting for the lock")]
    Timeout,
    /// Our own session died before the lock was acquired.
    #[error("session lost while waiting: {0}")]
    SessionLost(LossReason),
}

impl ClientError {
    pub(crate) fn api(reply: &Reply) -> ClientError {
        ClientError::Api {
            status: reply.status,
            body: reply.text(),
        }
    }

    /// Whether retrying the same request later may succeed (the agent was unreachable or
    /// answered 5xx), as Consul's client decides for monitor retries.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Api { status, .. } => *status >= 500,
            _ => false,
        }
    }
}
