//! Access control, as Consul's ACL system: tokens, policies and roles (replicated state), the
//! rule language policies are written in ([`rules`]) and the authorizer a request's token
//! resolves to ([`authz`]). A token grants what its policies, its roles' policies and its
//! service and node identities grant; anything no rule covers falls to the default policy.

use serde::{Deserialize, Serialize};

pub mod authz;
pub mod rules;
#[cfg(test)]
mod tests;

/// The built-in policy that grants everything (Consul's `global-management`).
pub const GLOBAL_MANAGEMENT_POLICY_ID: &str = "00000000-0000-0000-0000-000000000001";
pub const GLOBAL_MANAGEMENT_POLICY_NAME: &str = "global-management";
/// The rules of [`GLOBAL_MANAGEMENT_POLICY_ID`], as Consul writes them.
pub const GLOBAL_MANAGEMENT_RULES: &str = r#"
acl = "write"
agent_prefix "" {
  policy = "write"
}
event_prefix "" {
  policy = "write"
}
key_prefix "" {
  policy = "write"
}
keyring = "write"
node_prefix "" {
  policy = "write"
}
operator = "write"
mesh = "write"
peering = "write"
query_prefix "" {
  policy = "write"
}
service_prefix "" {
  policy = "write"
  intentions = "write"
}
session_prefix "" {
  policy = "write"
}"#;
/// The token a request without one acts as.
pub const ANONYMOUS_TOKEN_ACCESSOR_ID: &str = "00000000-0000-0000-0000-000000000002";
pub const ANONYMOUS_TOKEN_SECRET: &str = "anonymous";

/// A link from a token or role to a policy or role, by ID. The name is filled in when read
/// (a renamed policy shows its new name; a deleted one is left out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub id: String,
    pub name: String,
}

/// Grants what a service's own token needs (Consul's `ServiceIdentity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceIdentity {
    pub service_name: String,
    /// Empty: every datacenter.
    pub datacenters: Vec<String>,
}

/// Grants what a node's agent token needs (Consul's `NodeIdentity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub node_name: String,
    pub datacenter: String,
}

/// An ACL token. The accessor ID names it; the secret ID is what a client presents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub accessor_id: String,
    pub secret_id: String,
    pub description: String,
    pub policies: Vec<Link>,
    pub roles: Vec<Link>,
    pub service_identities: Vec<ServiceIdentity>,
    pub node_identities: Vec<NodeIdentity>,
    pub local: bool,
    /// Nanoseconds, as the client asked (0: none); `expiration_time_ms` is what counts.
    pub expiration_ttl_ns: u64,
    /// Milliseconds since the Unix epoch after which the token stops working.
    pub expiration_time_ms: Option<u64>,
    pub create_time_ms: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

impl Token {
    /// A token with these IDs and nothing else: no description, links or expiry.
    pub fn new(accessor_id: impl Into<String>, secret_id: impl Into<String>) -> Token {
        Token {
            accessor_id: accessor_id.into(),
            secret_id: secret_id.into(),
            description: String::new(),
            policies: Vec::new(),
            roles: Vec::new(),
            service_identities: Vec::new(),
            node_identities: Vec::new(),
            local: false,
            expiration_ttl_ns: 0,
            expiration_time_ms: None,
            create_time_ms: 0,
            create_index: 0,
            modify_index: 0,
        }
    }

    /// Whether the token has expired at `now_ms` (milliseconds since the Unix epoch).
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expiration_time_ms.is_some_and(|at| at <= now_ms)
    }
}

/// A named set of rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub id: String,
    pub name: String,
    pub description: String,
    /// The rules, as written (HCL or JSON; see [`rules::parse`]).
    pub rules: String,
    pub datacenters: Vec<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A named set of policies and identities that tokens link to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    pub id: String,
    pub name: String,
    pub description: String,
    pub policies: Vec<Link>,
    pub service_identities: Vec<ServiceIdentity>,
    pub node_identities: Vec<NodeIdentity>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// What a token resolves to: the token, its roles, and every policy it reaches directly or
/// through its roles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub token: Token,
    pub roles: Vec<Role>,
    pub policies: Vec<Policy>,
}
