//! Turning [`Op`]s into committed raft entries: batch what waits, stamp it with this leader's
//! clock and `client_write` it, mapping openraft's errors to what a caller can act on. No entry larger
//! than [`MAX_COMMAND_BYTES`] is ever proposed: the HTTP API refuses large bodies long before,
//! and this is the bound that holds whatever path a change comes by (every entry must cross
//! to a follower within one AppendEntries).

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use vigil_shared::rpc::{Command, Op, Response, ServerError};

use crate::raft::{Raft, TypeConfig};
use crate::telemetry::Proposal;

/// Milliseconds since the Unix epoch on this machine's clock.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The largest encoded [`Command`] a raft entry may carry: above the largest request the HTTP
/// API admits (a 512 KiB KV value or txn body) with room to spare.
pub const MAX_COMMAND_BYTES: usize = 2 * 1024 * 1024;

/// Raft entries a proposer keeps in flight at once. What arrives meanwhile waits and goes
/// into the next entry: every entry costs a pass through openraft's core, a replication round
/// and an apply, so one entry carrying many ops is what lets concurrent writers share them.
const MAX_IN_FLIGHT: usize = 2;
/// Most ops in one entry.
const MAX_BATCH_OPS: usize = 512;

/// An op waiting to be proposed, with its encoded size and who waits for its response.
struct Pending {
    op: Op,
    size: usize,
    reply: oneshot::Sender<Result<Response, ServerError>>,
}

/// Proposes ops for this server: each [`Proposer::propose`] joins a queue, and one task turns
/// the queue into raft entries, at most `MAX_IN_FLIGHT` at a time, each carrying every op
/// that waited (one op alone, or an [`Op::Batch`]), never more than [`MAX_COMMAND_BYTES`].
#[derive(Clone)]
pub struct Proposer {
    raft: Raft,
    queue: mpsc::UnboundedSender<Pending>,
    held: Arc<watch::Sender<bool>>,
}

/// Keeps a [`Proposer`] from proposing while it lives (see [`Proposer::hold`]).
pub struct Hold(Arc<watch::Sender<bool>>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

impl Proposer {
    /// Starts the batching task (it ends when every proposer clone is dropped).
    pub fn new(raft: Raft) -> Proposer {
        let (queue, pending) = mpsc::unbounded_channel();
        let held = Arc::new(watch::Sender::new(false));
        tokio::spawn(batch_loop(raft.clone(), pending, held.subscribe()));
        Proposer { raft, queue, held }
    }

    /// Holds every new entry back until the returned guard drops: ops still queue, and go out
    /// (or are answered `NotLeader` if leadership moved meanwhile) once it does. A leadership
    /// transfer holds writes so that the target's log stays the most recent one.
    pub fn hold(&self) -> Hold {
        self.held.send_replace(true);
        Hold(self.held.clone())
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Commits `op` through raft and returns what applying it produced.
    pub async fn propose(&self, op: Op) -> Result<Response, ServerError> {
        let size = postcard::experimental::serialized_size(&op)
            .map_err(|e| ServerError::Internal(format!("encoding a command: {e}")))?;
        if size > MAX_COMMAND_BYTES - COMMAND_OVERHEAD {
            return Err(ServerError::TooLarge {
                size,
                limit: MAX_COMMAND_BYTES,
            });
        }
        let proposal = Proposal::of(&op);
        let started = std::time::Instant::now();
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { op, size, reply })
            .map_err(|_| ServerError::ShuttingDown)?;
        let response = answer.await.map_err(|_| ServerError::ShuttingDown)??;
        proposal.committed(&response, started.elapsed());
        Ok(response)
    }
}

/// Bytes a [`Command`] adds around its ops at most (the clock, the variant tags, the batch's
/// length prefix).
const COMMAND_OVERHEAD: usize = 32;

async fn batch_loop(
    raft: Raft,
    mut pending: mpsc::UnboundedReceiver<Pending>,
    mut held: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(p) => p,
            None => match pending.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Wait until nothing holds entries back and for a free slot: everything that arrives
        // meanwhile joins this entry.
        if held.wait_for(|held| !held).await.is_err() {
            return;
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut size = first.size + COMMAND_OVERHEAD;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_OPS {
            let Ok(next) = pending.try_recv() else {
                break;
            };
            if size + next.size > MAX_COMMAND_BYTES {
                carried = Some(next);
                break;
            }
            size += next.size;
            batch.push(next);
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            commit(&raft, batch).await;
            drop(slot);
        });
    }
}

/// Commits one entry for `batch` and answers each op.
async fn commit(raft: &Raft, batch: Vec<Pending>) {
    let (mut ops, replies): (Vec<Op>, Vec<_>) = batch.into_iter().map(|p| (p.op, p.reply)).unzip();
    let op = match ops.len() {
        1 => ops.remove(0),
        _ => Op::Batch(ops),
    };
    let cmd = Command {
        now_ms: wall_ms(),
        op,
    };
    let result = raft
        .client_write(cmd)
        .await
        .map(|w| w.data)
        .map_err(map_write_error);
    let responses: Vec<Result<Response, ServerError>> = match result {
        Ok(Response::Batch(responses)) if replies.len() > 1 && responses.len() == replies.len() => {
            responses.into_iter().map(Ok).collect()
        }
        Ok(response) if replies.len() == 1 => vec![Ok(response)],
        Ok(other) => {
            let e = ServerError::Internal(format!(
                "a batch of {} ops was answered {other:?}",
                replies.len()
            ));
            vec![Err(e); replies.len()]
        }
        Err(e) => vec![Err(e); replies.len()],
    };
    for (reply, response) in replies.into_iter().zip(responses) {
        // A caller that went away needs no answer.
        let _ = reply.send(response);
    }
}

fn map_write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ServerError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => match f.leader_node {
            Some(node) => ServerError::NotLeader {
                leader: Some(node.rpc_addr),
            },
            None => ServerError::NoLeader,
        },
        RaftError::Fatal(openraft::error::Fatal::Stopped) => ServerError::ShuttingDown,
        // The entry may have reached other servers before the log failed here: the outcome is
        // unknown. The cause goes to this server's log, not to the client.
        RaftError::Fatal(fatal) => {
            tracing::error!(error = %fatal, "raft has stopped on this server");
            ServerError::Indeterminate(
                "the raft log on this server failed; the change may or may not have been applied"
                    .to_owned(),
            )
        }
        other => ServerError::Internal(other.to_string()),
    }
}
