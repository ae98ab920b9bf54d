//! The durable raft log of a server set: one redb file (`<data_dir>/raft.redb`) holding the log
//! entries (index → postcard `Entry`) and the raft metadata (vote, committed log id, last purged
//! log id, file format version).
//!
//! Invariants openraft relies on:
//! * every write transaction commits with `Durability::Immediate` (fsync) before the call that
//!   made it returns, and `append` reports the flush to openraft only after that commit;
//! * `append` writes a whole batch in one transaction: one fsync per batch (group commit);
//! * writes are serialized: each trait method awaits its own commit, and redb admits one
//!   writer at a time anyway. Commits run on tokio's blocking pool so an fsync never stalls a
//!   runtime worker; reads are short range scans and run inline.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, RaftLogReader, StorageIOError, Vote};
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, TableDefinition,
    WriteTransaction,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

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

/// Why the raft log could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error(
        "raft log {path} is locked by another process; is another server using this data directory?"
    )]
    AlreadyOpen { path: PathBuf },
    #[error("cannot open raft log {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: DatabaseError,
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
}

/// The durable raft log. Cloning shares the same database (the reader handed to openraft is a
/// clone).
#[derive(Clone)]
pub struct RedbLogStore {
    db: Arc<Database>,
}

impl RedbLogStore {
    /// Opens (creating if missing) the log at `path`, normally `<data_dir>/`[`LOG_FILE_NAME`].
    /// The parent directory must exist. Blocks briefly (one fsync for a new file).
    pub fn open(path: impl AsRef<Path>) -> Result<RedbLogStore, LogStoreError> {
        let path = path.as_ref();
        let db = Database::create(path).map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => LogStoreError::AlreadyOpen {
                path: path.to_owned(),
            },
            e => LogStoreError::Open {
                path: path.to_owned(),
                source: e,
            },
        })?;
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
        Ok(RedbLogStore { db: Arc::new(db) })
    }

    /// Runs `write` in one write transaction on the blocking pool and commits it with fsync.
    async fn commit<F>(&self, write: F) -> Result<(), AnyError>
    where
        F: FnOnce(&WriteTransaction) -> Result<(), redb::Error> + Send + 'static,
    {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || commit_durably(&db, write))
            .await
            .map_err(|e| AnyError::new(&e))?
            .map_err(|e| AnyError::new(&e))
    }

    /// Writes a batch of entries in one transaction: one fsync for the whole batch.
    async fn write_entries(
        &self,
        entries: impl IntoIterator<Item = Entry, IntoIter: Send> + Send,
    ) -> Result<(), AnyError> {
        let encoded = entries
            .into_iter()
            .map(|e| postcard::to_allocvec(&e).map(|bytes| (e.log_id.index, bytes)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AnyError::new(&e))?;
        self.commit(move |tx| {
            let mut logs = tx.open_table(LOGS)?;
            for (index, bytes) in &encoded {
                logs.insert(*index, bytes.as_slice())?;
            }
            Ok(())
        })
        .await
    }

    /// Reads and decodes one metadata value.
    fn read_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, AnyError> {
        let tx = self.db.begin_read().map_err(|e| AnyError::new(&e))?;
        let table = tx.open_table(META).map_err(|e| AnyError::new(&e))?;
        let Some(bytes) = table.get(key).map_err(|e| AnyError::new(&e))? else {
            return Ok(None);
        };
        postcard::from_bytes(bytes.value())
            .map(Some)
            .map_err(|e| AnyError::new(&e))
    }

    /// Commits one metadata value durably.
    async fn write_meta<T: Serialize>(&self, key: &'static str, value: &T) -> Result<(), AnyError> {
        let bytes = postcard::to_allocvec(value).map_err(|e| AnyError::new(&e))?;
        self.commit(move |tx| {
            tx.open_table(META)?.insert(key, bytes.as_slice())?;
            Ok(())
        })
        .await
    }
}

/// Creates both tables if missing and stamps a new file with [`FORMAT_VERSION`]; returns the
/// file's format version.
fn init_tables(db: &Database) -> Result<u8, redb::Error> {
    let mut found = FORMAT_VERSION;
    commit_durably(db, |tx| {
        tx.open_table(LOGS)?;
        let mut meta = tx.open_table(META)?;
        let stamped = meta.get(KEY_FORMAT)?.map(|v| v.value().first().copied());
        match stamped {
            // An empty format value cannot be ours: report it as version 0.
            Some(version) => found = version.unwrap_or(0),
            None => {
                meta.insert(KEY_FORMAT, [FORMAT_VERSION].as_slice())?;
            }
        }
        Ok(())
    })?;
    Ok(found)
}

/// One write transaction, committed with fsync. On error the transaction is dropped (aborted).
fn commit_durably<F>(db: &Database, write: F) -> Result<(), redb::Error>
where
    F: FnOnce(&WriteTransaction) -> Result<(), redb::Error>,
{
    commit_with(db, Durability::Immediate, write)
}

