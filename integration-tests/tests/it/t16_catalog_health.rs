//! The catalog, health and prepared-query APIs against a real dev agent: registration through
//! `/v1/catalog/register`, every read in Consul's shape with `?passing`, `?tag`, `?node-meta`
//! and `?filter=`, per-service blocking, check and service removal invalidating sessions, and
//! prepared queries that go with their session or ignore the checks they name. Mirrors
//! docs/consul-compatibility.md#catalog-health-and-prepared-queries.

use std::time::{Duration, Instant};

use integration_tests::cluster::Cluster;
use integration_tests::{Agent, Http, Reply, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::assert_error;

fn ok(reply: &Reply) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()
}

/// Registers `web` instance `id` on `node` with one HTTP-style check in `status`.
async fn register_web(agent: &Http, node: &str, id: &str, tags: &[&str], status: &str) {
    let body = json!({
        "Node": node,
        "Address": "10.1.2.3",
        "NodeMeta": {"rack": node},
        "Service": {"ID": id, "Service": "web", "Tags": tags, "Port": 8080,
                    "Meta": {"version": "2"}},
        "Check": {"CheckID": format!("{id}-http"), "Name": "http", "Status": status,
                  "ServiceID": id, "Output": "HTTP GET: 200 OK"},
    });
    let reply = agent.put("/v1/catalog/register", body.to_string()).await;
    assert_eq!(ok(&reply), json!(true));
}

