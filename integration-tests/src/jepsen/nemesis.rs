//! The nemesis: faults on a cluster of real processes on loopback, drawn from a seed. Kill -9
//! and restart of the leader, a follower or a client agent; SIGSTOP of each for a few seconds;
//! one server cut off from the other two (iptables rules on its RPC and gossip ports, both
//! ways, removed when the fault heals or the run ends); the leader's ports refusing every
//! datagram, as a firewall's `REJECT` makes them (alive, but to the others like a dead process);
//! a server whose data directory (a tmpfs) fills up. Partitions, refusals and full disks need
//! root; without it they are left out and the report says so.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::safety::register::AgentBoard;
use crate::safety::schedule::Rng;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    KillLeader,
    KillFollower,
    KillClient,
    PauseLeader,
    PauseFollower,
    PauseClient,
    /// One server (the leader half the time) cut off from the other two.
    Partition,
    /// One server's disk full.
    FullDisk,
    /// The leader's RPC and gossip ports refuse every datagram (a firewall's `REJECT`) while
    /// the leader runs on: to the others it looks like a dead process, which a failover on
    /// evidence must not take as licence to let it answer from its old term.
    RejectLeader,
}

impl Fault {
    /// What CI's plan injects: every fault but [`Fault::RejectLeader`], which has a plan of
    /// its own.
    pub const ALL: [Fault; 8] = [
        Fault::KillLeader,
        Fault::KillFollower,
        Fault::KillClient,
        Fault::PauseLeader,
        Fault::PauseFollower,
        Fault::PauseClient,
        Fault::Partition,
        Fault::FullDisk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::KillFollower => "kill-follower",
            Fault::KillClient => "kill-client",
            Fault::PauseLeader => "pause-leader",
            Fault::PauseFollower => "pause-follower",
            Fault::PauseClient => "pause-client",
            Fault::Partition => "partition",
            Fault::FullDisk => "full-disk",
            Fault::RejectLeader => "reject-leader",
        }
    }

    /// Whether the fault needs root here (iptables, mounting a tmpfs).
    pub fn needs_root(self) -> bool {
        matches!(
            self,
            Fault::Partition | Fault::FullDisk | Fault::RejectLeader
        )
    }
}

/// One step of a schedule: a quiet gap, then `fault` held for `hold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub gap: Duration,
    pub fault: Fault,
    pub hold: Duration,
    /// Drawn with the schedule, so the target is part of the seed: which server or client
    /// agent among those the fault may hit.
    pub pick: u64,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "after {:.1}s {} for {:.1}s (pick {})",
            self.gap.as_secs_f64(),
            self.fault.name(),
            self.hold.as_secs_f64(),
            self.pick
        )
    }
}

/// The steps for `seed`: faults of `kinds` (round-robin from a seeded start, so every kind
/// comes up), gaps of 1-3 s and holds of 2-6 s, until they fill `span`.
pub fn schedule(seed: u64, kinds: &[Fault], span: Duration) -> Vec<Step> {
    if kinds.is_empty() {
        return Vec::new();
    }
    let mut rng = Rng::new(seed);
    let offset = rng.below(kinds.len() as u64) as usize;
    let mut steps = Vec::new();
    let mut total = Duration::ZERO;
    for n in 0.. {
        let gap = rng.between(Duration::from_secs(1), Duration::from_secs(3));
        let hold = rng.between(Duration::from_secs(2), Duration::from_secs(6));
        let pick = rng.next_u64();
        total += gap + hold;
        if total > span && !steps.is_empty() {
            break;
        }
        steps.push(Step {
            gap,
            fault: kinds[(offset + n) % kinds.len()],
            hold,
            pick,
        });
    }
    steps
}

/// Whether this process may change iptables rules and mount filesystems (it runs as root:
/// `/proc/self` belongs to the process's user).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The cluster the nemesis works on, the board of HTTP addresses the clients use (servers
/// first, then client agents), and the tmpfs data directories when there are.
pub struct Nemesis<'a> {
    cluster: &'a mut Cluster,
    board: AgentBoard,
    tmpfs: Vec<PathBuf>,
    rules: Rules,
}

/// A data directory's tmpfs size with room to spare.
const ROOMY: &str = "256m";

