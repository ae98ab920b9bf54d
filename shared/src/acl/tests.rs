//! The rule language and the authorizer, after Consul's `acl/policy_test.go`,
//! `acl/policy_authorizer_test.go` and `acl/policy_merger_test.go`.

use super::authz::{Access, Authorizer, DefaultPolicy, PermissionDenied, Resource};
use super::rules::{Level, Rules, RulesError, parse};
use super::*;

// ---------------------------------------------------------------------------------------
// Helpers.

fn policy(id: &str, rules: &str, datacenters: &[&str]) -> Policy {
    Policy {
        id: id.into(),
        name: format!("policy-{id}"),
        description: String::new(),
        rules: rules.into(),
        datacenters: datacenters.iter().map(|dc| dc.to_string()).collect(),
        create_index: 1,
        modify_index: 1,
    }
}

fn token(accessor_id: &str) -> Token {
    Token {
        create_index: 1,
        modify_index: 1,
        ..Token::new(accessor_id, format!("secret-{accessor_id}"))
    }
}

fn role(id: &str) -> Role {
    Role {
        id: id.into(),
        name: format!("role-{id}"),
        description: String::new(),
        policies: Vec::new(),
        service_identities: Vec::new(),
        node_identities: Vec::new(),
        create_index: 1,
        modify_index: 1,
    }
}

fn resolved(policies: Vec<Policy>) -> Resolved {
    Resolved {
        token: token("tok-1"),
        roles: Vec::new(),
        policies,
    }
}

/// An authorizer for a token holding each of `rules` as one policy, in dc1.
fn authz(default: DefaultPolicy, rules: &[&str]) -> Authorizer {
    let policies = rules
        .iter()
        .enumerate()
        .map(|(i, rules)| policy(&format!("p{i}"), rules, &[]))
        .collect();
    Authorizer::new(&resolved(policies), "dc1", default).expect("rules parse")
}

fn parse_err(text: &str) -> String {
    parse(text).expect_err(text).to_string()
}

// ---------------------------------------------------------------------------------------
// Parsing.

const HCL_POLICY: &str = r#"
agent "foo" {
    policy = "read"
}
agent_prefix "bar" {
    policy = "write"
}
event_prefix "" {
    policy = "read"
}
event "foo" {
    policy = "deny"
}
key_prefix "" {
    policy = "read"
}
key_prefix "foo/" {
    policy = "write"
}
key_prefix "foo/bar/" {
    policy = "list"
}
key "foo/bar/baz" {
    policy = "deny"
}
keyring = "deny"
node_prefix "" {
    policy = "read"
}
node "foo" {
    policy = "write"
}
operator = "deny"
mesh = "write"
peering = "read"
service_prefix "" {
    policy = "write"
}
service "foo" {
    policy = "read"
    intentions = "write"
}
session "foo" {
    policy = "write"
}
session_prefix "bar" {
    policy = "deny"
}
query_prefix "" {
    policy = "read"
}
query "foo" {
    policy = "write"
}
acl = "read"
"#;

const JSON_POLICY: &str = r#"{
  "agent": {"foo": {"policy": "read"}},
  "agent_prefix": {"bar": {"policy": "write"}},
  "event_prefix": {"": {"policy": "read"}},
  "event": {"foo": {"policy": "deny"}},
  "key_prefix": {
    "": {"policy": "read"},
    "foo/": {"policy": "write"},
    "foo/bar/": {"policy": "list"}
  },
  "key": {"foo/bar/baz": {"policy": "deny"}},
  "keyring": "deny",
  "node_prefix": {"": {"policy": "read"}},
  "node": {"foo": {"policy": "write"}},
  "operator": "deny",
  "mesh": "write",
  "peering": "read",
  "service_prefix": {"": {"policy": "write"}},
  "service": {"foo": {"policy": "read", "intentions": "write"}},
  "session": {"foo": {"policy": "write"}},
  "session_prefix": {"bar": {"policy": "deny"}},
  "query_prefix": {"": {"policy": "read"}},
  "query": {"foo": {"policy": "write"}},
  "acl": "read"
}"#;

