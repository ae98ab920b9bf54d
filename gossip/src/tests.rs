//! Real-socket tests: several gossip instances in one process on 127.0.0.1 with the Local
//! profile, each with its own shutdown token, waiting on conditions with deadlines (never a
//! bare sleep).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};

use super::*;

const DC: &str = "dc1";

struct Instance {
    gossip: Gossip,
    shutdown: CancellationToken,
}

fn config(name: &str, join: Vec<SocketAddr>, keyring: Option<Keyring>, dc: &str) -> GossipConfig {
    GossipConfig {
        name: name.into(),
        bind_addr: "127.0.0.1:0".parse().unwrap(),
        advertise_addr: None,
        role: MemberRole::Server,
        rpc_addr: "127.0.0.1:8300".parse().unwrap(),
        datacenter: dc.into(),
        join,
        keyring,
        keyring_file: None,
        profile: TimingProfile::Local,
    }
}

/// The instances of one test: each stops with `root` (or alone, with its own child token), and
/// their tasks are tracked to check that none outlives the shutdown.
struct Cluster {
    root: CancellationToken,
    tasks: TaskTracker,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            root: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    async fn spawn(&self, config: GossipConfig) -> Instance {
        let shutdown = self.root.child_token();
        let gossip = start(config, shutdown.clone(), &self.tasks)
            .await
            .expect("start");
        Instance { gossip, shutdown }
    }

    /// a, and b joined through it, once a sees both Alive; with the seed to join a through.
    async fn pair(&self, keyring: Option<Keyring>) -> (Instance, Instance, Vec<SocketAddr>) {
        let a = self.spawn(config("a", vec![], keyring.clone(), DC)).await;
        let seed = vec![a.gossip.local_addr()];
        let b = self.spawn(config("b", seed.clone(), keyring, DC)).await;
        wait_alive(&a.gossip, Duration::from_secs(5), "a sees b", &["a", "b"]).await;
        (a, b, seed)
    }

    async fn stop_all(self) {
        self.root.cancel();
        self.tasks.close();
        tokio::time::timeout(Duration::from_secs(5), self.tasks.wait())
            .await
            .expect("every gossip task stops on shutdown");
    }
}

fn state_of(list: &[MemberStatus], name: &str) -> Option<MemberState> {
    list.iter().find(|m| m.name == name).map(|m| m.state)
}

/// Waits until `cond` holds for `gossip`'s member list; panics with the list after `limit`.
async fn wait_members(
    gossip: &Gossip,
    limit: Duration,
    what: &str,
    cond: impl Fn(&[MemberStatus]) -> bool,
) -> Duration {
    let start = Instant::now();
    let mut rx = gossip.subscribe();
    let waited = tokio::time::timeout(limit, rx.wait_for(|l| cond(l))).await;
    match waited {
        Ok(Ok(_)) => start.elapsed(),
        _ => panic!(
            "{what}: not within {limit:?}; members: {:#?}",
            gossip.members()
        ),
    }
}

/// Waits until `gossip` sees every one of `names` Alive.
async fn wait_alive(gossip: &Gossip, limit: Duration, what: &str, names: &[&str]) {
    wait_members(gossip, limit, what, |list| {
        names
            .iter()
            .all(|n| state_of(list, n) == Some(MemberState::Alive))
    })
    .await;
}