impl<'a> Nemesis<'a> {
    /// Takes `cluster` over. With `full_disk`, first moves every server's data directory onto
    /// a tmpfs of its own (restarting the servers); returns `None` for the tmpfs part when it
    /// cannot mount one.
    pub async fn new(cluster: &'a mut Cluster, board: AgentBoard, full_disk: bool) -> Nemesis<'a> {
        let mut nemesis = Nemesis {
            cluster,
            board,
            tmpfs: Vec::new(),
            rules: Rules::default(),
        };
        if full_disk {
            nemesis.onto_tmpfs().await;
        }
        nemesis
    }

    /// Whether the servers' data directories are tmpfs mounts (so a disk can fill up).
    pub fn has_tmpfs(&self) -> bool {
        !self.tmpfs.is_empty()
    }

    pub fn cluster(&self) -> &Cluster {
        self.cluster
    }

    async fn onto_tmpfs(&mut self) {
        let servers = self.cluster.servers.len();
        for i in 0..servers {
            self.cluster.kill9(i).await;
        }
        let mut mounted = Vec::new();
        for i in 0..servers {
            let data = self.cluster.dir().join(format!("s{i}-data"));
            let saved = self.cluster.dir().join(format!("s{i}-data.saved"));
            std::fs::rename(&data, &saved).expect("move the data directory aside");
            std::fs::create_dir(&data).expect("create the mount point");
            if !mount_tmpfs(&data, ROOMY) {
                std::fs::remove_dir(&data).expect("remove the mount point");
                std::fs::rename(&saved, &data).expect("move the data directory back");
                break;
            }
            copy_tree(&saved, &data);
            mounted.push(data);
        }
        if mounted.len() == servers {
            self.tmpfs = mounted;
        } else {
            for dir in mounted {
                unmount(&dir);
            }
        }
        for i in 0..servers {
            self.cluster.restart(i).await;
            self.board
                .set(i, Some(self.cluster.server(i).http().url("")));
        }
        self.cluster.leader().await;
    }

    /// Applies `step`, holds it, heals it; returns what it hit (`None`: skipped, and why).
    pub async fn apply(&mut self, step: &Step) -> Result<String, String> {
        let servers = self.cluster.servers.len();
        let leader = self.cluster.leader_within(Duration::from_secs(20)).await;
        let follower = {
            let others: Vec<usize> = (0..servers).filter(|&i| i != leader).collect();
            others[(step.pick % others.len() as u64) as usize]
        };
        let client = (step.pick % self.cluster.clients.len() as u64) as usize;
        // A server partitions and full disks hit: the leader half the time.
        let either = if step.pick.is_multiple_of(2) {
            leader
        } else {
            follower
        };
        match step.fault {
            Fault::KillLeader | Fault::KillFollower => {
                let i = if step.fault == Fault::KillLeader {
                    leader
                } else {
                    follower
                };
                self.board.set(i, None);
                self.cluster.kill9(i).await;
                tokio::time::sleep(step.hold).await;
                self.cluster.restart(i).await;
                self.board
                    .set(i, Some(self.cluster.server(i).http().url("")));
                Ok(format!("server s{i}"))
            }
            Fault::KillClient => {
                let slot = servers + client;
                self.board.set(slot, None);
                self.cluster.kill9_client(client).await;
                tokio::time::sleep(step.hold).await;
                self.cluster.restart_client(client).await;
                let url = self.cluster.client(client).http().url("");
                self.board.set(slot, Some(url));
                Ok(format!("client c{client}"))
            }
            Fault::PauseLeader | Fault::PauseFollower => {
                let i = if step.fault == Fault::PauseLeader {
                    leader
                } else {
                    follower
                };
                self.cluster.pause(i);
                tokio::time::sleep(step.hold).await;
                self.cluster.resume(i);
                Ok(format!("server s{i}"))
            }
            Fault::PauseClient => {
                self.cluster.pause_client(client);
                tokio::time::sleep(step.hold).await;
                self.cluster.resume_client(client);
                Ok(format!("client c{client}"))
            }
            Fault::Partition => {
                let i = either;
                self.partition(i)?;
                tokio::time::sleep(step.hold).await;
                self.rules.clear();
                Ok(format!("server s{i} cut off"))
            }
            Fault::RejectLeader => {
                self.rules
                    .reject_to(self.cluster.server_rpc(leader).port())?;
                self.rules
                    .reject_to(self.cluster.server_serf(leader).port())?;
                tokio::time::sleep(step.hold).await;
                self.rules.clear();
                Ok(format!("server s{leader} refusing"))
            }
            Fault::FullDisk => {
                let i = either;
                let Some(dir) = self.tmpfs.get(i).cloned() else {
                    return Err("no tmpfs data directories".to_owned());
                };
                let room = used_bytes(&dir) + 256 * 1024;
                resize_tmpfs(&dir, &room.to_string());
                tokio::time::sleep(step.hold).await;
                resize_tmpfs(&dir, ROOMY);
                // A server whose log failed exits (as etcd does); it comes back once there is room.
                if self.cluster.exited(i).is_some() {
                    self.board.set(i, None);
                    self.cluster.restart(i).await;
                    self.board
                        .set(i, Some(self.cluster.server(i).http().url("")));
                    return Ok(format!("server s{i} (exited, restarted)"));
                }
                Ok(format!("server s{i}"))
            }
        }
    }

    /// Drops every UDP packet between server `i`'s ports and the other servers' ports.
    fn partition(&mut self, i: usize) -> Result<(), String> {
        let ports = |j: usize| {
            [
                self.cluster.server_rpc(j).port(),
                self.cluster.server_serf(j).port(),
            ]
        };
        let mine = ports(i);
        for j in (0..self.cluster.servers.len()).filter(|&j| j != i) {
            for a in mine {
                for b in ports(j) {
                    self.rules.drop_between(a, b)?;
                }
            }
        }
        Ok(())
    }

    /// Every fault healed: rules removed, paused processes resumed, stopped servers started.
    pub async fn heal(&mut self) {
        self.rules.clear();
        for i in 0..self.cluster.servers.len() {
            if self.cluster.servers[i].is_running() {
                self.cluster.resume(i);
            } else {
                self.cluster.restart(i).await;
                self.board
                    .set(i, Some(self.cluster.server(i).http().url("")));
            }
        }
        for c in 0..self.cluster.clients.len() {
            if self.cluster.clients[c].is_running() {
                self.cluster.resume_client(c);
            }
        }
        for dir in &self.tmpfs {
            resize_tmpfs(dir, ROOMY);
        }
    }
}

impl Drop for Nemesis<'_> {
    fn drop(&mut self) {
        self.rules.clear();
        for dir in &self.tmpfs {
            unmount(dir);
        }
    }
}

