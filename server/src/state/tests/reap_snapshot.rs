//! Tombstone reaping, snapshots, the catalog and session ID case.

use super::*;

/// TestStateStore_ReapTombstones: tombstones hold the prefix index until reaped; reaping is by
/// the leader-clock time they were written (strictly before `before_ms`), and touches neither
/// entries nor the table index.
#[test]
fn reap_tombstones() {
    // Setup: five keys; delete two of them at T0 + 6 s and T0 + 7 s.
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    for (i, key) in ["foo", "foo/bar", "foo/baz", "foo/moo", "foo/zoo"]
        .iter()
        .enumerate()
    {
        write(&mut sm, 1 + i as u64, op::set(key, "v"));
    }
    kv_at(&mut sm, 6, T0 + 6_000, vec![op::delete("foo/baz")]);
    kv_at(&mut sm, 7, T0 + 7_000, vec![op::delete("foo/moo")]);
    assert_eq!(list_index(&sm, "foo/"), 7);
    assert_eq!(sm.kv().oldest_tombstone_ms(), Some(T0 + 6_000));

    // A reap bound equal to a tombstone's time keeps it.
    let reap = |before_ms| Op::ReapTombstones { before_ms };
    let (response, fx) = apply_at(&mut sm, 8, T0 + 8_000, reap(T0 + 6_000));
    assert_eq!((response, fx), (Response::Done, Effects::default()));
    assert_eq!(sm.kv().tombstone_count(), 2);

    // Reap the first: the index still comes from the second.
    apply_at(&mut sm, 9, T0 + 8_000, reap(T0 + 6_001));
    assert_eq!(sm.kv().tombstone_count(), 1);
    assert_eq!(sm.kv().oldest_tombstone_ms(), Some(T0 + 7_000));
    assert_eq!(list_index(&sm, "foo/"), 7);

    // Reap all: the prefix index slides back to the highest live entry.
    apply_at(&mut sm, 10, T0 + 8_000, reap(T0 + 8_000));
    assert_eq!(sm.kv().tombstone_count(), 0);
    assert_eq!(sm.kv().oldest_tombstone_ms(), None);
    assert_eq!(list_index(&sm, "foo/"), 5);
    assert_eq!(sm.kv().table_index(), 7);
    assert_eq!(sm.kv().len(), 3);
}

/// TestStateStore_{Session,KVS,Tombstone}_Snapshot_Restore: the whole state machine survives a
/// postcard round trip, and the restored copy behaves identically afterwards: check mappings,
/// held keys, tombstones and lock-delays (docs/consul-compatibility.md#deliberate-differences,
/// difference 4) all come back.
#[test]
fn snapshot_round_trip() {
    // Setup: two nodes with checks; sessions of both behaviours; locked keys, a tombstone, a
    // pending lock-delay.
    let mut sm = world();
    register_check(&mut sm, 3, check(N1, "web", HealthStatus::Passing));
    register_node(&mut sm, 4, N2);
    register_check(&mut sm, 5, check(N2, SERF_HEALTH, HealthStatus::Warning));
    let s1 = Session {
        node_checks: strings(&[SERF_HEALTH, "web"]),
        ..session(S1, N1)
    };
    create_session(&mut sm, 6, s1);
    let s2 = Session {
        behavior: Behavior::Delete,
        ttl: "15s".into(),
        ..session(S2, N2)
    };
    create_session(&mut sm, 7, s2);
    create_session(&mut sm, 8, session(S3, N1));
    create_session(&mut sm, 9, session(S4, N1));
    write(&mut sm, 10, op::lock("leader", "s1", S1));
    write(&mut sm, 11, op::lock(&format!("sema/{S2}"), "s2", S2));
    write(&mut sm, 12, op::lock("delayed", "s4", S4));
    write(&mut sm, 13, op::set("gone", ""));
    kv(&mut sm, 14, vec![op::delete("gone")]);
    destroy_at(&mut sm, 15, T0, S4);

    // Round trip through postcard: equal in every field.
    let bytes = sm.encode().expect("encode");
    let mut restored = StateMachine::decode(&bytes).expect("decode");
    assert_eq!(restored, sm);
    assert_eq!(restored.now_ms(), T0);
    assert_eq!(restored.sessions().on_check(N1, "web"), strings(&[S1]));
    assert_eq!(restored.kv().tombstone_count(), 1);
    assert_eq!(list_index(&restored, "gone"), 14);
    assert_eq!(
        restored.kv().lock_delay_remaining("delayed", T0),
        Some(15_000)
    );

    // The same script applied to both gives the same answers and the same state.
    let sema = format!("sema/{S2}");
    let script: Vec<(u64, Op)> = vec![
        (T0 + 1, Op::Kv(vec![op::lock("delayed", "s3", S3)])),
        (
            T0 + 2,
            Op::RegisterCheck(check(N1, "web", HealthStatus::Critical)),
        ),
        (T0 + 3, Op::DeregisterNode { name: N2.into() }),
        (T0 + 15_000, Op::Kv(vec![op::lock("delayed", "s3", S3)])),
    ];
    for (i, (now, command)) in script.into_iter().enumerate() {
        let index = 16 + i as u64;
        let a = apply_at(&mut sm, index, now, command.clone());
        let b = apply_at(&mut restored, index, now, command);
        assert_eq!(a, b, "step {i}");
        assert_eq!(restored, sm, "step {i}");
    }

    // And what the script did is what the restored indexes promise: the lock-delay refused
    // S3 at first, web → critical released S1's key, node2's removal deleted S2's key.
    assert_eq!(
        restored.kv().get("leader").and_then(|e| e.session.clone()),
        None
    );
    assert_eq!(restored.kv().get(&sema), None);
    assert_eq!(get(&restored, "delayed").map(|e| e.lock_index), Some(2));
    let (result, _) = restored.query(&ReadQuery::SessionList {});
    assert_eq!(session_ids(result), strings(&[S3]));
}

