//! The seam between an agent and "the servers": [`ServerApi`], what the HTTP API asks of them
//! (commit a write, a possibly blocking read, renew a session, operator requests, status).
//! Implemented by the in-process [`Server`] (the server role, `--dev`), by the agent's QUIC
//! client to remote servers, and by `memory::MemoryServer`, a test double that applies ops
//! straight to a state machine. Retries and deadlines are the caller's (the agent's
//! `Backend`); an implementation makes one attempt per call, in wire form: the caller takes
//! the answer apart by the request's type (`Query`, `Write`, [`operations::Operation`]).

/// The double is for tests only: built for this crate's tests and, through the `test-double`
/// feature, for the agent's (its dev-dependency turns it on); never in the `vigil` binary.
#[cfg(any(test, feature = "test-double"))]
pub mod memory;
pub mod operations;

use futures::future::BoxFuture;
use vigil_shared::operator::{OperatorError, OperatorReply, OperatorRequest};
use vigil_shared::rpc::calls::StatusInfo;
use vigil_shared::rpc::{
    Consistency, Op, QueryMeta, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};
use vigil_shared::session::Session;

use crate::Server;
use crate::operator;
use crate::server::Hop;

/// A read's answer: the result, and the index and leader it was read at.
pub type QueryFuture<'a> = BoxFuture<'a, Result<(QueryResult, QueryMeta), ServerError>>;

/// What an agent asks of the servers, one attempt per call. Object safe (boxed futures), so an
/// agent holds any of them behind one `Arc<dyn ServerApi>`.
pub trait ServerApi: Send + Sync {
    /// Commits a state change and returns what applying it produced.
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Response, ServerError>>;

    /// Answers a read in `opts.consistency`, blocking while the answer's index is not above
    /// `opts.min_index`, for `opts.wait_ms` at most.
    fn query(&self, opts: QueryOptions, query: ReadQuery) -> QueryFuture<'_>;

    /// The query answered at once from a server's own state, without asking a leader: the
    /// fallback of a blocking query whose servers are electing one. By default a stale query.
    fn stale_read(&self, query: ReadQuery) -> QueryFuture<'_> {
        let opts = QueryOptions {
            consistency: Consistency::Stale,
            min_index: 0,
            wait_ms: 0,
        };
        self.query(opts, query)
    }

    /// Restarts a session's TTL on the leader (no raft write) and returns the session.
    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Session, ServerError>>;

    /// Operates the server set (`/v1/operator/*`, snapshots) on the leader.
    fn operator(
        &self,
        request: OperatorRequest,
    ) -> BoxFuture<'_, Result<OperatorReply, OperatorError>>;

    /// The leader and the raft members.
    fn status(&self) -> BoxFuture<'_, Result<StatusInfo, ServerError>>;

    /// True once the servers' side of this agent is stopping: nothing is worth retrying.
    fn is_shutting_down(&self) -> bool;
}

impl ServerApi for Server {
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Response, ServerError>> {
        Box::pin(Server::write(self, op))
    }

    fn query(&self, opts: QueryOptions, query: ReadQuery) -> QueryFuture<'_> {
        Box::pin(Server::query(self, opts, query))
    }

    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Session, ServerError>> {
        Box::pin(self.renew_session(id))
    }

    fn operator(
        &self,
        request: OperatorRequest,
    ) -> BoxFuture<'_, Result<OperatorReply, OperatorError>> {
        Box::pin(operator::handle(self, request, Hop::Caller))
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusInfo, ServerError>> {
        let status = Server::status(self);
        Box::pin(async move { Ok(status) })
    }

    fn is_shutting_down(&self) -> bool {
        Server::is_shutting_down(self)
    }
}
