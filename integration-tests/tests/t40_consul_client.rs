//! Compatibility with a real Consul client: py-consul (installed into target/pydeps by
//! scripts/install-test-deps.sh) drives a dev agent through sessions, locks, blocking reads,
//! KV and txn, unchanged.

use std::path::PathBuf;
use std::time::Duration;

use integration_tests::Agent;

#[tokio::test]
async fn py_consul_drives_sessions_locks_and_blocking_reads() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let pydeps = workspace.join("target/pydeps");
    assert!(
        pydeps.join("consul").is_dir(),
        "py-consul is missing: run scripts/install-test-deps.sh"
    );
    let agent = Agent::dev().await;
    let addr = agent.base.trim_start_matches("http://").to_owned();
    let (host, port) = addr.rsplit_once(':').expect("host:port");

    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg(workspace.join("integration-tests/py/consul_client.py"))
            .args([host, port])
            .env("PYTHONPATH", &pydeps)
            .output(),
    )
    .await
    .expect("py-consul script finished in time")
    .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "py-consul script failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
}
