//! Resolving a request's token to what it may do. With ACLs enabled every HTTP request's token
//! (or the anonymous token when it brings none) is resolved through the servers to an
//! [`Authorizer`], cached by secret until the ACL tables change: one blocking query per agent
//! follows the tables' index, so a deleted or changed token stops working as soon as the
//! agent hears of it. Expiry is checked on every use. The agent's own work (anti-entropy,
//! reconciliation) does not pass through here: it carries the agent token to the servers,
//! which check it ([`crate::token`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil_shared::acl::authz::{Authorizer, DefaultPolicy};
use vigil_shared::acl::{ANONYMOUS_TOKEN_ACCESSOR_ID, ANONYMOUS_TOKEN_SECRET, Resolved, Token};
use vigil_shared::rpc::{Consistency, QueryOptions, ServerError, reads};

use crate::backend::Backend;
use crate::token::AgentToken;

/// How long the ACL index watcher blocks per query.
const WATCH_WAIT: Duration = Duration::from_secs(300);
/// Pause after a failed watch before the next.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// The ACL settings of an agent (Consul's `acl` block).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AclConfig {
    /// `None`: ACLs are disabled and every request may do anything.
    pub default_policy: Option<DefaultPolicy>,
    /// Consul's `acl.tokens.initial_management`: created by the leader at its first term.
    pub initial_management: Option<String>,
    /// Consul's `acl.tokens.agent`: the token this agent's own requests use.
    pub agent_token: Option<String>,
}

/// Why a token was not resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No such token, or it has expired (Consul's 403 `ACL not found`).
    #[error("ACL not found")]
    NotFound,
    #[error("{0}")]
    Rules(String),
    #[error(transparent)]
    Server(#[from] ServerError),
}

struct Cached {
    /// The ACL tables' index it was resolved at.
    index: u64,
    expires_ms: Option<u64>,
    /// `None`: no such token at that index (a negative entry, so a stream of made-up tokens
    /// costs one server read per token and ACL change, not one per request).
    authz: Option<Arc<Authorizer>>,
}

/// Resolves tokens for the HTTP API.
pub struct Acls {
    default_policy: Option<DefaultPolicy>,
    datacenter: String,
    backend: Arc<Backend>,
    index: watch::Receiver<u64>,
    cache: Mutex<HashMap<String, Cached>>,
    /// What every request may do with ACLs disabled (one, shared).
    open: Arc<Authorizer>,
    /// The tokens set through `PUT /v1/agent/token/<kind>` (Consul's `acl.tokens`), by kind;
    /// `default` is what a request without a token uses instead of the anonymous token.
    tokens: Mutex<HashMap<TokenKind, String>>,
    /// The agent token as the server requests of the agent's own work carry it.
    agent_token: AgentToken,
}

/// The agent's own tokens (`/v1/agent/token/<kind>`), under Consul's names and its legacy ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Default,
    Agent,
    AgentRecovery,
    Replication,
    /// The token the agent registers its config file's services with.
    ConfigFileRegistration,
}

impl TokenKind {
    pub fn parse(name: &str) -> Option<TokenKind> {
        Some(match name {
            "default" | "acl_token" => TokenKind::Default,
            "agent" | "acl_agent_token" => TokenKind::Agent,
            "agent_recovery" | "agent_master" | "acl_agent_master_token" => {
                TokenKind::AgentRecovery
            }
            "replication" | "acl_replication_token" => TokenKind::Replication,
            "config_file_service_registration" => TokenKind::ConfigFileRegistration,
            _ => return None,
        })
    }
}

impl Acls {
    /// With ACLs enabled, starts the watcher that follows the ACL tables' index (it ends with
    /// `shutdown`).
    pub fn new(
        config: &AclConfig,
        datacenter: &str,
        backend: Arc<Backend>,
        shutdown: CancellationToken,
        agent_token: AgentToken,
    ) -> Acls {
        agent_token.set(config.agent_token.clone().unwrap_or_default());
        let (tx, index) = watch::channel(0);
        if config.default_policy.is_some() {
            tokio::spawn(watch_index(Arc::clone(&backend), tx, shutdown));
        }
        Acls {
            default_policy: config.default_policy,
            datacenter: datacenter.to_owned(),
            backend,
            index,
            cache: Mutex::new(HashMap::new()),
            open: Arc::new(Authorizer::allow_all()),
            tokens: Mutex::new(
                config
                    .agent_token
                    .iter()
                    .map(|t| (TokenKind::Agent, t.clone()))
                    .collect(),
            ),
            agent_token,
        }
    }

