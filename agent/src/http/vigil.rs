//! Vigil's additions under `/v1/vigil/`: the linearizable sequencer (fencing token) check, and
//! lock observability (`/v1/vigil/locks`: native lock queues, held keys, semaphore holders,
//! fair-mutex queues).

use std::collections::{BTreeMap, HashMap};

use axum::response::Response;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::go::strconv::parse_uint;
use vigil_shared::kv::KvEntry;
use vigil_shared::recipe::{
    FAIR_FLAG_VALUE, LOCK_FLAG_VALUE, SEMAPHORE_FLAG_VALUE, SEMAPHORE_KEY, SemaphoreLock,
};
use vigil_shared::rpc::{Consistency, QueryOptions, reads};
use vigil_shared::session::Session;
use vigil_shared::vigil_api::{
    FairContender, FairQueue, HeldKey, KeyKind, LocksReport, SemaphoreContender, SemaphoreReport,
    SequencerReply, SessionRef,
};

use super::acl::filtered_by_acls;
use super::error::ApiError;
use super::{Ctx, with_meta};

/// `GET /v1/vigil/sequencer?key=K&lock-index=N&session=S` → `{"Valid":true}` while S holds K at
/// LockIndex N, else `{"Valid":false,"Reason":…}`; `?lock=L&token=T&session=S` checks a native
/// lock's fencing token. Always a read-index (linearizable) read.
pub async fn sequencer(cx: Ctx) -> Result<Response, ApiError> {
    let required = |name: &str| {
        cx.params
            .get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("Missing {name}")))
    };
    // A Vigil endpoint: every input error is a 400.
    let number =
        |name: &str| required(name).and_then(|v| parse_uint(v).map_err(ApiError::bad_request));
    let session = required("session")?.to_owned();
    let opts = QueryOptions {
        consistency: Consistency::Consistent,
        ..QueryOptions::default()
    };
    // A native lock's name, else the key; either is read under the key ACL.
    let lock = cx.params.get("lock").filter(|l| !l.is_empty());
    let name = match lock {
        Some(lock) => lock,
        None => required("key")?,
    };
    cx.check(Resource::Key, Access::Read, name)?;
    let name = name.to_owned();
    let (verdict, meta) = if lock.is_some() {
        let token = number("token")?;
        let query = reads::LockSequencer {
            name,
            token,
            session,
        };
        cx.state.backend.read(opts, query).await?
    } else {
        let lock_index = number("lock-index")?;
        let query = reads::Sequencer {
            key: name,
            lock_index,
            session,
        };
        cx.state.backend.read(opts, query).await?
    };
    Ok(with_meta(
        meta,
        cx.json(&SequencerReply::from_verdict(verdict)),
    ))
}

/// `GET /v1/vigil/locks?prefix=P`: what is locked under `P`, blocking with `?index=&wait=` on
/// both the native locks and the KV keys under `P`:
/// - `Queues`: native locks (`/v1/vigil/lock/<name>`), as `GET /v1/vigil/lock/<name>` shows one.
/// - `Locks`: every key held by a session that is not a semaphore or fair-mutex contender, with
///   `Kind` `lock` (an `api.Lock` key) or `key`, holder session, its name and node, `LockIndex`
///   and `HeldSinceIndex`. No acquisition time is recorded, so held-since is the key's
///   `ModifyIndex`: the raft index of the acquire, unless the holder rewrote the value since.
/// - `Semaphores`: each `<p>/.lock` with the semaphore flag: `Limit`, live `Holders` (pruned as
///   the Go client prunes) and `Waiting` contenders.
/// - `FairQueues`: live fair-mutex contenders per prefix in `CreateIndex` order; the first is
///   the owner.
pub async fn locks(cx: Ctx) -> Result<Response, ApiError> {
    let prefix = cx.params.get("prefix").unwrap_or_default().to_owned();
    let native = reads::Locks {
        prefix: prefix.clone(),
    };
    let opts = cx.query_options(&native)?;
    let (queues, meta) = cx.state.backend.read(opts, native).await?;
    let list = reads::KvList {
        prefix: prefix.clone(),
    };
    let (mut entries, _) = cx.read_now(list).await?;
    let found = entries.len() + queues.len();
    entries.retain(|e| cx.authz.allows(Resource::Key, Access::Read, &e.key));
    let sessions = super::lock::sessions(&cx.state.backend, opts).await?;
    let mut report = locks_report(&prefix, &entries, &sessions);
    report.queues = queues
        .iter()
        .filter(|lock| cx.authz.allows(Resource::Key, Access::Read, &lock.name))
        .map(|lock| super::lock::lock_report(lock, &sessions))
        .collect();
    let filtered = entries.len() + report.queues.len() < found;
    Ok(filtered_by_acls(
        filtered,
        with_meta(meta, cx.json(&report)),
    ))
}

