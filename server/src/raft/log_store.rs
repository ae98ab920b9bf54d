//! The raft log of a server: a write-ahead log in `<data_dir>/raft-log/` (mode 0700), kept by
//! the `raft-log` crate (the log engine openraft's author wrote for Databend's meta service).
//! `--dev` runs the same engine in a temporary directory that is removed when the server stops.
//!
//! Every change (an append, the vote, the committed id, a truncation or a purge) is one record
//! appended to the current chunk file, so a write costs one sequential append and one
//! `fdatasync`, where a B-tree commit rewrote a dozen scattered pages. Appends do not wait for
//! the disk: raft-log's flush thread writes and syncs every record queued meanwhile at once
//! (group commit) and only then calls the `IOFlushed` of each append. The log's index and a
//! cache of recent payloads live in memory, so an entry is readable as soon as `append`
//! returns.
//!
//! Invariants openraft relies on:
//! * records reach the file in the order openraft made them: one writer, one queue;
//! * an append's `IOFlushed` fires only once a sync holds it and every record before it;
//! * `save_vote` returns only once its record is durable;
//! * a truncated or purged entry is unreadable once the call returns;
//! * `limited_get_log_entries` returns at most [`MAX_APPEND_BYTES`] of encoded payloads, and
//!   one entry at least when the range holds any.
//!
//! A crash loses only records nobody was told are durable: each record carries a checksum, a
//! torn last record is cut off on open, and any other damage refuses the open.

use std::fmt::Debug;
use std::fs::{DirBuilder, Permissions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::RaftLogReader;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::type_config::alias::EntryPayloadOf;
use parking_lot::Mutex;
use raft_log::api::raft_log_writer::RaftLogWriter as _;
use raft_log::codeq::{Decode, Encode};
use raft_log::{Config, RaftLog};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Entry, LogId, MAX_APPEND_BYTES, TypeConfig, Vote};

/// The log's directory inside the data directory.
pub const LOG_DIR_NAME: &str = "raft-log";

/// Where an older build kept its log (one redb file).
const OLD_LOG_FILE_NAME: &str = "raft.redb";

/// Bump when the records' encodings change; an old binary then refuses a newer log.
const FORMAT_VERSION: u8 = 2;

/// Payloads kept in memory for reads (replication, apply): the newest up to this many bytes.
const CACHE_BYTES: usize = 64 * 1024 * 1024;
/// A chunk file is closed and a new one started past this size; purged entries go away a
/// whole chunk at a time.
const CHUNK_BYTES: usize = 64 * 1024 * 1024;
/// Buffer for reading a chunk back (on open, and for payloads no longer cached).
const READ_BUFFER_BYTES: usize = 1024 * 1024;

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
        source: io::Error,
    },
    #[error(
        "raft log {path} is corrupt (remove the data directory and rejoin the cluster, or restore it from a backup): {source}"
    )]
    Corrupt {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "raft log {path} has format version {found}; this build reads version {FORMAT_VERSION}"
    )]
    UnsupportedFormat { path: PathBuf, found: u8 },
    #[error(
        "{path} is the raft log of an older Vigil, which this build does not read: remove the data directory and rejoin the cluster, or restore it from a snapshot"
    )]
    OldLog { path: PathBuf },
}

/// What the log holds, as raft-log sees it: openraft's log ids and votes, each entry's payload
/// (postcard-encoded, so the cache hands out cheap copies), and the format stamp.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogTypes;

impl raft_log::Types for LogTypes {
    type LogId = Stored<LogId>;
    type LogPayload = Payload;
    type Vote = Stored<Vote>;
    type UserData = Stored<Stamp>;
    type Callback = Done;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        payload.0.len() as u64
    }
}

/// A value stored in a record as a length-prefixed postcard encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stored<T>(T);

/// Writes `bytes` as codeq's `Vec<u8>` does (a big-endian u32 length, then the bytes), which is
/// how [`Stored`] and [`Payload`] decode them, without first copying them into a `Vec`.
fn encode_bytes(bytes: &[u8], mut w: impl io::Write) -> io::Result<usize> {
    let len = u32::try_from(bytes.len()).map_err(io::Error::other)?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(bytes)?;
    Ok(bytes.len() + 4)
}

impl<T: Serialize> Encode for Stored<T> {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        encode_bytes(
            &postcard::to_allocvec(&self.0).map_err(io::Error::other)?,
            w,
        )
    }
}

