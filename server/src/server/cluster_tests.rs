//! Three servers in one process, on loopback QUIC, each behind a UDP relay the test can cut:
//! raft, formation and forwarding as they run in production, without spawning agents. The relay
//! of a server is the address the others know it by; cutting a server drops every datagram to
//! and from it, in both directions, until the links are healed.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::kv::KvOp;
use vigil_shared::operator::OperatorRequest::TransferLeader;
use vigil_shared::rpc::{Consistency, Op, QueryOptions, QueryResult, ReadQuery, Response};
use vigil_wire::tls::{CertificateAuthority, Role};

use super::{Hop, RaftTiming, Server, ServerConfig, ServerMode};
use crate::operator;

/// Far longer than anything here takes; only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// Which servers are cut off, by index, and the addresses their own sockets send from.
struct Links {
    cut: Mutex<BTreeSet<usize>>,
    sockets: Vec<SocketAddr>,
}

impl Links {
    /// Whether a datagram between server `server` and the sender at `peer` is dropped.
    fn drops(&self, server: usize, peer: SocketAddr) -> bool {
        let cut = self.cut.lock();
        cut.contains(&server)
            || self
                .sockets
                .iter()
                .position(|s| *s == peer)
                .is_some_and(|i| cut.contains(&i))
    }
}

/// Relays datagrams from `public` to the socket of server `server` at `target`, through one
/// upstream socket per sender so that the answers find their way back.
async fn relay(public: Arc<UdpSocket>, server: usize, target: SocketAddr, links: Arc<Links>) {
    let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut buf = vec![0; 65_536];
    while let Ok((len, from)) = public.recv_from(&mut buf).await {
        if links.drops(server, from) {
            continue;
        }
        let upstream = match upstreams.get(&from) {
            Some(upstream) => Arc::clone(upstream),
            None => {
                let upstream = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
                tokio::spawn(relay_back(
                    Arc::clone(&upstream),
                    Arc::clone(&public),
                    from,
                    server,
                    Arc::clone(&links),
                ));
                upstreams.insert(from, Arc::clone(&upstream));
                upstream
            }
        };
        let _ = upstream.send_to(&buf[..len], target).await;
    }
}

/// The answers of server `server` to the sender at `to`.
async fn relay_back(
    upstream: Arc<UdpSocket>,
    public: Arc<UdpSocket>,
    to: SocketAddr,
    server: usize,
    links: Arc<Links>,
) {
    let mut buf = vec![0; 65_536];
    while let Ok((len, _)) = upstream.recv_from(&mut buf).await {
        if !links.drops(server, to) {
            let _ = public.send_to(&buf[..len], to).await;
        }
    }
}

struct TestCluster {
    servers: Vec<Arc<Server>>,
    links: Arc<Links>,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    /// Three servers that find each other through a fixed member list and bootstrap together.
    async fn start() -> TestCluster {
        TestCluster::start_with(Duration::from_secs(10)).await
    }

    /// [`TestCluster::start`] with sessions' shortest TTL `session_ttl_min`.
    async fn start_with(session_ttl_min: Duration) -> TestCluster {
        const SERVERS: usize = 3;
        let dir = tempfile::tempdir().expect("temporary directory");
        let ca = CertificateAuthority::generate("vigil").expect("CA");
        let sockets: Vec<std::net::UdpSocket> = (0..SERVERS)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let links = Arc::new(Links {
            cut: Mutex::new(BTreeSet::new()),
            sockets: sockets.iter().map(|s| s.local_addr().unwrap()).collect(),
        });
        let mut members = Vec::new();
        for (i, socket) in links.sockets.iter().enumerate() {
            let public = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
            let rpc_addr = public.local_addr().unwrap();
            tokio::spawn(relay(public, i, *socket, Arc::clone(&links)));
            members.push(MemberStatus {
                name: format!("s{i}"),
                gossip_addr: rpc_addr,
                rpc_addr,
                role: MemberRole::Server,
                datacenter: "dc1".to_owned(),
                state: MemberState::Alive,
                pruned: false,
                protocol: vigil_shared::PROTOCOL,
            });
        }
        let (_, members_rx) = watch::channel(members.clone());
        let mut servers = Vec::new();
        for (member, socket) in members.iter().zip(sockets) {
            let config = ServerConfig {
                node_name: member.name.clone(),
                rpc_addr: member.rpc_addr,
                raft: RaftTiming::local(),
                mode: ServerMode::Cluster {
                    data_dir: dir.path().join(&member.name),
                    bootstrap_expect: SERVERS,
                },
                members: Some(members_rx.clone()),
                session_ttl_min,
                lock_delay_min: Duration::ZERO,
                max_blocking_queries: 16,
                lock_wait_reserve: 2,
                acls: None,
                acl_default_policy: None,
            };
            let tls = ca
                .issue(Role::Server, "dc1", "vigil", Some(&member.name))
                .expect("certificate");
            let server = Server::start(config, &tls, socket, CancellationToken::new())
                .await
                .expect("server starts");
            servers.push(server);
        }
        TestCluster {
            servers,
            links,
            _dir: dir,
        }
    }

