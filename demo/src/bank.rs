//! The bank: a resource that checks fencing tokens. It accepts a write only when the writer's
//! token is not older than the newest token it has accepted, and logs every decision. Tokens are
//! ordered by `(CreateIndex, LockIndex)` (see the crate documentation), so a holder that lost
//! the lock while it was frozen or cut off is turned away as soon as its successor has written.
//!
//! [`Bank`] is the pure decision rule; [`serve`] puts it behind HTTP (`POST /write`, `GET
//! /history`, `GET /status`) and [`BankClient`] is the workers' side of that API.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

use crate::{BankArgs, now_ms};

/// How long one write to the bank may take, connecting included.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Serves the bank until SIGTERM or Ctrl-C.
pub async fn serve(args: BankArgs) -> anyhow::Result<i32> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    // One stable line that scripts and tests read for the bound address.
    println!("vigil-demo bank listening on {}", listener.local_addr()?);
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
        let mut bank = bank.lock();
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
    let bank = bank.lock();
    axum::Json(bank.history().to_vec())
}

/// `GET /status`: counts and the newest token accepted.
async fn bank_status(State(bank): State<SharedBank>) -> axum::Json<Value> {
    let bank = bank.lock();
    let accepted = bank.history().iter().filter(|d| d.accepted).count();
    axum::Json(json!({
        "Accepted": accepted,
        "Rejected": bank.history().len() - accepted,
        "Newest": bank.newest,
    }))
}

/// A worker's connection to the bank: one HTTP request per write, each on a new connection (no
/// idle pool) and bounded by [`WRITE_TIMEOUT`], so a worker that was frozen or cut off finds no
/// half-dead connection when it resumes. The bank is not an agent, so this is plain `reqwest`,
/// the HTTP stack under `vigil_client`.
pub struct BankClient {
    http: reqwest::Client,
    /// `http://IP:port/write`.
    url: String,
}

impl BankClient {
    pub fn new(bank: SocketAddr) -> anyhow::Result<BankClient> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(WRITE_TIMEOUT)
            .build()
            .context("building the bank's HTTP client")?;
        Ok(BankClient {
            http,
            url: format!("http://{bank}/write"),
        })
    }

    /// Sends one write and returns the bank's decision (accepted or rejected).
    pub async fn write(&self, write: &BankWrite) -> anyhow::Result<Decision> {
        let response = self.http.post(&self.url).json(write).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        anyhow::ensure!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(serde_json::from_slice(&body)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
