//! Who may ask this server what. Two questions, in order:
//!
//! 1. May this certificate send the request at all? A server certificate may send anything; a
//!    client agent's what [`senders`] allows it; a CLI/HTTPS certificate nothing.
//! 2. May the token the request carries do it? A client agent's request is made on behalf of
//!    a token (the `*As` requests carry it; the older ones are the anonymous token's), which
//!    this server resolves against its own ACL tables and checks with the same
//!    [`Authorizer`] the agents use: writes and operator requests are refused without the
//!    permission, reads are answered cut down to what the token may read. A server's own
//!    requests (forwarding, the leader's duties) are not asked again: the server that took the
//!    request from an agent asked.
//!
//! Each check is an exhaustive `match` over the op, read or operator request, so a new one
//! does not compile until someone decides what it needs.

use vigil_shared::acl::authz::{Access, Authorizer, PermissionDenied, Resource};
use vigil_shared::acl::{ANONYMOUS_TOKEN_ACCESSOR_ID, ANONYMOUS_TOKEN_SECRET, Resolved, Token};
use vigil_shared::catalog::{Node, Service};
use vigil_shared::kv::KvOp;
use vigil_shared::operator::OperatorRequest;
use vigil_shared::rpc::{AclOp, QueryResult};
use vigil_shared::txn::TxnOp;

use super::*;
use crate::state::StateMachine;

/// The one datacenter (the agents' `DATACENTER`): policies scoped to others do not apply.
const DATACENTER: &str = "dc1";

/// Why a request was refused: the text the caller gets (Consul's where there is one).
pub(super) type Refusal = String;

/// Refuses a request the certificate may not send.
pub(super) fn check_sender(peer: &PeerIdentity, request: &RpcRequest) -> Result<(), Refusal> {
    match (peer.role, senders(request)) {
        (Role::Cli, _) => Err("a CLI or HTTPS certificate cannot call the RPC endpoint; \
             agents use a client agent certificate"
            .to_owned()),
        (Role::Client, Senders::Servers(what)) => Err(format!("{what} needs a server certificate")),
        (Role::Server, _) | (Role::Client, Senders::Agents) => Ok(()),
    }
}

/// Which certificates may send a request at all (what the token it carries may do is the
/// server's second question).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Senders {
    /// Servers only: raft membership, forwarding between servers, leader-internal writes. The
    /// name of what was asked, for the refusal of anyone else.
    Servers(&'static str),
    /// Servers and client agents.
    Agents,
}

/// Who may send this request: decided here for every request and every op, with no
/// wildcard arm, so a new request or op does not compile until someone decides. A
/// certificate for the HTTPS API and the CLI may send none (the server refuses it before
/// asking).
fn senders(request: &RpcRequest) -> Senders {
    match request {
        RpcRequest::Hello {} | RpcRequest::Status {} => Senders::Agents,
        RpcRequest::Join { .. } => Senders::Servers("a join"),
        RpcRequest::Forwarded(_) => Senders::Servers("forwarding"),
        RpcRequest::Write { op } | RpcRequest::WriteAs { op, .. } => op_senders(op),
        RpcRequest::Query { .. }
        | RpcRequest::QueryAs { .. }
        | RpcRequest::Renew { .. }
        | RpcRequest::RenewAs { .. }
        | RpcRequest::Operator { .. }
        | RpcRequest::OperatorAs { .. } => Senders::Agents,
    }
}

