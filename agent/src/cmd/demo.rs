//! `vigil demo bank` and `vigil demo worker`: the two programs of the fencing demo (the
//! docker-compose cluster and the lock-safety checker). They are not part of Vigil; they show
//! how a resource uses Vigil's fencing tokens.
//!
//! The bank is a resource that checks tokens: it accepts a write only when the writer's token is
//! not older than the newest token it has accepted, and logs every decision. A token is the
//! holder's sequencer `(Key, LockIndex, Session)` plus the `CreateIndex` of that key, and tokens
//! are ordered by `(CreateIndex, LockIndex)`: a plain lock keeps its key and its LockIndex grows
//! with every acquisition, while a fair lock gives each holder a contender key of its own
//! (acquired once, LockIndex 1) and serves holders in `CreateIndex` order. Either way the order
//! never goes backwards from one holder to the next, so a holder that lost the lock while it was
//! frozen or cut off is turned away as soon as its successor has written.
//!
//! The worker runs under `vigil lock` (`vigil lock --fair demo/leader -- vigil demo worker ...`):
//! it confirms with a linearizable read that it owns the lock (and learns its key's
//! `CreateIndex`), writes its token to the bank a few times, confirms again and exits, which
//! hands the lock to the next in line. Each step is one JSON line on stdout (`grant`, `write`,
//! `release`, `lost`): the record the safety checker reads. `--unfenced --ignore-loss` make the
//! broken worker of the checker's negative control.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use vigil_shared::client::{
    Client, ClientError, FAIR_FLAG_VALUE, FairStep, ReadOpts, fair_step, path,
};
use vigil_shared::kv::KvEntry;

use super::{AgentAddr, parse_duration};
use crate::cmd::child::EXIT_LOST;

/// How long one request to the bank or the agent may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Exit status when the worker started without holding the lock (nothing was written).
pub const EXIT_NOT_OWNER: i32 = 3;
/// Exit status after SIGTERM (128 + 15, as a shell reports it).
const EXIT_TERMINATED: i32 = 143;

#[derive(Debug, Subcommand)]
pub enum DemoCommand {
    /// A fencing "bank": accepts a write only if its token is not older than the newest one it
    /// has accepted, and logs every decision.
    Bank(BankArgs),
    /// The demo worker: run it under `vigil lock`; it writes its fencing token to the bank.
    Worker(WorkerArgs),
    /// Registers a demo node's health checks with its agent: `demo-bank` (HTTP: the bank
    /// answers) and `demo-worker` (TTL: the worker takes turns; `worker --check` passes it).
    Checks(ChecksArgs),
}

#[derive(Debug, Args)]
pub struct BankArgs {
    /// Address to serve on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8600")]
    pub listen: SocketAddr,
    /// Accept writes that carry no token (a resource that cannot fence: negative control only).
    #[arg(long)]
    pub allow_unfenced: bool,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The bank's address (IP:port).
    #[arg(long)]
    pub bank: SocketAddr,
    /// This worker's name in the bank's log (e.g. its node).
    #[arg(long)]
    pub name: String,
    /// How many writes to make while holding the lock.
    #[arg(long, default_value_t = 10)]
    pub writes: u64,
    /// Pause between two writes.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Write without the token (the bank cannot fence such writes). Negative control only.
    #[arg(long)]
    pub unfenced: bool,
    /// Keep writing after the lock is lost: ignore SIGTERM and the bank's rejections.
    /// Negative control only.
    #[arg(long)]
    pub ignore_loss: bool,
    /// A TTL check of the local agent to pass at every turn (e.g. `demo-worker`).
    #[arg(long)]
    pub check: Option<String>,
    #[command(flatten)]
    pub addr: AgentAddr,
}

#[derive(Debug, Args)]
pub struct ChecksArgs {
    /// The bank's address (IP:port): the `demo-bank` check asks its `/status`.
    #[arg(long)]
    pub bank: SocketAddr,
    /// How long the worker may go without a turn before `demo-worker` turns critical.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub worker_ttl: Duration,
    #[command(flatten)]
    pub addr: AgentAddr,
}

/// ID of the TTL check the worker passes at every turn.
pub const WORKER_CHECK: &str = "demo-worker";
/// ID of the HTTP check on the bank.
pub const BANK_CHECK: &str = "demo-bank";

