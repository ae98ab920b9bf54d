//! LockIndex across tree deletes and tombstone reaping
//! (docs/consul-compatibility.md#deliberate-differences, difference 1).

use super::*;

/// The sequence: three acquire/release rounds, a plain delete, an acquire (4), then a
/// tree delete of the prefix and an acquire: 5, not 1, and the old sequencer stays invalid.
#[test]
fn lock_index_survives_a_tree_delete() {
    // Three rounds, a plain delete, a fourth acquire.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    let mut index = 4;
    let mut next = || {
        index += 1;
        index
    };
    for _ in 0..3 {
        write(&mut sm, next(), op::lock("app/lock", "", S1));
        write(&mut sm, next(), op::unlock("app/lock", "", S1));
    }
    write(&mut sm, next(), op::delete("app/lock"));
    write(&mut sm, next(), op::lock("app/lock", "", S1));
    assert_eq!(get(&sm, "app/lock").map(|e| e.lock_index), Some(4));
    write(&mut sm, next(), op::unlock("app/lock", "", S1));

    // A tree delete of the prefix, then an acquire: the count goes on.
    write(&mut sm, next(), op::delete_tree("app/"));
    assert_eq!(get(&sm, "app/lock"), None);
    write(&mut sm, next(), op::lock("app/lock", "", S1));
    assert_eq!(get(&sm, "app/lock").map(|e| e.lock_index), Some(5));
    for old in 1..=4 {
        assert!(sm.check_sequencer("app/lock", old, S1).is_err(), "{old}");
    }
    assert_eq!(sm.check_sequencer("app/lock", 5, S1), Ok(()));

    // The same inside one transaction: a tree delete, then an acquire by another session.
    create_session(&mut sm, next(), session(S2, N1));
    let (outcome, _) = kv(
        &mut sm,
        next(),
        vec![op::delete_tree("app"), op::lock("app/lock", "", S2)],
    );
    committed(outcome);
    assert_eq!(get(&sm, "app/lock").map(|e| e.lock_index), Some(6));
}

/// A prefix tombstone written over a key's own tombstone keeps the key's LockIndex: `k` is
/// deleted at LockIndex 2, `k/x` is created and the tree `k` deleted (tombstone for prefix `k`).
#[test]
fn a_prefix_tombstone_never_lowers_a_key_tombstone() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("k", "", S1));
    write(&mut sm, 5, op::unlock("k", "", S1));
    write(&mut sm, 6, op::lock("k", "", S1));
    write(&mut sm, 7, op::delete("k"));
    write(&mut sm, 8, op::set("k/x", "x"));
    write(&mut sm, 9, op::delete_tree("k"));
    write(&mut sm, 10, op::lock("k", "", S1));
    assert_eq!(get(&sm, "k").map(|e| e.lock_index), Some(3));
}