    /// The one of `among` that leads, once one does.
    async fn leader(&self, among: &[usize]) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(&i) = among.iter().find(|&&i| self.servers[i].is_leader()) {
                return i;
            }
            assert!(Instant::now() < deadline, "none of {among:?} leads");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Commits `op` through the leader among `among`, retrying what was never applied (no
    /// leader yet, or leadership moved on) as the agent's backend does. Returns the leader.
    async fn commit(&self, among: &[usize], op: Op) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let leader = self.leader(among).await;
            if self.try_commit(leader, &op, deadline).await {
                return leader;
            }
        }
    }

    /// Commits `op` through server `server`, which forwards it when it does not lead, retrying
    /// what was never applied.
    async fn commit_through(&self, server: usize, op: Op) {
        let deadline = Instant::now() + PATIENCE;
        while !self.try_commit(server, &op, deadline).await {}
    }

    /// One attempt of a commit through `server`: true once applied, false (after a pause) when
    /// it was not applied and may be retried before `deadline`.
    async fn try_commit(&self, server: usize, op: &Op, deadline: Instant) -> bool {
        match self.servers[server].write(op.clone()).await {
            Ok(Response::Txn(_) | Response::Done | Response::SessionCreated { .. }) => true,
            Err(e) if e.safe_to_retry(false) && Instant::now() < deadline => {
                tokio::time::sleep(POLL).await;
                false
            }
            other => panic!("{op:?} through s{server}: {other:?}"),
        }
    }

    fn cut(&self, server: usize) {
        self.links.cut.lock().insert(server);
    }

    fn heal(&self) {
        self.links.cut.lock().clear();
    }

    /// The value of `key` in server `server`'s own state, without asking a leader.
    async fn local_value(&self, server: usize, key: &str) -> Option<Vec<u8>> {
        let opts = QueryOptions {
            consistency: Consistency::Stale,
            min_index: 0,
            wait_ms: 0,
        };
        let query = ReadQuery::KvGet {
            key: key.to_owned(),
        };
        match self.servers[server].query(opts, query).await {
            Ok((QueryResult::Entries(entries), _)) => entries.into_iter().next().map(|e| e.value),
            other => panic!("a stale read of {key} on s{server}: {other:?}"),
        }
    }

    /// Waits until server `server` has applied `key` = `value`.
    async fn has(&self, server: usize, key: &str, value: &str) {
        let deadline = Instant::now() + PATIENCE;
        while self.local_value(server, key).await.as_deref() != Some(value.as_bytes()) {
            assert!(Instant::now() < deadline, "s{server} never applied {key}");
            tokio::time::sleep(POLL).await;
        }
    }
}

