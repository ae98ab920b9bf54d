//! Where the HTTP API's requests go: "the servers" behind one [`ServerApi`], which is the
//! in-process server when this agent runs the server role, the servers reached over QUIC RPC
//! otherwise ([`RemoteServers`]), or a test double. Whatever they are, requests are retried
//! here when that is safe: anything that was never applied (no leader yet, a server that could
//! not be reached) and every read, within a deadline, so an election or a server loss looks
//! like latency rather than an error. A blocking query answers by its deadline whatever the
//! servers do. Local blocking queries of the same read share one wait on the servers
//! ([`coalesce`]).

mod coalesce;
mod remote;
#[cfg(test)]
mod tests;

pub use remote::RemoteServers;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use rand::Rng as _;
use tokio::time::Instant;
use vigil_server::api::operations::Operation;
use vigil_server::{Server, ServerApi};
use vigil_shared::operator::OperatorError;
use vigil_shared::rpc::calls::StatusInfo;
use vigil_shared::rpc::{
    Consistency, Query, QueryMeta, QueryOptions, QueryResult, ReadQuery, ServerError, Write,
};
use vigil_shared::session::Session;

/// How long a request keeps retrying through an election or a server loss.
const RETRY_FOR: Duration = Duration::from_secs(15);

/// The servers as the HTTP API sees them, with the retries around them.
pub struct Backend {
    servers: Arc<dyn ServerApi>,
    /// This agent's own server when it runs the server role: its raft figures, its fatal
    /// errors and its shutdown are the agent's too.
    local: Option<Arc<Server>>,
    /// The blocking queries waiting on the servers, coalesced.
    waits: Arc<coalesce::Waits>,
}