pub async fn run(cmd: DemoCommand) -> anyhow::Result<i32> {
    match cmd {
        DemoCommand::Bank(args) => run_bank(args).await,
        DemoCommand::Worker(args) => run_worker(args).await,
        DemoCommand::Checks(args) => register_checks(args).await,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A holder's fencing token: its sequencer and the `CreateIndex` of the sequencer's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Token {
    pub key: String,
    pub lock_index: u64,
    pub session: String,
    pub create_index: u64,
}

impl Token {
    /// Tokens compare by this: later holders have larger ranks (see the module documentation).
    pub fn rank(&self) -> (u64, u64) {
        (self.create_index, self.lock_index)
    }
}

/// One write sent to the bank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct BankWrite {
    /// Who is writing, for the log (the worker's name).
    pub node: String,
    /// The writer's session: identifies the holder even when no token is sent.
    pub writer: String,
    /// The writer's own count of its writes, from 1.
    pub seq: u64,
    #[serde(default)]
    pub token: Option<Token>,
}

/// What the bank decided about one write; `GET /history` lists them in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Decision {
    /// Position in the bank's history, from 1.
    pub n: u64,
    /// Bank's wall clock, milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub node: String,
    pub writer: String,
    pub seq: u64,
    pub token: Option<Token>,
    pub accepted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The bank's state: the newest token accepted and every decision. Pure, so it is unit-tested.
#[derive(Debug, Default)]
pub struct Bank {
    allow_unfenced: bool,
    newest: Option<Token>,
    history: Vec<Decision>,
}

impl Bank {
    pub fn new(allow_unfenced: bool) -> Bank {
        Bank {
            allow_unfenced,
            ..Bank::default()
        }
    }

    /// Decides one write at `at_ms` and records the decision.
    pub fn decide(&mut self, write: BankWrite, at_ms: u64) -> &Decision {
        let verdict = match (&write.token, &self.newest) {
            (None, _) if self.allow_unfenced => Ok(()),
            (None, _) => Err("no token".to_owned()),
            (Some(t), Some(newest)) if t.rank() < newest.rank() => Err(format!(
                "stale token (CreateIndex {}, LockIndex {}): the newest accepted is CreateIndex {}, LockIndex {} of session {}",
                t.create_index,
                t.lock_index,
                newest.create_index,
                newest.lock_index,
                newest.session
            )),
            (Some(t), Some(newest))
                if t.rank() == newest.rank()
                    && (t.session != newest.session || t.key != newest.key) =>
            {
                Err(format!(
                    "conflicting token: session {} claims the rank of session {}",
                    t.session, newest.session
                ))
            }
            (Some(_), _) => Ok(()),
        };
        if verdict.is_ok()
            && let Some(token) = &write.token
        {
            self.newest = Some(token.clone());
        }
        let decision = Decision {
            n: self.history.len() as u64 + 1,
            at_ms,
            node: write.node,
            writer: write.writer,
            seq: write.seq,
            token: write.token,
            accepted: verdict.is_ok(),
            reason: verdict.err(),
        };
        self.history.push(decision);
        self.history.last().expect("just pushed")
    }

    pub fn history(&self) -> &[Decision] {
        &self.history
    }
}

/// The human line the bank logs for a decision.
fn log_line(d: &Decision) -> String {
    let token = match &d.token {
        Some(t) => format!(
            "token {} LockIndex {} CreateIndex {}",
            t.key, t.lock_index, t.create_index
        ),
        None => "no token".to_owned(),
    };
    match &d.reason {
        None => format!(
            "bank: #{} ACCEPT write {} from {} ({token})",
            d.n, d.seq, d.node
        ),
        Some(reason) => format!(
            "bank: #{} REJECT write {} from {} ({token}): {reason}",
            d.n, d.seq, d.node
        ),
    }
}

type SharedBank = Arc<Mutex<Bank>>;

async fn run_bank(args: BankArgs) -> anyhow::Result<i32> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    // One stable line that scripts and tests read for the bound address.
    println!("vigil demo bank listening on {}", listener.local_addr()?);
    let bank: SharedBank = Arc::new(Mutex::new(Bank::new(args.allow_unfenced)));
    let app = Router::new()
        .route("/write", post(bank_write))
        .route("/history", get(bank_history))
        .route("/status", get(bank_status))
        .with_state(bank);
    let mut term = signal(SignalKind::terminate())?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    Ok(0)
}

