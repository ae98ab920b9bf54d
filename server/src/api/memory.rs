//! [`MemoryServer`]: a test double of the servers with no raft and no network. Each write is
//! applied at once to one [`StateMachine`] at the next index, and wakes the blocking reads it
//! concerns through the same [`Watches`] and blocking loop a server uses; every read is
//! answered from that state whatever its consistency mode. Its clock is tokio's, so lock-delays,
//! session TTLs and blocking waits follow paused time in tests.
//!
//! It plays the leader's timed duties with the leader's own timers: a TTL session expires
//! TTL × 2 after its creation or last renewal (then it is destroyed, as the leader commits it),
//! and a native lock whose lock-delay holds up waiters is woken when it ends. Not modelled:
//! elections and leaderless windows, forwarding, replication lag and stale reads that lag,
//! TTL checkpoints, membership reconciliation, tombstone reaping, ACL bootstrap by a leader,
//! the blocking-query limit, and changing the server set (operator requests on peers answer
//! as a lone server would).

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_shared::SESSION_TTL_MULTIPLIER;
use vigil_shared::lock::LockOp;
use vigil_shared::operator::{
    AutopilotHealth, OperatorError, OperatorReply, OperatorRequest, PeerRef, ServerHealth,
};
use vigil_shared::rpc::ServerError;
use vigil_shared::rpc::calls::{PeerInfo, ServerNode, StatusInfo};
use vigil_shared::rpc::{Command, Op, QueryMeta, QueryOptions, ReadQuery, Response};
use vigil_shared::session::{Session, check_ttl};

use super::{QueryFuture, ServerApi};
use crate::leader::{LockDelayTimers, SessionTimers, session_ttl};
use crate::operator;
use crate::raft::NodeId;
use crate::snapshot::Archive;
use crate::state::StateMachine;
use crate::state::reads::AnyRead;
use crate::watch::{Watches, blocking_read};

/// The double's one server, as status and operator requests name it.
const NODE_ID: NodeId = 1;
const NODE_NAME: &str = "memory";
const RPC_ADDR: &str = "127.0.0.1:8300";

/// The servers as one in-memory state machine; see the module comment for what it models.
pub struct MemoryServer {
    core: Arc<Core>,
    /// Ends blocking reads and the timer task when the double is dropped.
    stop: CancellationToken,
}

/// What writes, reads and the timer task share.
struct Core {
    state: Mutex<Applied>,
    watches: Arc<Watches>,
    /// Smallest session TTL accepted, as a server's `session_ttl_min`.
    ttl_min: Duration,
    /// The wall clock at creation and tokio's instant then: now is `epoch_ms` plus tokio time
    /// elapsed since, so paused time moves it.
    epoch_ms: u64,
    started: Instant,
    timers: mpsc::UnboundedSender<TimerInput>,
}

struct Applied {
    machine: StateMachine,
    /// The index of the last applied op (the raft index a server would stamp it with).
    index: u64,
}

/// What applied ops tell the timer task, as a server's state store tells its leader duties.
enum TimerInput {
    /// A TTL session created or renewed `at`: expire it TTL × 2 from then.
    Renew {
        id: String,
        ttl: Duration,
        at: Instant,
    },
    Destroyed {
        id: String,
    },
    LockDelay {
        name: String,
        until_ms: u64,
    },
}

impl Default for MemoryServer {
    fn default() -> MemoryServer {
        MemoryServer::new(Duration::from_secs(10))
    }
}

impl MemoryServer {
    /// An empty state at index 0, accepting session TTLs of `ttl_min` and more. Spawns the
    /// timer task on the current tokio runtime; it ends when the double is dropped.
    pub fn new(ttl_min: Duration) -> MemoryServer {
        let (timers, inputs) = mpsc::unbounded_channel();
        let core = Arc::new(Core {
            state: Mutex::new(Applied {
                machine: StateMachine::at_protocol(vigil_shared::PROTOCOL),
                index: 0,
            }),
            watches: Arc::new(Watches::default()),
            ttl_min,
            epoch_ms: crate::proposer::wall_ms(),
            started: Instant::now(),
            timers,
        });
        let stop = CancellationToken::new();
        tokio::spawn(run_timers(Arc::downgrade(&core), inputs, stop.clone()));
        MemoryServer { core, stop }
    }

    /// The index of the last applied write.
    pub fn index(&self) -> u64 {
        self.core.state.lock().index
    }

    /// Reads the state directly (no blocking, no meta).
    pub fn read<T>(&self, f: impl FnOnce(&StateMachine) -> T) -> T {
        f(&self.core.state.lock().machine)
    }
}

impl Drop for MemoryServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Core {
    fn now_ms(&self) -> u64 {
        self.epoch_ms + millis(self.started.elapsed())
    }

