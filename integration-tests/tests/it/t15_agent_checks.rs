//! The agent's own checks and services over HTTP against real dev agents: every check type
//! against real local targets (an HTTP server answering 200/429/500, open and closed TCP ports,
//! `/bin/true`, `/bin/false` and `exit 2` scripts), TTL updates and expiry, services with
//! several checks, maintenance mode, sessions bound to checks, anti-entropy repairing the
//! catalog, config-file definitions, Consul's exact shapes and error texts.
//! Mirrors docs/consul-compatibility.md#agent-checks-and-services, #invalidation and
//! #consul-tests-mirrored (`TestCheckHTTP`, `TestCheckTCP*`, `TestCheckMonitor_*`, `TestCheckTTL`).

use std::time::Duration;

use integration_tests::{Agent, Reply, SHORT_AE_INTERVAL, SHORT_SESSION_TTL, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::common::{assert_error, assert_error_containing, config_file, refused_config};

/// Consul's answer to a service ID this agent does not have.
const UNKNOWN_SERVICE: &str =
    "Unknown service ID \"ghost\". Ensure that the service ID is passed, not the service name.";

/// Consul's shortest check interval: a process check must beat any interval check.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Long enough for an interval check's stagger, a run and the sync to the catalog.
const SETTLE: Duration = Duration::from_secs(15);

fn assert_ok(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

async fn put_ok(agent: &Agent, path: &str, body: Value) {
    assert_ok(&agent.put(path, body.to_string()).await);
}

/// `/v1/agent/checks` as an object keyed by check ID.
async fn agent_checks(agent: &Agent) -> Value {
    let reply = agent.get("/v1/agent/checks").await;
    assert_ok(&reply);
    reply.json()
}

async fn agent_check(agent: &Agent, id: &str) -> Option<Value> {
    agent_checks(agent).await.get(id).cloned()
}

/// A check of this agent's node as the catalog holds it.
async fn catalog_check(agent: &Agent, id: &str) -> Option<Value> {
    let reply = agent.get(&format!("/v1/health/node/{}", agent.node)).await;
    assert_ok(&reply);
    reply
        .json()
        .as_array()
        .expect("array")
        .iter()
        .find(|c| c["CheckID"] == id)
        .cloned()
}

/// Waits until the agent reports `status` for check `id`, and returns the check.
async fn wait_status(agent: &Agent, id: &str, status: &str) -> Value {
    eventually(SETTLE, &format!("check {id} {status}"), || async {
        agent_check(agent, id)
            .await
            .filter(|c| c["Status"] == status)
    })
    .await
}

/// Registers the TTL check `name`, passing until its `ttl` runs out.
async fn passing_ttl_check(agent: &Agent, name: &str, ttl: &str) {
    let body = json!({"Name": name, "TTL": ttl, "Status": "passing"});
    put_ok(agent, "/v1/agent/check/register", body).await;
}

/// A session bound to `serfHealth` and `check`, with no lock-delay so a released key is free.
async fn bound_session(agent: &Agent, check: &str) -> String {
    agent
        .session(&json!({"NodeChecks": ["serfHealth", check], "LockDelay": "0s"}).to_string())
        .await
}

/// A tiny HTTP server on 127.0.0.1: `/ok` answers 200, `/busy` 429, `/fail` 500, and `/echo`
/// 200 with the request line and headers it received.
async fn http_target() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                // Read the body too, so closing never resets the connection under the reply.
                let text = String::from_utf8_lossy(&request).to_string();
                let head_len = text.find("\r\n\r\n").map_or(request.len(), |at| at + 4);
                let body_len = text
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                while request.len() < head_len + body_len {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (status, body) = match path.as_str() {
                    "/ok" => ("200 OK", "all good".to_owned()),
                    "/busy" => ("429 Too Many Requests", "slow down".to_owned()),
                    "/echo" => ("200 OK", text.to_ascii_lowercase()),
                    _ => ("500 Internal Server Error", "broken".to_owned()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    (base, task)
}

/// A TCP port on 127.0.0.1 nobody listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address").port()
}

#[tokio::test]
async fn ttl_check_pass_warn_fail_update_and_expiry() {
    let agent = Agent::dev().await;

    // A TTL check starts critical with no output, and is in the catalog when register returns.
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "heartbeat", "TTL": "2s", "Notes": "the worker's pulse"}),
    )
    .await;
    let check = agent_check(&agent, "heartbeat").await.expect("registered");
    assert_eq!(check["Status"], "critical");
    assert_eq!(check["Output"], "");
    assert_eq!(check["Type"], "ttl");
    assert_eq!(check["Notes"], "the worker's pulse");
    let synced = catalog_check(&agent, "heartbeat").await.expect("synced");
    assert_eq!(synced["Status"], "critical");

    // pass/warn/fail set the status, the note becomes the output; each reaches the catalog
    // before the reply.
    for (verb, status) in [
        ("pass", "passing"),
        ("warn", "warning"),
        ("fail", "critical"),
    ] {
        let note = format!("{verb} note");
        let reply = agent
            .put(
                &format!("/v1/agent/check/{verb}/heartbeat?note={verb}%20note"),
                "",
            )
            .await;
        assert_ok(&reply);
        assert!(reply.body.is_empty(), "empty body");
        let check = agent_check(&agent, "heartbeat").await.expect("check");
        assert_eq!(
            (check["Status"].clone(), check["Output"].clone()),
            (json!(status), json!(note))
        );
        let synced = catalog_check(&agent, "heartbeat").await.expect("synced");
        assert_eq!(
            (synced["Status"].clone(), synced["Output"].clone()),
            (json!(status), json!(note))
        );
    }

    // update takes a body; output past 4 KiB is cut with Consul's suffix.
    let long = "x".repeat(5000);
    put_ok(
        &agent,
        "/v1/agent/check/update/heartbeat",
        json!({"Status": "passing", "Output": long}),
    )
    .await;
    let check = agent_check(&agent, "heartbeat").await.expect("check");
    assert_eq!(check["Status"], "passing");
    let output = check["Output"].as_str().expect("output");
    assert_eq!(
        output,
        format!("{} ... (captured 4096 of 5000 bytes)", "x".repeat(4096))
    );
    put_ok(
        &agent,
        "/v1/agent/check/update/heartbeat",
        json!({"Status": "passing", "Output": "last words"}),
    )
    .await;

    // With no update for the TTL, the check expires to critical, quoting the last output.
    let expired = wait_status(&agent, "heartbeat", "critical").await;
    assert_eq!(
        expired["Output"],
        "TTL expired (last output before timeout follows): last words"
    );
    eventually(SETTLE, "expiry in the catalog", || async {
        catalog_check(&agent, "heartbeat")
            .await
            .filter(|c| c["Status"] == "critical")
    })
    .await;

    // An update re-arms it.
    put_ok(&agent, "/v1/agent/check/pass/heartbeat", json!(null)).await;
    assert_eq!(
        agent_check(&agent, "heartbeat").await.expect("check")["Status"],
        "passing"
    );

    // Errors: unknown IDs, a bad status, a non-TTL check.
    assert_error(
        &agent.put("/v1/agent/check/pass/nope", "").await,
        StatusCode::NOT_FOUND,
        "Unknown check ID \"nope\". Ensure that the check ID is passed, not the check name.",
    );
    assert_error(
        &agent
            .put("/v1/agent/check/update/heartbeat", r#"{"Status":"fine"}"#)
            .await,
        StatusCode::BAD_REQUEST,
        "Invalid check status: 'fine'",
    );
    put_ok(&agent, "/v1/agent/maintenance?enable=true", json!(null)).await;
    assert_error(
        &agent
            .put("/v1/agent/check/pass/_node_maintenance", "")
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "CheckID \"_node_maintenance\" does not have associated TTL",
    );
    let get = agent.get("/v1/agent/check/pass/heartbeat").await;
    assert_eq!(
        get.status,
        StatusCode::METHOD_NOT_ALLOWED,
        "pass is PUT only"
    );
}

#[tokio::test]
async fn http_checks_map_200_429_and_500() {
    let agent = Agent::dev().await;
    let (base, server) = http_target().await;

    // Three checks against a real server: 2xx passing, 429 warning, 500 critical, with
    // Consul's output format.
    for path in ["ok", "busy", "fail"] {
        put_ok(
            &agent,
            "/v1/agent/check/register",
            json!({"Name": path, "HTTP": format!("{base}/{path}"), "Interval": "1s",
                   "Status": if path == "fail" { "passing" } else { "critical" }}),
        )
        .await;
    }
    let ok = wait_status(&agent, "ok", "passing").await;
    assert_eq!(
        ok["Output"],
        format!("HTTP GET {base}/ok: 200 OK Output: all good")
    );
    assert_eq!(ok["Type"], "http");
    assert_eq!(ok["Interval"], "1s");
    assert_eq!(
        ok["Definition"],
        json!({"Interval": "1s", "HTTP": format!("{base}/ok")})
    );
    let busy = wait_status(&agent, "busy", "warning").await;
    assert_eq!(
        busy["Output"],
        format!("HTTP GET {base}/busy: 429 Too Many Requests Output: slow down")
    );
    let fail = wait_status(&agent, "fail", "critical").await;
    assert_eq!(
        fail["Output"],
        format!("HTTP GET {base}/fail: 500 Internal Server Error Output: broken")
    );
    // Runner results reach the catalog without any API call.
    eventually(SETTLE, "runner statuses in the catalog", || async {
        let ok = catalog_check(&agent, "ok").await?;
        let busy = catalog_check(&agent, "busy").await?;
        (ok["Status"] == "passing" && busy["Status"] == "warning").then_some(())
    })
    .await;

    // Method, headers and body are sent; Consul's User-Agent and Accept by default.
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "echo", "HTTP": format!("{base}/echo"), "Interval": "1s",
               "Method": "POST", "Header": {"X-Probe": ["yes"]}, "Body": "ping",
               "Timeout": "2s"}),
    )
    .await;
    let echo = eventually(SETTLE, "echo check output", || async {
        agent_check(&agent, "echo")
            .await
            .filter(|c| c["Output"].as_str().is_some_and(|o| !o.is_empty()))
    })
    .await;
    let output = echo["Output"].as_str().expect("output");
    assert!(
        output.starts_with(&format!("HTTP POST {base}/echo: 200 OK Output: post /echo")),
        "{output}"
    );
    assert!(output.contains("x-probe: yes"), "{output}");
    assert!(
        output.contains("user-agent: consul health check"),
        "{output}"
    );
    assert!(
        output.contains("accept: text/plain, text/*, */*"),
        "{output}"
    );
    assert_eq!(echo["Timeout"], "2s");

    // A server that is gone: critical with the transport error.
    server.abort();
    let port = closed_port().await;
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "down", "HTTP": format!("http://127.0.0.1:{port}/"), "Interval": "1s",
               "Status": "passing"}),
    )
    .await;
    let down = wait_status(&agent, "down", "critical").await;
    let output = down["Output"].as_str().expect("output");
    assert!(
        output.starts_with(&format!("Get \"http://127.0.0.1:{port}/\": ")),
        "{output}"
    );
}