/// No LockIndex ever goes back, whatever mix of single deletes, tree deletes (of the key's own
/// prefix, a parent prefix, everything), delete-behaviour invalidations and tombstone reaps
/// comes between acquisitions. Every script is run on a few keys at once; after every step each
/// key's next acquire must grant more than anything that key was granted before.
#[test]
fn no_lock_index_goes_back_after_any_deletes_and_reaps() {
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Acquire,
        Release,
        Delete,
        DeleteTreeOwn,
        DeleteTreeParent,
        DeleteTreeAll,
        DestroyDeleteSession,
        Reap,
    }
    use Step::*;
    const ALL: [Step; 8] = [
        Acquire,
        Release,
        Delete,
        DeleteTreeOwn,
        DeleteTreeParent,
        DeleteTreeAll,
        DestroyDeleteSession,
        Reap,
    ];
    let keys = ["a/lock", "a/lock/sub", "b/other"];
    // Every sequence of four steps (8^4 = 4096 scripts), each followed by a final acquire.
    for script in 0..ALL.len().pow(4) {
        let steps: Vec<Step> = (0..4)
            .map(|i| ALL[(script / ALL.len().pow(i)) % ALL.len()])
            .collect();
        let mut sm = world();
        let mut index = 3;
        let mut now = T0;
        // Each key's LockIndex when last seen, and whether it was held then.
        let mut last = std::collections::HashMap::<&str, (u64, bool)>::new();
        // The delete-behaviour session, re-created after each destroy; lock-delay 0 so acquires
        // after an invalidation are not refused.
        let mut generation = 0u32;
        let session_id = |g: u32| format!("5b0a4bc6-5a5b-4c7a-9a1e-{g:012x}");
        let new_session = |sm: &mut StateMachine, index: u64, g: u32| {
            let s = Session {
                behavior: Behavior::Delete,
                lock_delay_ns: 0,
                ..session(&session_id(g), N1)
            };
            create_session(sm, index, s);
        };
        new_session(&mut sm, index, generation);
        for step in steps.iter().copied().chain([Acquire]) {
            index += 1;
            now += 1_000;
            let sid = session_id(generation);
            let ops: Vec<KvOp> = match step {
                Acquire => keys.iter().map(|k| op::lock(k, "", &sid)).collect(),
                Release => keys.iter().map(|k| op::unlock(k, "", &sid)).collect(),
                Delete => keys.iter().map(|k| op::delete(k)).collect(),
                DeleteTreeOwn => keys.iter().map(|k| op::delete_tree(k)).collect(),
                DeleteTreeParent => vec![op::delete_tree("a/"), op::delete_tree("b")],
                DeleteTreeAll => vec![op::delete_tree("")],
                DestroyDeleteSession => {
                    destroy_at(&mut sm, index, now, &sid);
                    generation += 1;
                    index += 1;
                    new_session(&mut sm, index, generation);
                    Vec::new()
                }
                Reap => {
                    reap_at(&mut sm, index, now);
                    Vec::new()
                }
            };
            // One op at a time: a release of an unheld key fails without stopping the others.
            for op in ops {
                index += 1;
                kv_at(&mut sm, index, now, vec![op]);
            }
            for key in keys {
                let Some(e) = get(&sm, key) else {
                    last.entry(key).and_modify(|(_, held)| *held = false);
                    continue;
                };
                let (before, was_held) = last.get(key).copied().unwrap_or((0, false));
                let held = e.session.is_some();
                if held && !was_held {
                    assert!(
                        e.lock_index > before,
                        "{steps:?}: {key} granted {} again (had {before})",
                        e.lock_index
                    );
                }
                assert!(
                    e.lock_index >= before,
                    "{steps:?}: {key} went back from {before} to {}",
                    e.lock_index
                );
                last.insert(key, (e.lock_index, held));
            }
        }
        for key in keys {
            let held = get(&sm, key).expect("the final acquire creates every key");
            assert!(held.session.is_some(), "{steps:?}: {key} not held");
        }
    }
}

/// Reaping raises the floor to the highest LockIndex a reaped tombstone held, and the floor
/// survives a snapshot (the state machine's postcard round trip).
#[test]
fn reaping_sets_the_lock_index_floor() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    for (i, key) in ["x", "y"].iter().enumerate() {
        let base = 4 + 10 * i as u64;
        for round in 0..=(i as u64 * 2) {
            write(&mut sm, base + 2 * round, op::lock(key, "", S1));
            write(&mut sm, base + 2 * round + 1, op::unlock(key, "", S1));
        }
    }
    assert_eq!(get(&sm, "y").map(|e| e.lock_index), Some(3));
    write(&mut sm, 30, op::delete_tree(""));
    assert_eq!(sm.kv().lock_index_floor(), 0);
    reap_at(&mut sm, 31, T0 + 1);
    assert_eq!(sm.kv().tombstone_count(), 0);
    assert_eq!(sm.kv().lock_index_floor(), 3);

    let bytes = sm.encode().expect("encode");
    let mut restored = StateMachine::decode(&bytes).expect("decode");
    assert_eq!(restored, sm);
    // A plain write creates a fresh key at 0, as in Consul; its first acquire is above the floor.
    write(&mut restored, 32, op::set("x", "v"));
    assert_eq!(get(&restored, "x").map(|e| e.lock_index), Some(0));
    write(&mut restored, 33, op::lock("x", "v", S1));
    assert_eq!(get(&restored, "x").map(|e| e.lock_index), Some(4));
}