fn commit_with<F>(db: &Database, durability: Durability, write: F) -> Result<(), redb::Error>
where
    F: FnOnce(&WriteTransaction) -> Result<(), redb::Error>,
{
    let mut tx = db.begin_write()?;
    tx.set_durability(durability)?;
    write(&tx)?;
    tx.commit()?;
    Ok(())
}

fn decode_entry(bytes: &[u8]) -> Result<Entry, AnyError> {
    postcard::from_bytes(bytes).map_err(|e| AnyError::new(&e))
}

/// `range` as owned bounds, or `None` when it cannot contain any index.
fn owned_bounds<RB: RangeBounds<u64>>(range: &RB) -> Option<(Bound<u64>, Bound<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = range.end_bound().cloned();
    let empty = match end {
        Bound::Included(e) => e < start,
        Bound::Excluded(e) => e <= start,
        Bound::Unbounded => false,
    };
    (!empty).then_some((Bound::Included(start), end))
}

impl RaftLogReader<TypeConfig> for RedbLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let Some(bounds) = owned_bounds(&range) else {
            return Ok(Vec::new());
        };
        let read = || -> Result<Vec<Entry>, AnyError> {
            let tx = self.db.begin_read().map_err(|e| AnyError::new(&e))?;
            let table = tx.open_table(LOGS).map_err(|e| AnyError::new(&e))?;
            let mut entries = Vec::new();
            for item in table.range::<u64>(bounds).map_err(|e| AnyError::new(&e))? {
                let (_, value) = item.map_err(|e| AnyError::new(&e))?;
                entries.push(decode_entry(value.value())?);
            }
            Ok(entries)
        };
        read().map_err(|e| StorageIOError::read_logs(e).into())
    }

    /// Entries from `start` on, at most [`MAX_APPEND_BYTES`] of them encoded (at least one):
    /// what one AppendEntries carries, so replication never reads (or sends) a whole backlog.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let read = || -> Result<Vec<Entry>, AnyError> {
            let tx = self.db.begin_read().map_err(|e| AnyError::new(&e))?;
            let table = tx.open_table(LOGS).map_err(|e| AnyError::new(&e))?;
            let mut entries = Vec::new();
            let mut bytes = 0usize;
            for item in table.range(start..end).map_err(|e| AnyError::new(&e))? {
                let (_, value) = item.map_err(|e| AnyError::new(&e))?;
                let encoded = value.value();
                bytes += encoded.len();
                if bytes > MAX_APPEND_BYTES && !entries.is_empty() {
                    break;
                }
                entries.push(decode_entry(encoded)?);
            }
            Ok(entries)
        };
        read().map_err(|e| StorageIOError::read_logs(e).into())
    }
}

