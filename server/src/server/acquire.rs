//! KV acquires without the herd's cost. A release wakes every waiter of a Consul-style lock, and
//! each asks to acquire; only one can win. On the leader, acquires of one key take turns: each
//! waits for the one before it to be applied, then an acquire another session's hold (or a
//! lock-delay) refuses is answered as a linearizable read, with no raft entry, as it changes
//! nothing. So a handoff costs the release and the winning acquire, whatever the number of
//! waiters.

use vigil_shared::kv::KvOp;

use super::*;
use crate::proposer::wall_ms;
use crate::turns::KeyTurn;

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
    Propose(Option<KeyTurn<'a>>),
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
