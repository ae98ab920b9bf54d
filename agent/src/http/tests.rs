//! The HTTP API through its router, on the in-memory servers ([`MemoryServer`]) and paused
//! time: no sockets, no gossip task, no raft. Requests go in with `tower`'s `oneshot`, and
//! every step of time is taken explicitly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use vigil_server::api::memory::MemoryServer;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};

use super::{AppState, router};
use crate::backend::Backend;
use crate::gossip::Gossip;
use crate::local::{self, LocalOptions, LocalState};
use crate::testing::settle;

const NODE: &str = "node1";
const GOSSIP: &str = "127.0.0.1:8301";
/// This node's UUID in the catalog.
const NODE_ID: &str = "9a1b0c2d-0000-4000-8000-00000000000f";

/// An agent's router over the in-memory servers, with what it started.
struct Agent {
    router: Router,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Agent {
    fn start() -> Agent {
        Agent::with_members(Vec::new())
    }

    /// An agent at gossip address [`GOSSIP`] whose member list is `members`.
    fn with_members(members: Vec<MemberStatus>) -> Agent {
        let addr: SocketAddr = GOSSIP.parse().expect("address");
        let backend = Arc::new(Backend::new(Arc::new(MemoryServer::default())));
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let local = LocalState::start(
            LocalOptions {
                node: NODE.to_owned(),
                node_id: NODE_ID.to_owned(),
                address: addr.ip().to_string(),
                enable_script_checks: false,
                enable_local_script_checks: false,
                ae_interval: Duration::from_secs(60),
                definitions: local::config::LocalDefinitions::default(),
            },
            Arc::clone(&backend),
            &tasks,
            shutdown.clone(),
        )
        .expect("local state");
        let state = AppState {
            backend: Arc::clone(&backend),
            local,
            gossip: Gossip::detached(addr, members),
            node_name: NODE.to_owned(),
            node_id: NODE_ID.to_owned(),
            http_addr: Some("127.0.0.1:8500".parse().expect("address")),
            https_addr: None,
            rpc_addr: "127.0.0.1:8300".parse().expect("address"),
            session_ttl_min: Duration::from_secs(10),
            shutdown: shutdown.clone(),
            reloader: Arc::new(local::reload::Reloader::new(None, Default::default())),
            acls: Arc::new(crate::acl::Acls::new(
                &crate::acl::AclConfig::default(),
                crate::DATACENTER,
                backend,
                shutdown.clone(),
            )),
        };
        Agent {
            router: router(state),
            shutdown,
            tasks,
        }
    }

    /// Sends one request on its own task, which has started when this returns.
    async fn send(&self, method: Method, uri: &str, body: &str) -> JoinHandle<Answer> {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body.to_owned()))
            .expect("request");
        let router = self.router.clone();
        let answer = tokio::spawn(async move {
            let response = router.oneshot(request).await.expect("infallible");
            let status = response.status();
            let index = response
                .headers()
                .get("X-Consul-Index")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            Answer {
                status,
                index,
                body: String::from_utf8_lossy(&body).into_owned(),
            }
        });
        settle().await;
        answer
    }

    /// Sends one request and waits for its answer (one that does not block).
    async fn call(&self, method: Method, uri: &str, body: &str) -> Answer {
        let answer = self.send(method, uri, body).await;
        assert!(answer.is_finished(), "{uri} did not answer at once");
        answer.await.expect("join")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    index: Option<u64>,
    body: String,
}

