//! Lock-delay: enforced in apply from the command's clock, 0 meaning none, capped at 60 s
//! (`delay_test.go`, `TestKVS_Apply_LockDelay`, `TestTxn_Apply_LockDelay`,
//! docs/consul-compatibility.md#lock-delay).

use super::*;

/// Refusal then expiry, with zero, ordinary, exactly-capped and over-capped delays: the delay
/// is min(LockDelay, 60 s) from the invalidating command's clock; 0 means none.
#[test]
fn lock_delay_refuses_then_expires() {
    // (what, session LockDelay in ns, probes: (ms after invalidation, expected remaining ms
    // or None when the acquire succeeds))
    type Probe = (u64, Option<u64>);
    #[rustfmt::skip]
    let cases: [(&str, u64, &[Probe]); 6] = [
        ("zero means no lock-delay",            0,                 &[(0, None)]),
        ("Consul's default 15 s",               15_000_000_000,    &[(0, Some(15_000)), (14_999, Some(1)), (15_000, None)]),
        ("50 ms as in TestKVS_Apply_LockDelay", 50_000_000,        &[(0, Some(50)), (49, Some(1)), (50, None)]),
        ("exactly the 60 s cap",                60_000_000_000,    &[(0, Some(60_000)), (59_999, Some(1)), (60_000, None)]),
        ("120 s is capped to 60 s",             120_000_000_000,   &[(0, Some(60_000)), (59_999, Some(1)), (60_000, None)]),
        ("one hour is capped to 60 s",          3_600_000_000_000, &[(30_000, Some(30_000)), (60_000, None)]),
    ];

    for (name, lock_delay_ns, probes) in cases {
        // Setup: S1 with this lock-delay holds "k"; destroyed at T0 (index 5). S2 is a
        // brand-new session, which lock-delay blocks too.
        let mut sm = world();
        create_session(
            &mut sm,
            3,
            Session {
                lock_delay_ns,
                ..session(S1, N1)
            },
        );
        write(&mut sm, 4, op::lock("k", "v", S1));
        destroy_at(&mut sm, 5, T0, S1);
        create_session(&mut sm, 6, session(S2, N1));
        let released = KvEntry {
            lock_index: 1,
            ..entry("k", "v", 4, 5)
        };

        for (i, &(after_ms, remaining)) in probes.iter().enumerate() {
            let now = T0 + after_ms;
            let index = 7 + i as u64;
            assert_eq!(
                sm.kv().lock_delay_remaining("k", now),
                remaining,
                "{name} +{after_ms}ms"
            );
            let (outcome, fx) = kv_at(&mut sm, index, now, vec![op::lock("k", "mine", S2)]);
            match remaining {
                // Refused: the error says why and how long; nothing is written.
                Some(remaining_ms) => {
                    let TxnOutcome::RolledBack(errors) = outcome else {
                        panic!("{name} +{after_ms}ms: expected a refusal");
                    };
                    let want = KvOpError::LockDelay {
                        key: "k".into(),
                        remaining_ms,
                    };
                    assert_eq!(
                        errors,
                        vec![TxnError {
                            op_index: 0,
                            error: want
                        }],
                        "{name}"
                    );
                    assert_eq!(fx, Effects::default(), "{name}");
                    assert_eq!(get(&sm, "k"), Some(released.clone()), "{name}");
                }
                // Granted: an acquisition, so LockIndex goes from 1 to 2.
                None => {
                    committed(outcome);
                    assert_eq!(fx.kv_keys, strings(&["k"]), "{name}");
                    let want = locked(entry("k", "mine", 4, index), S2, 2);
                    assert_eq!(get(&sm, "k"), Some(want), "{name}");
                }
            }
        }
    }
}

/// S1 (on N1, default 15 s lock-delay) held "k" (value "v") and was destroyed at T0, so "k"
/// is delayed until T0 + 15 s; S2 is alive. Raft indexes 3 to 6.
fn k_delayed_by_destroyed_s1() -> StateMachine {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("k", "v", S1));
    destroy_at(&mut sm, 6, T0, S1);
    sm
}