/// Who may propose `op`: the leader's own bookkeeping and whole-state replacements (a restore
/// goes through the operator path, which checks the archive) are for servers only.
fn op_senders(op: &Op) -> Senders {
    match op {
        Op::Kv(_)
        | Op::CreateSession(_)
        | Op::DestroySession { .. }
        | Op::RegisterNode { .. }
        | Op::RegisterCheck(_)
        | Op::DeregisterCheck { .. }
        | Op::DeregisterNode { .. }
        | Op::CatalogRegister(_)
        | Op::CatalogRegisterFull(_)
        | Op::DeregisterService { .. }
        | Op::SetQuery { .. }
        | Op::SetQueryFull { .. }
        | Op::DeleteQuery { .. }
        | Op::Lock(
            LockOp::Acquire { .. }
            | LockOp::Release { .. }
            | LockOp::Enqueue { .. }
            | LockOp::Leave { .. },
        )
        | Op::Acl(
            AclOp::Bootstrap(_)
            | AclOp::SetToken { .. }
            | AclOp::DeleteToken { .. }
            | AclOp::SetPolicy { .. }
            | AclOp::DeletePolicy { .. }
            | AclOp::SetRole { .. }
            | AclOp::DeleteRole { .. },
        )
        | Op::Txn(_) => Senders::Agents,
        Op::ReapTombstones { .. }
        | Op::CheckpointTtls { .. }
        | Op::Lock(LockOp::Wake { .. })
        | Op::Batch(_)
        | Op::RestoreSnapshot { .. }
        | Op::RestoreChunk { .. }
        | Op::SetAutopilotConfig { .. }
        | Op::Acl(AclOp::Init { .. })
        | Op::SetProtocol { .. }
        | Op::ExpireSession { .. } => Senders::Servers("this operation"),
    }
}

