//! Blocking queries coalesced in the agent: local watchers of the same read (the same query,
//! consistency mode and index) share one wait on the servers, and its answer fans out to each
//! of them (`?consistent` reads aside: each has the leader confirm itself for it). The servers
//! answer reads unfiltered (a token's filter is applied by the handler, per request, on the
//! answer), so watchers with different tokens may share a wait: each sees only its own
//! filtered view of the one answer. A watcher whose index differs asks its own question
//! (another key), never gets an answer meant for an older index.
//!
//! A shared wait is a [`Shared`] future polled by its watchers: when the last of them leaves (a
//! client hung up) it is dropped, and with it the query on the servers and their blocking slot.
//! The table holds it weakly, and the wait takes its own entry out when it ends either way.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt as _, Shared, WeakShared};
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::Answer;

/// A read's identity: its query, consistency mode and index, encoded; one allocation shared by
/// the read, the table and the wait's entry in it.
pub(super) type Read = Arc<[u8]>;

/// A shared wait. Its answer is shared behind an `Arc`: the wait keeps room for its answer
/// beside its future while it waits, a pointer rather than a few hundred bytes.
pub(super) type Wait = Shared<Registering>;

/// A shared wait as the table knows it: joinable by any watcher that may answer as late as it
/// does.
struct Entry {
    id: u64,
    /// When the wait answers at the latest.
    deadline: Instant,
    wait: WeakShared<Registering>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    /// By the read: the waits on it, nearly always one (a watcher with a shorter wait than the
    /// others' starts its own), kept inline.
    waits: HashMap<Read, SmallVec<[Entry; 1]>>,
    /// Waits in all.
    len: usize,
}

/// The query on the servers of a shared wait, and its entry in the table, taken out when the
/// wait ends: answered, or dropped by the last watcher polling it. A future of its own type
/// rather than an `async` block boxed around the query: the shared wait holds it inline.
pub(super) struct Registering {
    query: BoxFuture<'static, Answer>,
    _registered: Registered,
}

impl Future for Registering {
    type Output = Arc<Answer>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Arc<Answer>> {
        self.get_mut().query.poll_unpin(cx).map(Arc::new)
    }
}

/// The shared waits of one agent, and how many blocking queries they answer.
#[derive(Default)]
pub(super) struct Waits {
    table: Mutex<Table>,
    watchers: AtomicUsize,
}

/// Takes a wait's entry out of the table when the wait ends: answered, or dropped by the last
/// watcher polling it.
struct Registered {
    waits: Arc<Waits>,
    key: Read,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut table = self.waits.table.lock();
        let Some(entries) = table.waits.get_mut(&self.key) else {
            return;
        };
        let before = entries.len();
        entries.retain(|e| e.id != self.id);
        let removed = before - entries.len();
        if entries.is_empty() {
            table.waits.remove(&self.key);
        }
        table.len -= removed;
    }
}

/// One local blocking query, counted while it waits.
pub(super) struct Watcher {
    waits: Arc<Waits>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.waits.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Waits {
    /// Counts a local blocking query until the returned guard is dropped.
    pub(super) fn watcher(self: &Arc<Self>) -> Watcher {
        self.watchers.fetch_add(1, Ordering::Relaxed);
        Watcher {
            waits: Arc::clone(self),
        }
    }

    /// Blocking queries of local clients waiting now.
    pub(super) fn watchers(&self) -> usize {
        self.watchers.load(Ordering::Relaxed)
    }

    /// Waits on the servers now, each shared by one or more watchers.
    pub(super) fn shared(&self) -> usize {
        self.table.lock().len
    }

    /// The wait on the read `key` that answers by `deadline` plus `late`, joined (`true`);
    /// else the one `start` makes (answering by `deadline`), registered for the watchers of
    /// the same read that come next. `late` is how long after its request the watcher came
    /// here (its handler's first run): watchers whose requests came together may come here in
    /// another order, and still share a wait.
    pub(super) fn join_or_start(
        self: &Arc<Self>,
        key: &Read,
        deadline: Instant,
        late: Duration,
        start: impl FnOnce() -> BoxFuture<'static, Answer>,
    ) -> (Wait, bool) {
        let mut table = self.table.lock();
        let joined = table
            .waits
            .get(key)
            .into_iter()
            .flatten()
            .filter(|e| e.deadline <= deadline + late)
            .find_map(|e| e.wait.upgrade());
        if let Some(wait) = joined {
            return (wait, true);
        }
        table.next_id += 1;
        let id = table.next_id;
        let wait = Registering {
            query: start(),
            _registered: Registered {
                waits: Arc::clone(self),
                key: Arc::clone(key),
                id,
            },
        }
        .shared();
        if let Some(weak) = wait.downgrade() {
            table.waits.entry(Arc::clone(key)).or_default().push(Entry {
                id,
                deadline,
                wait: weak,
            });
            table.len += 1;
        }
        (wait, false)
    }
}
