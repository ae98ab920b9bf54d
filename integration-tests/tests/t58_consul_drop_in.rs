//! Where real Consul clients depend on Consul's exact behaviour: `session_ttl_min` is a server
//! setting (a client agent's own has no say), another datacenter answers Consul's 500 instead of
//! this one's data, `/v1/catalog/datacenters` lists this one, and the agent's root redirects to
//! `/ui/`, which answers 200 (so HTTP checks pointed at the agent pass).

use integration_tests::Agent;
use integration_tests::cluster::{Cluster, create_session};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_session_ttl_min_decides_through_a_client_agent() {
    // Phase 1: servers accept TTLs down to 1 s; the client agent keeps the default 10 s.
    let cluster = Cluster::servers(3)
        .server_arg("--session-ttl-min")
        .server_arg("1s")
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
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.text(),
        "Invalid Session TTL '500000000', must be between [1s=24h0m0s]"
    );
}

#[tokio::test]
async fn one_datacenter_and_the_agents_root() {
    let agent = Agent::dev().await;

    // Another datacenter is not silently answered with this one's data.
    for path in [
        "/v1/kv/x?dc=dc2",
        "/v1/catalog/nodes?dc=other",
        "/v1/kv/x?dc=dc1&datacenter=dc2",
    ] {
        let reply = agent.get(path).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        assert_eq!(reply.text(), "No path to datacenter", "{path}");
    }
    // This datacenter, named or not, is served.
    assert_eq!(
        agent.get("/v1/kv/x?dc=dc1").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        agent.get("/v1/catalog/nodes?dc=").await.status,
        StatusCode::OK
    );
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
