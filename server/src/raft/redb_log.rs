//! The raft log of a server: one redb file (`<data_dir>/raft.redb`, mode 0600) holding the log
//! entries (index → postcard `Entry`) and the raft metadata (vote, committed log id, last purged
//! log id, file format version). `--dev` runs the same store on redb's in-memory backend, where
//! each call commits its own change at once (see [`Writer::inline`]).
//!
//! Writes do not wait for the disk. Each call queues its change for one writer thread
//! ([`writer`]), which drains the queue into one write transaction and one fsync (group
//! commit), and only then calls the `LogFlushed` of each append. Until the file holds a change,
//! the [`overlay`] holds it, and every read sees the overlay laid over the file.
//!
//! Invariants openraft relies on:
//! * changes reach the file in the order openraft made them: one queue, one writer, applied in
//!   queue order inside each transaction;
//! * an append is readable when `append` returns, and its `LogFlushed` fires only after a
//!   commit with fsync holds it and every change queued before it;
//! * `save_vote` returns only once its commit is durable;
//! * a truncated or purged entry is unreadable once the call returns, even while the file or
//!   the queue still holds it;
//! * `limited_get_log_entries` returns at most [`MAX_APPEND_BYTES`] of encoded entries, and one
//!   entry at least when the range holds any.
//!
//! A crash loses only changes nobody was told are durable: redb commits atomically, and a file
//! is checked for integrity on every open, so a damaged one is refused rather than trusted.

mod overlay;
mod writer;

use std::fmt::Debug;
use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, RaftLogReader, StorageIOError, Vote};
use parking_lot::{Mutex, MutexGuard};
use redb::backends::{FileBackend, InMemoryBackend};
use redb::{
    Database, DatabaseError, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
};
use serde::de::DeserializeOwned;

use self::overlay::Overlay;
use self::writer::{Change, OnDurable, Request, Writer};
use super::{LogId, MAX_APPEND_BYTES, NodeId, StorageError, TypeConfig};

type Entry = openraft::Entry<TypeConfig>;

/// The log file's name inside the data directory.
pub const LOG_FILE_NAME: &str = "raft.redb";

/// Raft log entries by index; values are postcard `Entry<TypeConfig>`.
const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata by name; values are postcard (see the `KEY_*` constants).
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// `Vote<NodeId>`.
const KEY_VOTE: &str = "vote";
/// `Option<LogId>`.
const KEY_COMMITTED: &str = "committed";
/// `LogId`.
const KEY_LAST_PURGED: &str = "last_purged";
/// One byte: the layout of this file (tables and value encodings).
const KEY_FORMAT: &str = "format";

/// Bump when the tables or value encodings change; an old binary then refuses a newer file.
const FORMAT_VERSION: u8 = 1;

/// What errors name instead of a path for the in-memory store.
const IN_MEMORY: &str = "(in memory)";

/// The in-memory store flushes one commit in this many (see [`Writer::inline`]): a flush costs
/// about twice an unflushed commit's time, and the pages freed meanwhile stay few.
const IN_MEMORY_FLUSH_EVERY: u32 = 64;

