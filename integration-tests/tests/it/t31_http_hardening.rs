//! Hardening of the HTTP API against careless and hostile clients, each through the public
//! interface of a real dev agent: LockIndex through recursive deletes, bodies refused before
//! they are buffered (the agent's memory is measured), a per-client connection cap and header
//! timeout under half-open connections, clean paths and UTF-8 keys, numbers in Go's range, and
//! bounded fields (README.md, "Limits a client can hit").

use std::time::Duration;

use integration_tests::{Agent, Reply, eventually};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout};

use crate::common::{assert_error, assert_not_found, deny_dev_agent, raise_open_files};

const GIB: u64 = 1024 * 1024 * 1024;
/// How much the agent's resident memory may grow while it refuses a 1 GiB body.
const RSS_GROWTH_MAX_KIB: u64 = 12 * 1024;

/// `host:port` of the agent's HTTP API.
fn addr(agent: &Agent) -> String {
    agent.base.trim_start_matches("http://").to_owned()
}

fn pid(agent: &Agent) -> u32 {
    agent.pid().expect("agent is running")
}

/// The agent's resident set size (VmRSS) in KiB.
fn rss_kib(agent: &Agent) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid(agent))).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// The agent's open file descriptors.
fn open_fds(agent: &Agent) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", pid(agent)))
        .unwrap()
        .count()
}

/// Sends `request` as written on a new connection and returns everything the agent sends back
/// until it closes the connection (requests here carry `Connection: close`).
async fn raw(agent: &Agent, request: &str) -> String {
    let mut stream = TcpStream::connect(addr(agent)).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    read_all(&mut stream).await
}

/// Reads until EOF (or a reset), within 10 s.
async fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("the agent answers and closes within 10 s");
    String::from_utf8_lossy(&out).into_owned()
}

fn body_of(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// A 400 refusing `what`, with a text `check` accepts.
fn assert_bad_request(reply: &Reply, what: &str, check: impl Fn(&str) -> bool) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{what}");
    assert!(check(&reply.text()), "{what}: {}", reply.text());
}

