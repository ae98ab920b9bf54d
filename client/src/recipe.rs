//! What the recipes share: the session they hold their entries with, and, for the recipes with
//! one entry per contender (a semaphore slot, a KV fair mutex), writing that entry,
//! `<prefix>/<session>`, acquired by the contender's own session.

use std::time::Duration;

use vigil_shared::session::Behavior;

use super::keeper::SessionKeeper;
use super::lock::DEFAULT_LOCK_SESSION_TTL;
use super::session::SessionRequest;
use super::{Client, ClientError, path};

/// The check every session is bound to unless told otherwise: the node's gossip health.
const SERF_HEALTH: &str = "serfHealth";

/// The session a recipe holds its entries with: Go's `SessionName`, `SessionTTL`, `LockDelay`
/// and `Session` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeSession {
    pub name: String,
    pub ttl: Duration,
    /// `None`: the agent's default (15 s).
    pub lock_delay: Option<Duration>,
    /// A session the caller keeps alive (`api.LockOptions.Session`), reused by every
    /// acquisition; `None`: a new session per acquisition, destroyed on release.
    pub reuse: Option<String>,
    /// Bind a new session to this process as well as `serfHealth` (see
    /// [`Client::process_check`]): the process's exit invalidates it at once, while a stopped
    /// or slow process keeps it. Only where the agent runs on this host; elsewhere, or if the
    /// agent refuses the check, the session is bound to `serfHealth` alone.
    pub bind_process: bool,
}

impl RecipeSession {
    /// A new session per acquisition, named `name`, with Go's 15 s TTL and the agent's lock-delay.
    pub fn new(name: &str) -> RecipeSession {
        RecipeSession {
            name: name.to_owned(),
            ttl: DEFAULT_LOCK_SESSION_TTL,
            lock_delay: None,
            reuse: None,
            bind_process: true,
        }
    }

    /// The caller's session, or a new one whose entries `behavior` says what becomes of when it
    /// ends; kept alive until the keeper closes.
    pub(crate) async fn keep(
        &self,
        client: &Client,
        behavior: Behavior,
    ) -> Result<SessionKeeper, ClientError> {
        let mut request = SessionRequest {
            name: self.name.clone(),
            ttl: Some(self.ttl),
            lock_delay: self.lock_delay,
            behavior,
            ..SessionRequest::default()
        };
        if self.bind_process && self.reuse.is_none() {
            match client.process_check().await {
                Ok(Some(check)) => {
                    request.node_checks = Some(vec![SERF_HEALTH.to_owned()]);
                    request.service_checks = Some(vec![check]);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e,
                    "could not bind the session to this process; bound to serfHealth only"),
            }
        }
        SessionKeeper::reuse_or_create(client, self.reuse.as_deref(), &request).await
    }
}

/// Writes `<prefix>/<session>` with `value` and `flags`, acquired by `session`; its key.
pub(crate) async fn contender_entry(
    client: &Client,
    prefix: &str,
    value: &[u8],
    flags: u64,
    session: &str,
) -> Result<String, ClientError> {
    let key = path::join(&[prefix, session]);
    if !client
        .kv_acquire(&key, value, flags, session)
        .await?
        .acquired
    {
        return Err(ClientError::ContenderEntry);
    }
    Ok(key)
}
