//! [`Held`]: what every acquisition returns (a lock, a semaphore slot, a fair mutex, a
//! leadership), with the sequencer `(key, lock_index, session)`, a `lost()` future fed by a
//! background monitor, and `release()`. The single-key monitor used by locks lives here too.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_shared::kv::KvEntry;

use super::keeper::SessionKeeper;
use super::lost::{LossReason, LostSignal, LostTrigger};
use super::{Client, ClientError, ReadOpts, next_wait_index};

/// How long each monitor read blocks on the server.
pub(crate) const MONITOR_WAIT: Duration = Duration::from_secs(300);
/// Pause before a monitor retries a failed read.
pub(crate) const MONITOR_RETRY: Duration = Duration::from_secs(1);

/// What a [`Held`]'s sequencer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldKind {
    /// A KV key: `(Key, LockIndex, Session)`.
    Key,
    /// A lock of the server-side queue: `(lock name, token, Session)`.
    Queue,
}

impl HeldKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HeldKind::Key => "key",
            HeldKind::Queue => "queue",
        }
    }
}

/// A held lock. Dropping it releases in the background (see [`Client::drain_cleanups`]);
/// [`Held::release`] does it now and reports errors.
pub struct Held {
    kind: HeldKind,
    key: String,
    session: String,
    lock_index: u64,
    keeper: Option<SessionKeeper>,
    monitor: JoinHandle<()>,
    lost: LostSignal,
}

impl Held {
    pub(crate) fn new(
        key: String,
        lock_index: u64,
        keeper: SessionKeeper,
        monitor: JoinHandle<()>,
        lost: LostSignal,
    ) -> Held {
        Held {
            kind: HeldKind::Key,
            key,
            session: keeper.id().to_owned(),
            lock_index,
            keeper: Some(keeper),
            monitor,
            lost,
        }
    }

    /// Marks a hold of the server-side queue.
    pub(crate) fn queued(mut self) -> Held {
        self.kind = HeldKind::Queue;
        self
    }

    pub fn kind(&self) -> HeldKind {
        self.kind
    }

    /// The key whose `(Key, LockIndex, Session)` is this holder's sequencer: the lock key, or
    /// the contender key of a semaphore slot or fair mutex; for the server-side queue, the
    /// lock's name (and [`Held::lock_index`] is its fencing token).
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    pub fn lock_index(&self) -> u64 {
        self.lock_index
    }

    /// Resolves once the lock is no longer held: session invalidated, key released, deleted or
    /// taken by an operator, agent unreachable past the TTL or gone (it refused a connection),
    /// or released.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let lost = self.lost.clone();
        async move { lost.wait().await }
    }

    /// Why it was lost, if it already was.
    pub fn is_lost(&self) -> Option<LossReason> {
        self.lost.get()
    }

    /// Releases (release or delete the keys, as the recipe requires) and destroys the session.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.monitor.abort();
        match self.keeper.take() {
            Some(keeper) => keeper.close().await,
            None => Ok(()),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The keeper's own drop queues the release and the session destroy.
        self.monitor.abort();
    }
}

/// How long a monitor keeps retrying failed reads before the lock counts as lost: `retries`
/// pauses of [`MONITOR_RETRY`] when set (Consul's `MonitorRetries`), at most `ttl`.
pub(crate) fn unreachable_after(retries: Option<u32>, ttl: Duration) -> Duration {
    retries.map_or(ttl, |n| (MONITOR_RETRY * n).min(ttl))
}

/// What one look at a held lock found.
pub(crate) enum Look {
    /// Still held; block past this index next.
    Held {
        index: u64,
    },
    Lost(LossReason),
}

/// Looks at a held lock (blocking past the index it is given) until it is lost, the session is
/// lost, or the agent has been unreachable for `unreachable_after`; then fires `trigger` with
/// the reason. A failed look is retried from index 0 after [`MONITOR_RETRY`].
pub(crate) async fn monitor<F, Fut>(
    mut index: u64,
    keeper_lost: LostSignal,
    trigger: LostTrigger,
    unreachable_after: Duration,
    mut look: F,
) where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Look, ClientError>>,
{
    let mut last_ok = Instant::now();
    loop {
        let result = tokio::select! {
            reason = keeper_lost.wait() => {
                trigger.fire(reason);
                return;
            }
            result = look(index) => result,
        };
        match result {
            Ok(Look::Held { index: next }) => {
                last_ok = Instant::now();
                index = next;
            }
            Ok(Look::Lost(reason)) => {
                trigger.fire(reason);
                return;
            }
            Err(e) => {
                if last_ok.elapsed() >= unreachable_after {
                    trigger.fire(LossReason::Unreachable);
                    return;
                }
                tracing::debug!(error = %e, "lock monitor read failed, retrying");
                index = 0;
                // The session's loss (the agent gone, say) ends the pause too.
                if let Err(ClientError::SessionLost(reason)) = keeper_lost
                    .unless_lost(tokio::time::sleep(MONITOR_RETRY))
                    .await
                {
                    trigger.fire(reason);
                    return;
                }
            }
        }
    }
}

/// Watches `key` until it is no longer held by `session` (see [`monitor`]).
pub(crate) async fn monitor_key(
    client: Client,
    key: String,
    session: String,
    index: u64,
    keeper_lost: LostSignal,
    trigger: LostTrigger,
    unreachable_after: Duration,
) {
    let look = |index: u64| {
        let (client, key, session) = (client.clone(), key.clone(), session.clone());
        async move {
            let opts = ReadOpts::blocking(index, MONITOR_WAIT).consistent();
            Ok(match client.kv_get(&key, opts).await? {
                (Some(entry), meta) if entry.session.as_deref() == Some(session.as_str()) => {
                    Look::Held {
                        index: next_wait_index(index, meta.index),
                    }
                }
                (entry, _) => Look::Lost(explain(&client, &session, entry.as_ref()).await),
            })
        }
    };
    monitor(index, keeper_lost, trigger, unreachable_after, look).await;
}

/// Why `session` no longer holds a key now in state `entry`.
pub(crate) async fn explain(client: &Client, session: &str, entry: Option<&KvEntry>) -> LossReason {
    match entry.and_then(|e| e.session.as_deref()) {
        Some(other) if other != session => LossReason::TakenBy(other.to_owned()),
        _ => match client.session_info(session, ReadOpts::default()).await {
            Ok((None, _)) => LossReason::SessionInvalidated,
            _ if entry.is_none() => LossReason::KeyDeleted,
            _ => LossReason::KeyReleased,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_retries_bound_the_wait_for_an_unreachable_agent() {
        let ttl = Duration::from_secs(15);
        assert_eq!(unreachable_after(None, ttl), ttl, "default: a whole TTL");
        assert_eq!(unreachable_after(Some(0), ttl), Duration::ZERO);
        assert_eq!(unreachable_after(Some(3), ttl), Duration::from_secs(3));
        assert_eq!(
            unreachable_after(Some(60), ttl),
            ttl,
            "never beyond the TTL"
        );
    }
}
