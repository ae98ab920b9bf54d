//! The native lock queue in the state machine: FIFO grants in the releasing entry, one standing
//! change per grant, shared/exclusive exclusion without writer starvation, semaphore slots,
//! lock-delay after an involuntary loss, and fencing tokens that never go back.

use vigil_shared::lock::{LockHold, LockMode, LockOp, LockOutcome, LockStanding};
use vigil_shared::rpc::{ApplyError, Op, QueryResult, ReadQuery, Response};

use super::StateMachine;
use super::tests::{
    N1, S1, S2, S3, S4, T0, apply_at, create_session, destroy_at, session, world, world_at,
};

const L: &str = "db/primary";

fn acquire_as(
    sm: &mut StateMachine,
    index: u64,
    now_ms: u64,
    s: &str,
    mode: LockMode,
    limit: u32,
    try_only: bool,
) -> (Result<LockOutcome, ApplyError>, super::Effects) {
    let op = Op::Lock(LockOp::Acquire {
        name: L.to_owned(),
        session: s.to_owned(),
        mode,
        limit,
        try_only,
    });
    match apply_at(sm, index, now_ms, op) {
        (Response::Lock(outcome), fx) => (Ok(outcome), fx),
        (Response::Rejected(e), fx) => (Err(e), fx),
        (other, _) => panic!("a lock op answers with a lock outcome, got {other:?}"),
    }
}

/// A blocking acquire at `T0` that must not be refused.
fn acquire_in(
    sm: &mut StateMachine,
    index: u64,
    s: &str,
    mode: LockMode,
    limit: u32,
) -> LockOutcome {
    acquire_as(sm, index, T0, s, mode, limit, false).0.unwrap()
}

fn acquire(sm: &mut StateMachine, index: u64, s: &str) -> LockOutcome {
    acquire_in(sm, index, s, LockMode::Exclusive, 1)
}

fn acquire_shared(sm: &mut StateMachine, index: u64, s: &str) -> LockOutcome {
    acquire_in(sm, index, s, LockMode::Shared, 1)
}

fn release(sm: &mut StateMachine, index: u64, s: &str) -> (LockOutcome, super::Effects) {
    let op = Op::Lock(LockOp::Release {
        name: L.to_owned(),
        session: s.to_owned(),
    });
    match apply_at(sm, index, T0, op) {
        (Response::Lock(outcome), fx) => (outcome, fx),
        (other, _) => panic!("a release answers with a lock outcome, got {other:?}"),
    }
}

fn standing(sm: &StateMachine, s: &str) -> (LockStanding, u64) {
    match sm.query(&ReadQuery::LockStanding {
        name: L.to_owned(),
        session: s.to_owned(),
    }) {
        (QueryResult::Standing(st), index) => (st, index),
        (other, _) => panic!("a standing read answers with a standing, got {other:?}"),
    }
}

fn holders(sm: &StateMachine) -> Vec<(String, u64)> {
    sm.locks()
        .get(L)
        .map(|l| {
            l.holders
                .iter()
                .map(|h| (h.session.clone(), h.token))
                .collect()
        })
        .unwrap_or_default()
}

/// node1 with four default sessions (15 s lock-delay), S1..S4 at indexes 3..6.
fn four_sessions() -> StateMachine {
    let mut sm = world();
    for (i, s) in [S1, S2, S3, S4].into_iter().enumerate() {
        create_session(&mut sm, 3 + i as u64, session(s, N1));
    }
    sm
}

/// [`four_sessions`] with S1 holding the lock (index 10), S2 and S3 queued behind it (11, 12).
fn one_holder_two_waiters() -> StateMachine {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    acquire(&mut sm, 11, S2);
    acquire(&mut sm, 12, S3);
    sm
}

fn pair(s: &str) -> (String, String) {
    (L.to_owned(), s.to_owned())
}