#[tokio::test]
async fn tcp_checks_connect() {
    let agent = Agent::dev().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let open = listener.local_addr().expect("address");
    let closed = format!("127.0.0.1:{}", closed_port().await);

    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "open", "TCP": open.to_string(), "Interval": "1s"}),
    )
    .await;
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "closed", "TCP": closed, "Interval": "1s", "Status": "passing"}),
    )
    .await;
    let up = wait_status(&agent, "open", "passing").await;
    assert_eq!(up["Output"], format!("TCP connect {open}: Success"));
    assert_eq!(up["Type"], "tcp");
    let down = wait_status(&agent, "closed", "critical").await;
    let output = down["Output"].as_str().expect("output");
    assert!(
        output.starts_with(&format!("dial tcp {closed}: ")),
        "{output}"
    );
    assert!(output.to_lowercase().contains("refused"), "{output}");
}

#[tokio::test]
async fn script_checks_map_exit_codes() {
    let agent = Agent::dev_with_env(&["--enable-script-checks"], &[SHORT_SESSION_TTL]).await;
    let cases = [
        ("true", json!(["/bin/true"]), "passing"),
        ("false", json!(["/bin/false"]), "warning"),
        (
            "two",
            json!(["sh", "-c", "echo exiting; exit 2"]),
            "critical",
        ),
    ];
    for (name, args, _) in &cases {
        let initial = if *name == "true" {
            "critical"
        } else {
            "passing"
        };
        put_ok(
            &agent,
            "/v1/agent/check/register",
            json!({"Name": name, "Args": args, "Interval": "1s", "Status": initial}),
        )
        .await;
    }
    for (name, _, status) in &cases {
        let check = wait_status(&agent, name, status).await;
        assert_eq!(check["Type"], "script");
    }
    assert_eq!(
        agent_check(&agent, "two").await.expect("check")["Output"],
        "exiting\n"
    );

    // A script that outlives its timeout is killed and critical.
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "slow", "ScriptArgs": ["sleep", "30"], "Interval": "1s",
               "Timeout": "200ms", "Status": "passing"}),
    )
    .await;
    let slow = wait_status(&agent, "slow", "critical").await;
    assert_eq!(slow["Output"], "Timed out (200ms) running check");
}

