//! Large raft entries never stall the cluster: a change larger than one raft entry may be is
//! refused before it is proposed (no election follows), and a follower that was paused while
//! the leader took hundreds of megabytes of legal writes catches up, in bounded AppendEntries
//! batches, once it runs again.

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::eventually;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use vigil_shared::kv::KvOp;
use vigil_shared::rpc::calls::{RpcRequest, RpcResponse};
use vigil_shared::rpc::{Op, ServerError};
use vigil_wire::tls::Role;

use crate::common::exclusive;

/// The largest KV value Consul accepts (512 KiB) is far below this; it is what a huge session
/// name or a hand-made RPC could carry.
const OVERSIZED: usize = 16 * 1024 * 1024;
/// Legal KV writes (each under the 512 KiB limit) whose sum no single AppendEntries could carry.
const BACKLOG_WRITES: usize = 250;
const BACKLOG_VALUE: usize = 400_000;
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);

/// A server's raft figures from `/v1/agent/self` (`Stats.raft`, numbers as strings).
async fn raft_stat(cluster: &Cluster, i: usize, name: &str) -> u64 {
    let reply = cluster.server(i).get("/v1/agent/self").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["Stats"]["raft"][name]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Stats.raft.{name} in {}", reply.text()))
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_changes_are_refused_without_an_election() {
    let _heavy = exclusive().await;
    // Phase 1: a three-server cluster; note its leader and term.
    let cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let term = raft_stat(&cluster, leader, "term").await;

    // Phase 2: a 16 MiB session name over HTTP is refused with a client error (413 from its
    // Content-Length; the agent may close the connection before the client reads the answer).
    let name = "n".repeat(OVERSIZED);
    let body = serde_json::json!({ "Name": name }).to_string();
    let reply = cluster
        .server(leader)
        .try_request(Method::PUT, "/v1/session/create", Some(body.into_bytes()))
        .await;
    if let Ok(reply) = reply {
        assert!(
            reply.status.is_client_error(),
            "{}: {}",
            reply.status,
            reply.text()
        );
    }

    // Phase 3: the same size sent straight over RPC (as an agent would) is refused by the
    // server as too large, before raft sees it.
    let rpc = cluster.rpc_client(Role::Client, "big-writer");
    let write = RpcRequest::Write {
        op: Op::Kv(vec![KvOp::Set {
            key: "huge".to_owned(),
            value: vec![b'x'; OVERSIZED],
            flags: 0,
        }]),
    };
    let response = rpc
        .call_typed::<RpcRequest, RpcResponse>(
            cluster.server_rpc(leader),
            &write,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            response,
            RpcResponse::Write(Err(ServerError::TooLarge { .. }))
        ),
        "{response:?}"
    );

    // Phase 4: no election happened, and the cluster commits as before.
    assert_eq!(cluster.leader().await, leader);
    assert_eq!(raft_stat(&cluster, leader, "term").await, term);
    let reply = cluster.server(leader).put("/v1/kv/after", "ok").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_paused_through_a_large_backlog_catches_up() {
    let _heavy = exclusive().await;
    // Phase 1: a three-server cluster; one follower is frozen.
    let cluster = Cluster::servers(3).start().await;
    let leader = cluster.leader().await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    cluster.pause(follower);

    // Phase 2: the leader and the other follower commit 100 MB of legal writes.
    let value = vec![b'v'; BACKLOG_VALUE];
    for n in 0..BACKLOG_WRITES {
        let reply = cluster
            .server(leader)
            .put(&format!("/v1/kv/backlog/{n:03}"), value.clone())
            .await;
        assert_eq!(reply.status, StatusCode::OK, "write {n}: {}", reply.text());
    }

    // Phase 3: the follower runs again and receives the whole backlog: entries apply in log
    // order, so once it reads the last write it has applied every one before. (The leader's
    // applied index is no target: raft's metrics may not show the last write yet when its
    // answer is out.)
    cluster.resume(follower);
    let last = format!("/v1/kv/backlog/{:03}?stale", BACKLOG_WRITES - 1);
    let entry = eventually(
        CATCH_UP_LIMIT,
        "the paused follower to catch up",
        || async {
            let reply = cluster.server(follower).get(&last).await;
            (reply.status == StatusCode::OK).then(|| reply.json())
        },
    )
    .await;
    assert!(matches!(entry[0]["Value"], Value::String(_)));

    // Phase 4: the cluster still has its leader and commits.
    let reply = cluster.server(leader).put("/v1/kv/after", "ok").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}