/// The catalog side of apply: registrations report catalog changes only when something
/// changed; a check needs its node.
#[test]
fn catalog_registration_effects() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let node = |address: &str| Op::RegisterNode {
        name: N1.into(),
        address: address.into(),
    };

    // A check for an unknown node is refused.
    let reg = Op::RegisterCheck(check(N1, SERF_HEALTH, HealthStatus::Passing));
    let (response, fx) = apply(&mut sm, 1, reg.clone());
    assert_eq!(
        (response, fx),
        (
            Response::Rejected(ApplyError::MissingNode),
            Effects::default()
        )
    );

    // New node: changed; identical re-registration: not; new address: changed.
    let (_, fx) = apply(&mut sm, 2, node("10.0.0.1"));
    assert!(fx.catalog_changed);
    let (_, fx) = apply(&mut sm, 3, node("10.0.0.1"));
    assert!(!fx.catalog_changed);
    assert_eq!(sm.catalog().table_index(), 2);
    let (_, fx) = apply(&mut sm, 4, node("10.0.0.2"));
    assert!(fx.catalog_changed);
    let n = sm.catalog().node(N1).expect("registered").clone();
    assert_eq!(
        (n.address.as_str(), n.create_index, n.modify_index),
        ("10.0.0.2", 2, 4)
    );

    // Check: new is a change; identical is not; a status change is (CreateIndex kept).
    assert!(apply(&mut sm, 5, reg.clone()).1.catalog_changed);
    assert!(!apply(&mut sm, 6, reg).1.catalog_changed);
    let warn = Op::RegisterCheck(check(N1, SERF_HEALTH, HealthStatus::Warning));
    assert!(apply(&mut sm, 7, warn).1.catalog_changed);
    let c = sm.catalog().check(N1, SERF_HEALTH).expect("registered");
    assert_eq!(
        (c.status, c.create_index, c.modify_index),
        (HealthStatus::Warning, 5, 7)
    );
    let (checks, index) = sm.query(&ReadQuery::NodeChecks { node: N1.into() });
    assert_eq!((checks, index), (QueryResult::Checks(vec![c.clone()]), 7));

    // Deregistering an unknown check changes nothing.
    let (_, fx) = apply(
        &mut sm,
        8,
        Op::DeregisterCheck {
            node: N1.into(),
            check_id: "nope".into(),
        },
    );
    assert_eq!(fx, Effects::default());
}

/// docs/consul-compatibility.md#the-session-object: session IDs are looked up case-insensitively
/// everywhere: info, lock, re-lock, unlock, destroy.
#[test]
fn session_ids_are_case_insensitive() {
    let upper = S1.to_ascii_uppercase();
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));

    // Info by the upper-case ID finds the session.
    let (result, _) = sm.query(&ReadQuery::SessionInfo { id: upper.clone() });
    assert_eq!(session_ids(result), strings(&[S1]));

    // Lock with the upper-case ID: the key records the session's stored ID.
    write(&mut sm, 4, op::lock("k", "v", &upper));
    assert_eq!(get(&sm, "k"), Some(locked(entry("k", "v", 4, 4), S1, 1)));

    // Re-lock in the other case is the same holder: LockIndex stays 1.
    write(&mut sm, 5, op::lock("k", "w", S1));
    write(&mut sm, 6, op::lock("k", "x", &upper));
    assert_eq!(get(&sm, "k"), Some(locked(entry("k", "x", 4, 6), S1, 1)));

    // Unlock and destroy by the upper-case ID work too.
    write(&mut sm, 7, op::unlock("k", "", &upper));
    write(&mut sm, 8, op::lock("k", "", S1));
    let fx = destroy_at(&mut sm, 9, T0, &upper);
    assert_eq!(fx.sessions_destroyed, strings(&[S1]));
    assert_eq!(fx.kv_keys, strings(&["k"]));
    assert!(sm.sessions().is_empty());
    assert_eq!(get(&sm, "k").and_then(|e| e.session), None);
}
