//! `/v1/session/*`: create (with Consul's defaults and check-list fix-up), destroy, renew, and the
//! blocking reads `info`, `list` and `node`.

use axum::extract::Path;
use axum::response::Response;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json as json_value};
use vigil_shared::DEFAULT_LOCK_DELAY_NS;
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::api::{SessionJson, decode_case_insensitive_nullable};
use vigil_shared::catalog::SERF_HEALTH;
use vigil_shared::go::duration::{duration_ns_from_json, parse_go_duration};
use vigil_shared::rpc::{Query, reads, writes};
use vigil_shared::session::{Behavior, ServiceCheck, Session};

use super::acl::{check_session_write, filtered_by_acls};
use super::body::RequestBody;
use super::error::ApiError;
use super::limits;
use super::{Ctx, with_meta};

/// Distinguishes an absent field (`None`) from an explicit `null` (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
struct ServiceCheckBody {
    id: String,
    #[serde(default)]
    namespace: String,
}

/// The create body, field names lowercased; unknown fields are ignored, as Consul does here.
#[derive(Debug, Default, Deserialize)]
struct CreateBody {
    node: Option<String>,
    name: Option<String>,
    lockdelay: Option<Value>,
    behavior: Option<String>,
    ttl: Option<String>,
    #[serde(default, deserialize_with = "present")]
    checks: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    nodechecks: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    servicechecks: Option<Option<Vec<ServiceCheckBody>>>,
}

/// LockDelay: a Go duration string, or a number of nanoseconds (seconds when below 1000), as
/// Consul's `FixupLockDelay` reads it; a number outside Go's `time.Duration` is refused.
fn lock_delay_ns(v: &Value) -> Result<u64, String> {
    match v {
        Value::String(s) => parse_go_duration(s)
            .map(|d| d.as_nanos() as u64)
            .map_err(|e| e.to_string()),
        Value::Number(n) => {
            let ns = duration_ns_from_json(n).map_err(|e| e.to_string())?;
            let ns = u64::try_from(ns).map_err(|_| "LockDelay must not be negative")?;
            Ok(if ns < 1000 { ns * 1_000_000_000 } else { ns })
        }
        Value::Null => Ok(DEFAULT_LOCK_DELAY_NS),
        other => Err(format!("invalid LockDelay {other}")),
    }
}

/// Decodes and validates a create body; `node_name` is the node when the body names none. The
/// TTL is left to the servers, which check it against their `session_ttl_min` (as Consul's do).
pub(super) fn build_session(node_name: &str, body: &[u8]) -> Result<Session, ApiError> {
    let req: CreateBody = if body.is_empty() {
        CreateBody::default()
    } else {
        // `null` empties a default check list, as in Go.
        decode_case_insensitive_nullable(body, &[], &["checks", "nodechecks", "servicechecks"])
            .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?
    };
    let node = req.node.unwrap_or_else(|| node_name.to_owned());
    if node.is_empty() {
        return Err(ApiError::server("Must provide Node"));
    }
    let name = req.name.unwrap_or_default();
    limits::name("Node", &node)?;
    limits::name("Name", &name)?;
    let behavior_text = req.behavior.unwrap_or_default();
    let behavior = Behavior::parse(&behavior_text)
        .ok_or_else(|| ApiError::server(format!("Invalid Behavior setting '{behavior_text}'")))?;
    let lock_delay_ns = match &req.lockdelay {
        Some(v) => lock_delay_ns(v)
            .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}")))?,
        None => DEFAULT_LOCK_DELAY_NS,
    };
    // The TTL is checked by the servers, against their `session_ttl_min`, as in Consul.
    let ttl = req.ttl.unwrap_or_default();

    // Consul's legacy/new check-list fix-up (docs/consul-compatibility.md#check-lists-on-create).
    let default_checks = || Some(vec![SERF_HEALTH.to_owned()]);
    let mut checks = req
        .checks
        .unwrap_or_else(default_checks)
        .unwrap_or_default();
    let mut node_checks = req
        .nodechecks
        .unwrap_or_else(default_checks)
        .unwrap_or_default();
    if checks.is_empty() {
        node_checks.clear();
    } else if checks == [SERF_HEALTH] || node_checks.is_empty() {
        checks.clear();
    }
    let service_checks = req.servicechecks.flatten().map(|v| {
        v.into_iter()
            .map(|c| ServiceCheck {
                id: c.id,
                namespace: c.namespace,
            })
            .collect()
    });
    Ok(Session {
        id: uuid::Uuid::new_v4().to_string(),
        name,
        node,
        lock_delay_ns,
        behavior,
        ttl,
        node_checks,
        service_checks,
        checks,
        create_index: 0,
        modify_index: 0,
        owner: String::new(),
    })
}

