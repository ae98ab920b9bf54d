//! The authorizer a request's token resolves to: every rule the token reaches in this
//! datacenter, merged, over the default policy. It answers "may this token do `access` to
//! `resource` `name`?" the way Consul's policy authorizer chained over its default
//! authorizer does (`acl/policy_authorizer.go`, `acl/chained_authorizer.go`):
//!
//! - the governing rule for a name is its exact rule, else its longest prefix rule;
//! - `write` grants read, list and write; `list` grants list and read; `read` grants read;
//!   `deny` grants nothing and is final;
//! - no governing rule: the default policy decides (allow grants everything but ACL management,
//!   deny nothing). As Consul's allow-all authorizer, the default never grants `acl:read` or
//!   `acl:write` (and so never a snapshot, which needs `acl:write`): only a rule does.

use std::fmt;

use super::rules::{self, Level, Rules, RulesError, SegmentRules};
use super::{ANONYMOUS_TOKEN_ACCESSOR_ID, Resolved};
use crate::rpc::ReadQuery;

/// What a token may do where no rule says (Consul's `acl.default_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultPolicy {
    Allow,
    Deny,
}

/// What a rule can govern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    Acl,
    Agent,
    Event,
    Key,
    Keyring,
    Node,
    Operator,
    Query,
    Service,
    Session,
}

impl Resource {
    /// The name in rules and in permission errors (`key:write`).
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Acl => "acl",
            Resource::Agent => "agent",
            Resource::Event => "event",
            Resource::Key => "key",
            Resource::Keyring => "keyring",
            Resource::Node => "node",
            Resource::Operator => "operator",
            Resource::Query => "query",
            Resource::Service => "service",
            Resource::Session => "session",
        }
    }

    /// Whether rules for this resource name a segment (`key "a"`), rather than being one
    /// level for the whole resource (`operator = "read"`).
    pub fn is_segmented(self) -> bool {
        !matches!(self, Resource::Acl | Resource::Keyring | Resource::Operator)
    }
}

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    /// List keys under a prefix (only `key` rules grant it short of write).
    List,
    Write,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::List => "list",
            Access::Write => "write",
        }
    }
}

/// Consul's synthetic policy for a service identity: `service "<n>"` and
/// `service "<n>-sidecar-proxy"` write, `service_prefix ""` and `node_prefix ""` read.
/// Built directly rather than from template text, so no name can change its shape.
fn service_identity_rules(service: &str) -> Rules {
    let mut rules = Rules::default();
    rules.service.exact.insert(service.to_owned(), Level::Write);
    rules
        .service
        .exact
        .insert(format!("{service}-sidecar-proxy"), Level::Write);
    rules.service.prefix.insert(String::new(), Level::Read);
    rules.node.prefix.insert(String::new(), Level::Read);
    rules
}

/// Consul's synthetic policy for a node identity: `node "<n>"` write, `service_prefix ""`
/// read.
fn node_identity_rules(node: &str) -> Rules {
    let mut rules = Rules::default();
    rules.node.exact.insert(node.to_owned(), Level::Write);
    rules.service.prefix.insert(String::new(), Level::Read);
    rules
}

/// A token's permissions. Immutable once built, so share it behind an `Arc`.
#[derive(Debug, Clone)]
pub struct Authorizer {
    accessor_id: String,
    /// `None`: ACLs are disabled and everything is allowed.
    rules: Option<Rules>,
    default: DefaultPolicy,
}

impl Authorizer {
    /// ACLs disabled: everything allowed.
    pub fn allow_all() -> Authorizer {
        Authorizer {
            accessor_id: String::new(),
            rules: None,
            default: DefaultPolicy::Allow,
        }
    }

    /// The token's own policies (only those whose `datacenters` is empty or holds
    /// `datacenter`), its roles' policies, and the synthetic policies of its and its
    /// roles' service identities (scoped by their datacenters) and node identities (only
    /// those of `datacenter`), merged as Consul merges policies, over `default`.
    ///
    /// Errors if a policy's rules do not parse.
    pub fn new(
        resolved: &Resolved,
        datacenter: &str,
        default: DefaultPolicy,
    ) -> Result<Authorizer, RulesError> {
        let in_datacenter = |datacenters: &[String]| {
            datacenters.is_empty() || datacenters.iter().any(|dc| dc == datacenter)
        };
        let mut merged = Rules::default();
        let mut seen_policies = Vec::new();
        for policy in &resolved.policies {
            if seen_policies.contains(&&policy.id) || !in_datacenter(&policy.datacenters) {
                continue;
            }
            seen_policies.push(&policy.id);
            merged.merge(&rules::parse(&policy.rules)?);
        }

        let token = &resolved.token;
        let service_identities = token.service_identities.iter().chain(
            resolved
                .roles
                .iter()
                .flat_map(|role| &role.service_identities),
        );
        for identity in service_identities {
            if in_datacenter(&identity.datacenters) {
                merged.merge(&service_identity_rules(&identity.service_name));
            }
        }
        let node_identities = token
            .node_identities
            .iter()
            .chain(resolved.roles.iter().flat_map(|role| &role.node_identities));
        for identity in node_identities {
            if identity.datacenter == datacenter {
                merged.merge(&node_identity_rules(&identity.node_name));
            }
        }

        Ok(Authorizer {
            accessor_id: token.accessor_id.clone(),
            rules: Some(merged),
            default,
        })
    }