impl<T: DeserializeOwned> Decode for Stored<T> {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        let bytes = Vec::<u8>::decode(r)?;
        postcard::from_bytes(&bytes)
            .map(Stored)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// An entry's payload, postcard-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(Bytes);

impl Encode for Payload {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        encode_bytes(&self.0, w)
    }
}

impl Decode for Payload {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        Vec::<u8>::decode(r).map(|v| Payload(v.into()))
    }
}

/// The layout of the log's records; saved when a log is created, checked on every open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Stamp {
    format: u8,
}

/// Who hears that a flush is durable.
pub enum Done {
    /// openraft, for an append.
    Flushed(IOFlushed<TypeConfig>),
    /// A caller waiting for its change (the vote).
    Wait(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl raft_log::Callback for Done {
    fn send(self, result: io::Result<()>) {
        match self {
            Done::Flushed(flushed) => flushed.io_completed(result),
            // The waiter stopped waiting only if openraft is shutting down.
            Done::Wait(tx) => {
                let _ = tx.send(result);
            }
        }
    }
}

type Log = RaftLog<LogTypes>;

/// The raft log; see the module documentation.
pub struct LogStore {
    log: Arc<Mutex<Log>>,
    /// `--dev`'s directory, removed when the store is dropped.
    _temporary: Option<tempfile::TempDir>,
}

/// Reads the log for openraft's replication streams and state machine.
#[derive(Clone)]
pub struct LogReader {
    log: Arc<Mutex<Log>>,
}

impl LogStore {
    /// Opens (creating if missing) the log in `data_dir`'s [`LOG_DIR_NAME`]. Blocks while it
    /// reads the log back.
    pub fn open(data_dir: &Path) -> Result<LogStore, LogStoreError> {
        let old = data_dir.join(OLD_LOG_FILE_NAME);
        if old.exists() {
            return Err(LogStoreError::OldLog { path: old });
        }
        LogStore::open_dir(&data_dir.join(LOG_DIR_NAME), None)
    }

    /// A log in a new temporary directory, removed when the store is dropped: `--dev`.
    pub fn temporary() -> Result<LogStore, LogStoreError> {
        let dir = tempfile::Builder::new()
            .prefix("vigil-dev-raft-log-")
            .tempdir()
            .map_err(|source| LogStoreError::Create {
                path: std::env::temp_dir(),
                source,
            })?;
        let path = dir.path().to_owned();
        LogStore::open_dir(&path, Some(dir))
    }

    fn open_dir(
        path: &Path,
        temporary: Option<tempfile::TempDir>,
    ) -> Result<LogStore, LogStoreError> {
        create_private_dir(path).map_err(|source| LogStoreError::Create {
            path: path.to_owned(),
            source,
        })?;
        let mut log = Log::open(Arc::new(config(path))).map_err(|e| open_error(path, e))?;
        match log.log_state().user_data.as_ref() {
            Some(Stored(stamp)) if stamp.format == FORMAT_VERSION => {}
            Some(Stored(stamp)) => {
                return Err(LogStoreError::UnsupportedFormat {
                    path: path.to_owned(),
                    found: stamp.format,
                });
            }
            None => {
                let stamp = Stamp {
                    format: FORMAT_VERSION,
                };
                // No need to wait: any later sync carries the stamp before its own records, and
                // a log that lost it in a crash holds nothing else and is stamped again.
                log.save_user_data(Some(Stored(stamp)))
                    .and_then(|_| log.flush(true, None))
                    .map_err(|source| LogStoreError::Create {
                        path: path.to_owned(),
                        source,
                    })?;
            }
        }
        Ok(LogStore {
            log: Arc::new(Mutex::new(log)),
            _temporary: temporary,
        })
    }

    fn reader(&self) -> LogReader {
        LogReader {
            log: Arc::clone(&self.log),
        }
    }

    /// Queues `entries` and a sync; `done` hears when they are durable. Entries at or below
    /// the last purged index are already in the snapshot, so they are not appended again.
    fn append_then(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
        done: Done,
    ) -> io::Result<()> {
        let records = entries
            .into_iter()
            .map(|e| {
                let payload = postcard::to_allocvec(&e.payload).map_err(io::Error::other)?;
                Ok((Stored(e.log_id), Payload(payload.into())))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let mut log = self.log.lock();
        let purged = log.log_state().purged().map(|id| id.0.index);
        log.append(
            records
                .into_iter()
                .filter(|(id, _)| purged.is_none_or(|purged| id.0.index > purged)),
        )?;
        log.flush(true, Some(done))
    }
}

/// raft-log's settings for a log in `dir`.
fn config(dir: &Path) -> Config {
    let mut config = Config::new(dir.display());
    // Sync as soon as the flush thread has what waits: openraft appends one batch at a time,
    // so waiting for more only adds latency.
    config.wal.flush_batch_wait = Some(Duration::ZERO);
    config.wal.chunk_max_size = Some(CHUNK_BYTES);
    config.wal.read_buffer_size = Some(READ_BUFFER_BYTES);
    config.log_cache_capacity = Some(CACHE_BYTES);
    config
}

/// Creates `dir` (mode 0700) if missing, and takes group and other access away from one an
/// older build created.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, Permissions::from_mode(mode & 0o700))?;
    }
    Ok(())
}

fn open_error(path: &Path, source: io::Error) -> LogStoreError {
    let path = path.to_owned();
    match source.kind() {
        io::ErrorKind::WouldBlock => LogStoreError::AlreadyOpen { path },
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
            LogStoreError::Corrupt { path, source }
        }
        _ => LogStoreError::Open { path, source },
    }
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

impl LogReader {
    /// The entries in `[start, end)`, stopping before the entry that would take their encoded
    /// payloads above `budget` bytes (never before the first). Decodes outside the lock.
    fn read(&self, start: u64, end: u64, budget: usize) -> io::Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let mut records = Vec::new();
        {
            let log = self.log.lock();
            let mut bytes = 0usize;
            for record in log.read(start, end) {
                let (Stored(log_id), Payload(payload)) = record?;
                bytes = bytes.saturating_add(payload.len());
                if !records.is_empty() && bytes > budget {
                    break;
                }
                records.push((log_id, payload));
            }
        }
        records
            .into_iter()
            .map(|(log_id, payload)| {
                let payload: EntryPayloadOf<TypeConfig> =
                    postcard::from_bytes(&payload).map_err(io::Error::other)?;
                Ok(Entry { log_id, payload })
            })
            .collect()
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (start, end) = half_open(&range);
        self.read(start, end, usize::MAX)
    }

    /// At most [`MAX_APPEND_BYTES`] of encoded entries: one AppendEntries' worth.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        self.read(start, end, MAX_APPEND_BYTES)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.log.lock().log_state().vote().map(|v| v.0))
    }
}

