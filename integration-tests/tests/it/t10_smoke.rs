//! Basics of a dev agent: it starts, answers status, and leaves on SIGTERM with exit code 0.

use integration_tests::Agent;
use reqwest::StatusCode;

#[tokio::test]
async fn dev_agent_starts_reports_leader_and_exits_cleanly() {
    // A dev agent is its own leader and reports its RPC address as the leader's.
    let agent = Agent::dev().await;
    let leader = agent.get("/v1/status/leader").await;
    assert_eq!(leader.status, StatusCode::OK);
    assert_eq!(leader.json(), serde_json::json!(agent.rpc_addr));
    assert_eq!(
        agent.get("/v1/status/peers").await.json(),
        serde_json::json!([agent.rpc_addr])
    );

    // SIGTERM is a graceful stop.
    assert_eq!(agent.terminate().await, Some(0));
}