#[test]
fn waiters_are_granted_in_fifo_order_by_the_release_itself() {
    let mut sm = four_sessions();
    assert_eq!(acquire(&mut sm, 10, S1), LockOutcome::Held { token: 10 });
    assert_eq!(
        acquire(&mut sm, 11, S2),
        LockOutcome::Queued {
            position: 1,
            index: 11
        }
    );
    assert_eq!(
        acquire(&mut sm, 12, S3),
        LockOutcome::Queued {
            position: 2,
            index: 12
        }
    );
    // Asking again keeps the place (a client retrying after a lost answer).
    assert_eq!(
        acquire(&mut sm, 13, S3),
        LockOutcome::Queued {
            position: 2,
            index: 12
        }
    );
    assert_eq!(
        standing(&sm, S2),
        (LockStanding::Queued { position: 1 }, 11)
    );

    let (outcome, fx) = release(&mut sm, 14, S1);
    assert_eq!(
        outcome,
        LockOutcome::Released {
            held: true,
            queued: false
        }
    );
    // The release's own entry granted S2, and only S2's standing changed.
    assert_eq!(fx.locks.standings, vec![pair(S2)]);
    assert_eq!(holders(&sm), vec![(S2.to_owned(), 14)]);
    assert_eq!(
        standing(&sm, S2),
        (
            LockStanding::Held {
                token: 14,
                since_ms: T0
            },
            14
        )
    );
    assert_eq!(
        standing(&sm, S3),
        (LockStanding::Queued { position: 1 }, 12)
    );

    let (_, fx) = release(&mut sm, 15, S2);
    assert_eq!(fx.locks.standings, vec![pair(S3)]);
    assert_eq!(holders(&sm), vec![(S3.to_owned(), 15)]);
    let lock = sm.locks().get(L).unwrap();
    assert_eq!((lock.grants, lock.token), (3, 15));

    // The last release drops the lock; the next grant's token still goes up.
    release(&mut sm, 16, S3);
    assert!(sm.locks().get(L).is_none());
    assert_eq!(standing(&sm, S3), (LockStanding::Absent, 16));
    assert_eq!(acquire(&mut sm, 17, S1), LockOutcome::Held { token: 17 });
}

#[test]
fn a_release_by_someone_else_changes_nothing() {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    let (outcome, fx) = release(&mut sm, 11, S2);
    assert_eq!(
        outcome,
        LockOutcome::Released {
            held: false,
            queued: false
        }
    );
    assert!(fx.locks.changed.is_empty());
    assert_eq!(holders(&sm), vec![(S1.to_owned(), 10)]);
}

#[test]
fn a_waiter_leaving_the_queue_wakes_only_itself() {
    let mut sm = one_holder_two_waiters();
    let (outcome, fx) = release(&mut sm, 13, S2);
    assert_eq!(
        outcome,
        LockOutcome::Released {
            held: false,
            queued: true
        }
    );
    assert_eq!(fx.locks.standings, vec![pair(S2)]);
    assert_eq!(
        standing(&sm, S3),
        (LockStanding::Queued { position: 1 }, 12)
    );
}

#[test]
fn try_acquire_never_queues() {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    let (outcome, fx) = acquire_as(&mut sm, 11, T0, S2, LockMode::Exclusive, 1, true);
    assert_eq!(outcome, Ok(LockOutcome::Busy { lock_delay_ms: 0 }));
    assert!(fx.locks.changed.is_empty());
    assert_eq!(standing(&sm, S2).0, LockStanding::Absent);
}

#[test]
fn refusals_change_nothing() {
    let mut sm = four_sessions();
    let unknown = "00000000-0000-0000-0000-000000000000";
    let (outcome, _) = acquire_as(&mut sm, 10, T0, unknown, LockMode::Exclusive, 1, false);
    assert_eq!(outcome, Err(ApplyError::LockSession(unknown.to_owned())));
    assert!(sm.locks().get(L).is_none());

    acquire_in(&mut sm, 11, S1, LockMode::Exclusive, 2);
    let (outcome, _) = acquire_as(&mut sm, 12, T0, S2, LockMode::Exclusive, 3, false);
    assert_eq!(
        outcome,
        Err(ApplyError::LockLimitConflict { lock: 2, local: 3 })
    );
    assert_eq!(sm.locks().get(L).unwrap().modify_index, 11);
}

#[test]
fn readers_share_and_a_waiting_writer_holds_back_later_readers() {
    let mut sm = four_sessions();
    assert_eq!(
        acquire_shared(&mut sm, 10, S1),
        LockOutcome::Held { token: 10 }
    );
    assert_eq!(
        acquire_shared(&mut sm, 11, S2),
        LockOutcome::Held { token: 11 }
    );
    // A writer waits for the readers ahead of it...
    assert!(matches!(
        acquire(&mut sm, 12, S3),
        LockOutcome::Queued { position: 1, .. }
    ));
    // ...and a reader behind the waiting writer waits too: no writer starvation.
    assert!(matches!(
        acquire_shared(&mut sm, 13, S4),
        LockOutcome::Queued { position: 2, .. }
    ));
    release(&mut sm, 14, S1);
    assert_eq!(holders(&sm), vec![(S2.to_owned(), 11)]);
    let (_, fx) = release(&mut sm, 15, S2);
    assert_eq!(fx.locks.standings, vec![pair(S3)]);
    assert_eq!(holders(&sm), vec![(S3.to_owned(), 15)]);
    let (_, fx) = release(&mut sm, 16, S3);
    assert_eq!(fx.locks.standings, vec![pair(S4)]);
}

