//! The HTTP API's shared conventions against a real dev agent: status and agent endpoints,
//! routing (404, 405 with `Allow`, OPTIONS), `?pretty`, read headers, consistency and blocking
//! parameter validation, and Vigil's sequencer (fencing token) check.
//! Mirrors docs/consul-compatibility.md#http-conventions, #blocking-queries-and-consistency and
//! #additions.

use integration_tests::{Agent, Reply};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::assert_gets_answer;

/// The `Allow` header as a list of methods.
fn allowed(reply: &Reply) -> Vec<String> {
    reply
        .header("Allow")
        .expect("Allow header")
        .split(',')
        .map(|m| m.trim().to_owned())
        .collect()
}

/// Asserts Consul's read headers: an index that is never 0, a known leader, a last contact.
fn assert_read_headers(reply: &Reply, what: &str) {
    assert!(reply.index() >= 1, "{what}: X-Consul-Index must never be 0");
    assert_eq!(
        reply.header("X-Consul-KnownLeader").as_deref(),
        Some("true"),
        "{what}"
    );
    let contact = reply
        .header("X-Consul-LastContact")
        .unwrap_or_else(|| panic!("{what}: no X-Consul-LastContact"));
    assert_eq!(contact, "0", "{what}: the leader answered");
}

async fn sequencer(agent: &Agent, key: &str, lock_index: u64, session: &str) -> Value {
    let reply = agent
        .sequencer(&format!(
            "key={key}&lock-index={lock_index}&session={session}"
        ))
        .await;
    assert_read_headers(&reply, "sequencer");
    reply.json()
}

/// Asserts `{"Valid":true}`.
fn assert_valid(answer: &Value) {
    assert_eq!(answer, &json!({ "Valid": true }));
}

/// Asserts `{"Valid":false,"Reason":"<something>"}`.
fn assert_invalid(answer: &Value, what: &str) {
    assert_eq!(answer["Valid"], json!(false), "{what}: {answer}");
    let reason = answer["Reason"].as_str().unwrap_or_default();
    assert!(!reason.is_empty(), "{what}: a reason is given: {answer}");
}

#[tokio::test]
async fn status_reports_leader_rpc_address_and_peers() {
    // A dev agent leads its own one-voter cluster and names its RPC address.
    let agent = Agent::dev().await;
    let leader = agent.get("/v1/status/leader").await;
    assert_eq!(leader.status, StatusCode::OK);
    assert_eq!(
        leader.header("Content-Type").as_deref(),
        Some("application/json")
    );
    assert_eq!(leader.json(), json!(agent.rpc_addr));
    let peers = agent.get("/v1/status/peers").await;
    assert_eq!(peers.status, StatusCode::OK);
    assert_eq!(peers.json(), json!([agent.rpc_addr]));
}

#[tokio::test]
async fn agent_self_reports_config_member_and_leader() {
    // Clients read Config.NodeName, Config.Version and Stats.consul.leader_addr.
    let agent = Agent::dev().await;
    let reply = agent.get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let me = reply.json();
    assert_eq!(me["Config"]["NodeName"], json!("test-node"));
    let version = me["Config"]["Version"].as_str().expect("Config.Version");
    assert!(!version.is_empty());
    assert_eq!(me["Config"]["Server"], json!(true));

    // The member is this agent.
    let member = &me["Member"];
    assert!(member.is_object(), "{me}");
    assert_eq!(member["Name"], json!("test-node"));
    assert_eq!(member["Status"], json!(1));

    // The leader it reports is the one /v1/status/leader names.
    let leader = agent.get("/v1/status/leader").await.json();
    assert_eq!(me["Stats"]["consul"]["leader_addr"], leader);
    assert_eq!(me["Stats"]["consul"]["leader"], json!("true"));
}

