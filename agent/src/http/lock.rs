//! The native lock queue over HTTP (`/v1/vigil/lock/<name>`), a Vigil addition:
//! - `PUT ?session=S[&mode=shared][&limit=N][&try][&wait=D][&timeout=D]` takes the lock or
//!   joins its queue (one raft write) and waits for the grant in the same request (a blocking
//!   read woken only by this session's own grant). `wait` bounds one request (Consul's blocking
//!   default, 5 min, at most 10 min): past it the answer is 202 with `"Queued":true`, the
//!   contender keeps its place and asking again resumes the wait. `timeout` gives up: the
//!   contender leaves the queue (and is told of a grant that landed first). `try` answers at
//!   once, also for a session that already waits.
//! - Each acquire request has an identity of its own. A retry (the same session asking again,
//!   say on a new connection after a timeout) claims the session's place; the earlier request,
//!   when its client is gone, gives up only a place it still owns. A grant is never given back
//!   by a request that ends: it reaches the client that asks again, or stays with the session.
//! - One session has one standing per lock, in one mode: asking for exclusive what it holds or
//!   waits for shared is refused (500), unless it is the only holder (upgraded in place, with a
//!   new token); asking for shared what it holds exclusive answers the exclusive hold.
//! - `PUT ?release&session=S` or `DELETE ?session=S`: release, or leave the queue.
//! - `GET`: the lock's holders, queue and lock-delay (blocking with `?index=`); with
//!   `?session=S`, where S stands (`Held` and `Token`, or `Position`), blocking only until S's
//!   own standing changes (a holder's monitor).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::go::strconv::parse_uint;
use vigil_shared::lock::{LockHold, LockMode, LockState, MAX_LOCK_LIMIT};
use vigil_shared::rpc::writes::{Acquired, Leave, LockEnqueue, LockLeave, LockRelease};
use vigil_shared::rpc::{ApplyError, QueryOptions, ServerError, reads};
use vigil_shared::session::Session;
use vigil_shared::vigil_api::{
    AcquireReply, LockHolderReport, LockReport, LockWaiterReport, NotAcquired, SessionRef,
    StandingReply,
};

use super::acl::check_session_write;
use super::error::ApiError;
use super::params::{DEFAULT_WAIT, MAX_WAIT, Params, decode_path};
use super::{Ctx, with_meta};
use vigil_server::telemetry;

use crate::backend::Backend;

/// Longest lock name accepted.
const MAX_NAME_BYTES: usize = 1024;

