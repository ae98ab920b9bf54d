//! Running a command while a lock is held, shared by `vigil lock` and `vigil elect`. The child
//! runs in its own process group with the sequencer in its environment. Terminating signals sent
//! to `vigil` (TERM, INT, HUP, QUIT) are forwarded to the whole group; if the lock is lost the
//! group gets SIGTERM, then SIGKILL once the grace period is over. The lock is released when the
//! child exits.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use vigil_client::Held;

/// Exit status when the lock was lost while the child ran (and the child was terminated).
/// Consul's `consul lock` exits 0 here; a distinct status lets a supervisor tell "work cut short,
/// retry" (EX_TEMPFAIL) from success.
pub const EXIT_LOST: i32 = 75;
/// Exit status when the command could not be executed (as shells report it).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit status when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// How often the group is polled while it is being terminated.
const POLL: Duration = Duration::from_millis(20);

/// The terminating signals `vigil` catches (and forwards while a child runs).
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; do it first, so a signal while waiting for the lock is seen.
    pub fn install() -> anyhow::Result<Signals> {
        let install = |kind| signal(kind).context("installing signal handlers");
        Ok(Signals {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
            hup: install(SignalKind::hangup())?,
            quit: install(SignalKind::quit())?,
        })
    }

    /// The next terminating signal received.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        }
    }
}

/// The exit status of a signal's death, as shells report it.
pub fn signal_status(signal: Signal) -> i32 {
    128 + signal as i32
}

fn status_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(super::EXIT_ERROR)
}

/// The sequencer and Consul's marker, for the child's environment. `VIGIL_LOCK_TOKEN` is the
/// fencing number a resource compares: the LockIndex of a KV lock, the token of a queued lock.
pub fn lock_env(held: &Held) -> Vec<(&'static str, String)> {
    vec![
        ("VIGIL_LOCK_KEY", held.key().to_owned()),
        ("VIGIL_LOCK_INDEX", held.lock_index().to_string()),
        ("VIGIL_LOCK_TOKEN", held.lock_index().to_string()),
        ("VIGIL_LOCK_KIND", held.kind().as_str().to_owned()),
        ("VIGIL_LOCK_SESSION", held.session().to_owned()),
        ("CONSUL_LOCK_HELD", "true".to_owned()),
    ]
}

/// Runs `command` while `held` lasts and returns `vigil`'s exit status: the child's own (128+N if
/// a signal killed it), or [`EXIT_LOST`] if the lock was lost first. The child reads `vigil`'s
/// stdin only if `pass_stdin`, else /dev/null.
pub async fn run_while_held(
    held: Held,
    command: &[String],
    pass_stdin: bool,
    grace: Duration,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    let (program, args) = command.split_first().context("no command given")?;
    let stdin = if pass_stdin {
        Stdio::inherit()
    } else {
        Stdio::null()
    };
    let spawned = tokio::process::Command::new(program)
        .args(args)
        .envs(lock_env(&held))
        .stdin(stdin)
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("vigil: cannot run {program}: {e}");
            release(held).await;
            return Ok(match e.kind() {
                std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_EXECUTE,
            });
        }
    };
    let pgid = Pid::from_raw(child.id().context("child pid")? as i32);
    tracing::info!(pid = pgid.as_raw(), key = held.key(), "child started");
    let lost = held.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = status_code(status.context("waiting for the child")?);
                tracing::info!(code, "child exited, releasing the lock");
                release(held).await;
                return Ok(code);
            }
            reason = &mut lost => {
                eprintln!(
                    "vigil: lock lost ({reason}); terminating the child's process group {pgid}"
                );
                terminate_group(&mut child, pgid, grace).await;
                release(held).await;
                return Ok(EXIT_LOST);
            }
            sig = signals.recv() => {
                tracing::info!(signal = %sig, "forwarding to the child's process group");
                send(pgid, Some(sig));
            }
        }
    }
}

async fn release(held: Held) {
    if let Err(e) = held.release().await {
        eprintln!("vigil: releasing the lock failed: {e}");
    }
}

/// `killpg`, ignoring a group that is already gone. `None` only probes.
fn send(pgid: Pid, signal: Option<Signal>) -> bool {
    match killpg(pgid, signal) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(e) => {
            tracing::warn!(%pgid, error = %e, "signalling the child's process group failed");
            false
        }
    }
}

/// SIGTERM to the group; SIGKILL once `grace` is over if the child or anything else in its group
/// is still running.
pub async fn terminate_group(child: &mut tokio::process::Child, pgid: Pid, grace: Duration) {
    send(pgid, Some(Signal::SIGTERM));
    let deadline = Instant::now() + grace;
    let mut exited = false;
    loop {
        if !exited {
            exited = matches!(child.try_wait(), Ok(Some(_)));
        }
        if exited && !group_running(pgid) {
            return;
        }
        if Instant::now() >= deadline {
            eprintln!("vigil: grace period over; killing process group {pgid}");
            send(pgid, Some(Signal::SIGKILL));
            if !exited {
                let _ = child.wait().await;
            }
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether a process of group `pgid` is still running (zombies, which no signal can reach,
/// don't count). Reads `/proc`; without it, asks the kernel with signal 0.
fn group_running(pgid: Pid) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return send(pgid, None);
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .any(|stat| {
            // After the `(comm)` field: state, ppid, pgrp.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next().unwrap_or("Z");
            let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
            pgrp == Some(pgid.as_raw()) && state != "Z" && state != "X"
        })
}
