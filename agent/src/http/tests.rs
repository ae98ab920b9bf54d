//! The HTTP API through its router, on the in-memory servers ([`MemoryServer`]) and paused
//! time: no sockets, no gossip task, no raft. Requests go in through [`Api::answer`], and
//! every step of time is taken explicitly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::response::IntoResponse as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_gossip::Gossip;
use vigil_server::api::memory::MemoryServer;
use vigil_shared::acl::authz::DefaultPolicy;
use vigil_shared::acl::{GLOBAL_MANAGEMENT_POLICY_ID, Link, Token};
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::rpc::{AclOp, reads, writes};

use super::permissions::{Needs, Rule};
use super::{Api, AppState, HttpState, router};
use crate::backend::Backend;
use crate::local::{self, LocalOptions, LocalState};
use crate::testing::settle;
use vigil_shared::acl::authz::Resource;

const NODE: &str = "node1";
const GOSSIP: &str = "127.0.0.1:8301";
/// This node's UUID in the catalog.
const NODE_ID: &str = "9a1b0c2d-0000-4000-8000-00000000000f";
/// The management token of [`Agent::with_acls`].
const ROOT: &str = "2d7d1b4c-6d0e-4e0a-9d0b-7c3c3f3f0001";

/// An agent's router over the in-memory servers, with what it started.
struct Agent {
    router: Api,
    state: AppState,
    backend: Arc<Backend>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Agent {
    fn start() -> Agent {
        Agent::with_members(Vec::new())
    }

    /// An agent at gossip address [`GOSSIP`] whose member list is `members`.
    fn with_members(members: Vec<MemberStatus>) -> Agent {
        Agent::with(members, crate::acl::AclConfig::default())
    }

    /// An agent with ACLs on under `default_policy`; [`ROOT`] is its management token once
    /// [`Agent::init_acls`] has run.
    fn with_acls(default_policy: DefaultPolicy) -> Agent {
        let config = crate::acl::AclConfig {
            default_policy: Some(default_policy),
            ..Default::default()
        };
        let me = MemberStatus {
            name: NODE.to_owned(),
            gossip_addr: GOSSIP.parse().expect("address"),
            rpc_addr: "127.0.0.1:8300".parse().expect("address"),
            role: MemberRole::Client,
            datacenter: crate::DATACENTER.to_owned(),
            state: MemberState::Alive,
            pruned: false,
            protocol: vigil_shared::PROTOCOL,
        };
        Agent::with(vec![me], config)
    }

    /// What the leader writes when it finds ACLs on: the built-in policy, the anonymous token
    /// and [`ROOT`] as the initial management token.
    async fn init_acls(&self) {
        let root = Token {
            policies: vec![Link {
                id: GLOBAL_MANAGEMENT_POLICY_ID.to_owned(),
                name: String::new(),
            }],
            ..Token::new(uuid::Uuid::new_v4().to_string(), ROOT)
        };
        let op = AclOp::Init {
            initial_management: Some(root),
        };
        let done = self.backend.write(writes::Acl(op)).await.expect("write");
        assert!(done.is_ok(), "{done:?}");
        settle().await;
    }

    fn with(members: Vec<MemberStatus>, acl: crate::acl::AclConfig) -> Agent {
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
                definitions: crate::config::LocalDefinitions::default(),
            },
            Arc::clone(&backend),
            &tasks,
            shutdown.clone(),
        )
        .expect("local state");
        let state = AppState::from(HttpState {
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
                &acl,
                crate::DATACENTER,
                Arc::clone(&backend),
                shutdown.clone(),
                crate::token::AgentToken::default(),
            )),
            acquire_waits: Default::default(),
        });
        Agent {
            router: router(state.clone()),
            state,
            backend,
            shutdown,
            tasks,
        }
    }

    /// Sends one request on its own task, which has started when this returns.
    async fn send(&self, method: Method, uri: &str, body: &str) -> JoinHandle<Answer> {
        self.send_as(None, method, uri, body).await
    }

    /// [`Agent::send`] with `X-Consul-Token: token`.
    async fn send_as(
        &self,
        token: Option<&str>,
        method: Method,
        uri: &str,
        body: &str,
    ) -> JoinHandle<Answer> {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("X-Consul-Token", token);
        }
        let request = request.body(Body::from(body.to_owned())).expect("request");
        let answer = tokio::spawn(answer(self.router.clone(), request));
        settle().await;
        answer
    }

    /// Sends one request and waits for its answer (one that does not block).
    async fn call(&self, method: Method, uri: &str, body: &str) -> Answer {
        self.call_as(None, method, uri, body).await
    }

    /// [`Agent::call`] with `X-Consul-Token: token`.
    async fn call_as(&self, token: Option<&str>, method: Method, uri: &str, body: &str) -> Answer {
        let answer = self.send_as(token, method, uri, body).await;
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

/// What `router` answers `request`.
async fn answer(router: Api, request: Request<Body>) -> Answer {
    let response = router.answer(request).await;
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

/// What [`seed`] made, for the routes that name it.
struct Seeded {
    session: String,
    query: String,
    token: String,
    policy: String,
    role: String,
}

/// Something of every kind, each named `x` (the local service, a TTL check, a catalog node with
/// a service and a check, a key held by a session, an event, a prepared query, an ACL token,
/// policy and role), made with the management token.
async fn seed(agent: &Agent) -> Seeded {
    let root = Some(ROOT);
    let ok = |a: Answer, what: &str| {
        assert_eq!(a.status, StatusCode::OK, "{what}: {}", a.body);
        serde_json::from_str::<serde_json::Value>(&a.body).unwrap_or_default()
    };
    let put = |uri: &'static str, body: &'static str| agent.call_as(root, Method::PUT, uri, body);
    ok(
        put("/v1/agent/service/register", r#"{"Name":"x","ID":"x"}"#).await,
        "service",
    );
    ok(
        put("/v1/agent/check/register", r#"{"Name":"x","TTL":"10m"}"#).await,
        "check",
    );
    let catalog = r#"{"Node":"x","Address":"10.0.0.1","Service":{"Service":"x"},
        "Check":{"CheckID":"x","Name":"x","Status":"passing","ServiceID":"x"}}"#;
    ok(put("/v1/catalog/register", catalog).await, "catalog");
    let session = ok(
        put("/v1/session/create", r#"{"Checks":[]}"#).await,
        "session",
    )["ID"]
        .as_str()
        .expect("ID")
        .to_owned();
    let acquire = format!("/v1/kv/x?acquire={session}");
    ok(agent.call_as(root, Method::PUT, &acquire, "v").await, "key");
    let query = r#"{"Name":"x","Service":{"Service":"x"}}"#;
    let query = ok(
        agent.call_as(root, Method::POST, "/v1/query", query).await,
        "query",
    )["ID"]
        .as_str()
        .expect("ID")
        .to_owned();
    let policy = ok(
        put("/v1/acl/policy", r#"{"Name":"x","Rules":""}"#).await,
        "policy",
    );
    let role = ok(put("/v1/acl/role", r#"{"Name":"x"}"#).await, "role");
    let token = ok(
        put("/v1/acl/token", r#"{"Description":"x"}"#).await,
        "token",
    );
    Seeded {
        session,
        query,
        token: token["AccessorID"].as_str().expect("AccessorID").to_owned(),
        policy: policy["ID"].as_str().expect("ID").to_owned(),
        role: role["ID"].as_str().expect("ID").to_owned(),
    }
}

/// A token whose rules grant write on everything but `lacking`.
async fn all_but(agent: &Agent, lacking: Resource) -> String {
    let rules: String = [
        Resource::Acl,
        Resource::Agent,
        Resource::Event,
        Resource::Key,
        Resource::Keyring,
        Resource::Node,
        Resource::Operator,
        Resource::Query,
        Resource::Service,
        Resource::Session,
    ]
    .into_iter()
    .filter(|r| *r != lacking)
    .map(|r| match r.is_segmented() {
        true => format!("{}_prefix \"\" {{ policy = \"write\" }}\n", r.as_str()),
        false => format!("{} = \"write\"\n", r.as_str()),
    })
    .collect();
    let name = format!("all-but-{}", lacking.as_str());
    let policy = serde_json::json!({"Name": name, "Rules": rules}).to_string();
    let made = agent
        .call_as(Some(ROOT), Method::PUT, "/v1/acl/policy", &policy)
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    let token = serde_json::json!({"Policies": [{"Name": name}]}).to_string();
    let made = agent
        .call_as(Some(ROOT), Method::PUT, "/v1/acl/token", &token)
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    let token: serde_json::Value = serde_json::from_str(&made.body).expect("JSON");
    token["SecretID"].as_str().expect("SecretID").to_owned()
}

/// A request that reaches `rule`'s check: its path filled in with what `seeded` names, and the
/// query string and body the handler needs to get as far as the check.
fn sample(rule: &Rule, seeded: &Seeded) -> (String, String) {
    let Seeded {
        session,
        query,
        token,
        policy,
        role,
    } = seeded;
    let id = |path: &str| -> &str {
        match path {
            p if p.starts_with("/v1/acl/token/") => token,
            p if p.starts_with("/v1/acl/policy/") => policy,
            p if p.starts_with("/v1/acl/role/") => role,
            p if p.starts_with("/v1/session/") => session,
            p if p.starts_with("/v1/query/") => query,
            _ => "x",
        }
    };
    let mut uri = String::new();
    let mut rest = rule.path;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').expect("a closed placeholder") + open;
        uri.push_str(&rest[..open]);
        uri.push_str(match &rest[open + 1..close] {
            "id" | "*id" => id(rule.path),
            "node" if rule.path.starts_with("/v1/session/") => NODE,
            "kind" => "replication",
            "addr" => GOSSIP,
            "state" => "any",
            "file" | "*file" => "index.html",
            _ => "x",
        });
        rest = &rest[close + 1..];
    }
    uri.push_str(rest);
    let query_string = match (rule.path, rule.method) {
        ("/v1/vigil/sequencer", _) => format!("?key=x&lock-index=1&session={session}"),
        ("/v1/vigil/lock/{*name}", "PUT" | "DELETE") => format!("?session={session}"),
        ("/v1/kv" | "/v1/kv/", _) => "?recurse".to_owned(),
        (path, _) if path.contains("maintenance") => "?enable=true".to_owned(),
        _ => String::new(),
    };
    let body = match (rule.path, rule.method) {
        ("/v1/kv/{*key}", "PUT") => "v",
        ("/v1/txn", _) => r#"[{"KV":{"Verb":"set","Key":"x","Value":"dg=="}}]"#,
        ("/v1/acl/token" | "/v1/acl/token/{id}", "PUT") => r#"{"Description":"y"}"#,
        ("/v1/acl/policy" | "/v1/acl/policy/{id}", "PUT") => r#"{"Name":"y","Rules":""}"#,
        ("/v1/acl/role" | "/v1/acl/role/{id}", "PUT") => r#"{"Name":"y"}"#,
        ("/v1/agent/token/{kind}", _) => r#"{"Token":"t"}"#,
        ("/v1/agent/check/register", _) => r#"{"Name":"y","TTL":"10m"}"#,
        ("/v1/agent/service/register", _) => r#"{"Name":"x","ID":"x"}"#,
        ("/v1/catalog/register", _) => r#"{"Node":"x","Address":"10.0.0.1"}"#,
        ("/v1/catalog/deregister", _) => r#"{"Node":"x"}"#,
        ("/v1/query" | "/v1/query/{id}", "POST" | "PUT") => {
            r#"{"Name":"x","Service":{"Service":"x"}}"#
        }
        ("/v1/session/create", _) => r#"{"Checks":[]}"#,
        _ => "",
    };
    (uri + &query_string, body.to_owned())
}

/// Whether `answer` is Consul's refusal for want of a `resource` permission: a 403, or (a
/// transaction) a 409 naming the operation refused.
fn denied_on(answer: &Answer, resource: Resource) -> bool {
    let refused = match answer.status {
        StatusCode::FORBIDDEN => answer.body.starts_with("Permission denied"),
        StatusCode::CONFLICT => answer.body.contains(r#""What":"Permission denied"#),
        _ => false,
    };
    refused && answer.body.contains(&format!("'{}:", resource.as_str()))
}

/// Every entry of the permission table, tried as it says: with default deny, the anonymous
/// token and a token with every right but the one the route needs are refused (or see the
/// management token's answer cut down), and the management token is not refused.
#[tokio::test(start_paused = true)]
async fn every_route_refuses_a_token_without_its_permission() {
    let agent = Agent::with_acls(DefaultPolicy::Deny);
    agent.init_acls().await;
    let seeded = seed(&agent).await;
    let mut lacking = std::collections::HashMap::new();
    for r in super::permissions::ROUTES {
        if let Needs::Fixed(res, _) | Needs::Named(res, ..) | Needs::Filtered(res) = r.needs
            && let std::collections::hash_map::Entry::Vacant(entry) = lacking.entry(res)
        {
            entry.insert(all_but(&agent, res).await);
        }
    }
    // Reads first, then writes, then what destroys the seeded state (a session's destruction
    // after the deletes that use it), and leaving, which stops the agent, last.
    let mut rules: Vec<&Rule> = super::permissions::ROUTES.iter().collect();
    rules.sort_by_key(|r| match (r.method, r.path) {
        (_, "/v1/agent/leave") => 4,
        (_, "/v1/session/destroy/{id}") => 3,
        ("DELETE", _) => 2,
        (_, path) if path.contains("deregister") => 2,
        ("GET", _) => 0,
        _ => 1,
    });
    for rule in rules {
        let (uri, body) = sample(rule, &seeded);
        let method = Method::from_bytes(rule.method.as_bytes()).expect("method");
        let what = format!("{} {uri}", rule.method);
        let send = |token: Option<&str>| {
            let (method, uri, body) = (method.clone(), uri.clone(), body.clone());
            let agent = &agent;
            let token = token.map(str::to_owned);
            async move {
                let answer = agent.send_as(token.as_deref(), method, &uri, &body).await;
                tokio::time::advance(Duration::from_millis(10)).await;
                settle().await;
                answer.await.expect("join")
            }
        };
        let anonymous = send(None).await;
        match rule.needs {
            Needs::Nothing(_) => assert!(
                !anonymous.body.contains("lacks permission"),
                "{what}: {}",
                anonymous.body
            ),
            Needs::Fixed(res, _) | Needs::Named(res, ..) => {
                assert!(
                    denied_on(&anonymous, res),
                    "anonymous {what}: {}",
                    anonymous.body
                );
                let without = send(Some(&lacking[&res])).await;
                assert!(
                    denied_on(&without, res),
                    "all but {res:?}, {what}: {}",
                    without.body
                );
                // The monitor's answer is a stream that does not end.
                if !matches!(rule.path, "/v1/agent/leave" | "/v1/agent/monitor") {
                    let root = send(Some(ROOT)).await;
                    assert!(
                        !root.body.contains("lacks permission"),
                        "management, {what}: {}",
                        root.body
                    );
                }
            }
            Needs::Filtered(res) => {
                let root = send(Some(ROOT)).await;
                assert_eq!(
                    root.status,
                    StatusCode::OK,
                    "management, {what}: {}",
                    root.body
                );
                let without = send(Some(&lacking[&res])).await;
                for (who, cut) in [("anonymous", &anonymous), ("all but", &without)] {
                    assert!(
                        matches!(cut.status, StatusCode::OK | StatusCode::NOT_FOUND),
                        "{who}, {what}: {} {}",
                        cut.status,
                        cut.body
                    );
                    // Events travel by gossip, which this harness has none of: none to filter.
                    if rule.path != "/v1/event/list" {
                        assert_ne!(cut.body, root.body, "{who}, {what}: nothing was filtered");
                    }
                }
            }
        }
    }
    agent.stop().await;
}

/// The router serves exactly the methods the permission table lists for each path (its
/// `OPTIONS` answer names them), so no method is served without an entry.
#[tokio::test(start_paused = true)]
async fn the_router_serves_the_methods_the_permission_table_lists() {
    let agent = Agent::start();
    let mut paths: Vec<&str> = super::permissions::ROUTES.iter().map(|r| r.path).collect();
    paths.dedup();
    let seeded = Seeded {
        session: "s".into(),
        query: "q".into(),
        token: "t".into(),
        policy: "p".into(),
        role: "r".into(),
    };
    for path in paths {
        let rules: Vec<&Rule> = super::permissions::ROUTES
            .iter()
            .filter(|r| r.path == path)
            .collect();
        let (uri, _) = sample(rules[0], &seeded);
        let uri = uri.split('?').next().unwrap_or_default().to_owned();
        let request = Request::builder()
            .method(Method::OPTIONS)
            .uri(&uri)
            .body(Body::empty())
            .expect("request");
        let response = agent.router.answer(request).await;
        let allow = response
            .headers()
            .get("Allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut served: Vec<&str> = allow
            .split(',')
            .filter(|m| !matches!(*m, "OPTIONS" | "HEAD"))
            .collect();
        served.sort_unstable();
        let mut listed: Vec<&str> = rules.iter().map(|r| r.method).collect();
        listed.sort_unstable();
        assert_eq!(served, listed, "{path} ({uri})");
    }
    agent.stop().await;
}

/// Consul's allow-all default never grants ACL management or snapshots: the anonymous token
/// of a default-allow agent writes keys but cannot list or mint tokens nor take a snapshot.
#[tokio::test(start_paused = true)]
async fn default_allow_grants_no_acl_management_and_no_snapshot() {
    let agent = Agent::with_acls(DefaultPolicy::Allow);
    agent.init_acls().await;
    let put = agent.call(Method::PUT, "/v1/kv/k", "v").await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let listed = agent.call(Method::GET, "/v1/acl/tokens", "").await;
    assert!(denied_on(&listed, Resource::Acl), "{}", listed.body);
    assert!(listed.body.contains("'acl:read'"), "{}", listed.body);
    let minted = agent
        .call(
            Method::PUT,
            "/v1/acl/token",
            r#"{"Policies":[{"Name":"global-management"}]}"#,
        )
        .await;
    assert!(minted.body.contains("'acl:write'"), "{}", minted.body);
    let snapshot = agent.call(Method::GET, "/v1/snapshot", "").await;
    assert!(denied_on(&snapshot, Resource::Acl), "{}", snapshot.body);
    assert!(snapshot.body.contains("'acl:write'"), "{}", snapshot.body);
    // Leave and reload need agent:write, which the default grants here.
    let reload = agent.call(Method::PUT, "/v1/agent/reload", "").await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.body);
    agent.stop().await;
}

/// An unknown token is remembered as unknown only until the ACL tables change: once a token
/// with that secret is created, the next request with it works.
#[tokio::test(start_paused = true)]
async fn an_unknown_token_is_known_as_soon_as_it_is_created() {
    let agent = Agent::with_acls(DefaultPolicy::Deny);
    agent.init_acls().await;
    let secret = "5e0c7c1e-0000-4000-8000-0000000000aa";
    for _ in 0..2 {
        let unknown = agent
            .call_as(Some(secret), Method::GET, "/v1/agent/self", "")
            .await;
        assert_eq!(unknown.status, StatusCode::FORBIDDEN, "{}", unknown.body);
        assert_eq!(unknown.body, "ACL not found");
    }
    let token = serde_json::json!({
        "SecretID": secret,
        "Policies": [{"ID": GLOBAL_MANAGEMENT_POLICY_ID}],
    });
    let made = agent
        .call_as(Some(ROOT), Method::PUT, "/v1/acl/token", &token.to_string())
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    tokio::time::advance(Duration::from_millis(10)).await;
    settle().await;
    let known = agent
        .call_as(Some(secret), Method::GET, "/v1/agent/self", "")
        .await;
    assert_eq!(known.status, StatusCode::OK, "{}", known.body);
    agent.stop().await;
}

/// `node:write` cannot mark a node's `serfHealth` critical through the catalog (which would
/// invalidate every session on the node, whoever owns it): only a management token writes the
/// gossip layer's check.
#[tokio::test(start_paused = true)]
async fn node_write_cannot_write_serf_health_through_the_catalog() {
    let agent = Agent::with_acls(DefaultPolicy::Deny);
    agent.init_acls().await;
    let writer = all_but(&agent, Resource::Acl).await;
    let critical = r#"{"Node":"node1","Address":"10.0.0.1",
        "Check":{"CheckID":"serfHealth","Name":"Serf Health Status","Status":"critical"}}"#;
    let refused = agent
        .call_as(Some(&writer), Method::PUT, "/v1/catalog/register", critical)
        .await;
    assert!(denied_on(&refused, Resource::Acl), "{}", refused.body);
    let txn = r#"[{"Check":{"Verb":"set","Check":{"Node":"node1","CheckID":"serfHealth",
        "Name":"Serf Health Status","Status":"critical"}}}]"#;
    let refused = agent
        .call_as(Some(&writer), Method::PUT, "/v1/txn", txn)
        .await;
    assert!(denied_on(&refused, Resource::Acl), "{}", refused.body);
    let removed = agent
        .call_as(
            Some(&writer),
            Method::PUT,
            "/v1/catalog/deregister",
            r#"{"Node":"node1","CheckID":"serfHealth"}"#,
        )
        .await;
    assert!(denied_on(&removed, Resource::Acl), "{}", removed.body);
    // Its other checks it writes as before; management writes serfHealth too.
    let other = r#"{"Node":"node1","Address":"10.0.0.1",
        "Check":{"CheckID":"disk","Name":"disk","Status":"passing"}}"#;
    let done = agent
        .call_as(Some(&writer), Method::PUT, "/v1/catalog/register", other)
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let done = agent
        .call_as(Some(ROOT), Method::PUT, "/v1/catalog/register", critical)
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    agent.stop().await;
}

/// Runs of [`probe`], and how many of them are suspended now.
static PROBE_RUNS: AtomicUsize = AtomicUsize::new(0);
static PROBE_LIVE: AtomicUsize = AtomicUsize::new(0);

/// One run of [`probe`], counted while it lasts.
struct ProbeRun;

impl ProbeRun {
    fn start() -> ProbeRun {
        PROBE_RUNS.fetch_add(1, Ordering::SeqCst);
        PROBE_LIVE.fetch_add(1, Ordering::SeqCst);
        ProbeRun
    }
}

impl Drop for ProbeRun {
    fn drop(&mut self) {
        PROBE_LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A handler that reads the key `k` as the KV handler does, and counts its runs.
async fn probe(cx: super::Ctx) -> Result<axum::response::Response, super::error::ApiError> {
    let _run = ProbeRun::start();
    let (entries, meta) = cx
        .read(reads::KvGet {
            key: "k".to_owned(),
        })
        .await?;
    let value = entries
        .into_iter()
        .next()
        .map(|e| e.value)
        .unwrap_or_default();
    Ok(super::with_meta(meta, value.into_response()))
}

/// A waiting blocking GET holds no suspended handler: its first run hands its read to the front
/// layer and unwinds, and a second run answers with what the wait brought, without asking the
/// servers again. A GET with a body is not run twice: it waits inside its handler.
#[tokio::test(start_paused = true)]
async fn a_waiting_blocking_get_holds_no_handler_and_a_second_run_answers() {
    let agent = Agent::start();
    agent.call(Method::PUT, "/v1/kv/k", "v1").await;
    let index = agent
        .call(Method::GET, "/v1/kv/k", "")
        .await
        .index
        .expect("index");
    let app = Api::new(
        Router::new()
            .route("/probe", axum::routing::get(probe))
            .with_state(agent.state.clone()),
    );
    let get = |index: u64, body: &str| {
        let request = Request::get(format!("/probe?index={index}&wait=1m"))
            .body(Body::from(body.to_owned()))
            .expect("request");
        tokio::spawn(answer(app.clone(), request))
    };

    let waiting = get(index, "");
    settle().await;
    assert!(!waiting.is_finished(), "answered with its key unchanged");
    assert_eq!(PROBE_RUNS.load(Ordering::SeqCst), 1);
    assert_eq!(
        PROBE_LIVE.load(Ordering::SeqCst),
        0,
        "a handler is suspended"
    );
    assert_eq!(agent.backend.blocking_queries(), (1, 1));

    agent.call(Method::PUT, "/v1/kv/k", "v2").await;
    settle().await;
    let woken = waiting.await.expect("join");
    assert_eq!((woken.status, woken.body.as_str()), (StatusCode::OK, "v2"));
    assert!(woken.index > Some(index), "{woken:?}");
    assert_eq!(PROBE_RUNS.load(Ordering::SeqCst), 2);
    assert_eq!(agent.backend.blocking_queries(), (0, 0));

    let index = woken.index.expect("index");
    let with_body = get(index, "x");
    settle().await;
    assert_eq!(
        PROBE_LIVE.load(Ordering::SeqCst),
        1,
        "a GET with a body was parked"
    );
    agent.call(Method::PUT, "/v1/kv/k", "v3").await;
    settle().await;
    let woken = with_body.await.expect("join");
    assert_eq!((woken.status, woken.body.as_str()), (StatusCode::OK, "v3"));
    assert_eq!(PROBE_RUNS.load(Ordering::SeqCst), 3);
    agent.stop().await;
}

/// The second run resolves the token again: one deleted while its blocking query waited gets
/// no answer (Consul would answer with what the deleted token could read).
#[tokio::test(start_paused = true)]
async fn a_token_deleted_while_its_blocking_get_waits_is_refused_at_the_answer() {
    let agent = Agent::with_acls(DefaultPolicy::Deny);
    agent.init_acls().await;
    let secret = all_but(&agent, Resource::Acl).await;
    let put = agent
        .call_as(Some(&secret), Method::PUT, "/v1/kv/k", "v1")
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let me = agent
        .call_as(Some(&secret), Method::GET, "/v1/acl/token/self", "")
        .await;
    assert_eq!(me.status, StatusCode::OK, "{}", me.body);
    let me: serde_json::Value = serde_json::from_str(&me.body).expect("JSON");
    let accessor = me["AccessorID"].as_str().expect("AccessorID").to_owned();

    let uri = format!("/v1/kv/k?raw&index={}&wait=1m", put_index(&agent).await);
    let waiting = agent.send_as(Some(&secret), Method::GET, &uri, "").await;
    let deleted = agent
        .call_as(
            Some(ROOT),
            Method::DELETE,
            &format!("/v1/acl/token/{accessor}"),
            "",
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    tokio::time::advance(Duration::from_millis(10)).await;
    settle().await;
    assert!(
        !waiting.is_finished(),
        "the token's deletion answered a KV wait"
    );

    agent
        .call_as(Some(ROOT), Method::PUT, "/v1/kv/k", "v2")
        .await;
    settle().await;
    let refused = waiting.await.expect("join");
    assert_eq!(
        (refused.status, refused.body.as_str()),
        (StatusCode::FORBIDDEN, "ACL not found")
    );
    agent.stop().await;
}

/// The index of `k` as the management token reads it.
async fn put_index(agent: &Agent) -> u64 {
    let got = agent.call_as(Some(ROOT), Method::GET, "/v1/kv/k", "").await;
    got.index.expect("index")
}

/// A client that hangs up while its blocking query waits takes the wait on the servers with
/// it; `HEAD` and `?consistent` blocking reads are parked and answered like a GET.
#[tokio::test(start_paused = true)]
async fn a_parked_query_ends_with_its_client_and_every_read_mode_parks() {
    let agent = Agent::start();
    agent.call(Method::PUT, "/v1/kv/k", "v1").await;
    let index = agent
        .call(Method::GET, "/v1/kv/k", "")
        .await
        .index
        .expect("index");

    let gone = agent
        .send(Method::GET, &format!("/v1/kv/k?index={index}&wait=1m"), "")
        .await;
    assert_eq!(agent.backend.blocking_queries(), (1, 1));
    gone.abort();
    settle().await;
    assert_eq!(
        agent.backend.blocking_queries(),
        (0, 0),
        "the wait outlived its client"
    );

    let head = agent
        .send(Method::HEAD, &format!("/v1/kv/k?index={index}&wait=1m"), "")
        .await;
    let consistent = agent
        .send(
            Method::GET,
            &format!("/v1/kv/k?raw&consistent&index={index}&wait=1m"),
            "",
        )
        .await;
    let keys = agent
        .send(
            Method::GET,
            &format!("/v1/kv/?keys&index={index}&wait=1m"),
            "",
        )
        .await;
    assert_eq!(agent.backend.blocking_queries(), (3, 2));
    agent.call(Method::PUT, "/v1/kv/k", "v2").await;
    settle().await;
    let head = head.await.expect("join");
    assert_eq!((head.status, head.body.as_str()), (StatusCode::OK, ""));
    assert!(head.index > Some(index), "{head:?}");
    let consistent = consistent.await.expect("join");
    assert_eq!(
        (consistent.status, consistent.body.as_str()),
        (StatusCode::OK, "v2")
    );
    let keys = keys.await.expect("join");
    assert_eq!(
        (keys.status, keys.body.as_str()),
        (StatusCode::OK, r#"["k"]"#)
    );
    assert_eq!(agent.backend.blocking_queries(), (0, 0));
    agent.stop().await;
}