#[test]
fn a_released_writer_lets_every_reader_in_at_once() {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    for (i, s) in [S2, S3, S4].into_iter().enumerate() {
        acquire_shared(&mut sm, 11 + i as u64, s);
    }
    let (_, fx) = release(&mut sm, 20, S1);
    assert_eq!(fx.locks.standings, vec![pair(S2), pair(S3), pair(S4)]);
    // One entry, three grants: three distinct tokens, all above the writer's.
    assert_eq!(
        holders(&sm),
        vec![
            (S2.to_owned(), 20),
            (S3.to_owned(), 21),
            (S4.to_owned(), 22)
        ]
    );
    // The next entry's grant continues above them, whatever its raft index.
    release(&mut sm, 21, S2);
    acquire_shared(&mut sm, 22, S2);
    assert_eq!(sm.locks().get(L).unwrap().token, 23);
}

#[test]
fn a_semaphore_grants_up_to_its_limit() {
    let mut sm = four_sessions();
    let sem = |sm: &mut StateMachine, index, s| acquire_in(sm, index, s, LockMode::Exclusive, 2);
    assert!(matches!(sem(&mut sm, 10, S1), LockOutcome::Held { .. }));
    assert!(matches!(sem(&mut sm, 11, S2), LockOutcome::Held { .. }));
    assert!(matches!(sem(&mut sm, 12, S3), LockOutcome::Queued { .. }));
    let (_, fx) = release(&mut sm, 13, S1);
    assert_eq!(fx.locks.standings, vec![pair(S3)]);
    assert_eq!(holders(&sm).len(), 2);
}

#[test]
fn an_invalidated_holder_arms_lock_delay_and_the_wake_grants_the_next() {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    acquire(&mut sm, 11, S2);
    let fx = destroy_at(&mut sm, 12, T0 + 1_000, S1);
    // The lost holder's standing changed (whoever watches it wakes), and nobody is granted
    // during its 15 s lock-delay; the leader is told when it ends.
    assert_eq!(fx.locks.standings, vec![pair(S1)]);
    assert_eq!(fx.locks.delays, vec![(L.to_owned(), T0 + 16_000)]);
    assert_eq!(sm.locks().get(L).unwrap().delay_left_ms(T0 + 1_000), 15_000);
    // A try during the delay is busy and says for how long.
    let (outcome, _) = acquire_as(&mut sm, 13, T0 + 6_000, S3, LockMode::Exclusive, 1, true);
    assert_eq!(
        outcome,
        Ok(LockOutcome::Busy {
            lock_delay_ms: 10_000
        })
    );
    // A wake-up before the end re-reports the delay; at the end it grants S2.
    let wake = || Op::Lock(LockOp::Wake { name: L.to_owned() });
    let (_, fx) = apply_at(&mut sm, 14, T0 + 15_999, wake());
    assert!(fx.locks.standings.is_empty());
    assert_eq!(fx.locks.delays, vec![(L.to_owned(), T0 + 16_000)]);
    let (_, fx) = apply_at(&mut sm, 15, T0 + 16_000, wake());
    assert_eq!(fx.locks.standings, vec![pair(S2)]);
    assert_eq!(holders(&sm), vec![(S2.to_owned(), 15)]);
}

#[test]
fn an_invalidated_waiter_leaves_the_queue() {
    let mut sm = one_holder_two_waiters();
    let fx = destroy_at(&mut sm, 13, T0, S2);
    assert_eq!(fx.locks.standings, vec![pair(S2)]);
    assert!(fx.locks.delays.is_empty());
    assert_eq!(standing(&sm, S2).0, LockStanding::Absent);
    assert_eq!(standing(&sm, S3).0, LockStanding::Queued { position: 1 });
    assert_eq!(holders(&sm), vec![(S1.to_owned(), 10)]);
}