    /// Applies `op` at the next index, then wakes its readers and tells the timers.
    fn apply(&self, op: Op) -> Response {
        let command = Command {
            now_ms: self.now_ms(),
            op,
        };
        let (response, fx) = {
            let mut state = self.state.lock();
            state.index += 1;
            let index = state.index;
            state.machine.apply(index, command)
        };
        self.watches.notify(&fx);
        // The timer task outlives every write but the ones racing the double's drop.
        for (id, ttl) in fx.ttl_sessions_created {
            if let Some(ttl) = session_ttl(&ttl) {
                let at = Instant::now();
                let _ = self.timers.send(TimerInput::Renew { id, ttl, at });
            }
        }
        for id in fx.sessions_destroyed {
            let _ = self.timers.send(TimerInput::Destroyed { id });
        }
        for (name, until_ms) in fx.locks.delays {
            let _ = self.timers.send(TimerInput::LockDelay { name, until_ms });
        }
        response
    }

    fn meta(index: u64) -> QueryMeta {
        QueryMeta {
            index: index.max(1),
            known_leader: true,
            last_contact_ms: 0,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The leader's timed duties on the double: TTL expiries and lock-delay ends, each committed
/// as the leader would commit it.
async fn run_timers(
    core: Weak<Core>,
    mut inputs: mpsc::UnboundedReceiver<TimerInput>,
    stop: CancellationToken,
) {
    let mut sessions = SessionTimers::default();
    let mut lock_delays = LockDelayTimers::default();
    loop {
        let op = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            input = inputs.recv() => {
                let Some(core) = core.upgrade() else { return };
                match input {
                    Some(TimerInput::Renew { id, ttl, at }) => {
                        // Armed from when it happened, however late this task hears of it.
                        let left = (ttl * SESSION_TTL_MULTIPLIER).saturating_sub(at.elapsed());
                        sessions.arm(&id, ttl, left, core.now_ms() + millis(left));
                    }
                    Some(TimerInput::Destroyed { id }) => sessions.clear(&id),
                    Some(TimerInput::LockDelay { name, until_ms }) => {
                        lock_delays.arm(&name, until_ms, core.now_ms());
                    }
                    None => return,
                }
                continue;
            }
            Some(id) = sessions.next_expired(), if !sessions.is_empty() => {
                Op::ExpireSession { id }
            }
            Some(name) = lock_delays.next_due(), if !lock_delays.is_empty() => {
                Op::Lock(LockOp::Wake { name })
            }
        };
        let Some(core) = core.upgrade() else { return };
        core.apply(op);
    }
}

impl ServerApi for MemoryServer {
    fn write(&self, op: Op) -> BoxFuture<'_, Result<Response, ServerError>> {
        Box::pin(async move {
            if let Op::CreateSession(session) = &op {
                check_ttl(&session.ttl, self.core.ttl_min)
                    .map_err(ServerError::InvalidSessionTtl)?;
            }
            Ok(self.core.apply(op))
        })
    }

    fn query(&self, opts: QueryOptions, query: ReadQuery) -> QueryFuture<'_> {
        Box::pin(async move {
            let read = AnyRead::from(query);
            let look = || read.read(&self.core.state.lock().machine);
            let admit = |_: &_| Ok::<(), ServerError>(());
            let (result, index) =
                blocking_read(&self.core.watches, opts, look, admit, &self.stop).await?;
            Ok((result, Core::meta(index)))
        })
    }

    fn renew<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Session, ServerError>> {
        Box::pin(async move {
            let session = self
                .read(|state| state.sessions().get(id).cloned())
                .ok_or_else(|| ServerError::SessionNotFound(id.to_owned()))?;
            if let Some(ttl) = session_ttl(&session.ttl) {
                self.core
                    .timers
                    .send(TimerInput::Renew {
                        id: session.id.clone(),
                        ttl,
                        at: Instant::now(),
                    })
                    .map_err(|_| ServerError::ShuttingDown)?;
            }
            Ok(session)
        })
    }

