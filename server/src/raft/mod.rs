//! Raft plumbing: openraft's types instantiated once for Vigil, the log store (raft-log's
//! write-ahead log, in the data directory for server sets and in a temporary one for `--dev`),
//! the state-machine store that applies committed commands and keeps snapshots, and the network
//! used between servers.

pub mod log_store;
pub mod network;
pub mod runtime;
pub mod state_store;

#[cfg(test)]
mod tests;

use vigil_shared::rpc::calls::ServerNode;
use vigil_shared::rpc::{Command, Response};

/// Vigil's raft type configuration: openraft's defaults (what `declare_raft_types!` would
/// fill in), except the responder, which is the proposer's [`Answer`](crate::proposer::Answer)
/// so that an apply answers a write's callers itself, and the runtime, tokio with random draws
/// a simulation can seed ([`runtime::Runtime`]). The macro cannot name a generic
/// associated type, hence the impl written out.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Command;
    type R = Response;
    type NodeId = u64;
    type Node = ServerNode;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<Self::Term, Self::NodeId>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Self::D, Self::NodeId, Self::Node>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type Responder<T>
        = crate::proposer::Answer<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type AsyncRuntime = runtime::Runtime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// Most bytes of log entries one AppendEntries carries (at least one entry is always sent): the
/// log reader cuts replication's reads there. openraft cuts an AppendEntries off after one
/// heartbeat interval (100-150 ms), so a batch must be small enough to cross the network and be
/// fsynced by a follower within it; a larger backlog goes out as a series of bounded batches
/// instead of one that never arrives.
pub const MAX_APPEND_BYTES: usize = 1024 * 1024;

pub type NodeId = u64;
pub type Node = ServerNode;
pub type Raft = openraft::Raft<TypeConfig, state_store::StateStore>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, Node>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot's bytes, as built, sent in chunks and installed.
pub type SnapshotData = std::io::Cursor<Vec<u8>>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;
