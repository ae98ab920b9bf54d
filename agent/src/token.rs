//! Whose token a request to the servers is made with. An HTTP request runs its handler inside
//! [`scope`] with the token it presents (or the agent's default token, or the anonymous one),
//! so every server request the handler makes carries that token and the servers authorize it.
//! Everything else the agent sends (anti-entropy, check updates, reconciliation, the ACL index
//! watch) is the agent's own work and carries the agent token (`--acl-agent-token`, Consul's
//! `acl.tokens.agent`), with only what that token grants.

use std::future::Future;
use std::sync::Arc;

use parking_lot::RwLock;

tokio::task_local! {
    static REQUEST_TOKEN: String;
}

/// Runs `work` on behalf of the holder of `token` (empty: the anonymous token).
pub async fn scope<F: Future>(token: String, work: F) -> F::Output {
    REQUEST_TOKEN.scope(token, work).await
}

/// `work` made on behalf of the token the current task works for, to run on another task
/// (`tokio::spawn` does not carry it over by itself).
pub fn inherit<F: Future>(work: F) -> impl Future<Output = F::Output> {
    let token = REQUEST_TOKEN.try_with(Clone::clone).ok();
    async move {
        match token {
            Some(token) => REQUEST_TOKEN.scope(token, work).await,
            None => work.await,
        }
    }
}

/// The agent's own token, shared by whoever sets it (`--acl-agent-token`,
/// `PUT /v1/agent/token/agent`) and whoever sends requests.
#[derive(Debug, Clone, Default)]
pub struct AgentToken(Arc<RwLock<String>>);

impl AgentToken {
    pub fn set(&self, token: String) {
        *self.0.write() = token;
    }

    /// The token a request to the servers made now carries: the HTTP request's, inside one,
    /// else the agent's own.
    pub fn current(&self) -> String {
        REQUEST_TOKEN
            .try_with(Clone::clone)
            .unwrap_or_else(|_| self.0.read().clone())
    }
}
