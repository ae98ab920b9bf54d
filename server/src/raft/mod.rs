//! Raft plumbing: openraft's types instantiated once for Vigil, the log store (raft-log's
//! write-ahead log, in the data directory for server sets and in a temporary one for `--dev`),
//! the state-machine store that applies committed commands and keeps snapshots, and the network
//! used between servers.

pub mod log_store;
pub mod network;
pub mod state_store;

#[cfg(test)]
mod tests;

use std::io::Cursor;

use vigil_shared::rpc::{Command, Response};

openraft::declare_raft_types!(
    /// Vigil's raft type configuration.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = crate::rpc::ServerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Most bytes of log entries one AppendEntries carries (at least one entry is always sent).
/// openraft cuts an AppendEntries off after one heartbeat interval (100-150 ms), so a batch
/// must be small enough to cross the network and be fsynced by a follower within it; a larger
/// backlog goes out as a series of bounded batches instead of one that never arrives.
pub const MAX_APPEND_BYTES: usize = 1024 * 1024;

pub type NodeId = u64;
pub type Node = crate::rpc::ServerNode;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
