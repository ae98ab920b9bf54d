//! [`KvFairMutex`]: etcd's fair mutex over the KV API. Each contender writes `<prefix>/<session>`
//! acquired by its own session (flag [`FAIR_FLAG_VALUE`]); the owner is the live contender with
//! the smallest `CreateIndex`; every other contender blocks only on its predecessor's key, so a
//! release wakes exactly one waiter. A contender whose own session dies fails at once (its own
//! key is watched the whole time).
//!
//! A plain lock or semaphore holding keys on the same prefix is a conflict.
//!
//! On a Vigil agent, [`FairMutex`](super::FairMutex) does the same in one request per
//! acquisition on the server-side queue; this one stays for plain Consul servers, which have no
//! such queue, and for the demo's leader election.
//!
//! Dead contenders (key left without a session when a session was invalidated) are skipped. A
//! dead entry with no live entry before it may have been the owner when it died, so the next
//! owner honours the lock-delay on its key (probing with `?acquire`, which a Vigil agent refuses
//! with the remaining delay) before taking over, as a plain lock's successor would.

use std::time::Duration;

use vigil_shared::kv::{KvEntry, KvOp};
use vigil_shared::recipe::{FAIR_FLAG_VALUE, LOCK_FLAG_VALUE, SEMAPHORE_FLAG_VALUE};
use vigil_shared::session::Behavior;

use super::held::{Held, monitor_key};
use super::lock::DEFAULT_LOCK_RETRY_TIME;
use super::lost::{LostSignal, LostTrigger};
use super::recipe::{RecipeSession, contender_entry};
use super::{Client, ClientError, ReadOpts, next_wait_index, path};

pub const DEFAULT_FAIR_SESSION_NAME: &str = "Vigil Fair Lock";
/// How long each wait on the predecessor blocks on the server.
const PREDECESSOR_WAIT: Duration = Duration::from_secs(300);

/// What a contender does next, decided from one listing of the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FairStep {
    /// No live contender is ahead. `dead_before` (possibly a dead owner) must be cleared first,
    /// honouring their lock-delay; `stale` dead entries behind a live one can simply go.
    Owner {
        dead_before: Vec<KvEntry>,
        stale: Vec<KvEntry>,
    },
    /// Block on the live contender just ahead.
    Wait {
        predecessor: KvEntry,
        stale: Vec<KvEntry>,
    },
    /// Our own entry is gone or no longer ours: our session died.
    Gone,
}

/// The pure decision: `entries` is a listing of `<prefix>/`, `session` is ours.
pub fn fair_step(
    entries: &[KvEntry],
    prefix: &str,
    session: &str,
) -> Result<FairStep, ClientError> {
    let dir = format!("{}/", path::clean(prefix));
    let mut contenders: Vec<&KvEntry> = Vec::new();
    for entry in entries {
        let Some(name) = entry.key.strip_prefix(&dir) else {
            continue;
        };
        if name.is_empty() || name.contains('/') {
            continue;
        }
        // A plain lock or a semaphore contender in use on the same prefix.
        let other_recipe = entry.flags == LOCK_FLAG_VALUE || entry.flags == SEMAPHORE_FLAG_VALUE;
        if other_recipe && entry.session.is_some() {
            return Err(ClientError::FairConflict);
        }
        if entry.flags == FAIR_FLAG_VALUE {
            contenders.push(entry);
        }
    }
    contenders.sort_by(|a, b| (a.create_index, &a.key).cmp(&(b.create_index, &b.key)));
    let my_key = format!("{dir}{session}");
    let Some(me) = contenders.iter().position(|e| e.key == my_key) else {
        return Ok(FairStep::Gone);
    };
    if contenders[me].session.as_deref() != Some(session) {
        return Ok(FairStep::Gone);
    }
    let mut dead_head = Vec::new();
    let mut stale = Vec::new();
    let mut seen_live = false;
    for entry in &contenders {
        match (&entry.session, seen_live) {
            (Some(_), _) => seen_live = true,
            (None, false) => dead_head.push((*entry).clone()),
            (None, true) => stale.push((*entry).clone()),
        }
    }
    let predecessor = contenders[..me].iter().rev().find(|e| e.session.is_some());
    Ok(match predecessor {
        Some(p) => FairStep::Wait {
            predecessor: (*p).clone(),
            stale: dead_head.into_iter().chain(stale).collect(),
        },
        None => FairStep::Owner {
            dead_before: dead_head,
            stale,
        },
    })
}