#[tokio::test]
async fn script_checks_refused_without_the_flag() {
    let agent = Agent::dev().await;
    let refused = "Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' to true";
    assert_error(
        &agent
            .put(
                "/v1/agent/check/register",
                json!({"Name": "s", "Args": ["/bin/true"], "Interval": "1s"}).to_string(),
            )
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        refused,
    );
    assert_error(
        &agent
            .put(
                "/v1/agent/service/register",
                json!({"Name": "web", "Check": {"Args": ["/bin/true"], "Interval": "1s"}})
                    .to_string(),
            )
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        refused,
    );
    assert_eq!(agent_checks(&agent).await, json!({}));
    let services = agent.get("/v1/agent/services").await;
    assert_eq!(services.json(), json!({}), "nothing half-registered");
}

#[tokio::test]
async fn registration_errors_use_consul_texts() {
    let agent = Agent::dev().await;
    let cases = [
        (
            json!({"TTL": "10s"}),
            StatusCode::BAD_REQUEST,
            "Missing check name",
        ),
        (
            json!({"Name": "a", "TTL": "10s", "Status": "ok"}),
            StatusCode::BAD_REQUEST,
            "Bad check status",
        ),
        (
            json!({"Name": "a", "TTL": "10s", "Interval": "10s"}),
            StatusCode::BAD_REQUEST,
            "Invalid check: Interval and TTL cannot both be specified",
        ),
        (
            json!({"Name": "a", "TCP": "127.0.0.1:1"}),
            StatusCode::BAD_REQUEST,
            "Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or OSService checks",
        ),
        (
            json!({"Name": "a"}),
            StatusCode::BAD_REQUEST,
            "Invalid check: TTL must be > 0 for TTL checks",
        ),
        (
            json!({"Name": "a", "TTL": "10s", "Extra": true}),
            StatusCode::BAD_REQUEST,
            "Request decode failed: json: unknown field \"Extra\"",
        ),
        (
            json!({"Name": "a", "TTL": "10s", "ServiceID": "ghost"}),
            StatusCode::NOT_FOUND,
            "ServiceID \"ghost\" does not exist",
        ),
    ];
    for (body, status, message) in cases {
        let reply = agent
            .put("/v1/agent/check/register", body.to_string())
            .await;
        assert_error(&reply, status, message);
    }
    assert_error(
        &agent
            .put(
                "/v1/agent/service/register",
                json!({"Port": 80}).to_string(),
            )
            .await,
        StatusCode::BAD_REQUEST,
        "Missing service name",
    );
    assert_error(
        &agent
            .put(
                "/v1/agent/service/register",
                json!({"Name": "web", "Check": {"TTL": "5s", "Status": "up"}}).to_string(),
            )
            .await,
        StatusCode::BAD_REQUEST,
        "Status for checks must 'passing', 'warning', 'critical'",
    );
    for (path, message) in [
        ("/v1/agent/service/deregister/ghost", UNKNOWN_SERVICE),
        (
            "/v1/agent/check/deregister/ghost",
            "Unknown check ID \"ghost\". Ensure that the check ID is passed, not the check name.",
        ),
    ] {
        assert_error(&agent.put(path, "").await, StatusCode::NOT_FOUND, message);
    }
    assert_error(
        &agent.get("/v1/agent/service/ghost").await,
        StatusCode::NOT_FOUND,
        "unknown service ID: ghost",
    );
    assert_eq!(agent_checks(&agent).await, json!({}));
}

