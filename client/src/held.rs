//! [`Held`]: what every acquisition returns (a lock, a semaphore slot, a fair mutex, a
//! leadership), with the sequencer `(key, lock_index, session)`, a `lost()` future fed by a
//! background monitor, and `release()`. The single-key monitor used by locks lives here too.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use vigil_shared::kv::KvEntry;

use super::keeper::SessionKeeper;
use super::lost::{LossReason, LostSignal, LostTrigger};
use super::{Client, ClientError, ReadOpts, next_wait_index};

/// How long each monitor read blocks on the server.
pub(crate) const MONITOR_WAIT: Duration = Duration::from_secs(300);
/// Pause before a monitor retries a failed read.
pub(crate) const MONITOR_RETRY: Duration = Duration::from_secs(1);
/// How long a monitor's read in flight may go on once the lock is released: the release wakes
/// it at once, unless it never lands.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(2);

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
    /// The monitor's trigger: set to [`LossReason::Released`] when the holder lets go, which
    /// ends the monitor.
    trigger: LostTrigger,
    lost: LostSignal,
}

impl Held {
    pub(crate) fn new(
        key: String,
        lock_index: u64,
        keeper: SessionKeeper,
        trigger: LostTrigger,
    ) -> Held {
        Held {
            kind: HeldKind::Key,
            key,
            session: keeper.id().to_owned(),
            lock_index,
            keeper: Some(keeper),
            lost: trigger.signal(),
            trigger,
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
        self.trigger.fire(LossReason::Released);
        match self.keeper.take() {
            Some(keeper) => keeper.close().await,
            None => Ok(()),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The keeper's own drop queues the release and the session destroy.
        self.trigger.fire(LossReason::Released);
    }
}

/// How long a monitor keeps retrying failed reads before the lock counts as lost: `retries`
/// pauses of [`MONITOR_RETRY`] when set (Consul's `MonitorRetries`), at most `ttl`.
pub(crate) fn unreachable_after(retries: Option<u32>, ttl: Duration) -> Duration {
    retries.map_or(ttl, |n| (MONITOR_RETRY * n).min(ttl))
}

/// What one look at a held lock found.
pub(crate) enum Look<W> {
    /// Still held; block past this index next.
    Held { index: u64 },
    /// No longer held: `W` works out why (it may ask the agent), awaited only while the
    /// lock is still wanted.
    Lost(W),
}

/// Looks at a held lock (blocking past the index it is given) until it is lost, the session is
/// lost, or the agent has been unreachable for `unreachable_after`; then fires `trigger` with
/// the reason. A failed look is retried from index 0 after [`MONITOR_RETRY`].
///
/// Once `trigger` is set by anyone else (the holder releasing), the monitor ends, but not by
/// cutting its read in flight: the release wakes that read, and letting it answer keeps its
/// connection for the client's next request where cutting it would close it. It gets
/// [`RELEASE_GRACE`] for that, for a release that never lands.
pub(crate) async fn monitor<F, Fut, W>(
    mut index: u64,
    keeper_lost: LostSignal,
    trigger: LostTrigger,
    unreachable_after: Duration,
    mut look: F,
) where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Look<W>, ClientError>>,
    W: Future<Output = LossReason>,
{
    let settled = trigger.signal();
    let mut last_ok = Instant::now();
    while settled.get().is_none() {
        let read = look(index);
        tokio::pin!(read);
        let result = tokio::select! {
            biased;
            _ = settled.wait() => {
                // An answer after the grace would change nothing: it is dropped either way.
                let _ = tokio::time::timeout(RELEASE_GRACE, read).await;
                return;
            }
            reason = keeper_lost.wait() => {
                trigger.fire(reason);
                return;
            }
            result = &mut read => result,
        };
        match result {
            Ok(Look::Held { index: next }) => {
                last_ok = Instant::now();
                index = next;
            }
            Ok(Look::Lost(why)) => {
                // A release (our own, most often) is not worth a request to explain.
                tokio::select! {
                    biased;
                    _ = settled.wait() => {}
                    reason = why => trigger.fire(reason),
                }
                return;
            }
            Err(e) => {
                if last_ok.elapsed() >= unreachable_after {
                    trigger.fire(LossReason::Unreachable);
                    return;
                }
                tracing::debug!(error = %e, "lock monitor read failed, retrying");
                index = 0;
                // The session's loss (the agent gone, say) or the release ends the pause too.
                tokio::select! {
                    biased;
                    _ = settled.wait() => return,
                    reason = keeper_lost.wait() => {
                        trigger.fire(reason);
                        return;
                    }
                    () = tokio::time::sleep(MONITOR_RETRY) => {}
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
                (entry, _) => {
                    Look::Lost(async move { explain(&client, &session, entry.as_ref()).await })
                }
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
    use std::future::{Ready, pending};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const TTL: Duration = Duration::from_secs(15);

    /// A look that never answers (a release that never lands, an agent that stalls).
    fn stalled(_index: u64) -> impl Future<Output = Result<Look<Ready<LossReason>>, ClientError>> {
        pending()
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_lets_the_read_in_flight_answer_and_asks_nothing_more() {
        let (trigger, lost) = LostTrigger::new();
        let (_keeper, keeper_lost) = LostTrigger::new();
        let (answered, explained) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, e) = (Arc::clone(&answered), Arc::clone(&explained));
        let look = move |_index| {
            let (a, e) = (Arc::clone(&a), Arc::clone(&e));
            async move {
                // The blocking read, which the release wakes.
                tokio::time::sleep(Duration::from_millis(20)).await;
                a.fetch_add(1, Ordering::SeqCst);
                Ok(Look::Lost(async move {
                    e.fetch_add(1, Ordering::SeqCst);
                    LossReason::KeyReleased
                }))
            }
        };
        let watching = tokio::spawn(monitor(7, keeper_lost, trigger.clone(), TTL, look));
        tokio::task::yield_now().await;
        trigger.fire(LossReason::Released);
        watching.await.unwrap();
        assert_eq!(
            answered.load(Ordering::SeqCst),
            1,
            "the read in flight was cut"
        );
        assert_eq!(
            explained.load(Ordering::SeqCst),
            0,
            "a release was explained"
        );
        assert_eq!(lost.get(), Some(LossReason::Released));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_the_release_never_wakes_is_given_up_after_the_grace() {
        let (trigger, _lost) = LostTrigger::new();
        let (_keeper, keeper_lost) = LostTrigger::new();
        let watching = tokio::spawn(monitor(7, keeper_lost, trigger.clone(), TTL, stalled));
        tokio::task::yield_now().await;
        let released = Instant::now();
        trigger.fire(LossReason::Released);
        watching.await.unwrap();
        assert_eq!(released.elapsed(), RELEASE_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_monitor_of_a_lock_already_let_go_reads_nothing() {
        let (trigger, _lost) = LostTrigger::new();
        let (_keeper, keeper_lost) = LostTrigger::new();
        trigger.fire(LossReason::KeyReleased);
        let looks = AtomicUsize::new(0);
        let look = |index| {
            looks.fetch_add(1, Ordering::SeqCst);
            stalled(index)
        };
        monitor(7, keeper_lost, trigger, TTL, look).await;
        assert_eq!(looks.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sessions_loss_still_ends_a_stalled_read() {
        let (trigger, lost) = LostTrigger::new();
        let (keeper, keeper_lost) = LostTrigger::new();
        let watching = tokio::spawn(monitor(7, keeper_lost, trigger, TTL, stalled));
        tokio::task::yield_now().await;
        keeper.fire(LossReason::SessionInvalidated);
        watching.await.unwrap();
        assert_eq!(lost.get(), Some(LossReason::SessionInvalidated));
    }

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
