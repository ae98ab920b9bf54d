//! `PUT /v1/txn` against a real dev agent: every KV verb's result shape, all-or-nothing
//! conflicts reporting every failing op, the read-only path, lock-delay, and the body limits
//! (docs/consul-compatibility.md#transactions, #consul-tests-mirrored), with Vigil's LockIndex rule
//! (#deliberate-differences, difference 1).

use std::time::Duration;

use integration_tests::{Agent, Reply, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{arm_lock_delay, assert_error, assert_not_found, b64, kv_state};

async fn txn(agent: &Agent, ops: &Value) -> Reply {
    agent.put("/v1/txn", ops.to_string()).await
}

/// A transaction that must commit; returns its `Results`.
async fn txn_ok(agent: &Agent, ops: &Value) -> Vec<Value> {
    let reply = txn(agent, ops).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["Errors"], Value::Null, "{body}");
    body["Results"].as_array().expect("Results array").clone()
}

/// A transaction that must conflict; returns its `Errors` after checking the 409 shape.
async fn txn_conflict(agent: &Agent, ops: &Value) -> Value {
    let reply = txn(agent, ops).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.text());
    assert_eq!(
        reply.header("Content-Type").as_deref(),
        Some("application/json")
    );
    let body = reply.json();
    assert_eq!(body["Results"], Value::Null, "{body}");
    body["Errors"].clone()
}

fn kv(verb: &str, key: &str) -> Value {
    json!({ "KV": { "Verb": verb, "Key": key } })
}

fn kv_with(verb: &str, key: &str, fields: Value) -> Value {
    let mut op = kv(verb, key);
    for (k, v) in fields.as_object().expect("fields object") {
        op["KV"][k] = v.clone();
    }
    op
}

#[tokio::test]
async fn every_verb_has_its_result_shape_writes_without_values_reads_with_them() {
    let agent = Agent::dev().await;
    let s = agent.session("{}").await;

    // Writes and reads in one transaction: later ops see earlier writes; write results carry
    // Value null, reads carry the value; check-not-exists and delete produce no result.
    let results = txn_ok(
        &agent,
        &json!([
            kv_with("set", "foo/new", json!({ "Value": b64("one"), "Flags": 5 })),
            kv_with("cas", "foo/cas", json!({ "Value": b64("two"), "Index": 0 })),
            kv_with(
                "lock",
                "foo/lock",
                json!({ "Value": b64("three"), "Session": s })
            ),
            kv("get", "foo/new"),
            kv("get-or-empty", "foo/missing"),
            kv("check-not-exists", "foo/missing"),
            kv("delete", "foo/missing"),
            kv("get-tree", "foo/"),
        ]),
    )
    .await;
    let i = results[0]["KV"]["ModifyIndex"].as_u64().expect("index");
    let entry_json = |key: &str, flags: u64, value: Option<&str>, lock: Option<&str>| {
        let mut e = json!({
            "LockIndex": u64::from(lock.is_some()),
            "Key": key,
            "Flags": flags,
            "Value": value.map(b64),
            "CreateIndex": i,
            "ModifyIndex": i,
        });
        if let Some(s) = lock {
            e["Session"] = json!(s);
        }
        json!({ "KV": e })
    };
    assert_eq!(
        results,
        vec![
            entry_json("foo/new", 5, None, None),
            entry_json("foo/cas", 0, None, None),
            entry_json("foo/lock", 0, None, Some(&s)),
            entry_json("foo/new", 5, Some("one"), None),
            json!({ "KV": {
                "LockIndex": 0, "Key": "foo/missing", "Flags": 0, "Value": null,
                "CreateIndex": 0, "ModifyIndex": 0,
            }}),
            entry_json("foo/cas", 0, Some("two"), None),
            entry_json("foo/lock", 0, Some("three"), Some(&s)),
            entry_json("foo/new", 5, Some("one"), None),
        ]
    );

    // Checks, unlock and the deletes: checks answer the entry without its value, unlock answers
    // the released entry (LockIndex kept), deletes answer nothing.
    let results = txn_ok(
        &agent,
        &json!([
            kv_with("check-index", "foo/new", json!({ "Index": i })),
            kv_with("check-session", "foo/lock", json!({ "Session": s })),
            kv_with("check-session", "foo/new", json!({ "Session": "" })),
            kv_with(
                "unlock",
                "foo/lock",
                json!({ "Session": s, "Value": b64("rel") })
            ),
            kv_with("delete-cas", "foo/cas", json!({ "Index": i })),
            kv("delete-tree", "foo/n"),
            kv("get-tree", "foo/"),
        ]),
    )
    .await;
    assert_eq!(results.len(), 5, "{results:?}");
    assert_eq!(results[0], entry_json("foo/new", 5, None, None));
    assert_eq!(results[1], entry_json("foo/lock", 0, None, Some(&s)));
    assert_eq!(results[2], entry_json("foo/new", 5, None, None));
    let j = results[3]["KV"]["ModifyIndex"].as_u64().unwrap();
    assert!(j > i);
    assert_eq!(
        results[3],
        json!({ "KV": {
            "LockIndex": 1, "Key": "foo/lock", "Flags": 0, "Value": null,
            "CreateIndex": i, "ModifyIndex": j,
        }})
    );
    assert_eq!(results[4]["KV"]["Key"], json!("foo/lock"));
    assert_eq!(results[4]["KV"]["Value"], json!(b64("rel")));

    // The store agrees.
    assert_not_found(&agent, "/v1/kv/foo/cas").await;
    assert_not_found(&agent, "/v1/kv/foo/new").await;
    assert_eq!(results[4]["KV"], agent.kv_entry("foo/lock").await);
}

