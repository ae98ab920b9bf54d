//! The replicated state machine: KV, sessions, the catalog and prepared queries, mutated only by applying a
//! committed [`Command`] at a raft index. Apply reads no clock and does no I/O; it validates
//! first and then mutates, so a refused command changes nothing.

pub mod acl;
pub mod catalog;
pub mod format;
pub mod history;
pub mod kv;
pub mod locks;
pub mod query;
pub mod reads;
pub mod restore;
pub mod session;
mod txn;

#[cfg(test)]
mod lock_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vigil_shared::autopilot::AutopilotConfig;
use vigil_shared::catalog::{Check, HealthStatus, Node, Service, ServiceHealth};
use vigil_shared::history::{Cause, Event, LockEvent, LockKind};
use vigil_shared::kv::{KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::lock::LockMode;
use vigil_shared::query::PreparedQuery;
use vigil_shared::rpc::{ApplyError, Command, Op, Response};
use vigil_shared::session::Session;

use acl::AclStore;
use catalog::{Catalog, Touched};
use history::History;
use kv::{KeyChange, KvStore, TxnContext};
use locks::{LockEffects, LockTable, QueueEvent, Requests};
use query::QueryStore;
use restore::StagedRestore;
use session::SessionStore;

/// The protocol level from which the state machine records lock history.
const HISTORY_LEVEL: u32 = 2;

/// What an applied command changed, for waking blocking queries and for leader duties.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Effects {
    /// KV keys whose entries were written or deleted.
    pub kv_keys: Vec<String>,
    pub sessions_changed: bool,
    pub catalog_changed: bool,
    /// Service names whose instances or health changed.
    pub services_changed: Vec<String>,
    pub queries_changed: bool,
    pub acl_changed: bool,
    /// Sessions created with a TTL: (ID, TTL string).
    pub ttl_sessions_created: Vec<(String, String)>,
    pub sessions_destroyed: Vec<String>,
    /// Native locks: what changed, whose standing changed, lock-delays to wake.
    pub locks: LockEffects,
    /// `(lock, ms)`: holds that ended, how long each was held (from the lock history).
    pub lock_holds: Vec<(String, u64)>,
    /// `(lock, ms)`: how long each native lock's grant waited in its queue.
    pub lock_waits: Vec<(String, u64)>,
}

impl Effects {
    fn catalog(&mut self, touched: Touched) {
        self.catalog_changed |= touched.any;
        self.services_changed.extend(touched.services);
    }
}

/// What a blocking read waits on (each read says which, in [`reads`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Interest {
    /// Exactly this key.
    Key(String),
    /// Any key starting with this prefix.
    Prefix(String),
    Sessions,
    /// Anything in the catalog.
    Catalog,
    /// One service's instances and health.
    Service(String),
    Queries,
    /// The ACL tables.
    Acl,
    /// One session's standing on one native lock.
    LockStanding {
        name: String,
        session: String,
    },
    /// Native locks and KV keys under a prefix (`/v1/vigil/locks`).
    Locks(String),
    /// Not blockable.
    None,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateMachine {
    kv: KvStore,
    sessions: SessionStore,
    catalog: Catalog,
    queries: QueryStore,
    locks: LockTable,
    acl: AclStore,
    /// Latest leader clock seen; command clocks are clamped to never go backwards.
    last_now_ms: u64,
    /// Checkpointed TTL deadlines of live sessions (leader wall clock, ms). Soft state: not in
    /// snapshots, so a server restored from one arms full TTLs until the next checkpoint.
    #[serde(skip)]
    ttl_deadlines: BTreeMap<String, u64>,
    /// Autopilot's settings (`/v1/operator/autopilot/configuration`).
    autopilot: AutopilotConfig,
    /// A restore whose parts are arriving. Not in snapshot archives; in the snapshots raft
    /// sends and keeps, after the state (see `raft::state_store`), so every server stages the
    /// same bytes.
    #[serde(skip)]
    staged_restore: Option<StagedRestore>,
    /// The index of the latest op applied. From protocol level 2 on every op gets its own,
    /// strictly above the one before, also when the leader batched several into one raft
    /// entry: Consul gives every write its own index, and clients order contenders by
    /// `CreateIndex` and use `ModifyIndex` as a check-and-set token.
    index: u64,
    /// The protocol level every server applies ([`vigil_shared::PROTOCOL`]); 0 until the
    /// leader commits `Op::SetProtocol`. Below 2, the ops of one entry share its raft index and
    /// the lock queue ignores request identities, as the first release does.
    protocol: u32,
    /// The index of the latest restore: every read reports at least this index, since a
    /// restore may have replaced anything, so `X-Consul-Index` never goes back across one.
    restored_at: u64,
    /// Which request holds each waiting contender's place in a native lock's queue.
    lock_requests: Requests,
    // Fields added after the first release come last (above), so its snapshot encoding is a
    // prefix of this one's.
    /// Each lock's recent events, recorded from protocol level 2 on. Written after the state,
    /// in format 5 ([`format`]).
    #[serde(skip)]
    history: History,
}