fn put(key: &str, value: &str) -> Op {
    Op::Kv(vec![KvOp::Set {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        flags: 0,
    }])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_is_replaced_and_nothing_acknowledged_is_lost() {
    let cluster = TestCluster::start().await;
    let all = [0, 1, 2];
    let old = cluster.commit(&all, put("before", "1")).await;

    // Cut off, the leader cannot commit; the other two elect one of themselves, which can.
    cluster.cut(old);
    let rest: Vec<usize> = all.into_iter().filter(|&i| i != old).collect();
    cluster.commit(&rest, put("during", "2")).await;
    let stranded = tokio::time::timeout(
        Duration::from_millis(500),
        cluster.servers[old].write(put("stranded", "3")),
    )
    .await;
    assert!(
        !matches!(stranded, Ok(Ok(_))),
        "a leader without a quorum acknowledged a write: {stranded:?}"
    );

    // Healed, the old leader follows and holds what was acknowledged, and nothing else.
    cluster.heal();
    for server in all {
        cluster.has(server, "before", "1").await;
        cluster.has(server, "during", "2").await;
    }
    for server in all {
        assert_eq!(cluster.local_value(server, "stranded").await, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_writes_and_one_cut_off_catches_up_after_the_heal() {
    let cluster = TestCluster::start().await;
    let all = [0, 1, 2];
    let leader = cluster.commit(&all, put("first", "1")).await;
    let followers: Vec<usize> = all.into_iter().filter(|&i| i != leader).collect();
    let (forwarder, cut) = (followers[0], followers[1]);

    // A follower hands a write to the leader over the client protocol.
    cluster
        .commit_through(forwarder, put("forwarded", "2"))
        .await;

    // With one follower cut off the other two still make a quorum; the cut one hears nothing.
    cluster.cut(cut);
    cluster
        .commit(&[leader, forwarder], put("while-cut", "3"))
        .await;
    cluster.has(forwarder, "while-cut", "3").await;
    assert_eq!(cluster.local_value(cut, "while-cut").await, None);

    // Healed, it receives what it missed.
    cluster.heal();
    cluster.has(cut, "forwarded", "2").await;
    cluster.has(cut, "while-cut", "3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_racing_its_sessions_expiry_is_acknowledged_only_if_the_session_lives_on() {
    // The leader keeps leading with both followers cut off (nobody can win an election) but
    // commits nothing, so a session's TTL expiry leaves its destroy waiting. Renewals asked
    // meanwhile go through as soon as the links heal, racing that destroy: one that is
    // acknowledged must be worth a TTL (the Jepsen plan `rejecting-leader` found sessions gone
    // a second after an acknowledged renewal), one asked too late is told the session is gone.
    let ttl = Duration::from_secs(1);
    let cluster = TestCluster::start_with(ttl).await;
    let all = [0, 1, 2];
    let id = "5e551011-0000-4000-8000-000000000001";
    let node = Op::RegisterNode {
        name: "app".to_owned(),
        address: "127.0.0.1".to_owned(),
    };
    cluster.commit(&all, node).await;
    let session = vigil_shared::session::Session {
        id: id.to_owned(),
        node: "app".to_owned(),
        ttl: "1s".to_owned(),
        ..Default::default()
    };
    let leader = cluster.commit(&all, Op::CreateSession(session)).await;
    for i in all.into_iter().filter(|&i| i != leader) {
        cluster.cut(i);
    }
    // Past TTL × 2 without a renewal: the leader's timer has fired and its destroy waits.
    let cut_until = Instant::now() + ttl * 2 + ttl / 2;
    let server = Arc::clone(&cluster.servers[leader]);
    let renewal = tokio::spawn(async move {
        tokio::time::sleep_until(cut_until).await;
        loop {
            match server.renew_session(id).await {
                Ok(_) => return Some(Instant::now()),
                Err(super::ServerError::SessionNotFound(_)) => return None,
                Err(e) if e.safe_to_retry(false) => tokio::time::sleep(POLL).await,
                Err(e) => panic!("renewing: {e:?}"),
            }
        }
    });
    tokio::time::sleep_until(cut_until).await;
    cluster.heal();
    let renewed = renewal.await.expect("renewal task");
    let alive = || {
        let server = &cluster.servers[leader];
        server.shared().read().sessions().get(id).is_some()
    };
    match renewed {
        Some(at) => {
            // Acknowledged: the session lives at least a TTL past it.
            while Instant::now() < at + ttl * 9 / 10 {
                assert!(
                    alive(),
                    "gone {:?} after an acknowledged renewal",
                    at.elapsed()
                );
                tokio::time::sleep(POLL).await;
            }
        }
        None => {
            let deadline = Instant::now() + PATIENCE;
            while alive() {
                assert!(
                    Instant::now() < deadline,
                    "refused renewal, session never went"
                );
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_op_bound_to_a_term_commits_in_no_later_term_of_the_same_leader() {
    // A leader's duties decide in a term (a TTL expiry, a checkpoint); an op that waited out
    // that term must not be appended by the same server leading again, which has acknowledged
    // renewals since.
    let cluster = TestCluster::start().await;
    let leader = cluster.leader(&[0, 1, 2]).await;
    let server = Arc::clone(&cluster.servers[leader]);
    let raft = server.proposer().raft().clone();
    let term_of = |raft: &crate::raft::Raft| {
        use openraft::async_runtime::WatchReceiver as _;
        *raft.metrics().borrow_watched().vote.leader_id()
    };
    let old = term_of(&raft);
    // Leadership goes to another server and comes back: a later term of the same leader.
    let other = (leader + 1) % 3;
    for (from, to) in [(leader, other), (other, leader)] {
        let to_id = Some(cluster.servers[to].node_id());
        let transfer = operator::handle(
            &cluster.servers[from],
            TransferLeader { to: to_id },
            Hop::Caller,
        );
        transfer.await.expect("leadership transferred");
        cluster.leader(&[to]).await;
    }
    assert_ne!(term_of(&raft), old);
    let register = |name: &str| Op::RegisterNode {
        name: name.to_owned(),
        address: "127.0.0.1".to_owned(),
    };
    let stale = server
        .proposer()
        .bound_to(old)
        .propose(register("stale"))
        .await;
    assert!(
        matches!(stale, Err(super::ServerError::NotLeader { .. })),
        "{stale:?}"
    );
    // Bound to the term it leads under now, an op commits (another election meanwhile, on a
    // loaded machine, is retried).
    let deadline = Instant::now() + PATIENCE;
    loop {
        cluster.leader(&[leader]).await;
        let current = server.proposer().bound_to(term_of(&raft));
        match current.propose(register("current")).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "{e:?}"),
        }
    }
    let state = server.shared().read();
    assert!(state.catalog().node("current").is_some());
    assert!(
        state.catalog().node("stale").is_none(),
        "the stale op stayed out"
    );
}
