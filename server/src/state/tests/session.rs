//! Sessions: creation, reads, destruction and every invalidation trigger (Consul's
//! `session_test.go`).

use super::*;

/// TestStateStore_SessionCreate_SessionGet: every refusal, and a refusal changes nothing.
#[test]
fn session_create_refusals_change_nothing() {
    // Setup: node1 with serfHealth (passing), web (warning), db (critical); node2 with only a
    // passing "other" check; S1 already exists.
    let mut sm = world();
    register_check(&mut sm, 3, check(N1, "web", HealthStatus::Warning));
    register_check(&mut sm, 4, check(N1, "db", HealthStatus::Critical));
    register_node(&mut sm, 5, N2);
    register_check(&mut sm, 6, check(N2, "other", HealthStatus::Passing));
    create_session(&mut sm, 7, session(S1, N1));

    // S2 on node1 bound to the given checks, in each of the three check lists.
    let node_checks = |ids: &[&str]| Session {
        node_checks: strings(ids),
        ..session(S2, N1)
    };
    let legacy_checks = |ids: &[&str]| Session {
        checks: strings(ids),
        ..session(S2, N1)
    };
    let service_check = |id: &str| Session {
        service_checks: Some(vec![ServiceCheck {
            id: id.to_owned(),
            namespace: String::new(),
        }]),
        ..session(S2, N1)
    };
    let missing = |id: &str| ApplyError::MissingCheck(id.to_owned());
    let critical = |id: &str| ApplyError::CriticalCheck(id.to_owned());

    #[rustfmt::skip]
    let cases: Vec<(&str, Session, ApplyError)> = vec![
        ("node not in the catalog",                  session(S2, "nope"),                     ApplyError::MissingNode),
        ("default serfHealth missing on the node",   session(S2, N2),                         missing(SERF_HEALTH)),
        ("unknown node check",                       node_checks(&[SERF_HEALTH, "ghost"]),    missing("ghost")),
        ("checks are looked up on the own node",     node_checks(&["other"]),                 missing("other")),
        ("unknown service check",                    service_check("svc1"),                   missing("svc1")),
        ("unknown legacy check",                     legacy_checks(&["legacy"]),              missing("legacy")),
        ("critical node check",                      node_checks(&[SERF_HEALTH, "db"]),       critical("db")),
        ("critical service check",                   service_check("db"),                     critical("db")),
        ("critical legacy check",                    legacy_checks(&["db"]),                  critical("db")),
        ("duplicate ID",                             session(S1, N1),                         ApplyError::DuplicateSession),
        ("duplicate ID in another case",             session(&S1.to_ascii_uppercase(), N1),   ApplyError::DuplicateSession),
    ];

    for (i, (name, s, want)) in cases.into_iter().enumerate() {
        // A refused create still uses a raft index, but moves no table index and changes no
        // state (same clock, so even the clamp stays put).
        let before = sm.clone();
        let (response, fx) = apply(&mut sm, 10 + i as u64, Op::CreateSession(s));
        assert_eq!(response, Response::Rejected(want), "{name}");
        assert_eq!(fx, Effects::default(), "{name}");
        assert_unchanged(&sm, &before, "{name}");
        assert_eq!(sm.sessions().table_index(), 7, "{name}");
    }
}

