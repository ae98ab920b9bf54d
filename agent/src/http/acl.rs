//! `/v1/acl/*`: bootstrapping ACLs and managing tokens, policies and roles, with Consul's
//! shapes, codes and texts; and [`Authz`], what a request's token may do, which every handler
//! that reads or changes state asks. Auth methods, binding rules, login and templated
//! policies are not built: their routes answer 404.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json as json_value};
use vigil_shared::acl::authz::{Access, Authorizer, PermissionDenied, Resource};
use vigil_shared::acl::{
    ANONYMOUS_TOKEN_ACCESSOR_ID, GLOBAL_MANAGEMENT_POLICY_ID, Link, NodeIdentity, Policy, Role,
    ServiceIdentity, Token, rules,
};
use vigil_shared::api::acl::{
    GrantsJson, LinkJson, NodeIdentityJson, PolicyJson, RoleJson, ServiceIdentityJson, TokenJson,
};
use vigil_shared::api::decode_case_insensitive;
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::rpc::{AclOp, ApplyError, Query, QueryMeta, QueryOptions, reads, writes};

use super::body::RequestBody;
use super::error::ApiError;
use super::params::Params;
use super::{AppState, Ctx, json, read, with_meta};
use crate::acl::ResolveError;

/// What the request's token may do: resolved from `X-Consul-Token`, `Authorization: Bearer`
/// or `?token=` (in that order, as Consul reads them), or the anonymous token.
pub struct Authz(pub Arc<Authorizer>);

impl Authz {
    pub fn check(&self, resource: Resource, access: Access, name: &str) -> Result<(), ApiError> {
        Ok(self.0.check(resource, access, name)?)
    }

    pub fn allows(&self, resource: Resource, access: Access, name: &str) -> bool {
        self.0.allows(resource, access, name)
    }
}

/// Marks a response whose results the token's rules cut down, as Consul does.
pub fn filtered_by_acls(filtered: bool, mut response: Response) -> Response {
    if filtered {
        response.headers_mut().insert(
            "X-Consul-Results-Filtered-By-ACLs",
            axum::http::HeaderValue::from_static("true"),
        );
    }
    response
}

/// Using a session (to lock, unlock, renew or destroy it) needs `session:write` on its node,
/// and, a Vigil rule over Consul's, to be the token that created it or a management token
/// (`acl:write`). An unknown session is left for the servers to refuse with Consul's text.
pub async fn check_session_write(
    state: &AppState,
    authz: &Authz,
    session: &str,
) -> Result<(), ApiError> {
    if !state.acls.enabled() {
        return Ok(());
    }
    let query = reads::SessionInfo {
        id: session.to_owned(),
    };
    let (sessions, _) = state.backend.read(QueryOptions::default(), query).await?;
    let Some(s) = sessions.first() else {
        return Ok(());
    };
    authz.check(Resource::Session, Access::Write, &s.node)?;
    let owned = s.owner.is_empty() || s.owner == authz.0.accessor_id();
    if !owned && !authz.allows(Resource::Acl, Access::Write, "") {
        return Err(PermissionDenied {
            accessor_id: authz.0.accessor_id().to_owned(),
            resource: Resource::Session,
            access: Access::Write,
            name: s.id.clone(),
        }
        .into());
    }
    Ok(())
}

/// The secret a request presents, if any (`params`: its query string, for `?token=`).
pub fn request_token(parts: &Parts, params: &Params) -> Option<String> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if let Some(token) = header("X-Consul-Token") {
        return Some(token.to_owned());
    }
    if let Some(bearer) = header("Authorization").and_then(|v| {
        v.split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
    }) {
        return Some(bearer.to_owned());
    }
    params
        .get("token")
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

impl Authz {
    /// Resolves the token the request presents (`params`: its query string).
    pub async fn resolve(
        parts: &Parts,
        params: &Params,
        state: &AppState,
    ) -> Result<Authz, ApiError> {
        let token = request_token(parts, params);
        Ok(Authz(state.acls.authorize(token.as_deref()).await?))
    }
}

