//! KV: sets, check-and-set, locks, deletes and their indexes (Consul's `kvs_test.go`).

use super::*;

/// TestStateStore_KVSSet_KVSGet: indexes on create and update, a plain set keeps a lock's
/// Session (and, in Vigil, its LockIndex), a missing key reads at the table index, and an
/// identical set is a no-op that moves no index and wakes nobody.
#[test]
fn kv_set_get() {
    // Empty store: a missing key reads at index 0.
    let mut sm = world();
    let (result, index) = sm.query(&ReadQuery::KvGet { key: "foo".into() });
    assert_eq!((result, index), (QueryResult::Entries(Vec::new()), 0));

    // Create: CreateIndex == ModifyIndex; the write result has no value.
    let (outcome, fx) = kv(&mut sm, 3, vec![op::set("foo", "bar")]);
    assert_eq!(committed(outcome), vec![entry("foo", "", 3, 3)]);
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(get(&sm, "foo"), Some(entry("foo", "bar", 3, 3)));
    assert_eq!(key_index(&sm, "foo"), 3);

    // Update: CreateIndex kept, ModifyIndex moves; flags come from the request.
    write(&mut sm, 4, op::set_flags("foo", "baz", 7));
    assert_eq!(
        get(&sm, "foo"),
        Some(KvEntry {
            flags: 7,
            ..entry("foo", "baz", 3, 4)
        })
    );
    assert_eq!(key_index(&sm, "foo"), 4);

    // A plain set on a locked key keeps Session and LockIndex (locking is advisory).
    create_session(&mut sm, 5, session(S1, N1));
    write(&mut sm, 6, op::lock("foo", "locked", S1));
    write(&mut sm, 7, op::set("foo", "overwritten"));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "overwritten", 3, 7), S1, 1))
    );
    assert_eq!(sm.kv().held_by(S1).collect::<Vec<_>>(), vec!["foo"]);

    // An identical set is a no-op: result carries the old ModifyIndex, no key is touched, the
    // table index stays.
    let (outcome, fx) = kv(&mut sm, 8, vec![op::set("foo", "overwritten")]);
    assert_eq!(
        committed(outcome),
        vec![locked(entry("foo", "", 3, 7), S1, 1)]
    );
    assert!(fx.kv_keys.is_empty());
    assert_eq!(sm.kv().table_index(), 7);
    assert_eq!(key_index(&sm, "foo"), 7);

    // Changing only the flags is a change.
    write(&mut sm, 9, op::set_flags("foo", "overwritten", 1));
    assert_eq!(key_index(&sm, "foo"), 9);

    // A missing key reads at the table index.
    assert_eq!(key_index(&sm, "nope"), 9);
}

/// TestStateStore_KVSList: raw-prefix listing in key order; the prefix index comes from the
/// entries, then from a tombstone after a delete, then from the table once it is reaped.
#[test]
fn kv_list_and_tombstone_index() {
    // Empty store: nothing, at index 0.
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    assert_eq!(list(&sm, ""), (Vec::new(), 0));

    // Setup (out of key order on purpose).
    write(&mut sm, 1, op::set("foo", "foo"));
    write(&mut sm, 2, op::set("foo/bar", "bar"));
    write(&mut sm, 3, op::set("foo/bar/zip", "zip"));
    write(&mut sm, 4, op::set("foo/bar/zip/zorp", "zorp"));
    write(&mut sm, 5, op::set("foo/bar/baz", "baz"));
    write(&mut sm, 6, op::set("foobar", "raw prefix"));

    // A prefix lists every key starting with it, in key order, at the highest ModifyIndex.
    let (entries, index) = list(&sm, "foo/bar");
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        ["foo/bar", "foo/bar/baz", "foo/bar/zip", "foo/bar/zip/zorp"]
    );
    assert_eq!(entries[1], entry("foo/bar/baz", "baz", 5, 5));
    assert_eq!(index, 5);
    assert_eq!(list_index(&sm, "foo/bar/zip"), 4);
    assert_eq!(list(&sm, "foo").0.len(), 6);
    assert_eq!(list_index(&sm, ""), 6);

    // Delete a key: its tombstone holds the prefix index.
    kv_at(&mut sm, 7, T0, vec![op::delete("foo/bar/baz")]);
    assert_eq!(list(&sm, "foo/bar/baz"), (Vec::new(), 7));

    // A write elsewhere moves the global index but not this prefix's.
    write(&mut sm, 8, op::set("some/other/key", ""));
    assert_eq!(list_index(&sm, "foo/bar/baz"), 7);

    // Reap the tombstone: with nothing under the prefix the index falls back to the table's.
    let (_, fx) = reap_at(&mut sm, 9, T0 + 1);
    assert_eq!(fx, Effects::default());
    assert_eq!(list_index(&sm, "foo/bar/baz"), 8);
}

