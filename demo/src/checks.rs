//! The demo's health checks, registered with a client node's agent through its API: `demo-bank`
//! (HTTP: the bank answers) and `demo-worker` (TTL: the worker takes turns; `worker --check`
//! passes it at every turn).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use vigil_client::Client;

use crate::ChecksArgs;

/// ID of the TTL check the worker passes at every turn.
pub const WORKER_CHECK: &str = "demo-worker";
/// ID of the HTTP check on the bank.
pub const BANK_CHECK: &str = "demo-bank";

/// The check definitions `vigil-demo checks` registers (Consul's JSON).
pub fn check_definitions(bank: SocketAddr, worker_ttl: Duration) -> [Value; 2] {
    [
        json!({
            "ID": BANK_CHECK,
            "Name": "the bank answers",
            "HTTP": format!("http://{bank}/status"),
            "Interval": "5s",
            "Timeout": "2s",
        }),
        json!({
            "ID": WORKER_CHECK,
            "Name": "the demo worker takes turns",
            "TTL": format!("{}ms", worker_ttl.as_millis()),
        }),
    ]
}

/// `vigil-demo checks`: registers both checks with the agent.
pub async fn register(args: ChecksArgs) -> anyhow::Result<i32> {
    let client = args.addr.client()?;
    for check in check_definitions(args.bank, args.worker_ttl) {
        client
            .agent_check_register(&check)
            .await
            .map_err(|e| anyhow::anyhow!("registering {}: {e}", check["ID"]))?;
        println!("registered check {}", check["ID"]);
    }
    Ok(0)
}

/// Passes the agent's TTL check `check` (best effort: a failure is only reported).
pub async fn pass(client: &Client, check: &str, note: &str) {
    if let Err(e) = client.agent_check_pass(check, note).await {
        eprintln!("vigil-demo worker: could not pass check {check}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_checks_are_an_http_check_on_the_bank_and_a_ttl_check() {
        let [bank, worker] =
            check_definitions("10.0.0.1:8600".parse().unwrap(), Duration::from_secs(90));
        assert_eq!(bank["HTTP"], "http://10.0.0.1:8600/status");
        assert_eq!(bank["ID"], BANK_CHECK);
        assert_eq!(worker["TTL"], "90000ms");
        assert_eq!(worker["ID"], WORKER_CHECK);
    }
}
