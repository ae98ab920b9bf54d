//! Turning [`Op`]s into committed raft entries: batch what waits, stamp it with this leader's
//! clock and `client_write` it, mapping openraft's errors to what a caller can act on. No entry larger
//! than [`MAX_COMMAND_BYTES`] is ever proposed: the HTTP API refuses large bodies long before,
//! and this is the bound that holds whatever path a change comes by (every entry must cross
//! to a follower within one AppendEntries).

use std::cell::Cell;
use std::sync::Arc;

use openraft::error::ClientWriteError;
use openraft::raft::ClientWriteResult;
use openraft::raft::responder::Responder;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use vigil_shared::rpc::{Command, Op, Response, ServerError};

use crate::raft::{Raft, TypeConfig};
use crate::telemetry::Proposal;

thread_local! {
    /// Set by [`follow_tokio_clock`]: the wall clock then, and tokio's instant then.
    static TOKIO_WALL_CLOCK: Cell<Option<(u64, tokio::time::Instant)>> = const { Cell::new(None) };
}

/// Milliseconds since the Unix epoch on this machine's clock, or on the clock this thread
/// follows ([`follow_tokio_clock`]).
pub fn wall_ms() -> u64 {
    if let Some((epoch_ms, at)) = TOKIO_WALL_CLOCK.with(Cell::get) {
        return epoch_ms.saturating_add(at.elapsed().as_millis() as u64);
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Makes [`wall_ms`] on this thread `epoch_ms` plus tokio's time elapsed since this call
/// (`None`: the machine's clock again). A deterministic simulation runs every server on one
/// thread with tokio's clock paused: their wall clock (which stamps every command and arms the
/// leader's TTL and lock-delay timers) then moves only as the simulation advances time. Call
/// it inside the runtime.
pub fn follow_tokio_clock(epoch_ms: Option<u64>) {
    let clock = epoch_ms.map(|epoch_ms| (epoch_ms, tokio::time::Instant::now()));
    TOKIO_WALL_CLOCK.with(|c| c.set(clock));
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

/// An op waiting to be proposed, with its encoded size, the leader ID it may commit under
/// (any, if `None`) and who waits for its response.
struct Pending {
    op: Op,
    size: usize,
    leader: Option<LeaderId>,
    reply: Reply,
}

/// A raft leader ID (term and node): what a term's proposals are bound to.
pub type LeaderId = openraft::type_config::alias::CommittedLeaderIdOf<TypeConfig>;

/// Where the caller of one op waits for its answer.
type Reply = oneshot::Sender<Result<Response, ServerError>>;

/// Proposes ops for this server: each [`Proposer::propose`] joins a queue, and one task turns
/// the queue into raft entries, at most `MAX_IN_FLIGHT` at a time, each carrying every op
/// that waited (one op alone, or an [`Op::Batch`]), never more than [`MAX_COMMAND_BYTES`].
#[derive(Clone)]
pub struct Proposer {
    raft: Raft,
    queue: mpsc::UnboundedSender<Pending>,
    held: Arc<watch::Sender<bool>>,
    /// The leader ID this proposer's ops commit under ([`Proposer::bound_to`]).
    leader: Option<LeaderId>,
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
        Proposer {
            raft,
            queue,
            held,
            leader: None,
        }
    }

    /// This proposer, with every op it proposes refused (`NotLeader`) unless this server
    /// still leads under `leader` when raft appends it. A leader's own duties decide on what
    /// their term knows (a TTL expiry on a timer no renewal reset, a checkpoint of deadlines
    /// it tracks); an op that waited out the term in the queue must not be appended by a later
    /// term of the same server, which has acknowledged renewals of that session since.
    pub fn bound_to(&self, leader: LeaderId) -> Proposer {
        Proposer {
            leader: Some(leader),
            ..self.clone()
        }
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
            .send(Pending {
                op,
                size,
                leader: self.leader,
                reply,
            })
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
        let first_leader = first.leader;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_OPS {
            let Ok(next) = pending.try_recv() else {
                break;
            };
            // One entry, one condition: ops bound to another leader ID (or to none) wait for
            // the next.
            if size + next.size > MAX_COMMAND_BYTES || next.leader != first_leader {
                carried = Some(next);
                break;
            }
            size += next.size;
            batch.push(next);
        }
        let (cmd, replies) = entry(batch);
        let answers = Answers {
            replies,
            _slot: slot,
        };
        let answer = Answer(Box::new(move |result: ClientWriteResult<TypeConfig>| {
            answers.send(result.map(|w| w.data));
        }));
        let write = raft.write(cmd).responder(answer);
        let write = match first_leader {
            Some(leader) => write.with_leader(leader),
            None => write,
        };
        if write.await.is_err() {
            // raft's core has stopped; the answer, dropped with the refused message, told the
            // callers, and the server's failure watch reports why.
            return;
        }
    }
}

/// The entry for `batch` (one op alone, or an [`Op::Batch`]), stamped with this leader's
/// clock, and who waits for each op.
fn entry(batch: Vec<Pending>) -> (Command, Vec<Reply>) {
    let (mut ops, replies): (Vec<Op>, Vec<Reply>) =
        batch.into_iter().map(|p| (p.op, p.reply)).unzip();
    let op = match ops.len() {
        1 => ops.remove(0),
        _ => Op::Batch(ops),
    };
    let cmd = Command {
        now_ms: wall_ms(),
        op,
    };
    (cmd, replies)
}

/// openraft's responder for the proposer's entries (`TypeConfig::Responder`): what answers an
/// entry's callers, run by the apply itself, so no task stands between a commit and them.
pub struct Answer<T>(Box<dyn FnOnce(T) + Send>);

impl<T: openraft::OptionalSend + 'static> Responder<TypeConfig, T> for Answer<T> {
    fn on_complete(self, result: T) {
        (self.0)(result);
    }
}

/// Who waits for one entry, and its in-flight slot (given back when they are answered).
struct Answers {
    replies: Vec<Reply>,
    _slot: OwnedSemaphorePermit,
}

impl Answers {
    /// Answers each op with its part of what applying the entry produced.
    fn send(mut self, result: Result<Response, ClientWriteError<TypeConfig>>) {
        let replies = std::mem::take(&mut self.replies);
        let n = replies.len();
        let responses: Vec<Result<Response, ServerError>> = match result.map_err(write_error) {
            Ok(Response::Batch(responses)) if n > 1 && responses.len() == n => {
                responses.into_iter().map(Ok).collect()
            }
            Ok(response) if n == 1 => vec![Ok(response)],
            Ok(other) => {
                let e = ServerError::Internal(format!("a batch of {n} ops was answered {other:?}"));
                vec![Err(e); n]
            }
            Err(e) => vec![Err(e); n],
        };
        for (reply, response) in replies.into_iter().zip(responses) {
            // A caller that went away needs no answer.
            let _ = reply.send(response);
        }
    }
}

impl Drop for Answers {
    /// An entry raft dropped unanswered (its core stopped): the change may or may not have
    /// been applied.
    fn drop(&mut self) {
        for reply in self.replies.drain(..) {
            let _ = reply.send(Err(ServerError::Indeterminate(
                "raft stopped on this server before the change was answered; it may or may not have been applied".to_owned(),
            )));
        }
    }
}

/// What a caller is told of a write raft refused.
fn write_error(e: ClientWriteError<TypeConfig>) -> ServerError {
    match e {
        ClientWriteError::ForwardToLeader(f) => match f.leader_node {
            Some(node) => ServerError::NotLeader {
                leader: Some(node.rpc_addr),
            },
            None => ServerError::NoLeader,
        },
        other => ServerError::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers for `n` ops holding one of `slots`, and where each op's caller waits.
    fn waiting(
        n: usize,
        slots: &Arc<Semaphore>,
    ) -> (
        Answers,
        Vec<oneshot::Receiver<Result<Response, ServerError>>>,
    ) {
        let (replies, answers): (Vec<_>, Vec<_>) = (0..n).map(|_| oneshot::channel()).unzip();
        let slot = slots.clone().try_acquire_owned().expect("a free slot");
        (
            Answers {
                replies,
                _slot: slot,
            },
            answers,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_thread_that_follows_tokio_clock_moves_its_wall_clock_with_it() {
        follow_tokio_clock(Some(1_000));
        assert_eq!(wall_ms(), 1_000);
        tokio::time::advance(std::time::Duration::from_millis(2_500)).await;
        assert_eq!(wall_ms(), 3_500);
        follow_tokio_clock(None);
        assert!(wall_ms() > 1_700_000_000_000, "the machine's clock again");
    }

    #[test]
    fn each_op_of_a_batch_gets_its_own_response() {
        let slots = Arc::new(Semaphore::new(1));
        let (answers, mut rx) = waiting(2, &slots);
        answers.send(Ok(Response::Batch(vec![
            Response::Done,
            Response::Applied(false),
        ])));
        assert!(matches!(rx[0].try_recv(), Ok(Ok(Response::Done))));
        assert!(matches!(rx[1].try_recv(), Ok(Ok(Response::Applied(false)))));
        assert_eq!(slots.available_permits(), 1, "the slot is given back");
    }

    #[test]
    fn an_entry_dropped_unanswered_is_indeterminate_for_every_op() {
        let slots = Arc::new(Semaphore::new(1));
        let (answers, rx) = waiting(2, &slots);
        drop(answers);
        for mut rx in rx {
            assert!(matches!(
                rx.try_recv(),
                Ok(Err(ServerError::Indeterminate(_)))
            ));
        }
        assert_eq!(slots.available_permits(), 1, "the slot is given back");
    }
}