/// Three members that join through the first, one crash, one graceful leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_join_detect_a_crash_and_see_a_leave() {
    let cluster = Cluster::new();

    // Phase 1: a, b, c join through a and see each other (and themselves) Alive.
    let a = cluster.spawn(config("a", vec![], None, DC)).await;
    let seed = vec![a.gossip.local_addr()];
    let b = cluster.spawn(config("b", seed.clone(), None, DC)).await;
    let c = cluster.spawn(config("c", seed, None, DC)).await;
    for i in [&a, &b, &c] {
        wait_alive(&i.gossip, Duration::from_secs(10), "join", &["a", "b", "c"]).await;
    }
    let me = a.gossip.members();
    assert_eq!(me.len(), 3);
    assert!(
        me.iter()
            .all(|m| m.datacenter == DC && m.role == MemberRole::Server)
    );

    // Phase 2: c stops without leaving; a and b report it Failed within a bound.
    c.shutdown.cancel();
    let crashed = Instant::now();
    for i in [&a, &b] {
        wait_members(&i.gossip, Duration::from_secs(10), "crash detected", |l| {
            state_of(l, "c") == Some(MemberState::Failed)
        })
        .await;
    }
    let detected = crashed.elapsed();
    // A live member cannot be forced out.
    assert!(matches!(
        a.gossip.force_leave("b", false).await,
        Err(GossipError::NotFailed {
            state: MemberState::Alive,
            ..
        })
    ));
    eprintln!(
        "real sockets (Local): a crash was reported Failed by both survivors after {detected:?}"
    );
    assert!(detected < Duration::from_secs(5), "took {detected:?}");

    // Phase 3: b leaves gracefully; a reports it Left, not Failed.
    let leave_started = Instant::now();
    b.gossip.leave().await.expect("leave");
    let linger = leave_started.elapsed();
    assert!(linger <= TimingProfile::Local.leave_linger() + Duration::from_millis(300));
    let seen = wait_members(&a.gossip, Duration::from_secs(5), "leave seen", |l| {
        state_of(l, "b") == Some(MemberState::Left)
    })
    .await;
    eprintln!("real sockets (Local): graceful leave took {linger:?}, reported Left after {seen:?}");
    assert_eq!(state_of(&b.gossip.members(), "b"), Some(MemberState::Left));
    assert!(matches!(
        b.gossip.join(a.gossip.local_addr()).await,
        Err(GossipError::Stopped)
    ));

    // Phase 4: force-leave moves the crashed c from Failed to Left.
    a.gossip
        .force_leave("c", false)
        .await
        .expect("force-leave c");
    assert_eq!(state_of(&a.gossip.members(), "c"), Some(MemberState::Left));
    let pruned = |members: &[MemberStatus]| members.iter().any(|m| m.name == "c" && m.pruned);
    assert!(!pruned(&a.gossip.members()));
    // Force-leave with prune, after a plain one: c stays Left (the leader deregisters it) and
    // is marked pruned, so it is no longer listed.
    a.gossip.force_leave("c", true).await.expect("prune c");
    assert!(pruned(&a.gossip.members()));
    assert_eq!(state_of(&a.gossip.members(), "c"), Some(MemberState::Left));
    assert!(matches!(
        a.gossip.force_leave("nobody", false).await,
        Err(GossipError::UnknownMember { .. })
    ));
    assert_eq!(a.gossip.decrypt_failures(), 0);

    cluster.stop_all().await;
}

/// A member whose process is gone (its port closed) is refused by the kernel: with the error
/// queue read, the survivors declare it down before a suspicion could even expire.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_down_before_the_suspicion_timeout() {
    let cluster = Cluster::new();
    let names = ["a", "b", "c", "d"];
    let a = cluster.spawn(config("a", vec![], None, DC)).await;
    let seed = vec![a.gossip.local_addr()];
    let mut others = Vec::new();
    for name in &names[1..] {
        others.push(cluster.spawn(config(name, seed.clone(), None, DC)).await);
    }
    for i in std::iter::once(&a).chain(&others) {
        wait_alive(&i.gossip, Duration::from_secs(10), "join", &names).await;
    }

    // d's task stops and its socket closes; nothing told anyone.
    let d = others.pop().expect("d");
    d.shutdown.cancel();
    let killed = Instant::now();
    let suspicion = TimingProfile::Local.suspect_to_down_after(names.len());
    for i in std::iter::once(&a).chain(&others) {
        wait_members(&i.gossip, Duration::from_secs(10), "d seen down", |l| {
            state_of(l, "d") == Some(MemberState::Failed)
        })
        .await;
    }
    let detected = killed.elapsed();
    eprintln!(
        "real sockets (Local): a closed port was reported Failed by all survivors after \
         {detected:?} (suspicion timeout alone: {suspicion:?})"
    );
    assert!(
        detected < suspicion,
        "down after {detected:?}: not by evidence (suspicion alone takes {suspicion:?})"
    );
    for i in std::iter::once(&a).chain(&others) {
        let list = i.gossip.members();
        for name in &names[..3] {
            assert_eq!(state_of(&list, name), Some(MemberState::Alive), "{name}");
        }
    }
    cluster.stop_all().await;
}

/// join() to a live address succeeds; to a silent one it times out with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_waits_for_the_member_or_times_out() {
    let cluster = Cluster::new();
    let key = Keyring::new(Key::from_base64(&generate_key()).unwrap());
    let a = cluster
        .spawn(config("a", vec![], Some(key.clone()), DC))
        .await;
    let b = cluster.spawn(config("b", vec![], Some(key), DC)).await;

    b.gossip.join(a.gossip.local_addr()).await.expect("join a");
    wait_alive(&a.gossip, Duration::from_secs(5), "a sees b", &["a", "b"]).await;
    assert!(matches!(
        b.gossip.join(b.gossip.local_addr()).await,
        Err(GossipError::JoinSelf(_))
    ));

    // Nobody listens here (a bound-then-closed port).
    let silent = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = b.gossip.join(silent).await.unwrap_err();
    assert!(matches!(err, GossipError::JoinTimeout { .. }), "{err}");

    cluster.stop_all().await;
}

