//! [`Semaphore`]: Consul's `api.Semaphore` (N holders on a prefix), byte-compatible with it:
//! contender key `<prefix>/<session>` acquired with flag 16210313421097356768, coordination key
//! `<prefix>/.lock` holding `{"Limit":N,"Holders":{"<session>":true,…}}` exactly as Go's
//! `json.Marshal` writes it, dead holders pruned, slots taken and given back with CAS loops.
//! A lock and a semaphore on the same prefix see each other's flag on `.lock` and refuse.

use std::time::Duration;

use vigil_shared::kv::KvEntry;
use vigil_shared::recipe::{SEMAPHORE_FLAG_VALUE, SEMAPHORE_KEY, SemaphoreLock};
use vigil_shared::session::Behavior;

use super::held::{Held, Look, MONITOR_WAIT, explain, monitor, unreachable_after};
use super::lost::{LossReason, LostSignal, LostTrigger};
use super::recipe::{RecipeSession, contender_entry};
use super::{Client, ClientError, ReadOpts, next_wait_index, path};

/// `api.DefaultSemaphoreSessionName`.
pub const DEFAULT_SEMAPHORE_SESSION_NAME: &str = "Consul API Semaphore";
/// `api.DefaultSemaphoreWaitTime`.
pub const DEFAULT_SEMAPHORE_WAIT_TIME: Duration = Duration::from_secs(15);

/// The coordination entry in a listing, or an empty one with the semaphore flag (`findLock`).
fn find_lock(pairs: &[KvEntry], lock_key: &str) -> KvEntry {
    pairs
        .iter()
        .find(|p| p.key == lock_key)
        .cloned()
        .unwrap_or(KvEntry {
            key: lock_key.to_owned(),
            value: Vec::new(),
            flags: SEMAPHORE_FLAG_VALUE,
            session: None,
            lock_index: 0,
            create_index: 0,
            modify_index: 0,
        })
}

/// Semaphore settings (`api.SemaphoreOptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreOptions {
    pub prefix: String,
    pub limit: i64,
    /// Value of the contender entry.
    pub value: Vec<u8>,
    pub session: RecipeSession,
    pub wait_time: Duration,
    /// As [`LockOptions::monitor_retries`](super::LockOptions::monitor_retries).
    pub monitor_retries: Option<u32>,
}

impl SemaphoreOptions {
    pub fn new(prefix: impl Into<String>, limit: i64) -> SemaphoreOptions {
        SemaphoreOptions {
            prefix: prefix.into(),
            limit,
            value: Vec::new(),
            session: RecipeSession::new(DEFAULT_SEMAPHORE_SESSION_NAME),
            wait_time: DEFAULT_SEMAPHORE_WAIT_TIME,
            monitor_retries: None,
        }
    }
}

/// N holders on a prefix (`api.Semaphore`).
#[derive(Clone)]
pub struct Semaphore {
    client: Client,
    opts: SemaphoreOptions,
    lock_key: String,
}

impl Semaphore {
    pub fn new(client: &Client, opts: SemaphoreOptions) -> Result<Semaphore, ClientError> {
        if opts.prefix.is_empty() {
            return Err(ClientError::MissingPrefix);
        }
        if opts.limit <= 0 {
            return Err(ClientError::BadLimit);
        }
        let lock_key = path::join(&[&opts.prefix, SEMAPHORE_KEY]);
        Ok(Semaphore {
            client: client.clone(),
            opts,
            lock_key,
        })
    }

    /// Blocks until a slot is held. Dropping the future gives up and cleans up.
    pub async fn acquire(&self) -> Result<Held, ClientError> {
        let (client, opts) = (&self.client, &self.opts);
        let mut keeper = opts.session.keep(client, Behavior::Delete).await?;
        let session = keeper.id().to_owned();
        let session_lost = keeper.lost();
        let contender = contender_entry(
            client,
            &opts.prefix,
            &opts.value,
            SEMAPHORE_FLAG_VALUE,
            &session,
        )
        .await?;
        let (c, k) = (client.clone(), contender.clone());
        keeper.on_close(Box::pin(async move { c.kv_delete(&k).await.map(|_| ()) }));

        let mut index = 0;
        let (lock_index, start_index) = loop {
            let read = client.kv_list(&opts.prefix, ReadOpts::blocking(index, opts.wait_time));
            let (pairs, meta) = session_lost.unless_lost(read).await??;
            let lock_pair = find_lock(&pairs, &self.lock_key);
            if lock_pair.flags != SEMAPHORE_FLAG_VALUE {
                return Err(ClientError::SemaphoreConflict);
            }
            let mut lock =
                SemaphoreLock::decode(&lock_pair.value, opts.limit).map_err(ClientError::Decode)?;
            if lock.limit != opts.limit {
                return Err(ClientError::LimitConflict {
                    lock: lock.limit,
                    local: opts.limit,
                });
            }
            lock.prune(&pairs);
            if lock.holders.len() as i64 >= lock.limit {
                index = next_wait_index(index, meta.index);
                continue;
            }
            lock.holders.insert(session.clone(), true);
            let swapped = client
                .kv_cas(
                    &self.lock_key,
                    &lock.encode(),
                    SEMAPHORE_FLAG_VALUE,
                    lock_pair.modify_index,
                )
                .await?;
            if swapped {
                let lock_index = pairs
                    .iter()
                    .find(|p| p.key == contender)
                    .map_or(1, |p| p.lock_index);
                break (lock_index, meta.index);
            }
        };

        // Held: on close, leave the holders (CAS loop), then delete the contender entry.
        keeper.clear_cleanups();
        let leave = leave(
            client.clone(),
            self.lock_key.clone(),
            opts.limit,
            session.clone(),
            contender.clone(),
        );
        keeper.on_close(Box::pin(leave));
        let (trigger, _) = LostTrigger::new();
        let watch = SlotWatch {
            client: client.clone(),
            prefix: opts.prefix.clone(),
            lock_key: self.lock_key.clone(),
            limit: opts.limit,
            session,
            unreachable_after: unreachable_after(opts.monitor_retries, keeper.ttl()),
        };
        tokio::spawn(monitor_slot(
            watch,
            start_index,
            session_lost,
            trigger.clone(),
        ));
        Ok(Held::new(contender, lock_index, keeper, trigger))
    }