/// docs/consul-compatibility.md#lock-delay: lock-delay blocks only acquire. Plain set, cas, delete,
/// reads and release proceed; a voluntary release sets no lock-delay; a key that never had one
/// reports none (TestStateStore_KVSLockDelay).
#[test]
fn lock_delay_blocks_only_acquire() {
    let mut sm = k_delayed_by_destroyed_s1();
    let now = T0 + 1_000;
    assert_eq!(sm.kv().lock_delay_remaining("never-locked", now), None);

    // Plain set, cas and reads on the delayed key all go through (LockIndex is kept).
    let (outcome, _) = kv_at(
        &mut sm,
        7,
        now,
        vec![op::set("k", "plain"), op::cas("k", "cas", 7), op::get("k")],
    );
    let results = committed(outcome);
    assert_eq!(
        results[2],
        KvEntry {
            lock_index: 1,
            ..entry("k", "cas", 5, 7)
        }
    );

    // Unlock by a non-holder fails as "not held", not as lock-delay.
    let (outcome, _) = kv_at(&mut sm, 8, now, vec![op::unlock("k", "", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(
            0,
            "failed to unlock key \"k\", lock isn't held, or is held by another session".into()
        )]
    );

    // Other keys are not delayed; a voluntary release arms no delay, so re-acquire is at once.
    write(&mut sm, 9, op::lock("other", "x", S2));
    write(&mut sm, 10, op::unlock("other", "x", S2));
    assert_eq!(sm.kv().lock_delay_remaining("other", now), None);
    write(&mut sm, 11, op::lock("other", "x", S2));
    assert_eq!(get(&sm, "other").map(|e| e.lock_index), Some(2));

    // Delete of the delayed key is allowed, and the delay outlives the key.
    let (outcome, _) = kv_at(&mut sm, 12, now, vec![op::delete("k")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(get(&sm, "k"), None);
    let (outcome, _) = kv_at(&mut sm, 13, now, vec![op::lock("k", "x", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"k\" due to lock delay".into())]
    );
}

/// TestTxn_Apply_LockDelay: a txn `lock` in lock-delay fails the whole transaction (other ops
/// included) with "due to lock delay", and the same transaction succeeds afterwards.
#[test]
fn txn_lock_during_lock_delay_rolls_back_everything() {
    // Setup: S1 held "test" and was destroyed at T0 with a 50 ms lock-delay.
    let mut sm = world();
    create_session(
        &mut sm,
        3,
        Session {
            lock_delay_ns: 50_000_000,
            ..session(S1, N1)
        },
    );
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("test", "v", S1));
    destroy_at(&mut sm, 6, T0, S1);
    let txn = || vec![op::set("side", "effect"), op::lock("test", "mine", S2)];

    // During the delay: refused, and the set before it is not applied either.
    let before = sm.clone();
    let (outcome, fx) = kv_at(&mut sm, 7, T0 + 10, txn());
    assert_eq!(
        failures(outcome),
        vec![(1, "failed to lock key \"test\" due to lock delay".into())]
    );
    assert_eq!(fx, Effects::default());
    assert_eq!(get(&sm, "side"), None);
    assert_eq!(sm.kv(), before.kv());

    // After the delay: both ops apply.
    let (outcome, fx) = kv_at(&mut sm, 8, T0 + 50, txn());
    assert_eq!(committed(outcome).len(), 2);
    assert_eq!(fx.kv_keys, strings(&["side", "test"]));
    assert_eq!(
        get(&sm, "test").and_then(|e| e.session),
        Some(S2.to_owned())
    );
}

/// docs/consul-compatibility.md#lock-delay: apply uses the command's leader-stamped `now_ms`,
/// clamped so it never goes backwards; a command stamped by a leader with a lagging clock cannot
/// shorten or extend a lock-delay relative to what the state machine has already seen.
#[test]
fn lock_delay_uses_the_command_clock_clamped_monotonic() {
    let mut sm = k_delayed_by_destroyed_s1();
    assert_eq!(sm.now_ms(), T0);

    // A command at T0 + 20 s moves the state machine's clock forward.
    kv_at(&mut sm, 7, T0 + 20_000, vec![op::set("tick", "")]);
    assert_eq!(sm.now_ms(), T0 + 20_000);

    // A later command stamped with an older clock (T0 + 1 s) is applied at T0 + 20 s, so the
    // lock-delay has already passed.
    let (outcome, _) = kv_at(&mut sm, 8, T0 + 1_000, vec![op::lock("k", "mine", S2)]);
    committed(outcome);
    assert_eq!(sm.now_ms(), T0 + 20_000);
}

/// What the leader answers as a read instead of a raft entry: an acquire another session's
/// hold or a lock-delay refuses is known from the state as applying it would refuse it, and
/// nothing changes; anything else (a free key, the holder re-acquiring, an unknown session) is
/// left to raft.
#[test]
fn refused_acquires_are_known_without_applying_them() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("k", "v", S1));
    let held = get(&sm, "k");

    // Held by S1: S2's acquire is refused exactly as applying it refuses it.
    let refused = sm.refused_acquire(&op::lock("k", "w", S2), T0);
    let (applied, _) = kv_at(&mut sm.clone(), 6, T0, vec![op::lock("k", "w", S2)]);
    assert_eq!(refused, Some(applied));
    assert_eq!(get(&sm, "k"), held);

    // The holder re-acquiring, a free key and an unknown session go through raft.
    assert_eq!(sm.refused_acquire(&op::lock("k", "w", S1), T0), None);
    assert_eq!(sm.refused_acquire(&op::lock("free", "w", S2), T0), None);
    assert_eq!(sm.refused_acquire(&op::lock("k", "w", S3), T0), None);

    // S1 destroyed at T0: its lock-delay refuses S2 until T0 + 15 s, with what remains.
    destroy_at(&mut sm, 6, T0, S1);
    let refused = sm.refused_acquire(&op::lock("k", "w", S2), T0 + 1);
    assert_eq!(
        refused.map(failures),
        Some(vec![(
            0,
            "failed to lock key \"k\" due to lock delay".into()
        )])
    );
    assert_eq!(
        sm.refused_acquire(&op::lock("k", "w", S2), T0 + 15_000),
        None
    );
}