impl Server {
    /// What the request's token may do: `None` when the server need not ask (ACLs disabled,
    /// or a server's own request without a token).
    pub(super) fn caller(
        &self,
        peer: &PeerIdentity,
        request: &RpcRequest,
    ) -> Result<Option<Authorizer>, Refusal> {
        let Some(default) = self.config.acl_default_policy else {
            return Ok(None);
        };
        let token = match (peer.role, request.token()) {
            (Role::Server, None) => return Ok(None),
            (_, Some(token)) => token,
            (Role::Client | Role::Cli, None) => "",
        };
        let secret = if token.is_empty() {
            ANONYMOUS_TOKEN_SECRET
        } else {
            token
        };
        let resolved = self.shared.read().acl().resolve(secret);
        let resolved = match resolved {
            Some(r) if !r.token.expired(crate::proposer::wall_ms()) => r,
            // The leader has not written the anonymous token yet: only the default applies.
            _ if secret == ANONYMOUS_TOKEN_SECRET => Resolved {
                token: Token::new(ANONYMOUS_TOKEN_ACCESSOR_ID, ANONYMOUS_TOKEN_SECRET),
                roles: Vec::new(),
                policies: Vec::new(),
            },
            _ => return Err("ACL not found".to_owned()),
        };
        Authorizer::new(&resolved, DATACENTER, default)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// Refuses a write the token may not make.
    pub(super) fn authorize_write(&self, authz: &Authorizer, op: &Op) -> Result<(), Refusal> {
        let state = self.shared.read();
        write_permission(authz, &state, op).map_err(|e| e.to_string())
    }

    /// Refuses a session renewal the token may not make.
    pub(super) fn authorize_renew(&self, authz: &Authorizer, id: &str) -> Result<(), Refusal> {
        let state = self.shared.read();
        session_write(authz, &state, id).map_err(|e| e.to_string())
    }
}

/// A session is used (renewed, destroyed, locked with) under `session:write` on its node; an
/// unknown session is left for the state machine to refuse.
fn session_write(
    authz: &Authorizer,
    state: &StateMachine,
    id: &str,
) -> Result<(), PermissionDenied> {
    match state.sessions().get(id) {
        Some(session) => authz.check(Resource::Session, Access::Write, &session.node),
        None => Ok(()),
    }
}

fn kv_permission(
    authz: &Authorizer,
    state: &StateMachine,
    op: &KvOp,
) -> Result<(), PermissionDenied> {
    match op {
        KvOp::Get { key } | KvOp::GetOrEmpty { key } | KvOp::CheckNotExists { key } => {
            authz.check(Resource::Key, Access::Read, key)
        }
        KvOp::CheckIndex { key, .. } | KvOp::CheckSession { key, .. } => {
            authz.check(Resource::Key, Access::Read, key)
        }
        KvOp::GetTree { prefix } => authz.check(Resource::Key, Access::List, prefix),
        KvOp::Set { key, .. } | KvOp::Cas { key, .. } | KvOp::Delete { key } => {
            authz.check(Resource::Key, Access::Write, key)
        }
        KvOp::DeleteCas { key, .. } => authz.check(Resource::Key, Access::Write, key),
        KvOp::Lock { key, session, .. } | KvOp::Unlock { key, session, .. } => {
            authz.check(Resource::Key, Access::Write, key)?;
            session_write(authz, state, session)
        }
        KvOp::DeleteTree { prefix } => authz.check_key_write_prefix(prefix),
    }
}

fn node_write(authz: &Authorizer, node: &str) -> Result<(), PermissionDenied> {
    authz.check(Resource::Node, Access::Write, node)
}

fn service_write(authz: &Authorizer, service: &str) -> Result<(), PermissionDenied> {
    authz.check(Resource::Service, Access::Write, service)
}

/// A prepared query is changed under `query:write` on its name; an unnamed one is reached by
/// its ID alone (Consul's rule).
fn query_write(authz: &Authorizer, name: &str) -> Result<(), PermissionDenied> {
    if name.is_empty() {
        return Ok(());
    }
    authz.check(Resource::Query, Access::Write, name)
}

/// A node's `serfHealth` is the leader's to write (from gossip): through the catalog it needs
/// `acl:write`, so `node:write` cannot mark a node critical and invalidate sessions other
/// tokens own.
fn serf_health_write(authz: &Authorizer, check_id: &str) -> Result<(), PermissionDenied> {
    if check_id == vigil_shared::catalog::SERF_HEALTH {
        acl_write(authz)
    } else {
        Ok(())
    }
}

/// Changing the ACL tables needs `acl:write` (which no default policy grants).
fn acl_write(authz: &Authorizer) -> Result<(), PermissionDenied> {
    authz.check(Resource::Acl, Access::Write, "")
}

fn write_permission(
    authz: &Authorizer,
    state: &StateMachine,
    op: &Op,
) -> Result<(), PermissionDenied> {
    match op {
        Op::Kv(ops) => ops
            .iter()
            .try_for_each(|op| kv_permission(authz, state, op)),
        Op::CreateSession(session) => authz.check(Resource::Session, Access::Write, &session.node),
        Op::DestroySession { id } => session_write(authz, state, id),
        Op::RegisterNode { name, .. } | Op::DeregisterNode { name } => node_write(authz, name),
        Op::RegisterCheck(check) => {
            node_write(authz, &check.node)?;
            serf_health_write(authz, &check.check_id)?;
            if check.service_name.is_empty() {
                Ok(())
            } else {
                service_write(authz, &check.service_name)
            }
        }
        Op::DeregisterCheck { node, check_id } => {
            node_write(authz, node)?;
            serf_health_write(authz, check_id)
        }
        Op::CatalogRegister(registration) | Op::CatalogRegisterFull(registration) => {
            node_write(authz, &registration.node)?;
            for check in &registration.checks {
                serf_health_write(authz, &check.check_id)?;
            }
            match &registration.service {
                Some(service) => service_write(authz, &service.name),
                None => Ok(()),
            }
        }
        Op::DeregisterService { node, .. } => node_write(authz, node),
        Op::SetQuery { query, update } | Op::SetQueryFull { query, update } => {
            if *update && let Some(existing) = state.queries().lookup(&query.id) {
                query_write(authz, &existing.name)?;
            }
            query_write(authz, &query.name)
        }
        Op::DeleteQuery { id } => match state.queries().lookup(id) {
            Some(existing) => query_write(authz, &existing.name),
            None => Ok(()),
        },
        Op::Lock(lock) => match lock {
            LockOp::Acquire { name, session, .. }
            | LockOp::Release { name, session }
            | LockOp::Enqueue { name, session, .. }
            | LockOp::Leave { name, session, .. } => {
                authz.check(Resource::Key, Access::Write, name)?;
                session_write(authz, state, session)
            }
            LockOp::Wake { .. } => servers_only(authz),
        },
        Op::Acl(acl) => match acl {
            // Works once, before any management token exists, for whoever asks (Consul's).
            AclOp::Bootstrap(_) => Ok(()),
            AclOp::Init { .. }
            | AclOp::SetToken { .. }
            | AclOp::DeleteToken { .. }
            | AclOp::SetPolicy { .. }
            | AclOp::DeletePolicy { .. }
            | AclOp::SetRole { .. }
            | AclOp::DeleteRole { .. } => acl_write(authz),
        },
        Op::Txn(ops) => ops.iter().try_for_each(|op| match op {
            TxnOp::Kv(op) => kv_permission(authz, state, op),
            TxnOp::Node { verb, node } if verb.is_write() => node_write(authz, &node.name),
            TxnOp::Service { verb, service } if verb.is_write() => {
                service_write(authz, &service.name)
            }
            TxnOp::Check { verb, check } if verb.is_write() => {
                node_write(authz, &check.node)?;
                serf_health_write(authz, &check.check_id)
            }
            // Reads in a catalog transaction answer what the agent filters.
            TxnOp::Node { .. } | TxnOp::Service { .. } | TxnOp::Check { .. } => Ok(()),
        }),
        // Servers only (the sender check refused them already): never a token's to make.
        Op::ReapTombstones { .. }
        | Op::CheckpointTtls { .. }
        | Op::Batch(_)
        | Op::RestoreSnapshot { .. }
        | Op::RestoreChunk { .. }
        | Op::SetAutopilotConfig { .. }
        | Op::SetProtocol { .. }
        | Op::ExpireSession { .. } => servers_only(authz),
    }
}

/// What a server's own op needs from a token, should one ever carry it: management and
/// operator rights both.
fn servers_only(authz: &Authorizer) -> Result<(), PermissionDenied> {
    acl_write(authz)?;
    authz.check(Resource::Operator, Access::Write, "")
}

/// What an operator request needs: snapshots are management's (`acl:write`, as Consul's
/// `Snapshot` permission), the server set and autopilot the operator's.
pub(super) fn operator_permission(
    authz: &Authorizer,
    request: &OperatorRequest,
) -> Result<(), Refusal> {
    let (resource, access) = match request {
        OperatorRequest::SnapshotSave | OperatorRequest::SnapshotRestore(_) => {
            (Resource::Acl, Access::Write)
        }
        OperatorRequest::RemovePeer(_)
        | OperatorRequest::TransferLeader { .. }
        | OperatorRequest::AutopilotSet { .. } => (Resource::Operator, Access::Write),
        OperatorRequest::AutopilotHealth | OperatorRequest::AutopilotGet => {
            (Resource::Operator, Access::Read)
        }
    };
    authz.check(resource, access, "").map_err(|e| e.to_string())
}

/// Refuses a read the token may not make at all: resolving another token's secret (an agent
/// resolves the token a request presents, made on that token's behalf) and reading tokens
/// without `acl:read`. The rest is answered and cut down by [`filter`].
pub(super) fn read_permission(
    authz: &Authorizer,
    token: &str,
    query: &ReadQuery,
) -> Result<(), Refusal> {
    let denied = |e: PermissionDenied| e.to_string();
    match query {
        ReadQuery::AclResolve { secret_id } => {
            let own =
                secret_id == token || (token.is_empty() && secret_id == ANONYMOUS_TOKEN_SECRET);
            if own {
                Ok(())
            } else {
                acl_write(authz).map_err(denied)
            }
        }
        // A token may read itself (`/v1/acl/token/self`).
        ReadQuery::AclToken { accessor_id } if accessor_id == authz.accessor_id() => Ok(()),
        ReadQuery::AclToken { .. } | ReadQuery::AclTokenList {} => {
            authz.check(Resource::Acl, Access::Read, "").map_err(denied)
        }
        ReadQuery::Txn { ops } => ops
            .iter()
            .try_for_each(|op| authz.check(Resource::Key, Access::Read, op.key()))
            .map_err(denied),
        ReadQuery::Sequencer { key: name, .. }
        | ReadQuery::LockSequencer { name, .. }
        | ReadQuery::LockStanding { name, .. }
        | ReadQuery::LockHold { name, .. }
        | ReadQuery::History {
            name,
            prefix: false,
        } => authz
            .check(Resource::Key, Access::Read, name)
            .map_err(denied),
        ReadQuery::KvGet { .. }
        | ReadQuery::KvList { .. }
        | ReadQuery::KvKeys { .. }
        | ReadQuery::SessionInfo { .. }
        | ReadQuery::SessionList {}
        | ReadQuery::SessionNode { .. }
        | ReadQuery::CatalogNodes {}
        | ReadQuery::NodeChecks { .. }
        | ReadQuery::CatalogServices {}
        | ReadQuery::CatalogService { .. }
        | ReadQuery::CatalogNode { .. }
        | ReadQuery::CatalogServicesFull {}
        | ReadQuery::CatalogServiceFull { .. }
        | ReadQuery::CatalogNodeFull { .. }
        | ReadQuery::HealthServiceFull { .. }
        | ReadQuery::QueryExecuteFull { .. }
        | ReadQuery::ServiceChecks { .. }
        | ReadQuery::ChecksInState { .. }
        | ReadQuery::HealthService { .. }
        | ReadQuery::QueryList {}
        | ReadQuery::QueryGet { .. }
        | ReadQuery::QueryListFull {}
        | ReadQuery::QueryGetFull { .. }
        | ReadQuery::QueryExecute { .. }
        | ReadQuery::Lock { .. }
        | ReadQuery::Locks { .. }
        | ReadQuery::History { prefix: true, .. }
        | ReadQuery::AclPolicy { .. }
        | ReadQuery::AclPolicyList {}
        | ReadQuery::AclRole { .. }
        | ReadQuery::AclRoleList {} => Ok(()),
    }
}

/// Cuts a read's answer down to what the token may read, as the agents' handlers do: each
/// entry, session, node, service, check, query and lock under its own rule; ACL policies and
/// roles only with `acl:read`, token secrets only with `acl:write`. A read of one thing the
/// token may not see answers as if it were not there.
pub(super) fn filter(authz: &Authorizer, result: QueryResult) -> QueryResult {
    let read = |resource, name: &str| authz.allows(resource, Access::Read, name);
    let check_visible = |c: &vigil_shared::catalog::Check| {
        read(Resource::Node, &c.node)
            && (c.service_name.is_empty() || read(Resource::Service, &c.service_name))
    };
    let service_visible = |s: &Service| read(Resource::Service, &s.name);
    let pair_visible = |(n, s): &(Node, Service)| {
        read(Resource::Node, &n.name) && read(Resource::Service, &s.name)
    };
    let node_services = |found: Option<(Node, Vec<Service>)>| {
        found
            .filter(|(node, _)| read(Resource::Node, &node.name))
            .map(|(node, mut services)| {
                services.retain(service_visible);
                (node, services)
            })
    };
    let query_visible = |q: &vigil_shared::query::PreparedQuery| {
        if q.name.is_empty() {
            authz.allows(Resource::Acl, Access::Write, "")
        } else {
            read(Resource::Query, &q.name)
        }
    };
    let health_visible = |h: &vigil_shared::catalog::ServiceHealth| {
        read(Resource::Node, &h.node.name) && read(Resource::Service, &h.service.name)
    };
    match result {
        QueryResult::Entries(mut entries) => {
            entries.retain(|e| read(Resource::Key, &e.key));
            QueryResult::Entries(entries)
        }
        QueryResult::Keys(mut keys) => {
            keys.retain(|k| read(Resource::Key, k));
            QueryResult::Keys(keys)
        }
        QueryResult::Sessions(mut sessions) => {
            sessions.retain(|s| read(Resource::Session, &s.node));
            QueryResult::Sessions(sessions)
        }
        // Checked before they ran: the transaction's keys, the sequencer's and lock's name.
        QueryResult::Txn(outcome) => QueryResult::Txn(outcome),
        QueryResult::Sequencer(verdict) => QueryResult::Sequencer(verdict),
        QueryResult::Nodes(mut nodes) => {
            nodes.retain(|n| read(Resource::Node, &n.name));
            QueryResult::Nodes(nodes)
        }
        QueryResult::Checks(mut checks) => {
            checks.retain(check_visible);
            QueryResult::Checks(checks)
        }
        QueryResult::Services(mut services) => {
            services.retain(service_visible);
            QueryResult::Services(services)
        }
        QueryResult::ServicesFull(mut services) => {
            services.retain(service_visible);
            QueryResult::ServicesFull(services)
        }
        QueryResult::ServiceNodes(mut pairs) => {
            pairs.retain(pair_visible);
            QueryResult::ServiceNodes(pairs)
        }
        QueryResult::ServiceNodesFull(mut pairs) => {
            pairs.retain(pair_visible);
            QueryResult::ServiceNodesFull(pairs)
        }
        QueryResult::NodeServices(found) => QueryResult::NodeServices(node_services(found)),
        QueryResult::NodeServicesFull(found) => QueryResult::NodeServicesFull(node_services(found)),
        QueryResult::Health(mut health) => {
            health.retain(health_visible);
            QueryResult::Health(health)
        }
        QueryResult::HealthFull(mut health) => {
            health.retain(health_visible);
            QueryResult::HealthFull(health)
        }
        QueryResult::Queries(mut queries) => {
            queries.retain(query_visible);
            QueryResult::Queries(queries)
        }
        QueryResult::QueriesFull(mut queries) => {
            queries.retain(query_visible);
            QueryResult::QueriesFull(queries)
        }
        QueryResult::Executed(found) => QueryResult::Executed(found.map(|(query, mut nodes)| {
            nodes.retain(health_visible);
            (query, nodes)
        })),
        QueryResult::ExecutedFull(found) => {
            QueryResult::ExecutedFull(found.map(|(query, mut nodes)| {
                nodes.retain(health_visible);
                (query, nodes)
            }))
        }
        QueryResult::Lock(lock) => QueryResult::Lock(lock.filter(|l| read(Resource::Key, &l.name))),
        QueryResult::History(mut histories) => {
            histories.retain(|h| read(Resource::Key, &h.name));
            QueryResult::History(histories)
        }
        QueryResult::Locks(mut locks) => {
            locks.retain(|l| read(Resource::Key, &l.name));
            QueryResult::Locks(locks)
        }
        QueryResult::Standing(standing) => QueryResult::Standing(standing),
        QueryResult::Hold(hold) => QueryResult::Hold(hold),
        // Checked before it ran: the caller's own token, or management.
        QueryResult::AclResolved(resolved) => QueryResult::AclResolved(resolved),
        QueryResult::AclTokens(mut tokens) => {
            if !authz.allows(Resource::Acl, Access::Write, "") {
                for token in &mut tokens {
                    if token.accessor_id != authz.accessor_id() {
                        token.secret_id = "<hidden>".to_owned();
                    }
                }
            }
            QueryResult::AclTokens(tokens)
        }
        QueryResult::AclPolicies(mut policies) => {
            if !read(Resource::Acl, "") {
                policies.clear();
            }
            QueryResult::AclPolicies(policies)
        }
        QueryResult::AclRoles(mut roles) => {
            if !read(Resource::Acl, "") {
                roles.clear();
            }
            QueryResult::AclRoles(roles)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_shared::acl::authz::DefaultPolicy;
    use vigil_shared::acl::{GLOBAL_MANAGEMENT_POLICY_ID, Policy};
    use vigil_shared::rpc::calls::Forwarded;

    fn peer(role: Role) -> PeerIdentity {
        PeerIdentity { role, node: None }
    }

    #[test]
    fn each_certificate_sends_only_what_its_role_may() {
        let write = |op: Op| RpcRequest::WriteAs {
            op,
            token: String::new(),
        };
        let agents = [
            RpcRequest::Status {},
            write(Op::DestroySession { id: "s".into() }),
            RpcRequest::OperatorAs {
                request: OperatorRequest::SnapshotSave,
                token: String::new(),
            },
        ];
        let servers = [
            RpcRequest::Join {
                node_id: 2,
                node: Default::default(),
            },
            RpcRequest::Forwarded(Forwarded::Renew(calls::Renew { id: "s".into() })),
            write(Op::Acl(AclOp::Init {
                initial_management: None,
            })),
            write(Op::ReapTombstones { before_ms: 1 }),
            // The leader's TTL expiry: a client certificate could end any session with it.
            write(Op::ExpireSession { id: "s".into() }),
            write(Op::RestoreChunk {
                id: "r".into(),
                offset: 0,
                bytes: Vec::new(),
                last: true,
            }),
        ];
        for request in agents.iter().chain(&servers) {
            assert!(
                check_sender(&peer(Role::Server), request).is_ok(),
                "{request:?}"
            );
            let cli = check_sender(&peer(Role::Cli), request).unwrap_err();
            assert!(cli.contains("CLI"), "{cli}");
        }
        for request in &agents {
            assert!(
                check_sender(&peer(Role::Client), request).is_ok(),
                "{request:?}"
            );
        }
        for request in &servers {
            let why = check_sender(&peer(Role::Client), request).unwrap_err();
            assert!(why.contains("server certificate"), "{why}");
        }
    }

    #[test]
    fn a_token_reads_only_what_it_may_and_secrets_only_with_acl_write() {
        let resolved = |rules: &str| Resolved {
            token: Token::new("accessor", "secret"),
            roles: Vec::new(),
            policies: vec![Policy {
                id: "p".into(),
                name: "p".into(),
                description: String::new(),
                rules: rules.into(),
                datacenters: Vec::new(),
                create_index: 1,
                modify_index: 1,
            }],
        };
        let authz = |rules: &str| {
            Authorizer::new(&resolved(rules), DATACENTER, DefaultPolicy::Deny).expect("rules")
        };
        let reader = authz(r#"acl = "read""#);
        let nobody = authz("");
        let tokens = || {
            QueryResult::AclTokens(vec![
                Token::new(GLOBAL_MANAGEMENT_POLICY_ID, "root-secret"),
                Token::new("accessor", "secret"),
            ])
        };

        // acl:read lists tokens with others' secrets hidden (its own shown); nothing less may.
        let QueryResult::AclTokens(seen) = filter(&reader, tokens()) else {
            panic!("not tokens");
        };
        assert_eq!(seen[0].secret_id, "<hidden>");
        assert_eq!(seen[1].secret_id, "secret");
        let list = ReadQuery::AclTokenList {};
        assert!(read_permission(&reader, "secret", &list).is_ok());
        assert!(read_permission(&nobody, "secret", &list).is_err());

        // A token resolves itself, never another's secret without acl:write.
        let own = ReadQuery::AclResolve {
            secret_id: "secret".into(),
        };
        let other = ReadQuery::AclResolve {
            secret_id: "root-secret".into(),
        };
        assert!(read_permission(&nobody, "secret", &own).is_ok());
        assert!(read_permission(&reader, "secret", &other).is_err());
        assert!(read_permission(&authz(r#"acl = "write""#), "secret", &other).is_ok());

        // Keys are cut down to the token's rules.
        let kv = authz(r#"key_prefix "app/" { policy = "read" }"#);
        let entry = |key: &str| vigil_shared::kv::KvEntry {
            key: key.into(),
            value: Vec::new(),
            flags: 0,
            session: None,
            lock_index: 0,
            create_index: 1,
            modify_index: 1,
        };
        let QueryResult::Entries(entries) = filter(
            &kv,
            QueryResult::Entries(vec![entry("app/a"), entry("other/b")]),
        ) else {
            panic!("not entries");
        };
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].key, "app/a");

        // Operator requests: snapshots are management's, the peer set the operator's.
        assert!(operator_permission(&kv, &OperatorRequest::SnapshotSave).is_err());
        let operator = authz(r#"operator = "write""#);
        assert!(
            operator_permission(&operator, &OperatorRequest::TransferLeader { to: None }).is_ok()
        );
        assert!(operator_permission(&operator, &OperatorRequest::SnapshotSave).is_err());
    }
}
