//! `vigil tls ca create` and `vigil tls cert create`: Consul-style files in a directory that
//! load as TLS material and carry mutual TLS between a server and a client agent.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use integration_tests::binary;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_wire::tls::{ALPN_RPC, PeerIdentity, Role, TlsMaterial};
use vigil_wire::transport::{
    Protocol, RequestLimits, RpcClient, RpcHandler, client_endpoint, serve, server_endpoint,
};

fn vigil(dir: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run vigil")
}

/// The paths a successful command reports as saved.
fn saved(output: &Output) -> Vec<String> {
    assert!(
        output.status.success(),
        "vigil failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("==> Saved "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn ca_and_certificates_are_written_consul_style() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    // The CA goes to the current directory by default, and is never overwritten.
    let ca = saved(&vigil(dir, &["tls", "ca", "create"]));
    assert_eq!(ca, ["vigil-agent-ca.pem", "vigil-agent-ca-key.pem"]);
    let again = vigil(dir, &["tls", "ca", "create"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already exists"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // Certificates take the next free number and the CA from the current directory.
    let server0 = saved(&vigil(dir, &["tls", "cert", "create", "--server"]));
    assert_eq!(
        server0,
        ["dc1-server-vigil-0.pem", "dc1-server-vigil-0-key.pem"]
    );
    let server1 = saved(&vigil(dir, &["tls", "cert", "create", "--server"]));
    assert_eq!(
        server1,
        ["dc1-server-vigil-1.pem", "dc1-server-vigil-1-key.pem"]
    );
    let client = saved(&vigil(
        dir,
        &["tls", "cert", "create", "--client", "--dc", "dc2"],
    ));
    assert_eq!(
        client,
        ["dc2-client-vigil-0.pem", "dc2-client-vigil-0-key.pem"]
    );

    // A certificate for users of the HTTPS API and the CLI, which the RPC endpoint refuses.
    let cli = saved(&vigil(dir, &["tls", "cert", "create", "--cli"]));
    assert_eq!(cli, ["dc1-cli-vigil-0.pem", "dc1-cli-vigil-0-key.pem"]);

    // A role is required, and only one.
    assert!(!vigil(dir, &["tls", "cert", "create"]).status.success());
    assert!(
        !vigil(dir, &["tls", "cert", "create", "--cli", "--client"])
            .status
            .success()
    );
    assert!(
        !vigil(dir, &["tls", "cert", "create", "--server", "--client"])
            .status
            .success()
    );

    // --dir writes elsewhere and looks for the CA there unless --ca/--key say otherwise.
    let other = dir.join("other");
    std::fs::create_dir(&other).unwrap();
    let other_arg = other.to_str().unwrap();
    let missing_ca = vigil(
        dir,
        &["tls", "cert", "create", "--server", "--dir", other_arg],
    );
    assert!(!missing_ca.status.success());
    let elsewhere = saved(&vigil(
        dir,
        &[
            "tls",
            "cert",
            "create",
            "--server",
            "--dir",
            other_arg,
            "--ca",
            "vigil-agent-ca.pem",
            "--key",
            "vigil-agent-ca-key.pem",
        ],
    ));
    assert_eq!(
        elsewhere,
        [
            other.join("dc1-server-vigil-0.pem").display().to_string(),
            other
                .join("dc1-server-vigil-0-key.pem")
                .display()
                .to_string(),
        ]
    );

    // Everything written loads, with the role and server name its certificate proves.
    let load = |cert: &str, key: &str| {
        TlsMaterial::load(
            &dir.join("vigil-agent-ca.pem"),
            &dir.join(cert),
            &dir.join(key),
        )
        .unwrap()
    };
    let server = load(&server0[0], &server0[1]);
    assert_eq!(server.role(), Role::Server);
    assert_eq!(server.server_name(), "server.dc1.vigil");
    let client = load(&client[0], &client[1]);
    assert_eq!(client.role(), Role::Client);
    assert_eq!(client.server_name(), "server.dc2.vigil");
    let cli = load(&cli[0], &cli[1]);
    assert_eq!(cli.role(), Role::Cli);
    assert_eq!(cli.server_name(), "server.dc1.vigil");
}

/// Answers with the caller's role.
struct WhoAmI;

impl RpcHandler for WhoAmI {
    fn handle(&self, peer: &PeerIdentity, _request: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
        let role = peer.role;
        async move { role.as_str().as_bytes().to_vec() }.boxed()
    }
}

#[tokio::test]
async fn written_certificates_carry_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    saved(&vigil(dir, &["tls", "ca", "create"]));
    saved(&vigil(dir, &["tls", "cert", "create", "--server"]));
    saved(&vigil(dir, &["tls", "cert", "create", "--client"]));
    let ca = dir.join("vigil-agent-ca.pem");
    let server_tls = TlsMaterial::load(
        &ca,
        &dir.join("dc1-server-vigil-0.pem"),
        &dir.join("dc1-server-vigil-0-key.pem"),
    )
    .unwrap();
    let client_tls = TlsMaterial::load(
        &ca,
        &dir.join("dc1-client-vigil-0.pem"),
        &dir.join("dc1-client-vigil-0-key.pem"),
    )
    .unwrap();

    // A server on the loaded server certificate sees the loaded client certificate as a client.
    let endpoint = server_endpoint("127.0.0.1:0".parse().unwrap(), &server_tls).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    serve(
        endpoint,
        server_tls.server_name(),
        vec![Protocol {
            alpn: ALPN_RPC,
            servers_only: false,
            limits: RequestLimits::RPC,
            handler: Arc::new(WhoAmI),
        }],
        shutdown.clone(),
        tasks.clone(),
    );
    let client = RpcClient::new(
        client_endpoint(&client_tls).unwrap(),
        client_tls.server_name(),
    );
    let response = client
        .call(addr, b"who".to_vec(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(response, b"client");

    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}