#[tokio::test]
async fn service_with_several_checks() {
    let agent = Agent::dev().await;

    // Embedded checks get service:<id>:<n> IDs, the service's name and tags, and reach the
    // catalog with the service.
    put_ok(
        &agent,
        "/v1/agent/service/register",
        json!({"Name": "web", "ID": "web-1", "Port": 8080, "Tags": ["v1"],
               "Checks": [{"TTL": "30s"}, {"TTL": "30s", "Name": "second", "Status": "passing"}]}),
    )
    .await;
    let checks = agent_checks(&agent).await;
    let ids: Vec<&String> = checks.as_object().expect("object").keys().collect();
    assert_eq!(ids, ["service:web-1:1", "service:web-1:2"]);
    let first = &checks["service:web-1:1"];
    assert_eq!(first["Name"], "Service 'web' check");
    assert_eq!(first["ServiceID"], "web-1");
    assert_eq!(first["ServiceName"], "web");
    assert_eq!(first["ServiceTags"], json!(["v1"]));
    assert_eq!(first["Status"], "critical");
    assert_eq!(checks["service:web-1:2"]["Name"], "second");
    assert_eq!(checks["service:web-1:2"]["Status"], "passing");
    for id in ["service:web-1:1", "service:web-1:2"] {
        assert!(catalog_check(&agent, id).await.is_some(), "{id} synced");
    }
    let instances = agent.get("/v1/catalog/service/web").await.json();
    assert_eq!(instances[0]["ServiceID"], "web-1");
    assert_eq!(instances[0]["ServicePort"], 8080);

    // A check registered on its own can name the service.
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "extra", "TTL": "30s", "ServiceID": "web-1"}),
    )
    .await;
    assert_eq!(
        agent_check(&agent, "extra").await.expect("check")["ServiceName"],
        "web"
    );

    // Re-registering keeps other checks unless ?replace-existing-checks.
    let again = json!({"Name": "web", "ID": "web-1", "Port": 8080, "Check": {"TTL": "30s"}});
    put_ok(&agent, "/v1/agent/service/register", again.clone()).await;
    assert!(agent_check(&agent, "extra").await.is_some());
    put_ok(
        &agent,
        "/v1/agent/service/register?replace-existing-checks",
        again,
    )
    .await;
    let ids: Vec<String> = agent_checks(&agent)
        .await
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    assert_eq!(ids, ["service:web-1"]);
    assert!(
        catalog_check(&agent, "extra").await.is_none(),
        "replaced in the catalog too"
    );

    // Deregistering the service removes its checks, here and in the catalog.
    put_ok(&agent, "/v1/agent/service/deregister/web-1", json!(null)).await;
    assert_eq!(agent_checks(&agent).await, json!({}));
    assert_eq!(agent.get("/v1/agent/services").await.json(), json!({}));
    assert!(catalog_check(&agent, "service:web-1").await.is_none());
    assert_eq!(agent.get("/v1/catalog/service/web").await.json(), json!([]));
}

