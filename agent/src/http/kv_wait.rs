//! An `?acquire` that waits in the agent (`X-Vigil-Acquire-Wait`): a Consul-style lock's waiter
//! in one request. Refused because another session holds the key or a lock-delay covers it,
//! the acquire does not answer yet: the agent blocks on the key and asks again whenever it
//! comes free (sleeps out a lock-delay), and answers when the lock is taken or the wait is
//! over. The waiting acquires of one key on this agent take turns, first come first served:
//! only the first asks the servers at a release, the others wait behind it, so a handoff costs
//! each agent one acquire and its reads however many of its clients wait. A client that hangs
//! up drops its handler, and with it its place.

use std::time::Duration;

use axum::http::HeaderMap;
use tokio::time::Instant;
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::kv::{KvOp, KvOpError, TxnError, TxnOutcome};
use vigil_shared::rpc::{Consistency, QueryOptions, reads, writes};

use super::Ctx;
use super::error::ApiError;
use super::params::MAX_WAIT;

/// Request header (a Go duration): how long the `?acquire` may wait in the agent.
const ACQUIRE_WAIT_HEADER: &str = "X-Vigil-Acquire-Wait";

/// The wait an `?acquire` asks for in [`ACQUIRE_WAIT_HEADER`], at most [`MAX_WAIT`] as for a
/// blocking read; `None` for none (or zero).
pub(super) fn asked(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(ACQUIRE_WAIT_HEADER) else {
        return Ok(None);
    };
    let wait = value
        .to_str()
        .ok()
        .and_then(|v| parse_go_duration(v).ok())
        .ok_or_else(|| ApiError::bad_request(format!("Invalid {ACQUIRE_WAIT_HEADER}")))?;
    Ok((!wait.is_zero()).then(|| wait.min(MAX_WAIT)))
}

/// For an acquire that waits in the agent: after `outcome`, a refusal of `op` because another
/// session holds the key or a lock-delay covers it, waits until the key may be taken (its
/// holder gone, the delay over) and says whether to ask again; `false` for any other outcome,
/// when `deadline` comes first, or when the key is found with other flags than the acquire's
/// (a semaphore's key, say: the client's conflict to see, not a lock to wait for).
async fn free_again(cx: &Ctx, op: &KvOp, outcome: &TxnOutcome, deadline: Instant) -> bool {
    let (TxnOutcome::RolledBack(errors), KvOp::Lock { key, flags, .. }) = (outcome, op) else {
        return false;
    };
    let [TxnError { error, .. }] = errors.as_slice() else {
        return false;
    };
    match error {
        KvOpError::LockHeld(_) => released(cx, key, *flags, deadline).await,
        KvOpError::LockDelay { remaining_ms, .. } => {
            let over = Instant::now() + Duration::from_millis(*remaining_ms);
            over < deadline && {
                tokio::time::sleep_until(over).await;
                true
            }
        }
        _ => false,
    }
}

/// Blocks on `key` until no session holds it (or it is gone): `true`; `false` at `deadline`,
/// on an error, or when the key's flags are not `flags`. Reads as a default read does (on a
/// Vigil leader, under its confirmed lease), so a free key it sees is one the leader has freed.
async fn released(cx: &Ctx, key: &str, flags: u64, deadline: Instant) -> bool {
    let mut index = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let opts = QueryOptions {
            consistency: Consistency::Default,
            min_index: index,
            wait_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        };
        let query = reads::KvGet {
            key: key.to_owned(),
        };
        let read = cx.state.backend.read(opts, query);
        let Ok(Ok((entries, meta))) = tokio::time::timeout_at(deadline, read).await else {
            return false;
        };
        match entries.first() {
            None => return true,
            Some(entry) if entry.flags != flags => return false,
            Some(entry) if entry.session.is_none() => return true,
            Some(_) => index = meta.index.max(1),
        }
    }
}

/// Sends the acquire `op` (a [`KvOp::Lock`]) in its turn on the key, again after each refusal
/// the key's release (or the lock-delay's end) may lift, until it is taken, refused for another
/// reason, or `deadline` comes: the last outcome. A wait over before its turn came answers what
/// one acquire then says.
pub(super) async fn acquire(
    cx: &Ctx,
    op: &KvOp,
    deadline: Instant,
) -> Result<TxnOutcome, ApiError> {
    let send = || cx.state.backend.write(writes::Kv(vec![op.clone()]));
    let turn = cx.state.acquire_waits.turn(op.key());
    let Ok(_turn) = tokio::time::timeout_at(deadline, turn).await else {
        return Ok(send().await?);
    };
    loop {
        let outcome = send().await?;
        if !free_again(cx, op, &outcome, deadline).await {
            return Ok(outcome);
        }
    }
}