impl FromRequestParts<AppState> for Authz {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Authz, ApiError> {
        Authz::resolve(parts, &Params::parse(parts.uri.query()), state).await
    }
}

impl From<ResolveError> for ApiError {
    fn from(e: ResolveError) -> ApiError {
        match e {
            ResolveError::NotFound => acl_not_found(),
            ResolveError::Rules(text) => ApiError::server(text),
            ResolveError::Server(e) => e.into(),
        }
    }
}

impl From<PermissionDenied> for ApiError {
    fn from(e: PermissionDenied) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, e.to_string())
    }
}

fn acl_not_found() -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "ACL not found")
}

fn acl_disabled(state: &AppState) -> Result<(), ApiError> {
    if state.acls.enabled() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "ACL support disabled",
        ))
    }
}

/// Changing ACLs needs them enabled and `acl:write`.
fn manage(cx: &Ctx) -> Result<(), ApiError> {
    acl_disabled(&cx.state)?;
    cx.check(Resource::Acl, Access::Write, "")
}

/// Reading ACLs needs them enabled and `acl:read`.
fn inspect(cx: &Ctx) -> Result<(), ApiError> {
    acl_disabled(&cx.state)?;
    cx.check(Resource::Acl, Access::Read, "")
}

/// The one item a read by ID or name found, or Consul's 403 `ACL not found`.
async fn read_one<T, Q: Query<Output = Vec<T>>>(
    state: &AppState,
    params: &Params,
    query: Q,
) -> Result<(T, QueryMeta), ApiError> {
    let (items, meta) = read(state, params, query).await?;
    let item = items.into_iter().next().ok_or_else(acl_not_found)?;
    Ok((item, meta))
}

/// What reading a policy or role that is not there answers: a well-formed ID (or a name) that
/// names nothing is Consul's 404, which clients read as "none"; anything else stays the 403
/// `ACL not found`.
fn missing_on_read(e: ApiError, id: &str, by_name: bool) -> ApiError {
    let well_formed = by_name || uuid::Uuid::parse_str(id).is_ok();
    if well_formed && e.status == StatusCode::FORBIDDEN && e.message == "ACL not found" {
        ApiError::new(StatusCode::NOT_FOUND, "ACL not found")
    } else {
        e
    }
}

/// Commits a deletion and answers Consul's `true`.
async fn commit_delete(cx: &Ctx, op: AclOp) -> Result<Response, ApiError> {
    manage(cx)?;
    write(&cx.state, op).await?;
    Ok(cx.json(&true))
}

/// Commits an ACL change; Consul's codes for what the servers refuse.
async fn write(state: &AppState, op: AclOp) -> Result<(), ApiError> {
    state
        .backend
        .write(writes::Acl(op))
        .await?
        .map_err(|rejected| match rejected {
            ApplyError::AclNotFound => acl_not_found(),
            e @ ApplyError::AclBootstrapped { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, format!("Permission denied: {e}"))
            }
            e => ApiError::server(e.to_string()),
        })
}

fn links(links: &[Link]) -> Vec<LinkJson> {
    links
        .iter()
        .map(|l| LinkJson {
            id: l.id.clone(),
            name: l.name.clone(),
        })
        .collect()
}

/// What a token or role grants; a role has no roles.
fn grants(
    policies: &[Link],
    roles: &[Link],
    services: &[ServiceIdentity],
    nodes: &[NodeIdentity],
) -> GrantsJson {
    GrantsJson {
        policies: links(policies),
        roles: links(roles),
        service_identities: services
            .iter()
            .map(|s| ServiceIdentityJson {
                service_name: s.service_name.clone(),
                datacenters: s.datacenters.clone(),
            })
            .collect(),
        node_identities: nodes
            .iter()
            .map(|n| NodeIdentityJson {
                node_name: n.node_name.clone(),
                datacenter: n.datacenter.clone(),
            })
            .collect(),
    }
}

