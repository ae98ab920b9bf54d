//! Who may be a server: only a certificate carrying exactly `server.<dc>.<domain>` takes part in
//! raft (a client certificate whose node name starts with `server.` used to pass), a server
//! certificate issued for one node joins only as that node, leader-internal writes come only
//! from servers, a cluster with its `--bootstrap-expect` voters takes no more, and a joining
//! server becomes a voter only once it has received the log, so a join naming an unreachable
//! address never costs the cluster its quorum.

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use integration_tests::binary;
use integration_tests::cluster::{Cluster, raft_ids};
use openraft::Vote;
use openraft::raft::VoteRequest;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair};
use serde_json::Value;
use vigil_server::raft::network::{PeerRequest, PeerResponse};
use vigil_shared::rpc::Op;
use vigil_shared::rpc::calls::{self, RpcRequest, RpcResponse, ServerNode};
use vigil_wire::tls::{Role, TlsMaterial};
use vigil_wire::transport::{CallKind, RpcClient, TransportError, client_endpoint};

const CALL_TIMEOUT: Duration = Duration::from_secs(40);

/// A certificate with exactly `names`, signed by the cluster's CA: what `vigil tls cert create
/// --client --node server` produced before node names were checked.
fn forge(cluster: &Cluster, names: &[&str]) -> (PathBuf, PathBuf) {
    let (ca_cert, ca_key) = cluster.ca_files();
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(ca_key).unwrap()).unwrap();
    let issuer =
        Issuer::from_ca_cert_pem(&std::fs::read_to_string(ca_cert).unwrap(), ca_key).unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let cert_path = cluster.dir().join("forged.pem");
    let key_path = cluster.dir().join("forged-key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

async fn call(rpc: &RpcClient, addr: SocketAddr, request: &RpcRequest) -> RpcResponse {
    rpc.call_typed::<RpcRequest, RpcResponse>(addr, request, CALL_TIMEOUT)
        .await
        .expect("the RPC reaches the server")
}

fn join(node_id: u64, name: &str, rpc_addr: SocketAddr) -> RpcRequest {
    RpcRequest::Join {
        node_id,
        node: ServerNode {
            name: name.to_owned(),
            rpc_addr: rpc_addr.to_string(),
        },
    }
}

fn voters(configuration: &Value) -> Vec<String> {
    configuration["Servers"]
        .as_array()
        .expect("Servers array")
        .iter()
        .filter(|s| s["Voter"] == Value::Bool(true))
        .map(|s| s["Node"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_named_server_cannot_join_vote_or_reap() {
    // Phase 1: a three-server cluster and its membership.
    let cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let before = raft_ids(&cluster.raft_configuration(leader).await);
    assert_eq!(before.len(), 3);

    // Phase 2: the CLI no longer issues a client certificate whose names read as a server's.
    let output = Command::new(binary())
        .current_dir(cluster.dir())
        .args(["tls", "cert", "create", "--client", "--node", "server"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid node name"), "{stderr}");

    // Phase 3: such a certificate, made by other means, proves a client, not a server.
    let (cert, key) = forge(
        &cluster,
        &["client.dc1.vigil", "server.client.dc1.vigil", "localhost"],
    );
    let forged_tls = TlsMaterial::load(cluster.ca_files().0, &cert, &key).unwrap();
    assert_eq!(forged_tls.role(), Role::Client);
    let rpc = cluster.rpc_client_with(&cert, &key);
    let addr = cluster.server_rpc(leader);

    // Phase 4: every server-only request from it is refused.
    let spare = UdpSocket::bind("127.0.0.1:0").unwrap();
    let requests = [
        join(4242, "rogue", spare.local_addr().unwrap()),
        RpcRequest::Write {
            op: Op::ReapTombstones {
                before_ms: u64::MAX,
            },
        },
        RpcRequest::Forwarded(
            calls::Write {
                op: Op::DestroySession {
                    id: "00000000-0000-0000-0000-000000000000".to_owned(),
                },
            }
            .into(),
        ),
    ];
    // Each on a stream of its own, then on the one stream a client's blocking calls share: the
    // server checks a request's sender there as on a stream of its own.
    for kind in [CallKind::Prompt, CallKind::Blocking] {
        for request in &requests {
            let answer = rpc
                .call_typed_as::<RpcRequest, RpcResponse>(kind, addr, request, CALL_TIMEOUT)
                .await
                .expect("the RPC reaches the server");
            match answer {
                RpcResponse::Refused(why) => {
                    assert!(
                        why.contains("server certificate") || why.contains("only servers"),
                        "{why}"
                    );
                }
                other => panic!("{request:?} ({kind:?}) was not refused: {other:?}"),
            }
        }
    }

    // Phase 5: it cannot even open raft's protocol, so a vote never reaches raft.
    let raft = RpcClient::with_config(
        client_endpoint(&forged_tls).unwrap(),
        forged_tls.server_name(),
        forged_tls.raft_client_config().unwrap(),
    );
    let vote = PeerRequest::Vote(VoteRequest::new(Vote::new(1_000, 4242), None));
    match raft
        .call_typed::<PeerRequest, PeerResponse>(addr, &vote, CALL_TIMEOUT)
        .await
    {
        Err(TransportError::Unreachable { reason, .. }) => {
            assert!(reason.contains("server certificate"), "{reason}");
        }
        other => panic!("a client certificate spoke raft: {other:?}"),
    }

    // Phase 6: the membership is what it was, and the cluster still commits writes.
    assert_eq!(raft_ids(&cluster.raft_configuration(leader).await), before);
    cluster.server(leader).put_key("still-works", "yes").await;
    // Phase 7: what the servers keep on disk is theirs alone (Consul's raft data is private).
    for i in 0..3 {
        let data = cluster.dir().join(format!("s{i}-data"));
        let mode = std::fs::metadata(&data).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", data.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_join_for_an_unreachable_address_never_becomes_a_voter() {
    // Phase 1: a three-server cluster and a genuine server certificate for node `ghost`.
    let mut cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let rpc = cluster.rpc_client(Role::Server, "ghost");
    // Bound but never answering: nothing is served at this address.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let ghost_addr = silent.local_addr().unwrap();

    // Phase 2: the certificate is for `ghost`; joining under another name is refused.
    match call(
        &rpc,
        cluster.server_rpc(leader),
        &join(7, "other", ghost_addr),
    )
    .await
    {
        RpcResponse::Refused(why) => assert!(why.contains("ghost"), "{why}"),
        other => panic!("a join under another node's name was not refused: {other:?}"),
    }

    // Phase 3: the cluster has its three voters (--bootstrap-expect 3): a fourth is refused at
    // once, without ever being a learner.
    let full = raft_ids(&cluster.raft_configuration(leader).await);
    match call(
        &rpc,
        cluster.server_rpc(leader),
        &join(7, "ghost", ghost_addr),
    )
    .await
    {
        RpcResponse::Join(Err(e)) => assert!(e.to_string().contains("already has 3 voters"), "{e}"),
        other => panic!("a fourth voter was not refused: {other:?}"),
    }
    assert_eq!(raft_ids(&cluster.raft_configuration(leader).await), full);

    // Phase 4: a follower is lost and removed, which makes room.
    let lost = (0..3).find(|i| *i != leader).expect("a follower");
    let configuration = cluster.raft_configuration(leader).await;
    let lost_id = configuration["Servers"]
        .as_array()
        .expect("Servers array")
        .iter()
        .find(|s| s["Node"] == format!("s{lost}").as_str())
        .and_then(|s| s["ID"].as_str())
        .expect("the follower's raft ID")
        .to_owned();
    cluster.kill9(lost).await;
    let removed = cluster
        .server(leader)
        .delete(&format!("/v1/operator/raft/peer?id={lost_id}"))
        .await;
    assert_eq!(
        removed.status,
        reqwest::StatusCode::OK,
        "{}",
        removed.text()
    );
    let before = raft_ids(&cluster.raft_configuration(leader).await);

    // Phase 5: joining as itself at an unreachable address. While the join runs, the
    // configuration never lists the ghost as a voter; the join then fails.
    let request = join(7, "ghost", ghost_addr);
    let joining = {
        let rpc = rpc.clone();
        let addr = cluster.server_rpc(leader);
        tokio::spawn(async move { call(&rpc, addr, &request).await })
    };
    let mut saw_learner = false;
    while !joining.is_finished() {
        let configuration = cluster.raft_configuration(leader).await;
        assert!(
            !voters(&configuration).contains(&"ghost".to_owned()),
            "an unreachable server became a voter: {configuration}"
        );
        saw_learner |= raft_ids(&configuration).len() > before.len();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match joining.await.unwrap() {
        RpcResponse::Join(Err(e)) => assert!(e.to_string().contains("not added"), "{e}"),
        other => panic!("the join of an unreachable server did not fail: {other:?}"),
    }
    assert!(saw_learner, "the ghost was never even a learner");

    // Phase 6: the learner is gone again and the two servers left still commit writes.
    assert_eq!(raft_ids(&cluster.raft_configuration(leader).await), before);
    cluster.server(leader).put_key("after-ghost", "yes").await;
}
