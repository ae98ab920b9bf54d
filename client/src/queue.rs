//! Recipes on the server-side lock queue (`/v1/vigil/lock/<name>`): [`LockQueue`] in general,
//! [`FairMutex`] (first come, first served) and [`RwLock`] (shared readers, exclusive writers,
//! no writer starvation). An acquisition is one request (enqueue and wait for the grant) and a
//! release one more; the holder's fencing token is [`Held::lock_index`], larger than any token
//! the lock granted before. These need a Vigil agent: against Consul, use [`KvFairMutex`]
//! (crate::KvFairMutex) or [`Lock`](crate::Lock).

use std::time::Duration;

use reqwest::Method;
use tokio::time::Instant;
use vigil_shared::lock::LockMode;
use vigil_shared::session::Behavior;
use vigil_shared::vigil_api::{AcquireReply, LockReport, NotAcquired, StandingReply};

use super::held::{Held, Look, MONITOR_WAIT, monitor};
use super::lost::{LossReason, LostSignal, LostTrigger};
use super::recipe::RecipeSession;
use super::{
    Client, ClientError, REQUEST_TIMEOUT, ReadOpts, encode_path, next_wait_index, with_query,
};

/// Session name of a queue contender that brings no session of its own.
pub const DEFAULT_QUEUE_SESSION_NAME: &str = "Vigil lock queue";
/// How long one acquire request waits on the agent before asking again (keeping its place).
const ACQUIRE_WAIT: Duration = Duration::from_secs(300);
/// How long a waiter pauses before asking again when the servers' blocking-query budget
/// refused its wait (429): it stays queued in its place meanwhile.
const BUDGET_PAUSE: Duration = Duration::from_secs(1);

/// What to lock, how, and with which session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOptions {
    pub name: String,
    pub mode: LockMode,
    /// Slots of the lock: 1 for a mutex, N for a semaphore (exclusive holders only).
    pub limit: u32,
    pub session: RecipeSession,
    /// Give up (and leave the queue) after this long; `None`: wait as long as it takes.
    pub timeout: Option<Duration>,
    /// Watch the grant with a long poll, so [`Held::lost`] resolves as soon as the lock is
    /// lost. Without it only the session tells (its keeper's renewals, or the caller's own
    /// keeper for a reused session), as with etcd's `concurrency.Mutex`, and an acquisition
    /// costs two requests instead of three.
    pub monitor: bool,
}

impl QueueOptions {
    pub fn new(name: impl Into<String>) -> QueueOptions {
        QueueOptions {
            name: name.into(),
            mode: LockMode::Exclusive,
            limit: 1,
            session: RecipeSession::new(DEFAULT_QUEUE_SESSION_NAME),
            timeout: None,
            monitor: true,
        }
    }
}

/// Whether an acquisition waits for its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Try,
    Until(Option<Instant>),
}

impl Client {
    /// `PUT /v1/vigil/lock/<name>?session=…`: one acquire request. `wait` bounds how long the
    /// agent holds it; `timeout` makes the contender leave the queue when it passes.
    pub async fn lock_queue_acquire(
        &self,
        opts: &QueueOptions,
        session: &str,
        try_only: bool,
        wait: Duration,
        timeout: Option<Duration>,
    ) -> Result<AcquireReply, ClientError> {
        let mut query = vec![
            ("session", session.to_owned()),
            ("mode", opts.mode.as_str().to_owned()),
            ("limit", opts.limit.to_string()),
            ("wait", format!("{}ms", wait.as_millis())),
        ];
        if try_only {
            query.push(("try", String::new()));
        }
        if let Some(t) = timeout {
            query.push(("timeout", format!("{}ms", t.as_millis())));
        }
        let path = format!("/v1/vigil/lock/{}", encode_path(&opts.name));
        let reply = self
            .send(
                Method::PUT,
                &with_query(&path, &query),
                None,
                wait + wait / 16 + REQUEST_TIMEOUT,
            )
            .await;
        if !try_only {
            self.count_blocking_return();
        }
        let reply = reply?;
        // 202: the wait ended with the session still queued (the body says so).
        if reply.status == 202 {
            return reply.json();
        }
        reply.ok()?.json()
    }

    /// Releases the lock or leaves its queue: whether `session` had either.
    pub async fn lock_queue_release(&self, name: &str, session: &str) -> Result<bool, ClientError> {
        let path = format!("/v1/vigil/lock/{}", encode_path(name));
        let query = [("release", String::new()), ("session", session.to_owned())];
        let reply = self
            .send(
                Method::PUT,
                &with_query(&path, &query),
                None,
                REQUEST_TIMEOUT,
            )
            .await?;
        reply.ok()?.json()
    }

