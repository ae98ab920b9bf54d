//! The server's request/response vocabulary. Agents speak it to servers (in-process in dev mode,
//! over QUIC otherwise). Enums are versioned by appending variants only (postcard encodes the
//! variant index), so never reorder them.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::catalog::{Check, HealthStatus, Node, Service, ServiceHealth};
use crate::kv::{KvEntry, KvOp, TxnOutcome};
use crate::query::PreparedQuery;
use crate::session::Session;

/// A state change. The leader wraps it in a [`Command`] stamped with its clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// 0: KV ops applied atomically (a single-key write is a one-op transaction).
    Kv(Vec<KvOp>),
    /// 1: the ID is chosen by whoever proposes it, so apply stays deterministic.
    CreateSession(Session),
    /// 2: destroy = invalidate (releases or deletes its keys, arms lock-delay).
    DestroySession { id: String },
    /// 3: register or update a node.
    RegisterNode { name: String, address: String },
    /// 4: register or update a check; a critical status invalidates the sessions bound to it.
    RegisterCheck(CheckRegistration),
    /// 5
    DeregisterCheck { node: String, check_id: String },
    /// 6: removes the node, its checks, and every session on it.
    DeregisterNode { name: String },
    /// 7: drop tombstones written before `before_ms` (leader's clock).
    ReapTombstones { before_ms: u64 },
    /// 8: `/v1/catalog/register` and agent anti-entropy: a node, optionally one service, and
    /// checks, all or nothing.
    CatalogRegister(Registration),
    /// 9: removes a service and its checks (invalidating the sessions bound to them).
    DeregisterService { node: String, service_id: String },
    /// 10: creates a prepared query, or with `update` replaces an existing one.
    SetQuery { query: PreparedQuery, update: bool },
    /// 11
    DeleteQuery { id: String },
    /// 12: the leader's TTL deadlines of sessions (session ID, leader wall clock in ms), so a
    /// new leader arms what is left instead of a full TTL (leader-internal).
    CheckpointTtls { deadlines: Vec<(String, u64)> },
}

/// A check as registered; indexes and the service's name and tags are filled in by the
/// catalog.
pub type CheckRegistration = Check;

/// What `/v1/catalog/register` carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub node: String,
    pub node_id: String,
    pub address: String,
    pub tagged_addresses: BTreeMap<String, String>,
    pub node_meta: BTreeMap<String, String>,
    /// Leave the node's fields alone (it must exist).
    pub skip_node_update: bool,
    pub service: Option<Service>,
    pub checks: Vec<CheckRegistration>,
}

/// What raft replicates: an [`Op`] with the proposing leader's wall clock in milliseconds.
/// Apply never reads a clock; it uses `now_ms` (clamped to be monotonic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub now_ms: u64,
    pub op: Op,
}

/// A deterministic refusal found while applying a command. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApplyError {
    #[error("Missing node registration")]
    MissingNode,
    #[error("Missing check '{0}' registration")]
    MissingCheck(String),
    #[error("Check '{0}' is in critical state")]
    CriticalCheck(String),
    #[error("Session ID must be unique")]
    DuplicateSession,
    #[error("Unknown service ID '{service_id}' for check ID '{check_id}'")]
    UnknownServiceForCheck {
        service_id: String,
        check_id: String,
    },
    #[error("invalid session \"{0}\"")]
    InvalidQuerySession(String),
    #[error("name '{0}' aliases an existing query name")]
    DuplicateQueryName(String),
    #[error("Cannot modify non-existent prepared query: '{0}'")]
    MissingQuery(String),
}

/// The result of applying one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// 0
    Done,
    /// 1
    Txn(TxnOutcome),
    /// 2
    SessionCreated { id: String },
    /// 3
    Rejected(ApplyError),
}