/// TestStateStore_SessionCreate_SessionGet / TestSessionCreate*: what is stored, which checks
/// are mapped, and which creates hand a TTL to the leader.
#[test]
fn session_create_stores_indexes_and_check_mappings() {
    // Setup: node1 with serfHealth passing, web warning, api passing; node2 with no checks.
    let mut sm = world();
    register_check(&mut sm, 3, check(N1, "web", HealthStatus::Warning));
    register_check(&mut sm, 4, check(N1, "api", HealthStatus::Passing));
    register_node(&mut sm, 5, N2);

    struct Case {
        name: &'static str,
        session: Session,
        mapped: &'static [&'static str],
        ttl_effect: bool,
    }
    let cases = [
        Case {
            name: "defaults: release, serfHealth",
            session: session(S1, N1),
            mapped: &[SERF_HEALTH],
            ttl_effect: false,
        },
        Case {
            name: "a warning check is accepted",
            session: Session {
                node_checks: strings(&["web"]),
                ..session(S2, N1)
            },
            mapped: &["web"],
            ttl_effect: false,
        },
        Case {
            name: "no checks at all on a node without serfHealth",
            session: Session {
                node_checks: Vec::new(),
                ..session(S3, N2)
            },
            mapped: &[],
            ttl_effect: false,
        },
        Case {
            name: "union of legacy, node and service checks; delete behaviour; TTL",
            session: Session {
                name: "svc lock".into(),
                behavior: Behavior::Delete,
                ttl: "30s".into(),
                lock_delay_ns: 0,
                checks: strings(&["web"]),
                service_checks: Some(vec![ServiceCheck {
                    id: "api".into(),
                    namespace: String::new(),
                }]),
                ..session(S4, N1)
            },
            mapped: &[SERF_HEALTH, "web", "api"],
            ttl_effect: true,
        },
    ];

    for (i, case) in cases.into_iter().enumerate() {
        let index = 10 + i as u64;
        let name = case.name;
        let id = case.session.id.clone();

        // Create: stored as given, with CreateIndex == ModifyIndex == the raft index.
        let fx = create_session(&mut sm, index, case.session.clone());
        let stored = sm.sessions().get(&id).expect(name).clone();
        let want = Session {
            create_index: index,
            modify_index: index,
            owner: String::new(),
            ..case.session.clone()
        };
        assert_eq!(stored, want, "{name}");
        assert_eq!(sm.sessions().table_index(), index, "{name}");

        // Effects: sessions changed; the leader hears about TTL sessions only.
        assert!(fx.sessions_changed, "{name}");
        let ttl: Vec<(String, String)> = if case.ttl_effect {
            vec![(id.clone(), case.session.ttl.clone())]
        } else {
            Vec::new()
        };
        assert_eq!(fx.ttl_sessions_created, ttl, "{name}");
        assert!(
            fx.kv_keys.is_empty() && fx.sessions_destroyed.is_empty(),
            "{name}"
        );

        // Check mappings: every check the session depends on finds it.
        for c in case.mapped {
            let bound = sm.sessions().on_check(&case.session.node, c);
            assert!(bound.contains(&id), "{name}: {c}");
        }
        assert!(
            sm.sessions().on_node(&case.session.node).contains(&id),
            "{name}"
        );
    }
    assert_eq!(sm.sessions().len(), 4);
}

/// TestStateStore_SessionList / TestStateStore_NodeSessions / TestSessionGet: reads return
/// arrays and the sessions table index, whatever the session's own index.
#[test]
fn session_reads_report_the_table_index() {
    // Before any session: info of an unknown ID is empty, at table index 0.
    let mut sm = world();
    register_node(&mut sm, 3, N2);
    register_check(&mut sm, 4, check(N2, SERF_HEALTH, HealthStatus::Passing));
    let info = |id: &str| ReadQuery::SessionInfo { id: id.to_owned() };
    let (result, index) = sm.query(&info(S1));
    assert_eq!((session_ids(result), index), (Vec::new(), 0));

    // Three sessions on two nodes, created out of ID order.
    create_session(&mut sm, 5, session(S3, N1));
    create_session(&mut sm, 6, session(S1, N1));
    create_session(&mut sm, 7, session(S2, N2));

    // List: every session, in ID order, at the table index.
    let (result, index) = sm.query(&ReadQuery::SessionList {});
    assert_eq!((session_ids(result), index), (strings(&[S1, S2, S3]), 7));

    // Node: only that node's sessions; an unknown node is empty.
    let node = |n: &str| ReadQuery::SessionNode { node: n.to_owned() };
    let (result, index) = sm.query(&node(N1));
    assert_eq!((session_ids(result), index), (strings(&[S1, S3]), 7));
    let (result, _) = sm.query(&node(N2));
    assert_eq!(session_ids(result), strings(&[S2]));
    let (result, _) = sm.query(&node("nope"));
    assert!(session_ids(result).is_empty());

    // Info: the one session, but at the table index (7), not its own ModifyIndex (5); a
    // missing ID is empty at the table index.
    let (result, index) = sm.query(&info(S3));
    assert_eq!((session_ids(result), index), (strings(&[S3]), 7));
    let (result, index) = sm.query(&info(S4));
    assert_eq!((session_ids(result), index), (Vec::new(), 7));
}

