//! The worker: one turn of holding the lock. It runs under `vigil lock` (`vigil lock --fair
//! demo/leader -- vigil-demo worker ...`), confirms with a linearizable read that it owns the
//! lock (and, for a KV lock, learns its key's `CreateIndex`), writes its token to the bank a few
//! times, confirms again and exits, which hands the lock to the next in line. Each step is one
//! JSON line on stdout (`grant`, `write`, `release`, `lost`): the record the safety checker
//! reads. `--unfenced --ignore-loss` make the broken worker of the checker's negative control.

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio::signal::unix::{SignalKind, signal};
use vigil_client::{Client, ClientError, FAIR_FLAG_VALUE, FairStep, ReadOpts, fair_step, path};
use vigil_shared::kv::KvEntry;

use crate::bank::{BankClient, BankWrite, Token};
use crate::{EXIT_ERROR, EXIT_LOST, EXIT_NOT_OWNER, EXIT_TERMINATED, WorkerArgs, checks, now_ms};

/// The sequencer `vigil lock` gives its child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequencer {
    pub key: String,
    pub lock_index: u64,
    pub session: String,
    /// A lock of the server-side queue (`key` is its name, `lock_index` its token).
    pub queue: bool,
}

impl Sequencer {
    fn from_env() -> anyhow::Result<Sequencer> {
        let var = |name: &str| {
            std::env::var(name)
                .with_context(|| format!("{name} is not set: run the worker under `vigil lock`"))
        };
        Ok(Sequencer {
            key: var("VIGIL_LOCK_KEY")?,
            lock_index: var("VIGIL_LOCK_INDEX")?
                .parse()
                .context("VIGIL_LOCK_INDEX is not a number")?,
            session: var("VIGIL_LOCK_SESSION")?,
            queue: std::env::var("VIGIL_LOCK_KIND").is_ok_and(|k| k == "queue"),
        })
    }

    /// The prefix the lock's key lives under (`demo/leader` for `demo/leader/<session>`).
    fn prefix(&self) -> &str {
        self.key.rsplit_once('/').map_or("", |(p, _)| p)
    }
}

/// Whether `entries` (a listing of the sequencer's prefix) say the sequencer holds the lock: its
/// key is held by its session at its LockIndex and, for a fair-lock contender, no live contender
/// (nor a dead one still to be cleared) is ahead of it.
pub fn owns(entries: &[KvEntry], seq: &Sequencer) -> bool {
    let Some(mine) = entries.iter().find(|e| e.key == seq.key) else {
        return false;
    };
    if mine.session.as_deref() != Some(seq.session.as_str()) || mine.lock_index != seq.lock_index {
        return false;
    }
    if mine.flags != FAIR_FLAG_VALUE {
        return true;
    }
    matches!(
        fair_step(entries, seq.prefix(), &seq.session),
        Ok(FairStep::Owner { dead_before, .. }) if dead_before.is_empty()
    )
}

/// One linearizable look at the lock: the read's index, our key's `CreateIndex`, ownership.
struct Look {
    index: u64,
    create_index: Option<u64>,
    owner: bool,
}

async fn look(client: &Client, seq: &Sequencer) -> Result<Look, ClientError> {
    if seq.queue {
        let (lock, meta) = client
            .lock_queue_get(&seq.key, ReadOpts::default().consistent())
            .await?;
        let owner = lock.is_some_and(|l| {
            l.holders
                .iter()
                .any(|h| h.session.id == seq.session && h.token == seq.lock_index)
        });
        return Ok(Look {
            index: meta.index,
            create_index: Some(0),
            owner,
        });
    }
    let dir = format!("{}/", path::clean(seq.prefix()));
    let (entries, meta) = client
        .kv_list(&dir, ReadOpts::default().consistent())
        .await?;
    Ok(Look {
        index: meta.index,
        create_index: entries
            .iter()
            .find(|e| e.key == seq.key)
            .map(|e| e.create_index),
        owner: owns(&entries, seq),
    })
}

/// One line of the worker's record on stdout (JSON): who, when, and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct WorkerLine {
    /// The worker's `--name`.
    pub node: String,
    pub session: String,
    /// Worker's wall clock, milliseconds since the Unix epoch.
    pub at_ms: u64,
    #[serde(flatten)]
    pub event: WorkerEvent,
}