fn name_of(uri: &axum::http::Uri) -> Result<String, ApiError> {
    let raw = uri.path().strip_prefix("/v1/vigil/lock/").unwrap_or("");
    let name = decode_path(raw)
        .map_err(|_| ApiError::bad_request("Invalid URL: Invalid UTF-8 in lock name"))?;
    if name.is_empty() {
        return Err(ApiError::bad_request("Missing lock name"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(ApiError::bad_request(format!(
            "Lock name is {} bytes; the limit is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(name)
}

fn session_of(params: &Params) -> Result<String, ApiError> {
    params
        .get("session")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_request("Missing session"))
}

fn duration_param(params: &Params, name: &str) -> Result<Option<Duration>, ApiError> {
    params
        .get(name)
        .filter(|v| !v.is_empty())
        .map(|v| {
            parse_go_duration(v).map_err(|_| ApiError::bad_request(format!("Invalid {name} time")))
        })
        .transpose()
}

/// `PUT` and `DELETE /v1/vigil/lock/<name>`.
pub async fn change(cx: Ctx, method: Method) -> Result<Response, ApiError> {
    let name = name_of(&cx.uri)?;
    let session = session_of(&cx.params)?;
    // A native lock's name is guarded as a key of that name is.
    cx.check(Resource::Key, Access::Write, &name)?;
    check_session_write(&cx.state, &cx.authz, &session).await?;
    if method == Method::DELETE || cx.params.has("release") {
        let released = release(&cx.state.backend, &name, &session).await?;
        return Ok(cx.json(&released));
    }
    let mode = LockMode::parse(cx.params.get("mode").unwrap_or_default())
        .ok_or_else(|| ApiError::bad_request("Invalid mode: use \"exclusive\" or \"shared\""))?;
    let limit = match cx.params.get("limit").filter(|v| !v.is_empty()) {
        None => 1,
        Some(v) => parse_uint(v)
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=MAX_LOCK_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!("Invalid limit: must be 1 to {MAX_LOCK_LIMIT}"))
            })?,
    };
    let wait = duration_param(&cx.params, "wait")?
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_WAIT)
        .min(MAX_WAIT);
    let timeout = duration_param(&cx.params, "timeout")?;
    let try_only = cx.params.has("try") || timeout.is_some_and(|t| t.is_zero());
    // This request's identity: only it can give up the place it claims. Never 0, which names
    // the places taken by the first release's acquire.
    let request = rand::random::<u64>() | 1;
    let enqueue = LockEnqueue {
        name: name.clone(),
        session: session.clone(),
        mode,
        limit,
        try_only,
        request,
    };
    let reply = |mode, outcome: Outcome| {
        let (status, body) = outcome.reply(name.clone(), session.clone(), mode);
        (status, cx.json(&body)).into_response()
    };
    // The enqueue runs to its end in its own task, and the guard is armed before it starts: a
    // client that goes away while its contender is being queued still gives up its place,
    // after the enqueue (never before it, which would leave the contender queued for good).
    let enqueued = tokio::spawn({
        let backend = cx.state.backend.clone();
        crate::token::inherit(async move { backend.write(enqueue).await })
    });
    let mut leave = LeaveOnDrop {
        backend: cx.state.backend.clone(),
        name: name.clone(),
        session: session.clone(),
        request,
        enqueue: Some(enqueued),
        armed: true,
    };
    let acquired = leave.enqueued().await?;
    // From here on the guard is armed only while this request waits in the queue.
    leave.armed = false;
    let (queued_index, mode) = match acquired.map_err(refused)? {
        Acquired::Held { token, mode } => return Ok(reply(mode, Outcome::Held(token))),
        Acquired::Busy { lock_delay_ms } => {
            return Ok(reply(mode, Outcome::Busy { lock_delay_ms }));
        }
        // A try from a session that already waits (under another request): where it stands,
        // at once.
        Acquired::Queued { position, mode, .. } if try_only => {
            return Ok(reply(mode, Outcome::Queued(position)));
        }
        Acquired::Queued { index, mode, .. } => (index, mode),
    };
    leave.armed = true;
    let gives_up = timeout.is_some_and(|t| t <= wait);
    let deadline = Instant::now() + timeout.map_or(wait, |t| t.min(wait));
    let hold = wait_for_grant(&cx.state.backend, &name, &session, queued_index, deadline).await;
    // The wait ended with an answer: whatever it is, this request says so itself.
    leave.armed = false;
    let hold = match hold {
        // The servers hold as many blocking queries as they may: the contender is queued
        // and keeps its place; asking again resumes the wait where it stands.
        Err(ServerError::TooManyBlockingQueries) => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{}; the session keeps its place in the queue, and asking again resumes the wait",
                    ServerError::TooManyBlockingQueries
                ),
            ));
        }
        hold => hold?,
    };
    let hold = match hold {
        LockHold::Queued { .. } if gives_up => {
            // Gives up its own place; a grant that landed since the last look is kept, and
            // told.
            match leave_queue(&cx.state.backend, &name, &session, request).await? {
                Leave::Left => return Ok(reply(mode, Outcome::TimedOut)),
                Leave::Stayed(hold) => hold,
            }
        }
        hold => hold,
    };
    Ok(match hold {
        LockHold::Held {
            token,
            since_ms,
            mode,
        } => {
            // From the releasing entry's proposal to this waiter's answer.
            telemetry::lock_handoff(Duration::from_millis(wall_ms().saturating_sub(since_ms)));
            reply(mode, Outcome::Held(token))
        }
        LockHold::Queued { position, mode } => reply(mode, Outcome::Queued(position)),
        LockHold::Absent => reply(mode, Outcome::Removed),
    })
}

