//! Writes, reads (blocking and in every consistency mode) and session renewals: each served
//! here when this server leads (or for a stale read), forwarded to the leader otherwise, as
//! [`Server::at_leader`] decides.

use tokio::sync::SemaphorePermit;

use super::acquire::Decided;
use super::forward::Hop;
use super::*;
use crate::state::reads::{AnyRead, Found};
use crate::watch::{Look, Waiting};

impl Server {
    /// Commits a state change, forwarding to the leader from a follower.
    pub async fn write(&self, op: Op) -> Result<Response, ServerError> {
        self.write_from(op, Hop::Caller).await
    }

    /// A state change, proposed at the leader. The leader may run the previous release, which
    /// cannot decode a newer op: it goes in the form the cluster's level applies, here or
    /// forwarded.
    pub(super) async fn write_from(&self, op: Op, hop: Hop) -> Result<Response, ServerError> {
        let level = self.shared.read().protocol();
        let (op, reply) = crate::protocol::downgrade(op, level)?;
        self.at_leader(calls::Write { op }, hop, |calls::Write { op }| {
            self.propose_here(op)
        })
        .await
        .map(|response| reply.restore(response))
    }

    /// Proposes a change on this server, the leader.
    async fn propose_here(&self, mut op: Op) -> Result<Response, ServerError> {
        let _turn = match self.decide_acquire(&op).await? {
            Decided::Refused(response) => return Ok(response),
            Decided::Propose(turn) => turn,
        };
        if let Op::CreateSession(session) = &mut op {
            check_ttl(&session.ttl, self.config.session_ttl_min)
                .map_err(ServerError::InvalidSessionTtl)?;
            let floor = u64::try_from(self.config.lock_delay_min.as_nanos()).unwrap_or(u64::MAX);
            session.lock_delay_ns = session.lock_delay_ns.max(floor);
        }
        self.proposer.propose(op).await
    }

    pub(super) fn meta(&self, index: u64) -> QueryMeta {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let last_contact_ms = if m.state == ServerState::Leader {
            0
        } else {
            self.last_leader_contact
                .lock()
                .map_or(0, |t| t.elapsed().as_millis() as u64)
        };
        QueryMeta {
            index: index.max(1),
            known_leader: m.current_leader.is_some(),
            last_contact_ms,
        }
    }