/// `POST /write`: 200 with the decision when accepted, 409 when rejected.
async fn bank_write(
    State(bank): State<SharedBank>,
    axum::Json(write): axum::Json<BankWrite>,
) -> (StatusCode, axum::Json<Decision>) {
    let decision = {
        let mut bank = bank.lock().unwrap_or_else(|e| e.into_inner());
        let decision = bank.decide(write, now_ms()).clone();
        // Logged while the lock is held, so the log is in decision order.
        println!("{}", log_line(&decision));
        decision
    };
    let status = if decision.accepted {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    (status, axum::Json(decision))
}

/// `GET /history`: every decision, in order.
async fn bank_history(State(bank): State<SharedBank>) -> axum::Json<Vec<Decision>> {
    let bank = bank.lock().unwrap_or_else(|e| e.into_inner());
    axum::Json(bank.history().to_vec())
}

/// `GET /status`: counts and the newest token accepted.
async fn bank_status(State(bank): State<SharedBank>) -> axum::Json<Value> {
    let bank = bank.lock().unwrap_or_else(|e| e.into_inner());
    let accepted = bank.history().iter().filter(|d| d.accepted).count();
    axum::Json(json!({
        "Accepted": accepted,
        "Rejected": bank.history().len() - accepted,
        "Newest": bank.newest,
    }))
}

/// The sequencer `vigil lock` gives its child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequencer {
    pub key: String,
    pub lock_index: u64,
    pub session: String,
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
            Err(e) => eprintln!("vigil demo worker: cannot encode {line:?}: {e}"),
        }
    }
}

