//! The servers' request path as the simulation plays it: what `Server::at_leader` and its
//! `write`, `query` and `renew_session` do, over the simulated network. A request is served
//! where it lands when that server leads; otherwise it is forwarded once to the leader that
//! server knows, and a forwarded request that finds no leader there is refused. Writes go
//! through the server's proposer; a read confirms the leader's lease
//! (the server's own `confirm_lease`) and then reads its state, as a default-mode read does;
//! a blocking read is answered by the server's own `read_local`, in the steps `Server::query`
//! takes (the lease confirmed and a first look, then the wait on the server's watch
//! registry); a renewal confirms the lease, then asks the leader duties to restart the
//! session's timer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use tokio::sync::oneshot;
use vigil_server::leader::{DutyInput, Renewal, session_ttl};
use vigil_server::raft::NodeId;
use vigil_server::server::{confirm_lease, leads, read_local};
use vigil_shared::kv::KvEntry;
use vigil_shared::rpc::{
    Consistency, Op, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};

use crate::net::Lost;
use crate::world::{Node, Party, Plant, World, timing};

/// How long a client waits for an answer (the agent's deadline for one attempt).
const REQUEST_TTL: Duration = Duration::from_secs(5);

/// What a client asks of the servers.
#[derive(Debug, Clone)]
pub enum Call {
    Write(Box<Op>),
    /// A default-mode read of one key.
    Read(String),
    /// A default-mode blocking read (`?index=&wait=`): answered once its index is above
    /// `min_index`, or after `wait_ms`.
    Wait {
        query: ReadQuery,
        min_index: u64,
        wait_ms: u64,
    },
    Renew(String),
}

/// What the servers answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Response(Response),
    Entry(Option<KvEntry>),
    /// A blocking read's answer and its index (`X-Consul-Index`, never 0).
    Query(Box<QueryResult>, u64),
    Renewed,
}

/// The time a request spent on the simulated network (every leg it travelled, a forwarded
/// one's too), in microseconds: what a blocking read's answer time is allowed beyond its wait.
#[derive(Debug, Clone, Default)]
pub struct Legs(Arc<AtomicU64>);

impl Legs {
    /// Travels one leg of `delay`, adding the time it took (tokio's timer rounds a sleep up to
    /// its next millisecond).
    pub async fn travel(&self, delay: Duration) {
        let start = tokio::time::Instant::now();
        tokio::time::sleep(delay).await;
        let took = start.elapsed();
        self.0.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn total(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }
}

/// How long a client waits for the answer to `call` (a blocking read's wait on top).
fn deadline(call: &Call) -> Duration {
    match call {
        Call::Wait { wait_ms, .. } => REQUEST_TTL + Duration::from_millis(*wait_ms),
        _ => REQUEST_TTL,
    }
}

impl World {
    /// Client `client` sends `call` to server `at`; `legs` adds up its time on the network.
    pub async fn request(
        self: &Arc<World>,
        client: usize,
        at: NodeId,
        call: Call,
        legs: &Legs,
    ) -> Result<Reply, ServerError> {
        let is_write = matches!(call, Call::Write(_));
        let world = Arc::clone(self);
        let ttl = deadline(&call);
        let forward = legs.clone();
        let answer = self
            .carry(
                Party::Client(client),
                at,
                ttl,
                legs,
                move |node| async move { world.at_leader(node, call, &forward).await },
            )
            .await;
        answer.unwrap_or_else(|lost| Err(lost_error(lost, is_write)))
    }

    /// Serves `call` on `node` if it leads (or, with stale reads planted, any read), and
    /// forwards it to the leader otherwise.
    async fn at_leader(
        self: &Arc<World>,
        node: Arc<Node>,
        call: Call,
        legs: &Legs,
    ) -> Result<Reply, ServerError> {
        let planted = match call {
            Call::Read(_) | Call::Wait { .. } => self.plant == Plant::StaleReads,
            Call::Renew(_) => self.plant == Plant::RenewAnywhere,
            Call::Write(_) => false,
        };
        if leads(&node.raft) || planted {
            return self.serve(&node, call).await;
        }
        let leader = {
            let metrics = node.raft.metrics();
            metrics.borrow_watched().current_leader
        };
        let Some(leader) = leader.filter(|l| *l != node.id) else {
            return Err(ServerError::NoLeader);
        };
        let is_write = matches!(call, Call::Write(_));
        let world = Arc::clone(self);
        let forwarded = self
            .carry(
                Party::Server(node.id),
                leader,
                deadline(&call),
                legs,
                move |leader| async move {
                    if leads(&leader.raft) {
                        world.serve(&leader, call).await
                    } else {
                        Err(ServerError::NoLeader)
                    }
                },
            )
            .await;
        forwarded.unwrap_or_else(|lost| Err(lost_error(lost, is_write)))
    }

