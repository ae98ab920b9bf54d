//! Raft plumbing: openraft's types instantiated once for Vigil, the log store, the state-machine
//! store that applies committed commands, and the network used between servers.

pub mod log_store;
pub mod network;
pub mod state_store;

use std::io::Cursor;

use vigil_shared::rpc::{Command, Response};

openraft::declare_raft_types!(
    /// Vigil's raft type configuration.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