/// How an acquire ended.
enum Outcome {
    Held(u64),
    Busy {
        lock_delay_ms: u64,
    },
    /// Still waiting at this position.
    Queued(u64),
    TimedOut,
    Removed,
}

impl Outcome {
    /// Its status and body: 200, or 202 while the session still waits in the queue (asking
    /// again resumes the wait), so no client reads a wait that ended as a refusal.
    fn reply(self, lock: String, session: String, mode: LockMode) -> (StatusCode, AcquireReply) {
        let mut body = AcquireReply {
            lock,
            session,
            mode,
            acquired: false,
            token: None,
            queued: false,
            reason: None,
            position: None,
            lock_delay_remaining_ms: None,
        };
        let status = match self {
            Outcome::Held(token) => {
                body.acquired = true;
                body.token = Some(token);
                StatusCode::OK
            }
            Outcome::Busy { lock_delay_ms } => {
                body.reason = Some(if lock_delay_ms > 0 {
                    NotAcquired::LockDelay
                } else {
                    NotAcquired::Held
                });
                body.lock_delay_remaining_ms = Some(lock_delay_ms);
                StatusCode::OK
            }
            Outcome::Queued(position) => {
                body.queued = true;
                body.reason = Some(NotAcquired::Queued);
                body.position = Some(position);
                StatusCode::ACCEPTED
            }
            Outcome::TimedOut => {
                body.reason = Some(NotAcquired::Timeout);
                StatusCode::OK
            }
            Outcome::Removed => {
                body.reason = Some(NotAcquired::Removed);
                StatusCode::OK
            }
        };
        (status, body)
    }
}

/// Blocks until `session` is granted `name` or leaves its queue, or `deadline` passes.
async fn wait_for_grant(
    backend: &Backend,
    name: &str,
    session: &str,
    mut index: u64,
    deadline: Instant,
) -> Result<LockHold, ServerError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let opts = QueryOptions {
            min_index: index,
            wait_ms: left.as_millis() as u64,
            ..QueryOptions::default()
        };
        let query = reads::LockHold {
            name: name.to_owned(),
            session: session.to_owned(),
        };
        let (hold, meta) = backend.read(opts, query).await?;
        if !matches!(hold, LockHold::Queued { .. }) || left.is_zero() {
            return Ok(hold);
        }
        index = index.max(meta.index);
    }
}

/// A lock change the servers refused: Consul's 500 with the reason.
fn refused(e: ApplyError) -> ApiError {
    ApiError::server(e.to_string())
}

/// Releases the lock or leaves its queue: whether the session had either.
async fn release(backend: &Backend, name: &str, session: &str) -> Result<bool, ApiError> {
    let release = LockRelease {
        name: name.to_owned(),
        session: session.to_owned(),
    };
    let released = backend.write(release).await?.map_err(refused)?;
    Ok(released.held || released.queued)
}

/// Gives up the place in the queue that `request` claimed, if it still has it.
async fn leave_queue(
    backend: &Backend,
    name: &str,
    session: &str,
    request: u64,
) -> Result<Leave, ApiError> {
    let leave = LockLeave {
        name: name.to_owned(),
        session: session.to_owned(),
        request,
    };
    backend.write(leave).await?.map_err(refused)
}

/// Gives up a contender's place in the queue when its request ends without an answer (the
/// client went away): nobody is left to be told of a grant. Only this request's own place is
/// given up: a newer request of the same session (a client retrying on a new connection) has
/// claimed it, or a grant that landed stays with the session, as a lost reply to Consul's
/// `?acquire` does. If the enqueue is still under way, the contender leaves after it.
struct LeaveOnDrop {
    backend: std::sync::Arc<Backend>,
    name: String,
    session: String,
    request: u64,
    enqueue: Option<JoinHandle<Result<Result<Acquired, ApplyError>, ServerError>>>,
    armed: bool,
}