#[tokio::test(start_paused = true)]
async fn a_kv_put_is_read_back_as_json_and_raw() {
    let agent = Agent::start();

    // A put answers `true`.
    let put = agent.call(Method::PUT, "/v1/kv/app/config", "hello").await;
    assert_eq!((put.status, put.body.as_str()), (StatusCode::OK, "true"));

    // The entry reads back as Consul's JSON (the value in base64), with its index.
    let got = agent.call(Method::GET, "/v1/kv/app/config", "").await;
    assert_eq!(got.status, StatusCode::OK);
    let entries: serde_json::Value = serde_json::from_str(&got.body).expect("JSON");
    assert_eq!(entries[0]["Key"], "app/config");
    assert_eq!(entries[0]["Value"], "aGVsbG8=");
    let index = got.index.expect("X-Consul-Index");
    assert_eq!(entries[0]["ModifyIndex"], index);
    let raw = agent.call(Method::GET, "/v1/kv/app/config?raw", "").await;
    assert_eq!((raw.status, raw.body.as_str()), (StatusCode::OK, "hello"));

    // A key never written is a 404.
    let missing = agent.call(Method::GET, "/v1/kv/app/other", "").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_blocking_get_answers_a_write_at_once_and_otherwise_at_its_wait() {
    let agent = Agent::start();
    let put = agent.call(Method::PUT, "/v1/kv/k", "v1").await;
    assert_eq!(put.status, StatusCode::OK);
    let index = agent
        .call(Method::GET, "/v1/kv/k", "")
        .await
        .index
        .expect("index");

    // A blocking get on the key's index waits while nothing is written to it.
    let uri = format!("/v1/kv/k?raw&index={index}&wait=5s");
    let blocked = agent.send(Method::GET, &uri, "").await;
    tokio::time::advance(Duration::from_secs(1)).await;
    agent.call(Method::PUT, "/v1/kv/other", "x").await;
    settle().await;
    assert!(!blocked.is_finished(), "answered with its key unchanged");

    // A write to the key answers it at once, with the new value and index.
    agent.call(Method::PUT, "/v1/kv/k", "v2").await;
    settle().await;
    assert!(blocked.is_finished(), "the write did not wake it");
    let woken = blocked.await.expect("join");
    assert_eq!((woken.status, woken.body.as_str()), (StatusCode::OK, "v2"));
    let index = woken.index.expect("index");

    // With nothing written, it answers after its wait (5 s, at most 5 s / 16 late), with the
    // index it was given.
    let uri = format!("/v1/kv/k?raw&index={index}&wait=5s");
    let quiet = agent.send(Method::GET, &uri, "").await;
    tokio::time::advance(Duration::from_millis(4999)).await;
    settle().await;
    assert!(!quiet.is_finished(), "answered before its wait");
    tokio::time::advance(Duration::from_secs(5) / 16).await;
    settle().await;
    assert!(quiet.is_finished(), "no answer by its deadline");
    let quiet = quiet.await.expect("join");
    assert_eq!((quiet.status, quiet.body.as_str()), (StatusCode::OK, "v2"));
    assert_eq!(quiet.index, Some(index));
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn agent_self_reports_this_process_not_an_older_holder_of_its_name() {
    // Another process (started earlier at another port) still holds this node's name, so the
    // member list has it and not us: we are not admitted yet.
    let member = |port: u16| MemberStatus {
        name: NODE.to_owned(),
        gossip_addr: SocketAddr::from(([127, 0, 0, 1], port)),
        rpc_addr: "127.0.0.1:8300".parse().expect("address"),
        role: MemberRole::Client,
        datacenter: crate::DATACENTER.to_owned(),
        state: MemberState::Alive,
        pruned: false,
        protocol: vigil_shared::PROTOCOL,
    };
    let me: SocketAddr = GOSSIP.parse().expect("address");
    let agent = Agent::with_members(vec![member(9301)]);
    let reply = agent.call(Method::GET, "/v1/agent/self", "").await;
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(body["Member"]["Port"], me.port(), "{}", body["Member"]);
    agent.stop().await;

    // Once admitted, its own row, with its status.
    let agent = Agent::with_members(vec![member(me.port())]);
    let reply = agent.call(Method::GET, "/v1/agent/self", "").await;
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(body["Member"]["Port"], me.port());
    assert_eq!(body["Member"]["Status"], 1);
    agent.stop().await;
}
