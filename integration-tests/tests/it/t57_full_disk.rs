//! A leader whose disk fills up: its raft stops, the process exits non-zero instead of going on
//! claiming leadership, the other servers elect a leader, and writes through a client agent
//! succeed there within an election; once there is room again the server restarts and catches
//! up. Each server's data directory is a tmpfs here, so "full" is a size we choose (this needs
//! root, as CI has; without it the test says why it did nothing).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Http, eventually};
use reqwest::StatusCode;
use tokio::time::Instant;

use crate::common::exclusive;

const ROOMY: &str = "256m";
/// What a write through the client agent may take once the full leader is gone.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

fn mount_tmpfs(dir: &Path, size: &str) -> bool {
    Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

fn resize_tmpfs(dir: &Path, size: &str) {
    let status = Command::new("mount")
        .args(["-o", &format!("remount,size={size}")])
        .arg(dir)
        .status()
        .expect("run mount");
    assert!(status.success(), "remount {} to {size}", dir.display());
}

/// Bytes used on the filesystem of `dir`.
fn used_bytes(dir: &Path) -> u64 {
    let output = Command::new("df")
        .args(["--output=used", "-B1"])
        .arg(dir)
        .output()
        .expect("run df");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df output")
}

/// Waits until a PUT of `path` through `agent` succeeds, within [`FAILOVER_LIMIT`].
async fn write_eventually(agent: &Http, path: &str, what: &str) {
    eventually(FAILOVER_LIMIT, what, || async {
        let reply = agent
            .try_request(reqwest::Method::PUT, path, Some(b"x".to_vec()))
            .await
            .ok()?;
        (reply.status == StatusCode::OK).then_some(())
    })
    .await;
}

/// Unmounts the tmpfs data directories when the test ends, however it ends.
struct Mounts(Vec<std::path::PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
    }
}

/// Moves server `i`'s data directory onto a tmpfs mounted in its place.
fn onto_tmpfs(cluster: &Cluster, i: usize) -> Option<std::path::PathBuf> {
    let data = cluster.dir().join(format!("s{i}-data"));
    let saved = cluster.dir().join(format!("s{i}-data.saved"));
    std::fs::rename(&data, &saved).unwrap();
    std::fs::create_dir(&data).unwrap();
    if !mount_tmpfs(&data, ROOMY) {
        std::fs::remove_dir(&data).unwrap();
        std::fs::rename(&saved, &data).unwrap();
        return None;
    }
    copy_tree(&saved, &data);
    Some(data)
}

/// Copies the files under `from` into `to`, directories included (the raft log is one).
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_with_a_full_disk_gives_way() {
    let _heavy = exclusive().await;
    // Phase 1: three servers and a client agent; then every server's data moves to a tmpfs.
    let mut cluster = Cluster::servers(3).clients(1).start().await;
    for i in 0..3 {
        cluster.kill9(i).await;
    }
    let mut mounts = Mounts(Vec::new());
    for i in 0..3 {
        match onto_tmpfs(&cluster, i) {
            Some(dir) => mounts.0.push(dir),
            None => {
                eprintln!("t57: skipped: cannot mount a tmpfs here (needs root)");
                return;
            }
        }
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    let agent = cluster.client(0).http();
    write_eventually(&agent, "/v1/kv/before", "a write through the client agent").await;

    // Phase 2: the leader's disk is made all but full.
    let full = cluster.leader().await;
    let dir = &mounts.0[full];
    let room = used_bytes(dir) + 512 * 1024;
    resize_tmpfs(dir, &room.to_string());

    // Phase 3: writes through the client agent go on; the full leader's raft stops and its
    // process exits non-zero rather than going on as a leader that cannot write.
    let value = vec![b'v'; 100_000];
    let started = Instant::now();
    let mut n = 0;
    let status = loop {
        if let Some(status) = cluster.exited(full) {
            break status;
        }
        assert!(
            started.elapsed() < FAILOVER_LIMIT,
            "the full leader is still up"
        );
        let _ = agent
            .try_request(
                reqwest::Method::PUT,
                &format!("/v1/kv/fill/{n}"),
                Some(value.clone()),
            )
            .await;
        n += 1;
    };
    assert_eq!(status.code(), Some(1), "{status}");
    let failed_at = Instant::now();
    write_eventually(&agent, "/v1/kv/after", "a write on the new leader").await;
    eprintln!(
        "t57: writes through the client agent succeed {:?} after the full leader stopped",
        failed_at.elapsed()
    );
    let leader = cluster.leader().await;
    assert_ne!(leader, full);

    // Phase 4: with room again the server restarts, rejoins and catches up.
    resize_tmpfs(dir, ROOMY);
    cluster.restart(full).await;
    let reply = cluster.server(leader).get("/v1/kv/after").await;
    let index = reply.index();
    eventually(
        FAILOVER_LIMIT,
        "the restarted server to catch up",
        || async {
            let reply = cluster.server(full).try_get("/v1/kv/after?stale").await?;
            (reply.status == StatusCode::OK && reply.index() >= index).then_some(())
        },
    )
    .await;
}