/// TestKVSEndpoint_ListKeys at the state level: keys listing with and without a separator.
#[test]
fn kv_keys_with_separator() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    for (i, key) in ["/test/key1", "/test/key2", "/test/sub/key3", "/other"]
        .iter()
        .enumerate()
    {
        write(&mut sm, 1 + i as u64, op::set(key, "v"));
    }
    let keys = |prefix: &str, separator: Option<&str>| {
        sm.query(&ReadQuery::KvKeys {
            prefix: prefix.into(),
            separator: separator.map(str::to_owned),
        })
    };
    assert_eq!(
        keys("/test/", Some("/")),
        (
            QueryResult::Keys(strings(&["/test/key1", "/test/key2", "/test/sub/"])),
            3
        )
    );
    assert_eq!(
        keys("/test/", None),
        (
            QueryResult::Keys(strings(&["/test/key1", "/test/key2", "/test/sub/key3"])),
            3
        )
    );
    assert_eq!(
        keys("/nope/", Some("/")),
        (QueryResult::Keys(Vec::new()), 4)
    );
}

/// TestStateStore_KVSDelete: delete writes a tombstone; the index does not slide back until
/// it is reaped; deleting a missing key is idempotent and moves nothing.
#[test]
fn kv_delete() {
    // Setup.
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    write(&mut sm, 1, op::set("foo", "foo"));
    write(&mut sm, 2, op::set("foo/bar", "bar"));

    // Delete "foo": no result, the key is touched, a tombstone holds the index at 3.
    let (outcome, fx) = kv_at(&mut sm, 3, T0, vec![op::delete("foo")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(get(&sm, "foo"), None);
    assert_eq!(get(&sm, "foo/bar"), Some(entry("foo/bar", "bar", 2, 2)));
    assert_eq!(sm.kv().tombstone_count(), 1);
    assert_eq!(list_index(&sm, "foo"), 3);
    assert_eq!(key_index(&sm, "foo"), 3);

    // Reap it: the prefix index reverts to the remaining foo/bar.
    reap_at(&mut sm, 4, T0 + 1);
    assert_eq!(sm.kv().tombstone_count(), 0);
    assert_eq!(list_index(&sm, "foo"), 2);

    // Deleting a missing key succeeds and changes nothing.
    let before = sm.clone();
    let (outcome, fx) = kv_at(&mut sm, 5, T0 + 1, vec![op::delete("foo")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(fx, Effects::default());
    assert_unchanged(&sm, &before, "nothing changed");
    assert_eq!(sm.kv().table_index(), 3);
}

/// TestStateStore_KVSDeleteCAS: a missing key is success, a wrong index refuses, the right
/// index deletes (and tombstones).
#[test]
fn kv_delete_cas() {
    // (what, key, index, Ok(deleted) or the error text)
    #[rustfmt::skip]
    let cases: [(&str, &str, u64, Result<bool, &str>); 5] = [
        ("missing key is success for any index",  "nope", 99, Ok(false)),
        ("missing key with index 0",              "nope", 0,  Ok(false)),
        ("index 0 never deletes an existing key", "bar",  0,  Err("failed to delete key \"bar\", index is stale")),
        ("wrong index",                           "bar",  1,  Err("failed to delete key \"bar\", index is stale")),
        ("right index",                           "bar",  2,  Ok(true)),
    ];
    for (name, key, index, want) in cases {
        // Setup: foo at 1, bar at 2, baz at 3.
        let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
        write(&mut sm, 1, op::set("foo", "foo"));
        write(&mut sm, 2, op::set("bar", "bar"));
        write(&mut sm, 3, op::set("baz", "baz"));
        let before = sm.clone();

        let (outcome, fx) = kv(&mut sm, 4, vec![op::delete_cas(key, index)]);
        match want {
            Ok(deleted) => {
                assert!(committed(outcome).is_empty(), "{name}");
                assert_eq!(get(&sm, key), None, "{name}");
                let touched: &[&str] = if deleted { &[key] } else { &[] };
                assert_eq!(fx.kv_keys, strings(touched), "{name}");
                assert_eq!(sm.kv().tombstone_count(), usize::from(deleted), "{name}");
                assert_eq!(sm.kv().table_index(), if deleted { 4 } else { 3 }, "{name}");
            }
            Err(text) => {
                assert_eq!(failures(outcome), vec![(0, text.to_owned())], "{name}");
                assert_unchanged(&sm, &before, "{name}");
            }
        }
    }
}

/// TestStateStore_KVSSetCAS: cas 0 creates only if absent, a mismatch is refused, a match
/// writes like set; the Session (and in Vigil the LockIndex) of a locked key is preserved.
#[test]
fn kv_cas() {
    let stale = |key: &str| format!("failed to set key \"{key}\", index is stale");
    let mut sm = world_at(1);

    // cas 0 on a missing key creates it.
    let (outcome, fx) = kv(&mut sm, 3, vec![op::cas("foo", "bar", 0)]);
    assert_eq!(committed(outcome), vec![entry("foo", "", 3, 3)]);
    assert_eq!(fx.kv_keys, strings(&["foo"]));

    // Refusals change nothing: cas 0 on an existing key, a wrong index, any non-zero index
    // on a missing key.
    for (key, index) in [("foo", 0), ("foo", 2), ("foo", 4), ("missing", 3)] {
        let before = sm.clone();
        let (outcome, fx) = kv(&mut sm, 4, vec![op::cas(key, "nope", index)]);
        assert_eq!(
            failures(outcome),
            vec![(0, stale(key))],
            "cas {key}@{index}"
        );
        assert_eq!(fx, Effects::default());
        assert_unchanged(&sm, &before, "nothing changed");
    }

    // The matching index writes.
    write(&mut sm, 5, op::cas("foo", "baz", 3));
    assert_eq!(get(&sm, "foo"), Some(entry("foo", "baz", 3, 5)));

    // On a locked key, cas keeps Session and LockIndex (Consul would reset LockIndex to 0).
    create_session(&mut sm, 6, session(S1, N1));
    write(&mut sm, 7, op::lock("foo", "locked", S1));
    write(&mut sm, 8, op::cas("foo", "cas", 7));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "cas", 3, 8), S1, 1))
    );
}