#[test]
fn the_sequencer_checks_holder_and_token() {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    let check = |sm: &StateMachine, token, s: &str| match sm.query(&ReadQuery::LockSequencer {
        name: L.to_owned(),
        token,
        session: s.to_owned(),
    }) {
        (QueryResult::Sequencer(r), _) => r,
        (other, _) => panic!("unexpected {other:?}"),
    };
    assert_eq!(check(&sm, 10, S1), Ok(()));
    assert!(check(&sm, 9, S1).is_err());
    assert!(check(&sm, 10, S2).is_err());
    release(&mut sm, 11, S1);
    assert!(check(&sm, 10, S1).is_err());
}

#[test]
fn locks_and_tokens_survive_a_snapshot() {
    let mut sm = four_sessions();
    acquire(&mut sm, 10, S1);
    acquire(&mut sm, 11, S2);
    let bytes = sm.encode().unwrap();
    let mut restored = StateMachine::decode(&bytes).unwrap();
    assert_eq!(restored.locks(), sm.locks());
    release(&mut restored, 12, S1);
    assert_eq!(holders(&restored), vec![(S2.to_owned(), 12)]);
    assert_eq!(restored.locks().last_token(), 12);
}

fn enqueue(
    sm: &mut StateMachine,
    index: u64,
    s: &str,
    mode: LockMode,
    try_only: bool,
    request: u64,
) -> Result<LockOutcome, ApplyError> {
    let op = Op::Lock(LockOp::Enqueue {
        name: L.to_owned(),
        session: s.to_owned(),
        mode,
        limit: 1,
        try_only,
        request,
    });
    match apply_at(sm, index, T0, op).0 {
        Response::Lock(outcome) => Ok(outcome),
        Response::Rejected(e) => Err(e),
        other => panic!("an enqueue answers with a lock outcome, got {other:?}"),
    }
}

fn leave(sm: &mut StateMachine, index: u64, s: &str, request: u64) -> LockOutcome {
    let op = Op::Lock(LockOp::Leave {
        name: L.to_owned(),
        session: s.to_owned(),
        request,
    });
    match apply_at(sm, index, T0, op).0 {
        Response::Lock(outcome) => outcome,
        other => panic!("a leave answers with a lock outcome, got {other:?}"),
    }
}

fn hold(sm: &StateMachine, s: &str) -> LockHold {
    match sm.query(&ReadQuery::LockHold {
        name: L.to_owned(),
        session: s.to_owned(),
    }) {
        (QueryResult::Hold(hold), _) => hold,
        (other, _) => panic!("a hold read answers with a hold, got {other:?}"),
    }
}

const X: LockMode = LockMode::Exclusive;
const SH: LockMode = LockMode::Shared;

/// The double grant of a retried acquire: the first request's client went away, the retry
/// claimed the place (and was granted); the first request's leave must change nothing.
#[test]
fn a_leave_never_takes_back_a_grant_or_a_place_a_retry_claimed() {
    let mut sm = four_sessions();
    enqueue(&mut sm, 10, S1, X, false, 1).unwrap();
    assert_eq!(
        enqueue(&mut sm, 11, S2, X, false, 100),
        Ok(LockOutcome::Waiting {
            position: 1,
            index: 11,
            mode: X
        })
    );
    // S2's client retries on a new connection: same place, now owned by request 200.
    assert_eq!(
        enqueue(&mut sm, 12, S2, X, false, 200),
        Ok(LockOutcome::Waiting {
            position: 1,
            index: 11,
            mode: X
        })
    );
    // The first request's leave arrives: ignored, S2 keeps its place.
    let stayed = leave(&mut sm, 13, S2, 100);
    assert_eq!(
        stayed,
        LockOutcome::Stayed(LockHold::Queued {
            position: 1,
            mode: X
        })
    );
    // S1 releases: S2 is granted; a leave of either request now leaves the grant alone.
    release(&mut sm, 14, S1);
    let LockHold::Held { token, .. } = hold(&sm, S2) else {
        panic!("S2 is granted");
    };
    for request in [100, 200] {
        assert!(matches!(
            leave(&mut sm, 15, S2, request),
            LockOutcome::Stayed(LockHold::Held { .. })
        ));
    }
    assert_eq!(holders(&sm), vec![(S2.to_owned(), token)]);
    // And S3 is not granted beside S2.
    enqueue(&mut sm, 16, S3, X, false, 300).unwrap();
    assert_eq!(holders(&sm), vec![(S2.to_owned(), token)]);
}

