//! Sessions over HTTP against a real dev agent: create defaults and Consul's check-list fix-up,
//! case-insensitive bodies, LockDelay and TTL inputs, exact error codes and texts (Consul's 500
//! for what servers refuse, 400 for undecodable bodies; index unmoved), destroy / info / renew /
//! list / node, invalidation of held keys, and blocking reads.
//! Mirrors docs/consul-compatibility.md#sessions and #consul-tests-mirrored.

use std::time::{Duration, Instant};

use integration_tests::{Agent, Reply};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{
    assert_error, assert_error_prefix, assert_gets_answer, assert_plain_error, assert_waits_out,
};

/// The sessions table index, as `/v1/session/list` reports it.
async fn sessions_index(agent: &Agent) -> u64 {
    let reply = agent.get("/v1/session/list").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.index()
}

/// The one session `info` returns for `id`.
async fn info(agent: &Agent, id: &str) -> Value {
    let reply = agent.get(&format!("/v1/session/info/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let list = reply.json();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "info {id}: {list}");
    list[0].clone()
}

/// Asserts a plain-text 400 with exactly `message`.
fn assert_bad_request(reply: &Reply, message: &str) {
    assert_plain_error(reply, StatusCode::BAD_REQUEST, message);
}

/// Asserts a plain-text 500 with exactly `message`: what Consul answers for everything its
/// servers refuse, and what real clients match on.
fn assert_server_error(reply: &Reply, message: &str) {
    assert_plain_error(reply, StatusCode::INTERNAL_SERVER_ERROR, message);
}

#[tokio::test]
async fn create_without_body_uses_consul_defaults() {
    // An empty body takes every default: this agent's node, serfHealth, 15 s lock-delay, release.
    let agent = Agent::dev().await;
    let reply = agent.put("/v1/session/create", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.header("X-Consul-Index"),
        None,
        "create sends no index header"
    );
    let body = reply.json();
    let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["ID"]);
    let id = body["ID"].as_str().expect("ID").to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");

    // The stored session has Consul's shape and field order; Checks is omitted when empty.
    let read = agent.get(&format!("/v1/session/info/{id}")).await;
    let session = read.json()[0].clone();
    let fields: Vec<&str> = session
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        [
            "ID",
            "Name",
            "Node",
            "LockDelay",
            "Behavior",
            "TTL",
            "NodeChecks",
            "ServiceChecks",
            "CreateIndex",
            "ModifyIndex"
        ]
    );
    assert_eq!(session["ID"], json!(id));
    assert_eq!(session["Name"], json!(""));
    assert_eq!(session["Node"], json!("test-node"));
    assert_eq!(session["Node"], json!(agent.node));
    assert_eq!(session["LockDelay"], json!(15_000_000_000u64));
    assert_eq!(session["Behavior"], json!("release"));
    assert_eq!(session["TTL"], json!(""));
    assert_eq!(session["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(session["ServiceChecks"], Value::Null);

    // Sessions are never updated, and the read's index is the table index: this create.
    assert_eq!(session["CreateIndex"], session["ModifyIndex"]);
    assert_eq!(json!(read.index()), session["CreateIndex"]);

    // `{}` means the same as no body.
    let id = agent.session("{}").await;
    let session = info(&agent, &id).await;
    assert_eq!(session["NodeChecks"], json!(["serfHealth"]));
    assert_eq!(session["LockDelay"], json!(15_000_000_000u64));
    assert_eq!(session["Behavior"], json!("release"));
    assert!(session.get("Checks").is_none(), "{session}");
}

#[tokio::test]
async fn check_lists_follow_consul_fixup_rules() {
    // Each body of the check-list matrix (docs/consul-compatibility.md#check-lists-on-create) gives
    // the stored NodeChecks, with legacy Checks dropped.
    let agent = Agent::dev().await;
    let cases = [
        (r#"{"Checks":["serfHealth"]}"#, json!(["serfHealth"])),
        (r#"{"NodeChecks":["serfHealth"]}"#, json!(["serfHealth"])),
        (r#"{"NodeChecks":[]}"#, json!([])),
        (r#"{"Checks":[]}"#, json!([])),
        (r#"{"Checks":null}"#, json!([])),
        (
            r#"{"Checks":["serfHealth"],"NodeChecks":["serfHealth"]}"#,
            json!(["serfHealth"]),
        ),
    ];
    for (body, node_checks) in cases {
        let id = agent.session(body).await;
        let session = info(&agent, &id).await;
        assert_eq!(session["NodeChecks"], node_checks, "body {body}: {session}");
        assert!(
            session.get("Checks").is_none(),
            "body {body}: Checks omitted: {session}"
        );
        assert_eq!(session["ServiceChecks"], Value::Null, "body {body}");
    }

    // A check the node does not have fails the create, through any of the three lists, and
    // leaves the sessions index where it was.
    let before = sessions_index(&agent).await;
    for body in [
        r#"{"NodeChecks":["x"]}"#,
        r#"{"Checks":["x"]}"#,
        r#"{"ServiceChecks":[{"ID":"x"}]}"#,
        r#"{"NodeChecks":["serfHealth","x"]}"#,
    ] {
        let reply = agent.put("/v1/session/create", body).await;
        assert_server_error(&reply, "apply failed: Missing check 'x' registration");
    }
    assert_eq!(sessions_index(&agent).await, before);
}

#[tokio::test]
async fn create_bodies_decode_case_insensitively() {
    // py-consul sends lowercase names; they must mean the same as Consul's PascalCase, and
    // so must the Go client's spelling (LockDelay as milliseconds, as `api.Session.Create`
    // sends it).
    let agent = Agent::dev().await;
    let py = r#"{"name":"py","lockdelay":"15s","ttl":"20s","behavior":"delete"}"#;
    let go = r#"{"Name":"go","LockDelay":"15000ms","TTL":"10s","Behavior":"release"}"#;
    for (body, name, ttl, behavior) in [(py, "py", "20s", "delete"), (go, "go", "10s", "release")] {
        let session = info(&agent, &agent.session(body).await).await;
        assert_eq!(session["Name"], json!(name));
        assert_eq!(session["LockDelay"], json!(15_000_000_000u64));
        assert_eq!(session["TTL"], json!(ttl));
        assert_eq!(session["Behavior"], json!(behavior));
        assert_eq!(session["Node"], json!("test-node"));
    }

    // Any mix of case works, including node and check lists.
    let id = agent
        .session(r#"{"NAME":"mixed","nOdE":"test-node","nodechecks":[],"BeHaViOr":"delete"}"#)
        .await;
    let session = info(&agent, &id).await;
    assert_eq!(session["Name"], json!("mixed"));
    assert_eq!(session["NodeChecks"], json!([]));
    assert_eq!(session["Behavior"], json!("delete"));

    // Unknown fields in a session body are ignored, as Consul's lenient decoder does.
    let id = agent.session(r#"{"Name":"extra","Bogus":1}"#).await;
    assert_eq!(info(&agent, &id).await["Name"], json!("extra"));
}

#[tokio::test]
async fn lock_delay_accepts_strings_numbers_and_small_numbers_as_seconds() {
    // Strings are Go durations; numbers are nanoseconds, or seconds below 1000; 0 means none;
    // values above the 60 s cap are stored as given (the cap applies at use).
    let agent = Agent::dev().await;
    let cases = [
        (json!("20s"), 20_000_000_000u64),
        (json!("500ms"), 500_000_000),
        (json!("1m30s"), 90_000_000_000),
        (json!("120s"), 120_000_000_000),
        (json!("0s"), 0),
        (json!(5), 5_000_000_000),
        (json!(999), 999_000_000_000),
        (json!(1000), 1000),
        (json!(2_000_000_000u64), 2_000_000_000),
        (json!(0), 0),
    ];
    for (input, stored) in cases {
        let body = json!({ "LockDelay": input }).to_string();
        let id = agent.session(&body).await;
        assert_eq!(
            info(&agent, &id).await["LockDelay"],
            json!(stored),
            "LockDelay {input}"
        );
    }

    // An unparsable LockDelay is a decode error.
    let before = sessions_index(&agent).await;
    let reply = agent
        .put("/v1/session/create", r#"{"LockDelay":"soon"}"#)
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert!(
        reply.text().starts_with("Request decode failed: "),
        "{}",
        reply.text()
    );
    assert_eq!(sessions_index(&agent).await, before);
}

#[tokio::test]
async fn ttl_inputs_within_bounds_are_stored_as_given() {
    // The agent's minimum is 1s here; both ends of [1s, 24h] are inclusive; zero means no TTL.
    let agent = Agent::dev().await;
    for ttl in ["1s", "1000ms", "10s", "24h", "0s", "0", ""] {
        let body = json!({ "TTL": ttl }).to_string();
        let id = agent.session(&body).await;
        assert_eq!(info(&agent, &id).await["TTL"], json!(ttl), "TTL {ttl:?}");
    }
}

#[tokio::test]
async fn bad_create_inputs_are_500_with_consul_text_and_leave_the_index_alone() {
    // Every rejected create answers Consul's 500 and message, and creates nothing.
    let agent = Agent::dev().await;
    let before = sessions_index(&agent).await;
    let cases = [
        (r#"{"Behavior":"x"}"#, "Invalid Behavior setting 'x'"),
        (
            r#"{"behavior":"DELETE!"}"#,
            "Invalid Behavior setting 'DELETE!'",
        ),
        (
            r#"{"TTL":"10z"}"#,
            r#"Session TTL '10z' invalid: time: unknown unit "z" in duration "10z""#,
        ),
        (
            r#"{"TTL":"100000s"}"#,
            "Invalid Session TTL '100000000000000', must be between [1s=24h0m0s]",
        ),
        (
            r#"{"TTL":"500ms"}"#,
            "Invalid Session TTL '500000000', must be between [1s=24h0m0s]",
        ),
        (
            r#"{"TTL":"24h0m1s"}"#,
            "Invalid Session TTL '86401000000000', must be between [1s=24h0m0s]",
        ),
        (r#"{"Node":""}"#, "Must provide Node"),
        (
            r#"{"Node":"nope"}"#,
            "apply failed: Missing node registration",
        ),
        (
            r#"{"NodeChecks":["x"]}"#,
            "apply failed: Missing check 'x' registration",
        ),
    ];
    for (body, message) in cases {
        let reply = agent.put("/v1/session/create", body).await;
        assert_server_error(&reply, message);
        assert_eq!(sessions_index(&agent).await, before, "after {body}");
    }

    // Bodies that are not a JSON object are decode failures.
    for body in ["{", "not json", r#"{"Name":}"#, "[]", r#"{"TTL":5}"#] {
        let reply = agent.put("/v1/session/create", body).await;
        assert_error_prefix(&reply, StatusCode::BAD_REQUEST, "Request decode failed: ");
        assert_eq!(sessions_index(&agent).await, before, "after {body}");
    }

    // Nothing was created.
    assert_eq!(agent.get("/v1/session/list").await.json(), json!([]));
}

#[tokio::test]
async fn unknown_sessions_destroy_true_info_empty_renew_404() {
    // Destroy is idempotent and needs no valid UUID; it moves no index.
    let agent = Agent::dev().await;
    let unknown = "1f2d3c4b-0000-4000-8000-00000000abcd";
    let before = sessions_index(&agent).await;
    for id in [unknown, "nope"] {
        let reply = agent.put(&format!("/v1/session/destroy/{id}"), "").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.json(), json!(true));
    }
    assert_eq!(sessions_index(&agent).await, before);

    // Info of an unknown session is an empty array (never null), with the read headers.
    let reply = agent.get(&format!("/v1/session/info/{unknown}")).await;
    assert_error(&reply, StatusCode::OK, "[]");
    assert_eq!(reply.index(), before);

    // Renew of an unknown session is a 404 naming it.
    let reply = agent.put(&format!("/v1/session/renew/{unknown}"), "").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.text(), format!("Session id '{unknown}' not found"));

    // Routes with an empty ID or node name are 400s.
    assert_bad_request(&agent.get("/v1/session/info/").await, "Missing session");
    assert_bad_request(
        &agent.put("/v1/session/destroy/", "").await,
        "Missing session",
    );
    assert_bad_request(
        &agent.put("/v1/session/renew/", "").await,
        "Missing session",
    );
    assert_bad_request(&agent.get("/v1/session/node/").await, "Missing node name");
}

#[tokio::test]
async fn session_lifecycle_create_renew_destroy() {
    // A created session is readable, by its ID in any case.
    let agent = Agent::dev().await;
    let id = agent.session(r#"{"Name":"life"}"#).await;
    let session = info(&agent, &id).await;
    let created = sessions_index(&agent).await;
    assert_eq!(session["CreateIndex"], json!(created));
    assert_eq!(info(&agent, &id.to_uppercase()).await["ID"], json!(id));

    // Renewing a session without a TTL succeeds, returns it as info does, and moves no index.
    let reply = agent.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json(), json!([session]));
    assert_eq!(reply.header("X-Consul-Index"), None);
    assert_eq!(sessions_index(&agent).await, created);

    // Destroy answers true and moves the table index; the session is gone for every reader.
    let reply = agent.put(&format!("/v1/session/destroy/{id}"), "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!(true));
    let destroyed = sessions_index(&agent).await;
    assert!(destroyed > created, "{destroyed} > {created}");
    let reply = agent.get(&format!("/v1/session/info/{id}")).await;
    assert_eq!(reply.json(), json!([]));
    assert_eq!(reply.index(), destroyed);
    assert_eq!(agent.get("/v1/session/list").await.json(), json!([]));

    // Renewing it now is the 404 the Go client turns into ErrSessionExpired.
    let reply = agent.put(&format!("/v1/session/renew/{id}"), "").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.text(), format!("Session id '{id}' not found"));

    // A second destroy is still true.
    let reply = agent.put(&format!("/v1/session/destroy/{id}"), "").await;
    assert_eq!(reply.json(), json!(true));
    assert_eq!(sessions_index(&agent).await, destroyed);
}

#[tokio::test]
async fn list_and_node_endpoints_return_arrays() {
    // With no sessions, both listings are `[]`, and an unknown node is not an error.
    let agent = Agent::dev().await;
    let listings = [
        "/v1/session/list",
        "/v1/session/node/test-node",
        "/v1/session/node/elsewhere",
    ];
    let replies = assert_gets_answer(&agent, &listings, StatusCode::OK, "[]").await;
    for (reply, path) in replies.iter().zip(listings) {
        assert!(reply.index() >= 1, "{path}");
    }

    // Three sessions on this node appear in both listings, ordered by ID.
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        ids.push(agent.session(&json!({ "Name": name }).to_string()).await);
    }
    ids.sort();
    let list = agent.get("/v1/session/list").await;
    let listed: Vec<String> = list
        .json()
        .as_array()
        .expect("array")
        .iter()
        .map(|s| s["ID"].as_str().expect("ID").to_owned())
        .collect();
    assert_eq!(listed, ids);
    let node = agent.get("/v1/session/node/test-node").await;
    assert_eq!(node.json(), list.json());
    assert_eq!(agent.get("/v1/session/node/elsewhere").await.text(), "[]");

    // The index is the latest create.
    let newest = list
        .json()
        .as_array()
        .expect("array")
        .iter()
        .map(|s| s["CreateIndex"].as_u64().expect("index"))
        .max();
    assert_eq!(Some(list.index()), newest);
    assert_eq!(node.index(), list.index());
}

#[tokio::test]
async fn destroy_releases_held_keys_keeping_lock_index() {
    // A session holds two keys (LockIndex 1); another session holds a third; a fourth is free.
    let agent = Agent::dev().await;
    let id = agent.session(r#"{"LockDelay":"0s"}"#).await;
    let bystander = agent.session("{}").await;
    assert_eq!(agent.acquire("held", &id).await.json(), json!(true));
    assert_eq!(agent.acquire("held2", &id).await.json(), json!(true));
    assert_eq!(
        agent.acquire("theirs", &bystander).await.json(),
        json!(true)
    );
    assert_eq!(agent.put("/v1/kv/free", "v").await.json(), json!(true));
    let held = agent.kv_entry("held").await;
    assert_eq!(held["Session"], json!(id));
    assert_eq!(held["LockIndex"], json!(1));
    let theirs_before = agent.kv_entry("theirs").await;
    let free_before = agent.kv_entry("free").await;

    // A blocking read of the key wakes when the destroy releases it.
    let modify = held["ModifyIndex"].as_u64().expect("index");
    let blocking = format!("/v1/kv/held?index={modify}&wait=30s");
    let destroy = format!("/v1/session/destroy/{id}");
    let (woken, destroyed) = tokio::join!(agent.get(&blocking), agent.put(&destroy, ""));
    assert_eq!(destroyed.json(), json!(true));
    let destroy_index = sessions_index(&agent).await;
    assert_eq!(woken.status, StatusCode::OK);
    assert!(woken.index() > modify);

    // Release clears Session, keeps LockIndex, value and CreateIndex, at the destroy's index.
    let released = agent.kv_entry("held").await;
    assert!(released.get("Session").is_none(), "{released}");
    assert_eq!(released["LockIndex"], json!(1));
    assert_eq!(released["Value"], held["Value"]);
    assert_eq!(released["CreateIndex"], held["CreateIndex"]);
    assert_eq!(released["ModifyIndex"], json!(destroy_index));
    assert_eq!(woken.json()[0], released);

    // Every key it held is released in that same raft index.
    let released2 = agent.kv_entry("held2").await;
    assert!(released2.get("Session").is_none(), "{released2}");
    assert_eq!(released2["LockIndex"], json!(1));
    assert_eq!(released2["ModifyIndex"], json!(destroy_index));

    // Keys it did not hold are untouched, including another session's lock.
    assert_eq!(agent.kv_entry("theirs").await, theirs_before);
    assert_eq!(agent.kv_entry("free").await, free_before);
}

#[tokio::test]
async fn destroying_a_delete_session_removes_its_keys() {
    // A delete-behaviour session holds a key.
    let agent = Agent::dev().await;
    let id = agent
        .session(r#"{"Behavior":"delete","LockDelay":0}"#)
        .await;
    assert_eq!(info(&agent, &id).await["Behavior"], json!("delete"));
    assert_eq!(agent.acquire("doomed", &id).await.json(), json!(true));

    // Destroying it deletes the key instead of releasing it.
    let reply = agent.put(&format!("/v1/session/destroy/{id}"), "").await;
    assert_eq!(reply.json(), json!(true));
    let reply = agent.get("/v1/kv/doomed").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(reply.index() >= 1);
}

/// A blocking listing woken past `index` by the creation of session `id`, which it lists.
fn assert_woken_with(woken: &Reply, index: u64, id: &str) {
    assert!(woken.index() > index);
    let listed = woken.json();
    let ids = listed.as_array().expect("array").iter().map(|s| &s["ID"]);
    assert!(
        ids.into_iter().any(|listed| *listed == json!(id)),
        "{listed}"
    );
}

#[tokio::test]
async fn blocking_session_reads_wait_and_wake() {
    // An index at or below the current one answers at once.
    let agent = Agent::dev().await;
    agent.session("{}").await;
    let current = sessions_index(&agent).await;
    let started = Instant::now();
    let reply = agent
        .get(&format!("/v1/session/list?index={}&wait=30s", current - 1))
        .await;
    assert_eq!(reply.index(), current);
    assert!(started.elapsed() < Duration::from_secs(10));

    // With nothing changing, a blocking read waits out `wait` and returns the same index.
    assert_waits_out(&agent, "/v1/session/list", current).await;

    // A create wakes a blocked list long before its wait runs out.
    let started = Instant::now();
    let blocking = format!("/v1/session/list?index={current}&wait=60s");
    let (woken, id) = tokio::join!(agent.get(&blocking), agent.session(r#"{"Name":"wake"}"#));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_woken_with(&woken, current, &id);

    // The node listing blocks and wakes the same way.
    let current = woken.index();
    let blocking = format!("/v1/session/node/test-node?index={current}&wait=60s");
    let (woken, id) = tokio::join!(
        agent.get(&blocking),
        agent.session(r#"{"Name":"wake-node"}"#)
    );
    assert_woken_with(&woken, current, &id);

    // A blocking info on a live session wakes when it is destroyed, returning `[]`.
    let current = woken.index();
    let blocking = format!("/v1/session/info/{id}?index={current}&wait=60s");
    let destroy = format!("/v1/session/destroy/{id}");
    let (woken, destroyed) = tokio::join!(agent.get(&blocking), agent.put(&destroy, ""));
    assert_eq!(destroyed.json(), json!(true));
    assert!(woken.index() > current);
    assert_eq!(woken.json(), json!([]));
}