/// TestStateStore_KVSDeleteTree and TestStateStore_Watches_PrefixDelete: a tree delete that
/// matches nothing changes nothing; a nested prefix delete writes one tombstone for the prefix;
/// deleting everything writes none but still moves the index.
#[test]
fn kv_delete_tree() {
    // Setup.
    let mut sm = world();
    write(&mut sm, 3, op::set("foo/bar", "bar"));
    write(&mut sm, 4, op::set("foo/bar/baz", "baz"));
    write(&mut sm, 5, op::set("foo/bar/zip", "zip"));
    write(&mut sm, 6, op::set("foo/zorp", "zorp"));

    // No match: no index change, no tombstone, no effects.
    let before = sm.clone();
    let (outcome, fx) = kv_at(&mut sm, 9, T0, vec![op::delete_tree("bar")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(fx, Effects::default());
    assert_unchanged(&sm, &before, "nothing changed");

    // Nested prefix: the three keys go; one tombstone for "foo/bar" holds the index.
    let (outcome, fx) = kv_at(&mut sm, 10, T0, vec![op::delete_tree("foo/bar")]);
    assert!(committed(outcome).is_empty());
    assert_eq!(
        fx.kv_keys,
        strings(&["foo/bar", "foo/bar/baz", "foo/bar/zip"])
    );
    let (entries, index) = list(&sm, "foo");
    assert_eq!(entries, vec![entry("foo/zorp", "zorp", 6, 6)]);
    assert_eq!(index, 10);
    assert_eq!(sm.kv().table_index(), 10);
    assert_eq!(sm.kv().tombstone_count(), 1);

    // Reaping the tombstone lets the index revert to foo/zorp.
    reap_at(&mut sm, 11, T0 + 1);
    assert_eq!(list_index(&sm, "foo"), 6);

    // A locked key deleted by a tree delete is no longer held by its session.
    create_session(&mut sm, 12, session(S1, N1));
    write(&mut sm, 13, op::lock("foo/lock", "", S1));
    // Deleting everything: every key goes, no prefix tombstone is written (only the locked
    // key's, which keeps its LockIndex), the index moves.
    let (_, fx) = kv_at(&mut sm, 14, T0 + 1, vec![op::delete_tree("")]);
    assert_eq!(fx.kv_keys, strings(&["foo/lock", "foo/zorp"]));
    assert!(sm.kv().is_empty());
    assert_eq!(sm.kv().tombstone_count(), 1);
    assert_eq!(list_index(&sm, ""), 14);
    assert_eq!(sm.kv().held_by(S1).count(), 0);
    // ...so destroying the session later touches no key.
    assert!(destroy_at(&mut sm, 15, T0 + 1, S1).kv_keys.is_empty());
}

/// TestStateStore_KVSLock: missing or bogus session errors; lock creates with LockIndex 1;
/// re-lock by the holder updates the value without bumping LockIndex; unlock + re-lock bumps
/// it; locking an existing key bumps from its LockIndex; another session is refused.
#[test]
fn kv_lock() {
    let mut sm = world_at(1);

    // No session, then a bogus one.
    let (outcome, _) = kv(&mut sm, 3, vec![op::lock("foo", "foo", "")]);
    assert_eq!(failures(outcome), vec![(0, "missing session".into())]);
    let (outcome, _) = kv(&mut sm, 3, vec![op::lock("foo", "foo", S1)]);
    assert_eq!(
        failures(outcome),
        vec![(0, format!("invalid session \"{S1}\""))]
    );
    assert_eq!(sm.kv().table_index(), 0);

    // Lock creates the key: LockIndex 1, CreateIndex == ModifyIndex; the result has no value.
    create_session(&mut sm, 4, session(S1, N1));
    let (outcome, fx) = kv(&mut sm, 5, vec![op::lock("foo", "foo", S1)]);
    assert_eq!(
        committed(outcome),
        vec![locked(entry("foo", "", 5, 5), S1, 1)]
    );
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "foo", 5, 5), S1, 1))
    );
    assert_eq!(key_index(&sm, "foo"), 5);
    assert_eq!(sm.kv().held_by(S1).collect::<Vec<_>>(), vec!["foo"]);

    // Re-lock by the holder: value updated, LockIndex stays 1.
    write(&mut sm, 6, op::lock("foo", "bar", S1));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "bar", 5, 6), S1, 1))
    );

    // Re-lock with nothing changed is a no-op (no index move).
    let (_, fx) = kv(&mut sm, 7, vec![op::lock("foo", "bar", S1)]);
    assert!(fx.kv_keys.is_empty());
    assert_eq!(key_index(&sm, "foo"), 6);

    // Unlock and re-lock: LockIndex 2.
    write(&mut sm, 8, op::unlock("foo", "baz", S1));
    write(&mut sm, 9, op::lock("foo", "zoo", S1));
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "zoo", 5, 9), S1, 2))
    );

    // Lock an existing unlocked key: LockIndex from 0 to 1, CreateIndex kept.
    write(&mut sm, 10, op::set("bar", "bar"));
    write(&mut sm, 11, op::lock("bar", "xxx", S1));
    assert_eq!(
        get(&sm, "bar"),
        Some(locked(entry("bar", "xxx", 10, 11), S1, 1))
    );

    // Another session is refused and nothing changes.
    create_session(&mut sm, 12, session(S2, N1));
    let before = sm.clone();
    let (outcome, fx) = kv(&mut sm, 13, vec![op::lock("bar", "nope", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"bar\", lock is already held".into())]
    );
    assert_eq!(fx, Effects::default());
    assert_unchanged(&sm, &before, "nothing changed");
    assert_eq!(key_index(&sm, "bar"), 11);
}