    /// Whether the token may do `access` to `resource` `name` (`name` is ignored for the
    /// unsegmented resources: acl, operator, keyring).
    pub fn allows(&self, resource: Resource, access: Access, name: &str) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        let governing = match resource {
            Resource::Acl => rules.acl,
            Resource::Keyring => rules.keyring,
            Resource::Operator => rules.operator,
            Resource::Agent => rules.agent.lookup(name),
            Resource::Event => rules.event.lookup(name),
            Resource::Key => rules.key.lookup(name),
            Resource::Node => rules.node.lookup(name),
            Resource::Query => rules.query.lookup(name),
            Resource::Service => rules.service.lookup(name),
            Resource::Session => rules.session.lookup(name),
        };
        match governing {
            Some(level) => grants(level, access),
            None => self.default == DefaultPolicy::Allow && resource != Resource::Acl,
        }
    }

    /// [`allows`](Self::allows), as an error naming what was missing.
    pub fn check(
        &self,
        resource: Resource,
        access: Access,
        name: &str,
    ) -> Result<(), PermissionDenied> {
        if self.allows(resource, access, name) {
            Ok(())
        } else {
            Err(self.denied(resource, access, name))
        }
    }

    /// Whether the token may write every key under `prefix` (Consul's `KeyWritePrefix`, for
    /// a recursive delete): the longest prefix rule covering `prefix` grants write, and no
    /// rule, exact or prefix, at or under `prefix` grants less than write. With no covering
    /// prefix rule and nothing under it, the default policy decides.
    pub fn key_write_prefix(&self, prefix: &str) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        let key: &SegmentRules = &rules.key;
        let covering = key
            .prefix
            .iter()
            .filter(|(segment, _)| prefix.starts_with(segment.as_str()))
            .max_by_key(|(segment, _)| segment.len())
            .map(|(_, level)| *level);
        if covering.is_some_and(|level| level != Level::Write) {
            return false;
        }
        let under = |(segment, level): (&String, &Level)| {
            segment.starts_with(prefix) && *level != Level::Write
        };
        if key.exact.iter().any(under) || key.prefix.iter().any(under) {
            return false;
        }
        match covering {
            Some(_) => true,
            None => self.default == DefaultPolicy::Allow,
        }
    }

    /// [`key_write_prefix`](Self::key_write_prefix), as an error naming what was missing.
    pub fn check_key_write_prefix(&self, prefix: &str) -> Result<(), PermissionDenied> {
        if self.key_write_prefix(prefix) {
            Ok(())
        } else {
            Err(self.denied(Resource::Key, Access::Write, prefix))
        }
    }

    /// Whether the token may read some name of a segmented `resource` starting with
    /// `prefix` (`""`: any name at all): a rule at or under `prefix` grants read, or the
    /// longest prefix rule covering `prefix` does, or, with no covering rule, the default
    /// policy allows. `false` means no name under `prefix` can ever be read, whatever exists,
    /// so a read of them answers nothing and is not worth blocking for.
    pub fn may_read_under(&self, resource: Resource, prefix: &str) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        let segments: &SegmentRules = match resource {
            Resource::Agent => &rules.agent,
            Resource::Event => &rules.event,
            Resource::Key => &rules.key,
            Resource::Node => &rules.node,
            Resource::Query => &rules.query,
            Resource::Service => &rules.service,
            Resource::Session => &rules.session,
            Resource::Acl | Resource::Keyring | Resource::Operator => {
                return self.allows(resource, Access::Read, "");
            }
        };
        let readable_under = |(segment, level): (&String, &Level)| {
            segment.starts_with(prefix) && grants(*level, Access::Read)
        };
        if segments.exact.iter().any(readable_under) || segments.prefix.iter().any(readable_under) {
            return true;
        }
        let covering = segments
            .prefix
            .iter()
            .filter(|(segment, _)| prefix.starts_with(segment.as_str()))
            .max_by_key(|(segment, _)| segment.len())
            .map(|(_, level)| *level);
        match covering {
            Some(level) => grants(level, Access::Read),
            None => self.default == DefaultPolicy::Allow,
        }
    }

    /// Whether `query` can never answer this token anything: whatever the state holds, every
    /// result would be cut away by its filter (or refused by the agent's own check). Such a
    /// read is answered at once, never held as a blocking query: a token that may see nothing
    /// cannot use up the servers' blocking-query budget by waiting on what it cannot see.
    pub fn sees_nothing(&self, query: &ReadQuery) -> bool {
        let read = |resource, name: &str| self.allows(resource, Access::Read, name);
        match query {
            ReadQuery::KvGet { key } => !read(Resource::Key, key),
            ReadQuery::KvList { prefix }
            | ReadQuery::KvKeys { prefix, .. }
            | ReadQuery::Locks { prefix } => !self.may_read_under(Resource::Key, prefix),
            ReadQuery::Lock { name }
            | ReadQuery::History {
                name,
                prefix: false,
            } => !read(Resource::Key, name),
            ReadQuery::History { name, prefix: true } => !self.may_read_under(Resource::Key, name),
            ReadQuery::SessionInfo { .. } | ReadQuery::SessionList {} => {
                !self.may_read_under(Resource::Session, "")
            }
            ReadQuery::SessionNode { node } => !read(Resource::Session, node),
            ReadQuery::CatalogNodes {} => !self.may_read_under(Resource::Node, ""),
            ReadQuery::CatalogServices {} | ReadQuery::CatalogServicesFull {} => {
                !self.may_read_under(Resource::Service, "")
            }
            ReadQuery::CatalogService { name }
            | ReadQuery::CatalogServiceFull { name }
            | ReadQuery::ServiceChecks { name }
            | ReadQuery::HealthService { name }
            | ReadQuery::HealthServiceFull { name } => !read(Resource::Service, name),
            ReadQuery::CatalogNode { node }
            | ReadQuery::CatalogNodeFull { node }
            | ReadQuery::NodeChecks { node } => !read(Resource::Node, node),
            ReadQuery::ChecksInState { .. } => {
                !self.may_read_under(Resource::Node, "")
                    && !self.may_read_under(Resource::Service, "")
            }
            // Unnamed queries are listed to management only.
            ReadQuery::QueryList {}
            | ReadQuery::QueryGet { .. }
            | ReadQuery::QueryListFull {}
            | ReadQuery::QueryGetFull { .. } => {
                !self.may_read_under(Resource::Query, "")
                    && !self.allows(Resource::Acl, Access::Write, "")
            }
            ReadQuery::AclPolicy { .. }
            | ReadQuery::AclPolicyList {}
            | ReadQuery::AclRole { .. }
            | ReadQuery::AclRoleList {} => !read(Resource::Acl, ""),
            // Refused outright without the permission, or answered whole (a prepared query's
            // run, a token's own lookup): never a filtered wait.
            ReadQuery::Txn { .. }
            | ReadQuery::Sequencer { .. }
            | ReadQuery::QueryExecute { .. }
            | ReadQuery::QueryExecuteFull { .. }
            | ReadQuery::LockStanding { .. }
            | ReadQuery::LockSequencer { .. }
            | ReadQuery::LockHold { .. }
            | ReadQuery::AclResolve { .. }
            | ReadQuery::AclToken { .. }
            | ReadQuery::AclTokenList {} => false,
        }
    }

    /// The token's accessor ID (empty when ACLs are disabled).
    pub fn accessor_id(&self) -> &str {
        &self.accessor_id
    }

    fn denied(&self, resource: Resource, access: Access, name: &str) -> PermissionDenied {
        PermissionDenied {
            accessor_id: self.accessor_id.clone(),
            resource,
            access,
            name: if resource.is_segmented() {
                name.to_owned()
            } else {
                String::new()
            },
        }
    }
}

