//! A dev server in process: a fatal raft error reaches [`Server::failed`] (which the agent turns
//! into a non-zero exit), and a clean shutdown does not.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{RaftTiming, Server, ServerConfig, ServerMode};
use crate::raft::{Membership, Snapshot, SnapshotMeta, StoredMembership, TypeConfig, Vote};
use vigil_wire::tls::TlsMaterial;

/// Far longer than anything here takes; only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(30);

async fn dev_server() -> Arc<Server> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let rpc_addr = socket.local_addr().expect("address");
    let config = ServerConfig {
        node_name: "dev".to_owned(),
        rpc_addr,
        raft: RaftTiming::local(),
        mode: ServerMode::Dev,
        members: None,
        session_ttl_min: Duration::from_secs(10),
        lock_delay_min: Duration::ZERO,
        max_blocking_queries: 16,
        lock_wait_reserve: 2,
        acls: None,
        acl_default_policy: None,
    };
    let tls = TlsMaterial::dev().expect("TLS");
    Server::start(config, &tls, socket, CancellationToken::new())
        .await
        .expect("dev server")
}

#[tokio::test]
async fn a_storage_failure_stops_raft_and_failed_says_why() {
    let server = dev_server().await;
    // A later leader sends a snapshot whose bytes are no snapshot: the state store cannot
    // install it, and openraft stops on a storage error.
    let leader = 2;
    let meta = SnapshotMeta {
        last_log_id: Some(openraft::testing::log_id::<TypeConfig>(100, leader, 1_000)),
        last_membership: StoredMembership::new(None, Membership::default()),
    };
    let snapshot = Snapshot {
        meta,
        snapshot: Cursor::new(b"not a snapshot".to_vec()),
    };
    // Whether the call itself reports the failure is openraft's business; `failed` must.
    let _ = server
        .raft()
        .install_full_snapshot(Vote::new_committed(100, leader), snapshot)
        .await;
    let why = tokio::time::timeout(PATIENCE, server.failed())
        .await
        .expect("failed() resolves once raft has stopped");
    assert!(why.to_lowercase().contains("snapshot"), "{why}");
    assert!(!server.is_leader());
}

#[tokio::test]
async fn a_clean_shutdown_is_no_failure() {
    let server = dev_server().await;
    server.shutdown().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), server.failed())
            .await
            .is_err(),
        "failed() resolved after a clean shutdown"
    );
}