/// Turns maintenance on through `path` and returns the check `id` it adds.
async fn enable_maintenance(agent: &Agent, path: &str, id: &str) -> Value {
    put_ok(agent, path, json!(null)).await;
    agent_check(agent, id).await.expect("maintenance check")
}

/// Turns maintenance off through `path`: its check `id` leaves the agent and the catalog.
async fn disable_maintenance(agent: &Agent, path: &str, id: &str) {
    put_ok(agent, path, json!(null)).await;
    assert!(agent_check(agent, id).await.is_none(), "{id}");
    assert!(catalog_check(agent, id).await.is_none(), "{id}");
}

#[tokio::test]
async fn maintenance_mode_adds_and_removes_its_check() {
    let agent = Agent::dev().await;
    put_ok(&agent, "/v1/agent/service/register", json!({"Name": "db"})).await;

    // Node maintenance: a critical _node_maintenance check with the reason as its notes.
    let check = enable_maintenance(
        &agent,
        "/v1/agent/maintenance?enable=true&reason=patching",
        "_node_maintenance",
    )
    .await;
    assert_eq!(check["Name"], "Node Maintenance Mode");
    assert_eq!(check["Status"], "critical");
    assert_eq!(check["Notes"], "patching");
    assert_eq!(check["Type"], "maintenance");
    assert!(catalog_check(&agent, "_node_maintenance").await.is_some());
    // A session cannot bind to a node in maintenance.
    let refused = agent
        .put(
            "/v1/session/create",
            json!({"NodeChecks": ["serfHealth", "_node_maintenance"]}).to_string(),
        )
        .await;
    let critical = "is in critical state";
    assert_error_containing(&refused, StatusCode::INTERNAL_SERVER_ERROR, critical);
    disable_maintenance(
        &agent,
        "/v1/agent/maintenance?enable=false",
        "_node_maintenance",
    )
    .await;

    // Service maintenance, with Consul's default reason.
    let check = enable_maintenance(
        &agent,
        "/v1/agent/service/maintenance/db?enable=true",
        "_service_maintenance:db",
    )
    .await;
    assert_eq!(check["Name"], "Service Maintenance Mode");
    assert_eq!(check["ServiceID"], "db");
    assert_eq!(
        check["Notes"],
        "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."
    );
    let health = agent.get("/v1/health/service/db?passing").await.json();
    assert_eq!(
        health,
        json!([]),
        "an instance in maintenance is not passing"
    );
    disable_maintenance(
        &agent,
        "/v1/agent/service/maintenance/db?enable=false",
        "_service_maintenance:db",
    )
    .await;

    // Errors.
    let bad = StatusCode::BAD_REQUEST;
    for (path, status, message) in [
        ("/v1/agent/maintenance", bad, "Missing value for enable"),
        (
            "/v1/agent/maintenance?enable=maybe",
            bad,
            "Invalid value for enable: \"maybe\"",
        ),
        (
            "/v1/agent/service/maintenance/ghost?enable=true",
            StatusCode::NOT_FOUND,
            UNKNOWN_SERVICE,
        ),
    ] {
        assert_error(&agent.put(path, "").await, status, message);
    }
}

#[tokio::test]
async fn session_bound_to_ttl_check_dies_when_the_ttl_lapses() {
    let agent = Agent::dev().await;
    passing_ttl_check(&agent, "lease", "2s").await;

    // Hold a lock with a session bound to the TTL check.
    let session = bound_session(&agent, "lease").await;
    agent.acquire_ok("jobs/leader", &session).await;
    assert_eq!(
        agent.holder("jobs/leader").await.as_deref(),
        Some(session.as_str())
    );

    // Nobody renews the check: it goes critical, the session is invalidated, the lock released.
    eventually(SETTLE, "the lock to be released", || async {
        agent.holder("jobs/leader").await.is_none().then_some(())
    })
    .await;
    assert!(!agent.session_exists(&session).await);
    let check = agent_check(&agent, "lease").await.expect("check");
    assert_eq!(check["Status"], "critical");
    assert_eq!(check["Output"], "TTL expired");

    // Passing again does not bring the session back; a warning never invalidates.
    put_ok(&agent, "/v1/agent/check/pass/lease", json!(null)).await;
    assert!(!agent.session_exists(&session).await);
    passing_ttl_check(&agent, "steady", "1m").await;
    let survivor = bound_session(&agent, "steady").await;
    put_ok(&agent, "/v1/agent/check/warn/steady", json!(null)).await;
    assert!(
        agent.session_exists(&survivor).await,
        "warning keeps the session"
    );
    // An explicit fail invalidates before the reply returns.
    put_ok(&agent, "/v1/agent/check/fail/steady", json!(null)).await;
    assert!(!agent.session_exists(&survivor).await);
}