/// A token as Consul prints it.
fn token_json(t: &Token) -> TokenJson {
    TokenJson {
        accessor_id: t.accessor_id.clone(),
        secret_id: t.secret_id.clone(),
        description: t.description.clone(),
        grants: grants(
            &t.policies,
            &t.roles,
            &t.service_identities,
            &t.node_identities,
        ),
        local: t.local,
        expiration_time: t.expiration_time_ms.map(super::lock::rfc3339),
        expiration_ttl: t.expiration_ttl_ns,
        create_time: super::lock::rfc3339(t.create_time_ms),
        create_index: t.create_index,
        modify_index: t.modify_index,
        legacy: None,
    }
}

/// A token's secret is shown only to a token that may change ACLs (`acl:write`), as Consul
/// does; `acl:read` alone sees `<hidden>`.
fn redacted(authz: &Authz, mut token: TokenJson) -> TokenJson {
    if !authz.allows(Resource::Acl, Access::Write, "") {
        token.secret_id = "<hidden>".to_owned();
    }
    token
}

fn policy_json(p: &Policy) -> PolicyJson {
    PolicyJson {
        id: p.id.clone(),
        name: p.name.clone(),
        description: p.description.clone(),
        rules: Some(p.rules.clone()),
        datacenters: p.datacenters.clone(),
        create_index: p.create_index,
        modify_index: p.modify_index,
    }
}

/// A policy in a list: everything but its rules.
fn policy_entry_json(p: &Policy) -> PolicyJson {
    PolicyJson {
        rules: None,
        ..policy_json(p)
    }
}

fn role_json(r: &Role) -> RoleJson {
    RoleJson {
        id: r.id.clone(),
        name: r.name.clone(),
        description: r.description.clone(),
        grants: grants(&r.policies, &[], &r.service_identities, &r.node_identities),
        create_index: r.create_index,
        modify_index: r.modify_index,
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LinkBody {
    id: String,
    name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ServiceIdentityBody {
    servicename: String,
    datacenters: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NodeIdentityBody {
    nodename: String,
    datacenter: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenBody {
    accessorid: String,
    secretid: String,
    description: String,
    policies: Vec<LinkBody>,
    roles: Vec<LinkBody>,
    serviceidentities: Vec<ServiceIdentityBody>,
    nodeidentities: Vec<NodeIdentityBody>,
    local: bool,
    expirationtime: Option<String>,
    expirationttl: Option<Value>,
}

fn decode<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    decode_case_insensitive(body, &[])
        .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))
}

fn to_links(links: Vec<LinkBody>) -> Vec<Link> {
    links
        .into_iter()
        .map(|l| Link {
            id: l.id,
            name: l.name,
        })
        .collect()
}

fn to_service_identities(ids: Vec<ServiceIdentityBody>) -> Result<Vec<ServiceIdentity>, ApiError> {
    ids.into_iter()
        .map(|s| {
            if s.servicename.is_empty() {
                return Err(ApiError::server(
                    "Service identity is missing the service name field on this token",
                ));
            }
            Ok(ServiceIdentity {
                service_name: s.servicename,
                datacenters: s.datacenters,
            })
        })
        .collect()
}

fn to_node_identities(ids: Vec<NodeIdentityBody>) -> Result<Vec<NodeIdentity>, ApiError> {
    ids.into_iter()
        .map(|n| {
            if n.nodename.is_empty() {
                return Err(ApiError::server(
                    "Node identity is missing the node name field on this token",
                ));
            }
            if n.datacenter.is_empty() {
                return Err(ApiError::server(
                    "Node identity is missing the datacenter field on this token",
                ));
            }
            Ok(NodeIdentity {
                node_name: n.nodename,
                datacenter: n.datacenter,
            })
        })
        .collect()
}

/// ms since the epoch from RFC 3339.
fn parse_time(text: &str) -> Result<u64, ApiError> {
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?;
    Ok(u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
}

/// A token from a create or update body; new IDs where none are given.
fn token_from(body: TokenBody, now_ms: u64) -> Result<Token, ApiError> {
    let ttl_ns = match body.expirationttl {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => parse_go_duration(&s)
            .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?
            .as_nanos() as u64,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Request decode failed: invalid ExpirationTTL {other}"
            )));
        }
    };
    let mut expiration = body.expirationtime.as_deref().map(parse_time).transpose()?;
    if ttl_ns > 0 {
        if expiration.is_some() {
            return Err(ApiError::server(
                "Token Expiration TTL and Expiration Time cannot both be set",
            ));
        }
        expiration = Some(now_ms + ttl_ns / 1_000_000);
    }
    let new_id = || uuid::Uuid::new_v4().to_string();
    Ok(Token {
        accessor_id: if body.accessorid.is_empty() {
            new_id()
        } else {
            body.accessorid
        },
        secret_id: body.secretid,
        description: body.description,
        policies: to_links(body.policies),
        roles: to_links(body.roles),
        service_identities: to_service_identities(body.serviceidentities)?,
        node_identities: to_node_identities(body.nodeidentities)?,
        local: body.local,
        expiration_ttl_ns: ttl_ns,
        expiration_time_ms: expiration,
        create_time_ms: now_ms,
        create_index: 0,
        modify_index: 0,
    })
}

