//! The requests that operate the server set (Consul's `/v1/operator/*` and `/v1/snapshot`) and
//! their answers, as agents send them to servers inside `RpcRequest::Operator`. Running them is
//! the server's (`vigil_server::operator`, `vigil_server::snapshot`). The enums are append-only
//! (postcard encodes the variant index).

use serde::{Deserialize, Serialize};

use crate::autopilot::AutopilotConfig;
use crate::rpc::ServerError;

/// A raft member named by its ID (16 hex digits, as `/v1/operator/raft/configuration` shows it)
/// or by its RPC address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRef {
    Id(u64),
    Address(String),
}

/// A request to operate the server set. Append-only (postcard encodes the variant index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorRequest {
    /// 0: `DELETE /v1/operator/raft/peer`.
    RemovePeer(PeerRef),
    /// 1: `POST /v1/operator/raft/transfer-leader`; `None` picks the most caught-up voter.
    TransferLeader { to: Option<u64> },
    /// 2: `GET /v1/operator/autopilot/health`.
    AutopilotHealth,
    /// 3: `GET /v1/snapshot`: the leader's whole state as an archive.
    SnapshotSave,
    /// 4: `PUT /v1/snapshot`: replace the state with an archive's, through raft.
    SnapshotRestore(#[serde(with = "serde_bytes")] Vec<u8>),
    /// 5: `GET /v1/operator/autopilot/configuration`.
    AutopilotGet,
    /// 6: `PUT /v1/operator/autopilot/configuration` (`?cas=`).
    AutopilotSet {
        config: AutopilotConfig,
        cas: Option<u64>,
    },
}

/// What an operator request produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OperatorReply {
    /// 0
    Done,
    /// 1
    Health(AutopilotHealth),
    /// 2: a snapshot archive taken at raft `index`.
    Snapshot {
        index: u64,
        #[serde(with = "serde_bytes")]
        archive: Vec<u8>,
    },
    /// 3
    Autopilot(AutopilotConfig),
    /// 4: whether a check-and-set write was applied.
    Applied(bool),
}

/// Why an operator request was refused. The texts are Consul's where it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum OperatorError {
    #[error("id {0:?} was not found in the Raft configuration")]
    UnknownId(String),
    #[error("address {0:?} was not found in the Raft configuration")]
    UnknownAddress(String),
    /// Removing the leader itself: transfer leadership first.
    #[error("cannot remove the leader {0:?}; transfer leadership to another server first")]
    RemoveLeader(String),
    /// The removal would leave too few reachable voters to commit anything.
    #[error(
        "removing {peer:?} would lose quorum: {alive} of the remaining {voters} voters are alive"
    )]
    WouldLoseQuorum {
        peer: String,
        alive: usize,
        voters: usize,
    },
    #[error("cannot find peer")]
    NoOtherVoters,
    #[error("cannot transfer leadership to itself")]
    TransferToSelf,
    #[error("leadership transfer timeout")]
    TransferTimeout,
    #[error("{0}")]
    Archive(#[from] ArchiveError),
    #[error("{0}")]
    Server(#[from] ServerError),
}

/// Consul's `/v1/operator/autopilot/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutopilotHealth {
    pub healthy: bool,
    /// Voters that may fail while a quorum of healthy ones remains.
    pub failure_tolerance: usize,
    pub servers: Vec<ServerHealth>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerHealth {
    /// The server's raft node ID.
    pub id: u64,
    pub name: String,
    pub address: String,
    /// `alive`, `failed`, `left` or `none` (gossip does not know it).
    pub serf_status: String,
    pub leader: bool,
    pub voter: bool,
    /// The last log index the leader knows this server holds.
    pub last_index: u64,
    pub last_term: u64,
    pub healthy: bool,
}

/// Why an archive was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ArchiveError {
    #[error("snapshot archive is not gzip data or is truncated: {0}")]
    Gzip(String),
    #[error("not a Vigil snapshot archive")]
    NotAnArchive,
    #[error("snapshot archive is truncated ({got} of {expected} bytes)")]
    Truncated { got: usize, expected: usize },
    #[error("snapshot archive fails its checksum: it was changed or damaged")]
    Checksum,
    /// An archive version or state encoding this build does not read (`reads_*`: what it
    /// reads).
    #[error(
        "snapshot archive has version {archive}/{state}; this build reads {reads_archive}/{reads_state}"
    )]
    Version {
        archive: u8,
        state: u8,
        reads_archive: u8,
        reads_state: u8,
    },
    #[error("snapshot state does not decode: {0}")]
    Decode(String),
    #[error("snapshot state is {size} bytes; a restore takes at most {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// Another restore began while this one's parts were being committed.
    #[error("the restore was interrupted by another one; run it again")]
    Interrupted,
}
