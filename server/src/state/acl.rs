//! The ACL tables: tokens by accessor ID, policies and roles by ID, and whether ACLs were
//! bootstrapped. Links from tokens and roles are stored by ID; names are filled in when read,
//! so renaming a policy shows everywhere and a deleted one simply drops out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vigil_shared::acl::{
    ANONYMOUS_TOKEN_ACCESSOR_ID, ANONYMOUS_TOKEN_SECRET, GLOBAL_MANAGEMENT_POLICY_ID,
    GLOBAL_MANAGEMENT_POLICY_NAME, GLOBAL_MANAGEMENT_RULES, Link, Policy, Resolved, Role, Token,
};
use vigil_shared::rpc::{AclOp, ApplyError};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclStore {
    tokens: BTreeMap<String, Token>,
    policies: BTreeMap<String, Policy>,
    roles: BTreeMap<String, Role>,
    /// The raft index at which ACLs were bootstrapped (Consul's reset index), if they were.
    bootstrapped: Option<u64>,
    /// Raft index of the latest change to any ACL table.
    table_index: u64,
}

fn invalid(text: impl Into<String>) -> ApplyError {
    ApplyError::AclInvalid(text.into())
}

impl AclStore {
    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    pub fn apply(&mut self, op: AclOp, index: u64, now_ms: u64) -> Result<(), ApplyError> {
        match op {
            AclOp::Init { initial_management } => {
                if !self.policies.contains_key(GLOBAL_MANAGEMENT_POLICY_ID) {
                    self.put_policy(management_policy(), index);
                }
                if !self.tokens.contains_key(ANONYMOUS_TOKEN_ACCESSOR_ID) {
                    self.put_token(anonymous_token(now_ms), index);
                }
                if let Some(token) = initial_management {
                    if self.secret(&token.secret_id).is_none() {
                        let token = self.check_token(token, true, now_ms)?;
                        self.put_token(token, index);
                    }
                    self.bootstrapped.get_or_insert(index);
                }
                self.table_index = index;
                Ok(())
            }
            AclOp::Bootstrap(token) => {
                if let Some(reset_index) = self.bootstrapped {
                    return Err(ApplyError::AclBootstrapped { reset_index });
                }
                let token = self.check_token(token, true, now_ms)?;
                self.put_token(token, index);
                self.bootstrapped = Some(index);
                Ok(())
            }
            AclOp::SetToken { token, create } => {
                let token = self.check_token(token, create, now_ms)?;
                self.put_token(token, index);
                Ok(())
            }
            AclOp::DeleteToken { accessor_id } => {
                if accessor_id == ANONYMOUS_TOKEN_ACCESSOR_ID {
                    return Err(invalid(
                        "Delete operation not permitted on the anonymous token",
                    ));
                }
                self.tokens
                    .remove(&accessor_id)
                    .ok_or(ApplyError::AclNotFound)?;
                self.table_index = index;
                Ok(())
            }
            AclOp::SetPolicy { policy, create } => {
                let policy = self.check_policy(policy, create)?;
                self.put_policy(policy, index);
                Ok(())
            }
            AclOp::DeletePolicy { id } => {
                if id == GLOBAL_MANAGEMENT_POLICY_ID {
                    return Err(invalid(
                        "Delete operation not permitted on the builtin global-management policy",
                    ));
                }
                self.policies.remove(&id).ok_or(ApplyError::AclNotFound)?;
                self.table_index = index;
                Ok(())
            }
            AclOp::SetRole { role, create } => {
                let role = self.check_role(role, create)?;
                self.put_role(role, index);
                Ok(())
            }
            AclOp::DeleteRole { id } => {
                self.roles.remove(&id).ok_or(ApplyError::AclNotFound)?;
                self.table_index = index;
                Ok(())
            }
        }
    }

    fn put_token(&mut self, mut token: Token, index: u64) {
        token.create_index = self
            .tokens
            .get(&token.accessor_id)
            .map_or(index, |t| t.create_index);
        token.modify_index = index;
        self.tokens.insert(token.accessor_id.clone(), token);
        self.table_index = index;
    }

    fn put_policy(&mut self, mut policy: Policy, index: u64) {
        policy.create_index = self
            .policies
            .get(&policy.id)
            .map_or(index, |p| p.create_index);
        policy.modify_index = index;
        self.policies.insert(policy.id.clone(), policy);
        self.table_index = index;
    }

    fn put_role(&mut self, mut role: Role, index: u64) {
        role.create_index = self.roles.get(&role.id).map_or(index, |r| r.create_index);
        role.modify_index = index;
        self.roles.insert(role.id.clone(), role);
        self.table_index = index;
    }

