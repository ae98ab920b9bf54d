//! The server RPC protocol carried by the QUIC transport: raft's own messages between servers,
//! and the requests agents (and followers) send to servers. Both enums are append-only
//! (postcard encodes the variant index); each request names its response variant.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use vigil_shared::rpc::{
    Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::Session;

use crate::raft::{NodeId, TypeConfig};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RpcRequest {
    /// 0: who are you? (cluster formation)
    Hello,
    /// 1: raft, server to server only.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// 2: raft, server to server only.
    Vote(VoteRequest<NodeId>),
    /// 3: raft, server to server only.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// 4: commit a state change; `forwarded` stops a second hop.
    Write { op: Op, forwarded: bool },
    /// 5: a read, possibly blocking.
    Query {
        opts: QueryOptions,
        query: ReadQuery,
        forwarded: bool,
    },
    /// 6: renew a session's TTL (leader only).
    Renew { id: String, forwarded: bool },
    /// 7: add this server to an existing cluster as a voter.
    Join {
        node_id: NodeId,
        node: ServerNode,
        forwarded: bool,
    },
    /// 8: leader, peers and raft figures.
    Status,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum RpcResponse {
    /// 0
    Hello(HelloInfo),
    /// 1
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// 2
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// 3
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// 4
    Write(Result<Response, ServerError>),
    /// 5
    Query(Result<(QueryResult, QueryMeta), ServerError>),
    /// 6
    Renew(Result<Session, ServerError>),
    /// 7
    Join(Result<(), ServerError>),
    /// 8
    Status(StatusInfo),
    /// 9: the request is not allowed from this peer (e.g. raft from a client certificate).
    Refused(String),
}

/// A raft member: what other servers and agents need to reach it and name it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNode {
    pub name: String,
    pub rpc_addr: String,
}

impl std::fmt::Display for ServerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.rpc_addr)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloInfo {
    pub node_id: NodeId,
    pub node: ServerNode,
    /// Whether this server already belongs to a raft cluster.
    pub initialized: bool,
    /// The leader's RPC address, if known.
    pub leader: Option<String>,
}

/// One raft member as `/v1/operator/raft/configuration` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub node_id: NodeId,
    pub node: ServerNode,
    pub leader: bool,
    pub voter: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusInfo {
    pub leader: Option<String>,
    pub peers: Vec<PeerInfo>,
    /// Raft index of the membership configuration.
    pub config_index: u64,
}

/// A response of the wrong variant for its request: a protocol bug, reported rather than hidden.
pub fn unexpected(response: RpcResponse) -> ServerError {
    ServerError::Raft(format!("unexpected RPC answer: {response:?}"))
}