/// Builds the `/v1/vigil/locks` body from a listing and the sessions, without its native
/// `Queues` (pure, for tests).
pub fn locks_report(prefix: &str, entries: &[KvEntry], sessions: &[Session]) -> LocksReport {
    let by_id: HashMap<&str, &Session> = sessions.iter().map(|s| (s.id.as_str(), s)).collect();
    let holder = |session: &str| SessionRef::new(session, by_id.get(session).copied());
    let parent = |key: &str| key.rsplit_once('/').map(|(p, _)| p.to_owned());

    let mut held = Vec::new();
    let mut semaphores = Vec::new();
    let mut fair: BTreeMap<String, Vec<&KvEntry>> = BTreeMap::new();
    for entry in entries {
        let lock_suffix = format!("/{SEMAPHORE_KEY}");
        if entry.flags == SEMAPHORE_FLAG_VALUE && entry.key.ends_with(&lock_suffix) {
            let sem_prefix = &entry.key[..entry.key.len() - lock_suffix.len()];
            semaphores.push(semaphore_report(sem_prefix, entry, entries, &holder));
            continue;
        }
        let Some(session) = entry.session.as_deref() else {
            continue;
        };
        match entry.flags {
            FAIR_FLAG_VALUE => {
                if let Some(p) = parent(&entry.key) {
                    fair.entry(p).or_default().push(entry);
                }
            }
            SEMAPHORE_FLAG_VALUE => {} // a contender, reported with its semaphore
            flags => held.push(HeldKey {
                key: entry.key.clone(),
                kind: if flags == LOCK_FLAG_VALUE {
                    KeyKind::Lock
                } else {
                    KeyKind::Key
                },
                session: holder(session),
                lock_index: entry.lock_index,
                held_since_index: entry.modify_index,
            }),
        }
    }
    let fair_queues = fair
        .into_iter()
        .map(|(queue_prefix, mut queue)| {
            queue.sort_by_key(|e| (e.create_index, e.key.clone()));
            FairQueue {
                prefix: queue_prefix,
                queue: queue
                    .iter()
                    .map(|e| FairContender {
                        key: e.key.clone(),
                        session: holder(e.session.as_deref().unwrap_or_default()),
                        lock_index: e.lock_index,
                        create_index: e.create_index,
                    })
                    .collect(),
            }
        })
        .collect();
    LocksReport {
        prefix: prefix.to_owned(),
        locks: held,
        semaphores,
        fair_queues,
        queues: Vec::new(),
    }
}

fn semaphore_report(
    sem_prefix: &str,
    lock_entry: &KvEntry,
    entries: &[KvEntry],
    holder: &dyn Fn(&str) -> SessionRef,
) -> SemaphoreReport {
    let contender_dir = format!("{sem_prefix}/");
    let contenders: Vec<&KvEntry> = entries
        .iter()
        .filter(|e| e.flags == SEMAPHORE_FLAG_VALUE && e.session.is_some())
        .filter(|e| {
            e.key
                .strip_prefix(&contender_dir)
                .is_some_and(|rest| !rest.contains('/') && rest != SEMAPHORE_KEY)
        })
        .collect();
    let lock = SemaphoreLock::decode(&lock_entry.value, 0).map(|mut lock| {
        lock.prune(entries);
        lock
    });
    let (limit, holders) = match lock {
        Ok(lock) => (Some(lock.limit), lock.holders),
        Err(_) => (None, BTreeMap::new()),
    };
    let describe = |session: &str| {
        let contender = contenders
            .iter()
            .find(|e| e.session.as_deref() == Some(session));
        SemaphoreContender {
            session: holder(session),
            key: contender.map(|e| e.key.clone()),
            lock_index: contender.map(|e| e.lock_index),
            create_index: contender.map(|e| e.create_index),
        }
    };
    let holding = holders.keys().map(|s| describe(s)).collect();
    let mut waiting: Vec<&&KvEntry> = contenders
        .iter()
        .filter(|e| !holders.contains_key(e.session.as_deref().unwrap_or_default()))
        .collect();
    waiting.sort_by_key(|e| e.create_index);
    SemaphoreReport {
        prefix: sem_prefix.to_owned(),
        key: lock_entry.key.clone(),
        limit,
        holders: holding,
        waiting: waiting
            .iter()
            .map(|e| describe(e.session.as_deref().unwrap_or_default()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, flags: u64, session: Option<&str>, create_index: u64) -> KvEntry {
        KvEntry {
            key: key.into(),
            value: Vec::new(),
            flags,
            session: session.map(str::to_owned),
            lock_index: 1,
            create_index,
            modify_index: create_index,
        }
    }

    #[test]
    fn reports_locks_semaphores_and_fair_queues() {
        let mut sem = entry("s/.lock", SEMAPHORE_FLAG_VALUE, None, 5);
        sem.value = br#"{"Limit":2,"Holders":{"h1":true,"gone":true}}"#.to_vec();
        let entries = [
            entry("f/b", FAIR_FLAG_VALUE, Some("fb"), 9),
            entry("f/a", FAIR_FLAG_VALUE, Some("fa"), 8),
            entry("l/.lock", LOCK_FLAG_VALUE, Some("l1"), 3),
            entry("plain", 0, None, 1),
            sem,
            entry("s/h1", SEMAPHORE_FLAG_VALUE, Some("h1"), 6),
            entry("s/w1", SEMAPHORE_FLAG_VALUE, Some("w1"), 7),
        ];
        let report = locks_report("", &entries, &[]);
        assert_eq!(report.locks.len(), 1);
        assert_eq!(report.locks[0].key, "l/.lock");
        assert_eq!(report.locks[0].kind, KeyKind::Lock);
        assert_eq!(report.locks[0].held_since_index, 3);
        let semaphore = &report.semaphores[0];
        assert_eq!(semaphore.limit, Some(2));
        assert_eq!(semaphore.holders.len(), 1);
        assert_eq!(semaphore.holders[0].session.id, "h1");
        assert_eq!(semaphore.waiting[0].session.id, "w1");
        assert_eq!(report.fair_queues[0].prefix, "f");
        let queue: Vec<&str> = report.fair_queues[0]
            .queue
            .iter()
            .map(|c| c.session.id.as_str())
            .collect();
        assert_eq!(queue, ["fa", "fb"]);
    }
}
