//! Compatibility with a real Consul client: py-consul (installed into target/pydeps by
//! scripts/install-test-deps.sh) drives a dev agent through sessions, locks, blocking reads,
//! KV and txn, and through its agent, catalog and health calls (services, TTL and script checks,
//! maintenance, filters, node meta, sessions bound to checks), unchanged.

use integration_tests::{Agent, SHORT_SESSION_TTL, run_py_consul};

#[tokio::test]
async fn py_consul_drives_sessions_locks_and_blocking_reads() {
    let agent = Agent::dev().await;
    run_py_consul("consul_client.py", &agent, &[]).await;
}

#[tokio::test]
async fn py_consul_drives_the_agent_catalog_health_and_sessions() {
    let agent = Agent::dev_with_env(
        &["--enable-script-checks", "--node-meta", "env:prod"],
        &[SHORT_SESSION_TTL],
    )
    .await;
    run_py_consul("consul_agent_catalog.py", &agent, &[&agent.node]).await;
}
