//! The RPC endpoint's two protocols: client requests (who may ask what, in [`authorize`], and
//! the answer to each) and raft's messages between servers.

use futures::StreamExt as _;
use futures::future::BoxFuture;
use openraft::raft::AppendEntriesRequest;
use openraft_legacy::network_v1::ChunkedSnapshotReceiver as _;

use vigil_shared::acl::authz::Authorizer;
use vigil_shared::operator::OperatorRequest;
use vigil_shared::rpc::calls::Forwarded;

use super::authorize;
use super::forward::Hop;
use super::*;
use crate::raft::TypeConfig;
use crate::raft::network::{PeerRequest, PeerResponse, StreamAppendReply};

impl Server {
    pub(super) async fn handle(&self, peer: &PeerIdentity, request: RpcRequest) -> RpcResponse {
        if let Err(why) = authorize::check_sender(peer, &request) {
            return RpcResponse::Refused(why);
        }
        if let Some(why) = join_refusal(peer, &request) {
            return RpcResponse::Refused(why);
        }
        let authz = match self.caller(peer, &request) {
            Ok(authz) => authz,
            Err(why) => return RpcResponse::Refused(why),
        };
        let token = request.token().unwrap_or_default().to_owned();
        match request {
            RpcRequest::Hello {} => calls::Hello::answer(HelloInfo {
                node_id: self.node_id,
                node: self.self_node(),
                initialized: self.is_initialized(),
                leader: self.leader_addr(),
            }),
            RpcRequest::Status {} => calls::Status::answer(self.status()),
            RpcRequest::Write { op } | RpcRequest::WriteAs { op, .. } => {
                self.answer_write(authz, op, Hop::Caller).await
            }
            RpcRequest::Query { opts, query } | RpcRequest::QueryAs { opts, query, .. } => {
                self.answer_query(authz, &token, opts, query, Hop::Caller)
                    .await
            }
            RpcRequest::Renew { id } | RpcRequest::RenewAs { id, .. } => {
                self.answer_renew(authz, id, Hop::Caller).await
            }
            RpcRequest::Join { node_id, node } => {
                calls::Join::answer(self.join(node_id, node, Hop::Caller).await)
            }
            RpcRequest::Operator { request } | RpcRequest::OperatorAs { request, .. } => {
                self.answer_operator(authz, request, Hop::Caller).await
            }
            RpcRequest::Forwarded(forwarded) => match forwarded {
                Forwarded::Write(write) => self.answer_write(authz, write.op, Hop::Forwarded).await,
                Forwarded::Query(calls::Query { opts, query }) => {
                    self.answer_query(authz, &token, opts, query, Hop::Forwarded)
                        .await
                }
                Forwarded::Renew(calls::Renew { id }) => {
                    self.answer_renew(authz, id, Hop::Forwarded).await
                }
                Forwarded::Join(calls::Join { node_id, node }) => {
                    calls::Join::answer(self.join(node_id, node, Hop::Forwarded).await)
                }
                Forwarded::Operator(calls::Operator { request }) => {
                    self.answer_operator(authz, request, Hop::Forwarded).await
                }
            },
        }
    }

    /// A write, if the caller's token (`None`: not asked) may make it.
    async fn answer_write(&self, authz: Option<Authorizer>, op: Op, hop: Hop) -> RpcResponse {
        if let Some(authz) = &authz
            && let Err(why) = self.authorize_write(authz, &op)
        {
            return RpcResponse::Refused(why);
        }
        calls::Write::answer(self.write_from(op, hop).await)
    }

    /// A read, if the caller's token may make it, cut down to what the token may read.
    async fn answer_query(
        &self,
        authz: Option<Authorizer>,
        token: &str,
        opts: QueryOptions,
        query: ReadQuery,
        hop: Hop,
    ) -> RpcResponse {
        if let Some(authz) = &authz
            && let Err(why) = authorize::read_permission(authz, token, &query)
        {
            return RpcResponse::Refused(why);
        }
        // A read whose every result the token would lose to the filter is answered at once:
        // it takes no blocking-query slot.
        let opts = match &authz {
            Some(authz) if authz.sees_nothing(&query) => QueryOptions {
                min_index: 0,
                ..opts
            },
            _ => opts,
        };
        let answer = self.query_from(opts, query, hop).await;
        calls::Query::answer(answer.map(|(result, meta)| match &authz {
            Some(authz) => (authorize::filter(authz, result), meta),
            None => (result, meta),
        }))
    }

    async fn answer_renew(&self, authz: Option<Authorizer>, id: String, hop: Hop) -> RpcResponse {
        if let Some(authz) = &authz
            && let Err(why) = self.authorize_renew(authz, &id)
        {
            return RpcResponse::Refused(why);
        }
        calls::Renew::answer(self.renew_from(id, hop).await)
    }