    /// Answers a read in the requested consistency mode, blocking while the result's index is
    /// not above `opts.min_index` (up to `opts.wait_ms`). Default and consistent reads are
    /// answered by the leader; stale ones by whichever server is asked.
    pub fn query(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
    ) -> impl Future<Output = Result<(QueryResult, QueryMeta), ServerError>> + Send + '_ {
        self.query_from(opts, query, Hop::Caller)
    }

    /// [`Server::query`] for a request that reached this server by `hop`. Routing, the
    /// consistency checks and the first look are boxed on their own and freed before a
    /// blocking read waits here: a waiting read holds its [`Waiting`] and its read, not the
    /// futures that led to them. A plain function, not an `async fn`, which would keep its
    /// arguments for as long as it runs.
    pub(super) fn query_from(
        &self,
        opts: QueryOptions,
        query: ReadQuery,
        hop: Hop,
    ) -> impl Future<Output = Result<(QueryResult, QueryMeta), ServerError>> + Send + '_ {
        let read = calls::Query { opts, query };
        let looked = Box::pin(self.at_leader(read, hop, |calls::Query { opts, query }| {
            self.look_here(opts, query)
        }));
        async move {
            let (waiting, read) = match looked.await {
                Looked::Answered(answer) => return answer,
                Looked::Waits(waiting, read) => (waiting, read),
            };
            let (result, index) = waiting
                .wait(
                    &self.shared.watches,
                    move || read.read(&self.shared.read()),
                    &self.shutdown,
                )
                .await;
            Ok(self.answer(result, index))
        }
    }

    /// A read's first look at this server's state, once the consistency mode's checks pass.
    async fn look_here(&self, opts: QueryOptions, query: ReadQuery) -> Looked<'_> {
        let read = AnyRead::from(query);
        let look = look_local(
            &self.raft,
            &self.shared,
            self.read_lease(),
            opts,
            &read,
            |found| self.blocking_slot(found),
        )
        .await;
        match look {
            Ok(Look::Answer(result, index)) => Looked::Answered(Ok(self.answer(result, index))),
            Ok(Look::Wait(waiting)) => Looked::Waits(waiting, read),
            Err(e) => Looked::Answered(Err(e)),
        }
    }

    /// A read's answer as this server gives it, counted.
    fn answer(&self, result: QueryResult, index: u64) -> (QueryResult, QueryMeta) {
        crate::telemetry::read_answered(&result);
        (result, self.meta(index))
    }

    /// Checks that this server leads under a valid read lease (see [`confirm_lease`]).
    pub(super) async fn confirmed_leader(&self) -> Result<(), ServerError> {
        confirm_lease(&self.raft, self.read_lease()).await
    }

    /// How recent a quorum's acknowledgement must be for the leader to answer reads and
    /// renewals alone: a heartbeat and a half, so heartbeats keep it fresh, and exactly as long
    /// as a follower must have gone without hearing from its leader before it campaigns, or
    /// waives its lease, on evidence that the leader is dead.
    pub(super) fn read_lease(&self) -> Duration {
        read_lease(self.config.raft)
    }

    /// Blocking queries this server holds now (its own and forwarded ones).
    pub fn blocking_queries(&self) -> usize {
        self.config.max_blocking_queries
            - self.blocking.available_permits()
            - self.lock_waits.available_permits()
    }

    /// A slot for one blocking query, or [`ServerError::TooManyBlockingQueries`] at once. A
    /// lock wait takes one of the reserve first, then one of the rest; anything else only one
    /// of the rest.
    fn blocking_slot(
        &self,
        found: &Found<QueryResult>,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, ServerError> {
        let reserved = if is_lock_wait(found) {
            self.lock_waits.try_acquire().ok()
        } else {
            None
        };
        match reserved {
            Some(permit) => Ok(permit),
            None => self
                .blocking
                .try_acquire()
                .map_err(|_| ServerError::TooManyBlockingQueries),
        }
    }

    /// Renews a session: resets its TTL timer on the leader. No raft write, but the leader
    /// confirms its lease first, as for a default read: a leader cut off from the quorum (or
    /// paused past its lease) must not acknowledge renewals while the others elect a leader
    /// that has never heard of them and expires the session on its checkpointed deadline.
    pub async fn renew_session(&self, id: &str) -> Result<Session, ServerError> {
        self.renew_from(id.to_owned(), Hop::Caller).await
    }

    pub(super) async fn renew_from(&self, id: String, hop: Hop) -> Result<Session, ServerError> {
        self.at_leader(calls::Renew { id }, hop, |calls::Renew { id }| {
            self.renew_here(id)
        })
        .await
    }

    async fn renew_here(&self, id: String) -> Result<Session, ServerError> {
        self.confirmed_leader().await?;
        let session = self
            .shared
            .read()
            .sessions()
            .get(&id)
            .cloned()
            .ok_or_else(|| ServerError::SessionNotFound(id.clone()))?;
        if let Some(ttl) = session_ttl(&session.ttl) {
            let (renewed, outcome) = tokio::sync::oneshot::channel();
            self.duties
                .send(DutyInput::Renew {
                    id: session.id.clone(),
                    ttl,
                    renewed,
                })
                .map_err(|_| ServerError::ShuttingDown)?;
            match outcome.await.map_err(|_| ServerError::ShuttingDown)? {
                Renewal::Renewed => {}
                // Its destroy is on its way: acknowledging would promise a TTL it will not get.
                Renewal::Expiring => return Err(ServerError::SessionNotFound(id)),
                Renewal::NotLeading => return Err(ServerError::NoLeader),
            }
        }
        Ok(session)
    }
}

/// A read as far as it goes before it waits: answered (here, or by the leader it was forwarded
/// to), or waiting here, with the read it looks again with.
#[expect(
    clippy::large_enum_variant,
    reason = "taken apart at once; boxing it would cost every read an allocation"
)]
enum Looked<'a> {
    Answered(Result<(QueryResult, QueryMeta), ServerError>),
    Waits(Waiting<SemaphorePermit<'a>>, AnyRead),
}

impl From<Result<(QueryResult, QueryMeta), ServerError>> for Looked<'_> {
    fn from(answer: Result<(QueryResult, QueryMeta), ServerError>) -> Self {
        Looked::Answered(answer)
    }
}

/// Answers a read from the state of the server whose raft is `raft`, once the consistency
/// mode's checks pass (`lease`: its read lease), blocking as [`crate::watch::blocking_read`]
/// does (`admit` and `stop` as there): [`look_local`], then the wait. [`Server`] takes the two
/// steps itself; the simulation's servers answer reads here.
pub async fn read_local<P>(
    raft: &Raft,
    shared: &SharedState,
    lease: Duration,
    opts: QueryOptions,
    query: ReadQuery,
    admit: impl FnOnce(&Found<QueryResult>) -> Result<P, ServerError>,
    stop: &CancellationToken,
) -> Result<(QueryResult, u64), ServerError> {
    let read = AnyRead::from(query);
    let looked = Box::pin(look_local(raft, shared, lease, opts, &read, admit));
    let waiting = match looked.await? {
        Look::Answer(result, index) => return Ok((result, index)),
        Look::Wait(waiting) => waiting,
    };
    Ok(waiting
        .wait(&shared.watches, || read.read(&shared.read()), stop)
        .await)
}