/// iptables rules this run added, removed on [`Rules::clear`] (and on drop).
#[derive(Debug, Default)]
struct Rules(Vec<Vec<String>>);

impl Rules {
    /// Drops UDP on loopback from port `a` to port `b` and back.
    fn drop_between(&mut self, a: u16, b: u16) -> Result<(), String> {
        for (from, to) in [(a, b), (b, a)] {
            self.add(&[
                "--sport",
                &from.to_string(),
                "--dport",
                &to.to_string(),
                "-j",
                "DROP",
            ])?;
        }
        Ok(())
    }

    /// Refuses every UDP datagram to port `port` on loopback with ICMP port unreachable, as
    /// a closed port would.
    fn reject_to(&mut self, port: u16) -> Result<(), String> {
        self.add(&["--dport", &port.to_string(), "-j", "REJECT"])
    }

    /// Inserts the rule for outgoing UDP on loopback that `matching` completes.
    fn add(&mut self, matching: &[&str]) -> Result<(), String> {
        let rule: Vec<String> = ["OUTPUT", "-o", "lo", "-p", "udp"]
            .iter()
            .chain(matching)
            .map(|s| s.to_string())
            .collect();
        iptables("-I", &rule)?;
        self.0.push(rule);
        Ok(())
    }

    fn clear(&mut self) {
        for rule in self.0.drain(..) {
            if let Err(e) = iptables("-D", &rule) {
                eprintln!("jepsen: removing an iptables rule: {e}");
            }
        }
    }
}

impl Drop for Rules {
    fn drop(&mut self) {
        self.clear();
    }
}

fn iptables(action: &str, rule: &[String]) -> Result<(), String> {
    let status = Command::new("iptables")
        .arg(action)
        .args(rule)
        .status()
        .map_err(|e| format!("running iptables: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("iptables {action} {} failed", rule.join(" ")))
}

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
    let ok = Command::new("mount")
        .args(["-o", &format!("remount,size={size}")])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("jepsen: resizing {} to {size} failed", dir.display());
    }
}

fn unmount(dir: &Path) {
    let _ = Command::new("umount").arg("-l").arg(dir).status();
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
        .unwrap_or(0)
}

/// Copies the files of `from`, and of its directories (the raft log's), into `to`.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read a data directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            std::fs::create_dir(&target).expect("create a directory");
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy a file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_that_covers_every_kind() {
        let span = Duration::from_secs(120);
        let a = schedule(7, &Fault::ALL, span);
        assert_eq!(a, schedule(7, &Fault::ALL, span));
        assert_ne!(a, schedule(8, &Fault::ALL, span));
        for kind in Fault::ALL {
            assert!(a.iter().any(|s| s.fault == kind), "{kind:?} in {a:?}");
        }
        let total: Duration = a.iter().map(|s| s.gap + s.hold).sum();
        assert!(total <= span + Duration::from_secs(9));
    }
}
