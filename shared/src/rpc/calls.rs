//! The requests agents (and servers) send to servers over the transport's client protocol
//! (`vigil_wire::tls::ALPN_RPC`), and their answers; raft's own messages have their own enum and
//! protocol (the server's `raft::network`). Both enums are append-only (postcard encodes the
//! variant index); each request names its answer (see [`Call`]). A request a server forwards to
//! the leader travels in the one envelope [`RpcRequest::Forwarded`]. Sending one over QUIC is the
//! server crate's (`vigil_server::dial`).

use serde::{Deserialize, Serialize};

use super::{Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Request, Response, ServerError};
use crate::operator::{OperatorError, OperatorReply, OperatorRequest};
use crate::session::Session;

/// A request that names its answer (the [`Request`] convention): the [`RpcResponse`] variant
/// that answers it carries `Self::Output`. The server builds the answer with [`Call::answer`]
/// and a caller takes it out with [`reply`], so the compiler pairs every request with its
/// answer.
pub trait Call: Request<Answer = RpcResponse> + Into<RpcRequest> {
    fn answer(output: Self::Output) -> RpcResponse;
}

/// Declares every request once: the in-process enum [`RpcRequest`] (a struct variant each, and
/// [`RpcRequest::Forwarded`]) and, beside it, a struct per request implementing [`Call`], as
/// `reads!` in [`super`] declares the reads. What travels on the wire is [`wire`]'s.
macro_rules! calls {
    ($(
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $ty:ty),* $(,)? } => $answer:ident($out:ty);
    )*) => {
        #[derive(Debug, Clone)]
        pub enum RpcRequest {
            $($(#[$doc])* $name { $($field: $ty),* },)*
            /// A request a server forwarded to the leader on behalf of its caller (who was
            /// authorized there): served by a leader, or refused, never forwarded again.
            Forwarded(Forwarded),
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

            impl Request for $name {
                type Answer = RpcResponse;
                type Output = $out;

                fn output(response: RpcResponse) -> Result<$out, RpcResponse> {
                    match response {
                        RpcResponse::$answer(output) => Ok(output),
                        other => Err(other),
                    }
                }
            }

            impl Call for $name {
                fn answer(output: $out) -> RpcResponse {
                    RpcResponse::$answer(output)
                }
            }
        )*
    };
}

calls! {
    /// Who are you? (cluster formation)
    Hello {} => Hello(HelloInfo);
    /// Commit a state change (the anonymous token's, from a client agent).
    Write { op: Op } => Write(Result<Response, ServerError>);
    /// A read, possibly blocking.
    Query { opts: QueryOptions, query: ReadQuery } => Query(Result<(QueryResult, QueryMeta), ServerError>);
    /// Renew a session's TTL (leader only).
    Renew { id: String } => Renew(Result<Session, ServerError>);
    /// Add this server to an existing cluster as a voter (servers only).
    Join { node_id: u64, node: ServerNode } => Join(Result<(), ServerError>);
    /// Leader, peers and raft figures.
    Status {} => Status(StatusInfo);
    /// Operate the server set (`/v1/operator/*`).
    Operator { request: OperatorRequest } => Operator(Result<OperatorReply, OperatorError>);
    /// [`Write`] on behalf of the holder of `token` (an ACL secret; empty: the anonymous
    /// token), which the server authorizes against its own ACL tables. What agents send.
    WriteAs { op: Op, token: String } => Write(Result<Response, ServerError>);
    /// [`Query`] on behalf of the holder of `token`; the answer is cut down to what the
    /// token may read.
    QueryAs {
        opts: QueryOptions,
        query: ReadQuery,
        token: String,
    } => Query(Result<(QueryResult, QueryMeta), ServerError>);
    /// [`Renew`] on behalf of the holder of `token`.
    RenewAs { id: String, token: String } => Renew(Result<Session, ServerError>);
    /// [`Operator`] on behalf of the holder of `token`.
    OperatorAs {
        request: OperatorRequest,
        token: String,
    } => Operator(Result<OperatorReply, OperatorError>);
}

/// The requests that run at the leader, as a server forwards them there
/// ([`RpcRequest::Forwarded`]): the token's checks were made by the server that forwarded it.
#[derive(Debug, Clone)]
pub enum Forwarded {
    /// Boxed: a change is several times the size of the others.
    Write(Box<Write>),
    Query(Query),
    Renew(Renew),
    Join(Join),
    Operator(Operator),
}

macro_rules! forwarded {
    ($($name:ident),*) => {$(
        impl From<$name> for Forwarded {
            fn from(call: $name) -> Forwarded {
                Forwarded::$name(call)
            }
        }
    )*};
}

forwarded!(Query, Renew, Join, Operator);

impl From<Write> for Forwarded {
    fn from(call: Write) -> Forwarded {
        Forwarded::Write(Box::new(call))
    }
}

impl RpcRequest {
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
            | RpcRequest::Operator { .. }
            | RpcRequest::Forwarded(_) => None,
        }
    }
}

/// [`RpcRequest`] as the wire carries it: the first release's enum, appended to since (postcard
/// encodes the variant index: append only). A forwarded request is its own variant with
/// `forwarded: true`, so a server of the first release, while the cluster still runs protocol
/// level 1, understands what a server of this release forwards to it.
mod wire {
    use super::*;