/// What a worker reports, in order: `grant`, then `write`s, then `release` (or `lost`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "Event",
    rename_all = "kebab-case",
    rename_all_fields = "PascalCase"
)]
pub enum WorkerEvent {
    /// Started under `vigil lock`. `index` is the `X-Consul-Index` of a linearizable read of
    /// the lock's prefix (the raft index of the prefix's last change, so a logical time of the
    /// state seen), `owner` whether that state had this sequencer holding the lock; `error`
    /// when the read failed (then nothing is written).
    Grant {
        key: String,
        lock_index: u64,
        create_index: Option<u64>,
        index: Option<u64>,
        owner: bool,
        pid: u32,
        error: Option<String>,
    },
    /// One write to the bank and its answer (`reason` says why it was not accepted).
    Write {
        seq: u64,
        accepted: bool,
        reason: Option<String>,
    },
    /// Done writing: `index` is the last index at which the holder saw itself owning the lock
    /// (from a second read if it still did, else the grant's).
    Release {
        index: u64,
        owner: bool,
        error: Option<String>,
    },
    /// `vigil lock` sent SIGTERM: the lock was lost (or `vigil lock` was told to stop).
    Lost,
    /// SIGTERM arrived and `--ignore-loss` kept writing.
    SigtermIgnored,
}

/// Prints the worker's record, one JSON line per event (stdout is flushed per line).
struct Record<'a> {
    name: &'a str,
    session: &'a str,
}

impl Record<'_> {
    fn emit(&self, event: WorkerEvent) {
        let line = WorkerLine {
            node: self.name.to_owned(),
            session: self.session.to_owned(),
            at_ms: now_ms(),
            event,
        };
        match serde_json::to_string(&line) {
            Ok(json) => println!("{json}"),
            Err(e) => eprintln!("vigil-demo worker: cannot encode {line:?}: {e}"),
        }
    }
}

/// `vigil-demo worker`: one turn, ended early by SIGTERM (the lock was lost).
pub async fn run(args: WorkerArgs) -> anyhow::Result<i32> {
    // Installed first: from here on SIGTERM (lock lost) is handled, not fatal.
    let mut term = signal(SignalKind::terminate())?;
    let seq = Sequencer::from_env()?;
    let client = args.addr.client()?;
    let record = Record {
        name: &args.name,
        session: &seq.session,
    };
    let held = hold(&args, &seq, &client, &record);
    tokio::pin!(held);
    loop {
        tokio::select! {
            code = &mut held => return code,
            _ = term.recv() => {
                if !args.ignore_loss {
                    record.emit(WorkerEvent::Lost);
                    return Ok(EXIT_TERMINATED);
                }
                record.emit(WorkerEvent::SigtermIgnored);
            }
        }
    }
}