    /// Validates a token as Consul's `ACL.TokenSet` does and resolves its links to IDs.
    fn check_token(
        &self,
        mut token: Token,
        create: bool,
        now_ms: u64,
    ) -> Result<Token, ApplyError> {
        let existing = self.tokens.get(&token.accessor_id);
        match (create, existing) {
            (true, Some(_)) => return Err(invalid("Invalid Token: AccessorID is already in use")),
            (false, None) => return Err(invalid("Cannot find token to update")),
            (false, Some(old)) => {
                if token.secret_id.is_empty() {
                    token.secret_id = old.secret_id.clone();
                } else if token.secret_id != old.secret_id {
                    return Err(invalid("Changing a token's SecretID is not permitted"));
                }
                if token.local != old.local {
                    return Err(invalid(format!(
                        "Cannot toggle local mode of {}",
                        token.accessor_id
                    )));
                }
                if token.expiration_time_ms.is_some()
                    && token.expiration_time_ms != old.expiration_time_ms
                {
                    return Err(invalid(format!(
                        "Cannot change expiration time of {}",
                        token.accessor_id
                    )));
                }
                token.expiration_time_ms = old.expiration_time_ms;
                token.expiration_ttl_ns = old.expiration_ttl_ns;
                token.create_time_ms = old.create_time_ms;
            }
            (true, None) => {
                if token.expiration_time_ms.is_some_and(|at| at <= now_ms) {
                    return Err(invalid("ExpirationTime cannot be in the past"));
                }
            }
        }
        if let Some(holder) = self.secret(&token.secret_id)
            && holder.accessor_id != token.accessor_id
        {
            return Err(invalid("Invalid Token: SecretID is already in use"));
        }
        token.policies = link(&self.policies, token.policies)?;
        token.roles = link(&self.roles, token.roles)?;
        Ok(token)
    }

    fn check_policy(&self, policy: Policy, create: bool) -> Result<Policy, ApplyError> {
        if policy.name.is_empty() {
            return Err(invalid("Invalid Policy: no Name is set"));
        }
        if !valid_name(&policy.name) {
            return Err(invalid(
                "Invalid Policy: invalid Name. Only alphanumeric characters, '-' and '_' are allowed",
            ));
        }
        let existing = self.policies.get(&policy.id);
        match (create, existing) {
            (true, Some(_)) => return Err(invalid("Invalid Policy: ID is already in use")),
            (false, None) => return Err(invalid(format!("Cannot find policy {}", policy.id))),
            (false, Some(old)) if old.id == GLOBAL_MANAGEMENT_POLICY_ID => {
                if policy.datacenters != old.datacenters {
                    return Err(invalid(
                        "Changing the Datacenters of the builtin global-management policy is not permitted",
                    ));
                }
                if policy.rules != old.rules {
                    return Err(invalid(
                        "Changing the Rules for the builtin global-management policy is not permitted",
                    ));
                }
            }
            _ => {}
        }
        if self
            .policies
            .values()
            .any(|p| p.id != policy.id && p.name == policy.name)
        {
            return Err(invalid(format!(
                "Invalid Policy: A Policy with Name {:?} already exists",
                policy.name
            )));
        }
        Ok(policy)
    }

    fn check_role(&self, mut role: Role, create: bool) -> Result<Role, ApplyError> {
        if role.name.is_empty() {
            return Err(invalid("Role name is missing"));
        }
        if !valid_name(&role.name) {
            return Err(invalid(
                "Invalid Role: invalid Name. Only alphanumeric characters, '-' and '_' are allowed",
            ));
        }
        match (create, self.roles.contains_key(&role.id)) {
            (true, true) => return Err(invalid("Invalid Role: ID is already in use")),
            (false, false) => return Err(invalid(format!("Cannot find role {}", role.id))),
            _ => {}
        }
        if self
            .roles
            .values()
            .any(|r| r.id != role.id && r.name == role.name)
        {
            return Err(invalid(format!(
                "Invalid Role: A Role with Name {:?} already exists",
                role.name
            )));
        }
        role.policies = link(&self.policies, role.policies)?;
        Ok(role)
    }

    fn secret(&self, secret_id: &str) -> Option<&Token> {
        self.tokens.values().find(|t| t.secret_id == secret_id)
    }

    fn named_token(&self, token: &Token) -> Token {
        Token {
            policies: named(&self.policies, &token.policies),
            roles: named(&self.roles, &token.roles),
            ..token.clone()
        }
    }

    fn named_role(&self, role: &Role) -> Role {
        Role {
            policies: named(&self.policies, &role.policies),
            ..role.clone()
        }
    }

