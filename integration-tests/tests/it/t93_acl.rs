//! Access control through the HTTP API, as Consul's ACL system: a default-deny agent with an
//! initial management token; a token for one application's key prefix takes and releases its
//! lock but cannot read, release or delete another's, nor destroy another token's session;
//! listings are filtered; bootstrapping works once; an expiring token stops working; ACL state
//! survives a leader failover.

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Agent, Http, SHORT_SESSION_TTL, eventually, run_py_consul};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{assert_error, assert_error_containing};

const ROOT: &str = "2d7d1b4c-6d0e-4e0a-9d0b-7c3c3f3f0001";

async fn deny_agent() -> Agent {
    Agent::dev_with_env(
        &[
            "--acl-default-policy",
            "deny",
            "--acl-initial-management-token",
            ROOT,
        ],
        &[SHORT_SESSION_TTL],
    )
    .await
}

/// Waits until the leader has written the initial management token.
async fn management(agent: &Http) -> Http {
    let root = agent.with_token(ROOT);
    eventually(Duration::from_secs(20), "the initial management token", || {
        let root = root.clone();
        async move { (root.get("/v1/acl/token/self").await.status == StatusCode::OK).then_some(()) }
    })
    .await;
    root
}

fn ok(reply: &integration_tests::Reply) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()
}

fn denied(reply: &integration_tests::Reply) {
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    assert!(
        reply.text().starts_with("Permission denied"),
        "{}",
        reply.text()
    );
}

/// A token for `prefix` (key write) and every session (write), as the issue's application.
async fn app_token(root: &Http, name: &str, prefix: &str) -> String {
    let rules = format!(
        "key_prefix \"{prefix}\" {{\n  policy = \"write\"\n}}\nsession_prefix \"\" {{\n  policy = \"write\"\n}}\n"
    );
    let policy = ok(&root
        .put(
            "/v1/acl/policy",
            json!({"Name": name, "Rules": rules}).to_string(),
        )
        .await);
    assert_eq!(policy["Name"], name);
    let token = ok(&root
        .put(
            "/v1/acl/token",
            json!({"Description": name, "Policies": [{"Name": name}]}).to_string(),
        )
        .await);
    assert_eq!(token["Policies"][0]["Name"], name);
    token["SecretID"].as_str().expect("SecretID").to_owned()
}

/// The string `field` of each element of the array `list`.
fn fields<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    let list = list.as_array().expect("an array");
    list.iter().filter_map(|e| e[field].as_str()).collect()
}

/// Whether every element of the array `list` passes `check`.
fn every(list: &Value, check: impl Fn(&Value) -> bool) -> bool {
    list.as_array().expect("an array").iter().all(check)
}

