//! `vigil lock [--limit N] [--fair | --shared] [--timeout D] [--ttl D] [--lock-delay D]
//! [--grace D] PREFIX -- CMD...`: run CMD while holding a lock on PREFIX, as `consul lock` does
//! (limit 1: an `api.Lock` on `<prefix>/.lock`; limit N: an `api.Semaphore` on the prefix;
//! `--fair`: the server-side queue named PREFIX, first come first served, with N slots;
//! `--shared`: a shared hold of that queue, beside other shared holders), and
//! `vigil lock status PREFIX`, `vigil lock history NAME`. On exit a KV lock's coordination key is deleted unless someone
//! else holds it (`Lock.Destroy`/`Semaphore.Destroy`), so the prefix can later be locked with
//! another limit.
//!
//! `consul lock`'s command line works as it is ([`consul_argv`]): Go's single-dash flags
//! (`-n=2`, `-try 5s`, `-shell=false`), flags ending at the prefix, and the command after the
//! prefix without `--`, run through a shell as Consul does.
//!
//! Exit status: the child's (128+N if signal N killed it; 2 for any failure with
//! `--child-exit-code`, as Consul); [`EXIT_LOST`] if the lock was lost (the local agent gone
//! included) and the child terminated;
//! [`EXIT_TIMEOUT`] if `--timeout` ran out before the lock was held; 128+N if signal N arrived
//! while waiting; 126/127 if CMD could not be run; 1 for other errors.

use std::ffi::OsString;

use std::time::Duration;

use clap::{Args, Subcommand};
use vigil_client::{
    Client, ClientError, Held, Lock, LockOptions, LockQueue, QueueOptions, SEMAPHORE_KEY,
    Semaphore, SemaphoreOptions, path,
};
use vigil_shared::lock::LockMode;
use vigil_shared::vigil_api::{LocksReport, SessionRef};

pub use super::child::EXIT_LOST;
use super::child::{Signals, run_while_held, signal_status};
use super::{AgentAddr, GoArg, HoldArgs, clap_flag, go_arg};

/// Exit status when `--timeout` ran out while waiting for the lock (as `timeout(1)` uses).
pub const EXIT_TIMEOUT: i32 = 124;
/// How long cleanup (leaving the queue, destroying the session) may take before exiting.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);
/// `vigil`'s status with `--child-exit-code` when the command failed (Consul's).
const EXIT_CHILD_FAILED: i32 = 2;

/// `consul lock`'s flags as Go's flag package reads them: name, `vigil lock`'s long flag, and
/// whether it takes a value (else it is a boolean: `-flag`, or `-flag=BOOL` in Go's spellings).
const CONSUL_FLAGS: &[(&str, &str, bool)] = &[
    ("n", "limit", true),
    ("limit", "limit", true),
    ("try", "timeout", true),
    ("timeout", "timeout", true),
    ("monitor-retry", "monitor-retry", true),
    ("name", "name", true),
    ("token", "token", true),
    ("http-addr", "http-addr", true),
    ("ca-file", "ca-file", true),
    ("client-cert", "client-cert", true),
    ("client-key", "client-key", true),
    ("ttl", "ttl", true),
    ("lock-delay", "lock-delay", true),
    ("grace", "grace", true),
    ("shell", "shell", false),
    ("pass-stdin", "pass-stdin", false),
    ("child-exit-code", "child-exit-code", false),
    ("verbose", "verbose", false),
    ("v", "verbose", false),
    ("fair", "fair", false),
    ("h", "help", false),
    ("help", "help", false),
];

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LockCommand {
    #[command(subcommand)]
    pub action: Option<LockAction>,
    #[command(flatten)]
    pub run: LockArgs,
}

