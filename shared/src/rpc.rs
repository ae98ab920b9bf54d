//! The server's request/response vocabulary. Agents speak it to servers (in-process in dev mode,
//! over QUIC otherwise): state changes ([`Op`], [`writes`]), reads ([`ReadQuery`], [`reads`]),
//! and the envelope of the requests sent over QUIC ([`calls`]). Enums are versioned by appending
//! variants only (postcard encodes the variant index), so never reorder them.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::acl::{Policy, Resolved, Role, Token};
use crate::autopilot::AutopilotConfig;
use crate::catalog::{Check, HealthStatus, Node, Service, ServiceHealth};
use crate::kv::{KvEntry, KvOp, TxnOutcome};
use crate::lock::{LockOp, LockOutcome, LockStanding, LockState};
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
    /// checks, all or nothing; the registration as the first release encodes it (its service
    /// without tagged addresses).
    CatalogRegister(#[serde(with = "crate::first_release::registration")] Registration),
    /// 9: removes a service and its checks (invalidating the sessions bound to them).
    DeregisterService { node: String, service_id: String },
    /// 10: creates a prepared query, or with `update` replaces an existing one; the query as
    /// the first release encodes it (without `IgnoreCheckIDs`).
    SetQuery {
        #[serde(with = "crate::first_release::prepared_query")]
        query: PreparedQuery,
        update: bool,
    },
    /// 11
    DeleteQuery { id: String },
    /// 12: the leader's TTL deadlines of sessions (session ID, leader wall clock in ms), so a
    /// new leader arms what is left instead of a full TTL (leader-internal).
    CheckpointTtls { deadlines: Vec<(String, u64)> },
    /// 13: a change to a native lock (`/v1/vigil/lock/<name>`).
    Lock(LockOp),
    /// 14: several ops committed in one raft entry (the leader's proposer batches what arrives
    /// while earlier entries are in flight); applied in order at the entry's index, answered
    /// with a [`Response::Batch`] in the same order. Leader-internal.
    Batch(Vec<Op>),
    /// 15: replaces the whole state with a snapshot archive's (`PUT /v1/snapshot`), carrying
    /// over what must never go backwards (LockIndex floors). `state` is the postcard-encoded
    /// state machine, checked before it was proposed.
    RestoreSnapshot {
        #[serde(with = "serde_bytes")]
        state: Vec<u8>,
    },
    /// 16: replaces autopilot's settings; with `cas`, only if it is their `modify_index`.
    SetAutopilotConfig {
        config: AutopilotConfig,
        cas: Option<u64>,
    },
    /// 17: a part of a restore's state (`PUT /v1/snapshot`), staged until the `last` part
    /// arrives, which replaces the whole state as [`Op::RestoreSnapshot`] does. A restore of
    /// any size travels in parts that each fit one raft entry. `offset` 0 begins a restore
    /// (dropping any other one staged); a part that does not continue the staged restore `id`
    /// is refused.
    RestoreChunk {
        id: String,
        offset: u64,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
        last: bool,
    },
    /// 18: a change to the ACL tables (tokens, policies, roles).
    Acl(AclOp),
    /// 19: every server now applies `level` of the state machine's protocol
    /// ([`crate::PROTOCOL`]); the leader writes it once every server says it can
    /// (leader-internal). It never goes back.
    SetProtocol { level: u32 },
    /// 20: a transaction with catalog ops (`/v1/txn` with `Node`, `Service` or `Check`), all
    /// or nothing, answered with a [`Response::CatalogTxn`]. Protocol level 2.
    Txn(Vec<crate::txn::TxnOp>),
    /// 21: [`Op::SetQuery`] with every field of the query (`IgnoreCheckIDs` too). Protocol
    /// level 2.
    SetQueryFull { query: PreparedQuery, update: bool },
    /// 22: [`Op::CatalogRegister`] with every field of the registration (a service's tagged
    /// addresses too). Protocol level 2.
    CatalogRegisterFull(Registration),
    /// 23: [`Op::DestroySession`] of a session whose TTL lapsed (leader-internal): the same
    /// invalidation, which the lock history records as a TTL expiry. Protocol level 2.
    ExpireSession { id: String },
}