    async fn serve(&self, node: &Node, call: Call) -> Result<Reply, ServerError> {
        if self.verbose {
            self.note(format!("node {} serves {call:?}", node.id));
        }
        match call {
            Call::Write(op) => match (*op, self.plant) {
                (Op::DestroySession { .. }, Plant::LostDestroy) => {
                    Ok(Reply::Response(Response::Done))
                }
                (Op::CreateSession(mut session), Plant::NoLockDelay | Plant::UnboundChecks) => {
                    if self.plant == Plant::NoLockDelay {
                        session.lock_delay_ns = 0;
                    } else {
                        session.node_checks.clear();
                    }
                    let op = Op::CreateSession(session);
                    node.proposer.propose(op).await.map(Reply::Response)
                }
                (op, _) => node.proposer.propose(op).await.map(Reply::Response),
            },
            Call::Read(key) => {
                if self.plant != Plant::StaleReads {
                    confirm_lease(&node.raft, vigil_server::read_lease(timing())).await?;
                }
                Ok(Reply::Entry(node.shared.read().kv().get(&key).cloned()))
            }
            Call::Wait {
                query,
                min_index,
                wait_ms,
            } => {
                let opts = QueryOptions {
                    consistency: match self.plant {
                        Plant::StaleReads => Consistency::Stale,
                        _ => Consistency::Default,
                    },
                    min_index: match self.plant {
                        Plant::EarlyWakes => 0,
                        _ => min_index,
                    },
                    wait_ms: match self.plant {
                        Plant::WaitIgnored => wait_ms * 4,
                        _ => wait_ms,
                    },
                };
                let lease = vigil_server::read_lease(timing());
                let (result, index) = read_local(
                    &node.raft,
                    &node.shared,
                    lease,
                    opts,
                    query,
                    |_| Ok(()),
                    node.stopping(),
                )
                .await?;
                Ok(Reply::Query(Box::new(result), index.max(1)))
            }
            Call::Renew(id) if self.plant == Plant::RenewAnywhere && !leads(&node.raft) => {
                match node.shared.read().sessions().get(&id) {
                    Some(_) => Ok(Reply::Renewed),
                    None => Err(ServerError::SessionNotFound(id)),
                }
            }
            Call::Renew(id) => {
                confirm_lease(&node.raft, vigil_server::read_lease(timing())).await?;
                let ttl = {
                    let state = node.shared.read();
                    let session = state
                        .sessions()
                        .get(&id)
                        .ok_or_else(|| ServerError::SessionNotFound(id.clone()))?;
                    session_ttl(&session.ttl)
                };
                let Some(mut ttl) = ttl else {
                    return Ok(Reply::Renewed);
                };
                if self.plant == Plant::LongRenewals {
                    ttl *= 8;
                }
                let (renewed, outcome) = oneshot::channel();
                node.duties
                    .send(DutyInput::Renew {
                        id: id.clone(),
                        ttl,
                        renewed,
                    })
                    .map_err(|_| ServerError::ShuttingDown)?;
                match outcome.await.map_err(|_| ServerError::ShuttingDown)? {
                    Renewal::Renewed => Ok(Reply::Renewed),
                    Renewal::Expiring => Err(ServerError::SessionNotFound(id)),
                    Renewal::NotLeading => Err(ServerError::NoLeader),
                }
            }
        }
    }
}

/// What a caller hears of a message that got no answer.
fn lost_error(lost: Lost, is_write: bool) -> ServerError {
    match lost {
        Lost::Refused => ServerError::Unavailable(lost.to_string()),
        Lost::TimedOut if is_write => ServerError::Indeterminate(lost.to_string()),
        Lost::TimedOut => ServerError::Unavailable(lost.to_string()),
    }
}
