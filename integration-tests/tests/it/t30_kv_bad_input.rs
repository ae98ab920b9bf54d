//! Bad input to the KV and txn endpoints: each is refused with Consul's status and text (400
//! where Consul answers 400, 500 for what its servers refuse, 413 above the size limits), and
//! each leaves the store exactly as it was.

use integration_tests::{Agent, Reply};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::kv_state;

/// An agent holding a couple of keys, one of them locked: the agent, the locking session, and
/// the store's state ([`kv_state`]) to compare with after a refused request.
async fn seeded_agent() -> (Agent, String, (u64, Value)) {
    let agent = Agent::dev().await;
    let session = agent.session("{}").await;
    for path in [
        "/v1/kv/seed".to_owned(),
        format!("/v1/kv/locked?acquire={session}"),
    ] {
        let reply = agent.put(&path, "v").await;
        assert_eq!(reply.json(), json!(true), "{path}");
    }
    let before = kv_state(&agent).await;
    (agent, session, before)
}

fn assert_error(reply: &Reply, status: StatusCode, text: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    assert_eq!(reply.text(), text, "{what}");
    assert_eq!(
        reply.header("Content-Type").as_deref(),
        Some("text/plain; charset=utf-8"),
        "{what}"
    );
}

#[tokio::test]
async fn unparsable_flags_and_cas_are_500_with_go_parse_errors_and_change_nothing() {
    let (agent, _, before) = seeded_agent().await;

    // Go's strconv.ParseUint texts: no sign, digits only, and overflow is its own message.
    let cases = [
        ("/v1/kv/seed?flags=x", r#"parsing "x": invalid syntax"#),
        ("/v1/kv/seed?flags=", r#"parsing "": invalid syntax"#),
        ("/v1/kv/seed?flags=-1", r#"parsing "-1": invalid syntax"#),
        ("/v1/kv/seed?flags=%2B5", r#"parsing "+5": invalid syntax"#),
        ("/v1/kv/seed?flags=1.5", r#"parsing "1.5": invalid syntax"#),
        (
            "/v1/kv/seed?flags=18446744073709551616",
            r#"parsing "18446744073709551616": value out of range"#,
        ),
        ("/v1/kv/seed?cas=x", r#"parsing "x": invalid syntax"#),
        ("/v1/kv/new?cas=0x10", r#"parsing "0x10": invalid syntax"#),
    ];
    for (path, parse_error) in cases {
        let reply = agent.put(path, "changed").await;
        assert_error(
            &reply,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("strconv.ParseUint: {parse_error}"),
            path,
        );
        assert_eq!(kv_state(&agent).await, before, "{path}");
    }

    // The same parse applies to a cas DELETE.
    let reply = agent.delete("/v1/kv/seed?cas=x").await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        r#"strconv.ParseUint: parsing "x": invalid syntax"#,
        "DELETE cas=x",
    );
    assert_eq!(kv_state(&agent).await, before);
}

#[tokio::test]
async fn conflicting_put_flags_are_400_echoing_the_sorted_query_and_change_nothing() {
    // TestKVSEndpoint_PUT_ConflictingFlags.
    let (agent, session, before) = seeded_agent().await;

    // The body is the query re-encoded as Go's url.Values.Encode does (keys sorted, values
    // query-escaped), followed by a newline; `flags` combines with anything but is echoed.
    let cases = [
        (
            "/v1/kv/seed?cas=0&acquire=xxx".to_owned(),
            "Conflicting flags: acquire=xxx&cas=0\n".to_owned(),
        ),
        (
            format!("/v1/kv/locked?release={session}&acquire={session}"),
            format!("Conflicting flags: acquire={session}&release={session}\n"),
        ),
        (
            format!("/v1/kv/locked?flags=3&release={session}&cas=1&acquire=a%2Fb+c"),
            format!("Conflicting flags: acquire=a%2Fb+c&cas=1&flags=3&release={session}\n"),
        ),
    ];
    for (path, text) in cases {
        let reply = agent.put(&path, "changed").await;
        assert_error(&reply, StatusCode::BAD_REQUEST, &text, &path);
        assert_eq!(kv_state(&agent).await, before, "{path}");
    }
}

#[tokio::test]
async fn delete_with_recurse_and_cas_is_400_and_deletes_nothing() {
    // TestKVSEndpoint_DELETE_ConflictingFlags.
    let (agent, _, before) = seeded_agent().await;

    for path in ["/v1/kv/?recurse&cas=0", "/v1/kv/seed?cas=0&recurse"] {
        let reply = agent.delete(path).await;
        assert_error(
            &reply,
            StatusCode::BAD_REQUEST,
            "Conflicting flags: cas=0&recurse=\n",
            path,
        );
        assert_eq!(kv_state(&agent).await, before, "{path}");
    }
}

#[tokio::test]
async fn acquire_with_an_unknown_or_empty_session_is_500_and_writes_nothing() {
    let (agent, session, before) = seeded_agent().await;
    let unknown = "9f2d7e3c-1111-2222-3333-444455556666";

    // Consul's server-side texts with the RPC prefix, as 500s: an HA manager that adapts to
    // them looks for a 500 containing `invalid session`.
    let cases = [
        (
            format!("/v1/kv/new?acquire={unknown}"),
            format!("raft apply failed: invalid session \"{unknown}\""),
        ),
        (
            format!("/v1/kv/seed?acquire={unknown}"),
            format!("raft apply failed: invalid session \"{unknown}\""),
        ),
        (
            "/v1/kv/new?acquire=".to_owned(),
            "raft apply failed: missing session".to_owned(),
        ),
        (
            "/v1/kv/locked?release=".to_owned(),
            "raft apply failed: missing session".to_owned(),
        ),
    ];
    for (path, text) in cases {
        let reply = agent.put(&path, "changed").await;
        assert_error(&reply, StatusCode::INTERNAL_SERVER_ERROR, &text, &path);
        assert_eq!(kv_state(&agent).await, before, "{path}");
    }

    // Releasing with a session that does not hold the key is not an input error: `false`.
    let reply = agent
        .put(&format!("/v1/kv/locked?release={unknown}"), "x")
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!(false));
    assert_eq!(kv_state(&agent).await, before);

    // The lock is still held by its session.
    let locked = agent.get("/v1/kv/locked").await.json();
    assert_eq!(locked[0]["Session"], json!(session));
}

#[tokio::test]
async fn an_empty_key_is_400_missing_key_name() {
    let (agent, _, before) = seeded_agent().await;

    // Writes, single reads and single deletes need a key; with or without the trailing slash.
    let cases = [
        (Method::PUT, "/v1/kv/"),
        (Method::PUT, "/v1/kv"),
        (Method::PUT, "/v1/kv/?flags=1"),
        (Method::GET, "/v1/kv/"),
        (Method::GET, "/v1/kv"),
        (Method::GET, "/v1/kv/?raw"),
        (Method::DELETE, "/v1/kv/"),
        (Method::DELETE, "/v1/kv/?cas=0"),
    ];
    for (method, path) in cases {
        let what = format!("{method} {path}");
        let reply = agent.request(method, path, Some(b"x".to_vec())).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "Missing key name", &what);
        assert_eq!(kv_state(&agent).await, before, "{what}");
    }
}

#[tokio::test]
async fn a_value_over_512_kib_is_413_and_exactly_512_kib_is_stored() {
    let (agent, _, before) = seeded_agent().await;

    // One byte over kv_max_value_size: 413 with Consul's text; neither a new key nor an
    // existing one is written.
    for key in ["big", "seed"] {
        let reply = agent
            .put(&format!("/v1/kv/{key}"), vec![b'x'; 512 * 1024 + 1])
            .await;
        assert_error(
            &reply,
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body(524289 bytes) too large, max size: 524288 bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
            key,
        );
        assert_eq!(kv_state(&agent).await, before, "{key}");
    }

    // Exactly the limit is accepted and reads back whole.
    let reply = agent.put("/v1/kv/big", vec![b'y'; 512 * 1024]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!(true));
    assert_eq!(agent.get("/v1/kv/big?raw").await.body.len(), 512 * 1024);
}

#[tokio::test]
async fn bad_blocking_and_consistency_parameters_are_400() {
    let (agent, _, _) = seeded_agent().await;
    let cases = [
        ("/v1/kv/seed?index=x", "Invalid index"),
        ("/v1/kv/seed?index=-1", "Invalid index"),
        ("/v1/kv/seed?index=%2B1", "Invalid index"),
        ("/v1/kv/seed?index=1&wait=5z", "Invalid wait time"),
        (
            "/v1/kv/seed?stale&consistent",
            "Cannot specify ?stale with ?consistent, conflicting semantics.",
        ),
        ("/v1/kv/?recurse&index=abc", "Invalid index"),
    ];
    for (path, text) in cases {
        let reply = agent.get(path).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, text, path);
    }
}

#[tokio::test]
async fn unknown_routes_are_404() {
    let (agent, _, before) = seeded_agent().await;

    for (method, path) in [
        (Method::GET, "/v1/kvx/seed"),
        (Method::PUT, "/v1/kvs/seed"),
        (Method::PUT, "/v1/txn/extra"),
        (Method::GET, "/v1/nope"),
        (Method::DELETE, "/kv/seed"),
    ] {
        let what = format!("{method} {path}");
        let reply = agent.request(method, path, Some(b"[]".to_vec())).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{what}");
        assert_eq!(kv_state(&agent).await, before, "{what}");
    }
}

#[tokio::test]
async fn wrong_methods_are_405_with_an_allow_header_and_options_is_200() {
    let (agent, _, before) = seeded_agent().await;
    let txn_body = br#"[{"KV":{"Verb":"set","Key":"viatxn","Value":"eA=="}}]"#.to_vec();

    // KV allows GET, PUT, DELETE; txn allows PUT. The answer names the method and lists OPTIONS
    // plus the allowed methods, and nothing is written.
    let cases = [
        (Method::POST, "/v1/kv/seed", "OPTIONS,GET,PUT,DELETE"),
        (Method::PATCH, "/v1/kv/new", "OPTIONS,GET,PUT,DELETE"),
        (Method::POST, "/v1/txn", "OPTIONS,PUT"),
        (Method::GET, "/v1/txn", "OPTIONS,PUT"),
        (Method::DELETE, "/v1/txn", "OPTIONS,PUT"),
    ];
    for (method, path, allow) in cases {
        let what = format!("{method} {path}");
        let reply = agent
            .request(method.clone(), path, Some(txn_body.clone()))
            .await;
        assert_error(
            &reply,
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {method} not allowed"),
            &what,
        );
        assert_eq!(reply.header("Allow").as_deref(), Some(allow), "{what}");
        assert_eq!(kv_state(&agent).await, before, "{what}");
    }

    // OPTIONS answers 200 with the same Allow header and no body.
    for (path, allow) in [
        ("/v1/kv/seed", "OPTIONS,GET,PUT,DELETE"),
        ("/v1/txn", "OPTIONS,PUT"),
    ] {
        let reply = agent.request(Method::OPTIONS, path, None).await;
        assert_eq!(reply.status, StatusCode::OK, "OPTIONS {path}");
        assert_eq!(
            reply.header("Allow").as_deref(),
            Some(allow),
            "OPTIONS {path}"
        );
        assert!(reply.body.is_empty());
    }
}
