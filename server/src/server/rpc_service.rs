//! The RPC endpoint's two protocols: client requests (who may ask what, [`refusal`], and the
//! answer to each) and raft's messages between servers.

use futures::StreamExt as _;
use futures::future::BoxFuture;
use openraft::raft::AppendEntriesRequest;
use openraft_legacy::network_v1::ChunkedSnapshotReceiver as _;

use super::*;
use crate::raft::TypeConfig;
use crate::raft::network::{PeerRequest, PeerResponse, StreamAppendReply};

impl Server {
    pub(super) async fn handle(&self, peer: &PeerIdentity, request: RpcRequest) -> RpcResponse {
        if let Some(why) = refusal(peer, &request) {
            return RpcResponse::Refused(why);
        }
        match request {
            RpcRequest::Hello {} => calls::Hello::answer(HelloInfo {
                node_id: self.node_id,
                node: self.self_node(),
                initialized: self.is_initialized(),
                leader: self.leader_addr(),
            }),
            RpcRequest::Write { op, forwarded } => {
                calls::Write::answer(self.write_inner(op, forwarded).await)
            }
            RpcRequest::Query {
                opts,
                query,
                forwarded,
            } => calls::Query::answer(self.query_inner(opts, query, forwarded).await),
            RpcRequest::Renew { id, forwarded } => {
                calls::Renew::answer(self.renew_inner(id, forwarded).await)
            }
            RpcRequest::Join {
                node_id,
                node,
                forwarded,
            } => calls::Join::answer(self.join(node_id, node, forwarded).await),
            RpcRequest::Status {} => calls::Status::answer(self.status()),
            RpcRequest::Operator { request, forwarded } => {
                calls::Operator::answer(crate::operator::handle(self, request, forwarded).await)
            }
        }
    }

    /// Hands a raft message to raft; the transport lets only servers send them.
    async fn handle_peer(&self, request: PeerRequest) -> PeerResponse {
        match request {
            PeerRequest::AppendEntries(request) => {
                *self.last_leader_contact.lock() = Some(Instant::now());
                PeerResponse::AppendEntries(self.raft.append_entries(request).await)
            }
            PeerRequest::Vote(request) => PeerResponse::Vote(self.raft.vote(request).await),
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

/// Why `peer` may not make `request`, if it may not. Joins, forwarding and leader-internal
/// writes are for servers only (raft's messages never get here: their protocol is closed to
/// anything but a server at the handshake); a server certificate issued for a node may join
/// only as that node.
fn refusal(peer: &PeerIdentity, request: &RpcRequest) -> Option<String> {
    if peer.role == Role::Server {
        return match (request, &peer.node) {
            (
                RpcRequest::Join {
                    node,
                    forwarded: false,
                    ..
                },
                Some(certified),
            ) if *certified != node.name => Some(format!(
                "the certificate is for server {certified:?}; it cannot join as {:?}",
                node.name
            )),
            _ => None,
        };
    }
    match request {
        RpcRequest::Join { .. } => Some("a join needs a server certificate".to_owned()),
        RpcRequest::Write {
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
        } => Some("only servers forward requests".to_owned()),
        RpcRequest::Write {
            op:
                Op::ReapTombstones { .. }
                | Op::CheckpointTtls { .. }
                | Op::Lock(LockOp::Wake { .. })
                | Op::Batch(_),
            ..
        } => Some("leader-internal operations need a server certificate".to_owned()),
        // A restore's archive is checked on the operator path (`/v1/snapshot`), never skipped.
        RpcRequest::Write {
            op: Op::RestoreSnapshot { .. } | Op::RestoreChunk { .. },
            ..
        } => Some("a restore goes through the snapshot endpoint".to_owned()),
        _ => None,
    }
}
