//! The raft network between servers: each openraft RPC is one [`PeerRequest`] on the QUIC
//! transport's raft protocol ([`ALPN_RAFT`], which only a server certificate may open) to the
//! target's RPC address, over a connection pooled apart from client requests. Replication is
//! one stream call per openraft replication session ([`RaftPeer::stream_append`]): each
//! AppendEntries leaves as soon as openraft has it, without waiting for the answer to the one
//! before, and the follower takes them in order into [`openraft::Raft::stream_append`], so its
//! log can sync several in one `fdatasync`. Snapshots cross in chunks (openraft's v1 network,
//! through `openraft-legacy`'s adapter); a large backlog of entries crosses as a series of
//! AppendEntries, each cut at [`super::MAX_APPEND_BYTES`] by the log reader.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use openraft::error::decompose::DecomposeResult as _;
use openraft::error::{
    NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::{SnapshotOf, VoteOf};
use openraft_legacy::network_v1::{
    Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
#[cfg(doc)]
use vigil_wire::tls::ALPN_RAFT;
use vigil_wire::transport::{RpcClient, TransportError};

use super::{LogId, Node, NodeId, SnapshotData, TypeConfig};

/// Raft's messages, server to server. Append-only: postcard encodes the variant index.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    /// 0
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// 1
    Vote(VoteRequest<TypeConfig>),
    /// 2
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// 3: the leader hands leadership over to this server: campaign now (see
    /// [`crate::operator`]).
    Campaign,
    /// 4: would this server grant that vote? Nothing changes on it (Pre-Vote).
    PreVote(VoteRequest<TypeConfig>),
}

/// What answers a [`PeerRequest`]: the variant of the same name, or
/// [`PeerResponse::Undecodable`].
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    /// 0
    AppendEntries(Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>),
    /// 1
    Vote(Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>>),
    /// 2
    InstallSnapshot(
        Result<InstallSnapshotResponse<TypeConfig>, RaftError<TypeConfig, InstallSnapshotError>>,
    ),
    /// 3: the request did not decode (a peer of another build).
    Undecodable(String),
    /// 4: whether the campaign started; `Err` says why not.
    Campaign(Result<(), String>),
    /// 5
    PreVote(Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>>),
}

/// A follower's answer to one AppendEntries of a stream call: openraft's, or why raft could
/// not give one (it stopped); the call ends after the latter.
pub type StreamAppendReply = Result<StreamAppendResult<TypeConfig>, String>;

/// Hands out clients that share the server's pool of raft connections.
#[derive(Clone)]
pub struct QuicNetwork {
    /// Dials with the raft protocol ([`vigil_wire::tls::TlsMaterial::raft_client_config`]).
    pub rpc: RpcClient,
}

pub struct QuicPeer {
    rpc: RpcClient,
    target: NodeId,
    addr: Result<SocketAddr, String>,
}

/// One peer as openraft sees it: replication as stream calls, everything else through the v1
/// adapter (which cuts snapshots into chunks).
pub struct RaftPeer(Adapter<TypeConfig, QuicPeer, SnapshotData>);

impl RaftNetworkFactory<TypeConfig> for QuicNetwork {
    type Network = RaftPeer;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        RaftPeer(Adapter::new(QuicPeer {
            rpc: self.rpc.clone(),
            target,
            addr: node
                .rpc_addr
                .parse()
                .map_err(|e| format!("bad RPC address {:?} of node {target}: {e}", node.rpc_addr)),
        }))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PeerError(String);

type RpcErr<E> = RPCError<TypeConfig, E>;

/// A transport failure as raft sees it: a refused connection (this server's certificate is not
/// a server's) is an unreachable peer.
fn transport_error<E: std::error::Error>(e: TransportError) -> RpcErr<E> {
    match e {
        TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
        e => RPCError::Network(NetworkError::new(&e)),
    }
}

impl QuicPeer {
    fn addr<E: std::error::Error>(&self) -> Result<SocketAddr, RpcErr<E>> {
        self.addr
            .clone()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&PeerError(e))))
    }

    /// [`RaftPeer`]'s Pre-Vote; a peer that does not know the request grants it.
    async fn pre_vote(
        &self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr<RaftError<TypeConfig>>> {
        let vote = rpc.vote;
        match self
            .call(PeerRequest::PreVote(rpc), option.hard_ttl())
            .await?
        {
            PeerResponse::PreVote(result) => result.map_err(|e| remote(self.target, e)),
            PeerResponse::Undecodable(_) => Ok(VoteResponse::new(vote, None, true)),
            other => Err(self.wrong_answer(other)),
        }
    }

    /// Sends a raft message.
    async fn call<E: std::error::Error>(
        &self,
        request: PeerRequest,
        timeout: Duration,
    ) -> Result<PeerResponse, RpcErr<E>> {
        self.rpc
            .call_typed(self.addr()?, &request, timeout)
            .await
            .map_err(transport_error)
    }

    /// Opens a stream call that sends each of `requests` as it comes and answers them in order.
    async fn stream_append(
        &self,
        requests: BoxStream<'static, AppendEntriesRequest<TypeConfig>>,
        timeout: Duration,
    ) -> Result<
        BoxStream<'static, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
        RPCError<TypeConfig>,
    > {
        let plans = Plans::default();
        // A request that does not encode goes as an empty frame, which the follower cannot
        // decode: it ends the call there, as any other failure would.
        let frames = fold_commits(requests, plans.clone())
            .map(|request| postcard::to_allocvec(&request).unwrap_or_default())
            .boxed();
        let replies = self
            .rpc
            .stream(self.addr()?, frames, timeout)
            .await
            .map_err(transport_error)?;
        let target = self.target;
        Ok(replies
            .map(move |reply| {
                let reply = reply.map_err(transport_error)?;
                match postcard::from_bytes::<StreamAppendReply>(&reply) {
                    Ok(Ok(result)) => Ok(result),
                    Ok(Err(why)) => Err(RPCError::Network(NetworkError::new(&PeerError(format!(
                        "node {target} could not append: {why}"
                    ))))),
                    Err(e) => Err(RPCError::Network(NetworkError::new(&PeerError(format!(
                        "node {target} answered an AppendEntries undecodably: {e}"
                    ))))),
                }
            })
            .flat_map(move |reply| futures::stream::iter(plans.answers(reply)))
            .boxed())
    }

    /// A network error for an answer that is not the one asked for.
    fn wrong_answer<E: std::error::Error>(&self, answer: PeerResponse) -> RpcErr<E> {
        RPCError::Network(NetworkError::new(&PeerError(format!(
            "node {} answered {answer:?}",
            self.target
        ))))
    }
}