#[derive(Debug, Subcommand)]
pub enum LockAction {
    /// Show who holds locks under a prefix, semaphore holders and fair-lock queues.
    Status(StatusArgs),
    /// Show a lock's recorded history: grants, releases, losses and why, lock-delays.
    History(super::history::HistoryArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub prefix: String,
    /// Print the `/v1/vigil/locks` JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub addr: AgentAddr,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// How many may hold the lock at once (more than 1: a semaphore).
    #[arg(long, short = 'n', default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
    pub limit: i64,
    /// First come, first served: waiters get the lock (or one of its N slots) in arrival order,
    /// on the server-side queue named PREFIX.
    #[arg(long)]
    pub fair: bool,
    /// Hold the server-side queue named PREFIX shared with other `--shared` holders, never with
    /// an exclusive one (a readers-writer lock; first come, first served).
    #[arg(long, conflicts_with = "fair")]
    pub shared: bool,
    /// Run the command as one `$SHELL -c` script (else /bin/sh), its words joined by spaces, as
    /// `consul lock` does [default: true for `PREFIX CMD...`, false for `PREFIX -- CMD...`].
    #[arg(long)]
    pub shell: bool,
    /// Let the command read this stdin (else it reads /dev/null).
    #[arg(long)]
    pub pass_stdin: bool,
    /// Exit 2 if the command fails, as `consul lock -child-exit-code` [default: its own status].
    #[arg(long)]
    pub child_exit_code: bool,
    /// Failed reads of the held lock tolerated, 1 s apart, before it counts as lost [default:
    /// until the agent has been unreachable for a session TTL]. A local agent that refuses a
    /// connection is gone: the lock counts as lost at once.
    #[arg(long)]
    pub monitor_retry: Option<u32>,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// Session name [default: "Consul lock for '<command>' at '<prefix>'"].
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub addr: AgentAddr,
    /// KV prefix of the lock.
    #[arg(required = true)]
    pub prefix: Option<String>,
    /// The command to run while holding the lock.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub async fn run(cmd: LockCommand) -> anyhow::Result<i32> {
    match cmd.action {
        Some(LockAction::Status(args)) => status(args).await,
        Some(LockAction::History(args)) => super::history::run(args).await,
        None => run_locked(cmd.run).await,
    }
}

/// The three ways to lock a prefix.
enum Recipe {
    Lock(Lock),
    Semaphore(Semaphore),
    Queue(LockQueue),
}

impl Recipe {
    async fn acquire(&self) -> Result<Held, ClientError> {
        match self {
            Recipe::Lock(l) => l.acquire().await,
            Recipe::Semaphore(s) => s.acquire().await,
            Recipe::Queue(q) => q.acquire().await,
        }
    }