/// The store reads exactly as its readers do.
impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        self.reader().try_get_log_entries(range).await
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        self.reader().limited_get_log_entries(start, end).await
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        self.reader().read_vote().await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let log = self.log.lock();
        let state = log.log_state();
        let last_purged = state.purged().map(|id| id.0);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: state.last().map(|id| id.0).or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let (tx, durable) = tokio::sync::oneshot::channel();
        {
            let mut log = self.log.lock();
            log.save_vote(Stored(*vote))?;
            log.flush(true, Some(Done::Wait(tx)))?;
        }
        durable.await.map_err(io::Error::other)?
    }

    /// The committed id is only a hint for how far to replay on restart, so nobody waits for
    /// it, and the flush thread is not even woken for it: the record waits in the log's buffer
    /// and the next append's write carries it (every write used to wake that thread twice).
    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let Some(committed) = committed else {
            return Ok(());
        };
        self.log.lock().commit(Stored(committed)).map(drop)
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.log.lock().log_state().committed().map(|id| id.0))
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        self.append_then(entries, Done::Flushed(callback))
    }

    /// Removes every entry after `last_log_id` (all of them for `None`); a log that holds
    /// nothing after it is left alone (raft-log truncates only after an entry it holds).
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        let mut log = self.log.lock();
        if log
            .log_state()
            .last()
            .is_none_or(|last| last.0.index < from)
        {
            return Ok(());
        }
        log.truncate(from)?;
        // No sync: the next append's sync carries the truncation before its own records.
        log.flush(false, None)
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let mut log = self.log.lock();
        log.purge(Stored(log_id))?;
        // No sync: purged entries are in the snapshot; a later sync makes the record durable.
        log.flush(false, None)
    }
}

#[cfg(test)]
mod tests;
