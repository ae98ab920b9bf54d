//! The requests agents (and servers) send to servers over the transport's client protocol
//! (`vigil_wire::tls::ALPN_RPC`), and their answers; raft's own messages have their own enum and
//! protocol (the server's `raft::network`). Both enums are append-only (postcard encodes the
//! variant index); each request names its reply (see [`Call`]). Sending one over QUIC is the
//! server crate's (`vigil_server::dial`).

use serde::{Deserialize, Serialize};

use super::{AclOp, Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError};
use crate::lock::LockOp;
use crate::operator::{OperatorError, OperatorReply, OperatorRequest};
use crate::session::Session;

/// A request that names its answer: `Self::Reply` is what the [`RpcResponse`] variant that
/// answers it carries. The server builds the answer with [`Call::answer`] and a caller takes it
/// out with [`reply`], so the compiler pairs every request with its answer.
pub trait Call: Into<RpcRequest> {
    type Reply;
    fn answer(reply: Self::Reply) -> RpcResponse;
    /// The reply out of its response, or the response back when it answers something else.
    fn reply(response: RpcResponse) -> Result<Self::Reply, RpcResponse>;
}

/// Declares every request once: the wire enum [`RpcRequest`] (a struct variant each, in wire
/// order: append only) and, beside it, a struct per request implementing [`Call`]. It has the
/// shape of `reads!` in [`super`] but stays apart: `reads!` puts its structs in a module of their
/// own beside the enum and its trait names the answer `Output`, so one macro for both would
/// need a switch for each difference.
macro_rules! calls {
    ($(
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $ty:ty),* $(,)? } => $answer:ident($out:ty);
    )*) => {
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub enum RpcRequest {
            $($(#[$doc])* $name { $($field: $ty),* },)*
        }

        $(
            $(#[$doc])*
            #[derive(Debug, Clone)]
            pub struct $name { $(pub $field: $ty),* }

            impl From<$name> for RpcRequest {
                fn from(call: $name) -> RpcRequest {
                    let $name { $($field),* } = call;
                    RpcRequest::$name { $($field),* }
                }
            }

            impl Call for $name {
                type Reply = $out;

                fn answer(reply: $out) -> RpcResponse {
                    RpcResponse::$answer(reply)
                }

                fn reply(response: RpcResponse) -> Result<$out, RpcResponse> {
                    match response {
                        RpcResponse::$answer(reply) => Ok(reply),
                        other => Err(other),
                    }
                }
            }
        )*
    };
}

calls! {
    /// 0: who are you? (cluster formation)
    Hello {} => Hello(HelloInfo);
    /// 1: commit a state change; `forwarded` stops a second hop.
    Write { op: Op, forwarded: bool } => Write(Result<Response, ServerError>);
    /// 2: a read, possibly blocking.
    Query {
        opts: QueryOptions,
        query: ReadQuery,
        forwarded: bool,
    } => Query(Result<(QueryResult, QueryMeta), ServerError>);
    /// 3: renew a session's TTL (leader only).
    Renew { id: String, forwarded: bool } => Renew(Result<Session, ServerError>);
    /// 4: add this server to an existing cluster as a voter (servers only).
    Join {
        node_id: u64,
        node: ServerNode,
        forwarded: bool,
    } => Join(Result<(), ServerError>);
    /// 5: leader, peers and raft figures.
    Status {} => Status(StatusInfo);
    /// 6: operate the server set (`/v1/operator/*`); `forwarded` stops a second hop.
    Operator {
        request: OperatorRequest,
        forwarded: bool,
    } => Operator(Result<OperatorReply, OperatorError>);
    /// 7: [`Write`] on behalf of the holder of `token` (an ACL secret; empty: the anonymous
    /// token), which the server authorizes against its own ACL tables. What agents send.
    WriteAs { op: Op, token: String } => Write(Result<Response, ServerError>);
    /// 8: [`Query`] on behalf of the holder of `token`; the answer is cut down to what the
    /// token may read.
    QueryAs {
        opts: QueryOptions,
        query: ReadQuery,
        token: String,
    } => Query(Result<(QueryResult, QueryMeta), ServerError>);
    /// 9: [`Renew`] on behalf of the holder of `token`.
    RenewAs { id: String, token: String } => Renew(Result<Session, ServerError>);
    /// 10: [`Operator`] on behalf of the holder of `token`.
    OperatorAs {
        request: OperatorRequest,
        token: String,
    } => Operator(Result<OperatorReply, OperatorError>);
}

/// Which certificates may send a request at all (what the token it carries may do is the
/// server's second question).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Senders {
    /// Servers only: raft membership, forwarding between servers, leader-internal writes.
    Servers,
    /// Servers and client agents.
    Agents,
}

impl RpcRequest {
    /// Who may send this request: decided here for every request and every op, with no
    /// wildcard arm, so a new request or op does not compile until someone decides. A
    /// certificate for the HTTPS API and the CLI may send none (the server refuses it before
    /// asking).
    pub fn senders(&self) -> Senders {
        match self {
            RpcRequest::Hello {} | RpcRequest::Status {} => Senders::Agents,
            RpcRequest::Join { .. }
            | RpcRequest::Write {
                forwarded: true, ..
            }
            | RpcRequest::Query {
                forwarded: true, ..
            }
            | RpcRequest::Renew {
                forwarded: true, ..
            }
            | RpcRequest::Operator {
                forwarded: true, ..
            } => Senders::Servers,
            RpcRequest::Write {
                op,
                forwarded: false,
            }
            | RpcRequest::WriteAs { op, .. } => op_senders(op),
            RpcRequest::Query {
                forwarded: false, ..
            }
            | RpcRequest::QueryAs { .. }
            | RpcRequest::Renew {
                forwarded: false, ..
            }
            | RpcRequest::RenewAs { .. }
            | RpcRequest::Operator {
                forwarded: false, ..
            }
            | RpcRequest::OperatorAs { .. } => Senders::Agents,
        }
    }

    /// The token the request is made with: its own for the `*As` requests, none (the
    /// anonymous token, for a client agent) for the others.
    pub fn token(&self) -> Option<&str> {
        match self {
            RpcRequest::WriteAs { token, .. }
            | RpcRequest::QueryAs { token, .. }
            | RpcRequest::RenewAs { token, .. }
            | RpcRequest::OperatorAs { token, .. } => Some(token),
            RpcRequest::Hello {}
            | RpcRequest::Write { .. }
            | RpcRequest::Query { .. }
            | RpcRequest::Renew { .. }
            | RpcRequest::Join { .. }
            | RpcRequest::Status {}
            | RpcRequest::Operator { .. } => None,
        }
    }
}

/// Who may propose `op`: the leader's own bookkeeping and whole-state replacements (a restore
/// goes through the operator path, which checks the archive) are for servers only.
fn op_senders(op: &Op) -> Senders {
    match op {
        Op::Kv(_)
        | Op::CreateSession(_)
        | Op::DestroySession { .. }
        | Op::RegisterNode { .. }
        | Op::RegisterCheck(_)
        | Op::DeregisterCheck { .. }
        | Op::DeregisterNode { .. }
        | Op::CatalogRegister(_)
        | Op::CatalogRegisterFull(_)
        | Op::DeregisterService { .. }
        | Op::SetQuery { .. }
        | Op::SetQueryFull { .. }
        | Op::DeleteQuery { .. }
        | Op::Lock(
            LockOp::Acquire { .. }
            | LockOp::Release { .. }
            | LockOp::Enqueue { .. }
            | LockOp::Leave { .. },
        )
        | Op::Acl(
            AclOp::Bootstrap(_)
            | AclOp::SetToken { .. }
            | AclOp::DeleteToken { .. }
            | AclOp::SetPolicy { .. }
            | AclOp::DeletePolicy { .. }
            | AclOp::SetRole { .. }
            | AclOp::DeleteRole { .. },
        )
        | Op::Txn(_) => Senders::Agents,
        Op::ReapTombstones { .. }
        | Op::CheckpointTtls { .. }
        | Op::Lock(LockOp::Wake { .. })
        | Op::Batch(_)
        | Op::RestoreSnapshot { .. }
        | Op::RestoreChunk { .. }
        | Op::SetAutopilotConfig { .. }
        | Op::Acl(AclOp::Init { .. })
        | Op::SetProtocol { .. }
        | Op::ExpireSession { .. } => Senders::Servers,
    }
}

/// What answers an [`RpcRequest`]. [`RpcResponse::Refused`] may answer any of them.
#[derive(Debug, Serialize, Deserialize)]
pub enum RpcResponse {
    /// 0
    Hello(HelloInfo),
    /// 1
    Write(Result<Response, ServerError>),
    /// 2
    Query(Result<(QueryResult, QueryMeta), ServerError>),
    /// 3
    Renew(Result<Session, ServerError>),
    /// 4
    Join(Result<(), ServerError>),
    /// 5
    Status(StatusInfo),
    /// 6
    Operator(Result<OperatorReply, OperatorError>),
    /// 7: the request is not allowed from this peer (e.g. a join from a client certificate),
    /// or did not decode.
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
    pub node_id: u64,
    pub node: ServerNode,
    /// Whether this server already belongs to a raft cluster.
    pub initialized: bool,
    /// The leader's RPC address, if known.
    pub leader: Option<String>,
}

/// One raft member as `/v1/operator/raft/configuration` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub node_id: u64,
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

/// The reply to a `C` out of its response. A refusal is the server's word on why (a request
/// this peer may not make; one its token may not make is [`ServerError::PermissionDenied`]);
/// an answer of another kind is a protocol bug. Neither is retried.
pub fn reply<C: Call>(response: RpcResponse) -> Result<C::Reply, ServerError> {
    C::reply(response).map_err(|other| match other {
        RpcResponse::Refused(why) if why.starts_with("Permission denied") => {
            ServerError::PermissionDenied(why)
        }
        RpcResponse::Refused(why) => ServerError::Internal(format!("refused: {why}")),
        other => ServerError::Internal(format!("an answer of the wrong kind: {other:?}")),
    })
}