/// A change to the ACL tables. IDs and secrets are chosen by whoever proposes it; a link names
/// its policy or role by ID or, with an empty ID, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AclOp {
    /// 0: what the leader writes when it finds ACLs enabled: the built-in `global-management`
    /// policy and the anonymous token if missing, and the configured initial management token
    /// (which also ends bootstrapping, as Consul's does).
    Init { initial_management: Option<Token> },
    /// 1: `PUT /v1/acl/bootstrap`: creates a management token, once.
    Bootstrap(Token),
    /// 2: creates a token (`create`, its accessor must be new) or replaces one.
    SetToken { token: Token, create: bool },
    /// 3
    DeleteToken { accessor_id: String },
    /// 4: creates a policy (`create`) or replaces one.
    SetPolicy { policy: Policy, create: bool },
    /// 5
    DeletePolicy { id: String },
    /// 6: creates a role (`create`) or replaces one.
    SetRole { role: Role, create: bool },
    /// 7
    DeleteRole { id: String },
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

/// How openraft's logs name an entry's command: its clock and how many ops it carries, never
/// the ops themselves (they hold keys and values).
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ops = match &self.op {
            Op::Batch(ops) => ops.len(),
            _ => 1,
        };
        write!(f, "command of {ops} op(s) at {} ms", self.now_ms)
    }
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
    /// A native lock's contender names no live session.
    #[error("invalid session \"{0}\"")]
    LockSession(String),
    /// A contender asks for a different number of slots than the lock's current users.
    #[error("lock limit conflict (lock: {lock}, local: {local})")]
    LockLimitConflict { lock: u32, local: u32 },
    /// A restore whose state does not decode (it was checked before proposing, so only a
    /// build that encodes the state differently gets here).
    #[error("snapshot state does not decode")]
    InvalidSnapshot,
    /// A restore's part that does not continue the restore being staged (another restore began
    /// meanwhile): nothing was changed; run the restore again.
    #[error("the restore was interrupted by another one; run it again")]
    RestoreInterrupted,
    /// Bootstrapping ACLs again, or after an initial management token was configured.
    #[error("ACL bootstrap no longer allowed (reset index: {reset_index})")]
    AclBootstrapped { reset_index: u64 },
    /// An ACL change that names what does not exist (Consul answers 403 `ACL not found`).
    #[error("ACL not found")]
    AclNotFound,
    /// An ACL change Consul refuses, with its text.
    #[error("{0}")]
    AclInvalid(String),
    /// A session holding a native lock shared asks for it exclusive while other sessions share
    /// it: an upgrade, which would grant exclusive beside readers.
    #[error(
        "session {session} holds lock \"{lock}\" shared with other sessions: it cannot hold it exclusive; release it first"
    )]
    LockUpgradeHeld { lock: String, session: String },
    /// A session waiting for a native lock shared asks for it exclusive.
    #[error(
        "session {session} waits for lock \"{lock}\" shared: it cannot ask for it exclusive; release it first"
    )]
    LockUpgradeQueued { lock: String, session: String },
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
    /// 4
    Lock(LockOutcome),
    /// 5: one response per op of an [`Op::Batch`], in order.
    Batch(Vec<Response>),
    /// 6: whether a check-and-set write was applied.
    Applied(bool),
    /// 7: the outcome of an [`Op::Txn`].
    CatalogTxn(crate::txn::CatalogTxnOutcome),
}

/// The one convention of every request type, reads ([`Query`]), writes ([`Write`]), the
/// requests sent to servers ([`calls::Call`]) and the operator's (the server crate's
/// `Operation`): a request names the answer a caller gets, `Output`, and takes it out of the
/// wire enum that carries it, `Answer`, getting that back when it answers another request (a
/// protocol bug: a server of another build). Each kind of request is declared in one list by
/// a macro named after it (`reads!`, `writes!`, `calls!`, `operations!`) as `Name { fields }`
/// and the answer it names.
pub trait Request {
    /// The wire enum the answer travels in.
    type Answer;
    /// What the caller gets.
    type Output;
    fn output(answer: Self::Answer) -> Result<Self::Output, Self::Answer>;
}