/// Retries `attempt` with backoff while it fails retryably, the deadline allows and the agent
/// is not stopping.
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` would keep its arguments twice"
)]
fn with_retries<'a, T, F, Fut>(
    servers: &'a dyn ServerApi,
    deadline: Instant,
    idempotent: bool,
    mut attempt: F,
) -> impl Future<Output = Result<T, ServerError>> + 'a
where
    F: FnMut() -> Fut + 'a,
    Fut: Future<Output = Result<T, ServerError>> + 'a,
    T: 'a,
{
    async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            // The answer is taken out of the match before the backoff's sleep, so a blocking
            // query's attempt (which holds this future while it waits) keeps no room for one.
            let e = match attempt().await {
                Err(e)
                    if e.safe_to_retry(idempotent)
                        && Instant::now() + backoff < deadline
                        && !servers.is_shutting_down() =>
                {
                    e
                }
                result => return result,
            };
            tracing::debug!(error = %e, "retrying");
            drop(e);
            // Boxed: a blocking query's attempt holds this future while it waits, which would
            // otherwise keep room for a timer it rarely needs.
            Box::pin(tokio::time::sleep(backoff)).await;
            backoff = (backoff * 2).min(Duration::from_millis(250));
        }
    }
}

impl Backend {
    /// The in-process server of an agent running the server role.
    pub fn local(server: Arc<Server>) -> Backend {
        Backend {
            servers: Arc::clone(&server) as Arc<dyn ServerApi>,
            local: Some(server),
            waits: Arc::default(),
        }
    }

    /// Servers this agent does not run itself: over the network ([`RemoteServers`]), or a
    /// test double.
    pub fn new(servers: Arc<dyn ServerApi>) -> Backend {
        Backend {
            servers,
            local: None,
            waits: Arc::default(),
        }
    }

    /// This agent's own server, when it runs the server role.
    pub fn server(&self) -> Option<&Arc<Server>> {
        self.local.as_ref()
    }

    /// The blocking queries of this agent's clients waiting now, and the waits on the servers
    /// they share (one per distinct read).
    pub fn blocking_queries(&self) -> (usize, usize) {
        (self.waits.watchers(), self.waits.shared())
    }

    /// Commits a state change and answers what applying it produced. Each attempt takes its
    /// own copy of the op (a write is retried only when it was not applied).
    pub async fn write<W: Write>(&self, change: W) -> Result<W::Output, ServerError> {
        let op = change.into();
        let deadline = Instant::now() + RETRY_FOR;
        let servers = &*self.servers;
        let response = with_retries(servers, deadline, false, || servers.write(op.clone())).await?;
        W::output(response)
            .map_err(|other| ServerError::Internal(format!("a write was answered with {other:?}")))
    }

    /// A typed read: [`Backend::query`] with the answer taken out of its wire form.
    pub async fn read<Q: Query>(
        &self,
        opts: QueryOptions,
        query: Q,
    ) -> Result<(Q::Output, QueryMeta), ServerError> {
        typed::<Q>(self.query(opts, query.into()).await?)
    }

    /// Reads, blocking on the server; a lost server is retried on another within the wait. A
    /// blocking query answers by its deadline whatever the servers do (see [`Blocking`]).
    async fn query(&self, opts: QueryOptions, query: ReadQuery) -> Answer {
        if blocks(&opts) {
            return self.blocking(opts, query)?.answer().await;
        }
        let deadline = Instant::now() + RETRY_FOR;
        let opts = QueryOptions { wait_ms: 0, ..opts };
        with_retries(&*self.servers, deadline, true, || {
            self.servers.query(opts, query.clone())
        })
        .await
    }

    /// The blocking query `opts` make of `query`, its deadlines counted from now, before it
    /// waits: [`Blocking::answer`] waits.
    pub fn blocking(&self, opts: QueryOptions, query: ReadQuery) -> Result<Blocking, ServerError> {
        let wait = Duration::from_millis(opts.wait_ms);
        let spread = wait / 32;
        let jitter = if spread.is_zero() {
            Duration::ZERO
        } else {
            rand::thread_rng().gen_range(Duration::ZERO..spread)
        };
        let earliest = Instant::now() + wait;
        let read = postcard::to_allocvec(&(opts.consistency, opts.min_index, &query))
            .map_err(|e| ServerError::Internal(format!("a read's identity: {e}")))?;
        Ok(Blocking(Box::new(Asked {
            servers: Arc::clone(&self.servers),
            waits: Arc::clone(&self.waits),
            opts,
            read: read.into(),
            earliest,
            due: earliest + jitter,
            deadline: earliest + wait / 16,
            token: crate::token::carried(),
        })))
    }

    /// Renews a session on the leader, retrying through an election.
    pub async fn renew(&self, id: &str) -> Result<Session, ServerError> {
        let deadline = Instant::now() + RETRY_FOR;
        let servers = &*self.servers;
        with_retries(servers, deadline, true, || servers.renew(id)).await
    }

    /// Operates the server set (`/v1/operator/*`, snapshots) on the leader and answers what
    /// that produced.
    pub async fn operate<O: Operation>(&self, operation: O) -> Result<O::Output, OperatorError> {
        let reply = self.servers.operator(operation.into()).await?;
        O::output(reply).map_err(|other| {
            ServerError::Internal(format!("an operator request was answered with {other:?}")).into()
        })
    }

    /// The leader and the raft members, as this agent's server (or the first to answer) sees it.
    pub async fn status(&self) -> Result<StatusInfo, ServerError> {
        self.servers.status().await
    }
}

/// What a read answers, in its wire form.
pub type Answer = Result<(QueryResult, QueryMeta), ServerError>;

/// Whether `opts` make a read block: only a query with an index does; the HTTP layer sets a
/// default wait on every read, which must not stretch the retry window of a plain read to
/// minutes.
pub fn blocks(opts: &QueryOptions) -> bool {
    opts.min_index > 0 && opts.wait_ms > 0
}

/// `answer` taken out of its wire form as `Q`'s output.
pub fn typed<Q: Query>(
    (result, meta): (QueryResult, QueryMeta),
) -> Result<(Q::Output, QueryMeta), ServerError> {
    let output = Q::output(result)
        .map_err(|other| ServerError::Internal(format!("a read was answered with {other:?}")))?;
    Ok((output, meta))
}

/// A blocking query before it waits: what it asks and by when it answers, a few hundred bytes.
/// It answers by its deadline, Consul's `wait + wait/16`, also while the servers elect a leader
/// or one of them is lost (see [`wait_on_servers`]). The HTTP layer keeps this rather than the
/// suspended handler that asked while the query waits. Boxed: a future that holds one while
/// it waits holds a pointer.
pub struct Blocking(Box<Asked>);

struct Asked {
    servers: Arc<dyn ServerApi>,
    waits: Arc<coalesce::Waits>,
    opts: QueryOptions,
    /// The read's identity: its query, consistency mode and index, encoded. The query is kept
    /// only in this form while it waits, and decoded for each wait on the servers it starts.
    read: coalesce::Read,
    /// Not answered unchanged before this (the caller's `wait`).
    earliest: Instant,
    /// Until when the servers are asked to block: `wait` plus a jitter of at most `wait/32`.
    due: Instant,
    /// Answered by this whatever the servers do.
    deadline: Instant,
    /// The token of the request that asked, which the servers are asked with wherever the
    /// wait runs ([`crate::token`]).
    token: Option<String>,
}

impl Blocking {
    /// What it asks of the servers: its query, consistency mode and index, encoded (two
    /// blocking queries that ask the same share a wait).
    pub fn asks(&self) -> &Arc<[u8]> {
        &self.0.read
    }

    /// Waits for the answer. Local blocking queries of the same read (but `?consistent` ones)
    /// share one wait on the servers: a query joins one that answers no later than its own
    /// deadline, or starts its own. A shared wait started earlier can answer, unchanged,
    /// before this query's `wait` is over: it then waits again (joining or starting another),
    /// as it does not answer unchanged before its `wait`.
    pub fn answer(mut self) -> impl Future<Output = Answer> + Send {
        let token = self.0.token.take();
        crate::token::within(token, self.wait())
    }

    async fn wait(self) -> Answer {
        // What the wait needs is read from `asked` where it is used, not copied into variables
        // this future would keep across it.
        let asked = &*self.0;
        let _watcher = asked.waits.watcher();
        // A `?consistent` read has the leader confirm itself with a quorum for this request:
        // one confirmed for a wait that started before it would not do.
        if asked.opts.consistency == Consistency::Consistent {
            return asked.start().await;
        }
        // How long after its request this query came to the shared waits: one started
        // meanwhile by a query whose request came after its own may answer that much after
        // its deadline, and is joined all the same.
        let wait = Duration::from_millis(asked.opts.wait_ms);
        let late = asked
            .earliest
            .checked_sub(wait)
            .map_or(Duration::ZERO, |asked_at| asked_at.elapsed());
        loop {
            let (shared, joined) =
                asked
                    .waits
                    .join_or_start(&asked.read, asked.deadline, late, || asked.start());
            let answer = shared.await;
            match &*answer {
                Ok((_, meta))
                    if joined
                        && meta.index <= asked.opts.min_index
                        && Instant::now() < asked.earliest => {}
                _ => return Arc::unwrap_or_clone(answer),
            }
        }
    }
}

impl Asked {
    /// Its wait on the servers. Boxed, as the shared wait is: a waiting query holds the future
    /// that awaits it, which would otherwise keep room for a whole wait inline.
    fn start(&self) -> BoxFuture<'static, Answer> {
        match self.query() {
            Ok(query) => {
                let servers = Arc::clone(&self.servers);
                wait_on_servers(servers, self.opts, query, self.due, self.deadline).boxed()
            }
            Err(e) => std::future::ready(Err(e)).boxed(),
        }
    }

    /// The query, decoded from the read's identity.
    fn query(&self) -> Result<ReadQuery, ServerError> {
        postcard::from_bytes::<(Consistency, u64, ReadQuery)>(&self.read)
            .map(|(_, _, query)| query)
            .map_err(|e| ServerError::Internal(format!("a read's identity: {e}")))
    }
}

/// One blocking query on the servers, answered by `deadline` whatever they do. The servers are
/// asked to block until `due` (the caller's `wait` plus a jitter of at most `wait/32`; Consul's
/// is up to `wait/16`, the rest of it is this agent's margin), with retries until then. If none
/// has answered shortly after, a stale read from any server runs beside; if it is not behind
/// the index the caller knows, it is the answer, with `X-Consul-KnownLeader: false`, when by
/// the deadline the servers have not answered. Otherwise the deadline brings Consul's `No
/// cluster leader`.
#[expect(
    clippy::manual_async_fn,
    reason = "an `async fn` would keep its arguments twice"
)]
fn wait_on_servers(
    servers: Arc<dyn ServerApi>,
    opts: QueryOptions,
    query: ReadQuery,
    due: Instant,
    deadline: Instant,
) -> impl Future<Output = Result<(QueryResult, QueryMeta), ServerError>> + Send {
    async move {
        let servers = &*servers;
        // Half the margin lets a quiet query's answer, due at `due`, arrive.
        let grace = deadline.saturating_duration_since(due) / 2;
        // The fallback is made only once it is needed: a wait answered in time (nearly all of
        // them) holds no more than this while it waits.
        let primary = with_retries(servers, due, true, || {
            // A retry blocks only for what is left of the wait.
            let left = due.saturating_duration_since(Instant::now());
            let opts = QueryOptions {
                wait_ms: left.as_millis() as u64,
                ..opts
            };
            servers.query(opts, query.clone())
        });
        tokio::pin!(primary);
        let failed = match tokio::time::timeout_at(due + grace, primary.as_mut()).await {
            Ok(Err(e)) if e.safe_to_retry(true) => Some(e),
            Ok(result) => return result,
            Err(_) => None,
        };
        Box::pin(fall_back(servers, opts, &query, primary, failed, deadline)).await
    }
}

/// The rest of [`wait_on_servers`] once its servers have not answered in time: the `primary`
/// wait on them goes on (unless it `failed`), a stale read runs beside, and the deadline ends
/// both.
async fn fall_back<F>(
    servers: &dyn ServerApi,
    opts: QueryOptions,
    query: &ReadQuery,
    mut primary: std::pin::Pin<&mut F>,
    mut failed: Option<ServerError>,
    deadline: Instant,
) -> Result<(QueryResult, QueryMeta), ServerError>
where
    F: std::future::Future<Output = Result<(QueryResult, QueryMeta), ServerError>>,
{
    // From now on a stale read runs beside: the answer if the servers give none in time. A
    // server behind what the caller has seen (a lower index) has nothing to tell it: its
    // data could say a held lock is free.
    let fallback = async {
        let (result, meta) = servers.stale_read(query.clone()).await?;
        if meta.index < opts.min_index {
            return Err(ServerError::NoLeader);
        }
        let meta = QueryMeta {
            known_leader: false,
            ..meta
        };
        Ok((result, meta))
    };
    tokio::pin!(fallback);
    let expiry = tokio::time::sleep_until(deadline);
    tokio::pin!(expiry);
    let mut stale = None;
    let mut fallback_done = false;
    loop {
        tokio::select! {
            biased;
            result = &mut primary, if failed.is_none() => match result {
                Err(e) if e.safe_to_retry(true) => {
                    if let Some(answer) = stale.take() {
                        return Ok(answer);
                    }
                    if fallback_done {
                        return Err(e);
                    }
                    failed = Some(e);
                }
                result => return result,
            },
            answer = &mut fallback, if !fallback_done => {
                fallback_done = true;
                match (answer, failed.take()) {
                    (Ok(answer), None) => stale = Some(answer),
                    (Ok(answer), Some(_)) => return Ok(answer),
                    (Err(_), Some(e)) => return Err(e),
                    (Err(_), None) => {}
                }
            }
            () = &mut expiry => {
                return match stale {
                    Some(answer) => Ok(answer),
                    None => Err(failed.unwrap_or(ServerError::NoLeader)),
                };
            }
        }
    }
}
