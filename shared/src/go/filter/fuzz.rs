//! Fuzzing of `?filter=` expressions, which come straight from a URL: arbitrary strings, soups
//! of the grammar's own tokens, and valid expressions with characters edited. Parsing must
//! never panic (every refusal is a [`FilterError`](super::FilterError)), and a parsed filter must
//! evaluate any JSON without panicking and keep its logic: `not (E)` is the negation of `E`, and
//! `(E) and (E)` and `(E) or (E)` are `E`.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Value, json};

use super::Filter;

/// Valid expressions touching every operator, selector form and literal kind.
const VALID: &[&str] = &[
    r#"Node.Meta.env == "prod""#,
    r#"Service.Meta["env-name"] != `blue`"#,
    "Service.Tags contains primary and not Checks.Status == critical",
    r#""v1" in Service.Tags or "x" not in Service.Tags"#,
    r#"Service.Port == 8080 or Service.Port == "0x1F90""#,
    r#"Node.Node matches "^node-[0-9]+$" and Node.Node not matches "\\d{5}""#,
    "Node.Meta is empty or Node.Meta.rack is not empty",
    "(Score == 0.5 or Offset == -3) and not (Ports contains 80)",
    r#"Mixed contains true and Grid.Cell == "a" and Node.Meta.note == "a\tb""#,
    r#"not not not Service.EnableTagOverride == false"#,
];

/// The grammar's vocabulary, and a few things it has no place for.
const TOKENS: &[&str] = &[
    "(",
    ")",
    "not",
    "and",
    "or",
    "==",
    "!=",
    "is",
    "empty",
    "in",
    "contains",
    "matches",
    "Node",
    "Service.Meta",
    "Checks.Status",
    "Tags",
    "[",
    "]",
    ".",
    r#""x""#,
    r#""a\"b""#,
    "`raw`",
    r#""\u00e9""#,
    r#""\xff""#,
    r#""\377""#,
    r#""\U0010FFFF""#,
    r#""\uD800""#,
    "1",
    "-1.5",
    "0",
    "0x1F",
    "1e5",
    "passing",
    "\"",
    "`",
    "\\",
    "é",
    "\n",
    "\t",
    "[\"k\"]",
    "a(b",
    "*",
    "",
];

fn expression() -> impl Strategy<Value = String> {
    let soup = vec((select(TOKENS.to_vec()), any::<bool>()), 0..12).prop_map(|tokens| {
        tokens
            .into_iter()
            .map(|(t, space)| if space { format!("{t} ") } else { t.to_owned() })
            .collect()
    });
    let edit = (any::<Index>(), any::<Index>(), 0..3u8);
    let edited = (select(VALID.to_vec()), vec(edit, 1..4)).prop_map(|(valid, edits)| {
        let mut chars: Vec<char> = valid.chars().collect();
        for (at, token, kind) in edits {
            let at = at.index(chars.len() + 1);
            match kind {
                0 if at < chars.len() => {
                    chars.remove(at);
                }
                1 => {
                    chars.splice(at..at, token.get(TOKENS).chars());
                }
                _ => chars.truncate(at),
            }
        }
        chars.into_iter().collect()
    });
    prop_oneof![
        2 => soup,
        2 => edited,
        1 => select(VALID.to_vec()).prop_map(str::to_owned),
        1 => vec(any::<char>(), 0..24).prop_map(String::from_iter),
    ]
}

/// Items shaped like our list responses, and some that are not.
fn items() -> Vec<Value> {
    vec![
        json!({
            "Node": {"Node": "node-1", "Meta": {"env": "prod", "rack": "", "note": "a\tb"}},
            "Service": {"Tags": ["v1", "primary"], "Meta": {"env-name": "blue"}, "Port": 8080,
                        "EnableTagOverride": false},
            "Checks": [{"Status": "passing"}, {"Status": "critical"}],
            "Ports": [80, 443], "Mixed": ["x", 7, true, null, {"a": 1}], "Score": 0.5,
            "Offset": -3, "Grid": [[{"Cell": "a"}], [{"Cell": "b"}]],
        }),
        json!({"Node": null, "Service": [], "Checks": "passing", "Ports": {"80": 1}}),
        json!([{"Node": {"Meta": {}}}]),
        json!("Node"),
        json!(18_446_744_073_709_551_615_u64),
        Value::Null,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn filters_parse_or_refuse_and_keep_their_logic(expr in expression()) {
        let Ok(filter) = Filter::parse(&expr) else {
            return Ok(());
        };
        let negated = Filter::parse(&format!("not ({expr})"));
        let both = Filter::parse(&format!("({expr}) and ({expr})"));
        let either = Filter::parse(&format!("({expr}) or ({expr})"));
        for item in items() {
            let matches = filter.matches(&item);
            if let Ok(negated) = &negated {
                prop_assert_eq!(negated.matches(&item), !matches, "not ({}) on {}", expr, item);
            }
            if let Ok(both) = &both {
                prop_assert_eq!(both.matches(&item), matches, "({}) and itself on {}", expr, item);
            }
            if let Ok(either) = &either {
                prop_assert_eq!(either.matches(&item), matches, "({}) or itself on {}", expr, item);
            }
        }
    }
}

/// Each valid expression of the corpus parses, so the edits above start from real filters.
#[test]
fn the_corpus_parses() {
    for expr in VALID {
        assert!(Filter::parse(expr).is_ok(), "{expr}");
    }
}
