//! Compatibility with a real Consul client: py-consul (installed into target/pydeps by
//! scripts/install-test-deps.sh) drives a dev agent through sessions, locks, blocking reads,
//! KV and txn, and through its agent, catalog and health calls (services, TTL and script checks,
//! maintenance, filters, node meta, sessions bound to checks), unchanged.

use std::path::PathBuf;
use std::time::Duration;

use integration_tests::Agent;

/// Runs `integration-tests/py/<script>` with py-consul against `agent` (host, port and
/// `extra` arguments) and returns its stdout; panics if it fails.
async fn run_py_consul(script: &str, agent: &Agent, extra: &[&str]) -> String {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let pydeps = workspace.join("target/pydeps");
    assert!(
        pydeps.join("consul").is_dir(),
        "py-consul is missing: run scripts/install-test-deps.sh"
    );
    let addr = agent.base.trim_start_matches("http://").to_owned();
    let (host, port) = addr.rsplit_once(':').expect("host:port");

    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg(workspace.join("integration-tests/py").join(script))
            .args([host, port])
            .args(extra)
            .env("PYTHONPATH", &pydeps)
            .output(),
    )
    .await
    .expect("py-consul script finished in time")
    .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "py-consul script failed:\n{stdout}\n{stderr}"
    );
    stdout
}

#[tokio::test]
async fn py_consul_drives_sessions_locks_and_blocking_reads() {
    let agent = Agent::dev().await;
    let stdout = run_py_consul("consul_client.py", &agent, &[]).await;
    assert!(stdout.contains("checks passed"), "{stdout}");
}

#[tokio::test]
async fn py_consul_drives_the_agent_catalog_health_and_sessions() {
    let agent = Agent::dev_with(&[
        "--session-ttl-min",
        "1s",
        "--enable-script-checks",
        "--node-meta",
        "env:prod",
    ])
    .await;
    let stdout = run_py_consul("consul_agent_catalog.py", &agent, &[&agent.node]).await;
    assert!(stdout.contains("checks passed"), "{stdout}");
}