/// Why the raft log could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error(
        "raft log {path} is locked by another process; is another server using this data directory?"
    )]
    AlreadyOpen { path: PathBuf },
    #[error("cannot create raft log {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open raft log {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: DatabaseError,
    },
    #[error(
        "raft log {path} is corrupt (remove the data directory and rejoin the cluster, or restore it from a backup): {source}"
    )]
    Corrupt {
        path: PathBuf,
        #[source]
        source: AnyError,
    },
    #[error("cannot initialise raft log {path}: {source}")]
    Init {
        path: PathBuf,
        #[source]
        source: redb::Error,
    },
    #[error(
        "raft log {path} has format version {found}; this build reads version {FORMAT_VERSION}"
    )]
    UnsupportedFormat { path: PathBuf, found: u8 },
    #[error("cannot start the raft log writer for {path}: {source}")]
    Writer {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What the store, its readers and the writer thread share.
struct Shared {
    db: Database,
    overlay: Mutex<Overlay>,
}

impl Shared {
    fn overlay(&self) -> MutexGuard<'_, Overlay> {
        self.overlay.lock()
    }

    /// The overlay and a file snapshot taken together. The writer forgets a change only after
    /// committing it, so under the lock the file holds every change the overlay has forgotten.
    fn snapshot<T>(
        &self,
        take: impl FnOnce(&Overlay) -> T,
    ) -> Result<(ReadTransaction, T), AnyError> {
        let overlay = self.overlay();
        let tx = self.db.begin_read().map_err(|e| AnyError::new(&e))?;
        Ok((tx, take(&overlay)))
    }

    /// The entries in `range` of the log as openraft last wrote it, stopping before the entry
    /// that would take their encoded size above `budget` (never before the first).
    fn read(&self, range: impl RangeBounds<u64>, budget: usize) -> Result<Vec<Entry>, AnyError> {
        let (start, end) = half_open(&range);
        let (tx, (pending, (file_start, file_end))) =
            self.snapshot(|o| (o.encoded(start, end, budget), o.file_window()))?;
        let mut batch = Batch::new(budget);
        let mut pending = pending.into_iter().peekable();
        let (from, to) = (start.max(file_start), end.min(file_end));
        if from < to {
            let table = tx.open_table(LOGS).map_err(|e| AnyError::new(&e))?;
            for item in table.range(from..to).map_err(|e| AnyError::new(&e))? {
                let (index, value) = item.map_err(|e| AnyError::new(&e))?;
                let index = index.value();
                // Overlay entries sort in; one at the same index replaces the file's.
                let mut replaced = false;
                while let Some((i, encoded)) = pending.next_if(|(i, _)| *i <= index) {
                    replaced |= i == index;
                    if !batch.push(&encoded)? {
                        return Ok(batch.entries);
                    }
                }
                if !replaced && !batch.push(value.value())? {
                    return Ok(batch.entries);
                }
            }
        }
        for (_, encoded) in pending {
            if !batch.push(&encoded)? {
                break;
            }
        }
        Ok(batch.entries)
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, AnyError> {
        let (tx, (pending_last, (file_start, file_end), last_purged)) =
            self.snapshot(|o| (o.last(), o.file_window(), o.last_purged()))?;
        let mut file_last = None;
        if file_start < file_end {
            let table = tx.open_table(LOGS).map_err(|e| AnyError::new(&e))?;
            let mut range = table
                .range(file_start..file_end)
                .map_err(|e| AnyError::new(&e))?;
            if let Some(item) = range.next_back() {
                let (_, value) = item.map_err(|e| AnyError::new(&e))?;
                file_last = Some(decode_entry(value.value())?.log_id);
            }
        }
        let last = match (pending_last, file_last) {
            (Some(p), Some(f)) => Some(if p.index >= f.index { p } else { f }),
            (p, f) => p.or(f),
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last.or(last_purged),
        })
    }
}

/// Entries read so far, within a byte budget.
struct Batch {
    entries: Vec<Entry>,
    bytes: usize,
    budget: usize,
}

impl Batch {
    fn new(budget: usize) -> Batch {
        Batch {
            entries: Vec::new(),
            bytes: 0,
            budget,
        }
    }

    /// Decodes and keeps `encoded`, unless it would take the batch above its budget (the first
    /// entry is always kept); returns whether it was kept.
    fn push(&mut self, encoded: &[u8]) -> Result<bool, AnyError> {
        let bytes = self.bytes.saturating_add(encoded.len());
        if !self.entries.is_empty() && bytes > self.budget {
            return Ok(false);
        }
        self.entries.push(decode_entry(encoded)?);
        self.bytes = bytes;
        Ok(true)
    }
}

/// The raft log; see the module documentation. Dropping it commits whatever is still queued
/// and stops the writer thread.
pub struct RedbLogStore {
    shared: Arc<Shared>,
    writer: Writer,
    /// Sequence number of the last request queued.
    seq: u64,
    /// The vote as last saved (durable: `save_vote` waits for its commit).
    vote: Option<Vote<NodeId>>,
    /// The committed log id as openraft last saved it; its commit may still be queued.
    committed: Option<LogId>,
}

/// Reads the log for openraft's replication streams: the overlay first, then the file.
#[derive(Clone)]
pub struct RedbLogReader {
    shared: Arc<Shared>,
}

