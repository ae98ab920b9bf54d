//! The servers' request path as the simulation plays it: what `Server::at_leader` and its
//! `write`, `query` and `renew_session` do, over the simulated network. A request is served
//! where it lands when that server leads; otherwise it is forwarded once to the leader that
//! server knows, and a forwarded request that finds no leader there is refused. Writes go
//! through the server's proposer; a read confirms the leader's lease
//! (`ensure_linearizable` with the read lease) and then reads its state, as a default-mode
//! read does; a renewal confirms the lease, then asks the leader duties to restart the
//! session's timer.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver as _;
use tokio::sync::oneshot;
use vigil_server::leader::{DutyInput, Renewal, session_ttl};
use vigil_server::raft::NodeId;
use vigil_shared::kv::KvEntry;
use vigil_shared::rpc::{Op, Response, ServerError};

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
    Renew(String),
}

/// What the servers answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Response(Response),
    Entry(Option<KvEntry>),
    Renewed,
}

impl World {
    /// Client `client` sends `call` to server `at`.
    pub async fn request(
        self: &Arc<World>,
        client: usize,
        at: NodeId,
        call: Call,
    ) -> Result<Reply, ServerError> {
        let is_write = matches!(call, Call::Write(_));
        let world = Arc::clone(self);
        let answer = self
            .carry(
                Party::Client(client),
                at,
                REQUEST_TTL,
                move |node| async move { world.at_leader(node, call).await },
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
    ) -> Result<Reply, ServerError> {
        let planted = match call {
            Call::Read(_) => self.plant == Plant::StaleReads,
            Call::Renew(_) => self.plant == Plant::RenewAnywhere,
            Call::Write(_) => false,
        };
        if is_leader(&node) || planted {
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
                REQUEST_TTL,
                move |leader| async move {
                    if is_leader(&leader) {
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
            Call::Write(op) => node.proposer.propose(*op).await.map(Reply::Response),
            Call::Read(key) => {
                if self.plant != Plant::StaleReads {
                    confirmed_leader(node).await?;
                }
                Ok(Reply::Entry(node.shared.read().kv().get(&key).cloned()))
            }
            Call::Renew(id) if self.plant == Plant::RenewAnywhere && !is_leader(node) => {
                match node.shared.read().sessions().get(&id) {
                    Some(_) => Ok(Reply::Renewed),
                    None => Err(ServerError::SessionNotFound(id)),
                }
            }
            Call::Renew(id) => {
                confirmed_leader(node).await?;
                let ttl = {
                    let state = node.shared.read();
                    let session = state
                        .sessions()
                        .get(&id)
                        .ok_or_else(|| ServerError::SessionNotFound(id.clone()))?;
                    session_ttl(&session.ttl)
                };
                let Some(ttl) = ttl else {
                    return Ok(Reply::Renewed);
                };
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

/// `Server::is_leader`: leading, with raft running.
fn is_leader(node: &Node) -> bool {
    let metrics = node.raft.metrics();
    let m = metrics.borrow_watched();
    m.running_state.is_ok() && m.state == ServerState::Leader
}

/// `Server::confirmed_leader`: leading under a read lease a quorum acknowledged, with
/// everything committed applied.
async fn confirmed_leader(node: &Node) -> Result<(), ServerError> {
    if !is_leader(node) {
        return Err(ServerError::NoLeader);
    }
    let lease = vigil_server::read_lease(timing());
    node.raft
        .ensure_linearizable(openraft::LinearizerOption::new(Some(lease), true))
        .await
        .map_err(|_| ServerError::NoLeader)?;
    Ok(())
}