#[tokio::test]
async fn a_conflict_reports_every_failing_op_in_order_and_applies_nothing() {
    let agent = Agent::dev().await;
    let s1 = agent.session("{}").await;
    let s2 = agent.session("{}").await;
    agent.put_true("/v1/kv/a", "a").await;
    agent.put_true(&format!("/v1/kv/l?acquire={s1}"), "l").await;
    let m = agent.kv_entry("a").await["ModifyIndex"].as_u64().unwrap();
    let bogus = "00000000-0000-0000-0000-000000000000";
    let before = kv_state(&agent).await;

    // TestStateStore_Txn_KVS_Rollback: valid writes mixed with every kind of failure.
    let errors = txn_conflict(
        &agent,
        &json!([
            kv_with("set", "new", json!({ "Value": b64("x") })),
            kv_with("cas", "a", json!({ "Index": m + 100 })),
            kv_with("lock", "l", json!({ "Session": s2 })),
            kv_with("unlock", "a", json!({ "Session": s2 })),
            kv_with("check-index", "a", json!({ "Index": m + 1 })),
            kv_with("check-index", "missing", json!({ "Index": 1 })),
            kv_with("check-session", "l", json!({ "Session": s2 })),
            kv_with("check-session", "missing", json!({ "Session": s2 })),
            kv("check-not-exists", "a"),
            kv_with("delete-cas", "a", json!({ "Index": m + 100 })),
            kv("get", "missing"),
            kv_with("lock", "z", json!({ "Session": "" })),
            kv_with("lock", "z", json!({ "Session": bogus })),
            kv("delete", "a"),
        ]),
    )
    .await;
    let whats = [
        r#"failed to set key "a", index is stale"#.to_owned(),
        r#"failed to lock key "l", lock is already held"#.to_owned(),
        r#"failed to unlock key "a", lock isn't held, or is held by another session"#.to_owned(),
        format!(
            r#"failed index check for key "a", current modify index {m} != {}"#,
            m + 1
        ),
        r#"failed to check index, key "missing" doesn't exist"#.to_owned(),
        format!(r#"failed session check for key "l", current session "{s1}" != "{s2}""#),
        r#"failed to check session, key "missing" doesn't exist"#.to_owned(),
        r#"key "a" exists"#.to_owned(),
        r#"failed to delete key "a", index is stale"#.to_owned(),
        r#"key "missing" doesn't exist"#.to_owned(),
        "missing session".to_owned(),
        format!(r#"invalid session "{bogus}""#),
    ];
    let expected: Vec<Value> = whats
        .iter()
        .enumerate()
        .map(|(n, what)| json!({ "OpIndex": n + 1, "What": what }))
        .collect();
    assert_eq!(errors, json!(expected));

    // Nothing was applied: not the set, not the delete, not even the index.
    assert_eq!(kv_state(&agent).await, before);
}

#[tokio::test]
async fn read_only_txn_sets_leader_headers_but_no_index() {
    let agent = Agent::dev().await;
    agent.put_true("/v1/kv/r/1", "one").await;
    agent.put_true("/v1/kv/r/2", "two").await;
    let before = kv_state(&agent).await;

    // Only reads: answered from state, with KnownLeader and LastContact but no X-Consul-Index.
    let reply = txn(
        &agent,
        &json!([
            kv("get", "r/1"),
            kv("get-tree", "r/"),
            kv("check-not-exists", "r/3")
        ]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.header("X-Consul-KnownLeader").as_deref(),
        Some("true")
    );
    assert_eq!(reply.header("X-Consul-LastContact").as_deref(), Some("0"));
    assert_eq!(reply.header("X-Consul-Index"), None);
    let body = reply.json();
    assert_eq!(body["Errors"], Value::Null);
    let values: Vec<&Value> = body["Results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["KV"]["Value"])
        .collect();
    assert_eq!(
        values,
        [&json!(b64("one")), &json!(b64("one")), &json!(b64("two"))]
    );

    // A failing read-only transaction is a 409 with the same headers and still no index.
    let reply = txn(&agent, &json!([kv("get", "r/1"), kv("get", "r/9")])).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(
        reply.header("X-Consul-KnownLeader").as_deref(),
        Some("true")
    );
    assert_eq!(reply.header("X-Consul-Index"), None);
    assert_eq!(
        reply.json(),
        json!({ "Results": null, "Errors": [{ "OpIndex": 1, "What": r#"key "r/9" doesn't exist"# }] })
    );

    // Reads write nothing.
    assert_eq!(kv_state(&agent).await, before);
}

#[tokio::test]
async fn txn_lock_then_cas_keeps_lock_index_and_session() {
    // TestTxnEndpoint_KV_Actions, with Vigil's rule that LockIndex never decreases.
    let agent = Agent::dev().await;
    let s = agent.session("{}").await;

    // Lock and read in one transaction: LockIndex 1; the write result has no value, the read
    // result has it.
    let results = txn_ok(
        &agent,
        &json!([
            kv_with(
                "lock",
                "key",
                json!({ "Value": b64("test"), "Flags": 23, "Session": s })
            ),
            kv("get", "key"),
        ]),
    )
    .await;
    assert_eq!(results[0]["KV"]["LockIndex"], json!(1));
    assert_eq!(results[0]["KV"]["Session"], json!(s));
    assert_eq!(results[0]["KV"]["Value"], Value::Null);
    assert_eq!(results[1]["KV"]["Value"], json!(b64("test")));
    assert_eq!(results[1]["KV"]["Flags"], json!(23));
    let index = results[0]["KV"]["ModifyIndex"].as_u64().unwrap();

    // A cas on the locked key keeps the Session and (Vigil) keeps LockIndex 1; Flags come from
    // the request.
    let results = txn_ok(
        &agent,
        &json!([kv_with(
            "cas",
            "key",
            json!({ "Value": b64("new"), "Index": index })
        )]),
    )
    .await;
    let after = &results[0]["KV"];
    assert_eq!(after["LockIndex"], json!(1));
    assert_eq!(after["Flags"], json!(0));
    assert_eq!(after["Session"], json!(s));
    assert_eq!(after["Value"], Value::Null);
    assert!(after["ModifyIndex"].as_u64().unwrap() > index);

    // A lock with a session that does not exist is a 409 naming it, and changes nothing.
    let before = kv_state(&agent).await;
    let errors = txn_conflict(
        &agent,
        &json!([kv_with("lock", "key", json!({ "Session": "nope" }))]),
    )
    .await;
    assert_eq!(
        errors,
        json!([{ "OpIndex": 0, "What": r#"invalid session "nope""# }])
    );
    assert_eq!(kv_state(&agent).await, before);
}

#[tokio::test]
async fn check_not_exists_passes_once_then_fails_with_key_exists() {
    // TestTxn_CheckNotExists.
    let agent = Agent::dev().await;
    let ops = json!([
        kv("check-not-exists", "test"),
        kv_with("set", "test", json!({ "Value": b64("hello") })),
    ]);

    // First run: the key is absent, so the set commits (one result: the set).
    let results = txn_ok(&agent, &ops).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["KV"]["Key"], json!("test"));
    let stored = agent.kv_entry("test").await;

    // Second run: op 0 fails with exactly `key "test" exists`, and nothing is rewritten.
    let errors = txn_conflict(&agent, &ops).await;
    assert_eq!(
        errors,
        json!([{ "OpIndex": 0, "What": r#"key "test" exists"# }])
    );
    assert_eq!(agent.kv_entry("test").await, stored);
}

#[tokio::test]
async fn txn_lock_is_refused_during_lock_delay_and_succeeds_after_it() {
    // TestTxn_Apply_LockDelay.
    let agent = Agent::dev().await;

    // Invalidating the holder arms the key's lock-delay.
    arm_lock_delay(&agent, "test", "3s").await;
    let s2 = agent.session("{}").await;
    let released = agent.kv_entry("test").await;

    // A txn lock now is a 409 explaining the lock delay, and nothing is written.
    let lock = json!([kv_with(
        "lock",
        "test",
        json!({ "Value": b64("s2"), "Session": s2 })
    )]);
    let errors = txn_conflict(&agent, &lock).await;
    assert_eq!(
        errors,
        json!([{ "OpIndex": 0, "What": r#"failed to lock key "test" due to lock delay"# }])
    );
    assert_eq!(agent.kv_entry("test").await, released);

    // Once the delay has passed, the same transaction commits: LockIndex 2, held by s2.
    let results = eventually(Duration::from_secs(20), "lock-delay to pass", || async {
        let reply = txn(&agent, &lock).await;
        (reply.status == StatusCode::OK).then(|| reply.json())
    })
    .await;
    assert_eq!(results["Results"][0]["KV"]["LockIndex"], json!(2));
    assert_eq!(results["Results"][0]["KV"]["Session"], json!(s2));
}

#[tokio::test]
async fn unknown_verb_is_a_409_and_nothing_is_applied() {
    let agent = Agent::dev().await;
    agent.put_true("/v1/kv/seed", "x").await;
    let before = kv_state(&agent).await;

    // The verb is checked before anything is applied; only the bad op is reported.
    let errors = txn_conflict(
        &agent,
        &json!([
            kv_with("set", "new", json!({ "Value": b64("x") })),
            kv("frobnicate", "seed"),
        ]),
    )
    .await;
    assert_eq!(
        errors,
        json!([{ "OpIndex": 1, "What": "unknown KV operation: frobnicate" }])
    );
    assert_eq!(kv_state(&agent).await, before);
}

#[tokio::test]
async fn txn_field_names_match_case_insensitively() {
    let agent = Agent::dev().await;

    // Lowercase (py-consul style) field names write…
    let results = txn_ok(
        &agent,
        &json!([{ "kv": { "verb": "set", "key": "k", "value": b64("v"), "flags": 3 } }]),
    )
    .await;
    assert_eq!(results[0]["KV"]["Flags"], json!(3));

    // …and any other casing reads; responses are always PascalCase.
    let results = txn_ok(&agent, &json!([{ "Kv": { "VERB": "get", "kEy": "k" } }])).await;
    assert_eq!(
        results[0]["KV"]["Value"],
        json!(b64("v")),
        "{:?}",
        results[0]
    );
    assert_eq!(results[0]["KV"]["Key"], json!("k"));
}

#[tokio::test]
async fn malformed_txn_bodies_are_400_and_apply_nothing() {
    // TestTxnEndpoint_Bad_JSON and strict decoding.
    let agent = Agent::dev().await;
    agent.put_true("/v1/kv/seed", "x").await;
    let before = kv_state(&agent).await;

    let bodies = [
        r#"[{"KV":{"Verb":"set","Key":"new""#.to_owned(),
        "not json".to_owned(),
        r#"{"KV":{"Verb":"set","Key":"new"}}"#.to_owned(),
        r#"[{"KV":{"Verb":"set","Key":"new","Bogus":1}}]"#.to_owned(),
        r#"[{"KV":{"Verb":"set","Key":"new","Value":"!!not base64!!"}}]"#.to_owned(),
        r#"[{"KV":{"Verb":"set","Key":"new","Flags":"x"}}]"#.to_owned(),
    ];
    for body in bodies {
        // Each is a 400 with Consul's prefix and plain-text body…
        let reply = agent.put("/v1/txn", body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            reply.text().starts_with("Failed to parse body: "),
            "{body}: {}",
            reply.text()
        );
        assert_eq!(
            reply.header("Content-Type").as_deref(),
            Some("text/plain; charset=utf-8")
        );

        // …and the store is untouched.
        assert_eq!(kv_state(&agent).await, before, "{body}");
    }
}

#[tokio::test]
async fn txn_over_128_ops_is_413_and_exactly_128_commit() {
    // TestTxnEndpoint_Bad_Size_Ops.
    let agent = Agent::dev().await;
    let sets = |n: usize, prefix: &str| -> Value {
        Value::Array(
            (0..n)
                .map(|i| {
                    kv_with(
                        "set",
                        &format!("{prefix}/{i}"),
                        json!({ "Value": b64("v") }),
                    )
                })
                .collect(),
        )
    };

    // 129 ops: 413 with Consul's text, nothing applied.
    agent.put_true("/v1/kv/seed", "x").await;
    let before = kv_state(&agent).await;
    let reply = txn(&agent, &sets(129, "big")).await;
    assert_error(
        &reply,
        StatusCode::PAYLOAD_TOO_LARGE,
        "Transaction contains too many operations (129 > 128)",
    );
    assert_eq!(kv_state(&agent).await, before);

    // 128 ops is within the limit: all commit.
    let results = txn_ok(&agent, &sets(128, "ok")).await;
    assert_eq!(results.len(), 128);
    let keys = agent.get("/v1/kv/ok/?keys").await.json();
    assert_eq!(keys.as_array().unwrap().len(), 128);
}

#[tokio::test]
async fn txn_with_a_value_over_512_kib_is_413_and_applies_nothing() {
    // TestTxnEndpoint_Bad_Size_Item / _Net: a value over kv_max_value_size makes the body
    // exceed txn_max_req_len (both 512 KiB), so the body check answers first, as in Consul.
    let agent = Agent::dev().await;
    agent.put_true("/v1/kv/seed", "x").await;
    let before = kv_state(&agent).await;
    let big = vec![b'x'; 512 * 1024 + 1];
    let body = json!([
        kv_with("set", "small", json!({ "Value": b64("ok") })),
        kv_with("set", "big", json!({ "Value": b64(&big) })),
    ])
    .to_string();
    let len = body.len();
    let reply = agent.put("/v1/txn", body).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        reply.text(),
        format!(
            "Request body({len} bytes) too large, max size: 524288 bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#txn_max_req_len."
        )
    );
    assert_eq!(kv_state(&agent).await, before);

    // A large value whose base64 body stays under the limit commits.
    let fits = vec![b'y'; 300 * 1024];
    let results = txn_ok(
        &agent,
        &json!([kv_with("set", "fits", json!({ "Value": b64(&fits) }))]),
    )
    .await;
    assert_eq!(results.len(), 1);
    let raw = agent.get("/v1/kv/fits?raw").await;
    assert_eq!(raw.body.len(), fits.len());
}
