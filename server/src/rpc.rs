//! The requests agents (and servers) send to servers over the transport's client protocol
//! ([`vigil_wire::tls::ALPN_RPC`]); raft's own messages have their own enum and protocol
//! ([`crate::raft::network`]). Both enums are append-only (postcard encodes the variant index);
//! each request names its reply (see [`Call`]).

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vigil_shared::rpc::{
    Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::Session;
use vigil_wire::transport::{CallKind, RpcClient, TransportError};

use crate::operator::{OperatorError, OperatorReply, OperatorRequest};
use crate::raft::NodeId;

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
/// order: append only) and, in [`calls`], a struct per request implementing [`Call`].
macro_rules! calls {
    ($(
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $ty:ty),* $(,)? } => $answer:ident($out:ty);
    )*) => {
        #[derive(Debug, Clone, Serialize, Deserialize)]
        pub enum RpcRequest {
            $($(#[$doc])* $name { $($field: $ty),* },)*
        }

        /// The requests as types, each naming its reply.
        pub mod calls {
            use super::*;

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
        }
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
        node_id: NodeId,
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

/// The reply to a `C` out of its response. A refusal is the server's word on why (a request
/// this peer may not make); an answer of another kind is a protocol bug. Neither is retried.
pub fn reply<C: Call>(response: RpcResponse) -> Result<C::Reply, ServerError> {
    C::reply(response).map_err(|other| match other {
        RpcResponse::Refused(why) => ServerError::Internal(format!("refused: {why}")),
        other => ServerError::Internal(format!("an answer of the wrong kind: {other:?}")),
    })
}

/// A request built once for as many sends as retries need, that still names its reply.
pub struct Prepared<C> {
    request: RpcRequest,
    call: PhantomData<fn() -> C>,
}

impl<C: Call> Prepared<C> {
    pub fn new(call: C) -> Prepared<C> {
        Prepared {
            request: call.into(),
            call: PhantomData,
        }
    }

    pub fn request(&self) -> &RpcRequest {
        &self.request
    }
}

/// Sends `request` to the server at `addr` and takes its reply out of the answer: the
/// transport's failure, or the server's answer ([`reply`]).
pub async fn send<C: Call>(
    rpc: &RpcClient,
    kind: CallKind,
    addr: SocketAddr,
    request: &Prepared<C>,
    timeout: Duration,
) -> Result<Result<C::Reply, ServerError>, TransportError> {
    let response = rpc
        .call_typed_as::<RpcRequest, RpcResponse>(kind, addr, request.request(), timeout)
        .await?;
    Ok(reply::<C>(response))
}

#[cfg(test)]
#[path = "rpc_fuzz.rs"]
mod fuzz;
