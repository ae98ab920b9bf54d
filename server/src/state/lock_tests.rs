//! The native lock queue in the state machine: FIFO grants in the releasing entry, one standing
//! change per grant, shared/exclusive exclusion without writer starvation, semaphore slots,
//! lock-delay after an involuntary loss, and fencing tokens that never go back.

use vigil_shared::lock::{LockMode, LockOp, LockOutcome, LockStanding};
use vigil_shared::rpc::{ApplyError, Op, QueryResult, ReadQuery, Response};

use super::StateMachine;
use super::tests::{N1, S1, S2, S3, S4, T0, apply_at, create_session, destroy_at, session, world};

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
    let bytes = postcard::to_allocvec(&sm).unwrap();
    let mut restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(restored.locks(), sm.locks());
    release(&mut restored, 12, S1);
    assert_eq!(holders(&restored), vec![(S2.to_owned(), 12)]);
    assert_eq!(restored.locks().last_token(), 12);
}