/// How long an AppendEntries that carries nothing but a new commit index waits for the next
/// request of its stream to carry the commit instead. After every commit openraft sends the
/// followers a request with no entries to tell them; folding it into the next request spares
/// two messages each way and a wake-up of each follower per write when writes follow each
/// other. A follower learns of a commit at most this much later (or at the next heartbeat);
/// nothing waits for that, since reads are the leader's.
const COMMIT_HOLD: Duration = Duration::from_millis(20);

/// What became of a request of a replication stream.
#[derive(Debug, PartialEq)]
enum Plan {
    Sent,
    /// It carried only a commit and was folded into the next one; its `prev_log_id`.
    Folded(Option<LogId>),
}

/// The [`Plan`] of each request of a replication stream, in order, until answered.
#[derive(Clone, Default)]
struct Plans(Arc<Mutex<VecDeque<Plan>>>);

impl Plans {
    fn push(&self, plan: Plan) {
        self.0.lock().push_back(plan);
    }

    /// The answers a follower's `reply` to the next request sent gives, in order: one for
    /// each request folded into it, then its own. The follower accepting a request whose
    /// `prev_log_id` is a folded request's (or later) means it matches there too, which is
    /// all an answer to a request without entries says. An error is the answer to the first
    /// of them (replication stops at it).
    fn answers<E>(
        &self,
        reply: Result<StreamAppendResult<TypeConfig>, E>,
    ) -> Vec<Result<StreamAppendResult<TypeConfig>, E>> {
        let mut plans = self.0.lock();
        let mut answers = Vec::new();
        while let Some(Plan::Folded(prev_log_id)) = plans.pop_front() {
            if matches!(reply, Ok(Ok(_))) {
                answers.push(Ok(Ok(prev_log_id)));
            }
        }
        answers.push(reply);
        answers
    }
}

/// `requests` with each request that carries only a commit folded into the next one, when
/// that comes within [`COMMIT_HOLD`]; `plans` records what became of each.
fn fold_commits(
    requests: BoxStream<'static, AppendEntriesRequest<TypeConfig>>,
    plans: Plans,
) -> BoxStream<'static, AppendEntriesRequest<TypeConfig>> {
    futures::stream::unfold(
        (requests.fuse(), None, plans),
        |(mut requests, mut next, plans)| async move {
            loop {
                let request = match next.take() {
                    Some(request) => request,
                    None => requests.next().await?,
                };
                if request.entries.is_empty()
                    && let Ok(Some(later)) =
                        tokio::time::timeout(COMMIT_HOLD, requests.next()).await
                {
                    plans.push(Plan::Folded(request.prev_log_id));
                    next = Some(later);
                    continue;
                }
                plans.push(Plan::Sent);
                return Some((request, (requests, next, plans)));
            }
        },
    )
    .boxed()
}

fn remote<E: std::error::Error>(
    target: NodeId,
    e: RaftError<TypeConfig, E>,
) -> RpcErr<RaftError<TypeConfig, E>> {
    RPCError::RemoteError(RemoteError::new(target, e))
}

