//! `/v1/query`: prepared queries. Create, list, read, update and delete them, run them
//! (`/execute`: the healthy instances of the service) and explain them. A query bound to a
//! session is deleted by the state machine when that session is invalidated.

use std::collections::BTreeMap;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json as json_value};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::decode_case_insensitive;
use vigil_shared::go::duration::parse_go_duration;
use vigil_shared::query::{PreparedQuery, ServiceQuery};
use vigil_shared::rpc::{ApplyError, QueryOptions, Write, reads, writes};

use super::acl::Authz;
use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::params::Params;
use super::shapes::HealthJson;
use super::{AppState, Ctx, json, with_meta};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FailoverBody {
    nearestn: i64,
    datacenters: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ServiceBody {
    service: String,
    tags: Vec<String>,
    onlypassing: bool,
    near: String,
    nodemeta: BTreeMap<String, String>,
    servicemeta: BTreeMap<String, String>,
    failover: FailoverBody,
    ignorecheckids: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DnsBody {
    ttl: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct QueryBody {
    name: String,
    session: String,
    token: String,
    service: ServiceBody,
    dns: DnsBody,
}

/// Decodes and validates a create or update body into a query with the given ID.
pub(super) fn parse(id: String, body: &[u8]) -> Result<PreparedQuery, ApiError> {
    let body: QueryBody = decode_case_insensitive(body, &["nodemeta", "servicemeta"])
        .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?;
    if body.service.service.is_empty() {
        return Err(invalid("Must provide a Service name to query"));
    }
    if body.name.is_empty() && body.session.is_empty() {
        return Err(invalid("Must be bound to a session"));
    }
    limits::name("Name", &body.name)?;
    limits::name("Service.Service", &body.service.service)?;
    limits::tags("Service.Tags", &body.service.tags)?;
    limits::meta("Invalid NodeMeta: ", &body.service.nodemeta)?;
    limits::meta("Invalid ServiceMeta: ", &body.service.servicemeta)?;
    if !body.dns.ttl.is_empty() {
        parse_go_duration(&body.dns.ttl)
            .map_err(|e| invalid(&format!("Bad DNS TTL '{}': {e}", body.dns.ttl)))?;
    }
    let s = body.service;
    Ok(PreparedQuery {
        id,
        name: body.name,
        session: body.session,
        token: body.token,
        service: ServiceQuery {
            service: s.service,
            tags: s.tags,
            only_passing: s.onlypassing,
            node_meta: s.nodemeta,
            service_meta: s.servicemeta,
            failover_nearest_n: s.failover.nearestn,
            failover_datacenters: s.failover.datacenters,
            near: s.near,
            ignore_check_ids: s.ignorecheckids,
        },
        dns_ttl: body.dns.ttl,
        create_index: 0,
        modify_index: 0,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct QueryJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    name: &'a str,
    session: &'a str,
    token: &'a str,
    template: Value,
    service: Value,
    #[serde(rename = "DNS")]
    dns: Value,
    create_index: u64,
    modify_index: u64,
}

/// `null` for an empty list or map, else the value.
fn nil_if_empty<T: Serialize>(value: &T) -> Value {
    match serde_json::to_value(value).unwrap_or(Value::Null) {
        Value::Array(items) if items.is_empty() => Value::Null,
        Value::Object(map) if map.is_empty() => Value::Null,
        other => other,
    }
}

impl<'a> QueryJson<'a> {
    /// The query as `authz` may see it: its stored token is `<hidden>` unless the caller may
    /// write the query (Consul's redaction; an unnamed query's needs `acl:write`).
    fn new(authz: &Authz, q: &'a PreparedQuery) -> QueryJson<'a> {
        let may_write = if q.name.is_empty() {
            authz.allows(Resource::Acl, Access::Write, "")
        } else {
            authz.allows(Resource::Query, Access::Write, &q.name)
        };
        let s = &q.service;
        QueryJson {
            id: &q.id,
            name: &q.name,
            session: &q.session,
            token: if may_write || q.token.is_empty() {
                &q.token
            } else {
                "<hidden>"
            },
            template: json_value!({"Type": "", "Regexp": "", "RemoveEmptyTags": false}),
            // An empty list or map is Go's nil, `null`, as the client sent it (Consul keeps
            // nil; the Go client compares definitions with reflect.DeepEqual).
            service: json_value!({
                "Service": s.service,
                "Failover": {"NearestN": s.failover_nearest_n,
                             "Datacenters": nil_if_empty(&s.failover_datacenters)},
                "OnlyPassing": s.only_passing,
                "IgnoreCheckIDs": nil_if_empty(&s.ignore_check_ids),
                "Near": s.near,
                "Tags": nil_if_empty(&s.tags),
                "NodeMeta": nil_if_empty(&s.node_meta),
                "ServiceMeta": nil_if_empty(&s.service_meta),
                "Connect": false,
            }),
            dns: json_value!({"TTL": q.dns_ttl}),
            create_index: q.create_index,
            modify_index: q.modify_index,
        }
    }
}

/// Consul's 500 for a query definition its server refuses.
fn invalid(problem: &str) -> ApiError {
    ApiError::server(format!("Invalid prepared query: {problem}"))
}

fn query_not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "Query not found")
}

/// Applies a query write; a refusal is Consul's 500, with the prefix its server adds to what the
/// state store refuses.
async fn write<W: Write<Output = Result<(), ApplyError>>>(
    state: &AppState,
    change: W,
) -> Result<(), ApiError> {
    state
        .backend
        .write(change)
        .await?
        .map_err(|rejected| match rejected {
            e @ ApplyError::MissingQuery(_) => ApiError::server(e.to_string()),
            e => ApiError::server(format!("raft apply failed: {e}")),
        })
}

/// A named query needs `query:write` on its name; an unnamed one is reached only by its ID.
fn check_query_write(authz: &Authz, name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Ok(());
    }
    authz.check(Resource::Query, Access::Write, name)
}

/// Changing a query needs `query:write` on the name it has now.
async fn check_existing_query_write(
    state: &AppState,
    authz: &Authz,
    id: &str,
) -> Result<(), ApiError> {
    let query = reads::QueryGet {
        id_or_name: id.to_owned(),
    };
    let (queries, _) = state.backend.read(QueryOptions::default(), query).await?;
    match queries.first() {
        Some(q) => check_query_write(authz, &q.name),
        None => Ok(()),
    }
}

/// Listed are the named queries the token may read, and unnamed ones for management tokens.
fn may_read(authz: &Authz, query: &PreparedQuery) -> bool {
    if query.name.is_empty() {
        authz.allows(Resource::Acl, Access::Write, "")
    } else {
        authz.allows(Resource::Query, Access::Read, &query.name)
    }
}

/// `POST /v1/query` → `{"ID":"…"}`.
pub async fn create(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    let query = parse(uuid::Uuid::new_v4().to_string(), &body)?;
    check_query_write(&cx.authz, &query.name)?;
    let id = query.id.clone();
    write(
        &cx.state,
        writes::SetQuery {
            query,
            update: false,
        },
    )
    .await?;
    Ok(json(&Params::default(), &json_value!({ "ID": id })))
}

/// `GET /v1/query`.
pub async fn list(cx: Ctx) -> Result<Response, ApiError> {
    let (queries, meta) = cx.read(reads::QueryListFull {}).await?;
    let out: Vec<QueryJson<'_>> = queries
        .iter()
        .filter(|q| may_read(&cx.authz, q))
        .map(|q| QueryJson::new(&cx.authz, q))
        .collect();
    Ok(with_meta(meta, cx.json(&out)))
}

/// `GET /v1/query/<id>` → `[query]`, or 404.
pub async fn get(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    let (queries, meta) = cx.read(reads::QueryGetFull { id_or_name: id }).await?;
    if queries.is_empty() {
        return Err(query_not_found());
    }
    for q in &queries {
        cx.check(Resource::Query, Access::Read, &q.name)?;
    }
    let out: Vec<QueryJson<'_>> = queries
        .iter()
        .map(|q| QueryJson::new(&cx.authz, q))
        .collect();
    Ok(with_meta(meta, cx.json(&out)))
}

/// `PUT /v1/query/<id>`: replaces the query's definition.
pub async fn update(
    cx: Ctx,
    Path(id): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    check_existing_query_write(&cx.state, &cx.authz, &id).await?;
    let query = parse(id, &body)?;
    check_query_write(&cx.authz, &query.name)?;
    write(
        &cx.state,
        writes::SetQuery {
            query,
            update: true,
        },
    )
    .await?;
    Ok(StatusCode::OK.into_response())
}

/// `DELETE /v1/query/<id>`.
pub async fn delete(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    check_existing_query_write(&cx.state, &cx.authz, &id).await?;
    write(&cx.state, writes::DeleteQuery { id }).await?;
    Ok(StatusCode::OK.into_response())
}

/// `GET /v1/query/<id or name>/execute[?limit=N]`.
pub async fn execute(cx: Ctx, Path(id_or_name): Path<String>) -> Result<Response, ApiError> {
    let limit = cx.params.u64("limit")?;
    let (found, meta) = cx.read_now(reads::QueryExecuteFull { id_or_name }).await?;
    let Some((query, mut nodes)) = found else {
        return Err(query_not_found());
    };
    nodes.retain(|h| {
        cx.authz
            .allows(Resource::Service, Access::Read, &h.service.name)
            && cx.authz.allows(Resource::Node, Access::Read, &h.node.name)
    });
    if let Some(limit) = limit.filter(|l| *l > 0) {
        nodes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    let out = json_value!({
        "Service": query.service.service,
        "Nodes": nodes.iter().map(HealthJson::new).collect::<Vec<_>>(),
        "DNS": {"TTL": query.dns_ttl},
        "Datacenter": crate::DATACENTER,
        "Failovers": 0,
    });
    Ok(with_meta(meta, cx.json(&out)))
}

/// `GET /v1/query/<id or name>/explain` → `{"Query":…}`.
pub async fn explain(cx: Ctx, Path(id_or_name): Path<String>) -> Result<Response, ApiError> {
    let (queries, meta) = cx.read_now(reads::QueryGetFull { id_or_name }).await?;
    let query = queries.first().ok_or_else(query_not_found)?;
    cx.check(Resource::Query, Access::Read, &query.name)?;
    let out = json_value!({ "Query": QueryJson::new(&cx.authz, query) });
    Ok(with_meta(meta, cx.json(&out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_needs_a_service_and_a_name_or_session() {
        let err = |body: &str| parse("id".into(), body.as_bytes()).unwrap_err().message;
        assert_eq!(
            err(r#"{"Name":"q"}"#),
            "Invalid prepared query: Must provide a Service name to query"
        );
        assert_eq!(
            err(r#"{"Service":{"Service":"web"}}"#),
            "Invalid prepared query: Must be bound to a session"
        );
        assert!(
            err(r#"{"Name":"q","Service":{"Service":"web"},"DNS":{"TTL":"x"}}"#)
                .starts_with("Invalid prepared query: Bad DNS TTL 'x'")
        );
        let q = parse(
            "id".into(),
            br#"{"name":"q","service":{"service":"web","onlypassing":true,"tags":["a","!b"]}}"#,
        )
        .unwrap();
        assert!(q.service.only_passing);
        assert_eq!(q.service.tags, ["a", "!b"]);
    }
}
