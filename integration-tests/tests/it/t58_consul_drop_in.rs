//! Where real Consul clients depend on Consul's exact behaviour: `session_ttl_min` is a server
//! setting (a client agent's own has no say), another datacenter answers Consul's 500 instead of
//! this one's data, `/v1/catalog/datacenters` lists this one, and the agent's root redirects to
//! `/ui/`, which answers 200 (so HTTP checks pointed at the agent pass). `/v1/catalog/services`
//! filters per instance, `/v1/agent/health/service/*` answers with Consul's codes, what Consul's
//! servers refuse is its 500 and text, `/v1/agent/self` and `/v1/agent/members` have Consul's
//! sections, fields and node meta, a blocking query answers by its deadline while the servers
//! have no leader, and user events reach every agent by gossip.

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::{Agent, SHORT_SESSION_TTL, eventually};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{assert_error, assert_gets_answer, config_file};

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_session_ttl_min_decides_through_a_client_agent() {
    // Phase 1: servers accept TTLs down to 1 s; the client agent keeps the default 10 s.
    let cluster = Cluster::servers(3)
        .server_env(SHORT_SESSION_TTL)
        .clients(1)
        .start()
        .await;
    let client = cluster.client(0).http();

    // Phase 2: a 2 s TTL through the client agent is the servers' call: accepted.
    let id = create_session(&client, r#"{"TTL":"2s"}"#).await;
    let info = client.get(&format!("/v1/session/info/{id}")).await.json();
    assert_eq!(info[0]["TTL"], json!("2s"));

    // Phase 3: below the servers' minimum: Consul's 500 and text, which clients match on.
    let reply = client.put("/v1/session/create", r#"{"TTL":"500ms"}"#).await;
    assert_error(
        &reply,
        StatusCode::INTERNAL_SERVER_ERROR,
        "Invalid Session TTL '500000000', must be between [1s=24h0m0s]",
    );
}

#[tokio::test]
async fn one_datacenter_and_the_agents_root() {
    let agent = Agent::dev().await;

    // Another datacenter is not silently answered with this one's data.
    assert_gets_answer(
        &agent,
        &[
            "/v1/kv/x?dc=dc2",
            "/v1/catalog/nodes?dc=other",
            "/v1/kv/x?dc=dc1&datacenter=dc2",
        ],
        StatusCode::INTERNAL_SERVER_ERROR,
        "No path to datacenter",
    )
    .await;
    // This datacenter, named or not, is served.
    for (path, status) in [
        ("/v1/kv/x?dc=dc1", StatusCode::NOT_FOUND),
        ("/v1/catalog/nodes?dc=", StatusCode::OK),
    ] {
        assert_eq!(agent.get(path).await.status, status, "{path}");
    }
    let reply = agent.get("/v1/catalog/datacenters").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!(["dc1"]));

    // The root redirects to the UI (not followed here), which answers 200.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = client.get(agent.url("/")).send().await.unwrap();
    assert_eq!(root.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(root.headers()["location"], "/ui/");
    let ui = agent.get("/ui/").await;
    assert_eq!(ui.status, StatusCode::OK);
    assert!(ui.text().contains("<title>Vigil</title>"));
}

#[tokio::test]
async fn catalog_services_filter_each_instance_as_consul_does() {
    let agent = Agent::dev().await;

    // Phase 1: `web` on a prod node, `api` on a staging node.
    for (node, env, service, tags) in [
        ("n1", "prod", "web", json!(["prod", "v1"])),
        ("n2", "staging", "api", json!(["staging", "production"])),
    ] {
        let body = json!({"Node": node, "Address": "10.0.0.1", "NodeMeta": {"env": env},
                          "Service": {"Service": service, "Tags": tags}});
        let reply = agent.put("/v1/catalog/register", body.to_string()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }

    // Phase 2: go-bexpr's `in` on a list is element equality, and `?node-meta=` picks nodes.
    for (query, want) in [
        (
            "filter=%22prod%22%20in%20ServiceTags",
            json!({"web": ["prod", "v1"]}),
        ),
        (
            "filter=ServiceName%20%3D%3D%20api",
            json!({"api": ["production", "staging"]}),
        ),
        (
            "node-meta=env:staging",
            json!({"api": ["production", "staging"]}),
        ),
        (
            "node-meta=env:prod&filter=%22staging%22%20in%20ServiceTags",
            json!({}),
        ),
    ] {
        let reply = agent.get(&format!("/v1/catalog/services?{query}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{query}: {}", reply.text());
        assert_eq!(reply.json(), want, "{query}");
    }

    // The same on one service's instances: "production" is not "prod".
    let reply = agent
        .get("/v1/catalog/service/api?filter=%22prod%22%20in%20ServiceTags")
        .await;
    assert_eq!((reply.status, reply.json()), (StatusCode::OK, json!([])));
}

#[tokio::test]
async fn agent_health_by_service_id_and_name_uses_consuls_codes() {
    let agent = Agent::dev().await;
    let register = |id: &'static str| {
        let body = json!({"Name": "web", "ID": id, "Check": {"TTL": "60s"}});
        agent.put("/v1/agent/service/register", body.to_string())
    };
    assert_eq!(register("web1").await.status, StatusCode::OK);

    // A TTL check starts critical: 503, and the text form is the status alone.
    let reply = agent.get("/v1/agent/health/service/id/web1").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["AggregatedStatus"], json!("critical"));
    let reply = agent
        .get("/v1/agent/health/service/id/web1?format=text")
        .await;
    assert_error(&reply, StatusCode::SERVICE_UNAVAILABLE, "critical");

    // Passing: 200 with the service and its checks.
    let pass = agent.put("/v1/agent/check/pass/service:web1", "").await;
    assert_eq!(pass.status, StatusCode::OK, "{}", pass.text());
    let reply = agent.get("/v1/agent/health/service/id/web1").await;
    assert_eq!(reply.status, StatusCode::OK);
    let info = reply.json();
    assert_eq!(info["AggregatedStatus"], json!("passing"));
    assert_eq!(info["Service"]["ID"], json!("web1"));
    assert_eq!(info["Checks"][0]["CheckID"], json!("service:web1"));
    assert_eq!(info["Checks"][0]["Status"], json!("passing"));

    // By name: every instance, the worst one's code (warning: 429).
    assert_eq!(register("web2").await.status, StatusCode::OK);
    let warn = agent.put("/v1/agent/check/warn/service:web2", "").await;
    assert_eq!(warn.status, StatusCode::OK, "{}", warn.text());
    let reply = agent.get("/v1/agent/health/service/name/web").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let statuses: Vec<Value> = reply
        .json()
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| json!([i["Service"]["ID"], i["AggregatedStatus"]]))
        .collect();
    assert_eq!(
        statuses,
        [json!(["web1", "passing"]), json!(["web2", "warning"])]
    );
    let reply = agent
        .get("/v1/agent/health/service/name/web?format=text")
        .await;
    assert_error(&reply, StatusCode::TOO_MANY_REQUESTS, "warning");

    // Node maintenance puts every instance in maintenance: 503.
    let maint = agent.put("/v1/agent/maintenance?enable=true", "").await;
    assert_eq!(maint.status, StatusCode::OK);
    let reply = agent
        .get("/v1/agent/health/service/id/web1?format=text")
        .await;
    assert_error(&reply, StatusCode::SERVICE_UNAVAILABLE, "maintenance");

    // Unknown: 404, Consul's bodies.
    let reply = agent.get("/v1/agent/health/service/id/nope").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(
        reply.json(),
        json!({"AggregatedStatus": "critical", "Service": null, "Checks": null})
    );
    let reply = agent
        .get("/v1/agent/health/service/id/nope?format=text")
        .await;
    assert_eq!(reply.text(), "ServiceId nope not found");
    let reply = agent.get("/v1/agent/health/service/name/nope").await;
    assert_eq!(
        (reply.status, reply.json()),
        (StatusCode::NOT_FOUND, json!([]))
    );
    let reply = agent
        .get("/v1/agent/health/service/name/nope?format=text")
        .await;
    assert_eq!(reply.text(), "ServiceName nope Not Found");
}

#[tokio::test]
async fn what_consuls_servers_refuse_is_a_500_with_consuls_text() {
    let agent = Agent::dev().await;
    for (method, path, body, text) in [
        (
            "PUT",
            "/v1/catalog/register",
            r#"{"Address":"10.0.0.1"}"#,
            "Must provide node",
        ),
        ("PUT", "/v1/catalog/deregister", "{}", "Must provide node"),
        (
            "POST",
            "/v1/query",
            r#"{"Name":"q"}"#,
            "Invalid prepared query: Must provide a Service name to query",
        ),
        (
            "PUT",
            "/v1/query/00000000-0000-0000-0000-000000000000",
            r#"{"Name":"q","Service":{"Service":"web"}}"#,
            "Cannot modify non-existent prepared query: '00000000-0000-0000-0000-000000000000'",
        ),
        (
            "PUT",
            "/v1/agent/force-leave/nope",
            "",
            "agent: No node found with name 'nope'",
        ),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let reply = agent
            .request(method, path, Some(body.as_bytes().to_vec()))
            .await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        assert_eq!(reply.text(), text, "{path}");
    }
    // Consul's force-leave of a live member does nothing and answers 200.
    let me = agent
        .put(&format!("/v1/agent/force-leave/{}", agent.node), "")
        .await;
    assert_eq!(me.status, StatusCode::OK, "{}", me.text());
}

#[tokio::test]
async fn agent_self_members_and_node_meta_in_consuls_shapes() {
    // Phase 1: node meta from the config file and from repeated flags (a flag wins).
    let (_dir, config) = config_file("node_meta = { zone = \"z1\", rack = \"from-file\" }\n");
    let agent = Agent::dev_with_env(
        &[
            "--config",
            &config,
            "--node-meta",
            "rack:r1",
            "--node-meta",
            "env:prod",
        ],
        &[SHORT_SESSION_TTL],
    )
    .await;
    let meta = json!({"consul-network-segment": "", "env": "prod", "rack": "r1", "zone": "z1"});

    // Phase 2: /v1/agent/self has every top-level section Consul returns.
    let me = agent.get("/v1/agent/self").await.json();
    for section in [
        "Config",
        "DebugConfig",
        "Coord",
        "Member",
        "Meta",
        "Stats",
        "xDS",
    ] {
        assert!(me.get(section).is_some(), "no {section} in {me}");
    }
    // Nanoseconds under Config (Patroni divides it by 1e9), a duration under DebugConfig.
    assert_eq!(me["Config"]["SessionTTLMin"], json!(1_000_000_000u64));
    assert_eq!(me["DebugConfig"]["SessionTTLMin"], json!("1s"));
    assert_eq!(
        me["DebugConfig"]["SerfAdvertiseAddrLAN"],
        json!(format!(
            "tcp://{}",
            me["DebugConfig"]["SerfBindAddrLAN"].as_str().unwrap()
        ))
    );
    assert_eq!(me["Config"]["NodeName"], json!(agent.node));
    assert_eq!(me["Meta"], meta);

    // Phase 3: members carry Consul's fields and types; this agent's entry is self's Member.
    let members = agent.get("/v1/agent/members").await.json();
    let mine = members
        .as_array()
        .expect("a list")
        .iter()
        .find(|m| m["Name"] == json!(agent.node))
        .expect("this agent is a member")
        .clone();
    assert_eq!(me["Member"], mine);
    assert_eq!(mine["Status"], json!(1));
    assert!(mine["Port"].is_u64() && mine["Addr"].is_string());
    for field in [
        "ProtocolMin",
        "ProtocolMax",
        "ProtocolCur",
        "DelegateMin",
        "DelegateMax",
        "DelegateCur",
    ] {
        assert!(mine[field].is_u64(), "{field} in {mine}");
    }
    let tags = mine["Tags"].as_object().expect("Tags");
    for tag in [
        "role", "dc", "segment", "vsn", "vsn_min", "vsn_max", "build", "port",
    ] {
        assert!(
            tags.get(tag).is_some_and(Value::is_string),
            "{tag} in {tags:?}"
        );
    }
    assert_eq!(tags["role"], json!("consul"));

    // Phase 4: the catalog has the node's meta, and ?node-meta= finds it.
    eventually(
        Duration::from_secs(30),
        "the node meta in the catalog",
        || async {
            let node = agent
                .get(&format!("/v1/catalog/node/{}", agent.node))
                .await
                .json();
            (node["Node"]["Meta"] == meta).then_some(())
        },
    )
    .await;
    let found = agent
        .get("/v1/catalog/nodes?node-meta=rack:r1&node-meta=zone:z1")
        .await
        .json();
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    let none = agent
        .get("/v1/catalog/nodes?node-meta=rack:from-file")
        .await
        .json();
    assert_eq!(none, json!([]));
}

/// Sends a blocking read of `watched` at `index` with `wait`, and returns the reply and how long
/// it took.
async fn block_on_watched(
    client: &integration_tests::Http,
    index: u64,
    wait: &str,
) -> (integration_tests::Reply, Duration) {
    let started = std::time::Instant::now();
    let reply = client
        .get(&format!("/v1/kv/watched?index={index}&wait={wait}"))
        .await;
    (reply, started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_query_answers_by_its_deadline_while_the_servers_have_no_leader() {
    // Consul's bound is wait + wait/16; the slack covers a loaded test machine's scheduling
    // (a query that waited for a leader would retry for 15 s more).
    let bound = |wait: Duration| wait + wait / 16 + Duration::from_secs(1);

    // Phase 1: three servers and a client agent; a key to watch through the client.
    let mut cluster = Cluster::servers(3).clients(1).start().await;
    let client = cluster.client(0).http();
    assert_eq!(
        client.put("/v1/kv/watched", "v1").await.status,
        StatusCode::OK
    );
    let index = client.get("/v1/kv/watched").await.index();

    // Phase 2: the leader is killed 1.5 s into a 2.9 s wait: the answer still comes by the
    // deadline, at the index the caller knows.
    let leader = cluster.leader().await;
    let watch = {
        let client = client.clone();
        tokio::spawn(async move { block_on_watched(&client, index, "2900ms").await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill9(leader).await;
    let (reply, took) = watch.await.expect("the watcher");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(
        took <= bound(Duration::from_millis(2900)),
        "answered after {took:?}"
    );
    assert!(reply.index() >= index);
    assert_eq!(reply.json()[0]["Key"], json!("watched"));

    // Phase 3: a second server killed, so no leader can be elected: the query answers by its
    // deadline from the last server's state, saying no leader is known.
    cluster.leader().await;
    let second = cluster.running_servers()[0];
    cluster.kill9(second).await;
    let (reply, took) = block_on_watched(&client, index, "2s").await;
    assert!(
        took <= bound(Duration::from_secs(2)),
        "answered after {took:?}"
    );
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.header("X-Consul-KnownLeader").as_deref(),
        Some("false")
    );
    assert!(reply.index() >= index);
    let value = reply.json()[0]["Value"].as_str().map(str::to_owned);
    assert_eq!(value.as_deref(), Some("djE="), "v1, base64");
}

#[tokio::test]
async fn tagged_addresses_as_consuls_agent_fills_them() {
    let agent = Agent::dev().await;
    let body = json!({"Name": "web", "Address": "10.1.1.1", "Port": 80});
    let reply = agent
        .put("/v1/agent/service/register", body.to_string())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let tagged = json!({"lan_ipv4": {"Address": "10.1.1.1", "Port": 80},
                        "wan_ipv4": {"Address": "10.1.1.1", "Port": 80}});

    // The service's: on the agent, in the catalog and in health results.
    let services = agent.get("/v1/agent/services").await.json();
    assert_eq!(services["web"]["TaggedAddresses"], tagged);
    let instances = agent.get("/v1/catalog/service/web").await.json();
    assert_eq!(instances[0]["ServiceTaggedAddresses"], tagged);
    let health = agent.get("/v1/health/service/web").await.json();
    assert_eq!(health[0]["Service"]["TaggedAddresses"], tagged);

    // The node's: lan and wan, with their IPv4 forms.
    let node = agent
        .get(&format!("/v1/catalog/node/{}", agent.node))
        .await
        .json();
    let address = node["Node"]["Address"].clone();
    let node_tagged = &node["Node"]["TaggedAddresses"];
    for name in ["lan", "lan_ipv4", "wan", "wan_ipv4"] {
        assert_eq!(node_tagged[name], address, "{name} in {node_tagged}");
    }
    assert_eq!(node["Services"]["web"]["TaggedAddresses"], tagged);
}

#[tokio::test(flavor = "multi_thread")]
async fn user_events_spread_to_every_agent_by_gossip() {
    // Phase 1: a server and a client agent; the client watches for `deploy` events.
    let cluster = Cluster::servers(1).clients(1).start().await;
    let (server, client) = (cluster.server(0).http(), cluster.client(0).http());
    let none = client.get("/v1/event/list?name=deploy").await;
    assert_eq!((none.status, none.json()), (StatusCode::OK, json!([])));
    let index = none.index();
    let watch = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .get(&format!(
                    "/v1/event/list?name=deploy&index={index}&wait=30s"
                ))
                .await
        })
    };

    // Phase 2: fired on the server, it wakes the client's watch.
    let fired = server.put("/v1/event/fire/deploy", "v2").await;
    assert_eq!(fired.status, StatusCode::OK, "{}", fired.text());
    let fired = fired.json();
    assert_eq!(fired["Name"], json!("deploy"));
    assert_eq!(fired["Payload"], json!("djI="));
    assert_eq!(
        (fired["Version"].clone(), fired["LTime"].clone()),
        (json!(1), json!(0))
    );
    let seen = tokio::time::timeout(Duration::from_secs(30), watch)
        .await
        .expect("the watch woke")
        .expect("the watcher");
    let events = seen.json();
    assert_eq!(events.as_array().map(Vec::len), Some(1), "{events}");
    assert_eq!(events[0]["ID"], fired["ID"]);
    assert_eq!(events[0]["Payload"], json!("djI="));
    assert!(events[0]["LTime"].as_u64() >= Some(1));
    assert_ne!(seen.index(), index);

    // Phase 3: a node filter: only the named node lists the event.
    let only_server = format!(
        "/v1/event/fire/restart?node=%5E{}%24",
        cluster.server(0).node
    );
    assert_eq!(server.put(&only_server, "").await.status, StatusCode::OK);
    eventually(
        Duration::from_secs(30),
        "the server to list its event",
        || async {
            let listed = server.get("/v1/event/list?name=restart").await.json();
            (listed.as_array().map(Vec::len) == Some(1)).then_some(())
        },
    )
    .await;
    let marker = server.put("/v1/event/fire/marker", "").await.json();
    eventually(
        Duration::from_secs(30),
        "the client to see the marker",
        || async {
            let listed = client.get("/v1/event/list?name=marker").await.json();
            (listed[0]["ID"] == marker["ID"]).then_some(())
        },
    )
    .await;
    let restart = client.get("/v1/event/list?name=restart").await.json();
    assert_eq!(restart, json!([]), "the client is not the named node");

    // Phase 4: Consul's refusals.
    for (path, body, status, text) in [
        (
            "/v1/event/fire/",
            "",
            StatusCode::BAD_REQUEST,
            "Missing name".to_owned(),
        ),
        (
            "/v1/event/fire/x?tag=a",
            "",
            StatusCode::INTERNAL_SERVER_ERROR,
            "Cannot provide tag filter without service filter".to_owned(),
        ),
        (
            "/v1/event/fire/x",
            &"p".repeat(600),
            StatusCode::INTERNAL_SERVER_ERROR,
            "user event exceeds configured limit of 512 bytes before encoding".to_owned(),
        ),
    ] {
        let reply = server.put(path, body.to_owned()).await;
        assert_eq!((reply.status, reply.text()), (status, text), "{path}");
    }
}