/// Fair mutex settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvFairOptions {
    pub prefix: String,
    pub value: Vec<u8>,
    pub session: RecipeSession,
}

impl KvFairOptions {
    pub fn new(prefix: impl Into<String>) -> KvFairOptions {
        KvFairOptions {
            prefix: prefix.into(),
            value: Vec::new(),
            session: RecipeSession::new(DEFAULT_FAIR_SESSION_NAME),
        }
    }
}

/// A first-come, first-served mutex on a prefix.
#[derive(Clone)]
pub struct KvFairMutex {
    client: Client,
    opts: KvFairOptions,
}

impl KvFairMutex {
    pub fn new(client: &Client, opts: KvFairOptions) -> Result<KvFairMutex, ClientError> {
        if opts.prefix.is_empty() {
            return Err(ClientError::MissingPrefix);
        }
        Ok(KvFairMutex {
            client: client.clone(),
            opts,
        })
    }

    /// Queues up and blocks until first in line. Dropping the future leaves the queue.
    pub async fn acquire(&self) -> Result<Held, ClientError> {
        let (client, opts) = (&self.client, &self.opts);
        let mut keeper = opts.session.keep(client, Behavior::Release).await?;
        let session = keeper.id().to_owned();
        let my_key =
            contender_entry(client, &opts.prefix, &opts.value, FAIR_FLAG_VALUE, &session).await?;
        // Leaving deletes our entry only while it is still ours: an entry our dead session left
        // behind carries the lock-delay the next owner must honour.
        let (c, key, s) = (client.clone(), my_key.clone(), session.clone());
        keeper.on_close(Box::pin(async move {
            let ops = [
                KvOp::CheckSession {
                    key: key.clone(),
                    session: s,
                },
                KvOp::Delete { key },
            ];
            c.txn(&ops).await.map(|_| ())
        }));

        // Our own key is watched from now on: its loss ends the wait at once.
        let (mine, meta) = client.kv_get(&my_key, ReadOpts::default()).await?;
        let lock_index = mine.map_or(1, |e| e.lock_index);
        let (trigger, lost) = LostTrigger::new();
        tokio::spawn(monitor_key(
            client.clone(),
            my_key.clone(),
            session.clone(),
            meta.index,
            keeper.lost(),
            trigger.clone(),
            keeper.ttl(),
        ));
        let held = Held::new(my_key, lock_index, keeper, trigger);

        let dir = format!("{}/", path::clean(&opts.prefix));
        loop {
            if let Some(reason) = lost.get() {
                return Err(ClientError::SessionLost(reason));
            }
            let (entries, _) = client.kv_list(&dir, ReadOpts::default()).await?;
            match fair_step(&entries, &opts.prefix, &session)? {
                FairStep::Gone => {
                    let reason = tokio::time::timeout(Duration::from_secs(2), lost.wait())
                        .await
                        .unwrap_or(super::LossReason::KeyReleased);
                    return Err(ClientError::SessionLost(reason));
                }
                FairStep::Wait { predecessor, stale } => {
                    remove_stale(client, &stale).await;
                    wait_for(client, &predecessor, &lost).await?;
                }
                FairStep::Owner { dead_before, stale } => {
                    remove_stale(client, &stale).await;
                    if dead_before.is_empty() {
                        return Ok(held);
                    }
                    for dead in &dead_before {
                        clear_dead(client, dead, &session, &lost).await?;
                    }
                }
            }
        }
    }
}

/// Blocks until `predecessor` is gone, lost its session, or changed hands.
async fn wait_for(
    client: &Client,
    predecessor: &KvEntry,
    lost: &LostSignal,
) -> Result<(), ClientError> {
    let mut index = predecessor.modify_index;
    loop {
        let opts = ReadOpts::blocking(index, PREDECESSOR_WAIT);
        let (entry, meta) = lost
            .unless_lost(client.kv_get(&predecessor.key, opts))
            .await??;
        match entry {
            Some(e)
                if e.session == predecessor.session
                    && e.create_index == predecessor.create_index =>
            {
                index = next_wait_index(index, meta.index);
            }
            _ => return Ok(()),
        }
    }
}

/// Deletes dead entries that can never have owned the lock (best effort, CAS-guarded).
async fn remove_stale(client: &Client, stale: &[KvEntry]) {
    for entry in stale {
        if let Err(e) = client.kv_delete_cas(&entry.key, entry.modify_index).await {
            tracing::debug!(key = %entry.key, error = %e, "could not remove a dead contender");
        }
    }
}

