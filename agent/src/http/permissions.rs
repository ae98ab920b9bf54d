//! What every HTTP route requires of the request's token: one table, [`ROUTES`], an entry per
//! route and method, checked by [`guard`] in front of every handler. A route without an entry
//! is refused (500) rather than served unguarded, and a test compares the table with the
//! router, so a new route does not ship until someone writes down who may call it.
//!
//! A permission that does not depend on the request ([`Needs::Fixed`]) is checked here, before
//! the handler runs. One that names what the request names (a key, a service, a node: known only
//! once the path or body is read) is checked by the handler, and the entry says on what; a list
//! is filtered by the handler to what the token may read.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use vigil_shared::acl::authz::{Access, Authorizer, Resource};

use super::AppState;
use super::error::ApiError;
use super::params::Params;

/// Whose permission a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// No token at all; the text says why that is safe.
    Nothing(&'static str),
    /// `resource:access` on this agent's node name (agent rules) or on the unsegmented
    /// resources (acl, operator, keyring), checked before the handler.
    Fixed(Resource, Access),
    /// `resource:access` on a name the request carries; the text says which.
    Named(Resource, Access, &'static str),
    /// A read whose results are cut down to what the token may read of `resource`.
    Filtered(Resource),
}

/// One route and method.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// As registered in the router (`{id}`, `{*key}` for the parts the request fills in).
    pub path: &'static str,
    pub method: &'static str,
    pub needs: Needs,
}

const fn rule(path: &'static str, method: &'static str, needs: Needs) -> Rule {
    Rule {
        path,
        method,
        needs,
    }
}

use Access::{Read, Write};
use Needs::{Filtered, Fixed, Named, Nothing};
use Resource::{Acl, Agent, Event, Key, Keyring, Node, Operator, Query, Service, Session};

/// Why the ACL endpoints that work on the caller's own token need no rule.
const OWN_TOKEN: &str = "works on the token the request presents, which must resolve";
/// Why the routes that only answer a client error need no rule.
const INCOMPLETE: &str = "a path without its name: answers 400 and touches nothing";