/// A state change that names its answer: a caller gets `W::Output` from `Backend::write::<W>`
/// (a change the state machine may refuse answers `Result<_, ApplyError>`), so no caller
/// matches a [`Response`]. On the wire the change travels as an [`Op`] and its answer as a
/// [`Response`]; the types are in [`writes`].
pub trait Write: Request<Answer = Response> + Into<Op> {}

pub mod writes;

pub mod calls;

/// A read that names its answer: a caller gets `Q::Output` from `Backend::read::<Q>`, and the
/// state machine builds the answer with `Q::answer`, so the compiler pairs every request with
/// its answer. On the wire both travel as [`ReadQuery`] and [`QueryResult`].
pub trait Query: Request<Answer = QueryResult> + Into<ReadQuery> + Clone {
    /// The answer in its wire form.
    fn answer(output: Self::Output) -> QueryResult;
}

/// Declares every read once: the wire enum [`ReadQuery`] (a struct variant per read, in wire
/// order: append only) and, in [`reads`], a struct per read implementing [`Query`] with the
/// [`QueryResult`] variant that answers it; [`ReadQuery::into_typed`] turns the one into the
/// other.
macro_rules! reads {
    ($(
        $(#[$doc:meta])*
        $name:ident { $($field:ident: $ty:ty),* $(,)? } => $answer:ident($out:ty);
    )*) => {
        /// A read on the wire. Every read except `Txn`, `Sequencer`, `QueryExecute`,
        /// `QueryExecuteFull` and `LockSequencer` can block on an index.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        pub enum ReadQuery {
            $($(#[$doc])* $name { $($field: $ty),* },)*
        }

        impl ReadQuery {
            /// The read as its type, turned into an `R` that every read type turns into: the
            /// one place a [`ReadQuery`] is taken apart, so a server holds any read as one
            /// type and the compiler asks for each read's behaviour on it.
            pub fn into_typed<R>(self) -> R
            where
                $(reads::$name: Into<R>,)*
            {
                match self {
                    $(ReadQuery::$name { $($field),* } => reads::$name { $($field),* }.into(),)*
                }
            }
        }

        /// The reads as types, each naming its answer.
        pub mod reads {
            use super::*;

            $(
                $(#[$doc])*
                #[derive(Debug, Clone, PartialEq, Eq)]
                pub struct $name { $(pub $field: $ty),* }

                impl From<$name> for ReadQuery {
                    fn from(query: $name) -> ReadQuery {
                        let $name { $($field),* } = query;
                        ReadQuery::$name { $($field),* }
                    }
                }

                impl Request for $name {
                    type Answer = QueryResult;
                    type Output = $out;

                    fn output(result: QueryResult) -> Result<$out, QueryResult> {
                        match result {
                            QueryResult::$answer(output) => Ok(output),
                            other => Err(other),
                        }
                    }
                }

                impl Query for $name {
                    fn answer(output: $out) -> QueryResult {
                        QueryResult::$answer(output)
                    }
                }
            )*
        }
    };
}

reads! {
    /// 0: the entry at `key` (none or one).
    KvGet { key: String } => Entries(Vec<KvEntry>);
    /// 1: the entries under `prefix`.
    KvList { prefix: String } => Entries(Vec<KvEntry>);
    /// 2: the keys under `prefix`, up to the next `separator`.
    KvKeys {
        prefix: String,
        separator: Option<String>,
    } => Keys(Vec<String>);
    /// 3: the session `id` (none or one).
    SessionInfo { id: String } => Sessions(Vec<Session>);
    /// 4
    SessionList {} => Sessions(Vec<Session>);
    /// 5
    SessionNode { node: String } => Sessions(Vec<Session>);
    /// 6: a transaction with read verbs only (no raft, no blocking).
    Txn { ops: Vec<KvOp> } => Txn(TxnOutcome);
    /// 7: is `(key, lock_index, session)` the current holder? `Err` says why not.
    Sequencer {
        key: String,
        lock_index: u64,
        session: String,
    } => Sequencer(Result<(), String>);
    /// 8
    CatalogNodes {} => Nodes(Vec<Node>);
    /// 9
    NodeChecks { node: String } => Checks(Vec<Check>);
    /// 10: every service instance (the agent groups them by name).
    CatalogServices {} => Services(Vec<Service>);
    /// 11: the instances of one service as `(node, service)`, blocking on that service's index.
    CatalogService { name: String } => ServiceNodes(Vec<(Node, Service)>);
    /// 12: a node and its services; `None` when the node is unknown.
    CatalogNode { node: String } => NodeServices(Option<(Node, Vec<Service>)>);
    /// 13: the checks of every instance of one service.
    ServiceChecks { name: String } => Checks(Vec<Check>);
    /// 14: every check in `state` (`None`: any state).
    ChecksInState { state: Option<HealthStatus> } => Checks(Vec<Check>);
    /// 15: the instances of one service with their node and checks.
    HealthService { name: String } => Health(Vec<ServiceHealth>);
    /// 16
    QueryList {} => Queries(Vec<PreparedQuery>);
    /// 17: a prepared query by ID, or by name when no ID matches.
    QueryGet { id_or_name: String } => Queries(Vec<PreparedQuery>);
    /// 18: runs a prepared query (not blockable): the query and the instances it selected,
    /// `None` when no query matched.
    QueryExecute { id_or_name: String } => Executed(Option<(PreparedQuery, Vec<ServiceHealth>)>);
    /// 19: one native lock; `None` when no such lock exists.
    Lock { name: String } => Lock(Option<LockState>);
    /// 20: the native locks whose names start with `prefix`; blocks on them and on KV keys
    /// under `prefix` (what `/v1/vigil/locks` reports).
    Locks { prefix: String } => Locks(Vec<LockState>);
    /// 21: where `session` stands on lock `name`; blocks until it is granted or gone.
    LockStanding { name: String, session: String } => Standing(crate::lock::LockStanding);
    /// 22: is `(name, token, session)` a current holder of the native lock?
    LockSequencer {
        name: String,
        token: u64,
        session: String,
    } => Sequencer(Result<(), String>);
    /// 23: what the token with this secret resolves to; `None` when there is none.
    AclResolve { secret_id: String } => AclResolved(Option<Resolved>);
    /// 24: a token by accessor ID, its links' names filled in.
    AclToken { accessor_id: String } => AclTokens(Vec<Token>);
    /// 25: every token, its links' names filled in.
    AclTokenList {} => AclTokens(Vec<Token>);
    /// 26: a policy by ID or, with `by_name`, by name.
    AclPolicy { id: String, by_name: bool } => AclPolicies(Vec<Policy>);
    /// 27
    AclPolicyList {} => AclPolicies(Vec<Policy>);
    /// 28: a role by ID or, with `by_name`, by name, its links' names filled in.
    AclRole { id: String, by_name: bool } => AclRoles(Vec<Role>);
    /// 29
    AclRoleList {} => AclRoles(Vec<Role>);
    /// 30: where `session` stands on lock `name`, with the mode it holds or waits for; blocks
    /// until that changes (as `LockStanding`).
    LockHold { name: String, session: String } => Hold(crate::lock::LockHold);
    /// 31: [`ReadQuery::QueryList`] with every field of each query (`IgnoreCheckIDs` too); what
    /// agents of this release ask.
    QueryListFull {} => QueriesFull(Vec<PreparedQuery>);
    /// 32: [`ReadQuery::QueryGet`] with every field of the query.
    QueryGetFull { id_or_name: String } => QueriesFull(Vec<PreparedQuery>);
    /// 33: [`ReadQuery::CatalogServices`] with every field of each service (tagged addresses
    /// too); so the four after it, each as the read it is named after. What agents of this
    /// release ask.
    CatalogServicesFull {} => ServicesFull(Vec<Service>);
    /// 34
    CatalogServiceFull { name: String } => ServiceNodesFull(Vec<(Node, Service)>);
    /// 35
    CatalogNodeFull { node: String } => NodeServicesFull(Option<(Node, Vec<Service>)>);
    /// 36
    HealthServiceFull { name: String } => HealthFull(Vec<ServiceHealth>);
    /// 37
    QueryExecuteFull { id_or_name: String } => ExecutedFull(Option<(PreparedQuery, Vec<ServiceHealth>)>);
    /// 38: the recorded history of the locks named `name` (a KV key and a native lock may
    /// share it) or, with `prefix`, of every lock whose name starts with it; blocks on locks
    /// and KV keys under it.
    History { name: String, prefix: bool } => History(Vec<crate::history::LockHistory>);
}

/// A read's answer on the wire; [`Query::output`] takes it apart.
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
    /// 7: services as the first release encodes them (here and in the three variants after
    /// it, and in `Executed`: without tagged addresses).
    Services(#[serde(with = "crate::first_release::services")] Vec<Service>),
    /// 8: `(node, service)` pairs.
    ServiceNodes(#[serde(with = "crate::first_release::service_nodes")] Vec<(Node, Service)>),
    /// 9: `None` when the node is unknown.
    NodeServices(
        #[serde(with = "crate::first_release::node_services")] Option<(Node, Vec<Service>)>,
    ),
    /// 10
    Health(#[serde(with = "crate::first_release::health")] Vec<ServiceHealth>),
    /// 11: as the first release encodes them (without `IgnoreCheckIDs`).
    Queries(#[serde(with = "crate::first_release::prepared_queries")] Vec<PreparedQuery>),
    /// 12: the query run (as the first release encodes it) and the instances it selected;
    /// `None` when no query matched.
    Executed(
        #[serde(with = "crate::first_release::executed")]
        Option<(PreparedQuery, Vec<ServiceHealth>)>,
    ),
    /// 13: `None` when no such lock exists.
    Lock(Option<LockState>),
    /// 14
    Locks(Vec<LockState>),
    /// 15
    Standing(LockStanding),
    /// 16
    AclResolved(Option<Resolved>),
    /// 17
    AclTokens(Vec<Token>),
    /// 18
    AclPolicies(Vec<Policy>),
    /// 19
    AclRoles(Vec<Role>),
    /// 20
    Hold(crate::lock::LockHold),
    /// 21: with every field (`IgnoreCheckIDs` too).
    QueriesFull(Vec<PreparedQuery>),
    /// 22: as `Services`, whole (tagged addresses too); so the four after it.
    ServicesFull(Vec<Service>),
    /// 23
    ServiceNodesFull(Vec<(Node, Service)>),
    /// 24
    NodeServicesFull(Option<(Node, Vec<Service>)>),
    /// 25
    HealthFull(Vec<ServiceHealth>),
    /// 26
    ExecutedFull(Option<(PreparedQuery, Vec<ServiceHealth>)>),
    /// 27
    History(Vec<crate::history::LockHistory>),
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
    /// A write that may or may not have been applied: it reached a leader (or a raft log)
    /// that failed before answering. Retrying is safe only for an idempotent request.
    #[error("{0}")]
    Indeterminate(String),
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
    /// Not applied: the path to the leader failed before the request was taken up (a
    /// forwarded read whose leader could not be reached, a failed server RPC). Safe to retry.
    #[error("{0}")]
    Unavailable(String),
    /// A change of the server set that did not complete (joining, removing a peer, an
    /// election asked for).
    #[error("{0}")]
    Membership(String),
    /// A bug: an answer of the wrong kind, a value that does not encode. Never retried.
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller's token may not make this request: the server's own check refused it
    /// (Consul's 403 `Permission denied: …`).
    #[error("{0}")]
    PermissionDenied(String),
}

impl ServerError {
    /// Whether sending the request again cannot apply it twice: it was never applied (no
    /// leader, not delivered), or it may have been and `idempotent` says repeating it is
    /// harmless (reads, renewals).
    pub fn safe_to_retry(&self, idempotent: bool) -> bool {
        match self {
            ServerError::NoLeader
            | ServerError::NotLeader { .. }
            | ServerError::NoServers
            | ServerError::Unavailable(_) => true,
            ServerError::Indeterminate(_) => idempotent,
            ServerError::SessionNotFound(_)
            | ServerError::ShuttingDown
            | ServerError::TooLarge { .. }
            | ServerError::TooManyBlockingQueries
            | ServerError::InvalidSessionTtl(_)
            | ServerError::Membership(_)
            | ServerError::Internal(_)
            | ServerError::PermissionDenied(_) => false,
        }
    }
}