/// The worker's turn: confirm the grant, write to the bank, confirm again.
async fn hold(
    args: &WorkerArgs,
    seq: &Sequencer,
    client: &Client,
    record: &Record<'_>,
) -> anyhow::Result<i32> {
    let grant = |first: Option<&Look>, error: Option<String>| WorkerEvent::Grant {
        key: seq.key.clone(),
        lock_index: seq.lock_index,
        create_index: first.and_then(|f| f.create_index),
        index: first.map(|f| f.index),
        owner: first.is_some_and(|f| f.owner),
        pid: std::process::id(),
        error,
    };
    let first = match look(client, seq).await {
        Ok(first) => first,
        Err(e) => {
            record.emit(grant(None, Some(e.to_string())));
            return Ok(EXIT_ERROR);
        }
    };
    record.emit(grant(Some(&first), None));
    if let Some(check) = args.check.as_deref().filter(|_| first.owner) {
        let note = format!("holding {} at LockIndex {}", seq.key, seq.lock_index);
        checks::pass(client, check, &note).await;
    }
    let Some(create_index) = first
        .create_index
        .filter(|_| first.owner || args.ignore_loss)
    else {
        return Ok(EXIT_NOT_OWNER);
    };
    let token = (!args.unfenced).then(|| Token {
        key: seq.key.clone(),
        lock_index: seq.lock_index,
        session: seq.session.clone(),
        create_index,
    });

    let bank = BankClient::new(args.bank)?;
    let mut code = 0;
    for n in 1..=args.writes {
        if n > 1 {
            tokio::time::sleep(args.interval).await;
        }
        let write = BankWrite {
            node: args.name.clone(),
            writer: seq.session.clone(),
            seq: n,
            token: token.clone(),
        };
        // Rejected: a newer holder has written, so this one has lost the lock. An unreachable
        // bank decided nothing: go on with the next write.
        let (accepted, reason, fenced_off) = match bank.write(&write).await {
            Ok(decision) => (decision.accepted, decision.reason, !decision.accepted),
            Err(e) => (false, Some(format!("bank unreachable: {e:#}")), false),
        };
        record.emit(WorkerEvent::Write {
            seq: n,
            accepted,
            reason,
        });
        if fenced_off && !args.ignore_loss {
            code = EXIT_LOST;
            break;
        }
    }

    let release = match look(client, seq).await {
        Ok(last) if last.owner => WorkerEvent::Release {
            index: last.index,
            owner: true,
            error: None,
        },
        Ok(_) => WorkerEvent::Release {
            index: first.index,
            owner: false,
            error: None,
        },
        Err(e) => WorkerEvent::Release {
            index: first.index,
            owner: false,
            error: Some(e.to_string()),
        },
    };
    record.emit(release);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use vigil_client::LOCK_FLAG_VALUE;

    use super::*;

    fn entry(key: &str, session: Option<&str>, flags: u64, create_index: u64) -> KvEntry {
        KvEntry {
            key: key.into(),
            value: Vec::new(),
            flags,
            session: session.map(str::to_owned),
            lock_index: 1,
            create_index,
            modify_index: create_index,
        }
    }

    fn seq(session: &str) -> Sequencer {
        Sequencer {
            key: format!("demo/leader/{session}"),
            lock_index: 1,
            session: session.into(),
            queue: false,
        }
    }

    #[test]
    fn a_fair_contender_owns_only_when_first_in_line() {
        let listing = [
            entry("demo/leader/a", Some("a"), FAIR_FLAG_VALUE, 5),
            entry("demo/leader/b", Some("b"), FAIR_FLAG_VALUE, 7),
        ];
        assert!(owns(&listing, &seq("a")));
        assert!(!owns(&listing, &seq("b")), "a is ahead");
        assert!(!owns(&listing, &seq("c")), "no entry");
        let mut stale = seq("a");
        stale.lock_index = 2;
        assert!(!owns(&listing, &stale), "another LockIndex");
        let dead_head = [
            entry("demo/leader/a", None, FAIR_FLAG_VALUE, 5),
            entry("demo/leader/b", Some("b"), FAIR_FLAG_VALUE, 7),
        ];
        assert!(!owns(&dead_head, &seq("a")), "released");
        assert!(
            !owns(&dead_head, &seq("b")),
            "a dead head is not cleared yet"
        );
    }

    #[test]
    fn a_plain_lock_is_owned_by_its_session() {
        let plain = Sequencer {
            key: "demo/leader/.lock".into(),
            lock_index: 1,
            session: "a".into(),
            queue: false,
        };
        let listing = [entry("demo/leader/.lock", Some("a"), LOCK_FLAG_VALUE, 3)];
        assert!(owns(&listing, &plain));
        assert!(!owns(&listing, &seq("b")));
    }

    #[test]
    fn worker_lines_are_flat_json_and_read_back() {
        let line = WorkerLine {
            node: "c1".into(),
            session: "s".into(),
            at_ms: 5,
            event: WorkerEvent::Write {
                seq: 2,
                accepted: false,
                reason: Some("stale".into()),
            },
        };
        let value = serde_json::to_value(&line).unwrap();
        assert_eq!(
            value,
            json!({"Node": "c1", "Session": "s", "AtMs": 5, "Event": "write",
                   "Seq": 2, "Accepted": false, "Reason": "stale"})
        );
        assert_eq!(serde_json::from_value::<WorkerLine>(value).unwrap(), line);
        let ignored = r#"{"Node":"c1","Session":"s","AtMs":6,"Event":"sigterm-ignored"}"#;
        let parsed: WorkerLine = serde_json::from_str(ignored).unwrap();
        assert_eq!(parsed.event, WorkerEvent::SigtermIgnored);
    }
}