/// TestStateStore_SessionDestroy: destroying an unknown session is an idempotent no-op that
/// moves no index; a real destroy bumps the table index.
#[test]
fn session_destroy_is_idempotent() {
    // Destroying a session that never existed changes nothing at all.
    let mut sm = world();
    let before = sm.clone();
    assert_eq!(destroy_at(&mut sm, 3, T0, S1), Effects::default());
    assert_unchanged(&sm, &before, "nothing changed");
    assert_eq!(sm.sessions().table_index(), 0);

    // A real session: destroy removes it, bumps the table index and reports it.
    create_session(&mut sm, 4, session(S1, N1));
    let fx = destroy_at(&mut sm, 5, T0, S1);
    assert_eq!(fx.sessions_destroyed, strings(&[S1]));
    assert!(fx.sessions_changed && fx.kv_keys.is_empty());
    assert!(sm.sessions().get(S1).is_none());
    assert_eq!(sm.sessions().table_index(), 5);
    assert!(sm.sessions().on_node(N1).is_empty());
    assert!(sm.sessions().on_check(N1, SERF_HEALTH).is_empty());

    // Destroying it again is a no-op: the index stays at 5.
    assert_eq!(destroy_at(&mut sm, 6, T0, S1), Effects::default());
    assert_eq!(sm.sessions().table_index(), 5);
}

