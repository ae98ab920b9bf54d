//! Session calls: create (with the body the Go client sends), destroy, renew, and the blocking
//! reads `info`, `list` and `node`.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use vigil_shared::api::SessionJson;
use vigil_shared::go::duration::format_go_duration;
use vigil_shared::session::Behavior;

use super::{Client, ClientError, QueryMeta, REQUEST_TIMEOUT, ReadOpts, encode_path};

/// What to create. Unset fields take the agent's defaults (this node, `serfHealth`, 15 s
/// lock-delay, `release`, no TTL).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionRequest {
    pub name: String,
    pub node: Option<String>,
    pub ttl: Option<Duration>,
    /// `None` (or zero, as in Go's client) leaves the server default of 15 s.
    pub lock_delay: Option<Duration>,
    pub behavior: Behavior,
    /// `Some(vec![])` creates a session with no node checks.
    pub node_checks: Option<Vec<String>>,
    /// Service check IDs (`ServiceChecks`) the session is also bound to; `None` sends none.
    pub service_checks: Option<Vec<String>>,
}

impl SessionRequest {
    /// The JSON body, built as the Go client builds it: only the fields that are set, keys
    /// sorted, `LockDelay` in milliseconds (`"15000ms"`).
    pub fn body(&self) -> Vec<u8> {
        let mut body: BTreeMap<&str, Value> = BTreeMap::new();
        if !self.name.is_empty() {
            body.insert("Name", Value::from(self.name.clone()));
        }
        if let Some(node) = &self.node {
            body.insert("Node", Value::from(node.clone()));
        }
        match self.lock_delay {
            Some(d) if d.is_zero() => {
                // Go leaves 0 out (server default); Vigil accepts an explicit "0s" as no delay.
                body.insert("LockDelay", Value::from("0s"));
            }
            Some(d) => {
                body.insert("LockDelay", Value::from(format!("{}ms", d.as_millis())));
            }
            None => {}
        }
        if let Some(checks) = &self.node_checks {
            body.insert("NodeChecks", Value::from(checks.clone()));
        }
        if let Some(checks) = &self.service_checks {
            let checks: Vec<Value> = checks
                .iter()
                .map(|id| serde_json::json!({ "ID": id }))
                .collect();
            body.insert("ServiceChecks", Value::from(checks));
        }
        if self.behavior == Behavior::Delete {
            body.insert("Behavior", Value::from("delete"));
        }
        if let Some(ttl) = self.ttl {
            body.insert("TTL", Value::from(format_go_duration(ttl)));
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

impl Client {
    /// `PUT /v1/session/create`: the new session's ID.
    pub async fn session_create(&self, request: &SessionRequest) -> Result<String, ClientError> {
        let reply = self
            .send(
                Method::PUT,
                "/v1/session/create",
                Some(request.body()),
                REQUEST_TIMEOUT,
            )
            .await?;
        let v: Value = reply.ok()?.json()?;
        v["ID"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| ClientError::Decode(format!("no ID in {v}")))
    }

    /// `PUT /v1/session/destroy/<id>` (idempotent).
    pub async fn session_destroy(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/session/destroy/{}", encode_path(id));
        self.send(Method::PUT, &path, None, REQUEST_TIMEOUT)
            .await?
            .ok()?;
        Ok(())
    }

    /// `PUT /v1/session/renew/<id>`: the session, or `None` once it no longer exists (404).
    pub async fn session_renew(&self, id: &str) -> Result<Option<SessionJson>, ClientError> {
        let path = format!("/v1/session/renew/{}", encode_path(id));
        let reply = self.send(Method::PUT, &path, None, REQUEST_TIMEOUT).await?;
        match reply.status {
            200 => Ok(reply.json::<Vec<SessionJson>>()?.into_iter().next()),
            404 => Ok(None),
            _ => Err(ClientError::api(&reply)),
        }
    }

    /// `GET /v1/session/info/<id>`.
    pub async fn session_info(
        &self,
        id: &str,
        opts: ReadOpts,
    ) -> Result<(Option<SessionJson>, QueryMeta), ClientError> {
        let path = format!("/v1/session/info/{}", encode_path(id));
        let (sessions, meta) = self.session_read(&path, &opts).await?;
        Ok((sessions.into_iter().next(), meta))
    }

    /// `GET /v1/session/list`.
    pub async fn session_list(
        &self,
        opts: ReadOpts,
    ) -> Result<(Vec<SessionJson>, QueryMeta), ClientError> {
        self.session_read("/v1/session/list", &opts).await
    }

    /// `GET /v1/session/node/<node>`.
    pub async fn session_node(
        &self,
        node: &str,
        opts: ReadOpts,
    ) -> Result<(Vec<SessionJson>, QueryMeta), ClientError> {
        let path = format!("/v1/session/node/{}", encode_path(node));
        self.session_read(&path, &opts).await
    }

    /// A read answering a list of sessions; a 404 is an error.
    async fn session_read(
        &self,
        path: &str,
        opts: &ReadOpts,
    ) -> Result<(Vec<SessionJson>, QueryMeta), ClientError> {
        let (reply, meta) = self.read(path, &[], opts).await?;
        Ok((reply.ok()?.json()?, meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_what_the_go_client_sends() {
        let request = SessionRequest {
            name: "Consul API Lock".into(),
            ttl: Some(Duration::from_secs(15)),
            ..SessionRequest::default()
        };
        assert_eq!(
            String::from_utf8(request.body()).unwrap(),
            r#"{"Name":"Consul API Lock","TTL":"15s"}"#
        );
        let request = SessionRequest {
            name: "Consul API Semaphore".into(),
            ttl: Some(Duration::from_secs(15)),
            lock_delay: Some(Duration::from_secs(2)),
            behavior: Behavior::Delete,
            ..SessionRequest::default()
        };
        assert_eq!(
            String::from_utf8(request.body()).unwrap(),
            r#"{"Behavior":"delete","LockDelay":"2000ms","Name":"Consul API Semaphore","TTL":"15s"}"#
        );
    }
}
