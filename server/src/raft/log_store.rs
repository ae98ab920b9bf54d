//! An in-memory raft log for `--dev` (a single server whose state dies with the process).
//! The durable redb log used by real server sets implements the same traits.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{RaftLogReader, Vote};

use super::{LogId, NodeId, StorageError, TypeConfig};

type Entry = openraft::Entry<TypeConfig>;

#[derive(Default)]
struct MemLog {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
}

/// Cloning shares the same log (the reader handed to openraft is a clone).
#[derive(Clone, Default)]
pub struct MemLogStore {
    inner: Arc<Mutex<MemLog>>,
}

impl MemLogStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemLog> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let log = self.lock();
        let last = log.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: log.last_purged,
            last_log_id: last.or(log.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.lock().committed)
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
        {
            let mut log = self.lock();
            for e in entries {
                log.entries.insert(e.log_id.index, e);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.lock().entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut log = self.lock();
        log.entries = log.entries.split_off(&(log_id.index + 1));
        log.last_purged = Some(log_id);
        Ok(())
    }
}