/// A read. Every variant except `Txn` and `Sequencer` can block on an index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadQuery {
    /// 0
    KvGet { key: String },
    /// 1
    KvList { prefix: String },
    /// 2
    KvKeys {
        prefix: String,
        separator: Option<String>,
    },
    /// 3
    SessionInfo { id: String },
    /// 4
    SessionList,
    /// 5
    SessionNode { node: String },
    /// 6: a transaction with read verbs only (no raft, no blocking).
    Txn(Vec<KvOp>),
    /// 7: is `(key, lock_index, session)` the current holder?
    Sequencer {
        key: String,
        lock_index: u64,
        session: String,
    },
    /// 8
    CatalogNodes,
    /// 9
    NodeChecks { node: String },
    /// 10: every service instance (the agent groups them by name).
    CatalogServices,
    /// 11: the instances of one service, blocking on that service's index.
    CatalogService { name: String },
    /// 12: a node and its services.
    CatalogNode { node: String },
    /// 13: the checks of every instance of one service.
    ServiceChecks { name: String },
    /// 14: every check in `state` (`None`: any state).
    ChecksInState { state: Option<HealthStatus> },
    /// 15: the instances of one service with their node and checks.
    HealthService { name: String },
    /// 16
    QueryList,
    /// 17: a prepared query by ID, or by name when no ID matches.
    QueryGet { id_or_name: String },
    /// 18: runs a prepared query (not blockable).
    QueryExecute { id_or_name: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueryResult {
    /// 0
    Entries(Vec<KvEntry>),
    /// 1
    Keys(Vec<String>),
    /// 2
    Sessions(Vec<Session>),
    /// 3
    Txn(TxnOutcome),
    /// 4: `Err` carries the reason the token is not valid.
    Sequencer(Result<(), String>),
    /// 5
    Nodes(Vec<Node>),
    /// 6
    Checks(Vec<Check>),
    /// 7
    Services(Vec<Service>),
    /// 8: `(node, service)` pairs.
    ServiceNodes(Vec<(Node, Service)>),
    /// 9: `None` when the node is unknown.
    NodeServices(Option<(Node, Vec<Service>)>),
    /// 10
    Health(Vec<ServiceHealth>),
    /// 11
    Queries(Vec<PreparedQuery>),
    /// 12: the query run and the instances it selected; `None` when no query matched.
    Executed(Option<(PreparedQuery, Vec<ServiceHealth>)>),
}

/// How fresh a read must be (Consul's consistency modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Consistency {
    /// Answered by the leader from its state.
    #[default]
    Default,
    /// The leader confirms leadership with a quorum first (read-index).
    Consistent,
    /// Any server answers from local state.
    Stale,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueryOptions {
    pub consistency: Consistency,
    /// Block until the result's index exceeds this (0: answer at once).
    pub min_index: u64,
    /// How long to block, already clamped and jittered by the caller.
    pub wait_ms: u64,
}

/// Metadata sent with every read (the `X-Consul-*` headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryMeta {
    /// Never 0 (floored to 1, as Consul does).
    pub index: u64,
    pub known_leader: bool,
    pub last_contact_ms: u64,
}

/// Why the server could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ServerError {
    #[error("No cluster leader")]
    NoLeader,
    /// This server is not the leader; `leader` is its RPC address if known.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<String> },
    #[error("Session id '{0}' not found")]
    SessionNotFound(String),
    #[error("server is shutting down")]
    ShuttingDown,
    #[error("raft: {0}")]
    Raft(String),
    /// No server answered (a client agent's whole server list failed).
    #[error("No known Consul servers")]
    NoServers,
    /// The state change is larger than one raft entry may be; nothing was proposed.
    #[error("Request too large: the change is {size} bytes, the limit is {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// The server (or the path to it) already carries as many blocking queries as it may; the
    /// query was not started. Retry later, or with a shorter wait.
    #[error("Too many blocking queries in flight; retry later")]
    TooManyBlockingQueries,
    /// A session's TTL outside the servers' `[session_ttl_min, 24h]`, or not a duration; the
    /// text is Consul's.
    #[error("{0}")]
    InvalidSessionTtl(String),
}
