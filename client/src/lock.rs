//! [`Lock`]: Consul's `api.Lock` over the KV API, byte-compatible with it (same key, flag value
//! 3304740253564472344, session "Consul API Lock" with TTL 15 s, `?acquire`/`?release` with the
//! value re-sent), so a Vigil lock and a Go-client lock on the same key exclude each other.
//!
//! Acquire: blocking GET until the key is free, `?acquire`; on refusal a non-blocking GET tells
//! "held" (block again) from "lock-delay" (sleep for the delay Vigil reports, else 5 s). A Vigil
//! agent does most of that itself: asked to (`X-Vigil-Acquire-Wait`, for the lock's wait
//! time), an `?acquire` another session's hold or a lock-delay refuses waits in the agent,
//! which takes the key when it comes free; its answer gives the index to block from after a
//! refusal still standing at the end of the wait, and, once the lock is taken, the `LockIndex`
//! granted (read from the key otherwise). So a waiter costs one request, not a read and an
//! acquire per release.

use std::time::Duration;

use vigil_shared::recipe::LOCK_FLAG_VALUE;
use vigil_shared::session::Behavior;

use super::held::{Held, monitor_key, unreachable_after};
use super::lost::{LossReason, LostTrigger};
use super::recipe::RecipeSession;
use super::{Client, ClientError, ReadOpts, next_wait_index};

/// `api.DefaultLockSessionName`.
pub const DEFAULT_LOCK_SESSION_NAME: &str = "Consul API Lock";
/// `api.DefaultLockSessionTTL`.
pub const DEFAULT_LOCK_SESSION_TTL: Duration = Duration::from_secs(15);
/// `api.DefaultLockWaitTime`: each blocking GET while waiting.
pub const DEFAULT_LOCK_WAIT_TIME: Duration = Duration::from_secs(15);
/// `api.DefaultLockRetryTime`: the pause after a lock-delay refusal when the agent does not say
/// how long the delay lasts.
pub const DEFAULT_LOCK_RETRY_TIME: Duration = Duration::from_secs(5);

/// Refusals on an unheld key retried at once before pausing for [`DEFAULT_LOCK_RETRY_TIME`].
const QUICK_RETRIES: u32 = 3;

/// What to lock and with which session settings (`api.LockOptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    pub key: String,
    pub value: Vec<u8>,
    pub session: RecipeSession,
    pub wait_time: Duration,
    /// `MonitorRetries`: failed reads of the held key tolerated, 1 s apart, before
    /// the lock counts as lost. `None`: until the agent has been unreachable for a session TTL.
    pub monitor_retries: Option<u32>,
}

impl LockOptions {
    pub fn new(key: impl Into<String>) -> LockOptions {
        LockOptions {
            key: key.into(),
            value: Vec::new(),
            session: RecipeSession::new(DEFAULT_LOCK_SESSION_NAME),
            wait_time: DEFAULT_LOCK_WAIT_TIME,
            monitor_retries: None,
        }
    }
}

/// A mutex on one key (`api.Lock`).
#[derive(Clone)]
pub struct Lock {
    client: Client,
    opts: LockOptions,
}

impl Lock {
    pub fn new(client: &Client, opts: LockOptions) -> Result<Lock, ClientError> {
        if opts.key.is_empty() {
            return Err(ClientError::MissingKey);
        }
        Ok(Lock {
            client: client.clone(),
            opts,
        })
    }

    pub fn key(&self) -> &str {
        &self.opts.key
    }

