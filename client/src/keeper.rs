//! The session keeper: creates a TTL session, renews it every TTL/2 (retrying every second on
//! errors, as Go's `RenewPeriodic` does), and reports it lost on a 404 or after a full TTL without
//! a successful renew. Closing or dropping it runs the registered cleanups (release or delete the
//! keys it holds) and then destroys the session. A keeper [`borrowed`](SessionKeeper::borrowed)
//! from a session someone else keeps alive (Consul's `LockOptions.Session`) neither renews nor
//! destroys it: closing it runs the cleanups only.
//!
//! Either kind also counts its session lost the moment the agent, when it runs on this host,
//! refuses a connection ([`LossReason::AgentGone`], see [`super::liveness`]): the session is
//! bound to that agent's node, and the cluster frees its locks soon after the agent dies.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use vigil_shared::go::duration::parse_go_duration;

use super::liveness::lose_on_refusal;
use super::lost::{LossReason, LostSignal, LostTrigger};
use super::{Client, ClientError, SessionRequest};

/// Pause between failed renew attempts.
const RENEW_RETRY: Duration = Duration::from_secs(1);
/// Longest a single renew request may take.
const RENEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Work to do before the session is destroyed (release a lock, delete a contender key).
pub(crate) type Cleanup = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;

/// A session kept alive in the background. See the module doc.
pub struct SessionKeeper {
    client: Client,
    id: String,
    ttl: Duration,
    lost: LostSignal,
    /// A borrowed keeper's own loss signal, fired only by the agent watch (otherwise the
    /// recipe's monitor notices a lost session through what it watches).
    _borrowed_signal: Option<LostTrigger>,
    /// `None` for a borrowed session: its owner renews and destroys it.
    renewer: Option<JoinHandle<()>>,
    /// Counts the session lost when the agent refuses a connection; `None` for a remote agent.
    agent_watch: Option<JoinHandle<()>>,
    cleanups: Vec<Cleanup>,
    closed: bool,
}

impl SessionKeeper {
    /// Creates the session (`request.ttl` must be set) and starts renewing it.
    pub async fn create(
        client: &Client,
        request: &SessionRequest,
    ) -> Result<SessionKeeper, ClientError> {
        let ttl = request.ttl.unwrap_or(Duration::from_secs(15));
        let request = SessionRequest {
            ttl: Some(ttl),
            ..request.clone()
        };
        let id = client.session_create(&request).await?;
        let (trigger, lost) = LostTrigger::new();
        let agent_watch = watch_agent(client, &trigger);
        let renewer = tokio::spawn(renew(client.clone(), id.clone(), ttl, trigger));
        Ok(SessionKeeper {
            client: client.clone(),
            id,
            ttl,
            lost,
            _borrowed_signal: None,
            renewer: Some(renewer),
            agent_watch,
            cleanups: Vec::new(),
            closed: false,
        })
    }

    /// A keeper for session `id`, which its owner keeps alive (`ttl`: how long the holder's
    /// monitor tolerates an unreachable agent). Its loss is noticed by what the recipe watches.
    pub fn borrowed(client: &Client, id: &str, ttl: Duration) -> SessionKeeper {
        let (trigger, lost) = LostTrigger::new();
        let agent_watch = watch_agent(client, &trigger);
        SessionKeeper {
            client: client.clone(),
            id: id.to_owned(),
            ttl,
            lost,
            _borrowed_signal: Some(trigger),
            renewer: None,
            agent_watch,
            cleanups: Vec::new(),
            closed: false,
        }
    }

    /// The caller's session `id` if given, else a new one made from `request`.
    pub async fn reuse_or_create(
        client: &Client,
        id: Option<&str>,
        request: &SessionRequest,
    ) -> Result<SessionKeeper, ClientError> {
        match id {
            Some(id) => Ok(SessionKeeper::borrowed(
                client,
                id,
                request.ttl.unwrap_or(Duration::from_secs(15)),
            )),
            None => SessionKeeper::create(client, request).await,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Resolves when the session is known to be gone (or unreachable past its TTL).
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Registers work to run, in order, before the session is destroyed.
    pub(crate) fn on_close(&mut self, cleanup: Cleanup) {
        self.cleanups.push(cleanup);
    }

    pub(crate) fn clear_cleanups(&mut self) {
        self.cleanups.clear();
    }

    /// Stops renewing, runs the cleanups, destroys the session. Returns the first error.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.closed = true;
        let owned = self.stop_renewing();
        let cleanups = std::mem::take(&mut self.cleanups);
        finish(self.client.clone(), self.id.clone(), cleanups, owned).await
    }

    /// Stops the renewer and the agent watch; whether this keeper owns (and so destroys) the
    /// session.
    fn stop_renewing(&mut self) -> bool {
        if let Some(watch) = self.agent_watch.take() {
            watch.abort();
        }
        match self.renewer.take() {
            Some(renewer) => {
                renewer.abort();
                true
            }
            None => false,
        }
    }
}

impl Drop for SessionKeeper {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let owned = self.stop_renewing();
        let cleanups = std::mem::take(&mut self.cleanups);
        let (client, id) = (self.client.clone(), self.id.clone());
        self.client.spawn_cleanup(async move {
            if let Err(e) = finish(client, id.clone(), cleanups, owned).await {
                tracing::warn!(session = %id, error = %e, "cleanup after drop failed");
            }
        });
    }
}

/// Fires `trigger` when the agent refuses a connection, if it runs on this host.
fn watch_agent(client: &Client, trigger: &LostTrigger) -> Option<JoinHandle<()>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let refusals = client.agent_refusals()?;
    Some(runtime.spawn(lose_on_refusal(refusals, trigger.clone())))
}

async fn finish(
    client: Client,
    id: String,
    cleanups: Vec<Cleanup>,
    destroy: bool,
) -> Result<(), ClientError> {
    let mut first_error = None;
    for cleanup in cleanups {
        if let Err(e) = cleanup.await {
            first_error.get_or_insert(e);
        }
    }
    if destroy && let Err(e) = client.session_destroy(&id).await {
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

/// The renew loop; ends when the session is lost (or the task is aborted).
async fn renew(client: Client, id: String, mut ttl: Duration, trigger: LostTrigger) {
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(ttl / 2).await;
        loop {
            let budget = ttl.saturating_sub(last_ok.elapsed());
            if budget.is_zero() {
                tracing::warn!(session = %id, "no successful renew for a full TTL");
                trigger.fire(LossReason::Unreachable);
                return;
            }
            match tokio::time::timeout(budget.min(RENEW_TIMEOUT), client.session_renew(&id)).await {
                Ok(Ok(Some(session))) => {
                    last_ok = Instant::now();
                    // Honour a TTL the server changed.
                    if let Ok(new_ttl) = parse_go_duration(&session.ttl)
                        && !new_ttl.is_zero()
                    {
                        ttl = new_ttl;
                    }
                    break;
                }
                Ok(Ok(None)) => {
                    trigger.fire(LossReason::SessionInvalidated);
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(session = %id, error = %e, "renew failed, retrying");
                    tokio::time::sleep(RENEW_RETRY.min(budget)).await;
                }
                Err(_) => tracing::debug!(session = %id, "renew timed out, retrying"),
            }
        }
    }
}