impl RaftLogStorage<TypeConfig> for RedbLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_log = || -> Result<Option<LogId>, AnyError> {
            let tx = self.db.begin_read().map_err(|e| AnyError::new(&e))?;
            let table = tx.open_table(LOGS).map_err(|e| AnyError::new(&e))?;
            match table.last().map_err(|e| AnyError::new(&e))? {
                Some((_, value)) => Ok(Some(decode_entry(value.value())?.log_id)),
                None => Ok(None),
            }
        };
        let last = last_log().map_err(StorageIOError::read_logs)?;
        let last_purged: Option<LogId> = self
            .read_meta(KEY_LAST_PURGED)
            .map_err(StorageIOError::read_logs)?;
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_meta(KEY_VOTE, vote)
            .await
            .map_err(|e| StorageIOError::write_vote(e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(KEY_VOTE)
            .map_err(|e| StorageIOError::read_vote(e).into())
    }

    /// The committed index is only a hint for how far to replay on restart, so it is written
    /// without its own fsync (on openraft's commit path); the next durable commit carries it.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let bytes = postcard::to_allocvec(&committed).map_err(|e| StorageIOError::write(&e))?;
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            commit_with(&db, Durability::None, |tx| {
                tx.open_table(META)?
                    .insert(KEY_COMMITTED, bytes.as_slice())?;
                Ok(())
            })
        })
        .await
        .map_err(|e| StorageIOError::write(&e))?
        .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self
            .read_meta(KEY_COMMITTED)
            .map_err(StorageIOError::read)?;
        Ok(committed.flatten())
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
        let written = self.write_entries(entries).await;
        match written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.commit(move |tx| {
            tx.open_table(LOGS)?
                .retain_in::<u64, _>(log_id.index.., |_, _| false)?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_logs(e).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let purged = postcard::to_allocvec(&log_id)
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        self.commit(move |tx| {
            tx.open_table(META)?
                .insert(KEY_LAST_PURGED, purged.as_slice())?;
            tx.open_table(LOGS)?
                .retain_in::<u64, _>(..=log_id.index, |_, _| false)?;
            Ok(())
        })
        .await
        .map_err(|e| StorageIOError::write_logs(e).into())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::rpc::ServerNode;
    use openraft::{EntryPayload, Membership};
    use vigil_shared::kv::KvOp;
    use vigil_shared::rpc::{Command, Op};

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::testing::log_id(term, 1, index)
    }

    fn set(term: u64, index: u64, key: &str) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(Command {
                now_ms: 1_700_000_000_000 + index,
                op: Op::Kv(vec![KvOp::Set {
                    key: key.to_owned(),
                    value: format!("value at {index}").into_bytes(),
                    flags: index,
                }]),
            }),
        }
    }

    /// Blank, membership, then KV writes: the three payload kinds.
    fn sample_log(upto: u64) -> Vec<Entry> {
        let membership = Membership::new(
            vec![BTreeSet::from([1])],
            BTreeMap::from([(
                1,
                ServerNode {
                    name: "s1".into(),
                    rpc_addr: "127.0.0.1:8300".into(),
                },
            )]),
        );
        let mut entries = vec![
            Entry {
                log_id: log_id(1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(1, 2),
                payload: EntryPayload::Membership(membership),
            },
        ];
        entries.extend((3..=upto).map(|i| set(2, i, &format!("k{i}"))));
        entries
    }

    #[tokio::test]
    async fn log_vote_and_committed_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LOG_FILE_NAME);
        let vote = Vote::new_committed(2, 1);

        // Write a log, then shape it the way openraft does: purge a prefix, truncate a tail.
        {
            let mut store = RedbLogStore::open(&path).expect("open");
            store.write_entries(sample_log(20)).await.expect("append");
            store.save_vote(&vote).await.expect("vote");
            store
                .save_committed(Some(log_id(2, 15)))
                .await
                .expect("committed");
            store.purge(log_id(1, 2)).await.expect("purge");
            store.truncate(log_id(2, 18)).await.expect("truncate");
        }

        // A reopened store answers exactly as the first one did before it was dropped.
        let mut store = RedbLogStore::open(&path).expect("reopen");
        let state = store.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
        assert_eq!(state.last_log_id, Some(log_id(2, 17)));
        assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
        assert_eq!(
            store.read_committed().await.expect("committed"),
            Some(log_id(2, 15))
        );
        let entries = store.try_get_log_entries(0..100).await.expect("entries");
        assert_eq!(entries, sample_log(17)[2..].to_vec());

        // The reader openraft gets shares the same database.
        let mut reader = store.get_log_reader().await;
        store
            .write_entries([set(3, 18, "k18")])
            .await
            .expect("append");
        let tail = reader.try_get_log_entries(17..).await.expect("tail");
        assert_eq!(tail, vec![set(2, 17, "k17"), set(3, 18, "k18")]);
    }

    #[tokio::test]
    async fn empty_and_fully_purged_logs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LOG_FILE_NAME);

        // A new file: nothing at all.
        let mut store = RedbLogStore::open(&path).expect("open");
        let state = store.get_log_state().await.expect("log state");
        assert_eq!((state.last_purged_log_id, state.last_log_id), (None, None));
        assert_eq!(store.read_vote().await.expect("vote"), None);
        assert_eq!(store.read_committed().await.expect("committed"), None);

        // Everything purged: the last log id falls back to the last purged one.
        store.write_entries(sample_log(5)).await.expect("append");
        store.purge(log_id(2, 5)).await.expect("purge");
        drop(store);
        let mut store = RedbLogStore::open(&path).expect("reopen");
        let state = store.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, Some(log_id(2, 5)));
        assert_eq!(state.last_log_id, Some(log_id(2, 5)));

        // Empty and inverted ranges read nothing instead of failing.
        store
            .write_entries([set(2, 6, "k6")])
            .await
            .expect("append");
        assert!(
            store
                .try_get_log_entries(6..6)
                .await
                .expect("empty")
                .is_empty()
        );
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = 7..6;
        assert!(
            store
                .try_get_log_entries(inverted)
                .await
                .expect("inverted")
                .is_empty()
        );
        assert_eq!(
            store.try_get_log_entries(6..=6).await.expect("one").len(),
            1
        );
    }

    #[tokio::test]
    async fn second_open_of_the_same_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LOG_FILE_NAME);
        let _first = RedbLogStore::open(&path).expect("open");
        match RedbLogStore::open(&path) {
            Err(LogStoreError::AlreadyOpen { path: p }) => assert_eq!(p, path),
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("a second open of a locked log succeeded"),
        }
    }

    #[tokio::test]
    async fn a_newer_format_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LOG_FILE_NAME);

        // Stamp the file as if a future build wrote it.
        {
            let store = RedbLogStore::open(&path).expect("open");
            commit_durably(&store.db, |tx| {
                tx.open_table(META)?
                    .insert(KEY_FORMAT, [FORMAT_VERSION + 1].as_slice())?;
                Ok(())
            })
            .expect("stamp");
        }

        match RedbLogStore::open(&path) {
            Err(LogStoreError::UnsupportedFormat { found, .. }) => {
                assert_eq!(found, FORMAT_VERSION + 1)
            }
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("a newer format was accepted"),
        }
    }
}