impl RaftNetwork<TypeConfig> for QuicPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcErr<RaftError<TypeConfig>>> {
        let request = PeerRequest::AppendEntries(rpc);
        match self.call(request, option.hard_ttl()).await? {
            PeerResponse::AppendEntries(result) => result.map_err(|e| remote(self.target, e)),
            other => Err(self.wrong_answer(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<TypeConfig>,
        RpcErr<RaftError<TypeConfig, InstallSnapshotError>>,
    > {
        let request = PeerRequest::InstallSnapshot(rpc);
        match self.call(request, option.hard_ttl()).await? {
            PeerResponse::InstallSnapshot(result) => result.map_err(|e| remote(self.target, e)),
            other => Err(self.wrong_answer(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr<RaftError<TypeConfig>>> {
        match self.call(PeerRequest::Vote(rpc), option.hard_ttl()).await? {
            PeerResponse::Vote(result) => result.map_err(|e| remote(self.target, e)),
            other => Err(self.wrong_answer(other)),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for RaftPeer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.append_entries(rpc, option).await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        Box::pin(async move {
            let replies = self
                .0
                .inner()
                .stream_append(input.boxed(), option.hard_ttl())
                .await?;
            Ok(replies)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.vote(rpc, option).await
    }

    /// Pre-Vote: a server that could not win an election (one back from a pause or a
    /// restart, or removed meanwhile) finds out before it raises its term, so its return never
    /// makes the leader step down. A peer of an older build, which does not know the request,
    /// counts as granting, as openraft's default does: elections there go on as before.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0
            .inner()
            .pre_vote(rpc, option)
            .await
            .decompose_infallible()
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.0.full_snapshot(vote, snapshot, cancel, option).await
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.transfer_leader(rpc, option).await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.0.backoff()
    }
}

#[cfg(test)]
mod tests {
    use openraft::EntryPayload;
    use openraft::raft::StreamAppendError;

    use super::*;
    use crate::raft::{Entry, Vote};

    fn log_id(index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(1, 1, index)
    }

    /// A request after `prev` carrying the entries up to `last` (none when equal).
    fn request(prev: u64, last: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(log_id(prev)),
            entries: (prev + 1..=last)
                .map(|i| Entry {
                    log_id: log_id(i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: Some(log_id(prev)),
        }
    }

    fn prevs(sent: &[AppendEntriesRequest<TypeConfig>]) -> Vec<Option<LogId>> {
        sent.iter().map(|r| r.prev_log_id).collect()
    }

    #[tokio::test]
    async fn commit_only_requests_fold_into_the_next_and_take_its_answer() {
        let plans = Plans::default();
        let requests = [request(0, 5), request(5, 5), request(5, 5), request(5, 7)];
        let sent: Vec<_> = fold_commits(futures::stream::iter(requests).boxed(), plans.clone())
            .collect()
            .await;
        assert_eq!(prevs(&sent), [Some(log_id(0)), Some(log_id(5))]);

        let ok = |index: u64| Ok::<_, ()>(Ok(Some(log_id(index))));
        assert_eq!(
            plans.answers(ok(5)),
            [ok(5)],
            "the first request's own answer"
        );
        assert_eq!(
            plans.answers(ok(7)),
            [ok(5), ok(5), ok(7)],
            "the two folded requests are answered with their prev_log_id, then the carrier"
        );
    }

    #[tokio::test]
    async fn an_error_answers_the_first_folded_request_and_nothing_after() {
        let plans = Plans::default();
        let requests = [request(5, 5), request(5, 6)];
        let sent: Vec<_> = fold_commits(futures::stream::iter(requests).boxed(), plans.clone())
            .collect()
            .await;
        assert_eq!(sent.len(), 1);
        let conflict = Ok::<_, ()>(Err(StreamAppendError::Conflict(log_id(5))));
        assert_eq!(plans.answers(conflict.clone()), [conflict]);
        assert!(plans.0.lock().is_empty(), "both requests accounted for");
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_waits_for_a_carrier_at_most_the_hold() {
        let plans = Plans::default();
        let (requests, input) = futures::channel::mpsc::unbounded();
        let mut folded = fold_commits(input.boxed(), plans.clone());

        // Nothing follows: it goes on its own once the hold has passed.
        requests.unbounded_send(request(5, 5)).unwrap();
        let start = tokio::time::Instant::now();
        let sent = folded.next().await.unwrap();
        assert_eq!(sent.prev_log_id, Some(log_id(5)));
        assert_eq!(start.elapsed(), COMMIT_HOLD);

        // At the end of the stream (a heartbeat, a probe) it goes at once.
        requests.unbounded_send(request(5, 5)).unwrap();
        drop(requests);
        let start = tokio::time::Instant::now();
        assert_eq!(
            folded.next().await.map(|r| r.prev_log_id),
            Some(Some(log_id(5)))
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(folded.next().await.is_none());
        assert_eq!(*plans.0.lock(), [Plan::Sent, Plan::Sent], "both sent");
    }
}