/// TestStateStore_KVSUnlock: no session errors; a missing or unlocked key and the wrong
/// session are refused with no index change; the holder unlocks (LockIndex kept, value and
/// flags replaced); a second unlock is refused.
#[test]
fn kv_unlock() {
    let not_held = "failed to unlock key \"foo\", lock isn't held, or is held by another session";
    let mut sm = world();

    // No session.
    let (outcome, _) = kv(&mut sm, 3, vec![op::unlock("foo", "bar", "")]);
    assert_eq!(failures(outcome), vec![(0, "missing session".into())]);

    // A real session but no key.
    create_session(&mut sm, 4, session(S1, N1));
    let (outcome, _) = kv(&mut sm, 5, vec![op::unlock("foo", "bar", S1)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);

    // An unlocked key.
    write(&mut sm, 6, op::set("foo", "bar"));
    let (outcome, _) = kv(&mut sm, 7, vec![op::unlock("foo", "baz", S1)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);
    assert_eq!(get(&sm, "foo"), Some(entry("foo", "bar", 6, 6)));

    // Locked by S1; S2 cannot unlock it.
    write(&mut sm, 8, op::lock("foo", "bar", S1));
    create_session(&mut sm, 9, session(S2, N1));
    let (outcome, _) = kv(&mut sm, 10, vec![op::unlock("foo", "zoo", S2)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);
    assert_eq!(
        get(&sm, "foo"),
        Some(locked(entry("foo", "bar", 6, 8), S1, 1))
    );
    assert_eq!(key_index(&sm, "foo"), 8);

    // The holder unlocks: Session cleared, LockIndex kept, value and flags from the request.
    let release = KvOp::Unlock {
        key: "foo".into(),
        value: b"zoo".to_vec(),
        flags: 5,
        session: S1.into(),
    };
    let (outcome, fx) = kv(&mut sm, 11, vec![release]);
    let want = KvEntry {
        flags: 5,
        lock_index: 1,
        ..entry("foo", "zoo", 6, 11)
    };
    assert_eq!(
        committed(outcome),
        vec![KvEntry {
            value: Vec::new(),
            ..want.clone()
        }]
    );
    assert_eq!(fx.kv_keys, strings(&["foo"]));
    assert_eq!(get(&sm, "foo"), Some(want));
    assert_eq!(sm.kv().held_by(S1).count(), 0);

    // A bare release (no body) sets the value to empty and flags to 0.
    write(&mut sm, 12, op::lock("foo", "again", S1));
    write(&mut sm, 13, op::unlock("foo", "", S1));
    assert_eq!(
        get(&sm, "foo"),
        Some(KvEntry {
            lock_index: 2,
            ..entry("foo", "", 6, 13)
        })
    );

    // Unlocking again is refused and moves nothing.
    let (outcome, _) = kv(&mut sm, 14, vec![op::unlock("foo", "zoo", S1)]);
    assert_eq!(failures(outcome), vec![(0, not_held.into())]);
    assert_eq!(key_index(&sm, "foo"), 13);
}

/// docs/consul-compatibility.md#deliberate-differences, difference 1 (and
/// TestTxnEndpoint_KV_Actions with Vigil's twist): LockIndex never decreases on a key: plain set,
/// cas, unlock, invalidation and re-lock all keep or raise it.
#[test]
fn lock_index_never_decreases() {
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(
        &mut sm,
        4,
        Session {
            lock_delay_ns: 0,
            ..session(S2, N1)
        },
    );
    let lock_index = |sm: &StateMachine| get(sm, "k").map(|e| e.lock_index);

    // (what, command, LockIndex after, holder after)
    #[rustfmt::skip]
    let steps: Vec<(&str, Op, u64, Option<&str>)> = vec![
        ("lock",                            Op::Kv(vec![op::lock("k", "v", S1)]),     1, Some(S1)),
        ("plain set keeps it",              Op::Kv(vec![op::set("k", "w")]),          1, Some(S1)),
        ("cas keeps it",                    Op::Kv(vec![op::cas("k", "x", 6)]),       1, Some(S1)),
        ("unlock keeps it",                 Op::Kv(vec![op::unlock("k", "y", S1)]),   1, None),
        ("set on an unlocked key keeps it", Op::Kv(vec![op::set("k", "z")]),          1, None),
        ("re-lock raises it",               Op::Kv(vec![op::lock("k", "v", S2)]),     2, Some(S2)),
        ("invalidation keeps it",           Op::DestroySession { id: S2.into() },     2, None),
        ("next lock raises it",             Op::Kv(vec![op::lock("k", "v", S1)]),     3, Some(S1)),
    ];
    for (i, (name, command, want_index, want_holder)) in steps.into_iter().enumerate() {
        let (response, _) = apply(&mut sm, 5 + i as u64, command);
        assert!(
            !matches!(response, Response::Txn(TxnOutcome::RolledBack(_))),
            "{name}: {response:?}"
        );
        assert_eq!(lock_index(&sm), Some(want_index), "{name}");
        let holder = get(&sm, "k").and_then(|e| e.session);
        assert_eq!(holder.as_deref(), want_holder, "{name}");
    }
}

/// (what, key, lock index, session, expected verdict)
type SequencerCase<'a> = (&'a str, &'a str, u64, &'a str, Result<(), String>);

/// Vigil's sequencer: `(key, LockIndex, session)` is valid only while that session holds the
/// key at that LockIndex. Session IDs match case-insensitively.
#[test]
fn sequencer_checks() {
    // Setup: S1 locked "k" twice (LockIndex 2); "free" is unlocked; S2 exists.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("k", "", S1));
    write(&mut sm, 6, op::unlock("k", "", S1));
    write(&mut sm, 7, op::lock("k", "", S1));
    write(&mut sm, 8, op::set("free", ""));

    let upper = S1.to_ascii_uppercase();
    #[rustfmt::skip]
    let cases: [SequencerCase; 6] = [
        ("current holder and index", "k",    2, S1,     Ok(())),
        ("session in another case",  "k",    2, &upper, Ok(())),
        ("stale lock index",         "k",    1, S1,     Err("lock index 1 is not current (current is 2)".into())),
        ("another session",          "k",    2, S2,     Err("key \"k\" is held by another session".into())),
        ("unlocked key",             "free", 0, S1,     Err("key \"free\" is not locked".into())),
        ("missing key",              "gone", 1, S1,     Err("key \"gone\" does not exist".into())),
    ];
    for (name, key, lock_index, session, want) in cases {
        assert_eq!(sm.check_sequencer(key, lock_index, session), want, "{name}");
        let query = ReadQuery::Sequencer {
            key: key.into(),
            lock_index,
            session: session.into(),
        };
        assert_eq!(
            sm.query(&query),
            (QueryResult::Sequencer(want), key_index(&sm, key)),
            "{name}"
        );
    }

    // Once the session is destroyed the old token is no longer valid.
    destroy_at(&mut sm, 9, T0, S1);
    assert!(sm.check_sequencer("k", 2, S1).is_err());
}
