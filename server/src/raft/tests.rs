//! openraft's storage conformance suite run against the stores a server uses: the
//! [`LogStore`] in a data directory (server sets) and in a temporary one (`--dev`), each with a
//! [`StateStore`] keeping snapshots in its own temporary directory.

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

use super::TypeConfig;
use super::log_store::LogStore;
use super::state_store::{SharedState, StateStore};

/// Where the log lives.
enum Log {
    DataDir,
    Temporary,
}

impl StoreBuilder<TypeConfig, LogStore, StateStore, tempfile::TempDir> for Log {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = match self {
            Log::DataDir => LogStore::open(dir.path()),
            Log::Temporary => LogStore::temporary(),
        }
        .expect("open log");
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let state =
            StateStore::open(SharedState::new(events), dir.path().join("snapshots")).expect("open");
        Ok((dir, log, state))
    }
}

#[tokio::test]
async fn the_data_dir_log_passes_the_openraft_suite() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Log::DataDir).await
}

#[tokio::test]
async fn the_temporary_log_passes_the_openraft_suite() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Log::Temporary).await
}
