//! KV acquires without the herd's cost. A release wakes every waiter of a Consul-style lock, and
//! each asks to acquire; only one can win. On the leader, acquires of one key take turns: each
//! waits for the one before it to be applied, then an acquire another session's hold (or a
//! lock-delay) refuses is answered as a linearizable read, with no raft entry, as it changes
//! nothing. So a handoff costs the release and the winning acquire, whatever the number of
//! waiters.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;
use vigil_shared::kv::KvOp;

use super::*;
use crate::proposer::wall_ms;

/// The keys acquires are being decided for on this leader, each with its queue.
#[derive(Default)]
pub(super) struct AcquireTurns {
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// An acquire's turn on its key, from the moment it queues for it; the next acquire of the key
/// goes when it is dropped, and the key leaves the table with its last acquire (a waiter that
/// gives up included).
pub(super) struct AcquireTurn<'a> {
    turns: &'a AcquireTurns,
    key: String,
    queue: Option<Arc<tokio::sync::Mutex<()>>>,
    turn: Option<OwnedMutexGuard<()>>,
}

impl Drop for AcquireTurn<'_> {
    fn drop(&mut self) {
        drop(self.turn.take());
        let Some(queue) = self.queue.take() else {
            return;
        };
        // New acquires clone the queue under the table's lock: counted here, under it too.
        let mut keys = self.turns.keys.lock();
        drop(queue);
        if keys
            .get(&self.key)
            .is_some_and(|queue| Arc::strong_count(queue) == 1)
        {
            keys.remove(&self.key);
        }
    }
}

impl AcquireTurns {
    /// Waits for the acquires of `key` before this one to be decided.
    async fn turn(&self, key: &str) -> AcquireTurn<'_> {
        let queue = Arc::clone(self.keys.lock().entry(key.to_owned()).or_default());
        let mut turn = AcquireTurn {
            turns: self,
            key: key.to_owned(),
            queue: Some(Arc::clone(&queue)),
            turn: None,
        };
        turn.turn = Some(queue.lock_owned().await);
        turn
    }
}

/// The acquire `op` is, when it is a single one (the KV endpoint's `?acquire`, or a transaction
/// of one lock verb).
fn single_acquire(op: &Op) -> Option<&KvOp> {
    match op {
        Op::Kv(ops) => match ops.as_slice() {
            [lock @ KvOp::Lock { .. }] => Some(lock),
            _ => None,
        },
        _ => None,
    }
}

/// What an acquire's turn decided: a refusal to answer at once, or the turn to hold while it
/// goes through raft.
pub(super) enum Decided<'a> {
    Refused(Response),
    Propose(Option<AcquireTurn<'a>>),
}

impl Server {
    /// On the leader, a single KV acquire waits for its turn on the key, and is answered as a
    /// linearizable read (its lease confirmed and everything committed applied, as for a
    /// default read) when another session holds the key or a lock-delay covers it. Consul
    /// answers a lock-delay before raft too. Anything else is proposed, the turn held until it
    /// is applied: every acquire that succeeds (a session re-acquiring the key it holds
    /// updates its value and flags) and every other op.
    pub(super) async fn decide_acquire(&self, op: &Op) -> Result<Decided<'_>, ServerError> {
        let Some(lock) = single_acquire(op).filter(|_| self.is_leader()) else {
            return Ok(Decided::Propose(None));
        };
        let turn = self.acquires.turn(lock.key()).await;
        let refused = || self.shared.read().refused_acquire(lock, wall_ms());
        // Only an acquire that looks refused is worth confirming the lease for.
        if refused().is_none() {
            return Ok(Decided::Propose(Some(turn)));
        }
        // No longer leading: the proposer answers it `NotLeader`, which the caller retries.
        if self.confirmed_leader().await.is_err() {
            return Ok(Decided::Propose(None));
        }
        let Some(outcome) = refused() else {
            return Ok(Decided::Propose(Some(turn)));
        };
        let response = Response::Txn(outcome);
        for result in crate::telemetry::Proposal::of(op).acquire_results(&response) {
            crate::telemetry::lock_acquired(result);
        }
        Ok(Decided::Refused(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_leaves_the_table_with_its_last_acquire_even_one_that_gave_up() {
        let turns = AcquireTurns::default();
        let first = turns.turn("k").await;
        // A second acquire queues; its turn comes, and its client goes away before it takes
        // it (the first saw it waiting, so left the key in the table for it).
        let mut second = Box::pin(turns.turn("k"));
        assert!(futures::poll!(&mut second).is_pending());
        drop(first);
        drop(second);
        assert!(turns.keys.lock().is_empty(), "the key stayed in the table");

        // Two that both get their turn, one after the other.
        let first = turns.turn("k").await;
        let second = async { turns.turn("k").await };
        let (_, second) = tokio::join!(async { drop(first) }, second);
        assert_eq!(turns.keys.lock().len(), 1);
        drop(second);
        assert!(turns.keys.lock().is_empty());
    }
}