/// TestStateStore_Session_Invalidate_{DeleteNode,Critical_Check,DeleteCheck} and
/// TestStateStore_Session_Invalidate_Key_{Unlock,Delete}_Behavior: every trigger, for both
/// behaviours, against a bystander session on another node.
#[test]
fn session_invalidation_triggers() {
    let critical =
        |node: &str, id: &str| Op::RegisterCheck(check(node, id, HealthStatus::Critical));
    let status = |id: &str, status: HealthStatus| Op::RegisterCheck(check(N1, id, status));
    let dereg_check = |node: &str, id: &str| Op::DeregisterCheck {
        node: node.to_owned(),
        check_id: id.to_owned(),
    };
    let dereg_node = |name: &str| Op::DeregisterNode {
        name: name.to_owned(),
    };
    let destroy = |id: &str| Op::DestroySession { id: id.to_owned() };
    let passing_again = Op::RegisterCheck(CheckRegistration {
        output: "still fine".into(),
        ..check(N1, "web", HealthStatus::Passing)
    });

    // (what happens, the command, which sessions it destroys)
    #[rustfmt::skip]
    let cases: Vec<(&str, Op, &[&str])> = vec![
        ("explicit destroy",                  destroy(S1),                            &[S1]),
        ("destroy by upper-case ID",          destroy(&S1.to_ascii_uppercase()),      &[S1]),
        ("node deregistered",                 dereg_node(N1),                         &[S1]),
        ("serfHealth turns critical",         critical(N1, SERF_HEALTH),              &[S1]),
        ("bound check turns critical",        critical(N1, "web"),                    &[S1]),
        ("bound check deregistered",          dereg_check(N1, "web"),                 &[S1]),
        ("serfHealth deregistered",           dereg_check(N1, SERF_HEALTH),           &[S1]),
        ("other node's serfHealth critical",  critical(N2, SERF_HEALTH),              &[S2]),
        ("other node deregistered",           dereg_node(N2),                         &[S2]),
        ("warning never invalidates",         status("web", HealthStatus::Warning),   &[]),
        ("passing update",                    passing_again,                          &[]),
        ("unbound check turns critical",      critical(N1, "spare"),                  &[]),
        ("unbound check deregistered",        dereg_check(N1, "spare"),               &[]),
        ("unknown check deregistered",        dereg_check(N1, "ghost"),               &[]),
        ("unknown node deregistered",         dereg_node("ghost"),                    &[]),
        ("unknown session destroyed",         destroy(S3),                            &[]),
    ];

    for behavior in [Behavior::Release, Behavior::Delete] {
        for (name, trigger, destroyed) in &cases {
            let name = format!("{name} ({})", behavior.as_str());

            // Setup: S1 on node1 bound to serfHealth + web holds lock/a; bystander S2 on
            // node2 holds lock/b. Both have the default 15 s lock-delay.
            let mut sm = world();
            register_check(&mut sm, 3, check(N1, "web", HealthStatus::Passing));
            register_check(&mut sm, 4, check(N1, "spare", HealthStatus::Passing));
            register_node(&mut sm, 5, N2);
            register_check(&mut sm, 6, check(N2, SERF_HEALTH, HealthStatus::Passing));
            let s1 = Session {
                node_checks: strings(&[SERF_HEALTH, "web"]),
                behavior,
                ..session(S1, N1)
            };
            create_session(&mut sm, 7, s1);
            create_session(
                &mut sm,
                8,
                Session {
                    behavior,
                    ..session(S2, N2)
                },
            );
            write(&mut sm, 9, op::lock("lock/a", "a", S1));
            write(&mut sm, 10, op::lock("lock/b", "b", S2));

            // Trigger at index 11.
            let (response, fx) = apply(&mut sm, 11, trigger.clone());
            assert_eq!(response, Response::Done, "{name}");
            assert_eq!(fx.sessions_destroyed, strings(destroyed), "{name}");
            assert_eq!(fx.sessions_changed, !destroyed.is_empty(), "{name}");
            let want_table_index = if destroyed.is_empty() { 8 } else { 11 };
            assert_eq!(sm.sessions().table_index(), want_table_index, "{name}");

            // Each session's key: released or deleted at index 11 with a 15 s lock-delay if
            // its session died, untouched otherwise.
            let mut touched = Vec::new();
            for (id, key, value, lock_at) in [(S1, "lock/a", "a", 9), (S2, "lock/b", "b", 10)] {
                let held = locked(entry(key, value, lock_at, lock_at), id, 1);
                if !destroyed.contains(&id) {
                    assert!(sm.sessions().get(id).is_some(), "{name}: {id} survives");
                    assert_eq!(get(&sm, key), Some(held), "{name}: {key} still held");
                    assert_eq!(sm.kv().lock_delay_remaining(key, T0), None, "{name}");
                    continue;
                }
                touched.push(key);
                assert!(sm.sessions().get(id).is_none(), "{name}: {id} gone");
                assert_eq!(sm.kv().held_by(id).count(), 0, "{name}");
                let want = match behavior {
                    Behavior::Release => Some(KvEntry {
                        session: None,
                        modify_index: 11,
                        ..held
                    }),
                    Behavior::Delete => None,
                };
                assert_eq!(get(&sm, key), want, "{name}: {key}");
                assert_eq!(
                    list_index(&sm, key),
                    11,
                    "{name}: {key} index from entry or tombstone"
                );
                assert_eq!(
                    sm.kv().lock_delay_remaining(key, T0),
                    Some(15_000),
                    "{name}"
                );
            }
            assert_eq!(fx.kv_keys, strings(&touched), "{name}");
        }
    }
}

