//! Services, per-service health indexes and prepared queries.

use super::*;

fn web(node: &str, id: &str, tags: &[&str]) -> Service {
    Service {
        node: node.to_owned(),
        id: id.to_owned(),
        name: "web".to_owned(),
        tags: strings(tags),
        ..Service::default()
    }
}

fn registration(node: &str, service: Option<Service>, checks: Vec<CheckRegistration>) -> Op {
    Op::CatalogRegister(Registration {
        node: node.to_owned(),
        address: "10.0.0.1".to_owned(),
        service,
        checks,
        ..Registration::default()
    })
}

fn service_check(node: &str, id: &str, service: &str, status: HealthStatus) -> CheckRegistration {
    CheckRegistration {
        service_id: service.to_owned(),
        ..check(node, id, status)
    }
}

fn health(sm: &StateMachine, service: &str) -> (Vec<ServiceHealth>, u64) {
    match sm.query(&ReadQuery::HealthService {
        name: service.to_owned(),
    }) {
        (QueryResult::Health(h), index) => (h, index),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn catalog_register_adds_node_service_and_checks_at_once() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let register_web1 = || {
        registration(
            N1,
            Some(web(N1, "web1", &["v1"])),
            vec![
                check(N1, "disk", HealthStatus::Passing),
                service_check(N1, "http", "web1", HealthStatus::Warning),
            ],
        )
    };
    let (response, fx) = apply(&mut sm, 5, register_web1());
    assert_eq!(response, Response::Done);
    assert!(fx.catalog_changed);
    assert_eq!(fx.services_changed, strings(&["web"]));

    let (h, index) = health(&sm, "web");
    assert_eq!(index, 5);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].node.address, "10.0.0.1");
    // Node checks first, then the instance's, with its service name and tags filled in.
    let ids: Vec<&str> = h[0].checks.iter().map(|c| c.check_id.as_str()).collect();
    assert_eq!(ids, ["disk", "http"]);
    assert_eq!(h[0].checks[1].service_name, "web");
    assert_eq!(h[0].checks[1].service_tags, strings(&["v1"]));
    assert!(!h[0].passing());

    // The same registration again changes nothing and wakes nobody.
    let (_, fx) = apply(&mut sm, 6, register_web1());
    assert_eq!(fx, Effects::default());
    assert_eq!(health(&sm, "web").1, 5);
}

#[test]
fn catalog_register_refusals_change_nothing() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let orphan = registration(
        N1,
        None,
        vec![service_check(N1, "http", "nope", HealthStatus::Passing)],
    );
    assert_eq!(
        apply(&mut sm, 5, orphan).0,
        Response::Rejected(ApplyError::UnknownServiceForCheck {
            service_id: "nope".into(),
            check_id: "http".into()
        })
    );
    assert!(sm.catalog().node(N1).is_none());
}

/// Consul's `TestStateStore_EnsureRegistration` with `SkipNodeUpdate`: a node not yet in the
/// catalog is created from the registration; an existing one keeps its fields.
#[test]
fn skip_node_update_creates_a_missing_node_and_leaves_an_existing_one() {
    let mut sm = StateMachine::default();
    let skip = |address: &str| {
        Op::CatalogRegister(Registration {
            node: N1.into(),
            address: address.into(),
            skip_node_update: true,
            service: Some(web(N1, "web1", &[])),
            ..Registration::default()
        })
    };
    assert_eq!(apply(&mut sm, 6, skip("10.0.0.1")).0, Response::Done);
    let node = sm.catalog().node(N1).expect("created").clone();
    assert_eq!((node.address.as_str(), node.create_index), ("10.0.0.1", 6));
    assert_eq!(apply(&mut sm, 7, skip("10.0.0.2")).0, Response::Done);
    assert_eq!(sm.catalog().node(N1), Some(&node));
}

#[test]
fn a_service_watcher_wakes_only_for_its_service() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    apply(
        &mut sm,
        5,
        registration(N1, Some(web(N1, "web1", &[])), vec![]),
    );
    let db = Service {
        name: "db".into(),
        ..web(N2, "db1", &[])
    };
    apply(&mut sm, 6, registration(N2, Some(db), vec![]));

    // A check of a db instance touches db only.
    let (_, fx) = apply(
        &mut sm,
        7,
        Op::RegisterCheck(service_check(N2, "db-ping", "db1", HealthStatus::Passing)),
    );
    assert_eq!(fx.services_changed, strings(&["db"]));
    assert_eq!(health(&sm, "web").1, 5);
    assert_eq!(health(&sm, "db").1, 7);

    // A node-level check touches every service on that node.
    let (_, fx) = apply(
        &mut sm,
        8,
        Op::RegisterCheck(check(N1, "disk", HealthStatus::Passing)),
    );
    assert_eq!(fx.services_changed, strings(&["web"]));
    assert_eq!(health(&sm, "web").1, 8);

    // A KV write touches no service.
    let (_, fx) = apply(&mut sm, 9, Op::Kv(vec![op::set("k", "v")]));
    assert!(fx.services_changed.is_empty() && !fx.catalog_changed);

    // Removing the last instance still moves the service's index, so a watcher sees it go.
    let (_, fx) = apply(
        &mut sm,
        10,
        Op::DeregisterService {
            node: N1.into(),
            service_id: "web1".into(),
        },
    );
    assert_eq!(fx.services_changed, strings(&["web"]));
    assert_eq!(health(&sm, "web"), (Vec::new(), 10));
}