impl RedbLogStore {
    /// A reader over this store's log (the overlay, then the file).
    fn reader(&self) -> RedbLogReader {
        RedbLogReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Opens (creating if missing, with mode 0600) the log at `path`, normally
    /// `<data_dir>/`[`LOG_FILE_NAME`]. The parent directory must exist. Blocks while it checks
    /// the file's integrity (a read of the whole file) and, for a new file, for one fsync.
    pub fn open(path: impl AsRef<Path>) -> Result<RedbLogStore, LogStoreError> {
        let path = path.as_ref();
        let file = create_private(path).map_err(|source| LogStoreError::Create {
            path: path.to_owned(),
            source,
        })?;
        let open_error = |e: DatabaseError| match e {
            DatabaseError::DatabaseAlreadyOpen => LogStoreError::AlreadyOpen {
                path: path.to_owned(),
            },
            DatabaseError::Storage(redb::StorageError::Corrupted(_)) => LogStoreError::Corrupt {
                path: path.to_owned(),
                source: AnyError::new(&e),
            },
            e => LogStoreError::Open {
                path: path.to_owned(),
                source: e,
            },
        };
        let backend = FileBackend::new(file).map_err(open_error)?;
        let db = Database::builder()
            .set_check_integrity_on_open(true)
            .create_with_backend(backend)
            .map_err(open_error)?;
        let writer = Writer::thread;
        RedbLogStore::start(db, path, writer)
    }

    /// A log that lives in memory and dies with the process, for `--dev`.
    pub fn in_memory() -> Result<RedbLogStore, LogStoreError> {
        let path = Path::new(IN_MEMORY);
        let db = Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .map_err(|source| LogStoreError::Open {
                path: path.to_owned(),
                source,
            })?;
        let writer = |shared| Ok(Writer::inline(shared, IN_MEMORY_FLUSH_EVERY));
        RedbLogStore::start(db, path, writer)
    }

    /// Checks the format, loads the metadata and starts the writer.
    fn start(
        db: Database,
        path: &Path,
        writer: impl FnOnce(Arc<Shared>) -> io::Result<Writer>,
    ) -> Result<RedbLogStore, LogStoreError> {
        let found = init_tables(&db).map_err(|source| LogStoreError::Init {
            path: path.to_owned(),
            source,
        })?;
        if found != FORMAT_VERSION {
            return Err(LogStoreError::UnsupportedFormat {
                path: path.to_owned(),
                found,
            });
        }
        let corrupt = |source| LogStoreError::Corrupt {
            path: path.to_owned(),
            source,
        };
        let vote: Option<Vote<NodeId>> = read_meta(&db, KEY_VOTE).map_err(corrupt)?;
        let committed: Option<Option<LogId>> = read_meta(&db, KEY_COMMITTED).map_err(corrupt)?;
        let last_purged: Option<LogId> = read_meta(&db, KEY_LAST_PURGED).map_err(corrupt)?;
        let shared = Arc::new(Shared {
            db,
            overlay: Mutex::new(Overlay::new(last_purged)),
        });
        let writer = writer(Arc::clone(&shared)).map_err(|source| LogStoreError::Writer {
            path: path.to_owned(),
            source,
        })?;
        Ok(RedbLogStore {
            shared,
            writer,
            seq: 0,
            vote,
            committed: committed.flatten(),
        })
    }

    /// Queues `change`, after `update` has shown it to readers under the overlay's lock.
    fn queue(
        &mut self,
        change: Change,
        done: Option<OnDurable>,
        update: impl FnOnce(&mut Overlay, u64),
    ) -> Result<(), AnyError> {
        self.seq += 1;
        let seq = self.seq;
        update(&mut self.shared.overlay(), seq);
        self.writer
            .send(Request { seq, change, done })
            .map_err(|e| AnyError::new(&e))
    }

    /// `append` with any completion: `done` is told once a commit with fsync holds `entries`.
    fn append_then(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
        done: OnDurable,
    ) -> Result<(), AnyError> {
        let encoded = entries
            .into_iter()
            .map(|e| postcard::to_allocvec(&e).map(|bytes| (e.log_id, Bytes::from(bytes))))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AnyError::new(&e))?;
        let change = Change::Append(
            encoded
                .iter()
                .map(|(id, b)| (id.index, b.clone()))
                .collect(),
        );
        self.queue(change, Some(done), |overlay, seq| {
            overlay.append(seq, &encoded)
        })
    }
}