/// A process that sleeps until killed, to bind checks to.
fn sleeper() -> tokio::process::Child {
    tokio::process::Command::new("sleep")
        .arg("600")
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sleep")
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn session_bound_to_a_process_check_dies_with_the_process_not_with_a_pause() {
    let agent = Agent::dev().await;

    // A process check is passing while its process runs, with no Status given.
    let mut worker = sleeper();
    let pid = worker.id().expect("pid");
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "worker", "ProcessID": pid}),
    )
    .await;
    let check = agent_check(&agent, "worker").await.expect("check");
    assert_eq!(check["Status"], "passing", "{check}");
    assert_eq!(check["Type"], "process");
    let session = bound_session(&agent, "worker").await;
    agent.acquire_ok("jobs/process", &session).await;

    // Stopped (SIGSTOP) for longer than it takes the exit to be noticed: still held.
    signal(pid, "-STOP");
    let paused = tokio::time::Instant::now();
    while paused.elapsed() < Duration::from_secs(1) {
        assert!(
            agent.session_exists(&session).await,
            "a paused process keeps its session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        agent_check(&agent, "worker").await.expect("check")["Status"],
        "passing"
    );
    signal(pid, "-CONT");

    // Killed: the check is critical and the session gone within moments, not a probe interval.
    signal(pid, "-KILL");
    let killed = tokio::time::Instant::now();
    let _ = worker.wait().await;
    eventually(SETTLE, "the session to be invalidated", || async {
        (!agent.session_exists(&session).await).then_some(())
    })
    .await;
    let invalidated = killed.elapsed();
    assert_eq!(agent.holder("jobs/process").await, None);
    let check = agent_check(&agent, "worker").await.expect("check");
    assert_eq!(check["Status"], "critical");
    assert_eq!(check["Output"], format!("process {pid} exited"));
    println!("t15 process check: kill→session invalidated {invalidated:?}");
    assert!(
        invalidated < MIN_INTERVAL,
        "invalidated after {invalidated:?}: no faster than an interval check"
    );

    // A process that is already gone registers critical, so no session can bind to it.
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "gone", "ProcessID": pid}),
    )
    .await;
    assert_eq!(
        agent_check(&agent, "gone").await.expect("check")["Status"],
        "critical"
    );
    let refused = agent
        .put(
            "/v1/session/create",
            json!({"NodeChecks": ["serfHealth", "gone"]}).to_string(),
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        refused.text()
    );

    // In a service definition too; and it takes no other check type.
    let mut service_worker = sleeper();
    let service_pid = service_worker.id().expect("pid");
    put_ok(
        &agent,
        "/v1/agent/service/register",
        json!({"Name": "web", "Check": {"ProcessID": service_pid}}),
    )
    .await;
    wait_status(&agent, "service:web", "passing").await;
    let _ = service_worker.kill().await;
    wait_status(&agent, "service:web", "critical").await;
    for (body, message) in [
        (
            json!({"Name": "x", "ProcessID": 1, "TTL": "10s"}),
            "Invalid check: ProcessID cannot be combined with another check type, Interval or TTL",
        ),
        (
            json!({"Name": "x", "ProcessID": -1}),
            "Invalid check: ProcessID must be a positive process ID",
        ),
    ] {
        assert_error(
            &agent
                .put("/v1/agent/check/register", body.to_string())
                .await,
            StatusCode::BAD_REQUEST,
            message,
        );
    }
}

#[tokio::test]
async fn check_deregistration_invalidates_bound_sessions() {
    let agent = Agent::dev().await;
    passing_ttl_check(&agent, "guard", "1m").await;
    let session = bound_session(&agent, "guard").await;
    agent.acquire_ok("guarded", &session).await;

    put_ok(&agent, "/v1/agent/check/deregister/guard", json!(null)).await;
    assert!(
        !agent.session_exists(&session).await,
        "gone when deregister returns"
    );
    assert_eq!(agent.holder("guarded").await, None);
    assert!(catalog_check(&agent, "guard").await.is_none());

    // The same through a service's check.
    put_ok(
        &agent,
        "/v1/agent/service/register",
        json!({"Name": "api", "Check": {"TTL": "1m", "Status": "passing"}}),
    )
    .await;
    let session = agent
        .session(
            &json!({"NodeChecks": ["serfHealth"], "ServiceChecks": [{"ID": "service:api"}]})
                .to_string(),
        )
        .await;
    put_ok(&agent, "/v1/agent/service/deregister/api", json!(null)).await;
    assert!(!agent.session_exists(&session).await);
}

