//! `/v1/event/fire/<name>` and `/v1/event/list`: Consul's user events, spread to every member by
//! gossip. This agent lists the events it has seen whose filters match it (node name, and a
//! service of its own with a matching tag), with the last one's folded ID as `X-Consul-Index`,
//! and blocks on `?index=` until that index differs.

use axum::extract::Path;
use axum::http::HeaderValue;
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use regex_lite::Regex;
use serde::Serialize;
use tokio::time::Instant;
use vigil_gossip::event::{EVENT_SIZE_LIMIT, UserEvent, event_index};
use vigil_shared::acl::authz::{Access, Resource};
use vigil_shared::catalog::Service;

use super::Ctx;
use super::body::RequestBody;
use super::error::ApiError;

/// Consul's `UserEvent` JSON.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct EventJson<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    name: &'a str,
    /// Base64, or null when empty (Go's `[]byte`).
    payload: Option<String>,
    node_filter: &'a str,
    service_filter: &'a str,
    tag_filter: &'a str,
    version: u8,
    #[serde(rename = "LTime")]
    ltime: u64,
}

impl<'a> EventJson<'a> {
    fn new(e: &'a UserEvent) -> EventJson<'a> {
        EventJson {
            id: &e.id,
            name: &e.name,
            payload: (!e.payload.is_empty()).then(|| BASE64.encode(&e.payload)),
            node_filter: &e.node_filter,
            service_filter: &e.service_filter,
            tag_filter: &e.tag_filter,
            version: 1,
            ltime: e.ltime,
        }
    }
}

/// Consul's check of a filter: a valid regular expression.
fn filter(what: &str, pattern: &str) -> Result<(), ApiError> {
    if pattern.is_empty() {
        return Ok(());
    }
    Regex::new(pattern)
        .map(|_| ())
        .map_err(|e| ApiError::server(format!("Invalid {what} filter: {e}")))
}

/// `PUT /v1/event/fire/<name>[?node=][&service=][&tag=]`, the body the payload.
pub async fn fire(
    cx: Ctx,
    Path(name): Path<String>,
    RequestBody(body): RequestBody,
) -> Result<Response, ApiError> {
    cx.check(Resource::Event, Access::Write, &name)?;
    let param = |name: &str| cx.params.get(name).unwrap_or_default().to_owned();
    let event = UserEvent {
        id: uuid::Uuid::new_v4().to_string(),
        name,
        payload: body.to_vec(),
        node_filter: param("node"),
        service_filter: param("service"),
        tag_filter: param("tag"),
        ltime: 0,
    };
    if !event.tag_filter.is_empty() && event.service_filter.is_empty() {
        return Err(ApiError::server(
            "Cannot provide tag filter without service filter",
        ));
    }
    filter("node", &event.node_filter)?;
    filter("service", &event.service_filter)?;
    filter("tag", &event.tag_filter)?;
    if event.name.len() + event.payload.len() > EVENT_SIZE_LIMIT {
        return Err(ApiError::server(format!(
            "user event exceeds configured limit of {EVENT_SIZE_LIMIT} bytes before encoding"
        )));
    }
    let fired = cx
        .state
        .gossip
        .fire_event(event)
        .await
        .map_err(|e| ApiError::server(e.to_string()))?;
    // As Consul's answer: the event as sent, before any Lamport time is known.
    let answer = UserEvent { ltime: 0, ..fired };
    Ok(cx.json(&EventJson::new(&answer)))
}

pub async fn missing_name() -> ApiError {
    ApiError::bad_request("Missing name")
}

/// Consul's `shouldProcessUserEvent`: the node filter matches this node's name, and the service
/// filter one of its services' IDs (with the tag filter one of that service's tags).
fn concerns_us(event: &UserEvent, node: &str, services: &[Service]) -> bool {
    let matches = |pattern: &str, text: &str| Regex::new(pattern).is_ok_and(|re| re.is_match(text));
    if !event.node_filter.is_empty() && !matches(&event.node_filter, node) {
        return false;
    }
    if event.service_filter.is_empty() {
        return true;
    }
    services.iter().any(|s| {
        matches(&event.service_filter, &s.id)
            && (event.tag_filter.is_empty() || s.tags.iter().any(|t| matches(&event.tag_filter, t)))
    })
}

/// `GET /v1/event/list[?name=][&index=&wait=]`: oldest first.
pub async fn list(cx: Ctx) -> Result<Response, ApiError> {
    let opts = cx.params.query_options()?;
    let name = cx.params.get("name").filter(|n| !n.is_empty());
    let deadline = Instant::now() + std::time::Duration::from_millis(opts.wait_ms);
    let mut events = cx.state.gossip.events();
    loop {
        let seen = events.borrow_and_update().clone();
        let services = cx.state.local.services();
        let ours: Vec<&UserEvent> = seen
            .iter()
            .filter(|e| name.is_none_or(|n| e.name == n))
            .filter(|e| cx.authz.allows(Resource::Event, Access::Read, &e.name))
            .filter(|e| concerns_us(e, &cx.state.node_name, &services))
            .collect();
        // As Consul: 1 for no events, so a watch on an empty list blocks.
        let index = ours.last().map_or(1, |e| event_index(&e.id));
        if opts.min_index == 0 || index != opts.min_index || Instant::now() >= deadline {
            let out: Vec<EventJson> = ours.into_iter().map(EventJson::new).collect();
            let mut response = cx.json(&out);
            response
                .headers_mut()
                .insert("X-Consul-Index", HeaderValue::from(index));
            return Ok(response);
        }
        tokio::select! {
            changed = events.changed() => if changed.is_err() {
                return Err(ApiError::server("agent is shutting down"));
            },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(node: &str, service: &str, tag: &str) -> UserEvent {
        UserEvent {
            id: String::new(),
            name: "deploy".to_owned(),
            payload: Vec::new(),
            node_filter: node.to_owned(),
            service_filter: service.to_owned(),
            tag_filter: tag.to_owned(),
            ltime: 1,
        }
    }

    #[test]
    fn filters_pick_nodes_services_and_tags_by_regex() {
        let web = Service {
            id: "web-1".to_owned(),
            name: "web".to_owned(),
            tags: vec!["blue".to_owned()],
            ..Service::default()
        };
        let services = [web];
        for (e, want) in [
            (event("", "", ""), true),
            (event("^node-a$", "", ""), true),
            (event("node-b", "", ""), false),
            (event("", "^web", ""), true),
            (event("", "db", ""), false),
            (event("", "web", "^blu"), true),
            (event("", "web", "green"), false),
            (event("[", "", ""), false),
        ] {
            assert_eq!(concerns_us(&e, "node-a", &services), want, "{e:?}");
        }
    }
}