    async fn answer_operator(
        &self,
        authz: Option<Authorizer>,
        request: OperatorRequest,
        hop: Hop,
    ) -> RpcResponse {
        if let Some(authz) = &authz
            && let Err(why) = authorize::operator_permission(authz, &request)
        {
            return RpcResponse::Refused(why);
        }
        calls::Operator::answer(crate::operator::handle(self, request, hop).await)
    }

    /// Hands a raft message to raft; the transport lets only servers send them.
    async fn handle_peer(&self, request: PeerRequest) -> PeerResponse {
        match request {
            PeerRequest::AppendEntries(request) => {
                *self.last_leader_contact.lock() = Some(Instant::now());
                PeerResponse::AppendEntries(self.raft.append_entries(request).await)
            }
            PeerRequest::Vote(mut request) => {
                // A dead leader's lease protects nobody: let the vote through it.
                if !request.leadership_transfer && self.waive_lease_for().await {
                    request.leadership_transfer = true;
                }
                PeerResponse::Vote(self.raft.vote(request).await)
            }
            PeerRequest::PreVote(request) => {
                PeerResponse::PreVote(self.raft.pre_vote(request).await)
            }
            PeerRequest::InstallSnapshot(request) => {
                PeerResponse::InstallSnapshot(self.raft.install_snapshot(request).await)
            }
            PeerRequest::Campaign => PeerResponse::Campaign(
                self.raft
                    .trigger()
                    .elect(false)
                    .await
                    .map_err(|e| e.to_string()),
            ),
        }
    }
}

/// The client protocol's view of the server.
pub(super) struct RpcService(pub(super) Arc<Server>);

impl transport::RpcHandler for RpcService {
    fn handle(&self, peer: &PeerIdentity, request: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
        let server = Arc::clone(&self.0);
        let peer = peer.clone();
        Box::pin(async move {
            crate::telemetry::rpc_request();
            let response = match postcard::from_bytes::<RpcRequest>(&request) {
                Ok(request) => server.handle(&peer, request).await,
                Err(e) => RpcResponse::Refused(format!("undecodable request: {e}")),
            };
            encode_response(&response)
        })
    }

    /// A client's blocking calls share one stream, each answered as on a stream of its own.
    fn multiplexes(&self) -> bool {
        true
    }
}

/// The raft protocol's view of the server.
pub(super) struct PeerService(pub(super) Arc<Server>);

impl transport::RpcHandler for PeerService {
    fn handle(&self, _: &PeerIdentity, request: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
        let server = Arc::clone(&self.0);
        Box::pin(async move {
            let response = match postcard::from_bytes::<PeerRequest>(&request) {
                Ok(request) => server.handle_peer(request).await,
                Err(e) => PeerResponse::Undecodable(e.to_string()),
            };
            encode_response(&response)
        })
    }

    /// Replication: every request is an AppendEntries, taken in order by raft, which answers
    /// each once it is in the log (several may share one sync). A request that does not decode
    /// ends the requests: the call ends after the answers to those before it, and the leader
    /// sees it end unanswered.
    fn handle_stream(
        &self,
        _: &PeerIdentity,
        requests: transport::Frames,
    ) -> Option<transport::Frames> {
        let server = Arc::clone(&self.0);
        let contact = Arc::clone(&server);
        let requests = requests.scan((), move |(), frame| {
            let request = match postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(&frame) {
                Ok(request) => {
                    *contact.last_leader_contact.lock() = Some(Instant::now());
                    Some(request)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable AppendEntries; ending the stream");
                    None
                }
            };
            std::future::ready(request)
        });
        let replies = server.raft.stream_append(requests).map(|reply| {
            let reply: StreamAppendReply = reply.map_err(|fatal| fatal.to_string());
            encode_response(&reply)
        });
        Some(replies.boxed())
    }
}

/// The response's bytes; none (which the caller reads as a protocol error) if it does not
/// encode.
fn encode_response(response: &impl serde::Serialize) -> Vec<u8> {
    postcard::to_allocvec(response).unwrap_or_else(|e| {
        tracing::error!(error = %e, "encoding an RPC response");
        Vec::new()
    })
}

/// A server certificate issued for a node may join only as that node (who may send a join at
/// all is [`authorize::check_sender`]'s).
fn join_refusal(peer: &PeerIdentity, request: &RpcRequest) -> Option<String> {
    match (request, &peer.node) {
        (RpcRequest::Join { node, .. }, Some(certified)) if *certified != node.name => {
            Some(format!(
                "the certificate is for server {certified:?}; it cannot join as {:?}",
                node.name
            ))
        }
        _ => None,
    }
}