/// Every route the router serves, by path and method. Keep in the router's order.
pub const ROUTES: &[Rule] = &[
    rule("/v1/kv", "GET", Filtered(Key)),
    rule(
        "/v1/kv",
        "PUT",
        Nothing("no key: answers 400 and writes nothing"),
    ),
    rule(
        "/v1/kv",
        "DELETE",
        Named(Key, Write, "the key; with ?recurse every key under it"),
    ),
    rule("/v1/kv/", "GET", Filtered(Key)),
    rule(
        "/v1/kv/",
        "PUT",
        Nothing("no key: answers 400 and writes nothing"),
    ),
    rule(
        "/v1/kv/",
        "DELETE",
        Named(Key, Write, "the key; with ?recurse every key under it"),
    ),
    rule(
        "/v1/kv/{*key}",
        "GET",
        Named(Key, Read, "the key (?recurse, ?keys: filtered)"),
    ),
    rule(
        "/v1/kv/{*key}",
        "PUT",
        Named(Key, Write, "the key, and session:write with ?acquire"),
    ),
    rule(
        "/v1/kv/{*key}",
        "DELETE",
        Named(Key, Write, "the key; with ?recurse every key under it"),
    ),
    rule(
        "/v1/txn",
        "PUT",
        Named(
            Key,
            Write,
            "each operation's key, node or service (reads: read)",
        ),
    ),
    rule(
        "/v1/acl/bootstrap",
        "PUT",
        Nothing("works once, before any management token exists"),
    ),
    rule("/v1/acl/token", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/token/self", "GET", Nothing(OWN_TOKEN)),
    rule("/v1/acl/token/{id}", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/token/{id}", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/token/{id}", "DELETE", Fixed(Acl, Write)),
    rule("/v1/acl/token/{id}/clone", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/tokens", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/policy", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/policy/{id}", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/policy/{id}", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/policy/{id}", "DELETE", Fixed(Acl, Write)),
    rule("/v1/acl/policy/name/{name}", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/policies", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/role", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/role/{id}", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/role/{id}", "PUT", Fixed(Acl, Write)),
    rule("/v1/acl/role/{id}", "DELETE", Fixed(Acl, Write)),
    rule("/v1/acl/role/name/{name}", "GET", Fixed(Acl, Read)),
    rule("/v1/acl/roles", "GET", Fixed(Acl, Read)),
    rule(
        "/v1/acl/replication",
        "GET",
        Nothing("a fixed answer: one datacenter replicates nothing"),
    ),
    rule(
        "/v1/acl/login",
        "POST",
        Nothing("no auth methods exist: always refused"),
    ),
    rule("/v1/acl/logout", "POST", Nothing(OWN_TOKEN)),
    rule("/v1/agent/token/{kind}", "PUT", Fixed(Agent, Write)),
    rule("/v1/agent/host", "GET", Fixed(Operator, Read)),
    rule(
        "/v1/coordinate/datacenters",
        "GET",
        Nothing("the datacenter's name only"),
    ),
    rule("/v1/coordinate/nodes", "GET", Filtered(Node)),
    rule(
        "/v1/coordinate/node/{node}",
        "GET",
        Named(Node, Read, "the node"),
    ),
    rule(
        "/v1/catalog/connect/{service}",
        "GET",
        Named(Service, Read, "the service"),
    ),
    rule("/v1/snapshot", "GET", Fixed(Acl, Write)),
    rule("/v1/snapshot", "PUT", Fixed(Acl, Write)),
    rule(
        "/v1/session/create",
        "PUT",
        Named(Session, Write, "the session's node"),
    ),
    rule("/v1/session/destroy/", "PUT", Nothing(INCOMPLETE)),
    rule(
        "/v1/session/destroy/{id}",
        "PUT",
        Named(Session, Write, "the session's node"),
    ),
    rule("/v1/session/renew/", "PUT", Nothing(INCOMPLETE)),
    rule(
        "/v1/session/renew/{id}",
        "PUT",
        Named(Session, Write, "the session's node"),
    ),
    rule("/v1/session/info/", "GET", Nothing(INCOMPLETE)),
    rule("/v1/session/info/{id}", "GET", Filtered(Session)),
    rule("/v1/session/list", "GET", Filtered(Session)),
    rule("/v1/session/node/", "GET", Nothing(INCOMPLETE)),
    rule("/v1/session/node/{node}", "GET", Filtered(Session)),
    rule(
        "/v1/status/leader",
        "GET",
        Nothing("an address any member gossips"),
    ),
    rule(
        "/v1/status/peers",
        "GET",
        Nothing("addresses any member gossips"),
    ),
    rule(
        "/v1/operator/raft/configuration",
        "GET",
        Fixed(Operator, Read),
    ),
    rule("/v1/operator/raft/peer", "DELETE", Fixed(Operator, Write)),
    rule(
        "/v1/operator/raft/transfer-leader",
        "POST",
        Fixed(Operator, Write),
    ),
    rule(
        "/v1/operator/raft/transfer-leader",
        "PUT",
        Fixed(Operator, Write),
    ),
    rule(
        "/v1/operator/autopilot/configuration",
        "GET",
        Fixed(Operator, Read),
    ),
    rule(
        "/v1/operator/autopilot/configuration",
        "PUT",
        Fixed(Operator, Write),
    ),
    rule(
        "/v1/operator/autopilot/health",
        "GET",
        Fixed(Operator, Read),
    ),
    rule("/v1/operator/usage", "GET", Fixed(Operator, Read)),
    rule("/v1/operator/keyring", "GET", Fixed(Keyring, Read)),
    rule("/v1/operator/keyring", "POST", Fixed(Keyring, Write)),
    rule("/v1/operator/keyring", "PUT", Fixed(Keyring, Write)),
    rule("/v1/operator/keyring", "DELETE", Fixed(Keyring, Write)),
    rule("/v1/agent/self", "GET", Fixed(Agent, Read)),
    rule("/v1/agent/metrics", "GET", Fixed(Agent, Read)),
    rule("/v1/agent/reload", "PUT", Fixed(Agent, Write)),
    rule("/v1/agent/monitor", "GET", Fixed(Agent, Read)),
    rule("/v1/agent/members", "GET", Filtered(Node)),
    rule("/v1/agent/join/{addr}", "PUT", Fixed(Agent, Write)),
    rule("/v1/agent/leave", "PUT", Fixed(Agent, Write)),
    rule(
        "/v1/agent/force-leave/{node}",
        "PUT",
        Fixed(Operator, Write),
    ),
    rule("/v1/agent/checks", "GET", Filtered(Node)),
    rule(
        "/v1/agent/check/register",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule(
        "/v1/agent/check/deregister/{*id}",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule(
        "/v1/agent/check/pass/{*id}",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule(
        "/v1/agent/check/warn/{*id}",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule(
        "/v1/agent/check/fail/{*id}",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule(
        "/v1/agent/check/update/{*id}",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule(
        "/v1/agent/maintenance",
        "PUT",
        Named(Node, Write, "this agent's node"),
    ),
    rule("/v1/agent/services", "GET", Filtered(Service)),
    rule("/v1/agent/health/service/id/", "GET", Nothing(INCOMPLETE)),
    rule(
        "/v1/agent/health/service/id/{*id}",
        "GET",
        Named(Node, Read, "this agent's node"),
    ),
    rule("/v1/agent/health/service/name/", "GET", Nothing(INCOMPLETE)),
    rule(
        "/v1/agent/health/service/name/{*name}",
        "GET",
        Named(Service, Read, "the service"),
    ),
    rule(
        "/v1/agent/service/register",
        "PUT",
        Named(Service, Write, "the service's name"),
    ),
    rule(
        "/v1/agent/service/deregister/{*id}",
        "PUT",
        Named(Service, Write, "the service's name"),
    ),
    rule("/v1/agent/service/maintenance/", "PUT", Nothing(INCOMPLETE)),
    rule(
        "/v1/agent/service/maintenance/{*id}",
        "PUT",
        Named(Service, Write, "the service's name"),
    ),
    rule(
        "/v1/agent/service/{*id}",
        "GET",
        Named(Node, Read, "this agent's node"),
    ),
    rule("/v1/event/fire/", "PUT", Nothing(INCOMPLETE)),
    rule(
        "/v1/event/fire/{name}",
        "PUT",
        Named(Event, Write, "the event's name"),
    ),
    rule("/v1/event/list", "GET", Filtered(Event)),
    rule(
        "/v1/catalog/register",
        "PUT",
        Named(Node, Write, "the node, and service:write on its service"),
    ),
    rule(
        "/v1/catalog/deregister",
        "PUT",
        Named(Node, Write, "the node"),
    ),
    rule("/v1/catalog/nodes", "GET", Filtered(Node)),
    rule("/v1/catalog/services", "GET", Filtered(Service)),
    rule(
        "/v1/catalog/datacenters",
        "GET",
        Nothing("the datacenter's name only"),
    ),
    rule(
        "/v1/catalog/service/{name}",
        "GET",
        Named(Service, Read, "the service"),
    ),
    rule(
        "/v1/catalog/node/{node}",
        "GET",
        Named(Node, Read, "the node"),
    ),
    rule(
        "/v1/health/node/{node}",
        "GET",
        Named(Node, Read, "the node"),
    ),
    rule(
        "/v1/health/checks/{service}",
        "GET",
        Named(Service, Read, "the service"),
    ),
    rule(
        "/v1/health/service/{service}",
        "GET",
        Named(Service, Read, "the service"),
    ),
    rule("/v1/health/state/", "GET", Nothing(INCOMPLETE)),
    rule("/v1/health/state/{state}", "GET", Filtered(Node)),
    rule("/v1/query", "GET", Filtered(Query)),
    rule("/v1/query", "POST", Named(Query, Write, "the query's name")),
    rule(
        "/v1/query/{id}",
        "GET",
        Named(Query, Read, "the query's name"),
    ),
    rule(
        "/v1/query/{id}",
        "PUT",
        Named(Query, Write, "the query's name, before and after"),
    ),
    rule(
        "/v1/query/{id}",
        "DELETE",
        Named(Query, Write, "the query's name"),
    ),
    rule("/v1/query/{id}/execute", "GET", Filtered(Service)),
    rule(
        "/v1/query/{id}/explain",
        "GET",
        Named(Query, Read, "the query's name"),
    ),
    rule(
        "/v1/vigil/sequencer",
        "GET",
        Named(Key, Read, "the key or lock"),
    ),
    rule("/v1/vigil/locks", "GET", Filtered(Key)),
    rule("/v1/vigil/history", "GET", Filtered(Key)),
    rule(
        "/v1/vigil/history/{*name}",
        "GET",
        Named(Key, Read, "the lock's name (?prefix: filtered)"),
    ),
    rule(
        "/v1/vigil/lock/{*name}",
        "GET",
        Named(Key, Read, "the lock's name"),
    ),
    rule(
        "/v1/vigil/lock/{*name}",
        "PUT",
        Named(Key, Write, "the lock's name, and session:write"),
    ),
    rule(
        "/v1/vigil/lock/{*name}",
        "DELETE",
        Named(Key, Write, "the lock's name, and session:write"),
    ),
    rule(
        "/",
        "GET",
        Nothing("the UI's static files; its calls carry their own token"),
    ),
    rule(
        "/ui",
        "GET",
        Nothing("the UI's static files; its calls carry their own token"),
    ),
    rule(
        "/ui/",
        "GET",
        Nothing("the UI's static files; its calls carry their own token"),
    ),
    rule(
        "/ui/{*file}",
        "GET",
        Nothing("the UI's static files; its calls carry their own token"),
    ),
];

/// The entry for `method` on the route `path` (HEAD is served as GET).
pub fn lookup(path: &str, method: &Method) -> Option<&'static Rule> {
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    ROUTES.iter().find(|r| r.path == path && r.method == method)
}

/// The authorizer [`guard`] resolved, left for the handler's `Ctx` so a token is resolved once.
#[derive(Clone)]
pub struct Resolved(pub Arc<Authorizer>);

/// Most of a refused request's unread body that is read and dropped before the answer, as Go's
/// server does (256 KiB), so the client's connection stays open for its next request; a
/// connection with more unread is closed after the answer.
const REFUSED_BODY_DRAIN: usize = 256 * 1024;

/// The refusal `e`, once the request's body is read (up to [`REFUSED_BODY_DRAIN`]): a body
/// left unread makes the server close the connection after answering, and a client that sends
/// its next request on it meanwhile (py-consul's pooled connections) finds it closed without
/// an answer.
async fn refused(body: axum::body::Body, e: ApiError) -> Response {
    // Too large or broken: the connection closes, as it would have.
    let _ = axum::body::to_bytes(body, REFUSED_BODY_DRAIN).await;
    e.into_response()
}

/// In front of every route: refuses a route with no entry in [`ROUTES`] (a method the route
/// does not serve goes on to the router's 405), checks a
/// [`Needs::Fixed`] permission before the handler runs, and runs the handler on behalf of the
/// request's token, so the servers check it again ([`crate::token`]). The answer carries the
/// route for the request's timing ([`super::metrics::tag_route`]).
pub async fn guard(
    State(state): State<AppState>,
    matched: Option<MatchedPath>,
    req: Request,
    next: Next,
) -> Response {
    let Some(path) = matched else {
        // No route: the router's 404.
        return next.run(req).await;
    };
    // Boxed: a request let through waits below in `next.run` (a blocking query, for minutes),
    // and an admission inline (a token resolution, a refusal's body drained) would size this
    // future, so every waiting request, for a state it left long ago.
    let mut response = match Box::pin(admit(&state, &path, req)).await {
        Admission::Run(req, token) => crate::token::scope(token, next.run(req)).await,
        Admission::Unguarded(req) => next.run(req).await,
        Admission::Refused(answer) => answer,
    };
    super::metrics::tag_route(&mut response, &path);
    response
}

/// What [`guard`] does with a request.
enum Admission {
    /// Run the handler on behalf of the token.
    Run(Request, String),
    /// A method the route does not serve: the router's 405 with `Allow`, or its answer to
    /// OPTIONS. The table lists exactly the methods the router serves (tested), so no handler
    /// runs unguarded.
    Unguarded(Request),
    /// Refused, with this answer.
    Refused(Response),
}

async fn admit(state: &AppState, path: &MatchedPath, req: Request) -> Admission {
    let Some(rule) = lookup(path.as_str(), req.method()) else {
        if ROUTES.iter().any(|r| r.path == path.as_str()) {
            return Admission::Unguarded(req);
        }
        tracing::error!(path = %req.uri().path(), method = %req.method(), "a route without a permission entry");
        return Admission::Refused(
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "this route has no permission entry",
            )
            .into_response(),
        );
    };
    let (mut parts, body) = req.into_parts();
    let params = Params::parse(parts.uri.query());
    let token =
        super::acl::request_token(&parts, &params).unwrap_or_else(|| state.acls.default_token());
    if let Needs::Fixed(resource, access) = rule.needs {
        let name = if resource == Agent {
            state.node_name.as_str()
        } else {
            ""
        };
        let resolved = super::acl::Authz::resolve(&parts, &params, state);
        let checked = crate::token::scope(token.clone(), resolved)
            .await
            .and_then(|authz| authz.check(resource, access, name).map(|()| authz));
        match checked {
            Ok(authz) => parts.extensions.insert(Resolved(authz.0)),
            Err(e) => return Admission::Refused(refused(body, e).await),
        };
    }
    Admission::Run(Request::from_parts(parts, body), token)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The paths the router registers, read from its source.
    fn router_paths() -> BTreeSet<String> {
        let source = include_str!("mod.rs");
        source
            .split(".route(")
            .skip(1)
            .filter_map(|rest| {
                let rest = rest.trim_start().strip_prefix('"')?;
                Some(rest[..rest.find('"')?].to_owned())
            })
            .collect()
    }

    #[test]
    fn every_route_in_the_router_has_an_entry_and_every_entry_a_route() {
        let table: BTreeSet<String> = ROUTES.iter().map(|r| r.path.to_owned()).collect();
        let routed = router_paths();
        assert!(
            routed.len() > 90,
            "the router's source was not read: {routed:?}"
        );
        let unlisted: Vec<_> = routed.difference(&table).collect();
        assert!(
            unlisted.is_empty(),
            "routes without a permission entry: {unlisted:?}"
        );
        let stale: Vec<_> = table.difference(&routed).collect();
        assert!(
            stale.is_empty(),
            "entries for routes the router lacks: {stale:?}"
        );
    }

    #[test]
    fn no_route_and_method_has_two_entries() {
        let mut seen = BTreeSet::new();
        for r in ROUTES {
            assert!(
                seen.insert((r.path, r.method)),
                "{} {} twice",
                r.method,
                r.path
            );
        }
    }

    #[test]
    fn only_the_unsegmented_resources_and_agent_are_fixed() {
        for r in ROUTES {
            if let Needs::Fixed(resource, _) = r.needs {
                assert!(
                    matches!(resource, Acl | Agent | Operator | Keyring),
                    "{} {}: {resource:?} needs a name",
                    r.method,
                    r.path
                );
            }
        }
    }

    #[test]
    fn what_an_attacker_tried_first_is_guarded() {
        let needs = |path, method: Method| lookup(path, &method).map(|r| r.needs);
        assert_eq!(needs("/v1/snapshot", Method::GET), Some(Fixed(Acl, Write)));
        assert_eq!(needs("/v1/snapshot", Method::PUT), Some(Fixed(Acl, Write)));
        assert_eq!(
            needs("/v1/agent/leave", Method::PUT),
            Some(Fixed(Agent, Write))
        );
        assert_eq!(
            needs("/v1/agent/reload", Method::PUT),
            Some(Fixed(Agent, Write))
        );
        assert_eq!(
            needs("/v1/acl/tokens", Method::HEAD),
            Some(Fixed(Acl, Read))
        );
        assert_eq!(needs("/v1/agent/leave", Method::GET), None);
    }
}