fn ids(list: &Value, field: &str) -> Vec<String> {
    let mut out: Vec<String> = list
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| {
            v.pointer(field)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn catalog_and_health_reads_in_consul_shapes() {
    let agent = Agent::dev().await;

    // Three instances of web on three external nodes: passing, warning and critical.
    register_web(&agent, "ext1", "web1", &["v1", "primary"], "passing").await;
    register_web(&agent, "ext2", "web2", &["v1"], "warning").await;
    register_web(&agent, "ext3", "web3", &["v2"], "critical").await;

    // The services listing merges tags by name.
    let services = ok(&agent.get("/v1/catalog/services").await);
    assert_eq!(services["web"], json!(["primary", "v1", "v2"]));

    // catalog/service/<s>: node fields plus the Service* fields.
    let list = ok(&agent.get("/v1/catalog/service/web").await);
    assert_eq!(ids(&list, "/ServiceID"), ["web1", "web2", "web3"]);
    let one = &list[0];
    for field in [
        "ID",
        "Node",
        "Address",
        "Datacenter",
        "TaggedAddresses",
        "NodeMeta",
        "ServiceKind",
        "ServiceID",
        "ServiceName",
        "ServiceTags",
        "ServiceAddress",
        "ServiceWeights",
        "ServiceMeta",
        "ServicePort",
        "ServiceEnableTagOverride",
        "ServiceProxy",
        "ServiceConnect",
        "CreateIndex",
        "ModifyIndex",
    ] {
        assert!(one.get(field).is_some(), "{field} missing from {one}");
    }
    assert_eq!(one["ServicePort"], json!(8080));
    assert_eq!(one["ServiceWeights"], json!({"Passing": 1, "Warning": 1}));
    let tagged = ok(&agent.get("/v1/catalog/service/web?tag=v1").await);
    assert_eq!(ids(&tagged, "/ServiceID"), ["web1", "web2"]);
    let meta = ok(&agent
        .get("/v1/catalog/service/web?node-meta=rack:ext2")
        .await);
    assert_eq!(ids(&meta, "/ServiceID"), ["web2"]);

    // catalog/node/<n>: the node and its services by ID; an unknown node is null.
    let node = ok(&agent.get("/v1/catalog/node/ext1").await);
    assert_eq!(node["Node"]["Node"], json!("ext1"));
    assert_eq!(node["Node"]["Meta"], json!({"rack": "ext1"}));
    assert_eq!(node["Services"]["web1"]["Service"], json!("web"));
    assert_eq!(node["Services"]["web1"]["Tags"], json!(["v1", "primary"]));
    assert_eq!(ok(&agent.get("/v1/catalog/node/nobody").await), Value::Null);

    // health/service/<s>: node, service and checks; ?passing keeps only all-passing ones.
    let health = ok(&agent.get("/v1/health/service/web").await);
    assert_eq!(ids(&health, "/Service/ID"), ["web1", "web2", "web3"]);
    let check = &health[0]["Checks"][0];
    assert_eq!(check["ServiceName"], json!("web"));
    assert_eq!(check["ServiceTags"], json!(["v1", "primary"]));
    let passing = ok(&agent.get("/v1/health/service/web?passing").await);
    assert_eq!(ids(&passing, "/Service/ID"), ["web1"]);

    // ?filter= on the same list, with Consul's selector names.
    let filtered = ok(&agent
        .get("/v1/health/service/web?filter=Checks.Status%20%3D%3D%20critical%20or%20%22primary%22%20in%20Service.Tags")
        .await);
    assert_eq!(ids(&filtered, "/Service/ID"), ["web1", "web3"]);
    let filtered = ok(&agent
        .get("/v1/catalog/service/web?filter=ServiceMeta.version%20%3D%3D%20%222%22%20and%20Node%20!%3D%20ext3")
        .await);
    assert_eq!(ids(&filtered, "/ServiceID"), ["web1", "web2"]);
    let bad = agent
        .get("/v1/health/service/web?filter=Node%20%3D%3D")
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text());
    assert!(
        bad.text()
            .starts_with("Failed to create boolean expression evaluator"),
        "{}",
        bad.text()
    );

    // health/checks/<s>, health/state/<state> and health/node/<n>.
    let checks = ok(&agent.get("/v1/health/checks/web").await);
    assert_eq!(
        ids(&checks, "/CheckID"),
        ["web1-http", "web2-http", "web3-http"]
    );
    let critical = ok(&agent.get("/v1/health/state/critical").await);
    assert_eq!(ids(&critical, "/CheckID"), ["web3-http"]);
    let any = ok(&agent.get("/v1/health/state/any").await);
    assert!(ids(&any, "/CheckID").contains(&"serfHealth".to_owned()));
    assert_error(
        &agent.get("/v1/health/state/").await,
        StatusCode::BAD_REQUEST,
        "Missing check state",
    );
    assert_error(
        &agent.get("/v1/health/state/sideways").await,
        StatusCode::BAD_REQUEST,
        "Invalid check state: 'sideways'",
    );
    let node_checks = ok(&agent.get("/v1/health/node/ext2").await);
    assert_eq!(node_checks[0]["Status"], json!("warning"));
    assert_eq!(node_checks[0]["Output"], json!("HTTP GET: 200 OK"));
}

#[tokio::test]
async fn catalog_register_refuses_bad_input() {
    let agent = Agent::dev().await;
    assert_error(
        &agent
            .put("/v1/catalog/register", r#"{"Address":"1.2.3.4"}"#)
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Must provide node",
    );
    assert_error(
        &agent.put("/v1/catalog/register", r#"{"Node":"x"}"#).await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Must provide address if SkipNodeUpdate is not set",
    );
    assert_error(
        &agent
            .put(
                "/v1/catalog/register",
                r#"{"Node":"x","Address":"1.2.3.4","Service":{"ID":"s1"}}"#,
            )
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Must provide service name (Service.Service) when service ID is provided",
    );
    assert_error(
        &agent
            .put(
                "/v1/catalog/register",
                r#"{"Node":"x","Address":"1.2.3.4","Check":{"CheckID":"c","ServiceID":"nope"}}"#,
            )
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Unknown service ID 'nope' for check ID 'c'",
    );
    // Nothing of the refused registrations landed.
    assert_eq!(ok(&agent.get("/v1/catalog/node/x").await), Value::Null);
}

#[tokio::test]
async fn a_service_watcher_is_not_woken_by_other_writes() {
    let agent = Agent::dev().await;
    register_web(&agent, "ext1", "web1", &[], "passing").await;
    let index = agent.get("/v1/health/service/web").await.index();

    // A KV write and another service's registration while the watcher blocks: when its wait
    // runs out it answers with web's index unchanged.
    let http = agent.http();
    let watcher = tokio::spawn(async move {
        let started = Instant::now();
        let reply = http
            .get(&format!("/v1/health/service/web?index={index}&wait=2s"))
            .await;
        (reply.index(), started.elapsed())
    });
    agent.put("/v1/kv/unrelated", "x").await;
    let db = json!({"Node": "ext2", "Address": "10.0.0.2", "Service": {"Service": "db"}});
    ok(&agent.put("/v1/catalog/register", db.to_string()).await);
    let (seen, waited) = watcher.await.unwrap();
    assert_eq!(seen, index, "web's index moved on unrelated writes");
    assert!(
        waited >= Duration::from_millis(1500),
        "returned after {waited:?}"
    );

    // A change to web's health wakes it.
    let http = agent.http();
    let watcher = tokio::spawn(async move {
        http.get(&format!("/v1/health/service/web?index={index}&wait=30s"))
            .await
            .json()
    });
    register_web(&agent, "ext1", "web1", &[], "critical").await;
    let health = watcher.await.unwrap();
    assert_eq!(health[0]["Checks"][0]["Status"], json!("critical"));
}

#[tokio::test]
async fn removing_a_check_or_service_invalidates_sessions_bound_to_it() {
    // An external node: the agent's own node would have its anti-entropy delete checks it
    // does not know about (docs/consul-compatibility.md#anti-entropy), racing this test.
    let agent = Agent::dev().await;
    let node = "ext-db";
    let reg = json!({
        "Node": node, "Address": "10.0.0.9",
        "Service": {"ID": "api", "Service": "api"},
        "Checks": [
            {"CheckID": "node-disk", "Name": "disk", "Status": "passing"},
            {"CheckID": "api-http", "Name": "http", "Status": "passing", "ServiceID": "api"},
        ],
    });
    ok(&agent.put("/v1/catalog/register", reg.to_string()).await);

    let on_disk = agent
        .session(r#"{"Node":"ext-db","NodeChecks":["node-disk"],"LockDelay":"0s"}"#)
        .await;
    let on_api = agent
        .session(r#"{"Node":"ext-db","NodeChecks":[],"ServiceChecks":[{"ID":"api-http"}],"LockDelay":"0s"}"#)
        .await;
    for (key, session) in [("a", &on_disk), ("b", &on_api)] {
        let reply = agent
            .put(&format!("/v1/kv/{key}?acquire={session}"), "x")
            .await;
        assert_eq!(ok(&reply), json!(true));
    }

    // Deregistering the check destroys the session on it and releases its lock.
    let dereg = json!({"Node": node, "CheckID": "node-disk"});
    ok(&agent.put("/v1/catalog/deregister", dereg.to_string()).await);
    assert_eq!(
        ok(&agent.get(&format!("/v1/session/info/{on_disk}")).await),
        json!([])
    );
    assert!(ok(&agent.get("/v1/kv/a").await)[0].get("Session").is_none());
    assert_eq!(
        ok(&agent.get("/v1/kv/b").await)[0]["Session"],
        json!(on_api)
    );

    // Deregistering the service takes its checks and the session bound to them.
    let dereg = json!({"Node": node, "ServiceID": "api"});
    ok(&agent.put("/v1/catalog/deregister", dereg.to_string()).await);
    assert_eq!(
        ok(&agent.get(&format!("/v1/session/info/{on_api}")).await),
        json!([])
    );
    assert_eq!(ok(&agent.get("/v1/health/checks/api").await), json!([]));
}

#[tokio::test]
async fn prepared_queries_run_and_go_with_their_session() {
    let agent = Agent::dev().await;
    register_web(&agent, "ext1", "web1", &["prod"], "passing").await;
    register_web(&agent, "ext2", "web2", &["prod"], "warning").await;
    register_web(&agent, "ext3", "web3", &["dev"], "critical").await;

    // Input errors.
    assert_error(
        &agent.post_json("/v1/query", json!({"Name": "q"})).await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Invalid prepared query: Must provide a Service name to query",
    );
    assert_error(
        &agent
            .post_json("/v1/query", json!({"Service": {"Service": "web"}}))
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Invalid prepared query: Must be bound to a session",
    );
    assert_error(
        &agent
            .post_json(
                "/v1/query",
                json!({"Session": "00000000-0000-0000-0000-000000000000",
                       "Service": {"Service": "web"}}),
            )
            .await,
        StatusCode::INTERNAL_SERVER_ERROR,
        "raft apply failed: invalid session \"00000000-0000-0000-0000-000000000000\"",
    );

    // A named query: execute by name skips critical instances, OnlyPassing skips warning.
    let named = ok(&agent
        .post_json(
            "/v1/query",
            json!({"Name": "web-prod", "Service": {"Service": "web", "Tags": ["prod"]}}),
        )
        .await)["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = ok(&agent.get("/v1/query/web-prod/execute").await);
    assert_eq!(run["Service"], json!("web"));
    assert_eq!(run["Datacenter"], json!("dc1"));
    assert_eq!(ids(&run["Nodes"], "/Service/ID"), ["web1", "web2"]);
    let update = json!({"Name": "web-prod",
                        "Service": {"Service": "web", "Tags": ["prod"], "OnlyPassing": true}});
    assert_eq!(
        agent
            .put(&format!("/v1/query/{named}"), update.to_string())
            .await
            .status,
        StatusCode::OK
    );
    let run = ok(&agent.get(&format!("/v1/query/{named}/execute")).await);
    assert_eq!(ids(&run["Nodes"], "/Service/ID"), ["web1"]);
    let explained = ok(&agent.get("/v1/query/web-prod/explain").await);
    assert_eq!(explained["Query"]["Service"]["OnlyPassing"], json!(true));

    // A query bound to a session is listed, then deleted when the session is destroyed.
    let session = agent.session(r#"{"LockDelay":"0s"}"#).await;
    let bound = ok(&agent
        .post_json(
            "/v1/query",
            json!({"Session": session, "Service": {"Service": "web"}}),
        )
        .await)["ID"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = ok(&agent.get("/v1/query").await);
    assert_eq!(ids(&listed, "/ID"), {
        let mut both = vec![named.clone(), bound.clone()];
        both.sort();
        both
    });
    let got = ok(&agent.get(&format!("/v1/query/{bound}")).await);
    assert_eq!(got[0]["Session"], json!(session));
    ok(&agent
        .put(&format!("/v1/session/destroy/{session}"), "")
        .await);
    let gone = agent.get(&format!("/v1/query/{bound}")).await;
    assert_error(&gone, StatusCode::NOT_FOUND, "Query not found");
    assert_eq!(
        ids(&ok(&agent.get("/v1/query").await), "/ID"),
        std::slice::from_ref(&named)
    );

    // Delete; then neither the query nor its execution is found.
    assert_eq!(
        agent.delete(&format!("/v1/query/{named}")).await.status,
        StatusCode::OK
    );
    let missing = agent.get("/v1/query/web-prod/execute").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

/// A query's `IgnoreCheckIDs` (Consul's prepared-query execution test of it, in our words):
/// the checks it names do not count against an instance's health (they are still listed with
/// it), the list is stored and shown as given (`null` when there is none), and an update
/// without it counts them again.
#[tokio::test]
async fn a_query_ignores_the_checks_it_names() {
    let agent = Agent::dev().await;
    let id = queries_ignoring_checks(&agent).await;
    // Through the Go client's `null` for no list.
    let body = json!({"Name": "web-all", "Service": {"Service": "web", "IgnoreCheckIDs": null}});
    let reply = agent
        .put(&format!("/v1/query/{id}"), body.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let got = ok(&agent.get(&format!("/v1/query/{id}")).await);
    assert_eq!(got[0]["Service"]["IgnoreCheckIDs"], Value::Null);
    let run = ok(&agent.get("/v1/query/web-all/execute").await);
    assert_eq!(ids(&run["Nodes"], "/Service/ID"), ["web1"]);
}

/// The same through a client agent of a server cluster (the query and its run cross the RPC
/// transport), and after the server is killed and started again: the list comes back from its
/// disk.
#[tokio::test]
async fn a_querys_ignored_checks_cross_the_wire_and_a_restart() {
    let mut cluster = Cluster::servers(1).clients(1).start().await;
    let id = queries_ignoring_checks(cluster.client(0)).await;
    cluster.kill9(0).await;
    cluster.restart(0).await;
    let client = cluster.client(0);
    eventually(
        Duration::from_secs(30),
        "the query, whole, after the restart",
        || async {
            let reply = client.try_get(&format!("/v1/query/{id}")).await?;
            (reply.status == StatusCode::OK
                && reply.json()[0]["Service"]["IgnoreCheckIDs"] == json!(["web2-http"]))
            .then_some(())
        },
    )
    .await;
    let run = ok(&client.get("/v1/query/web-all/execute").await);
    assert_eq!(ids(&run["Nodes"], "/Service/ID"), ["web1", "web2"]);
}

/// Registers `web1` (passing) and `web2` (critical), and a query `web-all` ignoring web2's
/// check: both are selected, web2 with its critical check listed. Returns the query's ID.
async fn queries_ignoring_checks(agent: &Http) -> String {
    register_web(agent, "ext1", "web1", &[], "passing").await;
    register_web(agent, "ext2", "web2", &[], "critical").await;
    let body = json!({"Name": "web-all",
                      "Service": {"Service": "web", "IgnoreCheckIDs": ["web2-http"]}});
    let id = ok(&agent.post_json("/v1/query", body).await)["ID"]
        .as_str()
        .expect("an ID")
        .to_owned();
    let got = ok(&agent.get(&format!("/v1/query/{id}")).await);
    assert_eq!(got[0]["Service"]["IgnoreCheckIDs"], json!(["web2-http"]));
    let listed = ok(&agent.get("/v1/query").await);
    assert_eq!(listed[0]["Service"]["IgnoreCheckIDs"], json!(["web2-http"]));
    let explained = ok(&agent.get("/v1/query/web-all/explain").await);
    assert_eq!(
        explained["Query"]["Service"]["IgnoreCheckIDs"],
        json!(["web2-http"])
    );

    let run = ok(&agent.get("/v1/query/web-all/execute").await);
    assert_eq!(ids(&run["Nodes"], "/Service/ID"), ["web1", "web2"]);
    let web2 = run["Nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["Service"]["ID"] == "web2")
        .expect("web2");
    assert!(
        web2["Checks"]
            .as_array()
            .expect("checks")
            .iter()
            .any(|c| c["CheckID"] == "web2-http" && c["Status"] == "critical"),
        "{web2}"
    );
    id
}
