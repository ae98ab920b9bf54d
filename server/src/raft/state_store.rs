//! The bridge between openraft and the [`StateMachine`]: applies committed entries, wakes the
//! blocking queries they concern, tells the leader duties about sessions, and builds and
//! installs snapshots (the whole state machine as postcard).

use std::io::Cursor;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError};
use tokio::sync::{mpsc, watch};
use vigil_shared::rpc::Response;

use super::{LogId, StorageError, StoredMembership, TypeConfig};
use crate::state::{Effects, StateMachine};
use crate::watch::Watches;

type Entry = openraft::Entry<TypeConfig>;
type Meta = SnapshotMeta<super::NodeId, openraft::BasicNode>;

/// What leader duties need to hear about applied commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    Created { id: String, ttl: String },
    Destroyed { id: String },
}

/// State shared between the raft state machine and the readers of it.
pub struct SharedState {
    state: RwLock<StateMachine>,
    pub watches: Arc<Watches>,
    /// Last applied raft index.
    applied: watch::Sender<u64>,
    events: mpsc::UnboundedSender<SessionEvent>,
}

impl SharedState {
    pub fn new(events: mpsc::UnboundedSender<SessionEvent>) -> Arc<SharedState> {
        Arc::new(SharedState {
            state: RwLock::new(StateMachine::default()),
            watches: Arc::new(Watches::default()),
            applied: watch::Sender::new(0),
            events,
        })
    }

    /// Read access to the state machine. Never hold it across an `.await`.
    pub fn read(&self) -> RwLockReadGuard<'_, StateMachine> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows the last applied raft index.
    pub fn applied_receiver(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    fn publish(&self, fx: &Effects) {
        self.watches.notify(fx);
        for (id, ttl) in &fx.ttl_sessions_created {
            // The leader-duty task lives as long as the server; a closed channel means shutdown.
            let _ = self.events.send(SessionEvent::Created {
                id: id.clone(),
                ttl: ttl.clone(),
            });
        }
        for id in &fx.sessions_destroyed {
            let _ = self.events.send(SessionEvent::Destroyed { id: id.clone() });
        }
    }
}

#[derive(Clone)]
struct StoredSnapshot {
    meta: Meta,
    data: Vec<u8>,
}

#[derive(Default)]
struct RaftMeta {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshot: Option<StoredSnapshot>,
    snapshot_seq: u64,
}

/// openraft's view of the state machine. Cloning shares everything.
#[derive(Clone)]
pub struct StateStore {
    shared: Arc<SharedState>,
    meta: Arc<Mutex<RaftMeta>>,
}

fn io_err(e: impl std::error::Error + 'static) -> openraft::AnyError {
    openraft::AnyError::new(&e)
}

impl StateStore {
    pub fn new(shared: Arc<SharedState>) -> StateStore {
        StateStore {
            shared,
            meta: Arc::new(Mutex::new(RaftMeta::default())),
        }
    }

    fn meta(&self) -> std::sync::MutexGuard<'_, RaftMeta> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data = {
            let state = self.shared.read();
            postcard::to_allocvec(&*state)
                .map_err(|e| StorageIOError::read_state_machine(io_err(e)))?
        };
        let mut meta = self.meta();
        meta.snapshot_seq += 1;
        let last = meta.last_applied;
        let snapshot_meta = Meta {
            last_log_id: last,
            last_membership: meta.membership.clone(),
            snapshot_id: format!("{}-{}", last.map_or(0, |l| l.index), meta.snapshot_seq),
        };
        meta.snapshot = Some(StoredSnapshot {
            meta: snapshot_meta.clone(),
            data: data.clone(),
        });
        Ok(Snapshot {
            meta: snapshot_meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let meta = self.meta();
        Ok((meta.last_applied, meta.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut responses = Vec::new();
        let mut effects = Vec::new();
        let mut last = None;
        {
            let mut state = self.shared.state.write().unwrap_or_else(|e| e.into_inner());
            let mut meta = self.meta();
            for entry in entries {
                last = Some(entry.log_id);
                meta.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => responses.push(Response::Done),
                    EntryPayload::Normal(cmd) => {
                        let (response, fx) = state.apply(entry.log_id.index, cmd);
                        effects.push(fx);
                        responses.push(response);
                    }
                    EntryPayload::Membership(m) => {
                        meta.membership = StoredMembership::new(Some(entry.log_id), m);
                        responses.push(Response::Done);
                    }
                }
            }
        }
        if let Some(last) = last {
            self.shared.applied.send_replace(last.index);
        }
        for fx in &effects {
            self.shared.publish(fx);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let restored: StateMachine = postcard::from_bytes(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), io_err(e)))?;
        *self.shared.state.write().unwrap_or_else(|e| e.into_inner()) = restored;
        {
            let mut m = self.meta();
            m.last_applied = meta.last_log_id;
            m.membership = meta.last_membership.clone();
            m.snapshot = Some(StoredSnapshot {
                meta: meta.clone(),
                data,
            });
        }
        if let Some(last) = meta.last_log_id {
            self.shared.applied.send_replace(last.index);
        }
        // Everything may have changed: wake every waiter so each re-reads.
        self.shared.watches.wake_everyone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.meta().snapshot.clone().map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