/// docs/consul-compatibility.md#invalidation: deregistering a node destroys all of its sessions,
/// including sessions with no checks and TTL-only sessions; the node's checks go with it.
#[test]
fn node_deregistration_destroys_every_session_on_the_node() {
    // Setup: three kinds of session on node1, one on node2.
    let mut sm = world();
    register_node(&mut sm, 3, N2);
    register_check(&mut sm, 4, check(N2, SERF_HEALTH, HealthStatus::Passing));
    create_session(&mut sm, 5, session(S1, N1));
    let no_checks = Session {
        node_checks: Vec::new(),
        ..session(S2, N1)
    };
    create_session(&mut sm, 6, no_checks);
    let ttl_only = Session {
        node_checks: Vec::new(),
        ttl: "30s".into(),
        ..session(S3, N1)
    };
    let fx = create_session(&mut sm, 7, ttl_only);
    assert_eq!(
        fx.ttl_sessions_created,
        vec![(S3.to_owned(), "30s".to_owned())]
    );
    create_session(&mut sm, 8, session(S4, N2));

    // Deregister node1: its three sessions go in ID order, node2's stays.
    let (response, fx) = apply(&mut sm, 9, Op::DeregisterNode { name: N1.into() });
    assert_eq!(response, Response::Done);
    assert_eq!(fx.sessions_destroyed, strings(&[S1, S2, S3]));
    assert!(fx.catalog_changed && fx.sessions_changed);
    let (result, index) = sm.query(&ReadQuery::SessionList {});
    assert_eq!((session_ids(result), index), (strings(&[S4]), 9));

    // The node and its checks are gone from the catalog.
    assert!(sm.catalog().node(N1).is_none());
    assert!(sm.catalog().check(N1, SERF_HEALTH).is_none());
    let (checks, index) = sm.query(&ReadQuery::NodeChecks { node: N1.into() });
    assert_eq!((checks, index), (QueryResult::Checks(Vec::new()), 9));
    assert_eq!(sm.catalog().table_index(), 9);
}

/// TestStateStore_Session_Invalidate_Key_Unlock_Behavior in detail, then Consul's
/// TestKVS_Apply_LockDelay: the released key keeps everything but Session, and the next
/// acquire waits out the lock-delay and bumps LockIndex.
#[test]
fn release_invalidation_keeps_key_and_arms_lock_delay() {
    // Setup: S1 holds "lock" with flags and a value; S2 wants it.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    create_session(&mut sm, 4, session(S2, N1));
    let acquire = KvOp::Lock {
        key: "lock".into(),
        value: b"owner".to_vec(),
        flags: 42,
        session: S1.into(),
    };
    write(&mut sm, 5, acquire);

    // Invalidate S1 (a check failure) at index 6, time T0.
    let critical = check(N1, SERF_HEALTH, HealthStatus::Critical);
    let (_, fx) = apply_at(&mut sm, 6, T0, Op::RegisterCheck(critical));
    assert_eq!(fx.sessions_destroyed, strings(&[S1, S2]));
    assert_eq!(fx.kv_keys, strings(&["lock"]));
    let released = KvEntry {
        flags: 42,
        lock_index: 1,
        ..entry("lock", "owner", 5, 6)
    };
    assert_eq!(get(&sm, "lock"), Some(released.clone()));
    assert_eq!(key_index(&sm, "lock"), 6);
    assert_eq!(sm.kv().lock_delay_remaining("lock", T0), Some(15_000));

    // A new session (the node recovered) is refused until T0 + 15 s.
    register_check(&mut sm, 7, check(N1, SERF_HEALTH, HealthStatus::Passing));
    create_session(&mut sm, 8, session(S3, N1));
    let (outcome, fx) = kv_at(&mut sm, 9, T0 + 14_999, vec![op::lock("lock", "new", S3)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"lock\" due to lock delay".into())]
    );
    assert!(fx.kv_keys.is_empty());
    assert_eq!(get(&sm, "lock"), Some(released));

    // At T0 + 15 s the acquire succeeds and LockIndex goes to 2; CreateIndex is kept.
    let (outcome, fx) = kv_at(&mut sm, 10, T0 + 15_000, vec![op::lock("lock", "new", S3)]);
    let want = locked(entry("lock", "new", 5, 10), S3, 2);
    assert_eq!(
        committed(outcome),
        vec![KvEntry {
            value: Vec::new(),
            ..want.clone()
        }]
    );
    assert_eq!(fx.kv_keys, strings(&["lock"]));
    assert_eq!(get(&sm, "lock"), Some(want));
}