    /// Sets one of the agent's tokens (an empty one clears it).
    pub fn set_token(&self, kind: TokenKind, token: String) {
        if kind == TokenKind::Agent {
            self.agent_token.set(token.clone());
        }
        let mut tokens = self.tokens.lock();
        if token.is_empty() {
            tokens.remove(&kind);
        } else {
            tokens.insert(kind, token);
        }
    }

    /// The token a request that presents none is made with: the agent's default token, else
    /// the anonymous token (empty).
    pub fn default_token(&self) -> String {
        self.tokens
            .lock()
            .get(&TokenKind::Default)
            .cloned()
            .unwrap_or_default()
    }

    pub fn enabled(&self) -> bool {
        self.default_policy.is_some()
    }

    /// What the token with `secret` (none or empty: the anonymous token) may do.
    pub async fn authorize(&self, secret: Option<&str>) -> Result<Arc<Authorizer>, ResolveError> {
        let Some(default) = self.default_policy else {
            return Ok(Arc::clone(&self.open));
        };
        let default_token = self.tokens.lock().get(&TokenKind::Default).cloned();
        let secret = secret
            .filter(|s| !s.is_empty())
            .or(default_token.as_deref())
            .unwrap_or(ANONYMOUS_TOKEN_SECRET);
        let now = vigil_server::proposer::wall_ms();
        let current = *self.index.borrow();
        if let Some(c) = self.cache.lock().get(secret)
            && c.index == current
            && current != 0
        {
            return match (&c.authz, c.expires_ms) {
                (None, _) => Err(ResolveError::NotFound),
                (Some(_), Some(at)) if at <= now => Err(ResolveError::NotFound),
                (Some(authz), _) => Ok(Arc::clone(authz)),
            };
        }
        let (resolved, meta) = self
            .backend
            .read(
                QueryOptions::default(),
                reads::AclResolve {
                    secret_id: secret.to_owned(),
                },
            )
            .await?;
        let resolved = match resolved {
            Some(r) if !r.token.expired(now) => r,
            // The leader has not written the anonymous token yet: only the default applies.
            _ if secret == ANONYMOUS_TOKEN_SECRET => Resolved {
                token: Token::new(ANONYMOUS_TOKEN_ACCESSOR_ID, ANONYMOUS_TOKEN_SECRET),
                roles: Vec::new(),
                policies: Vec::new(),
            },
            _ => {
                self.remember(secret, meta.index, None, None);
                return Err(ResolveError::NotFound);
            }
        };
        let authz = Arc::new(
            Authorizer::new(&resolved, &self.datacenter, default)
                .map_err(|e| ResolveError::Rules(e.to_string()))?,
        );
        let expires_ms = resolved.token.expiration_time_ms;
        self.remember(secret, meta.index, expires_ms, Some(Arc::clone(&authz)));
        Ok(authz)
    }

    /// Caches what `secret` resolved to at the ACL tables' `index` (`None`: nothing).
    fn remember(
        &self,
        secret: &str,
        index: u64,
        expires_ms: Option<u64>,
        authz: Option<Arc<Authorizer>>,
    ) {
        let mut cache = self.cache.lock();
        if cache.len() > 4096 {
            cache.clear();
        }
        let entry = Cached {
            index,
            expires_ms,
            authz,
        };
        cache.insert(secret.to_owned(), entry);
    }
}

/// Follows the ACL tables' index with blocking reads, so cached authorizers are dropped as soon
/// as a token, policy or role changes.
async fn watch_index(backend: Arc<Backend>, tx: watch::Sender<u64>, shutdown: CancellationToken) {
    let mut index = 0;
    loop {
        let opts = QueryOptions {
            consistency: Consistency::Default,
            min_index: index,
            wait_ms: WATCH_WAIT.as_millis() as u64,
        };
        let read = backend.read(opts, reads::AclPolicyList {});
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            result = read => result,
        };
        match result {
            Ok((_, meta)) => {
                index = meta.index;
                tx.send_replace(index);
            }
            Err(e) => {
                tracing::debug!(error = %e, "ACL index watch failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(WATCH_RETRY) => {}
                }
            }
        }
    }
}