/// A session create declaring a `len`-byte body, of which only `start` is sent, is refused
/// with a 413 from its length alone.
async fn assert_session_create_too_large(agent: &Agent, len: u64, start: &str) {
    let response = raw(
        agent,
        &format!(
            "PUT /v1/session/create HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{start}"
        ),
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 413 "), "{response}");
    assert_eq!(
        body_of(&response),
        format!("Request body({len} bytes) too large, max size: 524288 bytes")
    );
}

fn header_of<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split_once("\r\n\r\n").map_or(response, |(h, _)| h);
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A session with lock-delay 0, so acquires after a delete are never held back.
async fn session(agent: &Agent) -> String {
    agent.session(r#"{"LockDelay": "0s"}"#).await
}

async fn sequencer_valid(agent: &Agent, key: &str, index: u64, session: &str) -> bool {
    let query = format!("key={key}&lock-index={index}&session={session}");
    agent.sequencer(&query).await.json()["Valid"] == json!(true)
}

#[tokio::test]
async fn lock_index_never_goes_back_through_a_recursive_delete() {
    let agent = Agent::dev().await;
    let s = session(&agent).await;
    let key = "hard/app/lock";

    // Three acquire/release rounds, a plain delete, an acquire: LockIndex 4.
    for _ in 0..3 {
        agent.acquire_ok(key, &s).await;
        agent.release_ok(key, &s).await;
    }
    assert_eq!(agent.delete(&format!("/v1/kv/{key}")).await.json(), true);
    agent.acquire_ok(key, &s).await;
    assert_eq!(agent.kv_entry(key).await["LockIndex"], json!(4));
    agent.release_ok(key, &s).await;

    // A recursive delete of a parent prefix, then an acquire: 5, and no old sequencer is
    // valid again.
    let reply = agent.delete("/v1/kv/hard/?recurse").await;
    assert_eq!(reply.json(), true);
    assert_not_found(&agent, &format!("/v1/kv/{key}")).await;
    agent.acquire_ok(key, &s).await;
    assert_eq!(agent.kv_entry(key).await["LockIndex"], json!(5));
    for old in 1..=4 {
        assert!(!sequencer_valid(&agent, key, old, &s).await, "{old}");
    }
    assert!(sequencer_valid(&agent, key, 5, &s).await);
    agent.release_ok(key, &s).await;

    // The issue's form: the recursive delete names the key itself. 6, and `(key, 1, S)` stays
    // invalid.
    let reply = agent.delete(&format!("/v1/kv/{key}?recurse")).await;
    assert_eq!(reply.json(), true);
    agent.acquire_ok(key, &s).await;
    assert_eq!(agent.kv_entry(key).await["LockIndex"], json!(6));
    assert!(!sequencer_valid(&agent, key, 1, &s).await);

    // The txn delete-tree verb followed by a lock in the same transaction: 7.
    let ops = json!([
        {"KV": {"Verb": "delete-tree", "Key": "hard/"}},
        {"KV": {"Verb": "lock", "Key": key, "Session": s}},
    ]);
    let reply = agent.put("/v1/txn", ops.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(agent.kv_entry(key).await["LockIndex"], json!(7));
    assert!(!sequencer_valid(&agent, key, 1, &s).await);
}

#[tokio::test]
async fn a_1_gib_body_is_refused_from_its_content_length_without_being_read() {
    let agent = Agent::dev().await;
    let before = rss_kib(&agent);

    // The head alone: the 413 comes back at once, with Consul's text, for KV and for txn.
    for (path, setting) in [
        ("/v1/kv/big", "kv_max_value_size"),
        ("/v1/txn", "txn_max_req_len"),
    ] {
        let mut stream = TcpStream::connect(addr(&agent)).await.unwrap();
        let head = format!("PUT {path} HTTP/1.1\r\nHost: a\r\nContent-Length: {GIB}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut response = vec![0; 4096];
        let n = timeout(Duration::from_secs(5), stream.read(&mut response))
            .await
            .expect("answered before any body byte was sent")
            .unwrap();
        let response = String::from_utf8_lossy(&response[..n]).into_owned();
        assert!(response.starts_with("HTTP/1.1 413 "), "{path}: {response}");
        assert_eq!(
            body_of(&response),
            format!(
                "Request body({GIB} bytes) too large, max size: 524288 bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#{setting}."
            )
        );

        // Streaming the body anyway: the agent has closed the connection, so the writes fail
        // long before 1 GiB has gone out.
        let written = stream_until_refused(&mut stream, GIB, false).await;
        assert!(written < GIB / 8, "{path}: {written} bytes accepted");
    }

    // Every other route has a limit too (512 KiB).
    assert_session_create_too_large(&agent, GIB, "").await;

    let grown = rss_kib(&agent).saturating_sub(before);
    assert!(grown <= RSS_GROWTH_MAX_KIB, "RSS grew by {grown} KiB");
    assert_eq!(agent.get("/v1/kv/?keys").await.json(), json!([]));
}

#[tokio::test]
async fn a_chunked_body_is_cut_off_at_the_limit_while_it_streams() {
    let agent = Agent::dev().await;
    let before = rss_kib(&agent);

    // 1 GiB, chunked, to KV, txn and session create: the agent stops reading at the limit,
    // answers 413 (or resets the connection) and memory stays flat.
    for path in ["/v1/kv/big", "/v1/txn", "/v1/session/create"] {
        let mut stream = TcpStream::connect(addr(&agent)).await.unwrap();
        let head = format!("PUT {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let written = stream_until_refused(&mut stream, GIB, true).await;
        assert!(written < GIB / 8, "{path}: {written} bytes accepted");
        let response = read_all(&mut stream).await;
        assert!(
            response.is_empty() || response.starts_with("HTTP/1.1 413 "),
            "{path}: {response}"
        );
    }
    let grown = rss_kib(&agent).saturating_sub(before);
    assert!(grown <= RSS_GROWTH_MAX_KIB, "RSS grew by {grown} KiB");

    // A chunked body a little over the limit is read to its end and answered with the text
    // Consul uses when no length was declared; nothing is stored.
    let chunk = "x".repeat(64 * 1024);
    let mut request =
        "PUT /v1/kv/big HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_owned();
    for _ in 0..9 {
        request.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    request.push_str("0\r\n\r\n");
    let response = raw(&agent, &request).await;
    assert!(response.starts_with("HTTP/1.1 413 "), "{response}");
    assert_eq!(
        body_of(&response),
        "Request body too large, max size: 524288 bytes"
    );
    assert_eq!(agent.get("/v1/kv/?keys").await.json(), json!([]));
}

/// Writes up to `total` bytes of body (as 64 KiB chunks when `chunked`) until the agent stops
/// taking them: a write fails, or none completes for a second. Returns the bytes written.
async fn stream_until_refused(stream: &mut TcpStream, total: u64, chunked: bool) -> u64 {
    let data = vec![b'x'; 64 * 1024];
    let mut frame = Vec::new();
    if chunked {
        frame.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    }
    frame.extend_from_slice(&data);
    if chunked {
        frame.extend_from_slice(b"\r\n");
    }
    let mut written = 0u64;
    while written < total {
        match timeout(Duration::from_secs(1), stream.write_all(&frame)).await {
            Ok(Ok(())) => written += data.len() as u64,
            Ok(Err(_)) | Err(_) => break,
        }
    }
    written
}

#[tokio::test]
async fn half_open_connections_cannot_exhaust_the_agent() {
    // A cap of 50 per client IP and a 3 s header timeout keep the test short.
    // This process holds a socket for each of the attacker's 5,000 connections.
    raise_open_files();
    let agent = Agent::dev_with(&[
        "--http-max-conns-per-client",
        "50",
        "--http-header-timeout",
        "3s",
    ])
    .await;
    let baseline = open_fds(&agent);
    let target: std::net::SocketAddr = addr(&agent).parse().unwrap();
    let attacker = move |_: usize| async move {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        socket.connect(target).await
    };

    // 5,000 half-open requests from 127.0.0.2: a request line and one header, never finished.
    let mut held = Vec::new();
    for i in 0..5_000 {
        let Ok(mut stream) = attacker(i).await else {
            continue;
        };
        let _ = stream
            .write_all(b"GET /v1/kv/x HTTP/1.1\r\nHost: a\r\n")
            .await;
        held.push(stream);
    }
    assert!(held.len() > 4_000, "only {} connections opened", held.len());

    // The agent holds at most the cap of them; a well-behaved client on 127.0.0.1 is served
    // within a second, time after time.
    let fds = open_fds(&agent);
    assert!(
        fds <= baseline + 50 + 10,
        "{fds} open descriptors (baseline {baseline})"
    );
    let client = integration_tests::Http::new(agent.base.clone());
    for _ in 0..10 {
        let started = Instant::now();
        let reply = timeout(Duration::from_secs(1), client.get("/v1/status/leader"))
            .await
            .expect("answered within 1 s");
        assert_eq!(reply.status, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    // One more connection from the attacker's address gets Consul's 429 and is closed.
    let mut extra = attacker(0).await.unwrap();
    let response = read_all(&mut extra).await;
    assert!(
        response.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{response}"
    );
    assert_eq!(
        body_of(&response),
        "Your IP is issuing too many concurrent connections, please rate limit your calls\n"
    );

    // The header timeout closes the half-open connections the agent did accept; then the
    // attacker's address is served again.
    eventually(
        Duration::from_secs(15),
        "half-open connections closed",
        || {
            let fds = open_fds(&agent);
            async move { (fds <= baseline + 5).then_some(()) }
        },
    )
    .await;
    drop(held);
    let mut again = attacker(0).await.unwrap();
    again
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let response = read_all(&mut again).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
}

#[tokio::test]
async fn keys_that_are_not_utf8_are_refused_instead_of_aliased() {
    let agent = Agent::dev().await;

    // %FF and %FE are not UTF-8: 400, nothing stored; %EF%BF%BD (U+FFFD itself) is a key.
    for key in ["alias/%FF", "alias/%FE"] {
        let reply = agent.put(&format!("/v1/kv/{key}"), "a").await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{key}");
        assert_eq!(reply.text(), "Invalid URL: Invalid UTF-8 in `key`");
    }
    let reply = agent.put("/v1/kv/alias/%EF%BF%BD", "c").await;
    assert_eq!(reply.json(), json!(true));
    let reply = agent.get("/v1/kv/alias/%FF?raw").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(
        agent.get("/v1/kv/alias/?keys").await.json(),
        json!(["alias/\u{fffd}"])
    );
    assert_eq!(
        agent.delete("/v1/kv/alias/%FE").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn unclean_paths_are_redirected_like_gos_servemux() {
    let agent = Agent::dev().await;

    // PUT /v1/kv//x: a 301 to the cleaned path, query kept, no body; nothing is stored.
    let response = raw(
        &agent,
        "PUT /v1/kv//x?cas=0 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: close\r\n\r\nv",
    )
    .await;
    assert!(
        response.starts_with("HTTP/1.1 301 Moved Permanently\r\n"),
        "{response}"
    );
    assert_eq!(header_of(&response, "Location"), Some("/v1/kv/x?cas=0"));
    assert_eq!(body_of(&response), "");
    assert_eq!(agent.get("/v1/kv/?keys").await.json(), json!([]));

    // GET gets Go's little HTML body; `..` and `.` segments are resolved too.
    let cases = [
        ("/v1//catalog/services", "/v1/catalog/services"),
        ("/v1/kv//app/config?raw", "/v1/kv/app/config?raw"),
        ("/v1/kv/a/../b/./c", "/v1/kv/b/c"),
        ("/v1/kv/a/..//", "/v1/kv/"),
    ];
    for (path, clean) in cases {
        let response = raw(
            &agent,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 301 "), "{path}: {response}");
        assert_eq!(header_of(&response, "Location"), Some(clean), "{path}");
        assert_eq!(
            header_of(&response, "Content-Type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(
            body_of(&response),
            format!("<a href=\"{clean}\">Moved Permanently</a>.\n\n")
        );
    }

    // A clean path is served as before.
    let response = raw(
        &agent,
        "GET /v1/catalog/services HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
}

#[tokio::test]
async fn numbers_outside_gos_range_are_refused() {
    let agent = Agent::dev().await;

    // LockDelay beyond int64 nanoseconds: 400 Request decode failed, no session created.
    for number in [
        "18446744073709551616",
        "18446744073709551615",
        "1e30",
        "1.79e308",
    ] {
        let reply = agent
            .put(
                "/v1/session/create",
                format!(r#"{{"LockDelay": {number}}}"#),
            )
            .await;
        let unmarshal = "Request decode failed: json: cannot unmarshal number ";
        assert_bad_request(&reply, number, |text| text.starts_with(unmarshal));
    }
    assert_eq!(agent.get("/v1/session/list").await.json(), json!([]));

    // The largest Go duration is accepted and listed as it is.
    let id = agent.session(r#"{"LockDelay": 9223372036854775807}"#).await;
    let info = agent.get(&format!("/v1/session/info/{id}")).await.json();
    assert_eq!(info[0]["LockDelay"], json!(9_223_372_036_854_775_807_u64));

    // A check interval or TTL beyond int64 nanoseconds is refused the same way.
    for body in [
        r#"{"Name": "big", "TTL": 1e30}"#,
        r#"{"Name": "big", "HTTP": "http://127.0.0.1:1/", "Interval": 18446744073709551616}"#,
    ] {
        let reply = agent.put("/v1/agent/check/register", body).await;
        let duration = "into Go value of type time.Duration";
        assert_bad_request(&reply, body, |text| text.ends_with(duration));
    }

    // ?passing is a Go bool: empty and true/false forms work, anything else is 400.
    for ok in [
        "passing",
        "passing=",
        "passing=true",
        "passing=0",
        "passing=F",
    ] {
        let reply = agent.get(&format!("/v1/health/service/none?{ok}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{ok}: {}", reply.text());
    }
    let reply = agent.get("/v1/health/service/none?passing=maybe").await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Invalid value for ?passing",
    );
}

#[tokio::test]
async fn every_field_is_bounded() {
    let agent = Agent::dev().await;
    let put = |path: &'static str, body: Value| {
        let agent = agent.http();
        async move {
            agent
                .request(Method::PUT, path, Some(body.to_string().into_bytes()))
                .await
        }
    };

    // A session name: 1 KiB is fine, more is a 400, more than 64 KiB is refused as a string
    // that long, more than 512 KiB as a body that long. Nothing reaches raft.
    let sessions_before = agent.get("/v1/session/list").await.json();
    let cases = [
        (
            2_000,
            StatusCode::BAD_REQUEST,
            "Name is 2000 bytes long, more than the limit of 1024".to_owned(),
        ),
        (
            100_000,
            StatusCode::BAD_REQUEST,
            "Request decode failed: Name is 100000 bytes long, more than the limit of 65536"
                .to_owned(),
        ),
    ];
    for (len, status, text) in cases {
        let reply = put("/v1/session/create", json!({ "Name": "n".repeat(len) })).await;
        assert_eq!(reply.status, status, "{len}");
        assert_eq!(reply.text(), text, "{len}");
    }
    // The issue's 16 MiB name: refused from its length, before the body is read.
    let len = 16 * 1024 * 1024 + r#"{"Name":""}"#.len();
    assert_session_create_too_large(&agent, len as u64, r#"{"Name":"nnnn"#).await;
    agent
        .session(&json!({ "Name": "n".repeat(1024) }).to_string())
        .await;
    let sessions = agent.get("/v1/session/list").await.json();
    assert_eq!(
        sessions.as_array().unwrap().len(),
        sessions_before.as_array().unwrap().len() + 1
    );

    // Catalog registration: Consul's metadata limits and texts, names and tags bounded.
    let meta: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let reply = put(
        "/v1/catalog/register",
        json!({"Node": "ext", "Address": "10.0.0.1", "NodeMeta": meta}),
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Invalid NodeMeta: Node metadata cannot contain more than 64 key/value pairs",
    );
    let long = "v".repeat(513);
    let reply = put(
        "/v1/catalog/register",
        json!({"Node": "ext", "Address": "10.0.0.1",
               "Service": {"Service": "web", "Meta": {"k": long}}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.text(),
        format!(
            "Invalid Service Meta: Couldn't load metadata pair ('k', '{long}'): Value is too long (limit: 512 characters)"
        )
    );
    let reply = put(
        "/v1/catalog/register",
        json!({"Node": "ext", "Address": "10.0.0.1",
               "Service": {"Service": "web", "Tags": ["t".repeat(1025)]}}),
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Service.Tags is 1025 bytes long, more than the limit of 1024",
    );
    let reply = put(
        "/v1/catalog/register",
        json!({"Node": "ext", "Address": "10.0.0.1",
               "Service": {"Service": "web", "Tags": vec!["t"; 1025]}}),
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Request decode failed: Service.Tags has 1025 entries, more than the limit of 1024",
    );
    let nodes = agent.get("/v1/catalog/nodes").await.json();
    assert!(
        nodes.as_array().unwrap().iter().all(|n| n["Node"] != "ext"),
        "{nodes}"
    );

    // Agent checks and services, and prepared queries.
    let reply = put(
        "/v1/agent/check/register",
        json!({"Name": "c".repeat(1025), "TTL": "10s"}),
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Name is 1025 bytes long, more than the limit of 1024",
    );
    let reply = put(
        "/v1/agent/service/register",
        json!({"Name": "web", "Tags": ["x".repeat(2000)]}),
    )
    .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Tags is 2000 bytes long, more than the limit of 1024",
    );
    let reply = agent
        .post_json(
            "/v1/query",
            json!({"Name": "q".repeat(1025), "Service": {"Service": "web"}}),
        )
        .await;
    assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Name is 1025 bytes long, more than the limit of 1024",
    );
    assert_eq!(agent.get("/v1/agent/checks").await.json(), json!({}));
    assert_eq!(agent.get("/v1/query").await.json(), json!([]));
}

/// Reads one response (headers and a `Content-Length` body) from a connection kept open,
/// within 10 s.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    timeout(Duration::from_secs(10), async {
        while !out.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.expect("a response");
            out.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&out).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |n| n.trim().parse().expect("a length"));
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.expect("the body");
        out.extend(body);
    })
    .await
    .expect("a response within 10 s");
    String::from_utf8_lossy(&out).into_owned()
}

/// py-consul's `test_acl_token_permission_denied` sends its next request on the connection a
/// 403 answered: a request refused before its handler runs has its body read first (asked for
/// with `100 Continue`), so the connection stays open, as Consul's does, instead of closing
/// under a client that reuses it.
#[tokio::test]
async fn a_refused_request_leaves_its_connection_open() {
    let agent = deny_dev_agent("root").await;
    let mut stream = TcpStream::connect(addr(&agent)).await.unwrap();
    let body = r#"{"Description": "not mine to change"}"#;
    let head = format!(
        "PUT /v1/acl/token/00000000-0000-0000-0000-000000000002 HTTP/1.1\r\nHost: agent\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let first = read_response(&mut stream).await;
    assert!(first.starts_with("HTTP/1.1 100"), "{first}");
    stream.write_all(body.as_bytes()).await.unwrap();
    let refused = read_response(&mut stream).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    stream
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let next = read_all(&mut stream).await;
    assert!(next.starts_with("HTTP/1.1 200"), "{next:?}");
}