    /// Deletes `.lock` if no live holder is left (`api.Semaphore.Destroy`).
    pub async fn destroy(&self) -> Result<(), ClientError> {
        let (pairs, _) = self
            .client
            .kv_list(&self.opts.prefix, ReadOpts::default())
            .await?;
        let lock_pair = find_lock(&pairs, &self.lock_key);
        if lock_pair.modify_index == 0 {
            return Ok(());
        }
        if lock_pair.flags != SEMAPHORE_FLAG_VALUE {
            return Err(ClientError::SemaphoreConflict);
        }
        let mut lock = SemaphoreLock::decode(&lock_pair.value, self.opts.limit)
            .map_err(ClientError::Decode)?;
        lock.prune(&pairs);
        if !lock.holders.is_empty() {
            return Err(ClientError::SemaphoreInUse);
        }
        if !self
            .client
            .kv_delete_cas(&self.lock_key, lock_pair.modify_index)
            .await?
        {
            return Err(ClientError::SemaphoreInUse);
        }
        Ok(())
    }
}

/// `Release`: remove ourselves from the holders with a CAS loop, then delete the contender.
async fn leave(
    client: Client,
    lock_key: String,
    limit: i64,
    session: String,
    contender: String,
) -> Result<(), ClientError> {
    loop {
        let (pair, _) = client.kv_get(&lock_key, ReadOpts::default()).await?;
        let (value, modify_index) = pair.map_or((Vec::new(), 0), |p| (p.value, p.modify_index));
        let mut lock = SemaphoreLock::decode(&value, limit).map_err(ClientError::Decode)?;
        if lock.holders.remove(&session).is_none() {
            break;
        }
        if client
            .kv_cas(
                &lock_key,
                &lock.encode(),
                SEMAPHORE_FLAG_VALUE,
                modify_index,
            )
            .await?
        {
            break;
        }
    }
    client.kv_delete(&contender).await.map(|_| ())
}

/// What a slot monitor watches.
struct SlotWatch {
    client: Client,
    prefix: String,
    lock_key: String,
    limit: i64,
    session: String,
    unreachable_after: Duration,
}

/// Watches the prefix until our session is no longer a (live) holder (see [`monitor`]).
async fn monitor_slot(
    watch: SlotWatch,
    index: u64,
    session_lost: LostSignal,
    trigger: LostTrigger,
) {
    let unreachable_after = watch.unreachable_after;
    let watch = &watch;
    let look = |index: u64| async move {
        let opts = ReadOpts::blocking(index, MONITOR_WAIT).consistent();
        let (pairs, meta) = watch.client.kv_list(&watch.prefix, opts).await?;
        let lock_pair = find_lock(&pairs, &watch.lock_key);
        let held = SemaphoreLock::decode(&lock_pair.value, watch.limit).map(|mut lock| {
            lock.prune(&pairs);
            lock.holders.contains_key(&watch.session)
        });
        if held == Ok(true) {
            return Ok(Look::Held {
                index: next_wait_index(index, meta.index),
            });
        }
        let mine = pairs
            .iter()
            .find(|p| p.session.as_deref() == Some(&watch.session))
            .cloned();
        Ok(Look::Lost(async move {
            match explain(&watch.client, &watch.session, mine.as_ref()).await {
                LossReason::KeyReleased => LossReason::SlotRemoved,
                other => other,
            }
        }))
    };
    monitor(index, session_lost, trigger, unreachable_after, look).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_coordination_key_is_an_empty_semaphore_entry() {
        // A listing of one contender's key (held by its session) and no `.lock`.
        let contender = KvEntry {
            session: Some("s1".into()),
            create_index: 7,
            ..find_lock(&[], "p/s1")
        };
        let found = find_lock(&[contender], "p/.lock");
        assert_eq!(found.key, "p/.lock");
        assert_eq!(found.flags, SEMAPHORE_FLAG_VALUE);
        assert_eq!(found.modify_index, 0);
    }
}