#[test]
fn deregistering_a_service_invalidates_sessions_on_its_checks() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let op = registration(
        N1,
        Some(web(N1, "web1", &[])),
        vec![service_check(N1, "http", "web1", HealthStatus::Passing)],
    );
    apply(&mut sm, 5, op);
    let s = Session {
        node_checks: Vec::new(),
        checks: strings(&["http"]),
        lock_delay_ns: 0,
        ..session(S1, N1)
    };
    create_session(&mut sm, 6, s);
    kv(&mut sm, 7, vec![op::lock("leader", "me", S1)]);

    let (_, fx) = apply(
        &mut sm,
        8,
        Op::DeregisterService {
            node: N1.into(),
            service_id: "web1".into(),
        },
    );
    assert_eq!(fx.sessions_destroyed, strings(&[S1]));
    assert_eq!(sm.kv().get("leader").unwrap().session, None);
    assert!(sm.catalog().check(N1, "http").is_none());
}

fn query(id: &str, name: &str, session: &str) -> PreparedQuery {
    PreparedQuery {
        id: id.to_owned(),
        name: name.to_owned(),
        session: session.to_owned(),
        service: ServiceQuery {
            service: "web".to_owned(),
            ..ServiceQuery::default()
        },
        ..PreparedQuery::default()
    }
}

fn set_query(q: PreparedQuery, update: bool) -> Op {
    Op::SetQuery { query: q, update }
}

#[test]
fn a_prepared_query_goes_with_its_session() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    register_node(&mut sm, 1, N1);
    register_check(&mut sm, 2, check(N1, SERF_HEALTH, HealthStatus::Passing));
    create_session(&mut sm, 3, session(S1, N1));

    assert_eq!(
        apply(&mut sm, 4, set_query(query("q1", "", S2), false)).0,
        Response::Rejected(ApplyError::InvalidQuerySession(S2.into()))
    );
    let (response, fx) = apply(&mut sm, 5, set_query(query("q1", "", S1), false));
    assert_eq!(response, Response::Done);
    assert!(fx.queries_changed);
    apply(&mut sm, 6, set_query(query("q2", "named", ""), false));
    assert_eq!(
        apply(&mut sm, 7, set_query(query("q3", "named", ""), false)).0,
        Response::Rejected(ApplyError::DuplicateQueryName("named".into()))
    );
    assert_eq!(
        apply(&mut sm, 8, set_query(query("q9", "x", ""), true)).0,
        Response::Rejected(ApplyError::MissingQuery("q9".into()))
    );
    assert_eq!(
        sm.queries().lookup("named").map(|q| q.id.as_str()),
        Some("q2")
    );

    // The session's node fails: the session goes, and its query with it in the same apply.
    let (_, fx) = register_critical(&mut sm, 9, N1);
    assert!(fx.queries_changed);
    assert!(sm.queries().lookup("q1").is_none());
    assert!(sm.queries().lookup("q2").is_some());
    assert_eq!(sm.queries().table_index(), 9);
}

fn register_critical(sm: &mut StateMachine, index: u64, node: &str) -> (Response, Effects) {
    apply(
        sm,
        index,
        Op::RegisterCheck(check(node, SERF_HEALTH, HealthStatus::Critical)),
    )
}

#[test]
fn executing_a_query_keeps_healthy_tagged_instances() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let instances = [
        (N1, "a", &["prod"][..], HealthStatus::Passing),
        (N2, "b", &["prod", "canary"][..], HealthStatus::Passing),
        ("node3", "c", &["prod"][..], HealthStatus::Warning),
        ("node4", "d", &["prod"][..], HealthStatus::Critical),
    ];
    for (i, (node, id, tags, status)) in instances.iter().enumerate() {
        let op = registration(
            node,
            Some(web(node, id, tags)),
            vec![service_check(node, "http", id, *status)],
        );
        apply(&mut sm, 10 + i as u64, op);
    }
    let run = |sm: &StateMachine, q: PreparedQuery| -> Vec<String> {
        let mut ids: Vec<String> = crate::state::query::execute(&q, sm.catalog())
            .into_iter()
            .map(|h| h.service.id)
            .collect();
        ids.sort();
        ids
    };
    let mut q = query("q", "web", "");
    assert_eq!(run(&sm, q.clone()), strings(&["a", "b", "c"]));
    q.service.only_passing = true;
    assert_eq!(run(&sm, q.clone()), strings(&["a", "b"]));
    q.service.tags = strings(&["PROD", "!canary"]);
    assert_eq!(run(&sm, q), strings(&["a"]));
}