async fn run_worker(args: WorkerArgs) -> anyhow::Result<i32> {
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
            return Ok(super::EXIT_ERROR);
        }
    };
    record.emit(grant(Some(&first), None));
    if let Some(check) = args.check.as_deref().filter(|_| first.owner) {
        let note = format!("holding {} at LockIndex {}", seq.key, seq.lock_index);
        pass_check(&args.addr, check, &note).await;
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
        let (accepted, reason, fenced_off) = match send_write(args.bank, &write).await {
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

/// The check definitions `vigil demo checks` registers (Consul's JSON).
pub fn check_definitions(bank: SocketAddr, worker_ttl: Duration) -> [Value; 2] {
    [
        json!({
            "ID": BANK_CHECK,
            "Name": "the bank answers",
            "HTTP": format!("http://{bank}/status"),
            "Interval": "5s",
            "Timeout": "2s",
        }),
        json!({
            "ID": WORKER_CHECK,
            "Name": "the demo worker takes turns",
            "TTL": format!("{}ms", worker_ttl.as_millis()),
        }),
    ]
}

/// The agent's address for the tiny HTTP client (an `IP:port`, with or without `http://`).
fn agent_socket(addr: &AgentAddr) -> anyhow::Result<SocketAddr> {
    let client = addr.client()?;
    let base = client.base().trim_start_matches("http://");
    base.parse()
        .with_context(|| format!("the agent address must be IP:port, not {base:?}"))
}

async fn register_checks(args: ChecksArgs) -> anyhow::Result<i32> {
    let agent = agent_socket(&args.addr)?;
    for check in check_definitions(args.bank, args.worker_ttl) {
        let body = serde_json::to_vec(&check)?;
        let (status, reply) = request(agent, "PUT", "/v1/agent/check/register", &body).await?;
        anyhow::ensure!(
            status == 200,
            "registering {}: HTTP {status}: {}",
            check["ID"],
            String::from_utf8_lossy(&reply)
        );
        println!("registered check {}", check["ID"]);
    }
    Ok(0)
}

/// Passes the agent's TTL check `check` (best effort: a failure is only reported).
async fn pass_check(addr: &AgentAddr, check: &str, note: &str) {
    let passed = async {
        let agent = agent_socket(addr)?;
        let path = format!(
            "/v1/agent/check/pass/{check}?note={}",
            form_urlencoded::byte_serialize(note.as_bytes()).collect::<String>()
        );
        let (status, reply) = request(agent, "PUT", &path, &[]).await?;
        anyhow::ensure!(
            status == 200,
            "HTTP {status}: {}",
            String::from_utf8_lossy(&reply)
        );
        anyhow::Ok(())
    };
    if let Err(e) = passed.await {
        eprintln!("vigil demo worker: could not pass check {check}: {e:#}");
    }
}

/// Sends one write to the bank and returns its decision.
async fn send_write(bank: SocketAddr, write: &BankWrite) -> anyhow::Result<Decision> {
    let body = serde_json::to_vec(write)?;
    let (status, body) = request(bank, "POST", "/write", &body).await?;
    anyhow::ensure!(
        status == 200 || status == 409,
        "HTTP {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(serde_json::from_slice(&body)?)
}

/// One HTTP/1.1 request with a JSON body on its own connection (`Connection: close`),
/// returning status and body. Its peers (the bank, the local agent) answer with a
/// `Content-Length` body, so this is all the HTTP the demo needs.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}"))??;
    parse_response(&raw)
}

/// Status code and body of a raw HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("truncated HTTP response")?;
    let head = std::str::from_utf8(&raw[..end]).context("HTTP head is not UTF-8")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line in {head:?}"))?;
    Ok((status, raw[end + 4..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_shared::client::LOCK_FLAG_VALUE;

    fn token(session: &str, create_index: u64, lock_index: u64) -> Token {
        Token {
            key: format!("demo/leader/{session}"),
            lock_index,
            session: session.to_owned(),
            create_index,
        }
    }

    fn write(session: &str, token: Option<Token>) -> BankWrite {
        BankWrite {
            node: "n".into(),
            writer: session.into(),
            seq: 1,
            token,
        }
    }

    #[test]
    fn bank_accepts_the_newest_token_and_rejects_older_ones() {
        let mut bank = Bank::new(false);
        let a = token("a", 10, 1);
        let b = token("b", 20, 1);
        let cases = [
            (write("a", Some(a.clone())), true),
            (write("a", Some(a.clone())), true),
            (write("b", Some(b.clone())), true),
            (write("a", Some(a.clone())), false),
            (write("b", Some(b.clone())), true),
            (write("x", None), false),
            (write("c", Some(token("c", 20, 1))), false),
            (write("b", Some(token("b", 20, 2))), true),
        ];
        for (i, (w, accepted)) in cases.into_iter().enumerate() {
            let d = bank.decide(w, i as u64);
            assert_eq!(d.accepted, accepted, "case {i}: {d:?}");
            assert_eq!(d.n, i as u64 + 1);
            assert_eq!(d.reason.is_none(), accepted);
        }
        let reasons: Vec<_> = bank
            .history()
            .iter()
            .filter_map(|d| d.reason.clone())
            .collect();
        assert!(reasons[0].starts_with("stale token"), "{reasons:?}");
        assert_eq!(reasons[1], "no token");
        assert!(reasons[2].starts_with("conflicting token"), "{reasons:?}");
    }

    #[test]
    fn a_bank_that_allows_unfenced_writes_accepts_them_without_moving_the_newest() {
        let mut bank = Bank::new(true);
        assert!(bank.decide(write("b", Some(token("b", 20, 1))), 0).accepted);
        assert!(bank.decide(write("a", None), 1).accepted);
        assert!(!bank.decide(write("a", Some(token("a", 10, 1))), 2).accepted);
    }

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

    #[test]
    fn the_demo_checks_are_an_http_check_on_the_bank_and_a_ttl_check() {
        let [bank, worker] =
            check_definitions("10.0.0.1:8600".parse().unwrap(), Duration::from_secs(90));
        assert_eq!(bank["HTTP"], "http://10.0.0.1:8600/status");
        assert_eq!(bank["ID"], BANK_CHECK);
        assert_eq!(worker["TTL"], "90000ms");
        assert_eq!(worker["ID"], WORKER_CHECK);
    }

    #[test]
    fn responses_are_parsed() {
        let raw = b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(raw).unwrap(), (409, b"{}".to_vec()));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