/// Consul's `enforce`: what a rule's level grants.
fn grants(level: Level, access: Access) -> bool {
    match level {
        Level::Write => true,
        Level::List => matches!(access, Access::List | Access::Read),
        Level::Read => access == Access::Read,
        Level::Deny => false,
    }
}

/// A request the token may not make. Displays as Consul's `PermissionDeniedError`, e.g.
/// `Permission denied: token with AccessorID '<id>' lacks permission 'key:write' on "app/x"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionDenied {
    pub accessor_id: String,
    pub resource: Resource,
    pub access: Access,
    /// Empty for the unsegmented resources; then the text says no `on ...`.
    pub name: String,
}

impl fmt::Display for PermissionDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let anonymous = self.accessor_id == ANONYMOUS_TOKEN_ACCESSOR_ID;
        f.write_str("Permission denied")?;
        if anonymous {
            f.write_str(": anonymous token")?;
        } else {
            write!(f, ": token with AccessorID '{}'", self.accessor_id)?;
        }
        write!(
            f,
            " lacks permission '{}:{}'",
            self.resource.as_str(),
            self.access.as_str()
        )?;
        if !self.name.is_empty() {
            write!(f, " on \"{}\"", self.name)?;
        }
        if anonymous {
            f.write_str(
                ". The anonymous token is used implicitly when a request does not specify a token.",
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for PermissionDenied {}