/// TestStateStore_Session_Invalidate_Key_Delete_Behavior in detail: the key is deleted (a
/// tombstone keeps the index), and lock-delay still applies to the now-missing key.
#[test]
fn delete_invalidation_removes_key_and_arms_lock_delay() {
    // Setup: delete-behaviour S1 holds two keys under sema/; an unrelated key sorts after.
    let mut sm = world();
    let s1 = Session {
        behavior: Behavior::Delete,
        ..session(S1, N1)
    };
    create_session(&mut sm, 3, s1);
    create_session(&mut sm, 4, session(S2, N1));
    write(&mut sm, 5, op::lock("sema/a", "a", S1));
    write(&mut sm, 6, op::lock("sema/b", "b", S1));
    write(&mut sm, 7, op::set("z", "z"));

    // Destroy S1 at index 8: both keys are deleted in key order and tombstoned.
    let fx = destroy_at(&mut sm, 8, T0, S1);
    assert_eq!(fx.kv_keys, strings(&["sema/a", "sema/b"]));
    assert_eq!(sm.kv().get("sema/a"), None);
    assert_eq!(sm.kv().get("sema/b"), None);
    assert_eq!(sm.kv().tombstone_count(), 2);
    assert_eq!(list(&sm, "sema/"), (Vec::new(), 8));
    assert_eq!(key_index(&sm, "sema/a"), 8);
    assert_eq!(sm.kv().table_index(), 8);

    // Lock-delay holds even though the key does not exist.
    let (outcome, _) = kv_at(&mut sm, 9, T0 + 1, vec![op::lock("sema/a", "x", S2)]);
    assert_eq!(
        failures(outcome),
        vec![(0, "failed to lock key \"sema/a\" due to lock delay".into())]
    );

    // After it, the key is created afresh but its LockIndex continues from the tombstone's
    // (Vigil: a sequencer never goes backwards, even across a delete), so 2, not Consul's 1.
    let (outcome, _) = kv_at(&mut sm, 10, T0 + 15_000, vec![op::lock("sema/a", "x", S2)]);
    committed(outcome);
    assert_eq!(
        get(&sm, "sema/a"),
        Some(locked(entry("sema/a", "x", 10, 10), S2, 2))
    );
}

/// Vigil: LockIndex survives a plain delete and a delete-then-lock inside one transaction, and
/// the reaping of the tombstone too (the reaped LockIndex becomes the floor of every acquire).
#[test]
fn lock_index_continues_across_delete() {
    // Lock twice (LockIndex 2), then delete the key.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("k", "a", S1));
    write(&mut sm, 5, op::unlock("k", "a", S1));
    write(&mut sm, 6, op::lock("k", "a", S1));
    write(&mut sm, 7, KvOp::Delete { key: "k".into() });
    assert_eq!(sm.kv().get("k"), None);

    // Re-locking continues at 3; a plain set of a re-created key keeps the count too.
    write(&mut sm, 8, op::lock("k", "b", S1));
    assert_eq!(sm.kv().get("k").map(|e| e.lock_index), Some(3));
    let (outcome, _) = kv_at(
        &mut sm,
        9,
        T0,
        vec![KvOp::Delete { key: "k".into() }, op::set("k", "c")],
    );
    committed(outcome);
    assert_eq!(sm.kv().get("k").map(|e| e.lock_index), Some(3));

    // Once the tombstone is reaped the key's own history is gone, but the floor is not.
    write(&mut sm, 10, KvOp::Delete { key: "k".into() });
    reap_at(&mut sm, 11, T0 + 1_000_000);
    assert_eq!(sm.kv().tombstone_count(), 0);
    write(&mut sm, 12, op::lock("k", "d", S1));
    assert_eq!(sm.kv().get("k").map(|e| e.lock_index), Some(4));
}