impl LeaveOnDrop {
    /// The enqueue's answer, once: `Err` when the servers gave none, their refusal inside.
    async fn enqueued(&mut self) -> Result<Result<Acquired, ApplyError>, ApiError> {
        let enqueue = self.enqueue.as_mut().expect("the enqueue is awaited once");
        let answer = enqueue.await;
        self.enqueue = None;
        answer
            .map_err(|e| ApiError::server(format!("enqueueing: {e}")))?
            .map_err(ApiError::from)
    }
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let backend = self.backend.clone();
        let (name, session, request) = (
            std::mem::take(&mut self.name),
            std::mem::take(&mut self.session),
            self.request,
        );
        let enqueue = self.enqueue.take();
        tokio::spawn(crate::token::inherit(async move {
            if let Some(enqueue) = enqueue {
                // Whatever it answered, the contender may be queued now.
                let _ = enqueue.await;
            }
            if let Err(e) = leave_queue(&backend, &name, &session, request).await {
                tracing::warn!(lock = %name, session = %session, error = %e.message, "leaving a lock queue after the client went away failed");
            }
        }));
    }
}

/// `GET /v1/vigil/lock/<name>`: one lock, or 404; with `?session=`, that session's standing.
pub async fn get(cx: Ctx) -> Result<Response, ApiError> {
    let name = name_of(&cx.uri)?;
    cx.check(Resource::Key, Access::Read, &name)?;
    let opts = cx.params.query_options()?;
    if cx.params.has("session") {
        let query = reads::LockStanding {
            name,
            session: session_of(&cx.params)?,
        };
        let (standing, meta) = cx.state.backend.read(opts, query).await?;
        let body = StandingReply::from_standing(&standing);
        return Ok(with_meta(meta, cx.json(&body)));
    }
    let (lock, meta) = cx
        .state
        .backend
        .read(opts, reads::Lock { name: name.clone() })
        .await?;
    let Some(lock) = lock else {
        return Ok(with_meta(meta, StatusCode::NOT_FOUND.into_response()));
    };
    let sessions = sessions(&cx.state.backend, opts).await?;
    Ok(with_meta(meta, cx.json(&lock_report(&lock, &sessions))))
}

/// Every session, for naming holders and waiters.
pub async fn sessions(backend: &Backend, opts: QueryOptions) -> Result<Vec<Session>, ApiError> {
    let opts = QueryOptions {
        consistency: opts.consistency,
        ..QueryOptions::default()
    };
    let (sessions, _) = backend.read(opts, reads::SessionList {}).await?;
    Ok(sessions)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// RFC 3339 in UTC to the millisecond (always three digits, so the texts sort as the times
/// do), from ms since the epoch.
pub fn rfc3339(ms: u64) -> String {
    vigil_shared::go::time::rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms))
}

/// A lock as `/v1/vigil/lock/<name>` and `/v1/vigil/locks` show it. Times since are measured
/// on this agent's clock against the leader's clock of the grant or enqueue.
pub fn lock_report(lock: &LockState, sessions: &[Session]) -> LockReport {
    let now = wall_ms();
    let who = |id: &str| SessionRef::new(id, sessions.iter().find(|s| s.id == id));
    let holders = lock
        .holders
        .iter()
        .map(|h| LockHolderReport {
            session: who(&h.session),
            mode: h.mode,
            token: h.token,
            held_since: rfc3339(h.since_ms),
            held_for_ms: now.saturating_sub(h.since_ms),
        })
        .collect();
    let waiters = lock
        .waiters
        .iter()
        .zip(1..)
        .map(|(w, position)| LockWaiterReport {
            session: who(&w.session),
            mode: w.mode,
            position,
            waiting_since: rfc3339(w.since_ms),
            waiting_for_ms: now.saturating_sub(w.since_ms),
        })
        .collect();
    LockReport {
        name: lock.name.clone(),
        limit: lock.limit,
        token: lock.token,
        grants: lock.grants,
        lock_delay_remaining_ms: lock.delay_left_ms(now),
        holders,
        waiters,
        create_index: lock.create_index,
        modify_index: lock.modify_index,
    }
}