#[test]
fn parses_every_resource_from_hcl() {
    let rules = parse(HCL_POLICY).unwrap();

    // Segmented resources land in exact or prefix by the block's name.
    assert_eq!(rules.agent.exact["foo"], Level::Read);
    assert_eq!(rules.agent.prefix["bar"], Level::Write);
    assert_eq!(rules.event.prefix[""], Level::Read);
    assert_eq!(rules.event.exact["foo"], Level::Deny);
    assert_eq!(rules.key.prefix[""], Level::Read);
    assert_eq!(rules.key.prefix["foo/"], Level::Write);
    assert_eq!(rules.key.prefix["foo/bar/"], Level::List);
    assert_eq!(rules.key.exact["foo/bar/baz"], Level::Deny);
    assert_eq!(rules.key.exact.len(), 1);
    assert_eq!(rules.node.prefix[""], Level::Read);
    assert_eq!(rules.node.exact["foo"], Level::Write);
    assert_eq!(rules.service.prefix[""], Level::Write);
    assert_eq!(rules.service.exact["foo"], Level::Read);
    assert_eq!(rules.session.exact["foo"], Level::Write);
    assert_eq!(rules.session.prefix["bar"], Level::Deny);
    assert_eq!(rules.query.prefix[""], Level::Read);
    assert_eq!(rules.query.exact["foo"], Level::Write);

    // Unsegmented ones are single levels.
    assert_eq!(rules.acl, Some(Level::Read));
    assert_eq!(rules.keyring, Some(Level::Deny));
    assert_eq!(rules.operator, Some(Level::Deny));
    assert_eq!(rules.mesh, Some(Level::Write));
    assert_eq!(rules.peering, Some(Level::Read));
}

#[test]
fn json_parses_to_the_same_rules_as_hcl() {
    let from_json = parse(JSON_POLICY).unwrap();
    assert_eq!(from_json, parse(HCL_POLICY).unwrap());
    assert_ne!(from_json, Rules::default());
}

#[test]
fn json_accepts_the_array_forms_hcl_as_json_allows() {
    let rules = parse(
        r#"{
          "key_prefix": [{"app/": {"policy": "write"}}, {"": [{"policy": "read"}]}],
          "service": [{"web": [{"policy": "write"}]}]
        }"#,
    )
    .unwrap();
    assert_eq!(rules.key.prefix["app/"], Level::Write);
    assert_eq!(rules.key.prefix[""], Level::Read);
    assert_eq!(rules.service.exact["web"], Level::Write);
}

#[test]
fn hcl_comments_commas_and_escapes() {
    let rules = parse(
        r#"
        # hash comment
        // slash comment
        /* block
           comment with "quotes" and key "x" { policy = "deny" } */
        key_prefix "a\"b/" { policy = "write", intentions = "ignored" }
        service_prefix "" { policy = "write" intentions = "write" }
        key "tab\there" {
          policy = "read" // trailing comment
        },
        operator = "read", acl = "write"
        keyring = "WRITE"
        "#,
    )
    .unwrap();
    assert_eq!(rules.key.prefix["a\"b/"], Level::Write);
    assert_eq!(rules.key.exact["tab\there"], Level::Read);
    assert!(
        !rules.key.exact.contains_key("x"),
        "commented-out rule was read"
    );
    assert_eq!(rules.service.prefix[""], Level::Write);
    assert_eq!(rules.operator, Some(Level::Read));
    assert_eq!(rules.acl, Some(Level::Write));
    // Levels are case-insensitive, as Consul's AccessLevelFromString.
    assert_eq!(rules.keyring, Some(Level::Write));
}

