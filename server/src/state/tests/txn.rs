//! Transactions: all-or-nothing, per-op errors and reads (`txn_test.go`,
//! `txn_endpoint_test.go`).

use super::*;

/// TestStateStore_Txn_KVS: one transaction hitting every verb. Later ops see earlier ones;
/// write results carry no value, read results do; deletes and check-not-exists give none.
#[test]
fn txn_every_verb_result_shape() {
    // Setup: five keys and a session.
    let mut sm = world();
    write(&mut sm, 3, op::set("foo/delete", "bar"));
    write(&mut sm, 4, op::set("foo/bar/baz", "baz"));
    write(&mut sm, 5, op::set("foo/bar/zip", "zip"));
    write(&mut sm, 6, op::set("foo/zorp", "zorp"));
    write(&mut sm, 7, op::set("foo/update", "stale"));
    create_session(&mut sm, 8, session(S1, N1));

    // (op, the results it produces)
    let none = Vec::new;
    #[rustfmt::skip]
    let steps: Vec<(KvOp, Vec<KvEntry>)> = vec![
        (op::get_tree("foo/bar"),                 vec![entry("foo/bar/baz", "baz", 4, 4), entry("foo/bar/zip", "zip", 5, 5)]),
        (op::get_or_empty("foo/update"),          vec![entry("foo/update", "stale", 7, 7)]),
        (op::get_or_empty("foo/nope"),            vec![entry("foo/nope", "", 0, 0)]),
        (op::get("foo/update"),                   vec![entry("foo/update", "stale", 7, 7)]),
        (op::check_index("foo/update", 7),        vec![entry("foo/update", "", 7, 7)]),
        (op::cas("foo/update", "new", 7),         vec![entry("foo/update", "", 7, 9)]),
        (op::get("foo/update"),                   vec![entry("foo/update", "new", 7, 9)]),
        (op::check_index("foo/update", 9),        vec![entry("foo/update", "", 7, 9)]),
        (op::set("foo/set", "set"),               vec![entry("foo/set", "", 9, 9)]),
        (op::lock("foo/lock", "locked", S1),      vec![locked(entry("foo/lock", "", 9, 9), S1, 1)]),
        (op::check_session("foo/lock", S1),       vec![locked(entry("foo/lock", "", 9, 9), S1, 1)]),
        (op::unlock("foo/lock", "unlocked", S1),  vec![KvEntry { lock_index: 1, ..entry("foo/lock", "", 9, 9) }]),
        (op::check_session("foo/lock", ""),       vec![KvEntry { lock_index: 1, ..entry("foo/lock", "", 9, 9) }]),
        (op::check_not_exists("foo/nope"),        none()),
        (op::delete("foo/delete"),                none()),
        (op::delete_cas("foo/zorp", 6),           none()),
        (op::delete_tree("foo/bar"),              none()),
        (op::get_tree("foo/"),                    vec![
            KvEntry { lock_index: 1, ..entry("foo/lock", "unlocked", 9, 9) },
            entry("foo/set", "set", 9, 9),
            entry("foo/update", "new", 7, 9),
        ]),
    ];
    let (ops, want): (Vec<KvOp>, Vec<Vec<KvEntry>>) = steps.into_iter().unzip();

    // Apply at index 9: results come back flattened, in op order.
    let (outcome, fx) = kv(&mut sm, 9, ops);
    assert_eq!(committed(outcome), want.concat());

    // Effects and the committed table.
    assert_eq!(
        fx.kv_keys,
        strings(&[
            "foo/bar/baz",
            "foo/bar/zip",
            "foo/delete",
            "foo/lock",
            "foo/set",
            "foo/update",
            "foo/zorp"
        ])
    );
    assert_eq!(sm.kv().table_index(), 9);
    assert_eq!(
        sm.kv().tombstone_count(),
        3,
        "foo/delete, foo/zorp and the foo/bar prefix"
    );
    assert_eq!(list(&sm, "").0, want[want.len() - 1]);
    assert_eq!(
        sm.kv().held_by(S1).count(),
        0,
        "locked and unlocked in the same txn"
    );
}

/// TestStateStore_Txn_KVS_Rollback: every failing op is reported, in order, with Consul's
/// text; the ops that would have succeeded are not applied either.
#[test]
fn txn_rollback_reports_every_error_in_order() {
    // Setup: S1 holds foo/lock; S2 is another live session.
    let mut sm = world();
    write(&mut sm, 3, op::set("foo/delete", "bar"));
    write(&mut sm, 4, op::set("foo/update", "stale"));
    create_session(&mut sm, 5, session(S1, N1));
    create_session(&mut sm, 6, session(S2, N1));
    write(&mut sm, 7, op::lock("foo/lock", "", S1));
    let session_mismatch =
        format!("failed session check for key \"foo/lock\", current session \"{S1}\" != \"{S2}\"");

    // (op, None if it would succeed, else its `What`)
    #[rustfmt::skip]
    let steps: Vec<(KvOp, Option<&str>)> = vec![
        (op::cas("foo/update", "new", 1),       Some("failed to set key \"foo/update\", index is stale")),
        (op::set("foo/new", "fine"),            None),
        (op::lock("foo/lock", "", S2),          Some("failed to lock key \"foo/lock\", lock is already held")),
        (op::unlock("foo/lock", "", S2),        Some("failed to unlock key \"foo/lock\", lock isn't held, or is held by another session")),
        (op::check_session("foo/lock", S2),     Some(&session_mismatch)),
        (op::get("nope"),                       Some("key \"nope\" doesn't exist")),
        (op::check_session("nope", S2),         Some("failed to check session, key \"nope\" doesn't exist")),
        (op::check_index("foo/lock", 6),        Some("failed index check for key \"foo/lock\", current modify index 7 != 6")),
        (op::check_index("nope", 6),            Some("failed to check index, key \"nope\" doesn't exist")),
        (op::delete("foo/delete"),              None),
        (op::delete_cas("foo/update", 1),       Some("failed to delete key \"foo/update\", index is stale")),
        (op::check_not_exists("foo/update"),    Some("key \"foo/update\" exists")),
        (op::lock("foo/x", "", ""),             Some("missing session")),
        (op::lock("foo/x", "", "bogus"),        Some("invalid session \"bogus\"")),
        (op::set("", "no key"),                 Some("Must provide key")),
        (op::get_or_empty("nope"),              None),
    ];
    let want: Vec<(usize, String)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, (_, what))| what.map(|w| (i, w.to_owned())))
        .collect();
    let ops = steps.into_iter().map(|(op, _)| op).collect();

    let before = sm.clone();
    let (outcome, fx) = kv(&mut sm, 8, ops);
    assert_eq!(failures(outcome), want);
    assert_eq!(fx, Effects::default());
    assert_unchanged(&sm, &before, "nothing applied");
}

