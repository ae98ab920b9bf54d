//! Whose token a request to the servers is made with. An HTTP request runs its handler inside
//! [`scope`] with the token it presents (or the agent's default token, or the anonymous one),
//! so every server request the handler makes carries that token and the servers authorize it.
//! Everything else the agent sends (anti-entropy, check updates, reconciliation, the ACL index
//! watch) is the agent's own work and carries the agent token (`--acl-agent-token`, Consul's
//! `acl.tokens.agent`), with only what that token grants.

use std::future::Future;
use std::sync::Arc;

use futures::future::Either;
use parking_lot::RwLock;

tokio::task_local! {
    static REQUEST_TOKEN: String;
}

/// Runs `work` on behalf of the holder of `token` (empty: the anonymous token).
pub fn scope<F: Future>(token: String, work: F) -> impl Future<Output = F::Output> {
    REQUEST_TOKEN.scope(token, work)
}

/// `work` made on behalf of the token the current task works for, to run on another task
/// (`tokio::spawn` does not carry it over by itself).
pub fn inherit<F: Future>(work: F) -> impl Future<Output = F::Output> {
    within(carried(), work)
}

/// The token the current task works for, for work made now that runs later outside its
/// [`scope`] (`None` outside every scope).
pub fn carried() -> Option<String> {
    REQUEST_TOKEN.try_with(Clone::clone).ok()
}

/// Runs `work` on behalf of `token` if there is one ([`carried`]). This and the two above are
/// plain functions, not `async fn`s, which would keep `work` twice: as their argument, and as
/// what they await.
pub fn within<F: Future>(token: Option<String>, work: F) -> impl Future<Output = F::Output> {
    match token {
        Some(token) => Either::Left(REQUEST_TOKEN.scope(token, work)),
        None => Either::Right(work),
    }
}

/// The agent's own token, shared by whoever sets it (`--acl-agent-token`,
/// `PUT /v1/agent/token/agent`) and whoever sends requests.
/// `None` with ACLs disabled: requests then carry no token at all and go out as the requests
/// servers of every version understand (a cluster mid-upgrade keeps working); with ACLs on,
/// the servers must be upgraded first, as Consul's upgrade order has it.
#[derive(Debug, Clone, Default)]
pub struct AgentToken(Option<Arc<RwLock<String>>>);

impl AgentToken {
    /// An agent token for an agent with ACLs `enabled` or not.
    pub fn new(enabled: bool) -> AgentToken {
        AgentToken(enabled.then(Arc::default))
    }

    pub fn set(&self, token: String) {
        if let Some(agent) = &self.0 {
            *agent.write() = token;
        }
    }

    /// The token a request to the servers made now carries: the HTTP request's, inside one,
    /// else the agent's own; `None` with ACLs disabled.
    pub fn current(&self) -> Option<String> {
        let agent = self.0.as_ref()?;
        Some(
            REQUEST_TOKEN
                .try_with(Clone::clone)
                .unwrap_or_else(|_| agent.read().clone()),
        )
    }
}