#[test]
fn hcl_object_forms_mean_the_same_as_blocks() {
    let blocks = parse(r#"key_prefix "app/" { policy = "write" }"#).unwrap();
    assert_eq!(
        parse(r#"key_prefix = { "app/" = { policy = "write" } }"#).unwrap(),
        blocks
    );
    assert_eq!(
        parse(r#"key_prefix { "app/" { policy = "write" } }"#).unwrap(),
        blocks
    );
}

#[test]
fn empty_text_and_empty_scalars_are_no_rules() {
    assert_eq!(parse("").unwrap(), Rules::default());
    assert_eq!(parse("  \n# only a comment\n").unwrap(), Rules::default());
    assert_eq!(parse("{}").unwrap(), Rules::default());
    // Consul's TestACLPolicy_Keyring_Empty / Operator_Empty: "" means unset.
    assert_eq!(
        parse(r#"keyring = "" operator = """#).unwrap(),
        Rules::default()
    );
}

#[test]
fn the_same_segment_twice_in_one_policy_keeps_the_strongest() {
    let rules = parse(
        r#"
        key_prefix "a/" { policy = "write" }
        key_prefix "a/" { policy = "read" }
        key "a/" { policy = "read" }
        key "a/" { policy = "list" }
        "#,
    )
    .unwrap();
    assert_eq!(rules.key.prefix["a/"], Level::Write);
    assert_eq!(rules.key.exact["a/"], Level::List);
}

#[test]
fn global_management_rules_parse() {
    let rules = parse(GLOBAL_MANAGEMENT_RULES).unwrap();
    assert_eq!(rules.acl, Some(Level::Write));
    assert_eq!(rules.operator, Some(Level::Write));
    assert_eq!(rules.keyring, Some(Level::Write));
    assert_eq!(rules.key.prefix[""], Level::Write);
    assert_eq!(rules.service.prefix[""], Level::Write);
}

#[test]
fn invalid_levels_are_rejected_with_consuls_texts() {
    // Consul's TestACLPolicy_Bad_Policy cases, with the full messages of acl/policy.go.
    let cases = [
        (
            r#"agent "" { policy = "nope" }"#,
            r#"Invalid agent policy: &acl.AgentRule{Node:"", Policy:"nope"}"#,
        ),
        (
            r#"agent_prefix "n" { policy = "nope" }"#,
            r#"Invalid agent_prefix policy: &acl.AgentRule{Node:"n", Policy:"nope"}"#,
        ),
        (
            r#"event "" { policy = "nope" }"#,
            r#"Invalid event policy: &acl.EventRule{Event:"", Policy:"nope"}"#,
        ),
        (
            r#"key "k" { policy = "nope" }"#,
            r#"Invalid key policy: &acl.KeyRule{Prefix:"k", Policy:"nope", EnterpriseRule:acl.EnterpriseRule{}}"#,
        ),
        (
            r#"key_prefix "a\"b" { policy = "nope" }"#,
            r#"Invalid key_prefix policy: &acl.KeyRule{Prefix:"a\"b", Policy:"nope", EnterpriseRule:acl.EnterpriseRule{}}"#,
        ),
        (r#"keyring = "nope""#, r#"Invalid keyring policy: "nope""#),
        (
            r#"node "" { policy = "nope" }"#,
            r#"Invalid node policy: &acl.NodeRule{Name:"", Policy:"nope", EnterpriseRule:acl.EnterpriseRule{}}"#,
        ),
        (r#"operator = "nope""#, r#"Invalid operator policy: "nope""#),
        (r#"acl = "list""#, r#"Invalid acl policy: "list""#),
        (r#"mesh = "nope""#, r#"Invalid mesh policy: "nope""#),
        (
            r#"query "" { policy = "nope" }"#,
            r#"Invalid query policy: &acl.PreparedQueryRule{Prefix:"", Policy:"nope"}"#,
        ),
        (
            r#"service "" { policy = "nope" }"#,
            r#"Invalid service policy: &acl.ServiceRule{Name:"", Policy:"nope", Intentions:"", EnterpriseRule:acl.EnterpriseRule{}}"#,
        ),
        (
            r#"service_prefix "" { policy = "read" intentions = "list" }"#,
            r#"Invalid service_prefix intentions policy: &acl.ServiceRule{Name:"", Policy:"read", Intentions:"list", EnterpriseRule:acl.EnterpriseRule{}}"#,
        ),
        (
            r#"session "" { policy = "nope" }"#,
            r#"Invalid session policy: &acl.SessionRule{Node:"", Policy:"nope"}"#,
        ),
        // A block without a policy has the empty level, which is not one.
        (
            r#"node_prefix "" { }"#,
            r#"Invalid node_prefix policy: &acl.NodeRule{Name:"", Policy:"", EnterpriseRule:acl.EnterpriseRule{}}"#,
        ),
    ];
    for (text, want) in cases {
        assert_eq!(parse_err(text), want, "rules: {text}");
    }
}

#[test]
fn list_is_only_a_key_level() {
    assert!(parse(r#"key "k" { policy = "list" }"#).is_ok());
    assert!(parse(r#"key_prefix "k" { policy = "list" }"#).is_ok());
    for resource in [
        "service",
        "node_prefix",
        "session",
        "agent",
        "event",
        "query_prefix",
    ] {
        let err = parse_err(&format!(r#"{resource} "x" {{ policy = "list" }}"#));
        assert!(
            err.starts_with(&format!("Invalid {resource} policy: ")),
            "{err}"
        );
    }
    assert_eq!(
        parse_err(r#"operator = "list""#),
        r#"Invalid operator policy: "list""#
    );
}

#[test]
fn validation_reports_the_first_error_in_consuls_order() {
    // acl is checked before any segmented rule, keyring after them all, whatever the order
    // in the text.
    let text = r#"
        keyring = "nope"
        key "k" { policy = "nope" }
        acl = "nope"
    "#;
    assert_eq!(parse_err(text), r#"Invalid acl policy: "nope""#);
    let text = r#"
        keyring = "nope"
        session "s" { policy = "nope" }
        key "k" { policy = "nope" }
    "#;
    assert!(parse_err(text).starts_with("Invalid key policy"));
}

#[test]
fn syntax_errors_say_failed_to_parse() {
    for text in [
        r#"key "a" { policy = "read" "#,
        r#"key "a" { policy = "read }"#,
        r#"key "a" policy = "read""#,
        r#"operator "read""#,
        "key \"a\" { policy = \"read\" } /* unterminated",
        r#"{"key": {"a": {"policy": "read"}}"#,
        r#"operator = { x = "y" }"#,
        "@",
    ] {
        let err = parse_err(text);
        assert!(
            err.starts_with("Failed to parse ACL rules: "),
            "{text}: {err}"
        );
    }
    assert_eq!(
        parse(r#"key "a" { policy = "read" "#),
        Err(RulesError::Syntax {
            line: 1,
            column: 27,
            message: "expected: IDENT | STRING got: EOF".into()
        })
    );
}

#[test]
fn unknown_resources_are_rejected() {
    assert_eq!(
        parse_err("\nkeys \"a\" { policy = \"read\" }"),
        r#"Failed to parse ACL rules: At 2:1: unknown ACL resource "keys""#
    );
    assert!(
        parse_err(r#"{"kv": {"a": {"policy": "read"}}}"#).contains(r#"unknown ACL resource "kv""#)
    );
}

#[test]
fn an_attribute_set_twice_is_rejected_as_hcl_does() {
    assert_eq!(
        parse_err("operator = \"read\"\noperator = \"write\""),
        "Failed to parse ACL rules: The argument \"operator\" at 2:1 was already set. \
         Each argument can only be defined once"
    );
    assert_eq!(
        parse_err("key \"a\" {\n  policy = \"read\"\n  policy = \"write\"\n}"),
        "Failed to parse ACL rules: The argument \"policy\" at 3:3 was already set. \
         Each argument can only be defined once"
    );
}

// ---------------------------------------------------------------------------------------
// Authorizing.

#[test]
fn exact_rules_beat_prefix_rules() {
    let authz = authz(
        DefaultPolicy::Deny,
        &[r#"
        key_prefix "app/" { policy = "write" }
        key "app/config" { policy = "read" }
        key_prefix "app/config" { policy = "write" }
        "#],
    );
    // The exact rule governs its name only, even against a longer-or-equal prefix rule.
    assert!(authz.allows(Resource::Key, Access::Read, "app/config"));
    assert!(!authz.allows(Resource::Key, Access::Write, "app/config"));
    assert!(authz.allows(Resource::Key, Access::Write, "app/config2"));
    assert!(authz.allows(Resource::Key, Access::Write, "app/other"));
    // An exact rule is no prefix: names under it fall through to the prefix rules.
    assert!(authz.allows(Resource::Key, Access::Write, "app/config/x"));
}

#[test]
fn the_longest_prefix_wins() {
    let authz = authz(
        DefaultPolicy::Allow,
        &[r#"
        key_prefix "" { policy = "read" }
        key_prefix "app/" { policy = "write" }
        key_prefix "app/secret/" { policy = "deny" }
        service_prefix "" { policy = "write" }
        service_prefix "db" { policy = "read" }
        "#],
    );
    assert!(authz.allows(Resource::Key, Access::Read, "other"));
    assert!(!authz.allows(Resource::Key, Access::Write, "other"));
    assert!(authz.allows(Resource::Key, Access::Write, "app/x"));
    assert!(!authz.allows(Resource::Key, Access::Read, "app/secret/x"));
    assert!(authz.allows(Resource::Key, Access::Write, "app/secret"));
    assert!(authz.allows(Resource::Service, Access::Write, "web"));
    assert!(!authz.allows(Resource::Service, Access::Write, "db-primary"));
    assert!(authz.allows(Resource::Service, Access::Read, "db-primary"));
}

#[test]
fn merged_policies_keep_deny_over_write_over_list_over_read() {
    let authz = authz(
        DefaultPolicy::Deny,
        &[
            r#"
            key_prefix "rw/" { policy = "read" }
            key_prefix "d/" { policy = "write" }
            key_prefix "l/" { policy = "read" }
            key "e" { policy = "write" }
            operator = "write"
            "#,
            r#"
            key_prefix "rw/" { policy = "write" }
            key_prefix "d/" { policy = "deny" }
            key_prefix "l/" { policy = "list" }
            key_prefix "e" { policy = "deny" }
            operator = "read"
            acl = "read"
            "#,
        ],
    );
    assert!(authz.allows(Resource::Key, Access::Write, "rw/x"));
    assert!(!authz.allows(Resource::Key, Access::Read, "d/x"));
    assert!(authz.allows(Resource::Key, Access::List, "l/x"));
    assert!(!authz.allows(Resource::Key, Access::Write, "l/x"));
    // Exact and prefix rules for one segment merge separately; the exact one still governs.
    assert!(authz.allows(Resource::Key, Access::Write, "e"));
    assert!(!authz.allows(Resource::Key, Access::Read, "ex"));
    assert!(authz.allows(Resource::Operator, Access::Write, ""));
    assert!(authz.allows(Resource::Acl, Access::Read, ""));
    assert!(!authz.allows(Resource::Acl, Access::Write, ""));

    // The order policies come in does not matter.
    let mut rules = parse(r#"key_prefix "x" { policy = "deny" }"#).unwrap();
    rules.merge(&parse(r#"key_prefix "x" { policy = "write" }"#).unwrap());
    assert_eq!(rules.key.prefix["x"], Level::Deny);
}

#[test]
fn write_grants_all_list_grants_list_and_read_read_grants_read() {
    let authz = authz(
        DefaultPolicy::Allow,
        &[r#"
        key_prefix "w/" { policy = "write" }
        key_prefix "l/" { policy = "list" }
        key_prefix "r/" { policy = "read" }
        key_prefix "d/" { policy = "deny" }
        "#],
    );
    let table = [
        ("w/k", [true, true, true]),
        ("l/k", [true, true, false]),
        ("r/k", [true, false, false]),
        ("d/k", [false, false, false]),
    ];
    for (key, [read, list, write]) in table {
        assert_eq!(
            authz.allows(Resource::Key, Access::Read, key),
            read,
            "{key} read"
        );
        assert_eq!(
            authz.allows(Resource::Key, Access::List, key),
            list,
            "{key} list"
        );
        assert_eq!(
            authz.allows(Resource::Key, Access::Write, key),
            write,
            "{key} write"
        );
    }
}

#[test]
fn no_rule_falls_to_the_default_but_deny_does_not() {
    let rules = r#"
        key_prefix "denied/" { policy = "deny" }
        node_prefix "" { policy = "read" }
    "#;
    let allow = authz(DefaultPolicy::Allow, &[rules]);
    let deny = authz(DefaultPolicy::Deny, &[rules]);

    // No rule: allow grants everything, write included; deny grants nothing.
    for access in [Access::Read, Access::List, Access::Write] {
        assert!(allow.allows(Resource::Key, access, "free"));
        assert!(!deny.allows(Resource::Key, access, "free"));
    }
    for resource in [Resource::Operator, Resource::Keyring] {
        assert!(allow.allows(resource, Access::Write, ""));
        assert!(!deny.allows(resource, Access::Read, ""));
    }
    // ACL management (and so snapshots) is never the default's: Consul's allow-all authorizer
    // denies `acl:read` and `acl:write`; only a rule grants them.
    for access in [Access::Read, Access::Write] {
        assert!(!allow.allows(Resource::Acl, access, ""));
        assert!(!deny.allows(Resource::Acl, access, ""));
    }
    let acl_read = authz(DefaultPolicy::Allow, &[r#"acl = "read""#]);
    assert!(acl_read.allows(Resource::Acl, Access::Read, ""));
    assert!(!acl_read.allows(Resource::Acl, Access::Write, ""));
    assert!(allow.allows(Resource::Session, Access::Write, "n1"));
    assert!(!deny.allows(Resource::Session, Access::Read, "n1"));

    // A deny rule is final even under default allow; a read rule does not widen to write.
    assert!(!allow.allows(Resource::Key, Access::Read, "denied/x"));
    assert!(!allow.allows(Resource::Node, Access::Write, "n1"));
    assert!(deny.allows(Resource::Node, Access::Read, "n1"));
}

#[test]
fn key_write_prefix_needs_write_everywhere_under_the_prefix() {
    let authz = authz(
        DefaultPolicy::Allow,
        &[r#"
        key_prefix "" { policy = "write" }
        key_prefix "app/secret/" { policy = "deny" }
        key "app/readonly" { policy = "read" }
        key_prefix "ro/" { policy = "read" }
        key_prefix "ro/rw/" { policy = "write" }
        "#],
    );
    assert!(authz.key_write_prefix("other/"));
    // A rule under the prefix that grants less than write blocks the recursive delete,
    // while each key outside it stays writable.
    assert!(authz.allows(Resource::Key, Access::Write, "app/x"));
    assert!(!authz.key_write_prefix("app/"));
    assert!(!authz.key_write_prefix(""));
    assert!(!authz.key_write_prefix("app/read"));
    assert!(authz.key_write_prefix("app/x"));
    assert!(!authz.key_write_prefix("app/secret/"));
    // The covering prefix rule itself must grant write, even if everything under does;
    // the longest covering rule is the one that counts.
    assert!(!authz.key_write_prefix("ro/"));
    assert!(!authz.key_write_prefix("ro/r"));
    assert!(authz.key_write_prefix("ro/rw/"));
    assert!(authz.key_write_prefix("ro/rw/deeper/"));
    assert_eq!(
        authz
            .check_key_write_prefix("app/")
            .unwrap_err()
            .to_string(),
        "Permission denied: token with AccessorID 'tok-1' lacks permission 'key:write' on \"app/\""
    );
    assert!(authz.check_key_write_prefix("other/").is_ok());

    // No covering rule and nothing under: the default decides.
    let only_under = r#"key_prefix "a/" { policy = "write" }"#;
    assert!(self::authz(DefaultPolicy::Allow, &[only_under]).key_write_prefix("b/"));
    assert!(!self::authz(DefaultPolicy::Deny, &[only_under]).key_write_prefix("b/"));
    // Write rules under an uncovered prefix do not lift the default deny for the rest of it.
    assert!(!self::authz(DefaultPolicy::Deny, &[only_under]).key_write_prefix(""));
    assert!(self::authz(DefaultPolicy::Allow, &[only_under]).key_write_prefix(""));
}

#[test]
fn policies_for_other_datacenters_are_left_out() {
    let resolved = resolved(vec![
        policy(
            "everywhere",
            r#"key_prefix "all/" { policy = "write" }"#,
            &[],
        ),
        policy(
            "here",
            r#"key_prefix "dc1/" { policy = "write" }"#,
            &["dc2", "dc1"],
        ),
        policy(
            "there",
            r#"key_prefix "dc2/" { policy = "write" }"#,
            &["dc2"],
        ),
    ]);
    let dc1 = Authorizer::new(&resolved, "dc1", DefaultPolicy::Deny).unwrap();
    assert!(dc1.allows(Resource::Key, Access::Write, "all/x"));
    assert!(dc1.allows(Resource::Key, Access::Write, "dc1/x"));
    assert!(!dc1.allows(Resource::Key, Access::Write, "dc2/x"));

    let dc3 = Authorizer::new(&resolved, "dc3", DefaultPolicy::Deny).unwrap();
    assert!(dc3.allows(Resource::Key, Access::Write, "all/x"));
    assert!(!dc3.allows(Resource::Key, Access::Write, "dc1/x"));
}

#[test]
fn a_policy_that_does_not_parse_fails_the_authorizer() {
    let broken = resolved(vec![policy("bad", r#"key "a" { policy = "nope" }"#, &[])]);
    let err = Authorizer::new(&broken, "dc1", DefaultPolicy::Allow).unwrap_err();
    assert!(err.to_string().starts_with("Invalid key policy"), "{err}");
    // A broken policy scoped to another datacenter is never read.
    let elsewhere = resolved(vec![policy(
        "bad",
        r#"key "a" { policy = "nope" }"#,
        &["dc9"],
    )]);
    assert!(Authorizer::new(&elsewhere, "dc1", DefaultPolicy::Allow).is_ok());
}

#[test]
fn service_identities_grant_consuls_template() {
    let mut resolved = resolved(Vec::new());
    resolved.token.service_identities = vec![
        ServiceIdentity {
            service_name: "web".into(),
            datacenters: Vec::new(),
        },
        ServiceIdentity {
            service_name: "elsewhere".into(),
            datacenters: vec!["dc2".into()],
        },
    ];
    let mut via_role = role("r1");
    via_role.service_identities = vec![ServiceIdentity {
        service_name: "api".into(),
        datacenters: vec!["dc1".into()],
    }];
    resolved.roles.push(via_role);
    let authz = Authorizer::new(&resolved, "dc1", DefaultPolicy::Deny).unwrap();

    for service in ["web", "web-sidecar-proxy", "api", "api-sidecar-proxy"] {
        assert!(
            authz.allows(Resource::Service, Access::Write, service),
            "{service}"
        );
    }
    assert!(!authz.allows(Resource::Service, Access::Write, "web2"));
    assert!(!authz.allows(Resource::Service, Access::Write, "elsewhere"));
    assert!(authz.allows(Resource::Service, Access::Read, "anything"));
    assert!(authz.allows(Resource::Node, Access::Read, "any-node"));
    assert!(!authz.allows(Resource::Node, Access::Write, "any-node"));
    assert!(!authz.allows(Resource::Key, Access::Read, "k"));
}

#[test]
fn node_identities_grant_consuls_template_in_their_datacenter() {
    let mut resolved = resolved(Vec::new());
    resolved.token.node_identities = vec![
        NodeIdentity {
            node_name: "n1".into(),
            datacenter: "dc1".into(),
        },
        NodeIdentity {
            node_name: "n2".into(),
            datacenter: "dc2".into(),
        },
    ];
    let mut via_role = role("r1");
    via_role.node_identities = vec![NodeIdentity {
        node_name: "n3".into(),
        datacenter: "dc1".into(),
    }];
    resolved.roles.push(via_role);
    let authz = Authorizer::new(&resolved, "dc1", DefaultPolicy::Deny).unwrap();

    assert!(authz.allows(Resource::Node, Access::Write, "n1"));
    assert!(authz.allows(Resource::Node, Access::Write, "n3"));
    assert!(!authz.allows(Resource::Node, Access::Write, "n2"));
    assert!(!authz.allows(Resource::Node, Access::Read, "n2"));
    assert!(!authz.allows(Resource::Node, Access::Write, "n10"));
    assert!(authz.allows(Resource::Service, Access::Read, "web"));
    assert!(!authz.allows(Resource::Service, Access::Write, "web"));
}

#[test]
fn global_management_grants_everything() {
    let resolved = resolved(vec![policy(
        GLOBAL_MANAGEMENT_POLICY_ID,
        GLOBAL_MANAGEMENT_RULES,
        &[],
    )]);
    let authz = Authorizer::new(&resolved, "dc1", DefaultPolicy::Deny).unwrap();
    let resources = [
        Resource::Acl,
        Resource::Agent,
        Resource::Event,
        Resource::Key,
        Resource::Keyring,
        Resource::Node,
        Resource::Operator,
        Resource::Query,
        Resource::Service,
        Resource::Session,
    ];
    for resource in resources {
        for access in [Access::Read, Access::List, Access::Write] {
            assert!(
                authz.allows(resource, access, "any/name"),
                "{resource:?} {access:?}"
            );
        }
    }
    assert!(authz.key_write_prefix(""));
}

#[test]
fn allow_all_allows_everything() {
    let authz = Authorizer::allow_all();
    assert!(authz.allows(Resource::Acl, Access::Write, ""));
    assert!(authz.allows(Resource::Key, Access::Write, "x"));
    assert!(authz.key_write_prefix(""));
    assert!(authz.check(Resource::Operator, Access::Write, "").is_ok());
}

#[test]
fn permission_denied_reads_as_consuls_error() {
    let authz = authz(DefaultPolicy::Deny, &[]);
    assert_eq!(authz.accessor_id(), "tok-1");
    assert_eq!(
        authz
            .check(Resource::Key, Access::Write, "app/x")
            .unwrap_err()
            .to_string(),
        "Permission denied: token with AccessorID 'tok-1' lacks permission 'key:write' on \"app/x\""
    );
    assert_eq!(
        authz
            .check(Resource::Session, Access::Read, "node-1")
            .unwrap_err()
            .to_string(),
        "Permission denied: token with AccessorID 'tok-1' lacks permission 'session:read' on \"node-1\""
    );
    // Unsegmented resources name nothing.
    assert_eq!(
        authz
            .check(Resource::Operator, Access::Read, "ignored")
            .unwrap_err()
            .to_string(),
        "Permission denied: token with AccessorID 'tok-1' lacks permission 'operator:read'"
    );
    // The anonymous token is called so, with Consul's hint.
    let mut anonymous = resolved(Vec::new());
    anonymous.token.accessor_id = ANONYMOUS_TOKEN_ACCESSOR_ID.into();
    let authz = Authorizer::new(&anonymous, "dc1", DefaultPolicy::Deny).unwrap();
    let err: PermissionDenied = authz.check(Resource::Key, Access::List, "a/").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Permission denied: anonymous token lacks permission 'key:list' on \"a/\". \
         The anonymous token is used implicitly when a request does not specify a token."
    );
    let as_error: &dyn std::error::Error = &err;
    assert!(as_error.to_string().starts_with("Permission denied"));
}

#[test]
fn may_read_under_asks_whether_any_name_under_a_prefix_can_be_read() {
    let deny = authz(
        DefaultPolicy::Deny,
        &[r#"key_prefix "app/" { policy = "read" }
key "cfg/one" { policy = "write" }
key_prefix "pub/" { policy = "read" }
key_prefix "pub/hidden/" { policy = "deny" }"#],
    );
    // A rule at or under the prefix grants read.
    assert!(deny.may_read_under(Resource::Key, ""));
    assert!(deny.may_read_under(Resource::Key, "ap"));
    assert!(deny.may_read_under(Resource::Key, "cfg/"));
    // The covering rule decides beneath it, a deny one too.
    assert!(deny.may_read_under(Resource::Key, "app/x/"));
    assert!(!deny.may_read_under(Resource::Key, "pub/hidden/"));
    assert!(!deny.may_read_under(Resource::Key, "pub/hidden/deeper"));
    // Nothing covers it and nothing is under it: the default.
    assert!(!deny.may_read_under(Resource::Key, "secret/"));
    assert!(!deny.may_read_under(Resource::Node, ""));
    assert!(!deny.may_read_under(Resource::Acl, ""));

    let allow = authz(
        DefaultPolicy::Allow,
        &[r#"key_prefix "secret/" { policy = "deny" }"#],
    );
    assert!(allow.may_read_under(Resource::Key, ""));
    assert!(allow.may_read_under(Resource::Key, "sec"));
    assert!(!allow.may_read_under(Resource::Key, "secret/x"));
    assert!(allow.may_read_under(Resource::Node, ""));
    assert!(!allow.may_read_under(Resource::Acl, ""));
    assert!(Authorizer::allow_all().may_read_under(Resource::Key, "secret/"));
}

#[test]
fn reads_a_token_can_see_nothing_of_are_known_before_they_run() {
    use crate::rpc::ReadQuery;
    let app = authz(
        DefaultPolicy::Deny,
        &[r#"key_prefix "app/" { policy = "read" }
node_prefix "" { policy = "read" }"#],
    );
    let kv_list = |prefix: &str| ReadQuery::KvList {
        prefix: prefix.into(),
    };
    assert!(app.sees_nothing(&kv_list("secret/")));
    assert!(!app.sees_nothing(&kv_list("app/")));
    assert!(!app.sees_nothing(&kv_list("")));
    assert!(app.sees_nothing(&ReadQuery::KvGet {
        key: "secret/x".into()
    }));
    assert!(app.sees_nothing(&ReadQuery::SessionList {}));
    assert!(app.sees_nothing(&ReadQuery::CatalogServices {}));
    assert!(!app.sees_nothing(&ReadQuery::CatalogNodes {}));
    assert!(!app.sees_nothing(&ReadQuery::ChecksInState { state: None }));
    assert!(app.sees_nothing(&ReadQuery::QueryList {}));
    assert!(app.sees_nothing(&ReadQuery::AclPolicyList {}));
    // Refused outright or answered whole: never a filtered wait.
    assert!(!app.sees_nothing(&ReadQuery::LockHold {
        name: "secret/l".into(),
        session: "s".into()
    }));

    let anonymous = authz(DefaultPolicy::Deny, &[]);
    assert!(anonymous.sees_nothing(&kv_list("")));
    assert!(anonymous.sees_nothing(&ReadQuery::CatalogNodes {}));
    assert!(anonymous.sees_nothing(&ReadQuery::HealthService { name: "web".into() }));
    assert!(!Authorizer::allow_all().sees_nothing(&kv_list("secret/")));
}
