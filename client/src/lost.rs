//! The "lock lost" signal: set at most once by whoever notices (the session keeper, a key
//! monitor), awaited by any number of holders. Once set it never changes.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

use super::ClientError;

/// Why a held lock (or a session) is no longer held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// The session was destroyed, expired, or its node or a check failed.
    SessionInvalidated,
    /// The lock key lost its session (an operator's release, or the session's invalidation).
    KeyReleased,
    /// The lock key was deleted.
    KeyDeleted,
    /// Another session holds the key now.
    TakenBy(String),
    /// Our session is no longer among the semaphore's holders.
    SlotRemoved,
    /// The agent could not be reached for longer than the session TTL.
    Unreachable,
    /// The holder released it (or the watcher stopped).
    Released,
    /// The agent on this host that the session was created through refused a connection: its
    /// process is gone, and the cluster frees the session's locks within about a second.
    AgentGone,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::SessionInvalidated => f.write_str("session invalidated"),
            LossReason::KeyReleased => f.write_str("lock key released"),
            LossReason::KeyDeleted => f.write_str("lock key deleted"),
            LossReason::TakenBy(s) => write!(f, "lock key taken by session {s}"),
            LossReason::SlotRemoved => f.write_str("no longer a semaphore holder"),
            LossReason::Unreachable => {
                f.write_str("agent unreachable for longer than the session TTL")
            }
            LossReason::Released => f.write_str("released"),
            LossReason::AgentGone => {
                f.write_str("the local agent is gone (it refused a connection)")
            }
        }
    }
}

/// The setting side. Clones share one signal.
#[derive(Clone)]
pub(crate) struct LostTrigger(Arc<watch::Sender<Option<LossReason>>>);

impl LostTrigger {
    pub fn new() -> (LostTrigger, LostSignal) {
        let (tx, rx) = watch::channel(None);
        (LostTrigger(Arc::new(tx)), LostSignal(rx))
    }

    /// The signal this trigger sets.
    pub fn signal(&self) -> LostSignal {
        LostSignal(self.0.subscribe())
    }

    /// Sets the reason unless one is already set.
    pub fn fire(&self, reason: LossReason) {
        self.0.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

/// The awaiting side: cheap to clone.
#[derive(Clone)]
pub struct LostSignal(watch::Receiver<Option<LossReason>>);

impl LostSignal {
    /// The reason, if it is already lost.
    pub fn get(&self) -> Option<LossReason> {
        self.0.borrow().clone()
    }

    /// Resolves once lost. If every trigger is dropped without firing, the watcher stopped, which
    /// counts as [`LossReason::Released`].
    pub async fn wait(&self) -> LossReason {
        let mut rx = self.0.clone();
        loop {
            if let Some(reason) = rx.borrow_and_update().clone() {
                return reason;
            }
            if rx.changed().await.is_err() {
                return rx.borrow().clone().unwrap_or(LossReason::Released);
            }
        }
    }

    /// What `work` resolves to, unless the loss comes first: then [`ClientError::SessionLost`].
    /// How a recipe waits (a blocking read, a pause) on behalf of a session it may lose.
    pub(crate) async fn unless_lost<T>(
        &self,
        work: impl Future<Output = T>,
    ) -> Result<T, ClientError> {
        tokio::select! {
            reason = self.wait() => Err(ClientError::SessionLost(reason)),
            output = work => Ok(output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_once_and_keeps_the_first_reason() {
        let (trigger, signal) = LostTrigger::new();
        assert_eq!(signal.get(), None);
        trigger.fire(LossReason::KeyDeleted);
        trigger.fire(LossReason::Unreachable);
        assert_eq!(signal.wait().await, LossReason::KeyDeleted);
    }

    #[tokio::test]
    async fn dropping_every_trigger_means_released() {
        let (trigger, signal) = LostTrigger::new();
        drop(trigger);
        assert_eq!(signal.wait().await, LossReason::Released);
    }
}