    pub fn token(&self, accessor_id: &str) -> Option<Token> {
        self.tokens.get(accessor_id).map(|t| self.named_token(t))
    }

    pub fn tokens(&self) -> Vec<Token> {
        self.tokens.values().map(|t| self.named_token(t)).collect()
    }

    pub fn policy(&self, id: &str, by_name: bool) -> Option<Policy> {
        find(&self.policies, id, by_name).cloned()
    }

    pub fn policies(&self) -> Vec<Policy> {
        self.policies.values().cloned().collect()
    }

    pub fn role(&self, id: &str, by_name: bool) -> Option<Role> {
        find(&self.roles, id, by_name).map(|r| self.named_role(r))
    }

    pub fn roles(&self) -> Vec<Role> {
        self.roles.values().map(|r| self.named_role(r)).collect()
    }

    /// The token with this secret, its roles, and every policy it reaches.
    pub fn resolve(&self, secret_id: &str) -> Option<Resolved> {
        let token = self.named_token(self.secret(secret_id)?);
        let roles: Vec<Role> = token
            .roles
            .iter()
            .filter_map(|l| self.roles.get(&l.id).map(|r| self.named_role(r)))
            .collect();
        let mut ids: Vec<&str> = token.policies.iter().map(|l| l.id.as_str()).collect();
        for role in &roles {
            ids.extend(role.policies.iter().map(|l| l.id.as_str()));
        }
        ids.sort_unstable();
        ids.dedup();
        let policies = ids
            .into_iter()
            .filter_map(|id| self.policies.get(id).cloned())
            .collect();
        Some(Resolved {
            token,
            roles,
            policies,
        })
    }
}

/// What a token or a role links to: a policy or a role, keyed by its ID.
trait Linkable {
    /// The noun in "cannot find …".
    const NOUN: &'static str;
    fn id_and_name(&self) -> (&str, &str);
}

impl Linkable for Policy {
    const NOUN: &'static str = "policy";
    fn id_and_name(&self) -> (&str, &str) {
        (&self.id, &self.name)
    }
}

impl Linkable for Role {
    const NOUN: &'static str = "role";
    fn id_and_name(&self) -> (&str, &str) {
        (&self.id, &self.name)
    }
}

/// The entry with this ID, or with this name when `by_name`.
fn find<'a, T: Linkable>(table: &'a BTreeMap<String, T>, id: &str, by_name: bool) -> Option<&'a T> {
    if by_name {
        table.values().find(|t| t.id_and_name().1 == id)
    } else {
        table.get(id)
    }
}

/// Links by ID, or by name when the ID is empty; an unknown one is refused, a repeated one
/// kept once. Stored links carry the ID only.
fn link<T: Linkable>(
    table: &BTreeMap<String, T>,
    links: Vec<Link>,
) -> Result<Vec<Link>, ApplyError> {
    let mut linked: Vec<Link> = Vec::with_capacity(links.len());
    for link in links {
        let by_name = link.id.is_empty();
        let wanted = if by_name { &link.name } else { &link.id };
        let Some(target) = find(table, wanted, by_name) else {
            return Err(invalid(format!("cannot find {} {wanted:?}", T::NOUN)));
        };
        let (id, _) = target.id_and_name();
        if !linked.iter().any(|l| l.id == id) {
            linked.push(Link {
                id: id.to_owned(),
                name: String::new(),
            });
        }
    }
    Ok(linked)
}

/// Fills in the names of links and drops the ones whose target is gone.
fn named<T: Linkable>(table: &BTreeMap<String, T>, links: &[Link]) -> Vec<Link> {
    links
        .iter()
        .filter_map(|l| table.get(&l.id))
        .map(|t| {
            let (id, name) = t.id_and_name();
            Link {
                id: id.to_owned(),
                name: name.to_owned(),
            }
        })
        .collect()
}

/// Consul's rule for policy and role names.
fn valid_name(name: &str) -> bool {
    name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn management_policy() -> Policy {
    Policy {
        id: GLOBAL_MANAGEMENT_POLICY_ID.to_owned(),
        name: GLOBAL_MANAGEMENT_POLICY_NAME.to_owned(),
        description: "Builtin Policy that grants unlimited access".to_owned(),
        rules: GLOBAL_MANAGEMENT_RULES.to_owned(),
        datacenters: Vec::new(),
        create_index: 0,
        modify_index: 0,
    }
}

fn anonymous_token(now_ms: u64) -> Token {
    Token {
        description: "Anonymous Token".to_owned(),
        create_time_ms: now_ms,
        ..Token::new(ANONYMOUS_TOKEN_ACCESSOR_ID, ANONYMOUS_TOKEN_SECRET)
    }
}