#[tokio::test]
async fn anti_entropy_repairs_the_catalog() {
    let agent = Agent::dev_with_env(&[], &[SHORT_SESSION_TTL, SHORT_AE_INTERVAL]).await;
    put_ok(
        &agent,
        "/v1/agent/service/register",
        json!({"Name": "cache", "Port": 6379, "Check": {"TTL": "1m", "Status": "passing"}}),
    )
    .await;
    passing_ttl_check(&agent, "disk", "1m").await;

    // A check deleted behind the agent's back comes back with the next full sync.
    let reply = agent
        .put(
            "/v1/catalog/deregister",
            json!({"Node": agent.node, "CheckID": "disk"}).to_string(),
        )
        .await;
    assert_ok(&reply);
    assert!(catalog_check(&agent, "disk").await.is_none());
    let repaired = eventually(SETTLE, "disk back in the catalog", || async {
        catalog_check(&agent, "disk").await
    })
    .await;
    assert_eq!(repaired["Status"], "passing");

    // The same for a whole service with its check.
    let reply = agent
        .put(
            "/v1/catalog/deregister",
            json!({"Node": agent.node, "ServiceID": "cache"}).to_string(),
        )
        .await;
    assert_ok(&reply);
    eventually(SETTLE, "cache back in the catalog", || async {
        let instances = agent.get("/v1/catalog/service/cache").await.json();
        let check = catalog_check(&agent, "service:cache").await?;
        (instances.as_array()?.len() == 1 && check["Status"] == "passing").then_some(())
    })
    .await;

    // What the catalog has on this node and the agent does not know goes, except serfHealth.
    let reply = agent
        .put(
            "/v1/catalog/register",
            json!({"Node": agent.node, "Address": "127.0.0.1",
                   "Service": {"Service": "stray", "ID": "stray"},
                   "Check": {"CheckID": "stray-check", "Name": "stray", "Status": "passing"}})
            .to_string(),
        )
        .await;
    assert_ok(&reply);
    eventually(SETTLE, "stray entries removed", || async {
        let gone = catalog_check(&agent, "stray-check").await.is_none();
        let instances = agent.get("/v1/catalog/service/stray").await.json();
        (gone && instances == json!([])).then_some(())
    })
    .await;
    assert_eq!(
        catalog_check(&agent, "serfHealth")
            .await
            .expect("serfHealth")["Status"],
        "passing"
    );
    assert!(catalog_check(&agent, "disk").await.is_some());

    // A status changed in the catalog is set back to the agent's.
    let reply = agent
        .put(
            "/v1/catalog/register",
            json!({"Node": agent.node, "Address": "127.0.0.1",
                   "Check": {"CheckID": "disk", "Name": "disk", "Status": "warning"}})
            .to_string(),
        )
        .await;
    assert_ok(&reply);
    eventually(SETTLE, "disk status repaired", || async {
        catalog_check(&agent, "disk")
            .await
            .filter(|c| c["Status"] == "passing" && c["Type"] == "ttl")
    })
    .await;
}