/// Opens `path` for redb, creating it with mode 0600 and taking group and other access away
/// from a file an older build created.
fn create_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    let mode = file.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        file.set_permissions(Permissions::from_mode(mode & 0o700))?;
    }
    Ok(file)
}

/// Creates both tables if missing and stamps a new file with [`FORMAT_VERSION`]; returns the
/// file's format version.
fn init_tables(db: &Database) -> Result<u8, redb::Error> {
    let tx = db.begin_write()?;
    let found = {
        tx.open_table(LOGS)?;
        let mut meta = tx.open_table(META)?;
        let stamped = meta.get(KEY_FORMAT)?.map(|v| v.value().first().copied());
        match stamped {
            // An empty format value cannot be ours: report it as version 0.
            Some(version) => version.unwrap_or(0),
            None => {
                meta.insert(KEY_FORMAT, [FORMAT_VERSION].as_slice())?;
                FORMAT_VERSION
            }
        }
    };
    tx.commit()?;
    Ok(found)
}

/// Reads and decodes one metadata value.
fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, AnyError> {
    let tx = db.begin_read().map_err(|e| AnyError::new(&e))?;
    let table = tx.open_table(META).map_err(|e| AnyError::new(&e))?;
    let Some(bytes) = table.get(key).map_err(|e| AnyError::new(&e))? else {
        return Ok(None);
    };
    postcard::from_bytes(bytes.value())
        .map(Some)
        .map_err(|e| AnyError::new(&e))
}

fn decode_entry(bytes: &[u8]) -> Result<Entry, AnyError> {
    postcard::from_bytes(bytes).map_err(|e| AnyError::new(&e))
}

/// `range` as `[start, end)`; empty when `start >= end`.
fn half_open(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for RedbLogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.shared
            .read(range, usize::MAX)
            .map_err(|e| StorageIOError::read_logs(e).into())
    }

    /// At most [`MAX_APPEND_BYTES`] of encoded entries: one AppendEntries' worth.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.shared
            .read(start..end, MAX_APPEND_BYTES)
            .map_err(|e| StorageIOError::read_logs(e).into())
    }
}

/// The store reads exactly as its readers do.
impl RaftLogReader<TypeConfig> for RedbLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.reader().try_get_log_entries(range).await
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.reader().limited_get_log_entries(start, end).await
    }
}

impl RaftLogStorage<TypeConfig> for RedbLogStore {
    type LogReader = RedbLogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.shared
            .log_state()
            .map_err(|e| StorageIOError::read_logs(e).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let value = postcard::to_allocvec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        let (durable, committed) = tokio::sync::oneshot::channel();
        let done: OnDurable = Box::new(move |result| {
            // The caller stopped waiting only if openraft is shutting down.
            let _ = durable.send(result);
        });
        let change = Change::Meta {
            key: KEY_VOTE,
            value,
        };
        self.queue(change, Some(done), |_, _| {})
            .map_err(StorageIOError::write_vote)?;
        committed
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.vote)
    }

    /// The committed index is only a hint for how far to replay on restart, so nobody waits for
    /// it: its commit goes without fsync unless it shares one with a waiting change.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let value = postcard::to_allocvec(&committed).map_err(|e| StorageIOError::write(&e))?;
        let change = Change::Meta {
            key: KEY_COMMITTED,
            value,
        };
        self.queue(change, None, |_, _| {})
            .map_err(StorageIOError::write)?;
        self.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        self.append_then(
            entries,
            Box::new(|result| callback.log_io_completed(result)),
        )
        .map_err(|e| StorageIOError::write_logs(e).into())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index;
        self.queue(Change::Truncate { from }, None, |overlay, seq| {
            overlay.truncate(seq, from)
        })
        .map_err(|e| StorageIOError::write_logs(e).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let encoded = postcard::to_allocvec(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        let change = Change::Purge {
            upto: log_id.index,
            log_id: encoded,
        };
        self.queue(change, None, |overlay, _| overlay.purge(log_id))
            .map_err(|e| StorageIOError::write_logs(e).into())
    }
}

#[cfg(test)]
mod tests;
