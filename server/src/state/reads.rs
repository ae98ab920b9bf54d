//! The reads the state machine answers. One impl per read ([`StateRead`]) returns its answer,
//! the index that answer stands at and what a blocking query on it waits for, together (as
//! Consul's state store reads return the index they read and the watch set they touched), so
//! what a read looks at and what wakes it cannot drift apart. [`AnyRead`] holds any read as one
//! type; a read without an impl does not compile where a [`ReadQuery`] becomes one.

use vigil_shared::catalog::{Check, Node, Service, ServiceHealth};
use vigil_shared::history::LockHistory;
use vigil_shared::kv::{KvEntry, TxnOutcome};
use vigil_shared::lock::{LockHold, LockStanding, LockState};
use vigil_shared::query::PreparedQuery;
use vigil_shared::rpc::{Query, QueryResult, ReadQuery, reads};
use vigil_shared::session::Session;

use super::{Interest, StateMachine};

/// What one read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<T> {
    pub output: T,
    /// The index the answer stands at (`X-Consul-Index`).
    pub index: u64,
    /// What a blocking query on this read waits for ([`Interest::None`]: it does not block).
    pub interest: Interest,
    /// Whether what was asked for is missing (a key, a session): a blocking query that finds
    /// it still missing waits on, rather than waking for unrelated index movement (Consul's
    /// rule).
    pub missing: bool,
}

impl<T> Found<T> {
    fn new(output: T, index: u64, interest: Interest) -> Found<T> {
        Found {
            output,
            index,
            interest,
            missing: false,
        }
    }

    fn map<U>(self, f: impl FnOnce(T) -> U) -> Found<U> {
        Found {
            output: f(self.output),
            index: self.index,
            interest: self.interest,
            missing: self.missing,
        }
    }
}

/// A read of the state: its answer, index and interest in one look ([`Found`]).
pub trait StateRead: Query {
    fn read(&self, state: &StateMachine) -> Found<Self::Output>;
}

/// Any read, as a blocking query holds it between looks.
pub struct AnyRead(Box<dyn Look + Send + Sync>);

/// A read with its answer in wire form.
trait Look {
    fn look(&self, state: &StateMachine) -> Found<QueryResult>;
}

impl<Q: StateRead> Look for Q {
    fn look(&self, state: &StateMachine) -> Found<QueryResult> {
        self.read(state).map(Q::answer)
    }
}

impl<Q: StateRead + Send + Sync + 'static> From<Q> for AnyRead {
    fn from(read: Q) -> AnyRead {
        AnyRead(Box::new(read))
    }
}

impl From<ReadQuery> for AnyRead {
    fn from(query: ReadQuery) -> AnyRead {
        query.into_typed()
    }
}

impl AnyRead {
    /// The read's answer in wire form. Every read reports at least the index of the latest
    /// restore, which may have replaced anything, so an index never goes back across one.
    pub fn read(&self, state: &StateMachine) -> Found<QueryResult> {
        let found = self.0.look(state);
        Found {
            index: found.index.max(state.restored_at),
            ..found
        }
    }
}

/// Session IDs are lowercase UUIDs, and a lock's effects name them so.
fn standing_interest(name: &str, session: &str) -> Interest {
    Interest::LockStanding {
        name: name.to_owned(),
        session: session.to_ascii_lowercase(),
    }
}

/// The session's ID as stored (a caller may ask in another case).
fn stored_session<'a>(state: &'a StateMachine, session: &'a str) -> &'a str {
    state.sessions.get(session).map_or(session, |s| &s.id)
}

impl StateRead for reads::KvGet {
    fn read(&self, state: &StateMachine) -> Found<Vec<KvEntry>> {
        let entries: Vec<KvEntry> = state.kv.get(&self.key).cloned().into_iter().collect();
        let missing = entries.is_empty();
        let index = state.kv.key_index(&self.key);
        Found {
            missing,
            ..Found::new(entries, index, Interest::Key(self.key.clone()))
        }
    }
}

impl StateRead for reads::KvList {
    fn read(&self, state: &StateMachine) -> Found<Vec<KvEntry>> {
        Found::new(
            state.kv.list(&self.prefix).cloned().collect(),
            state.kv.prefix_index(&self.prefix),
            Interest::Prefix(self.prefix.clone()),
        )
    }
}

impl StateRead for reads::KvKeys {
    fn read(&self, state: &StateMachine) -> Found<Vec<String>> {
        let keys: Vec<&str> = state
            .kv
            .list(&self.prefix)
            .map(|e| e.key.as_str())
            .collect();
        Found::new(
            vigil_shared::api::collapse_keys(&self.prefix, &keys, self.separator.as_deref()),
            state.kv.prefix_index(&self.prefix),
            Interest::Prefix(self.prefix.clone()),
        )
    }
}

impl StateRead for reads::SessionInfo {
    fn read(&self, state: &StateMachine) -> Found<Vec<Session>> {
        let sessions: Vec<Session> = state.sessions.get(&self.id).cloned().into_iter().collect();
        let missing = sessions.is_empty();
        let index = state.sessions.table_index();
        Found {
            missing,
            ..Found::new(sessions, index, Interest::Sessions)
        }
    }
}