    /// Encoding: borrows the request.
    #[derive(Serialize)]
    pub(super) enum Out<'a> {
        /// 0
        Hello {},
        /// 1
        Write { op: &'a Op, forwarded: bool },
        /// 2
        Query {
            opts: &'a QueryOptions,
            query: &'a ReadQuery,
            forwarded: bool,
        },
        /// 3
        Renew { id: &'a str, forwarded: bool },
        /// 4
        Join {
            node_id: u64,
            node: &'a ServerNode,
            forwarded: bool,
        },
        /// 5
        Status {},
        /// 6
        Operator {
            request: &'a OperatorRequest,
            forwarded: bool,
        },
        /// 7
        WriteAs { op: &'a Op, token: &'a str },
        /// 8
        QueryAs {
            opts: &'a QueryOptions,
            query: &'a ReadQuery,
            token: &'a str,
        },
        /// 9
        RenewAs { id: &'a str, token: &'a str },
        /// 10
        OperatorAs {
            request: &'a OperatorRequest,
            token: &'a str,
        },
    }

    /// Decoding: the same variants, owned.
    #[derive(Deserialize)]
    pub(super) enum In {
        Hello {},
        Write {
            op: Op,
            forwarded: bool,
        },
        Query {
            opts: QueryOptions,
            query: ReadQuery,
            forwarded: bool,
        },
        Renew {
            id: String,
            forwarded: bool,
        },
        Join {
            node_id: u64,
            node: ServerNode,
            forwarded: bool,
        },
        Status {},
        Operator {
            request: OperatorRequest,
            forwarded: bool,
        },
        WriteAs {
            op: Op,
            token: String,
        },
        QueryAs {
            opts: QueryOptions,
            query: ReadQuery,
            token: String,
        },
        RenewAs {
            id: String,
            token: String,
        },
        OperatorAs {
            request: OperatorRequest,
            token: String,
        },
    }

    impl<'a> From<&'a RpcRequest> for Out<'a> {
        fn from(request: &'a RpcRequest) -> Out<'a> {
            let forwarded = matches!(request, RpcRequest::Forwarded(_));
            match request {
                RpcRequest::Hello {} => Out::Hello {},
                RpcRequest::Status {} => Out::Status {},
                RpcRequest::Write { op } => Out::Write { op, forwarded },
                RpcRequest::Forwarded(Forwarded::Write(write)) => Out::Write {
                    op: &write.op,
                    forwarded,
                },
                RpcRequest::Query { opts, query }
                | RpcRequest::Forwarded(Forwarded::Query(Query { opts, query })) => Out::Query {
                    opts,
                    query,
                    forwarded,
                },
                RpcRequest::Renew { id }
                | RpcRequest::Forwarded(Forwarded::Renew(Renew { id })) => {
                    Out::Renew { id, forwarded }
                }
                RpcRequest::Join { node_id, node }
                | RpcRequest::Forwarded(Forwarded::Join(Join { node_id, node })) => Out::Join {
                    node_id: *node_id,
                    node,
                    forwarded,
                },
                RpcRequest::Operator { request }
                | RpcRequest::Forwarded(Forwarded::Operator(Operator { request })) => {
                    Out::Operator { request, forwarded }
                }
                RpcRequest::WriteAs { op, token } => Out::WriteAs { op, token },
                RpcRequest::QueryAs { opts, query, token } => Out::QueryAs { opts, query, token },
                RpcRequest::RenewAs { id, token } => Out::RenewAs { id, token },
                RpcRequest::OperatorAs { request, token } => Out::OperatorAs { request, token },
            }
        }
    }

    /// `call` as it came: from its caller, or forwarded by a server.
    fn hop(call: impl Into<Forwarded> + Into<RpcRequest>, forwarded: bool) -> RpcRequest {
        if forwarded {
            RpcRequest::Forwarded(call.into())
        } else {
            call.into()
        }
    }

    impl From<In> for RpcRequest {
        fn from(request: In) -> RpcRequest {
            match request {
                In::Hello {} => RpcRequest::Hello {},
                In::Status {} => RpcRequest::Status {},
                In::Write { op, forwarded } => hop(Write { op }, forwarded),
                In::Query {
                    opts,
                    query,
                    forwarded,
                } => hop(Query { opts, query }, forwarded),
                In::Renew { id, forwarded } => hop(Renew { id }, forwarded),
                In::Join {
                    node_id,
                    node,
                    forwarded,
                } => hop(Join { node_id, node }, forwarded),
                In::Operator { request, forwarded } => hop(Operator { request }, forwarded),
                In::WriteAs { op, token } => RpcRequest::WriteAs { op, token },
                In::QueryAs { opts, query, token } => RpcRequest::QueryAs { opts, query, token },
                In::RenewAs { id, token } => RpcRequest::RenewAs { id, token },
                In::OperatorAs { request, token } => RpcRequest::OperatorAs { request, token },
            }
        }
    }
}

impl Serialize for RpcRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        wire::Out::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RpcRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<RpcRequest, D::Error> {
        wire::In::deserialize(deserializer).map(RpcRequest::from)
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
pub fn reply<C: Call>(response: RpcResponse) -> Result<C::Output, ServerError> {
    C::output(response).map_err(|other| match other {
        RpcResponse::Refused(why) if why.starts_with("Permission denied") => {
            ServerError::PermissionDenied(why)
        }
        RpcResponse::Refused(why) => ServerError::Internal(format!("refused: {why}")),
        other => ServerError::Internal(format!("an answer of the wrong kind: {other:?}")),
    })
}
