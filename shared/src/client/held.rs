//! [`Held`]: what every acquisition returns (a lock, a semaphore slot, a fair mutex, a
//! leadership), with the sequencer `(key, lock_index, session)`, a `lost()` future fed by a
//! background monitor, and `release()`. The single-key monitor used by locks lives here too.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::keeper::SessionKeeper;
use super::lost::{LossReason, LostSignal, LostTrigger};
use super::{Client, ClientError, ReadOpts, next_wait_index};
use crate::kv::KvEntry;

/// How long each monitor read blocks on the server.
pub(crate) const MONITOR_WAIT: Duration = Duration::from_secs(300);
/// Pause before a monitor retries a failed read.
pub(crate) const MONITOR_RETRY: Duration = Duration::from_secs(1);

/// A held lock. Dropping it releases in the background (see [`Client::drain_cleanups`]);
/// [`Held::release`] does it now and reports errors.
pub struct Held {
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
            key,
            session: keeper.id().to_owned(),
            lock_index,
            keeper: Some(keeper),
            monitor,
            lost,
        }
    }

    /// The key whose `(Key, LockIndex, Session)` is this holder's sequencer: the lock key, or
    /// the contender key of a semaphore slot or fair mutex.
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
    /// taken by an operator, agent unreachable past the TTL, or released.
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

/// Watches `key` until it is no longer held by `session`, the session is lost, or the agent has
/// been unreachable for `unreachable_after`; then fires `trigger` with the reason.
pub(crate) async fn monitor_key(
    client: Client,
    key: String,
    session: String,
    mut index: u64,
    keeper_lost: LostSignal,
    trigger: LostTrigger,
    unreachable_after: Duration,
) {
    let mut last_ok = Instant::now();
    loop {
        let opts = ReadOpts::blocking(index, MONITOR_WAIT).consistent();
        let result = tokio::select! {
            reason = keeper_lost.wait() => {
                trigger.fire(reason);
                return;
            }
            result = client.kv_get(&key, opts) => result,
        };
        match result {
            Ok((Some(entry), meta)) if entry.session.as_deref() == Some(session.as_str()) => {
                last_ok = Instant::now();
                index = next_wait_index(index, meta.index);
            }
            Ok((entry, _)) => {
                trigger.fire(explain(&client, &session, entry.as_ref()).await);
                return;
            }
            Err(e) => {
                if last_ok.elapsed() >= unreachable_after {
                    trigger.fire(LossReason::Unreachable);
                    return;
                }
                tracing::debug!(%key, error = %e, "lock monitor read failed, retrying");
                index = 0;
                tokio::time::sleep(MONITOR_RETRY).await;
            }
        }
    }
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