/// Waits out the lock-delay of a dead entry that may have been the owner, then deletes it.
/// Acquiring it (with flags 0, so nobody counts it as a contender) is how the agent tells us
/// the delay; once acquired it is ours to delete.
async fn clear_dead(
    client: &Client,
    dead: &KvEntry,
    session: &str,
    lost: &LostSignal,
) -> Result<(), ClientError> {
    loop {
        let probe = client.kv_acquire(&dead.key, &[], 0, session).await?;
        if probe.acquired {
            client.kv_delete(&dead.key).await?;
            return Ok(());
        }
        let pause = match probe.lock_delay {
            Some(delay) => delay,
            None => {
                let (entry, _) = client.kv_get(&dead.key, ReadOpts::default()).await?;
                if entry.is_none_or(|e| e.session.is_some()) {
                    // Gone, or somebody else's now: the caller lists again.
                    return Ok(());
                }
                DEFAULT_LOCK_RETRY_TIME
            }
        };
        tracing::debug!(key = %dead.key, ?pause, "waiting out a dead owner's lock-delay");
        lost.unless_lost(tokio::time::sleep(pause)).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, create_index: u64, live: bool) -> KvEntry {
        KvEntry {
            key: format!("q/{name}"),
            value: Vec::new(),
            flags: FAIR_FLAG_VALUE,
            session: live.then(|| name.to_owned()),
            lock_index: 1,
            create_index,
            modify_index: create_index,
        }
    }

    fn keys(entries: &[KvEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.key.as_str()).collect()
    }

    #[test]
    fn first_live_contender_owns_and_the_rest_wait_on_their_predecessor() {
        // Listed by key, not by arrival: order comes from CreateIndex.
        let listing = [
            entry("a", 30, true),
            entry("b", 10, true),
            entry("c", 20, true),
        ];
        assert_eq!(
            fair_step(&listing, "q", "b").unwrap(),
            FairStep::Owner {
                dead_before: vec![],
                stale: vec![]
            }
        );
        let FairStep::Wait { predecessor, .. } = fair_step(&listing, "q", "c").unwrap() else {
            panic!("c waits");
        };
        assert_eq!(predecessor.key, "q/b");
        let FairStep::Wait { predecessor, .. } = fair_step(&listing, "q/", "a").unwrap() else {
            panic!("a waits");
        };
        assert_eq!(
            predecessor.key, "q/c",
            "blocks on its predecessor only, not the owner"
        );
    }

    #[test]
    fn dead_entries_are_skipped_and_a_dead_head_must_be_cleared() {
        let listing = [
            entry("dead-owner", 1, false),
            entry("b", 2, true),
            entry("dead-mid", 3, false),
            entry("d", 4, true),
        ];
        let FairStep::Wait { predecessor, stale } = fair_step(&listing, "q", "d").unwrap() else {
            panic!("d waits");
        };
        assert_eq!(predecessor.key, "q/b", "skips the dead entry just ahead");
        assert_eq!(keys(&stale), ["q/dead-owner", "q/dead-mid"]);
        let FairStep::Owner { dead_before, stale } = fair_step(&listing, "q", "b").unwrap() else {
            panic!("b owns");
        };
        assert_eq!(keys(&dead_before), ["q/dead-owner"]);
        assert_eq!(keys(&stale), ["q/dead-mid"]);
    }

    #[test]
    fn lost_entry_means_gone_and_other_recipes_conflict() {
        let listing = [entry("a", 1, true), entry("b", 2, false)];
        assert_eq!(fair_step(&listing, "q", "b").unwrap(), FairStep::Gone);
        assert_eq!(fair_step(&listing, "q", "zz").unwrap(), FairStep::Gone);
        let mut plain = entry(".lock", 5, true);
        plain.flags = LOCK_FLAG_VALUE;
        let err = fair_step(&[entry("a", 1, true), plain.clone()], "q", "a").unwrap_err();
        assert!(matches!(err, ClientError::FairConflict));
        plain.session = None;
        assert!(
            fair_step(&[entry("a", 1, true), plain], "q", "a").is_ok(),
            "unheld"
        );
    }

    #[test]
    fn ignores_deeper_keys_and_foreign_flags() {
        let mut deeper = entry("a", 1, true);
        deeper.key = "q/x/a".into();
        let mut foreign = entry("z", 2, true);
        foreign.flags = 0;
        let listing = [deeper, foreign, entry("b", 3, true)];
        assert!(matches!(
            fair_step(&listing, "q", "b").unwrap(),
            FairStep::Owner { .. }
        ));
    }
}
