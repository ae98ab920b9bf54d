//! Table-driven tests: each row is an expression and what it should do to one fixture.

use serde_json::{Value, json};

use super::{Filter, MAX_NESTING};

/// One `/v1/health/service/<s>` entry, plus a few extra fields for number and null cases.
fn entry() -> Value {
    json!({
        "Node": {
            "ID": "6f1c0a2e",
            "Node": "node-1",
            "Address": "10.0.0.1",
            "Datacenter": "dc1",
            "TaggedAddresses": {"lan": "10.0.0.1"},
            "Meta": {"env": "prod", "env-name": "blue", "rack": "", "note": "a\tb", "path": "C:\\tmp"},
        },
        "Service": {
            "ID": "web-1",
            "Service": "web",
            "Tags": ["v1", "primary"],
            "Meta": {"version": "1.2"},
            "Port": 8080,
            "Address": "",
            "EnableTagOverride": false,
            "Weights": {"Passing": 1, "Warning": 1},
            "Proxy": null,
        },
        "Checks": [
            {"Node": "node-1", "CheckID": "serfHealth", "Status": "passing", "ServiceTags": []},
            {"Node": "node-1", "CheckID": "service:web-1", "Status": "critical", "ServiceTags": ["v1", "primary"]},
        ],
        "Ports": [80, 443],
        "Mixed": ["x", 7, true, null, {"a": 1}],
        "Score": 0.5,
        "Offset": -3,
        "CreateIndex": 18_446_744_073_709_551_615_u64,
        "not": "x",
        "Grid": [[{"Cell": "a"}], [{"Cell": "b"}]],
    })
}

/// Asserts each `(expression, expected)` row against `item`, naming the row that fails.
fn check(item: &Value, rows: &[(&str, bool)]) {
    for (expr, want) in rows {
        let filter =
            Filter::parse(expr).unwrap_or_else(|e| panic!("{expr:?} failed to parse: {e}"));
        assert_eq!(filter.matches(item), *want, "{expr:?}");
    }
}

/// Asserts each `(expression, error text)` row is rejected with exactly that text.
fn check_errors(rows: &[(&str, &str)]) {
    for (expr, want) in rows {
        match Filter::parse(expr) {
            Ok(_) => panic!("{expr:?} parsed but should not"),
            Err(e) => assert_eq!(e.to_string(), *want, "{expr:?}"),
        }
    }
}