impl StateRead for reads::SessionList {
    fn read(&self, state: &StateMachine) -> Found<Vec<Session>> {
        Found::new(
            state.sessions.list().cloned().collect(),
            state.sessions.table_index(),
            Interest::Sessions,
        )
    }
}

impl StateRead for reads::SessionNode {
    fn read(&self, state: &StateMachine) -> Found<Vec<Session>> {
        let sessions = state
            .sessions
            .on_node(&self.node)
            .iter()
            .filter_map(|id| state.sessions.get(id).cloned())
            .collect();
        Found::new(sessions, state.sessions.table_index(), Interest::Sessions)
    }
}

/// Read verbs only: no raft, no blocking.
impl StateRead for reads::Txn {
    fn read(&self, state: &StateMachine) -> Found<TxnOutcome> {
        Found::new(
            state.read_txn(&self.ops),
            state.kv.table_index(),
            Interest::None,
        )
    }
}

impl StateRead for reads::Sequencer {
    fn read(&self, state: &StateMachine) -> Found<Result<(), String>> {
        Found::new(
            state.check_sequencer(&self.key, self.lock_index, &self.session),
            state.kv.key_index(&self.key),
            Interest::None,
        )
    }
}

impl StateRead for reads::CatalogNodes {
    fn read(&self, state: &StateMachine) -> Found<Vec<Node>> {
        Found::new(
            state.catalog.nodes().cloned().collect(),
            state.catalog.table_index(),
            Interest::Catalog,
        )
    }
}

impl StateRead for reads::NodeChecks {
    fn read(&self, state: &StateMachine) -> Found<Vec<Check>> {
        Found::new(
            state.catalog.node_checks(&self.node),
            state.catalog.table_index(),
            Interest::Catalog,
        )
    }
}

impl StateRead for reads::CatalogServices {
    fn read(&self, state: &StateMachine) -> Found<Vec<Service>> {
        Found::new(
            state.catalog.services().cloned().collect(),
            state.catalog.table_index(),
            Interest::Catalog,
        )
    }
}

impl StateRead for reads::CatalogServicesFull {
    fn read(&self, state: &StateMachine) -> Found<Vec<Service>> {
        reads::CatalogServices {}.read(state)
    }
}

impl StateRead for reads::CatalogService {
    fn read(&self, state: &StateMachine) -> Found<Vec<(Node, Service)>> {
        Found::new(
            state.catalog.instances(&self.name),
            state.catalog.service_index(&self.name),
            Interest::Service(self.name.clone()),
        )
    }
}

impl StateRead for reads::CatalogServiceFull {
    fn read(&self, state: &StateMachine) -> Found<Vec<(Node, Service)>> {
        let name = self.name.clone();
        reads::CatalogService { name }.read(state)
    }
}

impl StateRead for reads::CatalogNode {
    fn read(&self, state: &StateMachine) -> Found<Option<(Node, Vec<Service>)>> {
        Found::new(
            state.node_services(&self.node),
            state.catalog.table_index(),
            Interest::Catalog,
        )
    }
}

impl StateRead for reads::CatalogNodeFull {
    fn read(&self, state: &StateMachine) -> Found<Option<(Node, Vec<Service>)>> {
        let node = self.node.clone();
        reads::CatalogNode { node }.read(state)
    }
}

impl StateRead for reads::ServiceChecks {
    fn read(&self, state: &StateMachine) -> Found<Vec<Check>> {
        Found::new(
            state.catalog.service_checks(&self.name),
            state.catalog.service_index(&self.name),
            Interest::Service(self.name.clone()),
        )
    }
}

impl StateRead for reads::ChecksInState {
    fn read(&self, state: &StateMachine) -> Found<Vec<Check>> {
        Found::new(
            state.catalog.checks_in_state(self.state),
            state.catalog.table_index(),
            Interest::Catalog,
        )
    }
}

impl StateRead for reads::HealthService {
    fn read(&self, state: &StateMachine) -> Found<Vec<ServiceHealth>> {
        Found::new(
            state.catalog.health(&self.name),
            state.catalog.service_index(&self.name),
            Interest::Service(self.name.clone()),
        )
    }
}

impl StateRead for reads::HealthServiceFull {
    fn read(&self, state: &StateMachine) -> Found<Vec<ServiceHealth>> {
        let name = self.name.clone();
        reads::HealthService { name }.read(state)
    }
}

impl StateRead for reads::QueryList {
    fn read(&self, state: &StateMachine) -> Found<Vec<PreparedQuery>> {
        Found::new(
            state.queries.list().cloned().collect(),
            state.queries.table_index(),
            Interest::Queries,
        )
    }
}

impl StateRead for reads::QueryListFull {
    fn read(&self, state: &StateMachine) -> Found<Vec<PreparedQuery>> {
        reads::QueryList {}.read(state)
    }
}

