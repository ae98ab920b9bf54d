//! The ACL tables: bootstrapping once, the built-ins, links by ID or name, unique names, and
//! what a token resolves to.

use vigil_shared::acl::{
    ANONYMOUS_TOKEN_ACCESSOR_ID, GLOBAL_MANAGEMENT_POLICY_ID, Link, Policy, Role, Token,
};
use vigil_shared::rpc::{AclOp, reads};

use super::*;

fn acl(sm: &mut StateMachine, index: u64, op: AclOp) -> Response {
    apply(sm, index, Op::Acl(op)).0
}

fn set_token(token: Token, create: bool) -> AclOp {
    AclOp::SetToken { token, create }
}

fn policy(id: &str, name: &str, rules: &str) -> Policy {
    Policy {
        id: id.into(),
        name: name.into(),
        description: String::new(),
        rules: rules.into(),
        datacenters: Vec::new(),
        create_index: 0,
        modify_index: 0,
    }
}

fn by_name(name: &str) -> Link {
    Link {
        id: String::new(),
        name: name.into(),
    }
}

fn rejected(response: Response) -> String {
    match response {
        Response::Rejected(e) => e.to_string(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn init_writes_the_builtins_and_ends_bootstrapping() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let root = Token {
        policies: vec![Link {
            id: GLOBAL_MANAGEMENT_POLICY_ID.into(),
            name: String::new(),
        }],
        ..Token::new("root-accessor", "root-secret")
    };
    let init = AclOp::Init {
        initial_management: Some(root),
    };
    assert_eq!(acl(&mut sm, 3, init.clone()), Response::Done);
    let store = sm.acl();
    assert_eq!(store.table_index(), 3);
    assert!(store.token(ANONYMOUS_TOKEN_ACCESSOR_ID).is_some());
    let resolved = store.resolve("root-secret").expect("the initial token");
    assert_eq!(resolved.policies[0].name, "global-management");
    assert_eq!(resolved.token.policies[0].name, "global-management");
    // Init again (a new leader) changes nothing; bootstrapping is over, with its reset index.
    assert_eq!(acl(&mut sm, 4, init), Response::Done);
    assert_eq!(sm.acl().token("root-accessor").unwrap().create_index, 3);
    let again = acl(&mut sm, 5, AclOp::Bootstrap(Token::new("b", "b-secret")));
    assert_eq!(
        rejected(again),
        "ACL bootstrap no longer allowed (reset index: 3)"
    );
}

#[test]
fn bootstrap_works_once() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    acl(
        &mut sm,
        1,
        AclOp::Init {
            initial_management: None,
        },
    );
    assert_eq!(
        acl(&mut sm, 2, AclOp::Bootstrap(Token::new("a", "s"))),
        Response::Done
    );
    let twice = acl(&mut sm, 3, AclOp::Bootstrap(Token::new("b", "t")));
    assert_eq!(
        rejected(twice),
        "ACL bootstrap no longer allowed (reset index: 2)"
    );
    assert!(sm.acl().token("b").is_none());
}

#[test]
fn links_resolve_by_name_and_unknown_ones_are_refused() {
    // Refused writes reuse the next index below, as in the first release (protocol 1).
    let mut sm = StateMachine::at_protocol(1);
    acl(
        &mut sm,
        1,
        AclOp::Init {
            initial_management: None,
        },
    );
    let set = |policy| AclOp::SetPolicy {
        policy,
        create: true,
    };
    assert_eq!(
        acl(
            &mut sm,
            2,
            set(policy("p1", "app", "key \"a\" { policy = \"read\" }"))
        ),
        Response::Done
    );
    let dup = acl(&mut sm, 3, set(policy("p2", "app", "")));
    assert!(rejected(dup).contains("already exists"));
    let bad_name = acl(&mut sm, 3, set(policy("p3", "no spaces", "")));
    assert!(rejected(bad_name).contains("invalid Name"));

    let role = Role {
        id: "r1".into(),
        name: "readers".into(),
        description: String::new(),
        policies: vec![by_name("app")],
        service_identities: Vec::new(),
        node_identities: Vec::new(),
        create_index: 0,
        modify_index: 0,
    };
    assert_eq!(
        acl(&mut sm, 4, AclOp::SetRole { role, create: true }),
        Response::Done
    );
    let token = Token {
        roles: vec![by_name("readers")],
        ..Token::new("t1", "s1")
    };
    assert_eq!(acl(&mut sm, 5, set_token(token, true)), Response::Done);
    let stored = sm.acl().token("t1").unwrap();
    assert_eq!(
        stored.roles,
        vec![Link {
            id: "r1".into(),
            name: "readers".into()
        }]
    );
    let resolved = sm.acl().resolve("s1").unwrap();
    assert_eq!(resolved.policies.len(), 1);
    assert_eq!(resolved.policies[0].id, "p1");

    let unknown = Token {
        policies: vec![by_name("nope")],
        ..Token::new("t2", "s2")
    };
    let refused = acl(&mut sm, 6, set_token(unknown, true));
    assert!(rejected(refused).contains("cannot find policy"));
    let reused = acl(&mut sm, 6, set_token(Token::new("t3", "s1"), true));
    assert!(rejected(reused).contains("SecretID is already in use"));

    // A deleted policy drops out of every link; the role stays.
    assert_eq!(
        acl(&mut sm, 7, AclOp::DeletePolicy { id: "p1".into() }),
        Response::Done
    );
    assert!(sm.acl().resolve("s1").unwrap().policies.is_empty());
    assert!(sm.acl().role("readers", true).unwrap().policies.is_empty());
    let (answer, index) = sm.query(&reads::AclTokenList {}.into());
    assert_eq!(index, 7);
    assert!(matches!(answer, QueryResult::AclTokens(t) if t.len() == 2));
}

#[test]
fn the_builtins_are_protected() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    acl(
        &mut sm,
        1,
        AclOp::Init {
            initial_management: None,
        },
    );
    let delete = acl(
        &mut sm,
        2,
        AclOp::DeletePolicy {
            id: GLOBAL_MANAGEMENT_POLICY_ID.into(),
        },
    );
    assert!(rejected(delete).contains("not permitted"));
    let weaken = AclOp::SetPolicy {
        policy: policy(GLOBAL_MANAGEMENT_POLICY_ID, "global-management", ""),
        create: false,
    };
    assert!(rejected(acl(&mut sm, 2, weaken)).contains("not permitted"));
    let anonymous = AclOp::DeleteToken {
        accessor_id: ANONYMOUS_TOKEN_ACCESSOR_ID.into(),
    };
    assert!(rejected(acl(&mut sm, 2, anonymous)).contains("anonymous"));
    let missing = acl(
        &mut sm,
        2,
        AclOp::DeleteToken {
            accessor_id: "nope".into(),
        },
    );
    assert_eq!(rejected(missing), "ACL not found");
    assert_eq!(sm.acl().table_index(), 1);
}

#[test]
fn an_update_keeps_the_secret_and_expiry_and_refuses_to_change_them() {
    let mut sm = StateMachine::at_protocol(vigil_shared::PROTOCOL);
    let token = Token {
        expiration_time_ms: Some(T0 + 60_000),
        ..Token::new("t", "s")
    };
    assert_eq!(acl(&mut sm, 1, set_token(token, true)), Response::Done);
    let update = Token {
        description: "renamed".into(),
        ..Token::new("t", "")
    };
    assert_eq!(acl(&mut sm, 2, set_token(update, false)), Response::Done);
    let stored = sm.acl().token("t").unwrap();
    assert_eq!(
        (stored.secret_id.as_str(), stored.description.as_str()),
        ("s", "renamed")
    );
    assert_eq!(stored.expiration_time_ms, Some(T0 + 60_000));
    assert_eq!((stored.create_index, stored.modify_index), (1, 2));
    let other_secret = set_token(Token::new("t", "other"), false);
    assert!(rejected(acl(&mut sm, 3, other_secret)).contains("SecretID"));
    let past = Token {
        expiration_time_ms: Some(T0 - 1),
        ..Token::new("u", "u")
    };
    assert!(rejected(acl(&mut sm, 3, set_token(past, true))).contains("past"));
}
