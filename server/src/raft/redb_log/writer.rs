//! The one thread that writes the raft log's file. It takes every request queued since its last
//! commit, applies them in queue order in one write transaction, commits it (with fsync when
//! anyone waits for one of them: group commit), then tells the overlay what the file now holds
//! and only then reports each request durable, in order. In memory (`--dev`) nothing can be made
//! durable and a commit is cheap, so there is no thread: the caller commits, flushing now and
//! then only for redb to reuse freed pages (see [`Writer::inline`]).
//!
//! After a failed commit the file's state is unknown, so the writer refuses everything after
//! it: openraft stops on the first error it is told of.

use std::io;
use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use bytes::Bytes;
use redb::{Database, Durability};

use super::{KEY_LAST_PURGED, LOGS, META, Shared};

/// Told the outcome once the request's commit is durable (or has failed).
pub(super) type OnDurable = Box<dyn FnOnce(io::Result<()>) + Send + Sync>;

/// One change to the file, in the order openraft made it.
pub(super) enum Change {
    /// Entries by index, postcard-encoded.
    Append(Vec<(u64, Bytes)>),
    /// Remove every index from this one on.
    Truncate { from: u64 },
    /// Remove every index up to `upto` and record `log_id` (postcard) as the last purged.
    Purge { upto: u64, log_id: Vec<u8> },
    /// Set a metadata value (postcard).
    Meta { key: &'static str, value: Vec<u8> },
}

pub(super) struct Request {
    /// Increases by one per request; see [`super::overlay`].
    pub seq: u64,
    pub change: Change,
    /// `None` when nobody waits: such a request alone commits without fsync, and the next
    /// durable commit carries it.
    pub done: Option<OnDurable>,
}

/// In memory, the most requests nobody waits for that wait for a commit.
const DEFER_AT_MOST: usize = 64;

/// Commits batches of requests and reports them: on the writer thread for a file, in the
/// caller for memory.
struct Committer {
    shared: Arc<Shared>,
    /// Flush one commit in this many; `None` flushes every commit anyone waits for (a file).
    flush_every: Option<u32>,
    /// Commits since the last flushed one.
    unflushed: u32,
    /// Set by the first failed commit: every later request fails with it.
    failed: Option<String>,
}

impl Committer {
    fn commit(&mut self, batch: Vec<Request>) {
        let last_seq = batch.last().map_or(0, |r| r.seq);
        let durable = match self.flush_every {
            None => batch.iter().any(|r| r.done.is_some()),
            Some(n) => self.unflushed + 1 >= n,
        };
        self.unflushed = if durable { 0 } else { self.unflushed + 1 };
        let outcome = match &self.failed {
            Some(e) => Err(e.clone()),
            None => commit(&self.shared.db, &batch, durable).map_err(|e| e.to_string()),
        };
        match outcome {
            Ok(()) => {
                self.shared.overlay().flushed(last_seq);
                for done in batch.into_iter().filter_map(|r| r.done) {
                    done(Ok(()));
                }
            }
            Err(e) => {
                if self.failed.is_none() {
                    tracing::error!(error = %e, "raft log commit failed; refusing further writes");
                    self.failed = Some(e.clone());
                }
                for done in batch.into_iter().filter_map(|r| r.done) {
                    done(Err(io::Error::other(format!(
                        "raft log commit failed: {e}"
                    ))));
                }
            }
        }
    }
}

/// Where requests go.
pub(super) struct Writer(Mode);

enum Mode {
    /// A file: the writer thread commits what is queued while callers go on. Dropping the
    /// handle lets the thread commit what is still queued, then waits for it to exit, so the
    /// file is closed once the store and its readers are gone.
    Thread {
        queue: Option<Sender<Request>>,
        thread: Option<JoinHandle<()>>,
    },
    /// Memory: see [`Writer::inline`].
    Inline {
        committer: Committer,
        /// Requests nobody waits for, committed with the next one somebody does.
        deferred: Vec<Request>,
    },
}

impl Writer {
    /// The writer of a file, on its own thread.
    pub(super) fn thread(shared: Arc<Shared>) -> io::Result<Writer> {
        let (queue, requests) = mpsc::channel();
        let mut committer = Committer {
            shared,
            flush_every: None,
            unflushed: 0,
            failed: None,
        };
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || {
                while let Ok(first) = requests.recv() {
                    let mut batch = vec![first];
                    batch.extend(requests.try_iter());
                    committer.commit(batch);
                }
            })?;
        Ok(Writer(Mode::Thread {
            queue: Some(queue),
            thread: Some(thread),
        }))
    }

    /// The writer of an in-memory store (`--dev`). A commit there costs less than two hand-offs
    /// between threads, so the caller commits: a request somebody waits for at once, together
    /// with the requests nobody waits for queued before it (a committed index, a truncation, a
    /// purge). A flush is only a copy of pages, so it happens once in `flush_every` commits
    /// (redb reuses the pages a commit frees only after a flushed commit).
    pub(super) fn inline(shared: Arc<Shared>, flush_every: u32) -> Writer {
        Writer(Mode::Inline {
            committer: Committer {
                shared,
                flush_every: Some(flush_every),
                unflushed: 0,
                failed: None,
            },
            deferred: Vec::new(),
        })
    }

    /// Queues `request` (commits it, in memory); fails only when the writer thread is gone (it
    /// panicked).
    pub(super) fn send(&mut self, request: Request) -> Result<(), WriterStopped> {
        match &mut self.0 {
            Mode::Thread { queue, .. } => queue
                .as_ref()
                .ok_or(WriterStopped)?
                .send(request)
                .map_err(|_| WriterStopped),
            Mode::Inline {
                committer,
                deferred,
            } => {
                let waited = request.done.is_some();
                deferred.push(request);
                if waited || deferred.len() >= DEFER_AT_MOST {
                    committer.commit(std::mem::take(deferred));
                }
                Ok(())
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Mode::Thread { queue, thread } = &mut self.0 {
            drop(queue.take());
            if let Some(thread) = thread.take()
                && thread.join().is_err()
            {
                tracing::error!("the raft log writer panicked");
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the raft log writer has stopped")]
pub(super) struct WriterStopped;

/// Applies `batch` in order in one write transaction and commits it, flushed (fsync for a
/// file) when `durable`.
fn commit(db: &Database, batch: &[Request], durable: bool) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(if durable {
        Durability::Immediate
    } else {
        Durability::None
    })?;
    {
        let mut logs = tx.open_table(LOGS)?;
        let mut meta = tx.open_table(META)?;
        for request in batch {
            match &request.change {
                Change::Append(entries) => {
                    for (index, encoded) in entries {
                        logs.insert(*index, encoded.as_ref())?;
                    }
                }
                Change::Truncate { from } => {
                    logs.retain_in::<u64, _>(*from.., |_, _| false)?;
                }
                Change::Purge { upto, log_id } => {
                    meta.insert(KEY_LAST_PURGED, log_id.as_slice())?;
                    logs.retain_in::<u64, _>(..=*upto, |_, _| false)?;
                }
                Change::Meta { key, value } => {
                    meta.insert(*key, value.as_slice())?;
                }
            }
        }
    }
    tx.commit()?;
    Ok(())
}