    fn operator(
        &self,
        request: OperatorRequest,
    ) -> BoxFuture<'_, Result<OperatorReply, OperatorError>> {
        Box::pin(async move {
            match request {
                OperatorRequest::RemovePeer(PeerRef::Id(id)) if id == NODE_ID => {
                    Err(OperatorError::RemoveLeader(operator::format_id(id)))
                }
                OperatorRequest::RemovePeer(PeerRef::Id(id)) => {
                    Err(OperatorError::UnknownId(operator::format_id(id)))
                }
                OperatorRequest::RemovePeer(PeerRef::Address(address)) if address == RPC_ADDR => {
                    Err(OperatorError::RemoveLeader(operator::format_id(NODE_ID)))
                }
                OperatorRequest::RemovePeer(PeerRef::Address(address)) => {
                    Err(OperatorError::UnknownAddress(address))
                }
                OperatorRequest::TransferLeader { .. } => Err(OperatorError::NoOtherVoters),
                OperatorRequest::AutopilotHealth => {
                    let index = self.index();
                    Ok(OperatorReply::Health(AutopilotHealth {
                        healthy: true,
                        failure_tolerance: 0,
                        servers: vec![ServerHealth {
                            id: NODE_ID,
                            name: NODE_NAME.to_owned(),
                            address: RPC_ADDR.to_owned(),
                            serf_status: "alive".to_owned(),
                            leader: true,
                            voter: true,
                            last_index: index,
                            last_term: 1,
                            healthy: true,
                        }],
                    }))
                }
                OperatorRequest::SnapshotSave => {
                    let state = self.core.state.lock();
                    let archive = Archive::of(&state.machine, state.index)?;
                    Ok(OperatorReply::Snapshot {
                        index: state.index,
                        archive: archive.encode(),
                    })
                }
                OperatorRequest::SnapshotRestore(bytes) => {
                    let archive = Archive::decode(&bytes)?;
                    for part in operator::restore_parts(&archive) {
                        operator::part_restored(self.core.apply(part))?;
                    }
                    Ok(OperatorReply::Done)
                }
                OperatorRequest::AutopilotGet => Ok(OperatorReply::Autopilot(
                    self.read(|state| state.autopilot().clone()),
                )),
                OperatorRequest::AutopilotSet { config, cas } => {
                    match self.core.apply(Op::SetAutopilotConfig { config, cas }) {
                        Response::Applied(applied) => Ok(OperatorReply::Applied(applied)),
                        other => Err(ServerError::Internal(format!(
                            "autopilot's settings were answered {other:?}"
                        ))
                        .into()),
                    }
                }
            }
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<StatusInfo, ServerError>> {
        Box::pin(async move {
            Ok(StatusInfo {
                leader: Some(RPC_ADDR.to_owned()),
                peers: vec![PeerInfo {
                    node_id: NODE_ID,
                    node: ServerNode {
                        name: NODE_NAME.to_owned(),
                        rpc_addr: RPC_ADDR.to_owned(),
                    },
                    leader: true,
                    voter: true,
                }],
                config_index: 1,
            })
        })
    }

    fn is_shutting_down(&self) -> bool {
        self.stop.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use vigil_shared::lock::{LockMode, LockOutcome};

    use super::*;

    const LOCK_DELAY: Duration = Duration::from_secs(5);

    fn session(id: &str, lock_delay: Duration) -> Session {
        Session {
            lock_delay_ns: lock_delay.as_nanos() as u64,
            id: id.to_owned(),
            node: "n1".to_owned(),
            ..Session::default()
        }
    }

    fn acquire(session: &str) -> Op {
        Op::Lock(LockOp::Acquire {
            name: "db".to_owned(),
            session: session.to_owned(),
            mode: LockMode::Exclusive,
            limit: 1,
            try_only: false,
        })
    }

    fn holders(servers: &MemoryServer) -> Vec<String> {
        servers.read(|state| {
            state
                .locks()
                .get("db")
                .map(|l| l.holders.iter().map(|h| h.session.clone()).collect())
                .unwrap_or_default()
        })
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_lost_by_its_holder_goes_to_the_next_waiter_when_its_lock_delay_ends() {
        let servers = MemoryServer::default();
        let node = Op::RegisterNode {
            name: "n1".to_owned(),
            address: "127.0.0.1".to_owned(),
        };
        servers.write(node).await.expect("node");
        for id in ["a", "b"] {
            let created = servers
                .write(Op::CreateSession(session(id, LOCK_DELAY)))
                .await;
            assert!(
                matches!(created, Ok(Response::SessionCreated { .. })),
                "{created:?}"
            );
        }
        let held = servers.write(acquire("a")).await.expect("acquire");
        assert!(
            matches!(held, Response::Lock(LockOutcome::Held { .. })),
            "{held:?}"
        );
        let queued = servers.write(acquire("b")).await.expect("acquire");
        assert!(
            matches!(queued, Response::Lock(LockOutcome::Queued { .. })),
            "{queued:?}"
        );

        // The holder's session is invalidated: the lock is free but in its lock-delay, so the
        // waiter is not granted yet.
        let destroy = Op::DestroySession { id: "a".to_owned() };
        servers.write(destroy).await.expect("destroy");
        settle().await;
        assert!(holders(&servers).is_empty());
        tokio::time::advance(LOCK_DELAY - Duration::from_millis(1)).await;
        settle().await;
        assert!(
            holders(&servers).is_empty(),
            "granted inside the lock-delay"
        );

        // When it ends, the double's timer wakes the lock and the waiter holds it.
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(holders(&servers), ["b"]);
    }
}
