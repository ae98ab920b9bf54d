//! Checks of a client agent in a 3-server cluster: a TTL check registered on client 0 reaches
//! the catalog through the servers, a session on client 0 bound to it holds a lock, and when the
//! TTL lapses the session is invalidated and the lock released, as client 1 sees it.
//! docs/consul-compatibility.md#invalidation (a check turning critical), #ttl-check-updates and
//! #anti-entropy.

use std::time::Duration;

use integration_tests::cluster::{Cluster, create_session};
use integration_tests::eventually;
use reqwest::StatusCode;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// How long a change may take to be seen through another agent.
const PROPAGATE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn ttl_check_on_a_client_invalidates_its_session_cluster_wide() {
    let cluster = Cluster::servers(3).clients(2).start().await;
    let owner = cluster.client(0);
    let observer = cluster.client(1).http();

    // Client 0 registers a TTL check and keeps passing it; client 1 sees it in the catalog.
    let reply = owner
        .put(
            "/v1/agent/check/register",
            json!({"Name": "lease", "TTL": "2s", "Status": "passing"}).to_string(),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let renewing = CancellationToken::new();
    let renewer = {
        let http = owner.http();
        let stop = renewing.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let reply = http.put("/v1/agent/check/pass/lease?note=alive", "").await;
                assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    eventually(PROPAGATE, "the check seen through client 1", || async {
        observer
            .catalog_check(&owner.node, "lease")
            .await
            .filter(|c| c["Status"] == "passing" && c["Output"] == "alive")
    })
    .await;

    // A session on client 0 bound to the check holds a lock, as client 1 sees.
    let session = create_session(
        owner,
        &json!({"NodeChecks": ["serfHealth", "lease"], "LockDelay": "0s"}).to_string(),
    )
    .await;
    let reply = owner
        .put(&format!("/v1/kv/fenced/leader?acquire={session}"), "owner")
        .await;
    assert_eq!(reply.text(), "true");
    let entry = observer.get("/v1/kv/fenced/leader").await.json();
    assert_eq!(entry[0]["Session"], json!(session));

    // Client 0 stops passing the check: it expires, the session dies, the lock is free.
    renewing.cancel();
    renewer.await.expect("renewer");
    eventually(
        PROPAGATE,
        "the lock released, seen through client 1",
        || async {
            let entry = observer.get("/v1/kv/fenced/leader").await.json();
            entry[0].get("Session").is_none().then_some(())
        },
    )
    .await;
    let info = observer.get(&format!("/v1/session/info/{session}")).await;
    assert_eq!(info.json(), json!([]));
    let check = observer
        .catalog_check(&owner.node, "lease")
        .await
        .expect("check");
    assert_eq!(check["Status"], "critical");
    assert_eq!(
        check["Output"],
        "TTL expired (last output before timeout follows): alive"
    );

    // Another client can take the lock now.
    let other = create_session(&observer, r#"{"LockDelay":"0s"}"#).await;
    let reply = observer
        .put(&format!("/v1/kv/fenced/leader?acquire={other}"), "observer")
        .await;
    assert_eq!(reply.text(), "true");
}