/// A member with another key never gets in; the packets it sends are counted as failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_key_cannot_join() {
    let cluster = Cluster::new();
    let key = Keyring::new(Key::from_base64(&generate_key()).unwrap());
    let other_key = Keyring::new(Key::from_base64(&generate_key()).unwrap());
    let (a, b, seed) = cluster.pair(Some(key)).await;

    // Intruders: one with a different key, one with no key at all. Both keep announcing.
    let wrong = cluster
        .spawn(config("wrong", seed.clone(), Some(other_key), DC))
        .await;
    let clear = cluster.spawn(config("clear", seed, None, DC)).await;
    let err = wrong.gossip.join(a.gossip.local_addr()).await.unwrap_err();
    assert!(matches!(err, GossipError::JoinTimeout { .. }), "{err}");

    let deadline = Instant::now() + Duration::from_secs(5);
    while a.gossip.decrypt_failures() < 3 {
        assert!(
            Instant::now() < deadline,
            "a never counted the intruders' packets"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in [&a, &b] {
        let list = i.gossip.members();
        assert_eq!(state_of(&list, "wrong"), None, "{list:#?}");
        assert_eq!(state_of(&list, "clear"), None, "{list:#?}");
    }
    assert_eq!(wrong.gossip.members().len(), 1);
    assert_eq!(clear.gossip.members().len(), 1);
    // a never answers the intruders, so nothing reaches them to fail.
    assert_eq!(wrong.gossip.decrypt_failures(), 0);

    cluster.stop_all().await;
}

/// A member of another datacenter is neither reported nor counted, on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_datacenter_is_ignored() {
    let cluster = Cluster::new();
    let (a, b, seed) = cluster.pair(None).await;

    let far = cluster.spawn(config("far", seed, None, "dc2")).await;
    let err = far.gossip.join(a.gossip.local_addr()).await.unwrap_err();
    assert!(matches!(err, GossipError::JoinTimeout { .. }), "{err}");
    for i in [&a, &b] {
        assert_eq!(state_of(&i.gossip.members(), "far"), None);
        assert_eq!(i.gossip.members().len(), 2);
    }
    assert!(a.gossip.foreign_datacenter_drops() > 0);
    assert_eq!(a.gossip.decrypt_failures(), 0);
    assert_eq!(far.gossip.members().len(), 1);

    cluster.stop_all().await;
}

/// Key rotation through the gossip handle: every step reaches both members, each keeps its
/// ring in its keyring file, and a member restarted with the old key configured comes back
/// with its saved ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_and_the_ring_survives_a_restart() {
    let cluster = Cluster::new();
    let dir = tempfile::tempdir().unwrap();
    let key = || Key::from_base64(&generate_key()).unwrap();
    let (old, new) = (key(), key());
    let raw = |k: &Key| k.to_base64();
    let with_file = |name: &str, join: Vec<SocketAddr>| GossipConfig {
        keyring_file: Some(KeyringFile::in_data_dir(&dir.path().join(name))),
        ..config(name, join, Some(Keyring::new(old.clone())), DC)
    };
    let a = cluster.spawn(with_file("a", vec![])).await;
    let seed = vec![a.gossip.local_addr()];
    let b = cluster.spawn(with_file("b", seed.clone())).await;
    wait_alive(&a.gossip, Duration::from_secs(5), "join", &["a", "b"]).await;

    // Install, use, remove: both members answer each step.
    let bytes = |k: &Key| {
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, raw(k)).unwrap()
    };
    for op in [
        KeyOp::Install(bytes(&new)),
        KeyOp::Use(bytes(&new)),
        KeyOp::Remove(bytes(&old)),
    ] {
        let answer = a.gossip.keyring(op).await.expect("gossip runs");
        assert_eq!((answer.error(), answer.num_nodes), (None, 2), "{answer:?}");
    }
    let listed = b.gossip.keyring(KeyOp::List).await.expect("gossip runs");
    let only_new = std::collections::BTreeMap::from([(raw(&new), 2)]);
    assert_eq!((&listed.keys, &listed.primary_keys), (&only_new, &only_new));

    // b restarts with the old key configured: its file wins, and it is back with a.
    b.shutdown.cancel();
    wait_members(&a.gossip, Duration::from_secs(10), "b down", |l| {
        state_of(l, "b") == Some(MemberState::Failed)
    })
    .await;
    let b = cluster.spawn(with_file("b", seed)).await;
    for i in [&a, &b] {
        wait_alive(&i.gossip, Duration::from_secs(10), "b back", &["a", "b"]).await;
    }
    let listed = a.gossip.keyring(KeyOp::List).await.expect("gossip runs");
    assert_eq!((listed.error(), &listed.keys), (None, &only_new));

    cluster.stop_all().await;
}