async fn read_token(state: &AppState, accessor_id: &str) -> Result<Token, ApiError> {
    let query = reads::AclToken {
        accessor_id: accessor_id.to_owned(),
    };
    Ok(read_one(state, &Params::default(), query).await?.0)
}

/// Commits a token's creation or update and answers it as stored.
async fn set_token(cx: &Ctx, token: Token, create: bool) -> Result<Response, ApiError> {
    let accessor = token.accessor_id.clone();
    let op = AclOp::SetToken { token, create };
    commit_token(&cx.state, &cx.params, &accessor, op).await
}

/// Commits `op`, which writes the token `accessor`, and answers that token as stored.
async fn commit_token(
    state: &AppState,
    params: &Params,
    accessor: &str,
    op: AclOp,
) -> Result<Response, ApiError> {
    write(state, op).await?;
    let token = read_token(state, accessor).await?;
    Ok(json(params, &token_json(&token)))
}

/// `PUT /v1/acl/bootstrap`: the first management token, once.
pub async fn bootstrap(
    State(state): State<AppState>,
    params: Params,
) -> Result<Response, ApiError> {
    acl_disabled(&state)?;
    let token = Token {
        description: "Bootstrap Token (Global Management)".to_owned(),
        policies: vec![Link {
            id: GLOBAL_MANAGEMENT_POLICY_ID.to_owned(),
            name: String::new(),
        }],
        create_time_ms: vigil_server::proposer::wall_ms(),
        ..Token::new(
            uuid::Uuid::new_v4().to_string(),
            uuid::Uuid::new_v4().to_string(),
        )
    };
    let accessor = token.accessor_id.clone();
    commit_token(&state, &params, &accessor, AclOp::Bootstrap(token)).await
}

/// `PUT /v1/acl/token`.
pub async fn create_token(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    manage(&cx)?;
    let mut token = token_from(decode(&body)?, vigil_server::proposer::wall_ms())?;
    if token.secret_id.is_empty() {
        token.secret_id = uuid::Uuid::new_v4().to_string();
    }
    set_token(&cx, token, true).await
}

/// `GET /v1/acl/token/self`: the token the request presents.
pub async fn token_self(cx: Ctx) -> Result<Response, ApiError> {
    acl_disabled(&cx.state)?;
    let token = read_token(&cx.state, cx.authz.0.accessor_id()).await?;
    Ok(cx.json(&token_json(&token)))
}

/// `GET /v1/acl/token/<accessor>`.
pub async fn get_token(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    inspect(&cx)?;
    // A token that is not there stays `ACL not found` (403), as Consul answers it.
    let (token, meta) =
        read_one(&cx.state, &cx.params, reads::AclToken { accessor_id: id }).await?;
    let shown = redacted(&cx.authz, token_json(&token));
    Ok(with_meta(meta, cx.json(&shown)))
}

