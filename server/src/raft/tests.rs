//! openraft's storage conformance suite run against the durable stores: [`RedbLogStore`] and a
//! [`StateStore`] with a snapshot directory, each build in its own temporary directory.

use openraft::testing::{StoreBuilder, Suite};

use super::redb_log::{LOG_FILE_NAME, RedbLogStore};
use super::state_store::{SharedState, StateStore};
use super::{StorageError, TypeConfig};

struct DurableStores;

impl StoreBuilder<TypeConfig, RedbLogStore, StateStore, tempfile::TempDir> for DurableStores {
    async fn build(&self) -> Result<(tempfile::TempDir, RedbLogStore, StateStore), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = RedbLogStore::open(dir.path().join(LOG_FILE_NAME)).expect("open log");
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let state =
            StateStore::open(SharedState::new(events), dir.path().join("snapshots")).expect("open");
        Ok((dir, log, state))
    }
}

#[test]
fn durable_stores_pass_the_openraft_suite() -> Result<(), StorageError> {
    // The suite builds its own tokio runtime per case, so this is a plain test.
    Suite::test_all(DurableStores)
}