    /// `GET /v1/vigil/lock/<name>`: the lock's holders and queue, `None` when nobody uses it.
    pub async fn lock_queue_get(
        &self,
        name: &str,
        opts: ReadOpts,
    ) -> Result<(Option<LockReport>, super::QueryMeta), ClientError> {
        self.lock_queue_read(name, &[], opts).await
    }

    /// `GET /v1/vigil/lock/<name>?session=`: whether `session` holds the lock (and its token);
    /// blocks only until that session's own standing changes.
    pub async fn lock_queue_standing(
        &self,
        name: &str,
        session: &str,
        opts: ReadOpts,
    ) -> Result<(Option<u64>, super::QueryMeta), ClientError> {
        let query = [("session", session.to_owned())];
        let (standing, meta) = self
            .lock_queue_read::<StandingReply>(name, &query, opts)
            .await?;
        let token = standing.filter(|s| s.held).and_then(|s| s.token);
        Ok((token, meta))
    }

    async fn lock_queue_read<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        query: &[(&str, String)],
        opts: ReadOpts,
    ) -> Result<(Option<T>, super::QueryMeta), ClientError> {
        let path = format!("/v1/vigil/lock/{}", encode_path(name));
        let (reply, meta) = self.read(&path, query, &opts).await?;
        if reply.status == 404 {
            return Ok((None, meta));
        }
        Ok((Some(reply.json()?), meta))
    }
}

/// A lock on the server-side queue. See the module doc.
#[derive(Clone)]
pub struct LockQueue {
    client: Client,
    opts: QueueOptions,
}

impl LockQueue {
    pub fn new(client: &Client, opts: QueueOptions) -> Result<LockQueue, ClientError> {
        if opts.name.is_empty() {
            return Err(ClientError::MissingKey);
        }
        if opts.limit == 0 {
            return Err(ClientError::BadLimit);
        }
        Ok(LockQueue {
            client: client.clone(),
            opts,
        })
    }

    pub fn name(&self) -> &str {
        &self.opts.name
    }

    /// Waits for the grant (up to the options' timeout: then [`ClientError::Timeout`]).
    /// Dropping the future leaves the queue.
    pub async fn acquire(&self) -> Result<Held, ClientError> {
        let deadline = self.opts.timeout.map(|t| Instant::now() + t);
        self.take(Wait::Until(deadline))
            .await?
            .ok_or(ClientError::Timeout)
    }

    /// Takes the lock only if it is free now and nobody waits.
    pub async fn try_acquire(&self) -> Result<Option<Held>, ClientError> {
        self.take(Wait::Try).await
    }

    async fn take(&self, wait: Wait) -> Result<Option<Held>, ClientError> {
        let (client, opts) = (&self.client, &self.opts);
        let mut keeper = opts.session.keep(client, Behavior::Release).await?;
        let session = keeper.id().to_owned();
        // From here on, leaving (a drop, an error, a timeout) releases or leaves the queue.
        let (c, name, s) = (client.clone(), opts.name.clone(), session.clone());
        keeper.on_close(Box::pin(async move {
            c.lock_queue_release(&name, &s).await.map(|_| ())
        }));
        let session_lost = keeper.lost();
        let token = loop {
            let (try_only, timeout) = match wait {
                Wait::Try => (true, None),
                Wait::Until(deadline) => (
                    false,
                    deadline.map(|d| d.saturating_duration_since(Instant::now())),
                ),
            };
            let reply = client.lock_queue_acquire(opts, &session, try_only, ACQUIRE_WAIT, timeout);
            let reply = match session_lost.unless_lost(reply).await? {
                // Queued, but the servers hold as many blocking queries as they may: the
                // session keeps its place; ask again after a pause, or give up at the deadline
                // (closing the keeper leaves the queue).
                Err(ClientError::Api { status: 429, .. }) if !try_only => {
                    let now = Instant::now();
                    if let Wait::Until(Some(deadline)) = wait
                        && deadline <= now + BUDGET_PAUSE
                    {
                        keeper.close().await?;
                        return Ok(None);
                    }
                    session_lost
                        .unless_lost(tokio::time::sleep(BUDGET_PAUSE))
                        .await?;
                    continue;
                }
                reply => reply?,
            };
            match (reply.acquired, reply.token, reply.reason) {
                (true, Some(token), _) => break token,
                (_, _, Some(NotAcquired::Queued)) => continue,
                (_, _, Some(NotAcquired::Removed)) => {
                    return Err(ClientError::SessionLost(LossReason::SessionInvalidated));
                }
                _ => {
                    // Busy or timed out: nothing held, nothing queued.
                    keeper.clear_cleanups();
                    keeper.close().await?;
                    return Ok(None);
                }
            }
        };
        let (trigger, _) = LostTrigger::new();
        let watcher = trigger.clone();
        if opts.monitor {
            tokio::spawn(monitor_holder(
                client.clone(),
                opts.name.clone(),
                session,
                session_lost,
                watcher,
                keeper.ttl(),
            ));
        } else {
            // Only the session's loss, until the holder lets go.
            let settled = watcher.signal();
            tokio::spawn(async move {
                tokio::select! {
                    reason = session_lost.wait() => watcher.fire(reason),
                    _ = settled.wait() => {}
                }
            });
        }
        Ok(Some(
            Held::new(opts.name.clone(), token, keeper, trigger).queued(),
        ))
    }
}

