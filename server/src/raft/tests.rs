//! openraft's storage conformance suite run against the stores a server uses: the
//! [`RedbLogStore`] on a file (server sets) and in memory (`--dev`), each with a [`StateStore`]
//! keeping snapshots in its own temporary directory.

use openraft::testing::{StoreBuilder, Suite};

use super::redb_log::{LOG_FILE_NAME, RedbLogStore};
use super::state_store::{SharedState, StateStore};
use super::{StorageError, TypeConfig};

/// Where the log lives.
enum Log {
    File,
    Memory,
}

impl StoreBuilder<TypeConfig, RedbLogStore, StateStore, tempfile::TempDir> for Log {
    async fn build(&self) -> Result<(tempfile::TempDir, RedbLogStore, StateStore), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = match self {
            Log::File => RedbLogStore::open(dir.path().join(LOG_FILE_NAME)),
            Log::Memory => RedbLogStore::in_memory(),
        }
        .expect("open log");
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let state =
            StateStore::open(SharedState::new(events), dir.path().join("snapshots")).expect("open");
        Ok((dir, log, state))
    }
}

#[test]
fn the_file_log_passes_the_openraft_suite() -> Result<(), StorageError> {
    // The suite builds its own tokio runtime per case, so this is a plain test.
    Suite::test_all(Log::File)
}

#[test]
fn the_in_memory_log_passes_the_openraft_suite() -> Result<(), StorageError> {
    Suite::test_all(Log::Memory)
}
