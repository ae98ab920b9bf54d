//! What HashiCorp's Go `api` package needs beyond locks, sessions and KV, each test mirroring
//! one of that package's own tests (named in its doc) through the HTTP API: Go's `null`s, the
//! `consul` service, `SkipNodeUpdate`, node IDs, catalog ops in a transaction, the smaller
//! endpoints the client calls, tagged service addresses, the runtime gauges, an agent service's
//! `ContentHash` as Consul 1.8.7 computes it, deregistering an unknown service ID, and an agent
//! that stops on SIGTERM or SIGINT when the pipe its logs go to has been closed.

use std::process::Stdio;
use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Agent, Http, binary, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::common::{assert_error, b64, deny_dev_agent, unix_dev_agent};

/// Go writes a nil slice, map or pointer as `null`: each body here is what the Go client sends
/// for a call made without the optional parts (`api.TestAPI_CatalogRegistration` without
/// checks, `TestAPI_ACLPolicy_CreateReadDelete` without datacenters,
/// `TestAPI_OperatorAutopilotGetSetConfiguration`), and each is taken as if they were absent.
#[tokio::test]
async fn go_nulls_read_as_absent() {
    let acl_agent = deny_dev_agent("root").await;
    let agent = acl_agent.with_token("root");

    // A catalog registration with no checks and no tagged addresses, as `Catalog().Register`
    // sends it.
    let reg = json!({
        "ID": null, "Node": "go-null", "Address": "192.168.10.10", "TaggedAddresses": null,
        "NodeMeta": null, "Datacenter": "",
        "Service": {"ID": "redis1", "Service": "redis", "Tags": null, "Meta": null,
                    "Port": 8000, "Address": "", "Weights": null, "EnableTagOverride": false},
        "Check": null, "Checks": null, "SkipNodeUpdate": false,
    });
    let reply = agent.put("/v1/catalog/register", reg.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let instances = agent.get("/v1/catalog/service/redis").await.json();
    assert_eq!(instances[0]["ServiceID"], json!("redis1"));
    assert_eq!(instances[0]["ServiceTags"], json!([]));

    // A policy without datacenters.
    let policy = json!({"ID": "", "Name": "go-null", "Description": "", "Rules": "",
                        "Datacenters": null});
    let reply = agent.put("/v1/acl/policy", policy.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["Name"], json!("go-null"));

    // Autopilot settings with the durations left nil.
    let set = json!({"CleanupDeadServers": false, "LastContactThreshold": null,
                     "MaxTrailingLogs": 250, "ServerStabilizationTime": null});
    let reply = agent
        .put("/v1/operator/autopilot/configuration", set.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let after = agent
        .get("/v1/operator/autopilot/configuration")
        .await
        .json();
    assert_eq!(after["CleanupDeadServers"], json!(false));
    assert_eq!(after["MaxTrailingLogs"], json!(250));
    // A nil duration is zero, printed as Go prints it, so Go parses it back.
    assert_eq!(after["LastContactThreshold"], json!("0s"));

    // A transaction op with the other kinds left nil.
    let txn = json!([{"KV": {"Verb": "set", "Key": "go/null", "Value": null, "Flags": 0,
                             "Index": 0, "Session": ""},
                      "Node": null, "Service": null, "Check": null}]);
    let reply = agent.put("/v1/txn", txn.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());

    // A session's check lists are the exception Go has too: `null` empties the default.
    let id = agent.session(r#"{"Checks":null}"#).await;
    assert_eq!(agent.session_info(&id).await[0]["NodeChecks"], json!([]));
    drop(acl_agent);
}

/// `SkipNodeUpdate` registers a service on a node that is not in the catalog yet: the node is
/// created from the registration (Consul's `TestStateStore_EnsureRegistration`); on a node that
/// exists it leaves the node's fields alone.
#[tokio::test]
async fn skip_node_update_creates_a_missing_node() {
    let agent = Agent::dev().await;

    // Phase 1: the node is new, so it is created with what the registration says.
    let reg = |address: &str| {
        json!({"Node": "skip-node", "Address": address, "SkipNodeUpdate": true,
               "Service": {"Service": "web", "Port": 80}})
        .to_string()
    };
    let reply = agent.put("/v1/catalog/register", reg("10.1.1.1")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let node = agent.get("/v1/catalog/node/skip-node").await.json();
    assert_eq!(node["Node"]["Address"], json!("10.1.1.1"));
    assert_eq!(node["Services"]["web"]["Port"], json!(80));

    // Phase 2: now that it exists, SkipNodeUpdate keeps its address.
    let reply = agent.put("/v1/catalog/register", reg("10.2.2.2")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let node = agent.get("/v1/catalog/node/skip-node").await.json();
    assert_eq!(node["Node"]["Address"], json!("10.1.1.1"));

    // Still Consul's refusal without a node name.
    let reply = agent
        .put("/v1/catalog/register", r#"{"SkipNodeUpdate":true}"#)
        .await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Must provide node",
    );
}

/// Every server's node carries the `consul` service at its RPC port, which is how tools find the
/// servers (`api.TestAPI_CatalogServices`, `TestAPI_CatalogService`, `TestAPI_HealthService`
/// ask for it); the agent's anti-entropy leaves it alone.
#[tokio::test]
async fn servers_carry_the_consul_service() {
    let agent = Agent::dev().await;
    let rpc_port: u16 = agent.rpc_addr.rsplit(':').next().unwrap().parse().unwrap();

    // The leader registers it while reconciling the members, right after the node itself.
    eventually(Duration::from_secs(10), "the consul service", || {
        let agent = agent.http();
        async move {
            let services = agent.get("/v1/catalog/services").await.json();
            (services == json!({"consul": []})).then_some(())
        }
    })
    .await;
    let instances = json_ok(&agent, "/v1/catalog/service/consul").await;
    assert_eq!(instances.as_array().map(Vec::len), Some(1), "{instances}");
    assert_eq!(instances[0]["Node"], json!(agent.node));
    assert_eq!(instances[0]["ServiceID"], json!("consul"));
    assert_eq!(instances[0]["ServicePort"], json!(rpc_port));

    // Healthy, through its node's serfHealth.
    let healthy = json_ok(&agent, "/v1/health/service/consul?passing").await;
    assert_eq!(healthy.as_array().map(Vec::len), Some(1), "{healthy}");
    assert_eq!(healthy[0]["Checks"][0]["CheckID"], json!("serfHealth"));

    // A full anti-entropy pass (a local service registered and the catalog compared) keeps it.
    let reply = agent
        .put("/v1/agent/service/register", r#"{"Name":"web","Port":80}"#)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let reply = agent.put("/v1/agent/reload", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let services = json_ok(&agent, "/v1/catalog/services").await;
    assert_eq!(services, json!({"consul": [], "web": []}));
}

/// The agent's node has an ID (`api.TestAPI_AgentSelf` reads `Config.NodeID`,
/// `TestAPI_CatalogNodes` the node's `ID`): `--node-id` when given (any case, kept in
/// lowercase), else a new UUID for a dev agent.
#[tokio::test]
async fn the_node_has_an_id() {
    for (given, expected) in [
        (
            Some("6E0D8B6C-1F2A-4C3B-9D4E-5F6A7B8C9D0E"),
            Some("6e0d8b6c-1f2a-4c3b-9d4e-5f6a7b8c9d0e"),
        ),
        (None, None),
    ] {
        let agent = match given {
            Some(id) => Agent::dev_with(&["--node-id", id]).await,
            None => Agent::dev().await,
        };
        let me = json_ok(&agent, "/v1/agent/self").await;
        let id = me["Config"]["NodeID"]
            .as_str()
            .expect("a NodeID")
            .to_owned();
        assert!(uuid_like(&id), "{id:?}");
        if let Some(expected) = expected {
            assert_eq!(id, expected);
        }
        let path = format!("/v1/catalog/node/{}", agent.node);
        let catalog = eventually(
            Duration::from_secs(10),
            "the catalog has the node's ID",
            || {
                let agent = agent.http();
                let path = path.clone();
                let id = id.clone();
                async move {
                    let node = agent.get(&path).await.json();
                    (node["Node"]["ID"] == json!(id)).then_some(node)
                }
            },
        )
        .await;
        let nodes = json_ok(&agent, "/v1/catalog/nodes").await;
        assert_eq!(nodes[0]["ID"], catalog["Node"]["ID"]);
        // The node as stored (a transaction's `get`, `api.TestAPI_ClientTxn`): its ID, the
        // segment meta and the tagged addresses every Consul agent registers.
        let get = json!([{"Node": {"Verb": "get", "Node": {"Node": agent.node}}}]);
        let reply = agent.put("/v1/txn", get.to_string()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let stored = reply.json()["Results"][0]["Node"].clone();
        assert_eq!(stored["ID"], json!(id));
        assert_eq!(stored["Meta"], json!({"consul-network-segment": ""}));
        assert_eq!(
            stored["TaggedAddresses"],
            json!({"lan": "127.0.0.1", "lan_ipv4": "127.0.0.1", "wan": "127.0.0.1",
                   "wan_ipv4": "127.0.0.1"})
        );
    }
    // Not a UUID: refused at start, as Consul refuses it.
    let out = std::process::Command::new(binary())
        .args(["agent", "--dev", "--node-id", "node-1"])
        .output()
        .expect("run vigil");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid node ID"));
}

/// Lowercase hex in the 8-4-4-4-12 pattern.
fn uuid_like(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && id
            .chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// Catalog ops in a transaction (`api.TestAPI_ClientTxn`): a failing run reports every failed
/// op and applies nothing; a passing one returns KV, node, service and check results in op
/// order; `cas` and `delete-cas` compare ModifyIndex, as Consul's `TestStateStore_Txn_Node`,
/// `_Service` and `_Check` do.
#[tokio::test]
async fn transactions_carry_catalog_ops() {
    let agent = Agent::dev().await;
    let node_id = "1e2d3c4b-0000-4000-8000-0000000000aa";
    let reg = json!({"ID": node_id, "Node": "foo", "Address": "2.2.2.2",
        "Service": {"ID": "foo1", "Service": "foo"},
        "Checks": [{"CheckID": "bar", "Status": "critical",
                    "Definition": {"TCP": "1.1.1.1", "Interval": "5s", "Timeout": "10s"}}]});
    let reply = agent.put("/v1/catalog/register", reg.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let session = agent.session(r#"{"NodeChecks":[]}"#).await;

    // Phase 1: the lock has no session (so the key is not there to get) and `baz` does not
    // exist: every failure is reported, nothing applied.
    let ops = |session: &str| {
        json!([
            {"KV": {"Verb": "lock", "Key": "txn/k", "Value": b64("test"), "Session": session}},
            {"KV": {"Verb": "get", "Key": "txn/k"}},
            {"Node": {"Verb": "get", "Node": {"Node": "foo"}}},
            {"Service": {"Verb": "get", "Node": "foo", "Service": {"ID": "foo1"}}},
            {"Check": {"Verb": "get", "Check": {"Node": "foo", "CheckID": "bar"}}},
            {"Check": {"Verb": "get", "Check": {"Node": "foo", "CheckID": "baz"}}},
        ])
        .to_string()
    };
    let reply = agent.put("/v1/txn", ops("")).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.text());
    assert_eq!(
        reply.json(),
        json!({"Results": null, "Errors": [
            {"OpIndex": 0, "What": "missing session"},
            {"OpIndex": 1, "What": "key \"txn/k\" doesn't exist"},
            {"OpIndex": 5, "What": "check \"baz\" on node \"foo\" doesn't exist"},
        ]})
    );
    assert_eq!(
        agent.get("/v1/kv/txn/k").await.status,
        StatusCode::NOT_FOUND
    );

    // Phase 2: with `baz` registered and a session, every op answers, in order.
    let baz = json!({"Node": "foo", "Address": "2.2.2.2", "SkipNodeUpdate": true,
        "Check": {"CheckID": "baz", "Status": "passing"}});
    let reply = agent.put("/v1/catalog/register", baz.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let reply = agent.put("/v1/txn", ops(&session)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let results = reply.json()["Results"].clone();
    assert_eq!(results.as_array().map(Vec::len), Some(6), "{results}");
    assert_eq!(results[0]["KV"]["Session"], json!(session));
    assert_eq!(results[0]["KV"]["Value"], Value::Null);
    assert_eq!(results[1]["KV"]["Value"], json!(b64("test")));
    assert_eq!(results[2]["Node"]["ID"], json!(node_id));
    assert_eq!(results[2]["Node"]["Address"], json!("2.2.2.2"));
    // As stored: nothing filled in from the address, and Go's nil for none.
    assert_eq!(results[2]["Node"]["TaggedAddresses"], Value::Null);
    assert_eq!(results[2]["Node"]["Meta"], Value::Null);
    assert_eq!(results[4]["Check"]["ServiceTags"], Value::Null);
    assert_eq!(results[3]["Service"]["ID"], json!("foo1"));
    assert_eq!(results[4]["Check"]["Status"], json!("critical"));
    assert_eq!(results[4]["Check"]["Type"], json!("tcp"));
    assert_eq!(results[4]["Check"]["Definition"]["TCP"], json!("1.1.1.1"));
    assert_eq!(results[5]["Check"]["Status"], json!("passing"));

    // Phase 3: writes. A node `cas` at index 0 creates only; a stale `delete-cas` is refused;
    // a service `set` needs its node; one refused op rolls back the others.
    let create = json!([{"Node": {"Verb": "cas", "Node": {"Node": "bar", "Address": "3.3.3.3"}}},
                        {"Service": {"Verb": "set", "Node": "bar",
                                     "Service": {"ID": "db1", "Service": "db", "Port": 5432}}},
                        {"Check": {"Verb": "set", "Check": {"Node": "bar", "CheckID": "db-alive",
                                   "Name": "db alive", "ServiceID": "db1", "Status": "passing"}}}]);
    let reply = agent.put("/v1/txn", create.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let created = reply.json()["Results"].clone();
    let bar_index = created[0]["Node"]["ModifyIndex"]
        .as_u64()
        .expect("an index");
    assert_eq!(created[1]["Service"]["Port"], json!(5432));
    assert_eq!(created[2]["Check"]["ServiceName"], json!("db"));
    let health = json_ok(&agent, "/v1/health/service/db").await;
    assert_eq!(health[0]["Node"]["Address"], json!("3.3.3.3"));

    let again = agent.put("/v1/txn", create.to_string()).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(
        again.json()["Errors"],
        json!([{"OpIndex": 0, "What": "failed to set node \"bar\", index is stale"}])
    );
    let orphan = json!([
        {"KV": {"Verb": "set", "Key": "txn/rolled-back", "Value": b64("x")}},
        {"Service": {"Verb": "set", "Node": "nowhere", "Service": {"Service": "x"}}},
        {"Node": {"Verb": "delete-cas", "Node": {"Node": "bar", "ModifyIndex": bar_index + 1000}}},
    ]);
    let reply = agent.put("/v1/txn", orphan.to_string()).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(
        reply.json()["Errors"],
        json!([{"OpIndex": 1, "What": "Missing node registration"},
               {"OpIndex": 2, "What": "failed to delete node \"bar\", index is stale"}])
    );
    assert_eq!(
        agent.get("/v1/kv/txn/rolled-back").await.status,
        StatusCode::NOT_FOUND
    );

    // Phase 4: deletes give no result; the node goes with its service and check.
    let delete = json!([{"Node": {"Verb": "delete-cas",
                                  "Node": {"Node": "bar", "ModifyIndex": bar_index}}}]);
    let reply = agent.put("/v1/txn", delete.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json(), json!({"Results": [], "Errors": null}));
    assert_eq!(json_ok(&agent, "/v1/catalog/node/bar").await, Value::Null);
    assert_eq!(json_ok(&agent, "/v1/health/service/db").await, json!([]));

    // An unknown verb is Consul's 409 before anything runs.
    let bad = json!([{"Node": {"Verb": "frobnicate", "Node": {"Node": "foo"}}}]);
    let reply = agent.put("/v1/txn", bad.to_string()).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(
        reply.json()["Errors"],
        json!([{"OpIndex": 0, "What": "unknown Node verb \"frobnicate\""}])
    );
}

/// The endpoints the Go client calls that answered 404: `api.TestAPI_AgentHost`,
/// `TestAPI_AgentUpdateToken`, `TestAPI_CoordinateDatacenters`, `TestAPI_CoordinateNodes`,
/// `TestAPI_CoordinateNode`, `TestAPI_ACLReplication`, and py-consul's `test_catalog_filter`
/// (`/v1/catalog/connect/<service>`).
#[tokio::test]
async fn the_endpoints_go_calls_answer() {
    let agent = deny_dev_agent("root").await;
    let root = agent.with_token("root");

    // The host: every part read, and when.
    let host = json_ok(&root, "/v1/agent/host").await;
    assert!(
        host["CollectionTime"].as_u64().is_some_and(|t| t > 0),
        "{host}"
    );
    assert!(
        host["Memory"]["total"].as_u64().is_some_and(|t| t > 0),
        "{host}"
    );
    assert!(
        host["Host"]["hostname"].is_string() && host["CPU"].is_array(),
        "{host}"
    );
    assert_eq!(
        agent.get("/v1/agent/host").await.status,
        StatusCode::FORBIDDEN
    );

    // Every token kind, by Consul's names and the older ones; an unknown kind is a 404.
    for kind in [
        "default",
        "agent",
        "agent_master",
        "agent_recovery",
        "replication",
        "acl_token",
        "acl_agent_token",
        "acl_agent_master_token",
        "acl_replication_token",
        "config_file_service_registration",
    ] {
        let reply = root
            .put(&format!("/v1/agent/token/{kind}"), r#"{"Token":"root"}"#)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{kind}: {}", reply.text());
    }
    let reply = root.put("/v1/agent/token/nope", r#"{"Token":"x"}"#).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    // A request without a token uses the default token, as in Consul; clearing it restores
    // the anonymous token.
    assert_eq!(agent.get("/v1/agent/host").await.status, StatusCode::OK);
    let reply = root.put("/v1/agent/token/default", r#"{"Token":""}"#).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        agent.get("/v1/agent/host").await.status,
        StatusCode::FORBIDDEN
    );

    // Coordinates: the origin for every node; 404 for a node not in the catalog.
    let dcs = json_ok(&root, "/v1/coordinate/datacenters").await;
    assert_eq!(dcs[0]["Datacenter"], json!("dc1"));
    assert_eq!(
        dcs[0]["Coordinates"][0]["Node"],
        json!(format!("{}.dc1", agent.node))
    );
    let nodes = json_ok(&root, "/v1/coordinate/nodes").await;
    assert_eq!(nodes[0]["Node"], json!(agent.node));
    assert_eq!(nodes[0]["Coord"]["Vec"].as_array().map(Vec::len), Some(8));
    let node = json_ok(&root, &format!("/v1/coordinate/node/{}", agent.node)).await;
    assert_eq!(node[0]["Coord"], nodes[0]["Coord"]);
    assert_eq!(
        root.get("/v1/coordinate/node/nowhere").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        json_ok(&agent, "/v1/coordinate/nodes").await,
        json!([]),
        "filtered by ACL"
    );

    // ACL replication: nothing to replicate in one datacenter.
    let replication = json_ok(&root, "/v1/acl/replication").await;
    assert_eq!(replication["Enabled"], json!(false));
    assert_eq!(replication["Running"], json!(false));

    // Usage (py-consul's `test_usage`): this datacenter's counts, the `consul` service in.
    let usage = json_ok(&root, "/v1/operator/usage").await;
    assert_eq!(usage["Usage"]["dc1"]["Nodes"], json!(1));
    assert_eq!(usage["Usage"]["dc1"]["ServiceInstances"], json!(1));
    assert_eq!(usage["Usage"]["dc1"]["BillableServiceInstances"], json!(0));
    assert_eq!(usage["KnownLeader"], json!(true));

    // No Connect: an empty list, with an index.
    let reply = root.get("/v1/catalog/connect/web").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!([]));
    assert!(reply.index() > 0);
}

/// `api.TestAPI_AgentMetrics`: the Go runtime's gauges Consul reports, from this process (its
/// live tasks, the memory it holds, no garbage collections), in JSON and Prometheus text; they
/// need `agent:read` as the rest of the metrics do.
#[tokio::test]
async fn the_runtime_gauges_go_reads() {
    let agent = deny_dev_agent("root").await;
    let root = agent.with_token("root");
    assert_eq!(
        agent.get("/v1/agent/metrics").await.status,
        StatusCode::FORBIDDEN
    );

    let metrics = json_ok(&root, "/v1/agent/metrics").await;
    let gauge = |name: &str| {
        metrics["Gauges"]
            .as_array()
            .and_then(|gauges| gauges.iter().find(|g| g["Name"] == name))
            .and_then(|g| g["Value"].as_f64())
            .unwrap_or_else(|| panic!("no gauge {name}: {metrics}"))
    };
    let alloc = gauge("consul.runtime.alloc_bytes");
    let sys = gauge("consul.runtime.sys_bytes");
    assert!(alloc > 0.0 && sys >= alloc, "alloc {alloc}, sys {sys}");
    assert!(gauge("consul.runtime.num_goroutines") >= 1.0);
    assert!(gauge("vigil.runtime.threads") >= 1.0);
    assert_eq!(gauge("consul.runtime.total_gc_runs"), 0.0);
    assert_eq!(gauge("consul.runtime.total_gc_pause_ns"), 0.0);

    let text = root.get("/v1/agent/metrics?format=prometheus").await.text();
    assert!(
        text.contains("# TYPE consul_runtime_alloc_bytes gauge\nconsul_runtime_alloc_bytes "),
        "{text}"
    );
}

/// A service's own `TaggedAddresses` (py-consul's `test_agent_service_tagged_addresses`, the
/// Go client's `AgentServiceRegistration.TaggedAddresses`): stored as registered, beside the
/// `lan_ipv4`/`wan_ipv4` derived from its address, on the agent, in the catalog and in health
/// results; a `lan_ipv4` that is not an IPv4 address is refused and registers nothing; a
/// registration without them drops them from the catalog too.
#[tokio::test]
async fn services_keep_their_tagged_addresses() {
    let agent = Agent::dev().await;
    // py-consul sends the inner names in lowercase.
    let body = json!({"Name": "web", "Address": "10.1.1.1", "Port": 80,
                      "TaggedAddresses": {"lan": {"address": "192.168.0.1", "port": 8080},
                                          "wan": {"Address": "203.0.113.1", "Port": 80}}});
    let reply = agent
        .put("/v1/agent/service/register", body.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let tagged = json!({"lan": {"Address": "192.168.0.1", "Port": 8080},
                        "lan_ipv4": {"Address": "10.1.1.1", "Port": 80},
                        "wan": {"Address": "203.0.113.1", "Port": 80},
                        "wan_ipv4": {"Address": "10.1.1.1", "Port": 80}});
    assert_service_tagged(&agent, "web", &tagged).await;
    let one = json_ok(&agent, "/v1/agent/service/web").await;
    assert_eq!(one["TaggedAddresses"], tagged);

    // Refused: registers nothing.
    let bad = json!({"Name": "bad", "TaggedAddresses": {"lan_ipv4": {"Address": "::1"}}});
    assert_error(
        &agent
            .put("/v1/agent/service/register", bad.to_string())
            .await,
        StatusCode::BAD_REQUEST,
        "Service tagged address \"lan_ipv4\" must be a valid ipv4 address",
    );
    let services = json_ok(&agent, "/v1/agent/services").await;
    assert!(services.get("bad").is_none(), "{services}");

    // Through the catalog, as `Catalog().Register` sends them.
    let reg = json!({"Node": "ext", "Address": "10.2.2.2",
                     "Service": {"Service": "db", "Port": 5432,
                                 "TaggedAddresses": {"wan": {"Address": "198.51.100.7",
                                                             "Port": 15432}}}});
    let reply = agent.put("/v1/catalog/register", reg.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let db = json_ok(&agent, "/v1/catalog/service/db").await;
    assert_eq!(
        db[0]["ServiceTaggedAddresses"],
        json!({"wan": {"Address": "198.51.100.7", "Port": 15432}})
    );

    // Registered again without them: gone from the agent and the catalog.
    let plain = json!({"Name": "web", "Address": "10.1.1.1", "Port": 80});
    let reply = agent
        .put("/v1/agent/service/register", plain.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let derived = json!({"lan_ipv4": {"Address": "10.1.1.1", "Port": 80},
                         "wan_ipv4": {"Address": "10.1.1.1", "Port": 80}});
    assert_service_tagged(&agent, "web", &derived).await;
}

/// The same through a client agent of a server cluster (the registration and every read cross
/// the RPC transport), and after the server is killed and started again: the addresses come
/// back from its disk.
#[tokio::test]
async fn tagged_addresses_cross_the_wire_and_a_restart() {
    let mut cluster = Cluster::servers(1).clients(1).start().await;
    let body = json!({"Name": "web", "Port": 80,
                      "TaggedAddresses": {"lan": {"Address": "192.168.0.1", "Port": 8080}}});
    let reply = cluster
        .client(0)
        .put("/v1/agent/service/register", body.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let tagged = json!({"lan": {"Address": "192.168.0.1", "Port": 8080}});
    assert_service_tagged(cluster.client(0), "web", &tagged).await;
    cluster.kill9(0).await;
    cluster.restart(0).await;
    assert_service_tagged(cluster.client(0), "web", &tagged).await;
    assert_service_tagged(cluster.server(0), "web", &tagged).await;
}

/// Waits until service `id` shows `tagged` on the agent (when it runs there), in
/// `/v1/catalog/service`, `/v1/catalog/node` and `/v1/health/service`.
async fn assert_service_tagged(agent: &Http, id: &str, tagged: &Value) {
    eventually(
        Duration::from_secs(30),
        &format!("{id}'s tagged addresses everywhere: {tagged}"),
        || async {
            let local = json_if_ok(agent, "/v1/agent/services").await?;
            let instances = json_if_ok(agent, &format!("/v1/catalog/service/{id}")).await?;
            let health = json_if_ok(agent, &format!("/v1/health/service/{id}")).await?;
            let node = instances[0]["Node"].as_str()?.to_owned();
            let services = json_if_ok(agent, &format!("/v1/catalog/node/{node}")).await?;
            let ok = local
                .get(id)
                .is_none_or(|s| s["TaggedAddresses"] == *tagged)
                && instances[0]["ServiceTaggedAddresses"] == *tagged
                && health[0]["Service"]["TaggedAddresses"] == *tagged
                && services["Services"][id]["TaggedAddresses"] == *tagged;
            ok.then_some(())
        },
    )
    .await;
}

/// `api.TestAPI_AgentReload`: the agent's config file in Consul's JSON (a name ending in
/// `.json`), empty at start, then given a service and reloaded; a file that stops parsing
/// refuses the reload and keeps what was loaded.
#[tokio::test]
async fn a_json_config_file_reloads() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("reload.json");
    std::fs::write(&config, "").expect("write the config file");
    let agent = Agent::dev_with(&["--config", config.to_str().expect("UTF-8 path")]).await;
    let service = r#"{"service": {"name": "redis", "port": 1234, "Meta": {"some": "meta"}}}"#;
    std::fs::write(&config, service).expect("write the config file");
    let reply = agent.put("/v1/agent/reload", "").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let services = json_ok(&agent, "/v1/agent/services").await;
    assert_eq!(services["redis"]["Port"], json!(1234));
    assert_eq!(services["redis"]["Meta"], json!({"some": "meta"}));

    std::fs::write(&config, r#"{"service": "#).expect("write the config file");
    let reply = agent.put("/v1/agent/reload", "").await;
    assert_ne!(reply.status, StatusCode::OK, "{}", reply.text());
    let services = json_ok(&agent, "/v1/agent/services").await;
    assert_eq!(services["redis"]["Port"], json!(1234));
}

/// `api.TestAPI_Snapshot_Options`: a snapshot holds every secret, so taking one needs a
/// management token (`acl:write`); another datacenter is Consul's 500.
#[tokio::test]
async fn a_snapshot_needs_a_management_token() {
    let agent = deny_dev_agent("root").await;
    for token in [None, Some("anonymous")] {
        let client = token.map_or_else(|| agent.http(), |t| agent.with_token(t));
        let reply = client.get("/v1/snapshot").await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{token:?}");
        assert!(
            reply.text().starts_with("Permission denied"),
            "{}",
            reply.text()
        );
    }
    let root = agent.with_token("root");
    let reply = root.get("/v1/snapshot?dc=nope").await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "No path to datacenter",
    );
    let reply = root.get("/v1/snapshot?stale").await;
    assert_eq!(reply.status, StatusCode::OK);
}

/// Gossip keys of 16 and 24 bytes, as older `consul keygen` made them
/// (`api.TestAPI_OperatorKeyringInstallListPutRemove` installs and uses such keys): an agent
/// starts with one, and the keyring API installs, uses and removes another.
#[tokio::test]
async fn gossip_keys_of_16_and_24_bytes() {
    let key16 = b64([7u8; 16]);
    let key24 = b64([9u8; 24]);
    let agent = Agent::dev_with(&["--encrypt", &key16]).await;
    let keys = |ring: &Value| {
        let mut keys: Vec<String> = ring[0]["Keys"]
            .as_object()
            .expect("keys")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    };
    let ring = json_ok(&agent, "/v1/operator/keyring").await;
    assert_eq!(keys(&ring), std::slice::from_ref(&key16));
    for method in [reqwest::Method::POST, reqwest::Method::PUT] {
        let body = json!({"Key": key24}).to_string().into_bytes();
        let reply = agent
            .request(method, "/v1/operator/keyring", Some(body))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let ring = json_ok(&agent, "/v1/operator/keyring").await;
    let mut both = vec![key16.clone(), key24.clone()];
    both.sort();
    assert_eq!(keys(&ring), both);
    let body = json!({"Key": key16}).to_string().into_bytes();
    let reply = agent
        .request(reqwest::Method::DELETE, "/v1/operator/keyring", Some(body))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        keys(&json_ok(&agent, "/v1/operator/keyring").await),
        [key24]
    );
    // The agent still gossips with itself (its serfHealth stays passing).
    assert_eq!(
        agent.serf_health(&agent.node).await.as_deref(),
        Some("passing")
    );
}

/// `api.TestAPI_AgentMonitor` and `TestAPI_AgentMonitorJSON`: registering a service logs
/// Consul's `Synced service` at info, which a monitor at info sees, as hclog text or, with
/// `?logjson`, as one JSON object per line.
#[tokio::test]
async fn the_monitor_shows_a_registration_as_text_or_json() {
    let agent = Agent::dev_named("monitored", "info", &[], &[], None).await;
    for json in [false, true] {
        let path = if json {
            "/v1/agent/monitor?logjson"
        } else {
            "/v1/agent/monitor"
        };
        let mut stream = reqwest::get(agent.url(path)).await.expect("monitor");
        assert_eq!(stream.status(), StatusCode::OK);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let line = loop {
            assert!(tokio::time::Instant::now() < deadline, "no Synced line");
            let name = format!("redis-{json}");
            let body = json!({"Name": name}).to_string();
            agent.put("/v1/agent/service/register", body).await;
            let chunk = tokio::time::timeout(Duration::from_secs(1), stream.chunk()).await;
            if let Ok(Ok(Some(chunk))) = chunk {
                let text = String::from_utf8_lossy(&chunk).into_owned();
                if let Some(line) = text.lines().find(|l| l.contains("Synced service")) {
                    break line.to_owned();
                }
            }
        };
        if json {
            let value: Value = serde_json::from_str(&line).expect("a JSON line");
            assert_eq!(value["@level"], json!("info"), "{line}");
            assert_eq!(value["@message"], json!("Synced service"), "{line}");
            assert_eq!(value["service"], json!("redis-true"), "{line}");
        } else {
            assert!(line.contains(" [INFO] "), "{line}");
        }
    }
}

/// `api.TestAPI_UnixSocket`: with `--http-addr unix:///path` the API is served on a Unix
/// socket (a stale socket there is replaced), and answers as on TCP.
#[tokio::test]
async fn the_api_on_a_unix_socket() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let socket = dir.path().join("http.sock");
    // A socket left by an earlier run.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("a stale socket"));
    let (_agent, line) = unix_dev_agent(&socket, "unix-node").await;
    assert!(
        line.contains(&format!("http=unix://{}", socket.display())),
        "{line}"
    );

    // A request over the socket, as the Go client's Unix transport sends it.
    let ask = |request: String| {
        let socket = socket.clone();
        async move {
            let mut stream = tokio::net::UnixStream::connect(&socket)
                .await
                .expect("connect");
            stream.write_all(request.as_bytes()).await.expect("send");
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.expect("read");
            answer
        }
    };
    let answer =
        ask("GET /v1/agent/self HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""NodeName":"unix-node""#), "{answer}");
    let put = "PUT /v1/kv/over-unix HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    assert!(ask(put.into()).await.ends_with("true"));
    let raw = "GET /v1/kv/over-unix?raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert!(ask(raw.into()).await.ends_with("\r\n\r\nhi"));
}

/// An agent whose stdout and stderr go to pipes whose reader has gone (the parent died, or Go's
/// `sdk/testutil` stopped copying them) still stops on SIGTERM and on SIGINT, as
/// `testutil.TestServer.Stop` expects: it logs on, and every line it cannot write is dropped.
#[tokio::test]
async fn a_closed_log_pipe_never_blocks_shutdown() {
    for signal in ["-TERM", "-INT"] {
        // Phase 1: start with both streams piped, read the ready line, close both readers.
        let mut child = Command::new(binary())
            .args([
                "agent",
                "--dev",
                "--node",
                "closed-pipe",
                "--log-level",
                "debug",
            ])
            .args(["--http-addr", "127.0.0.1:0", "--rpc-addr", "127.0.0.1:0"])
            .args(["--serf-addr", "127.0.0.1:0", "--timing-profile", "local"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn vigil agent");
        let stdout = child.stdout.take().expect("piped stdout");
        let line = BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .expect("read the ready line")
            .expect("a ready line");
        drop(child.stderr.take());
        let http = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .expect("http= in the ready line")
            .to_owned();

        // Phase 2: requests, each of which logs a line at debug into the closed pipe.
        let client = reqwest::Client::new();
        for _ in 0..20 {
            let reply = client
                .get(format!("http://{http}/v1/status/leader"))
                .send()
                .await
                .expect("the agent answers");
            assert_eq!(reply.status(), StatusCode::OK);
        }

        // Phase 3: the signal stops it, gracefully.
        let pid = child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .unwrap_or_else(|_| panic!("the agent ignored {signal} with its log pipe closed"))
            .expect("wait for the agent");
        assert_eq!(status.code(), Some(0), "{signal}");
    }
}

/// `path` as JSON when it answers 200.
async fn json_if_ok(agent: &Http, path: &str) -> Option<Value> {
    let reply = agent.try_get(path).await?;
    (reply.status == StatusCode::OK).then(|| reply.json())
}

/// Reads `path` as JSON, asserting a 200.
async fn json_ok(agent: &Http, path: &str) -> Value {
    let reply = agent.get(path).await;
    assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.text());
    reply.json()
}

/// The new forms of a registration and a prepared query (tagged addresses, ignored checks) are
/// authorized as the old ones: a token that may only read is refused, and nothing is stored.
#[tokio::test]
async fn a_token_that_may_only_read_registers_no_tagged_addresses_and_no_query() {
    let agent = deny_dev_agent("root").await;
    let root = agent.with_token("root");
    eventually(
        Duration::from_secs(30),
        "the initial management token",
        || async { (root.get("/v1/acl/token/self").await.status == StatusCode::OK).then_some(()) },
    )
    .await;
    let rules = "node_prefix \"\" { policy = \"read\" }\nservice_prefix \"\" { policy = \"read\" }\nquery_prefix \"\" { policy = \"read\" }";
    let policy = root
        .put(
            "/v1/acl/policy",
            json!({"Name": "reader", "Rules": rules}).to_string(),
        )
        .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.text());
    let token = root
        .put(
            "/v1/acl/token",
            json!({"Policies": [{"Name": "reader"}]}).to_string(),
        )
        .await;
    assert_eq!(token.status, StatusCode::OK, "{}", token.text());
    let reader = agent.with_token(token.json()["SecretID"].as_str().unwrap());

    let registration = json!({"Node": "tagged", "Address": "10.2.2.2",
        "Service": {"Service": "web", "Port": 80,
                    "TaggedAddresses": {"lan": {"Address": "192.168.0.2", "Port": 80}}}});
    let reply = reader
        .put("/v1/catalog/register", registration.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    let nodes = json_ok(&root, "/v1/catalog/nodes").await;
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["Node"] != "tagged"),
        "{nodes}"
    );

    let query = json!({"Name": "q", "Service": {"Service": "web", "IgnoreCheckIDs": ["c1"]}});
    let reply = reader.post_json("/v1/query", query).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    assert_eq!(json_ok(&root, "/v1/query").await, json!([]));
}

/// `api.TestAPI_AgentService`: a service's `ContentHash` is the one Consul 1.8.7 computes for
/// the same service (the Go test pins `6b13684bfe179e67`), in the body and in
/// `X-Consul-ContentHash`, and a read blocking on it waits its whole wait. The hash follows
/// the content only: registering the same service again keeps it; one below 2^60 is printed
/// without a leading zero, as Go's `%x`; the tagged addresses derived from an IP address count.
#[tokio::test]
async fn the_agent_service_content_hash_is_consul_187s() {
    let agent = Agent::dev().await;
    let foo = json!({"Name": "foo", "Tags": ["bar", "baz"], "Port": 8000,
                     "Checks": [{"TTL": "15s"}, {"TTL": "30s"}]});
    let hashes = [
        (foo.clone(), "foo", "6b13684bfe179e67"),
        (foo.clone(), "foo", "6b13684bfe179e67"),
        (
            json!({"ID": "s11", "Name": "foo", "Tags": ["bar", "baz"], "Port": 8000}),
            "s11",
            "febf1d0744cf469",
        ),
        (
            json!({"ID": "web1", "Name": "web", "Tags": ["v1"], "Port": 80,
                   "Address": "10.0.0.5", "Meta": {"env": "prod", "team": "a"}}),
            "web1",
            "8c93e17b96669183",
        ),
    ];
    for (registration, id, hash) in hashes {
        let reply = agent
            .put("/v1/agent/service/register", registration.to_string())
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let one = agent.get(&format!("/v1/agent/service/{id}")).await;
        assert_eq!(one.status, StatusCode::OK, "{}", one.text());
        assert_eq!(one.json()["ContentHash"], json!(hash), "{registration}");
        assert_eq!(one.header("X-Consul-ContentHash").as_deref(), Some(hash));
    }

    // Blocking on the current hash: answered once the wait is over, with the same hash.
    let wait = Duration::from_millis(100);
    let started = std::time::Instant::now();
    let same = agent
        .get("/v1/agent/service/foo?hash=6b13684bfe179e67&wait=100ms")
        .await;
    assert!(
        started.elapsed() >= wait,
        "answered before the wait ran out"
    );
    assert_eq!(same.json()["ContentHash"], json!("6b13684bfe179e67"));
}

/// `api.TestAPI_AgentServiceAddress` ends by deregistering `foo`, which it never registered
/// (it registered `foo1` and `foo2`): Consul 1.8.7 answered 200 and did nothing; Consul since
/// answers 404, as Vigil does (docs/consul-compatibility.md, "Registering checks and
/// services"), and upstream's later version of the test deregisters `foo1` and `foo2`. A wrong
/// ID changes nothing: the session bound to `foo1`'s check keeps its lock until `foo1` itself
/// is deregistered; deregistering it again is 404 too.
#[tokio::test]
async fn deregistering_an_unknown_service_id_is_404_and_changes_nothing() {
    let agent = Agent::dev().await;
    let foo1 = json!({"Name": "foo1", "Port": 8000, "Address": "192.168.0.42",
                      "Check": {"TTL": "60s", "Status": "passing"}});
    let foo2 = json!({"Name": "foo2", "Port": 8000,
                      "TaggedAddresses": {"lan": {"Address": "192.168.0.43", "Port": 8000},
                                          "wan": {"Address": "198.18.0.1", "Port": 80}}});
    for registration in [foo1, foo2] {
        let reply = agent
            .put("/v1/agent/service/register", registration.to_string())
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let session = agent
        .session(r#"{"Checks": ["serfHealth", "service:foo1"]}"#)
        .await;
    agent.acquire_ok("foo1/leader", &session).await;

    // The wrong ID: 404 with Consul's text, both services and the lock kept.
    let not_found = |id: &str| {
        format!(
            "Unknown service ID \"{id}\". Ensure that the service ID is passed, not the service name."
        )
    };
    assert_error(
        &agent.put("/v1/agent/service/deregister/foo", "").await,
        StatusCode::NOT_FOUND,
        &not_found("foo"),
    );
    let services = json_ok(&agent, "/v1/agent/services").await;
    assert!(
        services.get("foo1").is_some() && services.get("foo2").is_some(),
        "{services}"
    );
    assert_eq!(agent.holder("foo1/leader").await, Some(session.clone()));

    // The right IDs: 200, and the session bound to foo1's check is invalidated with it.
    for id in ["foo1", "foo2"] {
        let reply = agent
            .put(&format!("/v1/agent/service/deregister/{id}"), "")
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{id}: {}", reply.text());
    }
    assert_eq!(json_ok(&agent, "/v1/agent/services").await, json!({}));
    eventually(Duration::from_secs(10), "the lock released", || async {
        agent.holder("foo1/leader").await.is_none().then_some(())
    })
    .await;
    assert!(!agent.session_exists(&session).await);

    // Gone now: deregistering it again is the same 404.
    assert_error(
        &agent.put("/v1/agent/service/deregister/foo1", "").await,
        StatusCode::NOT_FOUND,
        &not_found("foo1"),
    );
}