/// The first look of `read` at the state of the server whose raft is `raft`, once the
/// consistency mode's checks pass ([`crate::watch::first_look`], `admit` as there). A
/// blocking read's wait runs from its arrival: the checks count in it, as Consul's timer
/// starts before the leadership check of its loop, so a leader slow to confirm itself (a new
/// one applying what earlier leaders committed, one whose heartbeats are slow or lost) does
/// not hold the read beyond its wait (the deterministic simulation found reads held up to 3 s
/// beyond it: seeds 24, 53 and 2220 of vigil-sim).
async fn look_local<P>(
    raft: &Raft,
    shared: &SharedState,
    lease: Duration,
    opts: QueryOptions,
    read: &AnyRead,
    admit: impl FnOnce(&Found<QueryResult>) -> Result<P, ServerError>,
) -> Result<Look<P>, ServerError> {
    let arrived = Instant::now();
    let checks = async {
        match opts.consistency {
            Consistency::Stale => Ok(()),
            Consistency::Default => confirm_lease(raft, lease).await,
            Consistency::Consistent => raft
                .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
                .await
                .map(|_| ())
                .map_err(|_| ServerError::NoLeader),
        }
    };
    // A blocking read waits no longer for the checks than for its answer: a leader that cannot
    // confirm itself within the wait is refused then, as having none, and the caller asks
    // again or answers from its fallback (the agent's, by wait + wait/16). A read with no wait
    // left confirms as a plain one.
    if opts.min_index > 0 && opts.wait_ms > 0 {
        let wait = Duration::from_millis(opts.wait_ms);
        tokio::time::timeout(wait, checks)
            .await
            .map_err(|_| ServerError::NoLeader)??;
    } else {
        checks.await?;
    }
    // Whole milliseconds, rounded up: the wait ends no later for them.
    let checked_in = arrived.elapsed().as_micros().div_ceil(1000);
    let opts = QueryOptions {
        wait_ms: opts
            .wait_ms
            .saturating_sub(u64::try_from(checked_in).unwrap_or(u64::MAX)),
        ..opts
    };
    crate::watch::first_look(opts, || read.read(&shared.read()), admit)
}

/// Whether the server whose raft is `raft` leads, with raft running: a server whose raft
/// stopped (a storage failure) keeps the last state in its metrics, and must not claim
/// anything from it.
pub fn leads(raft: &Raft) -> bool {
    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    m.running_state.is_ok() && m.state == ServerState::Leader
}

/// Checks that the server whose raft is `raft` leads under a valid read lease (`lease`,
/// [`read_lease`]): a quorum acknowledged a message it sent within it (on the monotonic
/// clock), else a heartbeat round confirms it; then waits until everything committed is
/// applied. A leader paused longer than the lease (SIGSTOP, a long stall) has lost it when it
/// resumes, and finds the new term in that round instead of answering from its old one; a new
/// leader, or a server restarted as the leader of a term already over, answers only once it
/// has applied what earlier leaders committed. No one else can be elected while the lease
/// runs: a voter keeps raft's longer lease on the leader it follows, and waives it for a dead
/// leader only once it has not heard from it for the read lease (see `evidence`), so every vote
/// of a new majority comes after the old leader's lease ended.
pub async fn confirm_lease(raft: &Raft, lease: Duration) -> Result<(), ServerError> {
    if !leads(raft) {
        return Err(ServerError::NoLeader);
    }
    raft.ensure_linearizable(openraft::LinearizerOption::new(Some(lease), true))
        .await
        .map_err(|_| ServerError::NoLeader)?;
    Ok(())
}

/// [`Server::read_lease`] for raft timing `timing`.
pub fn read_lease(timing: RaftTiming) -> Duration {
    let heartbeat = Duration::from_millis(timing.heartbeat_ms);
    heartbeat + heartbeat / 2
}

/// Whether a read waits on a lock: a native lock's grant or holder's standing, or a KV key a
/// session holds (a Consul-style lock, watched by its waiters and its holder).
fn is_lock_wait(found: &Found<QueryResult>) -> bool {
    match (&found.interest, &found.output) {
        (Interest::LockStanding { .. }, _) => true,
        (Interest::Key(_), QueryResult::Entries(entries)) => {
            entries.iter().any(|entry| entry.session.is_some())
        }
        _ => false,
    }
}