#[test]
fn equality_on_strings_and_bare_words() {
    check(
        &entry(),
        &[
            (r#"Service.Service == "web""#, true),
            (r#"Service.Service != "web""#, false),
            (r#"Service.Service == "db""#, false),
            (r#"Service.Service != "db""#, true),
            ("Service.Service == web", true),
            ("Service.Service==web", true),
            ("Service.Service == `web`", true),
            (r#"Service.Service == "Web""#, false),
            (r#"Node.Node == "node-1""#, true),
            (r#"Node.Address == "10.0.0.1""#, true),
            // A bare selector-shaped value stands for its dotted text.
            (r#"Node.Meta.version == Service.Meta"#, false),
            (r#"Node.Address == "10.0.0.2""#, false),
        ],
    );
    check(
        &json!({"Ref": "a.b"}),
        &[("Ref == a.b", true), (r#"Ref == a["b"]"#, true)],
    );
}

#[test]
fn field_names_are_case_sensitive() {
    check(
        &entry(),
        &[
            ("service.service == web", false),
            ("Service.service == web", false),
            ("SERVICE.Service == web", false),
            ("Service.Service == web", true),
        ],
    );
}

#[test]
fn map_selectors_dotted_and_indexed() {
    check(
        &entry(),
        &[
            ("Node.Meta.env == prod", true),
            (r#"Node.Meta["env"] == prod"#, true),
            (r#"Node.Meta[ "env" ] == prod"#, true),
            (r#"Node.Meta[`env-name`] == "blue""#, true),
            (r#"Node.Meta["env-name"] == "blue""#, true),
            (r#"Node["Meta"]["env"] == "prod""#, true),
            (r#"Node.TaggedAddresses.lan == "10.0.0.1""#, true),
            (r#""env" in Node.Meta"#, true),
            (r#""env-name" in Node.Meta"#, true),
            (r#""zone" in Node.Meta"#, false),
            (r#""zone" not in Node.Meta"#, true),
            (r#"Node.Meta contains "env""#, true),
            (r#"Node.Meta not contains "env""#, false),
            // `in` on a map tests keys, not values.
            (r#""prod" in Node.Meta"#, false),
            ("Node.Meta is not empty", true),
            ("Service.Meta is empty", false),
        ],
    );
}

#[test]
fn missing_null_and_scalar_paths_read_as_absent() {
    check(
        &entry(),
        &[
            (r#"Nope == "x""#, false),
            (r#"Nope != "x""#, true),
            (r#"Nope == """#, false),
            ("Nope is empty", true),
            ("Nope is not empty", false),
            (r#""x" in Nope"#, false),
            (r#""x" not in Nope"#, true),
            (r#"Nope matches ".*""#, false),
            (r#"Nope not matches ".*""#, true),
            (r#"Nope.Deeper.Still contains "x""#, false),
            (r#"Node.Meta.zone == "x""#, false),
            (r#"Node.Meta.zone != "x""#, true),
            ("Node.Meta.zone is empty", true),
            // `null` and a path running into a scalar behave the same way.
            ("Service.Proxy is empty", true),
            ("Service.Proxy.DestinationServiceName is empty", true),
            (r#"Service.Proxy.DestinationServiceName == "web""#, false),
            ("Service.Port.Value == 8080", false),
            ("Service.Port.Value != 8080", true),
        ],
    );
}

#[test]
fn arrays_of_objects_match_if_any_element_does() {
    let item = entry();
    check(
        &item,
        &[
            ("Checks.Status == critical", true),
            ("Checks.Status == passing", true),
            ("Checks.Status == warning", false),
            // The whole operator applies per element: "some check is not passing".
            ("Checks.Status != passing", true),
            ("not Checks.Status == passing", false),
            (r#"Checks.CheckID matches "^service:""#, true),
            ("Checks.ServiceTags contains v1", true),
            ("Checks.ServiceTags is empty", true),
            ("Checks.ServiceTags is not empty", true),
            ("Checks is not empty", true),
            ("Checks is empty", false),
            ("Grid.Cell == b", true),
            ("Grid.Cell == c", false),
        ],
    );

    let all_passing = json!({"Checks": [{"Status": "passing"}, {"Status": "passing"}]});
    check(
        &all_passing,
        &[
            ("Checks.Status != passing", false),
            ("Checks.Status == passing", true),
        ],
    );

    // Over an empty array every operator is false, negated ones included.
    let no_checks = json!({"Checks": []});
    check(
        &no_checks,
        &[
            ("Checks.Status == passing", false),
            ("Checks.Status != passing", false),
            ("Checks.Status is empty", false),
            ("Checks.Status is not empty", false),
            ("Checks is empty", true),
        ],
    );
}

#[test]
fn in_and_contains_on_arrays_and_strings() {
    check(
        &entry(),
        &[
            (r#""v1" in Service.Tags"#, true),
            ("v1 in Service.Tags", true),
            ("`primary` in Service.Tags", true),
            (r#""v2" in Service.Tags"#, false),
            (r#""v2" not in Service.Tags"#, true),
            (r#"Service.Tags contains "v1""#, true),
            (r#"Service.Tags not contains "v1""#, false),
            // Element equality, not substring, inside an array.
            (r#""v" in Service.Tags"#, false),
            // Substring on a string.
            (r#""eb" in Service.Service"#, true),
            (r#"Service.Service contains "we""#, true),
            (r#"Service.Service contains "xyz""#, false),
            (r#"Service.Service not contains "xyz""#, true),
            (r#""" in Service.Service"#, true),
            // Elements are coerced one by one.
            ("443 in Ports", true),
            (r#""443" in Ports"#, true),
            ("8443 in Ports", false),
            ("x in Mixed", true),
            ("7 in Mixed", true),
            ("true in Mixed", true),
            ("a in Mixed", false),
            // Not applicable to numbers and booleans.
            ("Service.Port contains 80", false),
            ("Service.Port not contains 80", true),
            ("Service.EnableTagOverride contains false", false),
        ],
    );
}

#[test]
fn emptiness() {
    check(
        &entry(),
        &[
            ("Service.Address is empty", true),
            ("Service.Address is not empty", false),
            ("Service.Service is empty", false),
            ("Service.Tags is empty", false),
            ("Service.Tags is not empty", true),
            ("Node.Meta.rack is empty", true),
            ("Checks.ServiceTags is empty", true),
            // A number or boolean is never empty.
            ("Service.Port is empty", false),
            ("Service.Port is not empty", true),
            ("Service.EnableTagOverride is empty", false),
        ],
    );
    check(
        &json!({"Tags": [], "Meta": {}, "Name": ""}),
        &[
            ("Tags is empty", true),
            ("Meta is empty", true),
            ("Name is empty", true),
            ("Tags is not empty", false),
        ],
    );
}

#[test]
fn numbers_coerce_to_the_field() {
    check(
        &entry(),
        &[
            ("Service.Port == 8080", true),
            ("Service.Port != 8080", false),
            ("Service.Port == 80", false),
            ("Service.Port != 80", true),
            (r#"Service.Port == "8080""#, true),
            // Go's ParseInt(s, 0, 64): prefixes, octal, underscores, a sign.
            (r#"Service.Port == "0x1F90""#, true),
            (r#"Service.Port == "0X1f90""#, true),
            (r#"Service.Port == "0o17620""#, true),
            (r#"Service.Port == "017620""#, true),
            (r#"Service.Port == "0b1111110010000""#, true),
            (r#"Service.Port == "8_080""#, true),
            (r#"Service.Port == "0x_1F90""#, true),
            (r#"Service.Port == "+8080""#, true),
            (r#"Service.Port == "8__080""#, false),
            (r#"Service.Port == "_8080""#, false),
            (r#"Service.Port == "8080_""#, false),
            // Not a Go integer (8 is no octal digit) but a valid float: see the next rows.
            (r#"Service.Port == "08080""#, true),
            (r#"Service.Port == "0x""#, false),
            // An integer also equals a float literal of the same value.
            ("Service.Port == 8080.0", true),
            ("Service.Port == 8080.5", false),
            ("Service.Port == abc", false),
            ("Service.Port != abc", true),
            ("Service.Weights.Passing == 1", true),
            ("Offset == -3", true),
            ("Offset == 3", false),
            (r#"Offset == "-0x3""#, true),
            ("CreateIndex == 18446744073709551615", true),
            ("CreateIndex == 18446744073709551614", false),
            ("Score == 0.5", true),
            (r#"Score == "5e-1""#, true),
            ("Score == 0.25", false),
            ("Score != 0.25", true),
            ("Score == 0", false),
        ],
    );
}

#[test]
fn booleans_coerce_like_go_parse_bool() {
    let item = entry();
    let mut rows = Vec::new();
    for yes in [
        "false", "False", "FALSE", "f", "F", "0", "`false`", r#""0""#,
    ] {
        rows.push((format!("Service.EnableTagOverride == {yes}"), true));
        rows.push((format!("Service.EnableTagOverride != {yes}"), false));
    }
    for no in [
        "true", "True", "TRUE", "t", "T", "1", "fAlse", "no", "maybe",
    ] {
        rows.push((format!("Service.EnableTagOverride == {no}"), false));
        rows.push((format!("Service.EnableTagOverride != {no}"), true));
    }
    let rows: Vec<(&str, bool)> = rows.iter().map(|(e, w)| (e.as_str(), *w)).collect();
    check(&item, &rows);
    check(
        &json!({"On": true}),
        &[("On == true", true), ("On == 1", true), ("On == T", true)],
    );
}

#[test]
fn regular_expressions() {
    check(
        &entry(),
        &[
            (r#"Service.Service matches "^w.b$""#, true),
            (r#"Service.Service matches "e""#, true),
            (r#"Service.Service matches "^db""#, false),
            (r#"Service.Service not matches "^db""#, true),
            (r#"Service.Service not matches "^web$""#, false),
            (r#"Node.Node matches "node-[0-9]+""#, true),
            (r#"Node.Node matches "(?i)^NODE""#, true),
            (r#"Node.Meta.path matches `^C:\\tmp$`"#, true),
            (r#"Node.Meta.path matches "^C:\\\\tmp$""#, true),
            // Only strings can match.
            (r#"Service.Tags matches "v1""#, false),
            (r#"Service.Port matches "80""#, false),
            (r#"Service.Port not matches "80""#, true),
        ],
    );
}

#[test]
fn precedence_is_not_then_and_then_or() {
    const T: &str = "Service.Service == web";
    const F: &str = "Service.Service == db";
    let rows = [
        // `and` binds tighter than `or`: F or (T and T), T or (T and F).
        (format!("{F} or {T} and {T}"), true),
        (format!("{T} or {T} and {F}"), true),
        (format!("({T} or {T}) and {F}"), false),
        (format!("{T} and {F} or {T}"), true),
        (format!("{T} and ({F} or {F})"), false),
        // `not` binds tighter than `and` and `or`.
        (format!("not {F} and {F}"), false),
        (format!("not ({F} and {F})"), true),
        (format!("not {T} or {T}"), true),
        (format!("not ({T} or {T})"), false),
        // Stacked `not`s.
        (format!("not not {T}"), true),
        (format!("not not not {T}"), false),
        (format!("not  not\n{F}"), false),
        // Longer chains and groups.
        (format!("{F} or {F} or {F} or {T}"), true),
        (format!("{T} and {T} and {T} and {F}"), false),
        (format!("(({T}))"), true),
        (format!(" ( {T} ) "), true),
        (format!("({F}) or ({T})"), true),
        (format!("({T}) and not ({F})"), true),
        (format!("not ({F} or ({T} and not {T}))"), true),
    ];
    let rows: Vec<(&str, bool)> = rows.iter().map(|(e, w)| (e.as_str(), *w)).collect();
    check(&entry(), &rows);
}

#[test]
fn keywords_can_still_be_field_names() {
    check(
        &entry(),
        &[
            // `not` followed by something that is not an expression is the field `not`.
            ("not == x", true),
            ("not not == x", false),
            ("nothing is empty", true),
            (r#"Service.Service == or"#, false),
            (r#"Service.Service != and"#, true),
        ],
    );
}

#[test]
fn string_literals_and_escapes() {
    let item = json!({
        "Tab": "a\tb",
        "Slash": "C:\\tmp",
        "Quote": "say \"hi\"",
        "Accent": "é",
        "Emoji": "😀",
        "A": "A",
        "Lines": "a\nb",
        "Bell": "\u{7}\u{8}\u{c}\u{b}\r",
    });
    check(
        &item,
        &[
            (r#"Tab == "a\tb""#, true),
            ("Tab == `a\\tb`", false),
            ("Tab == `a\tb`", true),
            (r#"Slash == `C:\tmp`"#, true),
            (r#"Slash == "C:\\tmp""#, true),
            (r#"Quote == `say "hi"`"#, true),
            (r#"Quote == "say \"hi\"""#, true),
            (r#"Accent == "\u00e9""#, true),
            (r#"Accent == "\xc3\xa9""#, true),
            (r#"Accent == "é""#, true),
            (r#"Emoji == "\U0001F600""#, true),
            (r#"A == "\x41""#, true),
            (r#"A == "\101""#, true),
            (r#"Lines == "a\nb""#, true),
            ("Lines == `a\nb`", true),
            // Go drops carriage returns from raw strings.
            ("Lines == `a\r\nb`", true),
            (r#"Bell == "\a\b\f\v\r""#, true),
            (r#"Accent == "\u00E9" and A == "A""#, true),
        ],
    );
}

#[test]
fn empty_expression_keeps_everything() {
    let filter = Filter::parse("").expect("empty is the nil filter");
    assert!(filter.matches(&entry()));
    assert!(filter.matches(&json!(null)));
}

#[test]
fn filters_a_response_list() {
    // Phase 1: a catalog-nodes style list, filtered the way the HTTP layer does.
    let mut nodes = vec![
        json!({"Node": "a", "Address": "10.0.0.1", "Meta": {"env": "prod"}}),
        json!({"Node": "b", "Address": "10.0.0.2", "Meta": {"env": "dev"}}),
        json!({"Node": "c", "Address": "10.0.0.3", "Meta": {}}),
    ];
    let filter = Filter::parse(r#"Meta.env == prod or Meta is empty"#).expect("valid");
    nodes.retain(|n| filter.matches(n));
    let names: Vec<&str> = nodes.iter().filter_map(|n| n["Node"].as_str()).collect();
    assert_eq!(names, ["a", "c"]);

    // Phase 2: the same filter is reusable and cheap to clone.
    let again = filter.clone();
    assert!(again.matches(&json!({"Meta": {"env": "prod"}})));
}

#[test]
fn parse_errors_read_like_consul() {
    check_errors(&[
        // Consul's own answers (hashicorp/consul#7338, #9441), byte for byte after the prefix.
        (
            "foo",
            r#"Failed to create boolean expression evaluator: 1:4 (3): no match found, expected: "!=", ".", "==", "[", [ \t\r\n] or [a-zA-Z0-9_]"#,
        ),
        (
            "Address == 10.10.10.10",
            r#"Failed to create boolean expression evaluator: 1:17 (16): rule "number": Invalid number literal"#,
        ),
        (
            r#"(Node == "a""#,
            r#"Failed to create boolean expression evaluator: 1:13 (12): rule "grouping": Unmatched parentheses"#,
        ),
        (
            r#"Node == "abc"#,
            r#"Failed to create boolean expression evaluator: 1:13 (12): rule "string": Unterminated string literal"#,
        ),
        (
            "Node == `abc",
            r#"Failed to create boolean expression evaluator: 1:13 (12): rule "string": Unterminated string literal"#,
        ),
        (
            r#"Meta[env] == "x""#,
            r#"Failed to create boolean expression evaluator: 1:6 (5): rule "index": Invalid index"#,
        ),
        (
            r#"Meta["env" == "x""#,
            r#"Failed to create boolean expression evaluator: 1:12 (11): rule "index": Unclosed index expression"#,
        ),
        (
            r#""x" in 5"#,
            r#"Failed to create boolean expression evaluator: 1:8 (7): rule "match": Invalid selector"#,
        ),
        (
            r#"Node == "a\qb""#,
            r#"Failed to create boolean expression evaluator: 1:9 (8): rule "string": invalid syntax"#,
        ),
        (
            "Port == 01",
            r#"Failed to create boolean expression evaluator: 1:10 (9): rule "number": Invalid number literal"#,
        ),
        (
            "Port == 8080)",
            r#"Failed to create boolean expression evaluator: 1:13 (12): no match found, expected: ".", [ \t\r\n], [0-9] or EOF"#,
        ),
        (
            "Node == node-1",
            r#"Failed to create boolean expression evaluator: 1:13 (12): no match found, expected: ".", "[", [ \t\r\n], [a-zA-Z0-9_] or EOF"#,
        ),
        (
            "Node ==\n  web\n  or",
            r#"Failed to create boolean expression evaluator: 3:5 (18): no match found, expected: [ \t\r\n]"#,
        ),
    ]);
}

#[test]
fn malformed_expressions_are_rejected() {
    let rejected = [
        " ",
        "(",
        ")",
        "()",
        "Node",
        "Node ==",
        "== web",
        "Node = web",
        "Node == 'web'",
        r#"Node == "a" and"#,
        r#"Node == "a" or"#,
        r#"Node == "a" andNode == "b""#,
        r#"(Node == "a")or(Node == "b")"#,
        r#"not(Node == "a")"#,
        r#"Node == "a")"#,
        r#"((Node == "a")"#,
        r#""x"in Tags"#,
        r#""x" in"#,
        "in Tags",
        "Tags is",
        "Tags is not",
        "Tags isempty",
        "Tags contains",
        r#"Tags contain "x""#,
        r#"Node.Meta. == "x""#,
        r#"Node..Meta == "x""#,
        r#"1Node == "x""#,
        r#"_Node == "x""#,
        r#"Node == 1abc"#,
        r#"Node == -"#,
        r#"Node == 1."#,
        r#"Node == .5"#,
        r#"Node == "a\'b""#,
        "Node == \"a\nb\"",
        r#"Node == "\x4""#,
        r#"Node == "\400""#,
        r#"Node == "\ud800""#,
        r#"Node == "\xff""#,
        r#"Node == "a\""#,
        r#"Meta[] == "x""#,
        r#"Meta["a"["b"]] == "x""#,
        r#"Node matches "(""#,
        r#"Node matches "[a-""#,
    ];
    for expr in rejected {
        let err = Filter::parse(expr).expect_err(expr);
        assert!(
            err.to_string()
                .starts_with("Failed to create boolean expression evaluator: "),
            "{expr:?}: {err}"
        );
    }
}

#[test]
fn bad_regex_names_the_pattern() {
    let err = Filter::parse(r#"Node matches "a(b""#).expect_err("unbalanced group");
    assert!(
        err.to_string().starts_with(
            r#"Failed to create boolean expression evaluator: Failed to compile regular expression "a(b": "#
        ),
        "{err}"
    );
}

#[test]
fn nesting_is_bounded() {
    let at_limit = format!(
        "{}Node == x{}",
        "(".repeat(MAX_NESTING),
        ")".repeat(MAX_NESTING)
    );
    assert!(Filter::parse(&at_limit).is_ok());

    let too_deep = format!(
        "{}Node == x{}",
        "(".repeat(MAX_NESTING + 1),
        ")".repeat(MAX_NESTING + 1)
    );
    let err = Filter::parse(&too_deep).expect_err("too deep");
    assert!(
        err.to_string()
            .contains("Parentheses nest deeper than 64 levels"),
        "{err}"
    );

    // Long flat chains and `not` runs are loops, not recursion.
    let chain = vec!["Node == x"; 10_000].join(" or ");
    assert!(
        Filter::parse(&chain)
            .expect("long chain")
            .matches(&json!({"Node": "x"}))
    );
    let nots = format!("{}Node == x", "not ".repeat(10_001));
    assert!(
        !Filter::parse(&nots)
            .expect("many nots")
            .matches(&json!({"Node": "x"}))
    );
}