/// The index an op of the entry at `raft_index` is applied at, at protocol level `protocol`,
/// the op before it having taken `last`: the entry's own, or (from level 2 on, where each op
/// of a batch takes an index of its own) one above the previous op's when an earlier op took
/// indexes up to or beyond it. Never below the raft index, so a blocking query's index and
/// the raft log's stay comparable.
pub fn op_index(protocol: u32, last: u64, raft_index: u64) -> u64 {
    if protocol < 2 {
        raft_index
    } else {
        raft_index.max(last + 1)
    }
}

impl StateMachine {
    pub fn kv(&self) -> &KvStore {
        &self.kv
    }

    pub fn sessions(&self) -> &SessionStore {
        &self.sessions
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The restore being staged, if its parts are arriving.
    pub fn staged_restore(&self) -> Option<&StagedRestore> {
        self.staged_restore.as_ref()
    }

    pub fn set_staged_restore(&mut self, staged: Option<StagedRestore>) {
        self.staged_restore = staged;
    }

    pub fn autopilot(&self) -> &AutopilotConfig {
        &self.autopilot
    }

    pub fn queries(&self) -> &QueryStore {
        &self.queries
    }

    pub fn locks(&self) -> &LockTable {
        &self.locks
    }

    pub fn acl(&self) -> &AclStore {
        &self.acl
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    /// The leader clock of the latest applied command.
    pub fn now_ms(&self) -> u64 {
        self.last_now_ms
    }

    /// The last checkpointed TTL deadline of session `id` (leader wall clock, ms), if any.
    pub fn ttl_deadline(&self, id: &str) -> Option<u64> {
        self.ttl_deadlines.get(&id.to_ascii_lowercase()).copied()
    }

    /// An empty state machine that already applies protocol `level` (tests, and the
    /// in-memory server double, which has no leader to raise it).
    #[cfg(any(test, feature = "test-double"))]
    pub fn at_protocol(level: u32) -> StateMachine {
        StateMachine {
            protocol: level,
            ..StateMachine::default()
        }
    }

    /// The index of the latest op applied (what a snapshot archive is taken at).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The protocol level the cluster applies.
    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// Applies a committed command from the raft entry at `raft_index`. From protocol level 2
    /// on, each op of a batch is applied at an index of its own.
    pub fn apply(&mut self, raft_index: u64, cmd: Command) -> (Response, Effects) {
        let now_ms = cmd.now_ms.max(self.last_now_ms);
        self.last_now_ms = now_ms;
        let mut fx = Effects::default();
        let response = match cmd.op {
            Op::Batch(ops) if self.protocol >= 2 => Response::Batch(
                ops.into_iter()
                    .map(|op| {
                        let index = self.next_index(raft_index);
                        self.apply_op(index, now_ms, op, &mut fx)
                    })
                    .collect(),
            ),
            op => {
                let index = self.next_index(raft_index);
                self.apply_op(index, now_ms, op, &mut fx)
            }
        };
        (response, fx)
    }

    /// The index the next op of the entry at `raft_index` is applied at ([`op_index`]).
    /// Below level 2 the op index is not kept (it is the raft index), so the state encodes
    /// in the first release's format whole ([`StateMachine::format`]).
    fn next_index(&mut self, raft_index: u64) -> u64 {
        let index = op_index(self.protocol, self.index, raft_index);
        if self.protocol >= 2 {
            self.index = index;
        }
        index
    }

    /// Applies one op at raft `index`, adding what it changed to `fx`.
    fn apply_op(&mut self, index: u64, now_ms: u64, op: Op, fx: &mut Effects) -> Response {
        match op {
            Op::Batch(ops) => Response::Batch(
                ops.into_iter()
                    .map(|op| self.apply_op(index, now_ms, op, fx))
                    .collect(),
            ),
            Op::Kv(ops) => Response::Txn(self.apply_kv(&ops, index, now_ms, fx)),
            Op::CreateSession(session) => match self.create_session(session, index, fx) {
                Ok(id) => Response::SessionCreated { id },
                Err(e) => Response::Rejected(e),
            },
            Op::DestroySession { id } => {
                self.invalidate(&id, &Cause::Destroyed, index, now_ms, fx);
                Response::Done
            }
            Op::ExpireSession { id } => {
                self.invalidate(&id, &Cause::TtlExpired, index, now_ms, fx);
                Response::Done
            }
            Op::RegisterNode { name, address } => {
                let mut t = Touched::default();
                self.catalog.upsert_node(&name, &address, index, &mut t);
                fx.catalog(t);
                Response::Done
            }
            Op::RegisterCheck(reg) => {
                if self.catalog.node(&reg.node).is_none() {
                    Response::Rejected(ApplyError::MissingNode)
                } else {
                    let mut t = Touched::default();
                    self.catalog.upsert_check(&reg, index, &mut t);
                    fx.catalog(t);
                    self.invalidate_if_critical(&reg, index, now_ms, fx);
                    Response::Done
                }
            }
            Op::CatalogRegister(reg) | Op::CatalogRegisterFull(reg) => {
                match self.catalog.validate(&reg) {
                    Err(e) => Response::Rejected(e),
                    Ok(()) => {
                        let mut t = Touched::default();
                        self.catalog.register(&reg, index, &mut t);
                        fx.catalog(t);
                        for check in &reg.checks {
                            self.invalidate_if_critical(check, index, now_ms, fx);
                        }
                        Response::Done
                    }
                }
            }
            Op::DeregisterCheck { node, check_id } => {
                let mut t = Touched::default();
                if self.catalog.remove_check(&node, &check_id, index, &mut t) {
                    fx.catalog(t);
                    self.invalidate_on_checks(&node, &[check_id], false, index, now_ms, fx);
                }
                Response::Done
            }
            Op::DeregisterService { node, service_id } => {
                let mut t = Touched::default();
                if let Some(ids) = self
                    .catalog
                    .remove_service(&node, &service_id, index, &mut t)
                {
                    fx.catalog(t);
                    self.invalidate_on_checks(&node, &ids, false, index, now_ms, fx);
                }
                Response::Done
            }
            Op::DeregisterNode { name } => {
                let mut t = Touched::default();
                if self.catalog.remove_node(&name, index, &mut t).is_some() {
                    fx.catalog(t);
                }
                let cause = Cause::NodeDeregistered { node: name.clone() };
                for id in self.sessions.on_node(&name) {
                    self.invalidate(&id, &cause, index, now_ms, fx);
                }
                Response::Done
            }
            Op::SetQuery { query, update } | Op::SetQueryFull { query, update } => {
                let session_ok = self.sessions.get(&query.session).is_some();
                let found = if update && !self.queries.contains(&query.id) {
                    Err(ApplyError::MissingQuery(query.id.clone()))
                } else {
                    Ok(())
                };
                match found.and_then(|()| self.queries.validate(&query, session_ok)) {
                    Err(e) => Response::Rejected(e),
                    Ok(()) => {
                        self.queries.set(query, index);
                        fx.queries_changed = true;
                        Response::Done
                    }
                }
            }
            Op::DeleteQuery { id } => {
                if self.queries.delete(&id, index) {
                    fx.queries_changed = true;
                    Response::Done
                } else {
                    Response::Rejected(ApplyError::MissingQuery(id))
                }
            }
            Op::ReapTombstones { before_ms } => {
                self.kv.reap(before_ms, now_ms);
                self.locks.reap(now_ms);
                Response::Done
            }
            Op::Lock(op) => {
                let legacy = self.protocol < 2;
                let applied = self.locks.apply(
                    op,
                    &self.sessions,
                    &mut self.lock_requests,
                    index,
                    now_ms,
                    legacy,
                    &mut fx.locks,
                );
                self.record_queue_events(None, index, now_ms, fx);
                match applied {
                    Ok(outcome) => Response::Lock(outcome),
                    Err(e) => Response::Rejected(e),
                }
            }
            Op::CheckpointTtls { deadlines } => {
                for (id, deadline_ms) in deadlines {
                    let id = id.to_ascii_lowercase();
                    if self.sessions.get(&id).is_some() {
                        self.ttl_deadlines.insert(id, deadline_ms);
                    }
                }
                Response::Done
            }
            Op::RestoreSnapshot { state } => restore::restore(self, &state, index, fx),
            Op::RestoreChunk {
                id,
                offset,
                bytes,
                last,
            } => restore::stage(self, id, offset, bytes, last, index, fx),
            Op::SetAutopilotConfig { config, cas } => {
                Response::Applied(self.autopilot.set(config, index, cas))
            }
            Op::Txn(ops) => self.apply_txn(index, now_ms, ops, fx),
            Op::Acl(op) => match self.acl.apply(op, index, now_ms) {
                Ok(()) => {
                    fx.acl_changed = true;
                    Response::Done
                }
                Err(e) => Response::Rejected(e),
            },
            Op::SetProtocol { level } => {
                self.protocol = self.protocol.max(level);
                Response::Done
            }
        }
    }

    fn create_session(
        &mut self,
        mut session: Session,
        index: u64,
        fx: &mut Effects,
    ) -> Result<String, ApplyError> {
        if self.catalog.node(&session.node).is_none() {
            return Err(ApplyError::MissingNode);
        }
        for check_id in session.all_checks() {
            match self.catalog.check(&session.node, &check_id) {
                None => return Err(ApplyError::MissingCheck(check_id)),
                Some(c) if c.status == HealthStatus::Critical => {
                    return Err(ApplyError::CriticalCheck(check_id));
                }
                Some(_) => {}
            }
        }
        if self.sessions.get(&session.id).is_some() {
            return Err(ApplyError::DuplicateSession);
        }
        session.create_index = index;
        session.modify_index = index;
        let id = session.id.clone();
        if !session.ttl.is_empty() {
            fx.ttl_sessions_created
                .push((id.clone(), session.ttl.clone()));
        }
        self.sessions.insert(session, index);
        fx.sessions_changed = true;
        Ok(id)
    }

    /// A check registered critical invalidates the sessions bound to it.
    fn invalidate_if_critical(&mut self, check: &Check, index: u64, now_ms: u64, fx: &mut Effects) {
        if check.status == HealthStatus::Critical {
            let ids = [check.check_id.clone()];
            self.invalidate_on_checks(&check.node, &ids, true, index, now_ms, fx);
        }
    }

    /// Invalidates every session bound to one of the node's `check_ids`, which went critical
    /// (`critical`) or were deregistered.
    fn invalidate_on_checks(
        &mut self,
        node: &str,
        check_ids: &[String],
        critical: bool,
        index: u64,
        now_ms: u64,
        fx: &mut Effects,
    ) {
        for check_id in check_ids {
            let (at, check) = (node.to_owned(), check_id.clone());
            let cause = if critical {
                Cause::CheckCritical {
                    node: at,
                    check_id: check,
                }
            } else {
                Cause::CheckDeregistered {
                    node: at,
                    check_id: check,
                }
            };
            for id in self.sessions.on_check(node, check_id) {
                self.invalidate(&id, &cause, index, now_ms, fx);
            }
        }
    }

    /// Deletes a session and releases or deletes its keys, arming lock-delay. Idempotent.
    /// `cause` is what the lock history records of the locks it held.
    fn invalidate(&mut self, id: &str, cause: &Cause, index: u64, now_ms: u64, fx: &mut Effects) {
        let Some(session) = self.sessions.remove(id, index) else {
            return;
        };
        self.ttl_deadlines.remove(&session.id.to_ascii_lowercase());
        let keys = self.kv.invalidate_session(
            &session.id,
            session.behavior,
            session.lock_delay_ns,
            index,
            now_ms,
        );
        if self.protocol >= HISTORY_LEVEL {
            for key in &keys {
                let at = |event| LockEvent::new(index, now_ms, session.id.clone(), event);
                let lost = Event::Lost {
                    cause: cause.clone(),
                };
                self.record(key, LockKind::Key, at(lost), fx);
                if let Some(left) = self.kv.lock_delay_remaining(key, now_ms) {
                    let armed = Event::LockDelay {
                        until_ms: now_ms + left,
                    };
                    self.record(key, LockKind::Key, at(armed), fx);
                }
            }
        }
        fx.kv_keys.extend(keys);
        self.locks.invalidate_session(
            &session.id,
            session.lock_delay_ns,
            &mut self.lock_requests,
            index,
            now_ms,
            &mut fx.locks,
        );
        self.record_queue_events(Some(cause), index, now_ms, fx);
        fx.sessions_changed = true;
        if self.queries.delete_for_session(&session.id, index) {
            fx.queries_changed = true;
        }
        fx.sessions_destroyed.push(session.id);
    }

    /// Applies a KV transaction at `index`, recording the held keys that changed hands.
    fn apply_kv(&mut self, ops: &[KvOp], index: u64, now_ms: u64, fx: &mut Effects) -> TxnOutcome {
        let ctx = TxnContext {
            index,
            now_ms,
            sessions: &self.sessions,
        };
        let (outcome, applied) = self.kv.apply_txn(ops, &ctx);
        fx.kv_keys.extend(applied.touched);
        if self.protocol >= HISTORY_LEVEL {
            for change in applied.changes {
                let (key, session, event) = match change {
                    KeyChange::Granted {
                        key,
                        session,
                        lock_index,
                    } => {
                        let granted = self.granted(&session, lock_index, LockMode::Exclusive, None);
                        (key, session, granted)
                    }
                    KeyChange::Released { key, session } => (key, session, Event::Released),
                    KeyChange::Deleted { key, session } => (key, session, Event::Deleted),
                };
                let event = LockEvent::new(index, now_ms, session, event);
                self.record(&key, LockKind::Key, event, fx);
            }
        }
        outcome
    }

    /// Records `event` in lock `name`'s history, and its hold or wait time for the metrics.
    fn record(&mut self, name: &str, kind: LockKind, event: LockEvent, fx: &mut Effects) {
        match &event.event {
            Event::Granted {
                waited_ms: Some(waited),
                ..
            } => fx.lock_waits.push((name.to_owned(), *waited)),
            Event::Released | Event::Lost { .. } | Event::Deleted => {
                let granted = self.history.events(name, kind).rev().find(|e| {
                    e.session == event.session && matches!(e.event, Event::Granted { .. })
                });
                if let Some(granted) = granted {
                    let held = event.at_ms.saturating_sub(granted.at_ms);
                    fx.lock_holds.push((name.to_owned(), held));
                }
            }
            _ => {}
        }
        self.history
            .record_within(name, kind, event, history::Limits::configured());
    }

    /// A grant to `session` as the history records it, with who the session is.
    fn granted(&self, session: &str, token: u64, mode: LockMode, waited_ms: Option<u64>) -> Event {
        let found = self.sessions.get(session);
        Event::Granted {
            node: found.map(|s| s.node.clone()).unwrap_or_default(),
            session_name: found.map(|s| s.name.clone()).unwrap_or_default(),
            token,
            mode,
            waited_ms,
        }
    }

    /// Records what the native lock table reported (`fx.locks.events`, taken), a loss or a
    /// waiter's leaving for `cause` when a session was invalidated.
    fn record_queue_events(
        &mut self,
        cause: Option<&Cause>,
        index: u64,
        now_ms: u64,
        fx: &mut Effects,
    ) {
        let events = std::mem::take(&mut fx.locks.events);
        if self.protocol < HISTORY_LEVEL {
            return;
        }
        for (name, session, what) in events {
            let event = match what {
                QueueEvent::Granted {
                    token,
                    mode,
                    waited_ms,
                } => self.granted(&session, token, mode, Some(waited_ms)),
                QueueEvent::Released => Event::Released,
                QueueEvent::GaveUp => Event::GaveUp { cause: None },
                QueueEvent::Lost => Event::Lost {
                    cause: cause.cloned().unwrap_or(Cause::Destroyed),
                },
                QueueEvent::WaiterLost => Event::GaveUp {
                    cause: cause.cloned(),
                },
                QueueEvent::LockDelay { until_ms } => Event::LockDelay { until_ms },
                QueueEvent::LockDelayEnded => {
                    // Only a lock-delay recorded as armed ends: a wake-up proposed again (a
                    // retry, a new leader) ends nothing new.
                    let armed = self
                        .history
                        .events(&name, LockKind::Queue)
                        .rev()
                        .find(|e| {
                            matches!(e.event, Event::LockDelay { .. } | Event::LockDelayEnded)
                        })
                        .is_some_and(|e| matches!(e.event, Event::LockDelay { .. }));
                    if !armed {
                        continue;
                    }
                    Event::LockDelayEnded
                }
            };
            let event = LockEvent::new(index, now_ms, session, event);
            self.record(&name, LockKind::Queue, event, fx);
        }
    }

    /// A node and its services; `None` when the node is unknown.
    fn node_services(&self, node: &str) -> Option<(Node, Vec<Service>)> {
        let n = self.catalog.node(node)?;
        Some((
            n.clone(),
            self.catalog.node_services(node).cloned().collect(),
        ))
    }

    /// Runs the prepared query `id_or_name`: the query and the instances it selects.
    fn execute_query(&self, id_or_name: &str) -> Option<(PreparedQuery, Vec<ServiceHealth>)> {
        self.queries
            .lookup(id_or_name)
            .map(|q| (q.clone(), query::execute(q, &self.catalog)))
    }

    /// Answers a read; returns the result and its `X-Consul-Index` (before the floor to 1),
    /// never below the latest restore's index.
    /// A read's answer and index (see [`reads`] for what each read looks at).
    #[cfg(test)]
    pub fn query(
        &self,
        query: &vigil_shared::rpc::ReadQuery,
    ) -> (vigil_shared::rpc::QueryResult, u64) {
        let found = reads::AnyRead::from(query.clone()).read(self);
        (found.output, found.index)
    }

    /// What a KV acquire (`op`, a [`KvOp::Lock`]) would be answered now if another session
    /// holds its key or a lock-delay covers it, at wall clock `now_ms`: the refusal applying it
    /// would produce, which changes nothing. `None` for anything else (it would succeed, or
    /// fail otherwise).
    pub fn refused_acquire(&self, op: &KvOp, now_ms: u64) -> Option<TxnOutcome> {
        let ctx = TxnContext {
            index: self.kv.table_index(),
            now_ms: now_ms.max(self.last_now_ms),
            sessions: &self.sessions,
        };
        let outcome = self.kv.read_txn(std::slice::from_ref(op), &ctx);
        let TxnOutcome::RolledBack(errors) = &outcome else {
            return None;
        };
        match errors.as_slice() {
            [
                TxnError {
                    error: KvOpError::LockHeld(_) | KvOpError::LockDelay { .. },
                    ..
                },
            ] => Some(outcome),
            _ => None,
        }
    }

    /// Runs a transaction of read verbs; a write verb is refused rather than run and dropped.
    fn read_txn(&self, ops: &[KvOp]) -> TxnOutcome {
        let writes: Vec<TxnError> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.is_write())
            .map(|(op_index, _)| TxnError {
                op_index,
                error: KvOpError::WriteInReadOnly,
            })
            .collect();
        if !writes.is_empty() {
            return TxnOutcome::RolledBack(writes);
        }
        let ctx = TxnContext {
            index: self.kv.table_index(),
            now_ms: self.last_now_ms,
            sessions: &self.sessions,
        };
        self.kv.read_txn(ops, &ctx)
    }

    /// Is `(key, lock_index, session)` the lock's current holder? `Err` says why not.
    pub fn check_sequencer(&self, key: &str, lock_index: u64, session: &str) -> Result<(), String> {
        let Some(entry) = self.kv.get(key) else {
            return Err(format!("key \"{key}\" does not exist"));
        };
        match entry.session.as_deref() {
            None => Err(format!("key \"{key}\" is not locked")),
            Some(holder) if !holder.eq_ignore_ascii_case(session) => {
                Err(format!("key \"{key}\" is held by another session"))
            }
            Some(_) if entry.lock_index != lock_index => Err(format!(
                "lock index {lock_index} is not current (current is {})",
                entry.lock_index
            )),
            Some(_) => Ok(()),
        }
    }
}