    /// Blocks until the lock is held. Dropping the future gives up and destroys the session.
    pub async fn acquire(&self) -> Result<Held, ClientError> {
        let (client, opts) = (&self.client, &self.opts);
        let key = &opts.key;
        let mut keeper = opts.session.keep(client, Behavior::Release).await?;
        let session = keeper.id().to_owned();
        let session_lost = keeper.lost();
        let mut index = 0;
        let mut unexplained = 0;
        let taken = loop {
            let read = client.kv_get(key, ReadOpts::blocking(index, opts.wait_time));
            let (pair, meta) = session_lost.unless_lost(read).await??;
            if let Some(pair) = &pair {
                if pair.flags != LOCK_FLAG_VALUE {
                    return Err(ClientError::LockConflict);
                }
                // Held by another: block on it, but for the first look, after which the
                // acquire itself waits in a Vigil agent.
                if index != 0 && pair.session.as_deref().is_some_and(|s| s != session) {
                    index = next_wait_index(index, meta.index);
                    continue;
                }
            }
            let acquire = client.kv_acquire_waiting(
                key,
                &opts.value,
                LOCK_FLAG_VALUE,
                &session,
                opts.wait_time,
            );
            let acquired = session_lost.unless_lost(acquire).await??;
            if acquired.acquired {
                break acquired.lock_index.zip(acquired.key_index);
            }
            // Another session holds it: a Vigil agent says from which index to block.
            if let (Some(held), None) = (acquired.key_index, acquired.lock_delay) {
                index = next_wait_index(0, held);
                unexplained = 0;
                continue;
            }
            // Held by someone else (block on it), or lock-delay (wait it out).
            let (pair, meta) = client.kv_get(key, ReadOpts::default()).await?;
            if pair.is_some_and(|p| p.session.is_some()) {
                index = next_wait_index(0, meta.index);
                unexplained = 0;
                continue;
            }
            // Without Vigil's header, an unheld key may also mean it was released between the
            // refusal and the read: retry at once a few times before assuming lock-delay.
            let pause = match acquired.lock_delay {
                Some(delay) => delay,
                None if unexplained < QUICK_RETRIES => {
                    unexplained += 1;
                    index = 0;
                    continue;
                }
                None => DEFAULT_LOCK_RETRY_TIME,
            };
            unexplained = 0;
            tracing::debug!(%key, ?pause, "lock-delay in effect");
            session_lost.unless_lost(tokio::time::sleep(pause)).await?;
            index = 0;
        };

        // Held. The sequencer, as the agent gave it or read, then watch the key from there.
        let (lock_index, index, held) = match taken {
            Some((lock_index, key_index)) => (lock_index, key_index, true),
            None => {
                let (pair, meta) = client.kv_get(key, ReadOpts::default().consistent()).await?;
                let holder = pair.as_ref().and_then(|p| p.session.as_deref());
                let held = holder == Some(session.as_str());
                (pair.as_ref().map_or(0, |p| p.lock_index), meta.index, held)
            }
        };
        let (release_client, release_key, value) =
            (client.clone(), key.clone(), opts.value.clone());
        let release_session = session.clone();
        keeper.on_close(Box::pin(async move {
            release_client
                .kv_release(&release_key, &value, LOCK_FLAG_VALUE, &release_session)
                .await
                .map(|_| ())
        }));
        let (trigger, _) = LostTrigger::new();
        if !held {
            trigger.fire(LossReason::KeyReleased);
        }
        tokio::spawn(monitor_key(
            client.clone(),
            key.clone(),
            session,
            index,
            session_lost,
            trigger.clone(),
            unreachable_after(opts.monitor_retries, keeper.ttl()),
        ));
        Ok(Held::new(key.clone(), lock_index, keeper, trigger))
    }

    /// Deletes the lock key if nobody holds it (`api.Lock.Destroy`).
    pub async fn destroy(&self) -> Result<(), ClientError> {
        let (pair, _) = self
            .client
            .kv_get(&self.opts.key, ReadOpts::default())
            .await?;
        let Some(pair) = pair else {
            return Ok(());
        };
        if pair.flags != LOCK_FLAG_VALUE {
            return Err(ClientError::LockConflict);
        }
        if pair.session.is_some() {
            return Err(ClientError::LockInUse);
        }
        if !self
            .client
            .kv_delete_cas(&self.opts.key, pair.modify_index)
            .await?
        {
            return Err(ClientError::LockInUse);
        }
        Ok(())
    }
}