/// Retries `method path` (with `body`) through `http`, within 30 s, until it answers 200.
async fn until_ok(http: &Http, method: Method, path: &str, body: Option<&[u8]>, what: &str) {
    eventually(Duration::from_secs(30), what, || async {
        let body = body.map(<[u8]>::to_vec);
        let reply = http.try_request(method.clone(), path, body).await.ok()?;
        (reply.status == StatusCode::OK).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_prefix_token_holds_its_own_locks_and_nobody_elses() {
    let agent = deny_agent().await;
    let root = management(&agent).await;

    // Anonymous requests are denied; an unknown token is not found.
    denied(&agent.get("/v1/kv/app/lock").await);
    let unknown = agent.with_token("00000000-1111-2222-3333-444444444444");
    let reply = unknown.get("/v1/kv/app/lock").await;
    assert_error(&reply, StatusCode::FORBIDDEN, "ACL not found");

    let app_secret = app_token(&root, "app", "app/").await;
    let app = agent.with_token(&app_secret);
    let other = agent.with_token(&app_token(&root, "other", "other/").await);

    // The other application holds other/lock.
    let other_session = other.session(r#"{"Name":"other"}"#).await;
    let took = other
        .put(&format!("/v1/kv/other/lock?acquire={other_session}"), "x")
        .await;
    assert_eq!(ok(&took), true);

    // The app takes and releases its own lock.
    let session = app.session(r#"{"Name":"app"}"#).await;
    let took = app
        .put(&format!("/v1/kv/app/lock?acquire={session}"), "me")
        .await;
    assert_eq!(ok(&took), true);
    let entry = ok(&app.get("/v1/kv/app/lock").await);
    assert_eq!(entry[0]["Session"], session.as_str());

    // ... but cannot read, release or delete the other's, nor destroy its session.
    denied(&app.get("/v1/kv/other/lock").await);
    denied(
        &app.put(&format!("/v1/kv/other/lock?release={other_session}"), "")
            .await,
    );
    denied(&app.delete("/v1/kv/other/lock").await);
    denied(&app.delete("/v1/kv/?recurse").await);
    denied(
        &app.put(&format!("/v1/session/destroy/{other_session}"), "")
            .await,
    );
    denied(
        &app.put(&format!("/v1/kv/app/stolen?acquire={other_session}"), "")
            .await,
    );
    // Nor wait in the agent for the other's lock: refused at once, not at its release.
    let asked = std::time::Instant::now();
    let waited = reqwest::Client::new()
        .put(format!("{}/v1/kv/other/lock?acquire={session}", agent.base))
        .header("X-Consul-Token", &app_secret)
        .header("X-Vigil-Acquire-Wait", "10m")
        .send()
        .await
        .unwrap();
    assert_eq!(waited.status(), StatusCode::FORBIDDEN);
    assert!(asked.elapsed() < Duration::from_secs(60), "it waited");
    // A transaction touching the other's key is refused as a whole.
    let txn = json!([
        {"KV": {"Verb": "set", "Key": "app/a", "Value": "eA=="}},
        {"KV": {"Verb": "delete", "Key": "other/lock"}},
    ]);
    let reply = app.put("/v1/txn", txn.to_string()).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.text());
    assert_eq!(reply.json()["Errors"][0]["OpIndex"], 1);
    assert_eq!(agent_key(&root, "app/a").await, None);

    // Listings show only what the token may read, and say so.
    let listed = app.get("/v1/kv/?recurse").await;
    let entries = ok(&listed);
    let keys = fields(&entries, "Key");
    assert_eq!(keys, ["app/lock"]);
    assert_eq!(
        listed
            .header("X-Consul-Results-Filtered-By-ACLs")
            .as_deref(),
        Some("true")
    );
    let locks = ok(&app.get("/v1/vigil/locks").await);
    let held: Vec<&Value> = locks["Locks"].as_array().expect("Locks").iter().collect();
    assert_eq!(held.len(), 1, "{locks}");
    assert_eq!(held[0]["Key"], "app/lock");

    // The other's lock is untouched; the app's release works.
    let entry = ok(&root.get("/v1/kv/other/lock").await);
    assert_eq!(entry[0]["Session"], other_session.as_str());
    let released = app
        .put(&format!("/v1/kv/app/lock?release={session}"), "")
        .await;
    assert_eq!(ok(&released), true);
    // Its own session it may destroy; ACL management needs acl:write.
    assert_eq!(
        ok(&app.put(&format!("/v1/session/destroy/{session}"), "").await),
        true
    );
    denied(&app.get("/v1/acl/tokens").await);
}

async fn agent_key(http: &Http, key: &str) -> Option<Value> {
    let reply = http.get(&format!("/v1/kv/{key}")).await;
    (reply.status == StatusCode::OK).then(|| reply.json())
}

#[tokio::test]
async fn tokens_policies_and_roles_are_managed_as_in_consul() {
    let agent = deny_agent().await;
    let root = management(&agent).await;

    // Bootstrapping after an initial management token is refused, as Consul does.
    let again = agent.put("/v1/acl/bootstrap", "").await;
    assert_eq!(again.status, StatusCode::FORBIDDEN);
    assert!(
        again
            .text()
            .starts_with("Permission denied: ACL bootstrap no longer allowed (reset index: "),
        "{}",
        again.text()
    );

    // The built-ins exist.
    let me = ok(&root.get("/v1/acl/token/self").await);
    assert_eq!(me["Description"], "Initial Management Token");
    assert_eq!(me["Policies"][0]["Name"], "global-management");
    let anonymous = ok(&root
        .get("/v1/acl/token/00000000-0000-0000-0000-000000000002")
        .await);
    assert_eq!(anonymous["SecretID"], "anonymous");

    // A role grants through its policies; the anonymous token can be given rights too.
    let policy = ok(&root
        .put(
            "/v1/acl/policy",
            json!({"Name": "read-all", "Rules": "key_prefix \"\" { policy = \"read\" }"})
                .to_string(),
        )
        .await);
    let role = ok(&root
        .put(
            "/v1/acl/role",
            json!({"Name": "readers", "Policies": [{"ID": policy["ID"]}]}).to_string(),
        )
        .await);
    assert_eq!(role["Policies"][0]["Name"], "read-all");
    let reader = ok(&root
        .put(
            "/v1/acl/token",
            json!({"Roles": [{"Name": "readers"}]}).to_string(),
        )
        .await);
    let reader_http = agent.with_token(reader["SecretID"].as_str().expect("secret"));
    ok(&root.put("/v1/kv/k", "v").await);
    // acl:read alone sees tokens without their secrets.
    let auditor = ok(&root
        .put(
            "/v1/acl/policy",
            json!({"Name": "auditor", "Rules": "acl = \"read\""}).to_string(),
        )
        .await);
    let auditor = ok(&root
        .put(
            "/v1/acl/token",
            json!({"Policies": [{"ID": auditor["ID"]}]}).to_string(),
        )
        .await);
    let auditor = agent.with_token(auditor["SecretID"].as_str().expect("secret"));
    let seen = ok(&auditor
        .get(&format!(
            "/v1/acl/token/{}",
            reader["AccessorID"].as_str().expect("id")
        ))
        .await);
    assert_eq!(seen["SecretID"], "<hidden>");
    let listed = ok(&auditor.get("/v1/acl/tokens").await);
    assert!(every(&listed, |t| t["SecretID"] == "<hidden>"), "{listed}");
    denied(&auditor.put("/v1/acl/token", "{}").await);
    ok(&reader_http.get("/v1/kv/k").await);
    denied(&reader_http.put("/v1/kv/k", "w").await);

    // A bad rule is refused with the parser's text; names are unique.
    let bad = root
        .put(
            "/v1/acl/policy",
            json!({"Name": "bad", "Rules": "key_prefix \"\" { policy = \"sometimes\" }"})
                .to_string(),
        )
        .await;
    assert_error_containing(
        &bad,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Invalid key_prefix policy",
    );
    let dup = root
        .put("/v1/acl/policy", json!({"Name": "read-all"}).to_string())
        .await;
    assert_eq!(
        dup.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        dup.text()
    );

    // Changing the policy changes what the token may do at once; deleting the token ends it.
    let id = policy["ID"].as_str().expect("ID");
    ok(&root
        .put(
            &format!("/v1/acl/policy/{id}"),
            json!({"Name": "read-all", "Rules": "key_prefix \"\" { policy = \"write\" }"})
                .to_string(),
        )
        .await);
    eventually(Duration::from_secs(10), "the wider policy", || {
        let reader_http = reader_http.clone();
        async move { (reader_http.put("/v1/kv/k", "w").await.status == StatusCode::OK).then_some(()) }
    })
    .await;
    let accessor = reader["AccessorID"].as_str().expect("AccessorID");
    assert_eq!(
        ok(&root.delete(&format!("/v1/acl/token/{accessor}")).await),
        true
    );
    eventually(Duration::from_secs(10), "the deleted token refused", || {
        let reader_http = reader_http.clone();
        async move { (reader_http.get("/v1/kv/k").await.text() == "ACL not found").then_some(()) }
    })
    .await;
    let listed = ok(&root.get("/v1/acl/tokens").await);
    assert!(every(&listed, |t| t["AccessorID"] != accessor), "{listed}");
    let policies = ok(&root.get("/v1/acl/policies").await);
    let names = fields(&policies, "Name");
    assert!(names.contains(&"global-management") && names.contains(&"read-all"));
    let by_name = ok(&root.get("/v1/acl/role/name/readers").await);
    assert_eq!(by_name["ID"], role["ID"]);
}

#[tokio::test]
async fn a_token_expiring_mid_hold_stops_working_and_its_lock_stays_with_the_session() {
    let agent = deny_agent().await;
    let root = management(&agent).await;
    let token = ok(&root
        .put(
            "/v1/acl/token",
            json!({"Policies": [{"Name": "global-management"}], "ExpirationTTL": "2s"}).to_string(),
        )
        .await);
    assert!(token["ExpirationTime"].is_string(), "{token}");
    let short = agent.with_token(token["SecretID"].as_str().expect("secret"));
    let session = short.session(r#"{"TTL":"30s"}"#).await;
    let took = short
        .put(&format!("/v1/kv/held?acquire={session}"), "x")
        .await;
    assert_eq!(ok(&took), true);
    eventually(Duration::from_secs(10), "the token to expire", || {
        let short = short.clone();
        async move { (short.get("/v1/kv/held").await.text() == "ACL not found").then_some(()) }
    })
    .await;
    // The holder can no longer release or renew; the lock stays with the session (a lock is
    // the session's, not the token's), and a management token can end it.
    let release = short
        .put(&format!("/v1/kv/held?release={session}"), "")
        .await;
    assert_eq!(release.status, StatusCode::FORBIDDEN);
    let renew = short.put(&format!("/v1/session/renew/{session}"), "").await;
    assert_eq!(renew.status, StatusCode::FORBIDDEN);
    let entry = ok(&root.get("/v1/kv/held").await);
    assert_eq!(entry[0]["Session"], session.as_str());
    assert_eq!(
        ok(&root
            .put(&format!("/v1/session/destroy/{session}"), "")
            .await),
        true
    );
    let entry = ok(&root.get("/v1/kv/held").await);
    assert!(entry[0].get("Session").is_none(), "{entry}");
}

#[tokio::test]
async fn bootstrap_works_once_and_acls_off_answers_401() {
    let open = Agent::dev().await;
    let reply = open.put("/v1/acl/bootstrap", "").await;
    assert_error(&reply, StatusCode::UNAUTHORIZED, "ACL support disabled");

    let agent = Agent::dev_with(&["--acl-default-policy", "deny"]).await;
    let token = eventually(Duration::from_secs(20), "bootstrap", || {
        let agent = agent.http();
        async move {
            let reply = agent.put("/v1/acl/bootstrap", "").await;
            (reply.status == StatusCode::OK).then(|| reply.json())
        }
    })
    .await;
    assert_eq!(token["Policies"][0]["Name"], "global-management");
    let again = agent.put("/v1/acl/bootstrap", "").await;
    assert_eq!(again.status, StatusCode::FORBIDDEN, "{}", again.text());
    let root = agent.with_token(token["SecretID"].as_str().expect("secret"));
    ok(&root.put("/v1/kv/x", "y").await);
    denied(&agent.put("/v1/kv/x", "y").await);
}

#[tokio::test]
async fn acl_state_survives_a_leader_failover() {
    let mut spec = Cluster::servers(3).clients(1);
    for arg in [
        "--acl-default-policy",
        "deny",
        "--acl-initial-management-token",
        ROOT,
    ] {
        spec = spec.arg(arg);
    }
    let mut cluster = spec.start().await;
    // Through a client agent, which resolves tokens on the servers.
    let client = cluster.client(0).http();
    let root = management(&client).await;
    let secret = app_token(&root, "app", "app/").await;
    let leader = cluster.leader().await;
    cluster.kill9(leader).await;
    let app = client.with_token(&secret);
    let after_failover = "a write with the token after failover";
    until_ok(
        &app,
        Method::PUT,
        "/v1/kv/app/x",
        Some(b"1"),
        after_failover,
    )
    .await;
    denied(&app.put("/v1/kv/other/x", "1").await);

    // And a restart: the old leader comes back with the same state.
    cluster.restart(leader).await;
    let restarted = cluster.server(leader).http().with_token(&secret);
    let after_restart = "the token on the restarted server";
    until_ok(&restarted, Method::GET, "/v1/kv/app/x", None, after_restart).await;
    denied(&restarted.get("/v1/kv/other/x").await);
}

#[tokio::test]
async fn py_consul_manages_acls() {
    let agent = deny_agent().await;
    management(&agent).await;
    run_py_consul("consul_acl.py", &agent, &[ROOT]).await;
}

/// `vigil <args>` against `agent`, with `token` (if any) in `CONSUL_HTTP_TOKEN`.
async fn vigil(agent: &Agent, token: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut command = tokio::process::Command::new(integration_tests::binary());
    command
        .args(args)
        .env("CONSUL_HTTP_ADDR", &agent.base)
        .env_remove("VIGIL_HTTP_ADDR")
        .env_remove("VIGIL_HTTP_TOKEN")
        .env_remove("CONSUL_HTTP_TOKEN")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("CONSUL_HTTP_TOKEN", token);
    }
    tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("vigil finished in time")
        .expect("run vigil")
}

fn stdout_json(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

/// A dev agent with ACLs on (default deny), bootstrapped by `vigil acl bootstrap`, and the
/// management token's secret it printed.
async fn bootstrapped_by_the_cli() -> (Agent, String) {
    let agent = Agent::dev_with(&["--acl-default-policy", "deny"]).await;
    let root = eventually(Duration::from_secs(20), "vigil acl bootstrap", || {
        let agent = &agent;
        async move {
            let out = vigil(agent, None, &["acl", "bootstrap", "--format", "json"]).await;
            out.status.success().then(|| stdout_json(&out))
        }
    })
    .await;
    let root = root["SecretID"].as_str().expect("SecretID").to_owned();
    (agent, root)
}

/// What `vigil` printed when run with `token`, which must succeed.
async fn printed(agent: &Agent, token: &str, args: &[&str]) -> String {
    let out = vigil(agent, Some(token), args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_cli_bootstraps_and_hands_out_a_prefix_token() {
    let (agent, root) = bootstrapped_by_the_cli().await;
    let again = vigil(&agent, None, &["acl", "bootstrap"]).await;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("ACL bootstrap no longer allowed"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    let rules = "key_prefix \"app/\" { policy = \"write\" }";
    let policy = vigil(
        &agent,
        Some(&root),
        &["acl", "policy", "create", "--name", "app", "--rules", rules],
    )
    .await;
    let printed = String::from_utf8_lossy(&policy.stdout);
    assert!(
        policy.status.success() && printed.contains("Name:         app"),
        "{printed}"
    );
    let token = vigil(
        &agent,
        Some(&root),
        &[
            "acl",
            "token",
            "create",
            "--policy-name",
            "app",
            "--format",
            "json",
        ],
    )
    .await;
    let token = stdout_json(&token);
    let app = token["SecretID"].as_str().expect("SecretID");

    let put = vigil(&agent, Some(app), &["kv", "put", "app/x", "1"]).await;
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let other = vigil(&agent, Some(app), &["kv", "put", "other/x", "1"]).await;
    assert!(!other.status.success());
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
    let listed = vigil(
        &agent,
        Some(&root),
        &["acl", "token", "list", "--format", "json"],
    )
    .await;
    let listed = stdout_json(&listed);
    assert!(
        listed
            .as_array()
            .expect("tokens")
            .iter()
            .any(|t| t["AccessorID"] == token["AccessorID"])
    );
    let refused = vigil(&agent, Some(app), &["acl", "token", "list"]).await;
    assert!(!refused.status.success());
}

/// `vigil acl` prints what it reads as Consul's CLI does, for roles and policies named by
/// name and for lists; a malformed identity is refused before anything is sent, and a policy
/// that is not there is an error, not an empty entry.
#[tokio::test]
async fn the_cli_prints_roles_policies_and_tokens_it_reads() {
    let (agent, root) = bootstrapped_by_the_cli().await;
    let rules = "key_prefix \"app/\" { policy = \"read\" }";
    let create = &[
        "acl", "policy", "create", "--name", "reader", "--rules", rules,
    ];
    printed(&agent, &root, create).await;
    let read = printed(
        &agent,
        &root,
        &["acl", "policy", "read", "--name", "reader"],
    )
    .await;
    assert!(read.contains("Name:         reader"), "{read}");
    assert!(read.contains("Rules:\nkey_prefix \"app/\""), "{read}");

    let role = [
        "acl",
        "role",
        "create",
        "--name",
        "web-role",
        "--policy-name",
        "reader",
        "--service-identity",
        "web:dc1,dc2",
        "--node-identity",
        "n1:dc1",
    ];
    printed(&agent, &root, &role).await;
    let read = printed(
        &agent,
        &root,
        &["acl", "role", "read", "--name", "web-role"],
    )
    .await;
    assert!(read.contains("Name:         web-role"), "{read}");
    assert!(read.contains(" - reader"), "{read}");
    assert!(read.contains("   web (Datacenters: dc1, dc2)"), "{read}");
    assert!(read.contains("   n1 (Datacenter: dc1)"), "{read}");

    let token = [
        "acl",
        "token",
        "create",
        "--description",
        "ci",
        "--role-name",
        "web-role",
    ];
    let created = printed(&agent, &root, &token).await;
    assert!(created.contains("Description:      ci"), "{created}");
    assert!(created.contains("Roles:\n   "), "{created}");
    assert!(created.contains(" - web-role"), "{created}");
    let listed = printed(&agent, &root, &["acl", "token", "list"]).await;
    assert!(listed.contains("Description:      ci"), "{listed}");
    assert!(
        listed.contains("\n\nAccessorID:"),
        "a blank line between tokens: {listed}"
    );
    let me = printed(&agent, &root, &["acl", "token", "read", "--self"]).await;
    assert!(me.contains(&format!("SecretID:         {root}")), "{me}");
    let policies = printed(&agent, &root, &["acl", "policy", "list"]).await;
    assert!(policies.contains("Name:         reader"), "{policies}");
    assert!(
        !policies.contains("Rules:"),
        "a list shows no rules: {policies}"
    );

    let bad = ["acl", "token", "create", "--node-identity", "no-datacenter"];
    let refused = vigil(&agent, Some(&root), &bad).await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--node-identity must be NODE:DC"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let missing = vigil(
        &agent,
        Some(&root),
        &["acl", "policy", "read", "--name", "nope"],
    )
    .await;
    assert!(
        !missing.status.success(),
        "{}",
        String::from_utf8_lossy(&missing.stdout)
    );
}

/// The attack of issue #31 replayed: a client agent's certificate (every client host holds
/// one) dialing a follower's RPC endpoint by hand gets what the token it sends grants and no
/// more: without a token it reads no secret, mints no token, removes no peer and neither saves
/// nor restores a snapshot; the old tokenless requests are the anonymous token's, the
/// leader-internal ones a server's; a CLI certificate is refused outright. With the
/// management token the same requests work, so it is the token that decides.
#[tokio::test]
async fn a_client_agent_certificate_over_raw_rpc_gets_only_what_its_token_grants() {
    use vigil_shared::acl::{GLOBAL_MANAGEMENT_POLICY_ID, Link, Token};
    use vigil_shared::operator::{OperatorReply, OperatorRequest, PeerRef};
    use vigil_shared::rpc::calls::{self, Forwarded, RpcRequest, RpcResponse};
    use vigil_shared::rpc::{AclOp, Op, QueryOptions, QueryResult, ReadQuery};
    use vigil_wire::tls::Role;

    use crate::common::PROMPT;

    let cluster = Cluster::servers(3)
        .clients(1)
        .arg("--acl-default-policy")
        .arg("deny")
        .arg("--acl-initial-management-token")
        .arg(ROOT)
        .start()
        .await;
    let leader = cluster.leader().await;
    let root = management(cluster.server(leader)).await;

    // Through a client agent, the token a request presents is what the servers check too:
    // an application's prefix token writes and reads its prefix, and management reads it back.
    let client = cluster.client(0);
    let app = client.with_token(&app_token(&root, "app", "app/").await);
    eventually(Duration::from_secs(30), "a write through the client agent", || {
        let app = app.clone();
        async move { (app.put("/v1/kv/app/x", "v").await.status == StatusCode::OK).then_some(()) }
    })
    .await;
    let read = client.with_token(ROOT).get("/v1/kv/app/x?raw").await;
    assert_eq!((read.status, read.text()), (StatusCode::OK, "v".to_owned()));
    denied(&app.put("/v1/kv/other/x", "v").await);

    // A blocking read waits outside its handler, and still asks the servers with its own
    // request's token: the application's watch on its key wakes with the new value.
    let index = app.get("/v1/kv/app/x").await.index();
    let watch = {
        let app = app.clone();
        tokio::spawn(async move {
            app.get(&format!("/v1/kv/app/x?raw&index={index}&wait=60s"))
                .await
        })
    };
    let stats = client.with_token(ROOT);
    eventually(Duration::from_secs(30), "the watch waiting", || async {
        let me = stats.get("/v1/agent/self").await.json();
        (me["Stats"]["agent"]["blocking_queries"] == "1").then_some(())
    })
    .await;
    ok(&app.put("/v1/kv/app/x", "v2").await);
    let woken = watch.await.expect("join");
    assert_eq!(
        (woken.status, woken.text()),
        (StatusCode::OK, "v2".to_owned())
    );
    let follower = (0..3).find(|i| *i != leader).expect("a follower");
    let target = cluster.server_rpc(follower);
    let attacker = cluster.rpc_client(Role::Client, "attacker");
    let ask = |request: RpcRequest| {
        let attacker = attacker.clone();
        async move {
            attacker
                .call_typed::<RpcRequest, RpcResponse>(target, &request, PROMPT)
                .await
                .expect("an RPC answer")
        }
    };
    let refused = |response: &RpcResponse, why: &str| match response {
        RpcResponse::Refused(text) => assert!(text.contains(why), "{text}"),
        other => panic!("answered: {other:?}"),
    };
    let minted = Token {
        policies: vec![Link {
            id: GLOBAL_MANAGEMENT_POLICY_ID.to_owned(),
            name: String::new(),
        }],
        ..Token::new(
            "7b0c7c1e-0000-4000-8000-00000000a771",
            "7b0c7c1e-0000-4000-8000-00000000b00b",
        )
    };
    let query = |query: ReadQuery, token: &str| RpcRequest::QueryAs {
        opts: QueryOptions::default(),
        query,
        token: token.to_owned(),
    };

    // No secret: not by listing tokens, not by resolving the management token's secret,
    // with the anonymous token or with none (the requests older agents send).
    refused(
        &ask(query(ReadQuery::AclTokenList {}, "")).await,
        "acl:read",
    );
    let old_list = RpcRequest::Query {
        opts: QueryOptions::default(),
        query: ReadQuery::AclTokenList {},
    };
    refused(&ask(old_list).await, "acl:read");
    let resolve = ReadQuery::AclResolve {
        secret_id: ROOT.to_owned(),
    };
    refused(&ask(query(resolve, "")).await, "acl:write");
    let forwarded = RpcRequest::Forwarded(Forwarded::Query(calls::Query {
        opts: QueryOptions::default(),
        query: ReadQuery::AclTokenList {},
    }));
    refused(&ask(forwarded).await, "server certificate");

    // No working token: not by the ACL write agents make, not by the leader's own.
    let mint = Op::Acl(AclOp::SetToken {
        token: minted.clone(),
        create: true,
    });
    refused(
        &ask(RpcRequest::WriteAs {
            op: mint,
            token: String::new(),
        })
        .await,
        "acl:write",
    );
    let init = Op::Acl(AclOp::Init {
        initial_management: Some(minted.clone()),
    });
    refused(
        &ask(RpcRequest::Write { op: init }).await,
        "server certificate",
    );
    let reply = cluster
        .server(follower)
        .with_token(&minted.secret_id)
        .get("/v1/acl/tokens")
        .await;
    assert_error(&reply, StatusCode::FORBIDDEN, "ACL not found");

    // No peer removed, no snapshot saved or restored.
    let operate = |request: OperatorRequest| RpcRequest::OperatorAs {
        request,
        token: String::new(),
    };
    refused(
        &ask(operate(OperatorRequest::RemovePeer(PeerRef::Id(1)))).await,
        "operator:write",
    );
    refused(
        &ask(operate(OperatorRequest::SnapshotSave)).await,
        "acl:write",
    );
    refused(
        &ask(operate(OperatorRequest::SnapshotRestore(vec![0x1f, 0x8b]))).await,
        "acl:write",
    );
    let peers = ok(&root.get("/v1/operator/raft/configuration").await);
    assert_eq!(
        peers["Servers"].as_array().map(Vec::len),
        Some(3),
        "{peers}"
    );

    // A blocking read of what the token can see none of is answered at once, empty, and the
    // servers hold no blocking query for it (here the anonymous token under default deny).
    let index = read.index();
    for blind in [
        ReadQuery::KvList {
            prefix: "app/".to_owned(),
        },
        ReadQuery::SessionList {},
    ] {
        let request = RpcRequest::QueryAs {
            opts: QueryOptions {
                min_index: index + 1_000_000,
                wait_ms: 600_000,
                ..QueryOptions::default()
            },
            query: blind.clone(),
            token: String::new(),
        };
        match ask(request).await {
            RpcResponse::Query(Ok((QueryResult::Entries(e), _))) => assert!(e.is_empty()),
            RpcResponse::Query(Ok((QueryResult::Sessions(s), _))) => assert!(s.is_empty()),
            other => panic!("{blind:?}: {other:?}"),
        }
    }

    // A CLI certificate may send nothing at all.
    let cli = cluster.rpc_client(Role::Cli, "laptop");
    let status = cli
        .call_typed::<RpcRequest, RpcResponse>(target, &RpcRequest::Status {}, PROMPT)
        .await
        .expect("an RPC answer");
    refused(&status, "CLI");

    // The management token's requests are answered: the token decides, not the certificate.
    let listed = ask(query(ReadQuery::AclTokenList {}, ROOT)).await;
    let RpcResponse::Query(Ok((QueryResult::AclTokens(tokens), _))) = listed else {
        panic!("{listed:?}");
    };
    assert!(tokens.iter().any(|t| t.secret_id == ROOT), "{tokens:?}");
    let saved = ask(RpcRequest::OperatorAs {
        request: OperatorRequest::SnapshotSave,
        token: ROOT.to_owned(),
    })
    .await;
    assert!(
        matches!(
            saved,
            RpcResponse::Operator(Ok(OperatorReply::Snapshot { .. }))
        ),
        "{saved:?}"
    );
}