/// TestTxn_CheckNotExists: check-not-exists then set succeeds once; the second run fails with
/// exactly `op 0: key "test" exists`.
#[test]
fn txn_check_not_exists_then_set() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let txn = || vec![op::check_not_exists("test"), op::set("test", "hello")];

    let (outcome, _) = kv(&mut sm, 1, txn());
    assert_eq!(committed(outcome), vec![entry("test", "", 1, 1)]);

    let (outcome, _) = kv(&mut sm, 2, txn());
    let TxnOutcome::RolledBack(errors) = outcome else {
        panic!("the second run must fail");
    };
    let text: Vec<String> = errors
        .iter()
        .map(|e| format!("op {}: {}", e.op_index, e.error))
        .collect();
    assert_eq!(text, ["op 0: key \"test\" exists"]);
}

/// TestStateStore_Txn_KVS_ModifyIndexes: an unchanged set keeps its ModifyIndex, a changed one
/// gets the transaction's index; only the changed key is touched.
#[test]
fn txn_unchanged_set_keeps_modify_index() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    write(&mut sm, 1, op::set("foo/a", "1"));
    write(&mut sm, 2, op::set("foo/b", "2"));

    let (outcome, fx) = kv(
        &mut sm,
        3,
        vec![op::set("foo/a", "new"), op::set("foo/b", "2")],
    );
    assert_eq!(
        committed(outcome),
        vec![entry("foo/a", "", 1, 3), entry("foo/b", "", 2, 2)]
    );
    assert_eq!(fx.kv_keys, strings(&["foo/a"]));
    let (entries, index) = list(&sm, "");
    assert_eq!(
        entries,
        vec![entry("foo/a", "new", 1, 3), entry("foo/b", "2", 2, 2)]
    );
    assert_eq!(index, 3);
}

/// TestStateStore_Txn_KVS_RO / _RO_Safety and TestTxnEndpoint_KV_Actions' read path: a
/// read-only transaction answers from the current table at the KV table index, and never
/// changes state, even if handed a write verb.
#[test]
fn txn_read_only_query() {
    // Setup: S1 holds "lock"; "plain" is unlocked.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("lock", "held", S1));
    write(&mut sm, 5, op::set("plain", "p"));

    // Reads succeed, with values on get/get-tree and none on the checks.
    let reads = vec![
        op::get("lock"),
        op::get_tree(""),
        op::check_index("plain", 5),
        op::check_session("lock", S1),
        op::check_session("plain", ""),
        op::check_not_exists("nope"),
        op::get_or_empty("nope"),
    ];
    let held = locked(entry("lock", "held", 4, 4), S1, 1);
    let want = vec![
        held.clone(),
        held.clone(),
        entry("plain", "p", 5, 5),
        entry("plain", "", 5, 5),
        locked(entry("lock", "", 4, 4), S1, 1),
        entry("plain", "", 5, 5),
        entry("nope", "", 0, 0),
    ];
    let (result, index) = sm.query(&ReadQuery::Txn { ops: reads });
    assert_eq!(result, QueryResult::Txn(TxnOutcome::Committed(want)));
    assert_eq!(index, 5);

    // A failing read reports its error.
    let (result, _) = sm.query(&ReadQuery::Txn {
        ops: vec![op::get("nope"), op::check_index("plain", 1)],
    });
    let QueryResult::Txn(outcome) = result else {
        panic!("a read txn answers with a txn outcome");
    };
    assert_eq!(
        failures(outcome),
        vec![
            (0, "key \"nope\" doesn't exist".into()),
            (
                1,
                "failed index check for key \"plain\", current modify index 5 != 1".into()
            ),
        ]
    );

    // Safety: write verbs handed to the read path are refused, each reported, and change nothing.
    let before = sm.clone();
    let writes = vec![
        op::get("plain"),
        op::set("x", "y"),
        op::delete("plain"),
        op::delete_tree(""),
        op::unlock("lock", "", S1),
    ];
    let (result, _) = sm.query(&ReadQuery::Txn { ops: writes });
    let QueryResult::Txn(outcome) = result else {
        panic!("expected a txn result, got {result:?}");
    };
    let refused: Vec<usize> = failures(outcome).into_iter().map(|(i, _)| i).collect();
    assert_eq!(refused, vec![1, 2, 3, 4]);
    assert_unchanged(&sm, &before, "nothing changed");
}