/// `PUT /v1/acl/token/<accessor>`: replaces what the body sets.
pub async fn update_token(
    cx: Ctx,
    Path(id): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    manage(&cx)?;
    let body: TokenBody = decode(&body)?;
    if !body.accessorid.is_empty() && body.accessorid != id {
        return Err(ApiError::bad_request(
            "Token Accessor ID in URL and payload do not match",
        ));
    }
    let token = token_from(
        TokenBody {
            accessorid: id.clone(),
            ..body
        },
        vigil_server::proposer::wall_ms(),
    )?;
    set_token(&cx, token, false).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CloneBody {
    description: String,
}

/// `PUT /v1/acl/token/<accessor>/clone`: the same links under new IDs.
pub async fn clone_token(
    cx: Ctx,
    Path(id): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    manage(&cx)?;
    let body: CloneBody = decode(&body)?;
    let original = read_token(&cx.state, &id).await?;
    let clone = Token {
        description: if body.description.is_empty() {
            original.description.clone()
        } else {
            body.description
        },
        create_time_ms: vigil_server::proposer::wall_ms(),
        ..Token::new(
            uuid::Uuid::new_v4().to_string(),
            uuid::Uuid::new_v4().to_string(),
        )
    };
    let clone = Token {
        policies: original.policies,
        roles: original.roles,
        service_identities: original.service_identities,
        node_identities: original.node_identities,
        local: original.local,
        expiration_time_ms: original.expiration_time_ms,
        expiration_ttl_ns: original.expiration_ttl_ns,
        ..clone
    };
    set_token(&cx, clone, true).await
}

/// `DELETE /v1/acl/token/<accessor>` → `true`.
pub async fn delete_token(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    commit_delete(&cx, AclOp::DeleteToken { accessor_id: id }).await
}

/// `GET /v1/acl/tokens`, with Consul's `policy`, `role` and `servicename` filters.
pub async fn list_tokens(cx: Ctx) -> Result<Response, ApiError> {
    inspect(&cx)?;
    let (tokens, meta) = cx.read(reads::AclTokenList {}).await?;
    let policy = cx.params.get("policy").filter(|p| !p.is_empty());
    let role = cx.params.get("role").filter(|r| !r.is_empty());
    let service = cx.params.get("servicename").filter(|s| !s.is_empty());
    let out: Vec<TokenJson> = tokens
        .iter()
        .filter(|t| policy.is_none_or(|p| t.policies.iter().any(|l| l.id == p)))
        .filter(|t| role.is_none_or(|r| t.roles.iter().any(|l| l.id == r)))
        .filter(|t| {
            service.is_none_or(|s| t.service_identities.iter().any(|i| i.service_name == s))
        })
        .map(|t| TokenJson {
            legacy: Some(false),
            ..redacted(&cx.authz, token_json(t))
        })
        .collect();
    Ok(with_meta(meta, cx.json(&out)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct PolicyBody {
    id: String,
    name: String,
    description: String,
    rules: String,
    datacenters: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct RoleBody {
    id: String,
    name: String,
    description: String,
    policies: Vec<LinkBody>,
    serviceidentities: Vec<ServiceIdentityBody>,
    nodeidentities: Vec<NodeIdentityBody>,
}

/// A policy or a role: the two are created, read, updated and deleted the same way, by ID or
/// by name; this is what they differ in.
pub(super) trait Named: Sized {
    type Body: serde::de::DeserializeOwned + Default;
    type Read: Query<Output = Vec<Self>>;
    /// `policy` or `role`, as Consul's texts say it.
    const KIND: &'static str;
    fn body_id(body: &Self::Body) -> &str;
    /// The item a create or update body describes, under `id`.
    fn from_body(body: Self::Body, id: String) -> Result<Self, ApiError>;
    fn set(self, create: bool) -> AclOp;
    fn delete(id: String) -> AclOp;
    fn read(id: String, by_name: bool) -> Self::Read;
    fn id(&self) -> &str;
    type Json: serde::Serialize;
    fn json(&self) -> Self::Json;
}

impl Named for Policy {
    type Body = PolicyBody;
    type Read = reads::AclPolicy;
    const KIND: &'static str = "policy";

    fn body_id(body: &PolicyBody) -> &str {
        &body.id
    }

    fn from_body(body: PolicyBody, id: String) -> Result<Policy, ApiError> {
        rules::parse(&body.rules).map_err(|e| ApiError::server(e.to_string()))?;
        Ok(Policy {
            id,
            name: body.name,
            description: body.description,
            rules: body.rules,
            datacenters: body.datacenters,
            create_index: 0,
            modify_index: 0,
        })
    }

    fn set(self, create: bool) -> AclOp {
        AclOp::SetPolicy {
            policy: self,
            create,
        }
    }

    fn delete(id: String) -> AclOp {
        AclOp::DeletePolicy { id }
    }

    fn read(id: String, by_name: bool) -> reads::AclPolicy {
        reads::AclPolicy { id, by_name }
    }

    fn id(&self) -> &str {
        &self.id
    }

    type Json = PolicyJson;

    fn json(&self) -> PolicyJson {
        policy_json(self)
    }
}

impl Named for Role {
    type Body = RoleBody;
    type Read = reads::AclRole;
    const KIND: &'static str = "role";

    fn body_id(body: &RoleBody) -> &str {
        &body.id
    }

    fn from_body(body: RoleBody, id: String) -> Result<Role, ApiError> {
        Ok(Role {
            id,
            name: body.name,
            description: body.description,
            policies: to_links(body.policies),
            service_identities: to_service_identities(body.serviceidentities)?,
            node_identities: to_node_identities(body.nodeidentities)?,
            create_index: 0,
            modify_index: 0,
        })
    }

    fn set(self, create: bool) -> AclOp {
        AclOp::SetRole { role: self, create }
    }

    fn delete(id: String) -> AclOp {
        AclOp::DeleteRole { id }
    }

    fn read(id: String, by_name: bool) -> reads::AclRole {
        reads::AclRole { id, by_name }
    }

    fn id(&self) -> &str {
        &self.id
    }

    type Json = RoleJson;

    fn json(&self) -> RoleJson {
        role_json(self)
    }
}

/// Creates (`id` none) or replaces a policy or role, and answers it as stored.
async fn store<T: Named>(cx: &Ctx, id: Option<String>, body: &[u8]) -> Result<Response, ApiError> {
    manage(cx)?;
    let body: T::Body = decode(body)?;
    let given = T::body_id(&body);
    let kind = T::KIND;
    let create = id.is_none();
    let item = match id {
        None if !given.is_empty() => {
            return Err(ApiError::bad_request(format!(
                "Cannot specify a {kind} ID when creating a new {kind}"
            )));
        }
        Some(id) if !given.is_empty() && given != id => {
            let mut title = kind.to_owned();
            title[..1].make_ascii_uppercase();
            return Err(ApiError::bad_request(format!(
                "{title} ID in URL and payload do not match"
            )));
        }
        None => T::from_body(body, uuid::Uuid::new_v4().to_string())?,
        Some(id) => T::from_body(body, id)?,
    };
    let id = item.id().to_owned();
    write(&cx.state, item.set(create)).await?;
    let stored = read_one(&cx.state, &Params::default(), T::read(id, false))
        .await?
        .0;
    Ok(cx.json(&stored.json()))
}

/// A policy or role by ID or, with `by_name`, by name.
async fn show<T: Named>(cx: &Ctx, id: String, by_name: bool) -> Result<Response, ApiError> {
    inspect(cx)?;
    let (item, meta) = read_one(&cx.state, &cx.params, T::read(id.clone(), by_name))
        .await
        .map_err(|e| missing_on_read(e, &id, by_name))?;
    Ok(with_meta(meta, cx.json(&item.json())))
}

/// `PUT /v1/acl/policy`, `PUT /v1/acl/role`.
pub(super) async fn create<T: Named>(
    cx: Ctx,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    store::<T>(&cx, None, &body).await
}

/// `GET /v1/acl/policy/<id>`, `GET /v1/acl/role/<id>`.
pub(super) async fn get<T: Named>(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    show::<T>(&cx, id, false).await
}

/// `GET /v1/acl/policy/name/<name>`, `GET /v1/acl/role/name/<name>`.
pub(super) async fn get_by_name<T: Named>(
    cx: Ctx,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    show::<T>(&cx, name, true).await
}

/// `PUT /v1/acl/policy/<id>`, `PUT /v1/acl/role/<id>`.
pub(super) async fn update<T: Named>(
    cx: Ctx,
    Path(id): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    store::<T>(&cx, Some(id), &body).await
}

/// `DELETE /v1/acl/policy/<id>`, `DELETE /v1/acl/role/<id>` → `true`.
pub(super) async fn delete<T: Named>(
    cx: Ctx,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    commit_delete(&cx, T::delete(id)).await
}

/// `GET /v1/acl/policies`.
pub async fn list_policies(cx: Ctx) -> Result<Response, ApiError> {
    inspect(&cx)?;
    let (policies, meta) = cx.read(reads::AclPolicyList {}).await?;
    let out: Vec<PolicyJson> = policies.iter().map(policy_entry_json).collect();
    Ok(with_meta(meta, cx.json(&out)))
}

/// `GET /v1/acl/roles`, with Consul's `policy` filter.
pub async fn list_roles(cx: Ctx) -> Result<Response, ApiError> {
    inspect(&cx)?;
    let (roles, meta) = cx.read(reads::AclRoleList {}).await?;
    let policy = cx.params.get("policy").filter(|p| !p.is_empty());
    let out: Vec<RoleJson> = roles
        .iter()
        .filter(|r| policy.is_none_or(|p| r.policies.iter().any(|l| l.id == p)))
        .map(role_json)
        .collect();
    Ok(with_meta(meta, cx.json(&out)))
}

/// `GET /v1/acl/replication`: one datacenter, so nothing replicates; Consul's answer for a
/// primary datacenter.
pub async fn replication(cx: Ctx) -> Result<Response, ApiError> {
    acl_disabled(&cx.state)?;
    let never = "0001-01-01T00:00:00Z";
    Ok(cx.json(&json_value!({
        "Enabled": false,
        "Running": false,
        "SourceDatacenter": "",
        "ReplicationType": "",
        "ReplicatedIndex": 0,
        "ReplicatedRoleIndex": 0,
        "ReplicatedTokenIndex": 0,
        "LastSuccess": never,
        "LastError": never,
        "LastErrorMessage": "",
    })))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AgentTokenBody {
    token: String,
}

/// `PUT /v1/agent/token/<kind>` (`default`, `agent`, `agent_recovery`, `replication`,
/// `config_file_service_registration`, and
/// Consul's older names): sets one of this agent's tokens, which needs `agent:write` on it. The
/// default token is what requests without a token then use.
pub async fn set_agent_token(
    cx: Ctx,
    Path(kind): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    acl_disabled(&cx.state)?;
    cx.check(Resource::Agent, Access::Write, &cx.state.node_name)?;
    let Some(kind) = crate::acl::TokenKind::parse(&kind) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Token {kind:?} is unknown"),
        ));
    };
    let body: AgentTokenBody = decode(&body)?;
    cx.state.acls.set_token(kind, body.token);
    Ok(StatusCode::OK.into_response())
}

/// `POST /v1/acl/login`: Vigil has no auth methods, so every method named is unknown: Consul's
/// 403 `ACL not found`.
pub async fn login(cx: Ctx) -> Result<Response, ApiError> {
    acl_disabled(&cx.state)?;
    Err(acl_not_found())
}

/// `POST /v1/acl/logout`: only a token made by a login may log out, and no token is (Consul's
/// 403 `Permission denied`); the anonymous token is `ACL not found`, and an unknown token was
/// already refused as one.
pub async fn logout(cx: Ctx) -> Result<Response, ApiError> {
    acl_disabled(&cx.state)?;
    if cx.authz.0.accessor_id() == ANONYMOUS_TOKEN_ACCESSOR_ID {
        return Err(acl_not_found());
    }
    Err(ApiError::new(StatusCode::FORBIDDEN, "Permission denied"))
}