pub async fn create(cx: Ctx, RequestBody(body): RequestBody) -> Result<Response, ApiError> {
    let mut session = build_session(&cx.state.node_name, &body)?;
    cx.check(Resource::Session, Access::Write, &session.node)?;
    session.owner = cx.authz.0.accessor_id().to_owned();
    let id = cx
        .state
        .backend
        .write(writes::CreateSession(session))
        .await?
        .map_err(|e| ApiError::server(format!("apply failed: {e}")))?;
    Ok(cx.json(&json_value!({ "ID": id })))
}

pub async fn missing_id() -> ApiError {
    ApiError::bad_request("Missing session")
}

pub async fn missing_node() -> ApiError {
    ApiError::bad_request("Missing node name")
}

pub async fn destroy(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    check_session_write(&cx.state, &cx.authz, &id).await?;
    cx.state
        .backend
        .write(writes::DestroySession { id })
        .await?;
    Ok(cx.json(&true))
}

pub async fn renew(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    check_session_write(&cx.state, &cx.authz, &id).await?;
    let session = cx.state.backend.renew(&id).await?;
    Ok(cx.json(&[SessionJson::from_session(&session)]))
}

/// Sessions the token may read (`session:read` on their node).
async fn read_sessions<Q: Query<Output = Vec<Session>>>(
    cx: &Ctx,
    query: Q,
) -> Result<Response, ApiError> {
    let (sessions, meta) = cx.read(query).await?;
    let out: Vec<SessionJson> = sessions
        .iter()
        .filter(|s| cx.authz.allows(Resource::Session, Access::Read, &s.node))
        .map(SessionJson::from_session)
        .collect();
    let filtered = out.len() < sessions.len();
    Ok(filtered_by_acls(filtered, with_meta(meta, cx.json(&out))))
}

pub async fn info(cx: Ctx, Path(id): Path<String>) -> Result<Response, ApiError> {
    read_sessions(&cx, reads::SessionInfo { id }).await
}

pub async fn list(cx: Ctx) -> Result<Response, ApiError> {
    read_sessions(&cx, reads::SessionList {}).await
}

pub async fn node(cx: Ctx, Path(node): Path<String>) -> Result<Response, ApiError> {
    read_sessions(&cx, reads::SessionNode { node }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_delay_inputs() {
        assert_eq!(lock_delay_ns(&json_value!("15s")), Ok(15_000_000_000));
        assert_eq!(lock_delay_ns(&json_value!(5)), Ok(5_000_000_000));
        assert_eq!(lock_delay_ns(&json_value!(999)), Ok(999_000_000_000));
        assert_eq!(lock_delay_ns(&json_value!(1000)), Ok(1000));
        assert_eq!(lock_delay_ns(&json_value!(0)), Ok(0));
        assert!(lock_delay_ns(&json_value!("x")).is_err());
        assert_eq!(lock_delay_ns(&json_value!(2.5)), Ok(2_000_000_000));
        assert_eq!(
            lock_delay_ns(&json_value!(i64::MAX)),
            Ok(i64::MAX as u64),
            "the largest Go duration"
        );
        let over: Value = serde_json::from_str("18446744073709551616").unwrap();
        assert_eq!(
            lock_delay_ns(&over).unwrap_err(),
            "json: cannot unmarshal number 1.8446744073709552e+19 into Go value of type time.Duration"
        );
        assert!(lock_delay_ns(&json_value!(u64::MAX)).is_err());
        assert!(lock_delay_ns(&json_value!(1e30)).is_err());
        assert!(lock_delay_ns(&json_value!(-1)).is_err());
    }
}