impl StateRead for reads::QueryGet {
    fn read(&self, state: &StateMachine) -> Found<Vec<PreparedQuery>> {
        Found::new(
            state
                .queries
                .lookup(&self.id_or_name)
                .cloned()
                .into_iter()
                .collect(),
            state.queries.table_index(),
            Interest::Queries,
        )
    }
}

impl StateRead for reads::QueryGetFull {
    fn read(&self, state: &StateMachine) -> Found<Vec<PreparedQuery>> {
        let id_or_name = self.id_or_name.clone();
        reads::QueryGet { id_or_name }.read(state)
    }
}

/// Not blockable.
impl StateRead for reads::QueryExecute {
    fn read(&self, state: &StateMachine) -> Found<Option<(PreparedQuery, Vec<ServiceHealth>)>> {
        Found::new(
            state.execute_query(&self.id_or_name),
            state.catalog.table_index().max(state.queries.table_index()),
            Interest::None,
        )
    }
}

impl StateRead for reads::QueryExecuteFull {
    fn read(&self, state: &StateMachine) -> Found<Option<(PreparedQuery, Vec<ServiceHealth>)>> {
        let id_or_name = self.id_or_name.clone();
        reads::QueryExecute { id_or_name }.read(state)
    }
}

impl StateRead for reads::Lock {
    fn read(&self, state: &StateMachine) -> Found<Option<LockState>> {
        Found::new(
            state.locks.get(&self.name).cloned(),
            state.locks.table_index(),
            Interest::Locks(self.name.clone()),
        )
    }
}

impl StateRead for reads::Locks {
    fn read(&self, state: &StateMachine) -> Found<Vec<LockState>> {
        Found::new(
            state.locks.under(&self.prefix).cloned().collect(),
            state
                .locks
                .table_index()
                .max(state.kv.prefix_index(&self.prefix)),
            Interest::Locks(self.prefix.clone()),
        )
    }
}

impl StateRead for reads::LockStanding {
    fn read(&self, state: &StateMachine) -> Found<LockStanding> {
        let session = stored_session(state, &self.session);
        let (standing, index) = state.locks.standing(&self.name, session);
        Found::new(
            standing,
            index,
            standing_interest(&self.name, &self.session),
        )
    }
}

impl StateRead for reads::LockHold {
    fn read(&self, state: &StateMachine) -> Found<LockHold> {
        let session = stored_session(state, &self.session);
        let (hold, index) = state.locks.hold(&self.name, session);
        Found::new(hold, index, standing_interest(&self.name, &self.session))
    }
}

/// A lock's events change its key or its native lock, under its name.
impl StateRead for reads::History {
    fn read(&self, state: &StateMachine) -> Found<Vec<LockHistory>> {
        let (found, index) = state.history.read(&self.name, self.prefix);
        Found::new(found, index, Interest::Locks(self.name.clone()))
    }
}

impl StateRead for reads::LockSequencer {
    fn read(&self, state: &StateMachine) -> Found<Result<(), String>> {
        Found::new(
            state
                .locks
                .check_sequencer(&self.name, self.token, &self.session),
            state.locks.table_index(),
            Interest::None,
        )
    }
}

impl StateRead for reads::AclResolve {
    fn read(&self, state: &StateMachine) -> Found<Option<vigil_shared::acl::Resolved>> {
        Found::new(
            state.acl.resolve(&self.secret_id),
            state.acl.table_index(),
            Interest::Acl,
        )
    }
}

impl StateRead for reads::AclToken {
    fn read(&self, state: &StateMachine) -> Found<Vec<vigil_shared::acl::Token>> {
        Found::new(
            state.acl.token(&self.accessor_id).into_iter().collect(),
            state.acl.table_index(),
            Interest::Acl,
        )
    }
}

impl StateRead for reads::AclTokenList {
    fn read(&self, state: &StateMachine) -> Found<Vec<vigil_shared::acl::Token>> {
        Found::new(state.acl.tokens(), state.acl.table_index(), Interest::Acl)
    }
}

impl StateRead for reads::AclPolicy {
    fn read(&self, state: &StateMachine) -> Found<Vec<vigil_shared::acl::Policy>> {
        Found::new(
            state
                .acl
                .policy(&self.id, self.by_name)
                .into_iter()
                .collect(),
            state.acl.table_index(),
            Interest::Acl,
        )
    }
}

impl StateRead for reads::AclPolicyList {
    fn read(&self, state: &StateMachine) -> Found<Vec<vigil_shared::acl::Policy>> {
        Found::new(state.acl.policies(), state.acl.table_index(), Interest::Acl)
    }
}

impl StateRead for reads::AclRole {
    fn read(&self, state: &StateMachine) -> Found<Vec<vigil_shared::acl::Role>> {
        Found::new(
            state.acl.role(&self.id, self.by_name).into_iter().collect(),
            state.acl.table_index(),
            Interest::Acl,
        )
    }
}

impl StateRead for reads::AclRoleList {
    fn read(&self, state: &StateMachine) -> Found<Vec<vigil_shared::acl::Role>> {
        Found::new(state.acl.roles(), state.acl.table_index(), Interest::Acl)
    }
}