#[tokio::test]
async fn unknown_routes_are_404() {
    // Paths outside the route table are Go's plain 404.
    let agent = Agent::dev().await;
    for path in ["/v1/nope", "/v1/session/bogus", "/v2/kv/x", "/v1"] {
        let reply = agent.get(path).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn wrong_method_is_405_with_allow_and_options_is_200() {
    // A method the route does not take is 405 naming the method, with OPTIONS in `Allow`.
    let agent = Agent::dev().await;
    for (method, path, allowed_method) in [
        (Method::POST, "/v1/session/create", "PUT"),
        (Method::GET, "/v1/session/create", "PUT"),
        (Method::PUT, "/v1/session/list", "GET"),
        (Method::DELETE, "/v1/session/info/x", "GET"),
        (Method::GET, "/v1/session/destroy/x", "PUT"),
        (Method::PUT, "/v1/status/leader", "GET"),
        (Method::POST, "/v1/kv/x", "PUT"),
        (Method::POST, "/v1/vigil/sequencer", "GET"),
    ] {
        let reply = agent.request(method.clone(), path, None).await;
        assert_eq!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(reply.text(), format!("method {method} not allowed"));
        let allow = allowed(&reply);
        assert!(allow.contains(&"OPTIONS".to_owned()), "{path}: {allow:?}");
        assert!(
            allow.contains(&allowed_method.to_owned()),
            "{path}: {allow:?}"
        );
        assert!(!allow.contains(&method.to_string()), "{path}: {allow:?}");
    }

    // The exact body of the brief's example.
    let reply = agent
        .request(Method::POST, "/v1/session/create", None)
        .await;
    assert_eq!(reply.text(), "method POST not allowed");

    // OPTIONS is 200 with the same `Allow` header and no body.
    let reply = agent
        .request(Method::OPTIONS, "/v1/session/create", None)
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.is_empty(), "{}", reply.text());
    let allow = allowed(&reply);
    assert!(allow.contains(&"OPTIONS".to_owned()) && allow.contains(&"PUT".to_owned()));
    let reply = agent.request(Method::OPTIONS, "/v1/kv/x", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    let allow = allowed(&reply);
    for m in ["OPTIONS", "GET", "PUT", "DELETE"] {
        assert!(allow.contains(&m.to_owned()), "{allow:?}");
    }
}

#[tokio::test]
async fn pretty_indents_json_and_ends_with_newline() {
    // `?pretty` prints the same JSON indented as Consul does, with a trailing newline; without
    // it, compact.
    let agent = Agent::dev().await;
    agent.session(r#"{"Name":"pretty"}"#).await;
    for path in ["/v1/session/list", "/v1/agent/self", "/v1/status/peers"] {
        let plain = agent.get(path).await;
        let pretty = agent.get(&format!("{path}?pretty")).await;
        assert_eq!(pretty.status, StatusCode::OK, "{path}");
        let text = pretty.text();
        assert!(text.ends_with('\n'), "{path}: {text:?}");
        let second = text.lines().nth(1).unwrap_or_default();
        assert!(
            second.starts_with("    ") && !second.starts_with("     "),
            "{path} is indented by four spaces, as Go's MarshalIndent: {text}"
        );
        assert!(!plain.text().contains('\n'), "{path} is compact");
        assert_eq!(pretty.json(), plain.json(), "{path}");
    }
}

#[tokio::test]
async fn sequencer_validates_fencing_tokens() {
    // While a session holds a key at LockIndex 1, exactly that token is valid.
    let agent = Agent::dev().await;
    let holder = agent.session("{}").await;
    let other = agent.session("{}").await;
    agent.acquire_ok("fenced", &holder).await;
    assert_valid(&sequencer(&agent, "fenced", 1, &holder).await);

    // A wrong lock-index, a wrong session or a wrong key is invalid, with a reason.
    for (key, lock_index, session, what) in [
        ("fenced", 2, &holder, "lock-index 2"),
        ("fenced", 0, &holder, "lock-index 0"),
        ("fenced", 1, &other, "other session"),
        ("missing", 1, &holder, "missing key"),
    ] {
        assert_invalid(&sequencer(&agent, key, lock_index, session).await, what);
    }

    // After release the old token is invalid.
    agent.release_ok("fenced", &holder).await;
    assert_invalid(&sequencer(&agent, "fenced", 1, &holder).await, "released");

    // The next holder gets LockIndex 2; only its token is valid, the old one stays invalid.
    agent.acquire_ok("fenced", &other).await;
    assert_valid(&sequencer(&agent, "fenced", 2, &other).await);
    assert_invalid(&sequencer(&agent, "fenced", 1, &other).await, "stale index");
    assert_invalid(&sequencer(&agent, "fenced", 1, &holder).await, "old holder");

    // Missing or malformed parameters are 400s.
    for query in [
        format!("lock-index=2&session={other}"),
        format!("key=fenced&session={other}"),
        "key=fenced&lock-index=2".to_owned(),
        format!("key=&lock-index=2&session={other}"),
        "key=fenced&lock-index=2&session=".to_owned(),
        format!("key=fenced&lock-index=two&session={other}"),
        format!("key=fenced&lock-index=-1&session={other}"),
        String::new(),
    ] {
        let reply = agent.get(&format!("/v1/vigil/sequencer?{query}")).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            reply.text()
        );
        assert!(!reply.text().is_empty(), "{query}: a message");
    }
}

#[tokio::test]
async fn every_read_sets_index_leader_and_contact_headers() {
    // On a fresh agent (empty tables) every read still carries an index of at least 1, and so
    // do the 404s of a missing key and of an empty recursive listing.
    let agent = Agent::dev().await;
    for (path, status) in [
        ("/v1/session/list", StatusCode::OK),
        ("/v1/session/node/test-node", StatusCode::OK),
        (
            "/v1/session/info/00000000-0000-4000-8000-000000000000",
            StatusCode::OK,
        ),
        ("/v1/kv/?keys", StatusCode::OK),
        ("/v1/kv/missing", StatusCode::NOT_FOUND),
        ("/v1/kv/?recurse", StatusCode::NOT_FOUND),
        ("/v1/kv/nothing/?recurse", StatusCode::NOT_FOUND),
    ] {
        let reply = agent.get(path).await;
        assert_eq!(reply.status, status, "{path}: {}", reply.text());
        assert_read_headers(&reply, path);
    }

    // After writes, they still do, in every consistency mode.
    let id = agent.session("{}").await;
    assert_eq!(agent.put("/v1/kv/k", "v").await.json(), json!(true));
    for path in [
        format!("/v1/session/info/{id}"),
        "/v1/session/list".to_owned(),
        "/v1/kv/k".to_owned(),
    ] {
        for mode in ["", "?consistent", "?stale"] {
            let reply = agent.get(&format!("{path}{mode}")).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}{mode}");
            assert_read_headers(&reply, &format!("{path}{mode}"));
        }
    }
}

#[tokio::test]
async fn consistency_and_blocking_parameters_are_validated() {
    // ?stale and ?consistent together conflict.
    let agent = Agent::dev().await;
    let id = agent.session(r#"{"Name":"modes"}"#).await;
    let conflicting = [
        "/v1/session/list?stale&consistent",
        "/v1/session/list?consistent&stale",
        "/v1/kv/k?stale=1&consistent=1",
    ];
    // A bad index or wait is a 400 too.
    let bad_index = [
        "/v1/session/list?index=abc",
        "/v1/session/list?index=-1",
        "/v1/kv/k?index=1.5",
    ];
    let bad_wait = [
        "/v1/session/list?index=1&wait=5z",
        "/v1/session/list?index=1&wait=soon",
        "/v1/kv/k?index=1&wait=10",
        "/v1/session/list?wait=5z",
    ];
    for (paths, message) in [
        (
            &conflicting[..],
            "Cannot specify ?stale with ?consistent, conflicting semantics.",
        ),
        (&bad_index[..], "Invalid index"),
        (&bad_wait[..], "Invalid wait time"),
    ] {
        assert_gets_answer(&agent, paths, StatusCode::BAD_REQUEST, message).await;
    }

    // ?consistent and ?stale reads answer the same data as a default read.
    let default = agent.get(&format!("/v1/session/info/{id}")).await;
    for mode in ["consistent", "stale", "leader"] {
        let reply = agent.get(&format!("/v1/session/info/{id}?{mode}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{mode}");
        assert_eq!(reply.json(), default.json(), "{mode}");
        assert_eq!(reply.index(), default.index(), "{mode}");
    }
}