/// Watches lock `name` until `session` no longer holds it (see [`monitor`]).
async fn monitor_holder(
    client: Client,
    name: String,
    session: String,
    keeper_lost: LostSignal,
    trigger: LostTrigger,
    unreachable_after: Duration,
) {
    let look = |index: u64| {
        let (client, name, session) = (client.clone(), name.clone(), session.clone());
        async move {
            let opts = ReadOpts::blocking(index, MONITOR_WAIT).consistent();
            let (token, meta) = client.lock_queue_standing(&name, &session, opts).await?;
            if token.is_some() {
                return Ok(Look::Held {
                    index: next_wait_index(index, meta.index),
                });
            }
            Ok(Look::Lost(async move {
                match client.session_info(&session, ReadOpts::default()).await {
                    Ok((None, _)) => LossReason::SessionInvalidated,
                    _ => LossReason::KeyReleased,
                }
            }))
        }
    };
    monitor(0, keeper_lost, trigger, unreachable_after, look).await;
}

/// A first-come, first-served mutex on the server-side queue.
#[derive(Clone)]
pub struct FairMutex(LockQueue);

impl FairMutex {
    /// `opts.mode` and `opts.limit` are set to exclusive, 1.
    pub fn new(client: &Client, opts: QueueOptions) -> Result<FairMutex, ClientError> {
        let opts = QueueOptions {
            mode: LockMode::Exclusive,
            limit: 1,
            ..opts
        };
        LockQueue::new(client, opts).map(FairMutex)
    }

    /// Queues up and blocks until granted. Dropping the future leaves the queue.
    pub async fn acquire(&self) -> Result<Held, ClientError> {
        self.0.acquire().await
    }

    pub async fn try_acquire(&self) -> Result<Option<Held>, ClientError> {
        self.0.try_acquire().await
    }
}

/// A readers-writer lock on the server-side queue: readers share it, a writer excludes all;
/// a reader behind a waiting writer waits, so writers never starve.
#[derive(Clone)]
pub struct RwLock {
    read: LockQueue,
    write: LockQueue,
}

impl RwLock {
    pub fn new(client: &Client, opts: QueueOptions) -> Result<RwLock, ClientError> {
        let shared = QueueOptions {
            mode: LockMode::Shared,
            limit: 1,
            ..opts.clone()
        };
        let exclusive = QueueOptions {
            mode: LockMode::Exclusive,
            limit: 1,
            ..opts
        };
        Ok(RwLock {
            read: LockQueue::new(client, shared)?,
            write: LockQueue::new(client, exclusive)?,
        })
    }

    pub async fn read(&self) -> Result<Held, ClientError> {
        self.read.acquire().await
    }

    pub async fn write(&self) -> Result<Held, ClientError> {
        self.write.acquire().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_may_leave_out_what_does_not_apply() {
        let queued: AcquireReply = serde_json::from_str(
            r#"{"Lock":"l","Session":"s","Mode":"shared","Acquired":false,"Queued":true,"Reason":"queued","Position":2}"#,
        )
        .expect("a queued reply");
        assert_eq!(
            queued,
            AcquireReply {
                lock: "l".to_owned(),
                session: "s".to_owned(),
                mode: LockMode::Shared,
                acquired: false,
                token: None,
                queued: true,
                reason: Some(NotAcquired::Queued),
                position: Some(2),
                lock_delay_remaining_ms: None,
            }
        );
        assert!(serde_json::from_str::<AcquireReply>(r#"{"Token":3}"#).is_err());
    }
}
