//! The one thread that writes the raft log's file. It takes every request queued since its last
//! commit, applies them in queue order in one write transaction, commits it (with fsync when
//! anyone waits for one of them: group commit), then tells the overlay what the file now holds
//! and only then reports each request durable, in order.
//!
//! After a failed commit the file's state is unknown, so the writer refuses everything after
//! it: openraft stops on the first error it is told of.

use std::io;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use bytes::Bytes;
use redb::{Database, Durability};

use super::{KEY_LAST_PURGED, LOGS, META, Shared};

/// Told the outcome once the request's commit is durable (or has failed).
pub(super) type OnDurable = Box<dyn FnOnce(io::Result<()>) + Send>;

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

/// The handle on the writer thread. Dropping it lets the thread commit what is queued, then
/// waits for it to exit, so the file is closed once the store and its readers are gone.
pub(super) struct Writer {
    queue: Option<Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn spawn(shared: Arc<Shared>) -> io::Result<Writer> {
        let (queue, requests) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run(&shared, &requests))?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `request`; fails only when the writer thread is gone (it panicked).
    pub(super) fn send(&self, request: Request) -> Result<(), WriterStopped> {
        self.queue
            .as_ref()
            .ok_or(WriterStopped)?
            .send(request)
            .map_err(|_| WriterStopped)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the raft log writer panicked");
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the raft log writer has stopped")]
pub(super) struct WriterStopped;

fn run(shared: &Shared, requests: &Receiver<Request>) {
    // Set by the first failed commit: every later request fails with it.
    let mut failed: Option<String> = None;
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        batch.extend(requests.try_iter());
        let last_seq = batch.last().map_or(0, |r| r.seq);
        let outcome = match &failed {
            Some(e) => Err(e.clone()),
            None => commit(&shared.db, &batch).map_err(|e| e.to_string()),
        };
        match outcome {
            Ok(()) => {
                shared.overlay().flushed(last_seq);
                for done in batch.into_iter().filter_map(|r| r.done) {
                    done(Ok(()));
                }
            }
            Err(e) => {
                if failed.is_none() {
                    tracing::error!(error = %e, "raft log commit failed; refusing further writes");
                    failed = Some(e.clone());
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

/// Applies `batch` in order in one write transaction and commits it, with fsync when any of
/// its requests waits for durability.
fn commit(db: &Database, batch: &[Request]) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    let durable = batch.iter().any(|r| r.done.is_some());
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