/// A request that still owns its place gives it up; the next in line moves up.
#[test]
fn a_leave_gives_up_only_the_place_its_own_request_holds() {
    let mut sm = four_sessions();
    enqueue(&mut sm, 10, S1, X, false, 1).unwrap();
    enqueue(&mut sm, 11, S2, X, false, 2).unwrap();
    enqueue(&mut sm, 12, S3, X, false, 3).unwrap();
    assert_eq!(leave(&mut sm, 13, S2, 2), LockOutcome::Left);
    assert_eq!(hold(&sm, S2), LockHold::Absent);
    assert_eq!(
        hold(&sm, S3),
        LockHold::Queued {
            position: 1,
            mode: X
        }
    );
    // A leave of a session that is nowhere changes nothing.
    assert_eq!(
        leave(&mut sm, 14, S4, 4),
        LockOutcome::Stayed(LockHold::Absent)
    );
}

/// A try from a session that already waits answers at once and claims nothing: the waiting
/// request's leave still works.
#[test]
fn a_try_from_a_waiting_session_answers_at_once_and_claims_nothing() {
    let mut sm = four_sessions();
    enqueue(&mut sm, 10, S1, X, false, 1).unwrap();
    enqueue(&mut sm, 11, S2, X, false, 2).unwrap();
    assert_eq!(
        enqueue(&mut sm, 12, S2, X, true, 9),
        Ok(LockOutcome::Waiting {
            position: 1,
            index: 11,
            mode: X
        })
    );
    assert_eq!(leave(&mut sm, 13, S2, 2), LockOutcome::Left);
}

/// Exclusive is never granted beside readers: a reader asking for exclusive is refused while
/// others share the lock, and upgraded in place (new token) when it is the only holder.
#[test]
fn a_reader_asking_for_exclusive_is_refused_unless_it_is_alone() {
    let mut sm = four_sessions();
    let Ok(LockOutcome::Granted {
        token: t1,
        mode: SH,
    }) = enqueue(&mut sm, 10, S1, SH, false, 1)
    else {
        panic!("S1 reads");
    };
    enqueue(&mut sm, 11, S2, SH, false, 2).unwrap();
    assert_eq!(
        enqueue(&mut sm, 12, S1, X, false, 3),
        Err(ApplyError::LockUpgradeHeld {
            lock: L.to_owned(),
            session: S1.to_owned()
        })
    );
    assert!(matches!(hold(&sm, S1), LockHold::Held { mode: SH, .. }));
    // Asking for shared again answers the hold as stored.
    assert_eq!(
        enqueue(&mut sm, 13, S1, SH, false, 4),
        Ok(LockOutcome::Granted {
            token: t1,
            mode: SH
        })
    );
    // Once S2 is gone, S1 alone may upgrade: a new grant, with a new token.
    release(&mut sm, 14, S2);
    let Ok(LockOutcome::Granted { token, mode: X }) = enqueue(&mut sm, 15, S1, X, false, 5) else {
        panic!("S1 is upgraded");
    };
    assert!(token > t1);
    assert!(matches!(hold(&sm, S1), LockHold::Held { mode: X, .. }));
    // Asking for shared what it holds exclusive answers the exclusive hold.
    assert_eq!(
        enqueue(&mut sm, 16, S1, SH, false, 6),
        Ok(LockOutcome::Granted { token, mode: X })
    );
    // A reader now waits behind the writer.
    assert!(matches!(
        enqueue(&mut sm, 17, S3, SH, false, 7),
        Ok(LockOutcome::Waiting { mode: SH, .. })
    ));
    // ...and may not turn its wait into an exclusive one.
    assert_eq!(
        enqueue(&mut sm, 18, S3, X, false, 8),
        Err(ApplyError::LockUpgradeQueued {
            lock: L.to_owned(),
            session: S3.to_owned()
        })
    );
}

/// Below protocol level 2 an acquire answers the holder whatever mode it asks, exactly as
/// the first release does, so servers of both releases apply the same entries alike.
#[test]
fn below_level_2_acquire_keeps_the_first_releases_answers() {
    let mut sm = world_at(1);
    for (i, s) in [S1, S2].into_iter().enumerate() {
        create_session(&mut sm, 3 + i as u64, session(s, N1));
    }
    assert_eq!(
        acquire_shared(&mut sm, 10, S1),
        LockOutcome::Held { token: 10 }
    );
    acquire_shared(&mut sm, 11, S2);
    assert_eq!(acquire(&mut sm, 12, S1), LockOutcome::Held { token: 10 });
}