#[tokio::test]
async fn listings_have_consul_shapes() {
    let agent = Agent::dev().await;
    put_ok(
        &agent,
        "/v1/agent/service/register",
        json!({"name": "redis", "id": "redis1", "tags": ["primary"], "port": 6379,
               "address": "127.0.0.1", "meta": {"Version": "7"},
               "weights": {"passing": 3, "warning": 1}, "enable_tag_override": true,
               "check": {"tcp": "127.0.0.1:6379", "interval": "10s", "timeout": "1s",
                         "deregister_critical_service_after": "90m"}}),
    )
    .await;
    put_ok(
        &agent,
        "/v1/agent/check/register",
        json!({"Name": "mem", "ID": "mem1", "TTL": "30s", "Notes": "memory", "Status": "warning"}),
    )
    .await;

    // Whole objects, as a client comparing them would see them.
    let services = agent.get("/v1/agent/services").await;
    assert_eq!(
        services.header("Content-Type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        services.json(),
        json!({"redis1": {
            "ID": "redis1", "Service": "redis", "Tags": ["primary"], "Meta": {"Version": "7"},
            "Port": 6379, "Address": "127.0.0.1",
            "TaggedAddresses": {"lan_ipv4": {"Address": "127.0.0.1", "Port": 6379},
                                "wan_ipv4": {"Address": "127.0.0.1", "Port": 6379}},
            "Weights": {"Passing": 3, "Warning": 1}, "EnableTagOverride": true,
            "Datacenter": "dc1"}})
    );
    let node = agent.node.clone();
    let mut checks = agent_checks(&agent).await;
    // The TCP check's status depends on whether something listens on 6379 here.
    checks["service:redis1"]["Status"] = json!("<any>");
    checks["service:redis1"]["Output"] = json!("<any>");
    assert_eq!(
        checks,
        json!({
            "mem1": {
                "Node": node, "CheckID": "mem1", "Name": "mem", "Status": "warning",
                "Notes": "memory", "Output": "", "ServiceID": "", "ServiceName": "",
                "ServiceTags": [], "Type": "ttl", "Interval": "", "Timeout": "",
                "ExposedPort": 0, "Definition": {}, "CreateIndex": 0, "ModifyIndex": 0},
            "service:redis1": {
                "Node": node, "CheckID": "service:redis1", "Name": "Service 'redis' check",
                "Status": "<any>", "Notes": "", "Output": "<any>", "ServiceID": "redis1",
                "ServiceName": "redis", "ServiceTags": ["primary"], "Type": "tcp",
                "Interval": "10s", "Timeout": "1s", "ExposedPort": 0,
                "Definition": {"Interval": "10s", "Timeout": "1s",
                               "DeregisterCriticalServiceAfter": "1h30m0s",
                               "TCP": "127.0.0.1:6379"},
                "CreateIndex": 0, "ModifyIndex": 0}})
    );
    let keys: Vec<&String> = checks["mem1"].as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        [
            "Node",
            "CheckID",
            "Name",
            "Status",
            "Notes",
            "Output",
            "ServiceID",
            "ServiceName",
            "ServiceTags",
            "Type",
            "Interval",
            "Timeout",
            "ExposedPort",
            "Definition",
            "CreateIndex",
            "ModifyIndex"
        ]
    );

    // One service, with its content hash, which a blocking read waits on.
    let one = agent.get("/v1/agent/service/redis1").await;
    assert_ok(&one);
    let hash = one.header("X-Consul-ContentHash").expect("hash header");
    assert_eq!(one.json()["ContentHash"], json!(hash));
    assert_eq!(one.json()["Service"], "redis");
    let started = std::time::Instant::now();
    let same = agent
        .get(&format!("/v1/agent/service/redis1?hash={hash}&wait=300ms"))
        .await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "blocked until the wait ran out"
    );
    assert_eq!(same.header("X-Consul-ContentHash"), Some(hash.clone()));
    let waiter = {
        let http = agent.http();
        let hash = hash.clone();
        tokio::spawn(async move {
            http.get(&format!("/v1/agent/service/redis1?hash={hash}&wait=30s"))
                .await
        })
    };
    put_ok(
        &agent,
        "/v1/agent/service/register",
        json!({"Name": "redis", "ID": "redis1", "Port": 6380}),
    )
    .await;
    let woken = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by the change")
        .expect("task");
    assert_eq!(woken.json()["Port"], 6380);
    assert_ne!(woken.header("X-Consul-ContentHash"), Some(hash));

    // ?filter= keeps the matching entries of the object.
    let filtered = agent
        .get("/v1/agent/checks?filter=Status%20%3D%3D%20warning")
        .await
        .json();
    let ids: Vec<&String> = filtered.as_object().expect("object").keys().collect();
    assert_eq!(ids, ["mem1"]);
    let filtered = agent
        .get("/v1/agent/services?filter=Port%20%3D%3D%206380")
        .await
        .json();
    assert_eq!(filtered.as_object().expect("object").len(), 1);
    let filtered = agent
        .get("/v1/agent/services?filter=%22primary%22%20in%20Tags")
        .await
        .json();
    assert_eq!(filtered, json!({}), "re-registered without tags");
    let bad = agent.get("/v1/agent/checks?filter=Status%20%3D%3D").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text());
    assert!(
        bad.text()
            .starts_with("Failed to create boolean expression evaluator")
    );
}

#[tokio::test]
async fn config_file_definitions_register_at_every_start() {
    let (dir, config) = config_file(
        r#"
        [[service]]
        name = "billing"
        port = 9000
        tags = ["v2"]
        [[service.checks]]
        ttl = "1m"
        status = "passing"

        [[check]]
        id = "worker"
        name = "Worker heartbeat"
        ttl = "1m"
        "#,
    );
    let args = ["--config", config.as_str()];

    for start in 0..2 {
        // A dev agent keeps nothing: what is there after a restart came from the config file.
        let agent = Agent::dev_with_env(&args, &[SHORT_SESSION_TTL]).await;
        let services = agent.get("/v1/agent/services").await.json();
        assert_eq!(services["billing"]["Port"], 9000, "start {start}");
        let checks = agent_checks(&agent).await;
        assert_eq!(checks["service:billing"]["Status"], "passing");
        assert_eq!(checks["worker"]["Name"], "Worker heartbeat");
        assert_eq!(checks["worker"]["Status"], "critical");
        eventually(SETTLE, "config definitions in the catalog", || async {
            let worker = catalog_check(&agent, "worker").await?;
            let billing = agent.get("/v1/catalog/service/billing").await.json();
            (worker["Name"] == "Worker heartbeat" && billing.as_array()?.len() == 1).then_some(())
        })
        .await;
        agent.terminate().await;
    }

    // A config file that does not validate stops the agent from starting.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[check]]\nname = \"x\"\nargs = [\"/bin/true\"]\ninterval = \"1s\"\n",
    )
    .expect("write config");
    let stderr = refused_config(&bad);
    assert!(
        stderr.contains("Scripts are disabled on this agent"),
        "{stderr}"
    );
}