    /// Deletes the coordination key unless someone else holds it, as `consul lock` does on
    /// exit; a queued lock has none (the server drops a lock nobody holds or waits on).
    async fn destroy(&self) -> Result<(), ClientError> {
        let destroyed = match self {
            Recipe::Lock(l) => l.destroy().await,
            Recipe::Semaphore(s) => s.destroy().await,
            Recipe::Queue(_) => Ok(()),
        };
        match destroyed {
            Err(ClientError::LockInUse | ClientError::SemaphoreInUse) => {
                tracing::info!("cleanup skipped, lock in use");
                Ok(())
            }
            other => other,
        }
    }
}

async fn run_locked(args: LockArgs) -> anyhow::Result<i32> {
    super::init_logging(args.hold.verbose);
    let mut signals = Signals::install()?;
    let prefix = args.prefix.clone().unwrap_or_default();
    let prefix = prefix.trim_start_matches('/');
    if prefix.is_empty() {
        anyhow::bail!("Key prefix and child command must be specified");
    }
    if args.shared && args.limit != 1 {
        anyhow::bail!("--shared holders share one lock: it cannot be combined with --limit");
    }
    let client = args.addr.client()?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("Consul lock for '{}' at '{prefix}'", args.command.join(" ")));
    let recipe = if args.fair || args.shared {
        let mut opts = QueueOptions::new(prefix);
        opts.mode = if args.shared {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        opts.limit = u32::try_from(args.limit)?;
        opts.session = args.hold.session(name);
        tracing::info!(lock = %prefix, mode = opts.mode.as_str(), limit = opts.limit, "setting up a queued lock");
        Recipe::Queue(LockQueue::new(&client, opts)?)
    } else if args.limit == 1 {
        let key = path::join(&[prefix, SEMAPHORE_KEY]);
        tracing::info!(%key, "setting up lock");
        let mut opts = LockOptions::new(key);
        opts.session = args.hold.session(name);
        opts.monitor_retries = args.monitor_retry;
        Recipe::Lock(Lock::new(&client, opts)?)
    } else {
        tracing::info!(%prefix, limit = args.limit, "setting up semaphore");
        let mut opts = SemaphoreOptions::new(prefix, args.limit);
        opts.session = args.hold.session(name);
        opts.monitor_retries = args.monitor_retry;
        Recipe::Semaphore(Semaphore::new(&client, opts)?)
    };

    let waiting = recipe.acquire();
    let held = match acquire_or_give_up(waiting, args.hold.timeout, &mut signals, &client).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    tracing::info!(
        key = held.key(),
        lock_index = held.lock_index(),
        "lock held"
    );
    let command = if args.shell {
        shell_command(&args.command)
    } else {
        args.command.clone()
    };
    let code = run_while_held(
        held,
        &command,
        args.pass_stdin,
        args.hold.grace,
        &mut signals,
    )
    .await?;
    client.drain_cleanups(CLEANUP_LIMIT).await;
    if let Err(e) = recipe.destroy().await {
        eprintln!("vigil: Lock cleanup failed: {e}");
    }
    Ok(match code {
        0 | EXIT_LOST => code,
        _ if args.child_exit_code => EXIT_CHILD_FAILED,
        _ => code,
    })
}

/// The command as Consul's `ExecScript` runs it: `$SHELL -c "<words joined by spaces>"`.
fn shell_command(words: &[String]) -> Vec<String> {
    let shell = std::env::var("SHELL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/bin/sh".to_owned());
    vec![shell, "-c".to_owned(), words.join(" ")]
}

/// Rewrites `vigil lock`'s arguments written the way `consul lock` takes them into the form the
/// parser reads; other commands' arguments pass unchanged. Flags end at the first argument that is
/// not one (the prefix), as in Go: `-name`, `--name`, `-name=V` and `-name V` become `--name=V`.
/// What follows the prefix is the command: after a `--` it runs as it is (Vigil's form); without
/// one it is Consul's form and runs through a shell unless `-shell=false` is given.
pub fn consul_argv(argv: Vec<OsString>) -> Vec<OsString> {
    let subcommand = |a: &OsString| a == "status" || a == "history";
    if argv.get(1).is_none_or(|a| a != "lock") || argv.get(2).is_some_and(subcommand) {
        return argv;
    }
    let mut out: Vec<OsString> = argv[..2].to_vec();
    let mut rest = argv[2..].iter();
    let mut shell_given = false;
    while let Some(arg) = rest.next() {
        let (name, value) = match go_arg(arg) {
            GoArg::Positional => {
                // The prefix: what follows is the command.
                let command: Vec<&OsString> = rest.collect();
                let vigil_form = command.contains(&&OsString::from("--"))
                    && command.first().is_some_and(|a| is_flag(a));
                if vigil_form || command.is_empty() {
                    out.push(arg.clone());
                    out.extend(command.into_iter().cloned());
                } else {
                    if !shell_given {
                        out.push("--shell".into());
                    }
                    out.extend([arg.clone(), "--".into()]);
                    out.extend(command.into_iter().cloned());
                }
                return out;
            }
            GoArg::EndOfFlags => {
                // `--`: the prefix and the command follow, in Vigil's form.
                out.push(arg.clone());
                out.extend(rest.cloned());
                return out;
            }
            GoArg::Flag { name, value } => (name, value),
        };
        let Some(&(_, long, takes_value)) = CONSUL_FLAGS.iter().find(|(n, _, _)| *n == name) else {
            // Not one of ours (`-h`, a typo): the parser explains.
            out.push(arg.clone());
            continue;
        };
        shell_given |= long == "shell";
        out.extend(clap_flag(long, value, takes_value, &mut rest));
    }
    out
}

fn is_flag(arg: &OsString) -> bool {
    arg.to_str().is_some_and(|a| a.starts_with('-'))
}

/// Waits for the lock; `Ok(Err(status))` when a signal or the timeout ended the wait (the
/// session and any queue entry are cleaned up first).
pub(crate) async fn acquire_or_give_up(
    waiting: impl Future<Output = Result<Held, ClientError>>,
    timeout: Option<Duration>,
    signals: &mut Signals,
    client: &Client,
) -> anyhow::Result<Result<Held, i32>> {
    let deadline = async {
        match timeout {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        held = waiting => held
            .map(Ok)
            .map_err(|e| anyhow::anyhow!("Lock acquisition failed: {e}")),
        sig = signals.recv() => {
            eprintln!("vigil: {sig} while waiting for the lock; giving up");
            Ok(Err(signal_status(sig)))
        }
        () = deadline => {
            eprintln!("vigil: timed out waiting for the lock");
            Ok(Err(EXIT_TIMEOUT))
        }
    };
    if !matches!(outcome, Ok(Ok(_))) {
        client.drain_cleanups(CLEANUP_LIMIT).await;
    }
    outcome
}

/// `vigil lock status PREFIX`.
async fn status(args: StatusArgs) -> anyhow::Result<i32> {
    let client = args.addr.client()?;
    let prefix = args.prefix.trim_start_matches('/');
    if args.json {
        let report = client.vigil_locks(prefix).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    print!("{}", render_status(&client.locks_report(prefix).await?));
    Ok(0)
}

/// The human form of a `/v1/vigil/locks` report.
fn render_status(report: &LocksReport) -> String {
    let mut out = String::new();
    let holder = |s: &SessionRef| {
        format!(
            "session {} ({}) on node {}",
            s.id,
            s.name.as_deref().unwrap_or("-"),
            s.node.as_deref().unwrap_or("-")
        )
    };
    if report.queues.is_empty()
        && report.locks.is_empty()
        && report.semaphores.is_empty()
        && report.fair_queues.is_empty()
    {
        out.push_str("nothing held\n");
        return out;
    }
    for lock in &report.queues {
        out.push_str(&format!(
            "queued lock {} ({} slot(s), token {}, lock-delay {} ms left):\n",
            lock.name, lock.limit, lock.token, lock.lock_delay_remaining_ms,
        ));
        for h in &lock.holders {
            out.push_str(&format!(
                "  holder  {} {}, token {}, for {} ms\n",
                h.mode.as_str(),
                holder(&h.session),
                h.token,
                h.held_for_ms,
            ));
        }
        for w in &lock.waiters {
            out.push_str(&format!(
                "  {:>3}     {} {}, waiting {} ms\n",
                w.position,
                w.mode.as_str(),
                holder(&w.session),
                w.waiting_for_ms,
            ));
        }
    }
    for lock in &report.locks {
        out.push_str(&format!(
            "{} {}: held by {}, LockIndex {}, held since index {}\n",
            lock.kind.as_str(),
            lock.key,
            holder(&lock.session),
            lock.lock_index,
            lock.held_since_index,
        ));
    }
    for sem in &report.semaphores {
        // A lock key whose value does not decode has no limit: `null`, as the report says.
        let limit = sem
            .limit
            .map_or_else(|| "null".to_owned(), |l| l.to_string());
        out.push_str(&format!(
            "semaphore {}: {} of {limit} slots held\n",
            sem.prefix,
            sem.holders.len(),
        ));
        for h in &sem.holders {
            out.push_str(&format!("  holder  {}\n", holder(&h.session)));
        }
        for w in &sem.waiting {
            out.push_str(&format!("  waiting {}\n", holder(&w.session)));
        }
    }
    for queue in &report.fair_queues {
        out.push_str(&format!("fair lock {}:\n", queue.prefix));
        for (i, c) in queue.queue.iter().enumerate() {
            let role = if i == 0 { "owner " } else { "queued" };
            out.push_str(&format!(
                "  {i:>3} {role} {} (queued at index {})\n",
                holder(&c.session),
                c.create_index
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use vigil_shared::vigil_api::{LockHolderReport, LockReport, LockWaiterReport};

    use super::*;

    fn rewrite(args: &str) -> String {
        let argv = ["vigil"]
            .into_iter()
            .chain(args.split(' '))
            .map(OsString::from)
            .collect();
        consul_argv(argv)[1..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn consul_lock_command_lines_become_vigils() {
        for (given, parsed) in [
            // Consul's form: Go flags, the command after the prefix, run through a shell.
            (
                "lock -n=2 -try 5s jobs ./run.sh now",
                "lock --limit=2 --timeout=5s --shell jobs -- ./run.sh now",
            ),
            (
                "lock -shell=false -verbose=T --name x jobs true",
                "lock --verbose --name=x jobs -- true",
            ),
            (
                "lock -monitor-retry 0 -pass-stdin -child-exit-code -token t p cat",
                "lock --monitor-retry=0 --pass-stdin --child-exit-code --token=t --shell p -- cat",
            ),
            // A command that has its own `--` is still Consul's form.
            (
                "lock p git checkout -- f",
                "lock --shell p -- git checkout -- f",
            ),
            // Vigil's form stays as it is.
            (
                "lock --limit 3 --fair p -- sh -c x",
                "lock --limit=3 --fair p -- sh -c x",
            ),
            ("lock p --grace 1s -- true", "lock p --grace 1s -- true"),
            ("lock -- p sh", "lock -- p sh"),
            // Not ours to rewrite: `lock status`, `lock history`, other commands, unknown flags.
            ("lock status -n 2", "lock status -n 2"),
            ("lock history --json db", "lock history --json db"),
            ("kv get -n x", "kv get -n x"),
            ("lock -x p true", "lock -x --shell p -- true"),
            ("lock -n", "lock --limit"),
            ("lock -fair=maybe p -- x", "lock --fair=maybe p -- x"),
            ("lock p", "lock p"),
        ] {
            assert_eq!(rewrite(given), parsed, "{given}");
        }
    }

    #[test]
    fn status_lines_up_waiters_under_holders() {
        let who = |id: &str| SessionRef {
            id: id.to_owned(),
            name: Some("job".to_owned()),
            node: None,
        };
        let waiter = |id: &str, position| LockWaiterReport {
            session: who(id),
            mode: LockMode::Exclusive,
            position,
            waiting_since: String::new(),
            waiting_for_ms: 5,
        };
        let report = LocksReport {
            prefix: String::new(),
            locks: Vec::new(),
            semaphores: Vec::new(),
            fair_queues: Vec::new(),
            queues: vec![LockReport {
                name: "q".to_owned(),
                limit: 1,
                token: 3,
                grants: 3,
                lock_delay_remaining_ms: 0,
                holders: vec![LockHolderReport {
                    session: who("h"),
                    mode: LockMode::Exclusive,
                    token: 3,
                    held_since: String::new(),
                    held_for_ms: 9,
                }],
                waiters: vec![waiter("a", 1), waiter("b", 12)],
                create_index: 1,
                modify_index: 2,
            }],
        };
        assert_eq!(
            render_status(&report),
            "queued lock q (1 slot(s), token 3, lock-delay 0 ms left):\n\
             \x20 holder  exclusive session h (job) on node -, token 3, for 9 ms\n\
             \x20   1     exclusive session a (job) on node -, waiting 5 ms\n\
             \x20  12     exclusive session b (job) on node -, waiting 5 ms\n"
        );
    }

    #[test]
    fn a_shell_runs_the_joined_words() {
        let command = shell_command(&["echo".to_owned(), "a b".to_owned()]);
        assert_eq!(command[1..], ["-c", "echo a b"]);
    }
}
