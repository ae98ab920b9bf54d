//! Consul's `?filter=` expression language (HashiCorp go-bexpr), evaluated against the JSON
//! objects our list endpoints return, so a handler filters what it already built:
//!
//! ```
//! # use vigil_shared::go::filter::Filter;
//! # use serde_json::json;
//! let mut items = vec![json!({"Node": "a", "Meta": {"env": "prod"}}), json!({"Node": "b"})];
//! let f = Filter::parse(r#"Meta.env == "prod""#)?;
//! items.retain(|v| f.matches(v));
//! assert_eq!(items.len(), 1);
//! # Ok::<(), vigil_shared::go::filter::FilterError>(())
//! ```
//!
//! # Syntax (go-bexpr's `grammar.peg`, the release Consul vendors)
//! - Match operators: `S == V`, `S != V`, `S is empty`, `S is not empty`, `V in S`,
//!   `V not in S`, `S contains V`, `S not contains V`, `S matches V`, `S not matches V`.
//! - Logic: `not`, `and`, `or`, parentheses; `not` binds tighter than `and`, `and` tighter
//!   than `or`. Keywords need whitespace around them (`not(x == 1)` is an error, as in bexpr).
//! - Selectors: `Ident(.Ident | ["key"])*`, identifiers `[a-zA-Z][a-zA-Z0-9_]*`, so
//!   `Service.Meta.env` and `Service.Meta["env-name"]` name the same kind of path.
//! - Values: `"double quoted"` with Go escapes, `` `raw` `` (carriage returns dropped, like Go),
//!   numbers `-?(0|[1-9][0-9]*)(\.[0-9]+)?`, or a bare selector-shaped word taken as its text
//!   (`Status == passing`, `Enabled == true`).
//!
//! # Semantics (go-bexpr's `evaluate.go`)
//! - Field names and map keys match case-sensitively, as bexpr's struct-field and map lookups do.
//! - A value is coerced to the JSON type of the field it meets: strings compare as text, numbers
//!   by value (an integer field parses the literal as Go's `ParseInt(s, 0, 64)` does, so
//!   `"0x1F90"` and `"8_080"` equal 8080), booleans through Go's `ParseBool` (`true`, `T`, `1`...).
//! - `in`/`contains` tests key presence on an object, element equality on an array, and
//!   substring on a string. `is empty` is a zero length of a string, array or object.
//! - A selector that crosses an array of objects matches if *any* element matches, with the
//!   whole operator applied per element: bexpr's `evaluateMatchExpressionRecurse` loops over a
//!   slice at the same selector depth and returns on the first true. So
//!   `Checks.Status != "passing"` means "some check is not passing", and every operator,
//!   negated ones included, is false on an empty array.
//! - A missing key, a `null`, or a path that runs into a scalar reads as absent. Absent values
//!   follow bexpr's rule for a missing map key: `==`, `in`, `contains`, `matches` and
//!   `is not empty` are false; `!=`, `not in`, `not contains`, `not matches` and `is empty` are
//!   true.
//!
//! # Deliberate deviations
//! - **No schema.** Consul checks selectors against the Go struct before running and answers
//!   `Selector "Foo" is not valid`; we only have JSON, so an unknown field is absent (see above)
//!   and only syntax errors are errors. Likewise an operator that does not apply to the value's
//!   JSON type (`==` on an array, `matches` on a number, `is empty` on a boolean) is false and
//!   its negated form true, where Consul would reject the expression up front.
//! - Numbers: a JSON integer also equals a float literal of the same value (`8080.0`), since
//!   JSON cannot say whether Go held an integer or a float; float literals use Rust's parser.
//! - Double-quoted strings accept `\"` (bexpr ends the literal at the first `"`, making any
//!   such expression an error), so every expression bexpr accepts still means the same.
//! - Regular expressions use `regex-lite`: RE2 syntax like Go's `regexp`, but without Unicode
//!   classes (`\pL`); `\w`, `\d`, `\s`, `\b` are ASCII-only.
//! - An empty expression matches everything (bexpr's nil filter); parentheses nest at most
//!   [`MAX_NESTING`] deep, because the expression comes from a URL.
//! - bexpr's later additions that Consul does not use (JSON-pointer selectors, `.0` indexes)
//!   are not supported.

#[cfg(test)]
mod fuzz;
mod parse;
#[cfg(test)]
mod tests;

use regex_lite::Regex;
use serde_json::{Number, Value};

/// Deepest parenthesis nesting accepted; deeper input is rejected rather than recursed into.
pub const MAX_NESTING: usize = 64;

/// A parsed filter expression, ready to test any number of items.
#[derive(Debug, Clone)]
pub struct Filter {
    /// `None` for the empty expression, which keeps every item.
    expr: Option<Expr>,
}

/// Why an expression was rejected. Its Display text is the body Consul answers with:
/// `Failed to create boolean expression evaluator: <detail>` (go-bexpr's `CreateFilter` wraps
/// every parse and validation error in exactly that prefix and Consul's HTTP layer writes
/// `err.Error()` as the body). The detail follows go-bexpr's pigeon parser:
/// `<line>:<column> (<byte offset>): no match found, expected: "==", ...` for input no rule
/// accepts, and `<line>:<column> (<byte offset>): rule "number": Invalid number literal` for
/// the grammar's own checks (the tests pin two of Consul's answers byte for byte; elsewhere the
/// "expected" list is a best effort). Consul releases that evaluate the filter on a server
/// answered this with status 500 (hashicorp/consul#7338); it is the caller's mistake, so map it
/// to 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Failed to create boolean expression evaluator: {detail}")]
pub struct FilterError {
    detail: String,
}

impl Filter {
    /// Parses `expression`; an empty string yields a filter that keeps everything.
    pub fn parse(expression: &str) -> Result<Filter, FilterError> {
        if expression.is_empty() {
            return Ok(Filter { expr: None });
        }
        parse::parse(expression).map(|expr| Filter { expr: Some(expr) })
    }

    /// Whether `item` (one element of an API response list) passes the filter.
    pub fn matches(&self, item: &Value) -> bool {
        self.expr.as_ref().is_none_or(|expr| expr.eval(item))
    }
}

/// The parsed expression. `and`/`or` chains are flat lists so that neither parsing nor
/// evaluation recurses once per term.
#[derive(Debug, Clone)]
enum Expr {
    Or(Vec<Expr>),
    And(Vec<Expr>),
    Not(Box<Expr>),
    Match(Match),
}

impl Expr {
    fn eval(&self, item: &Value) -> bool {
        match self {
            Expr::Or(terms) => terms.iter().any(|t| t.eval(item)),
            Expr::And(terms) => terms.iter().all(|t| t.eval(item)),
            Expr::Not(inner) => !inner.eval(item),
            Expr::Match(m) => m.eval(item, &m.selector),
        }
    }
}

/// One match expression: a selector path, a positive test, and whether it was negated
/// (`!=`, `not in`, `not contains`, `not matches`, `is not empty`).
#[derive(Debug, Clone)]
struct Match {
    selector: Vec<String>,
    test: Test,
    negated: bool,
}

#[derive(Debug, Clone)]
enum Test {
    /// `==`, with the literal's raw text, coerced per value.
    Equal(String),
    /// `in` / `contains`.
    Contains(String),
    IsEmpty,
    /// `matches`, compiled once at parse time.
    Matches(Regex),
}

impl Match {
    /// Walks `path` down from `value`; see the module doc for arrays and absent values.
    fn eval(&self, value: &Value, path: &[String]) -> bool {
        let Some((field, rest)) = path.split_first() else {
            return self.test.holds(value) != self.negated;
        };
        match value {
            Value::Object(map) => match map.get(field) {
                Some(child) => self.eval(child, rest),
                None => self.eval(&Value::Null, &[]),
            },
            Value::Array(items) => items.iter().any(|item| self.eval(item, path)),
            _ => self.eval(&Value::Null, &[]),
        }
    }
}

impl Test {
    fn holds(&self, value: &Value) -> bool {
        match self {
            Test::Equal(raw) => scalar_equals(value, raw),
            Test::Contains(raw) => match value {
                Value::Object(map) => map.contains_key(raw),
                Value::Array(items) => items.iter().any(|item| scalar_equals(item, raw)),
                Value::String(s) => s.contains(raw.as_str()),
                _ => false,
            },
            Test::IsEmpty => match value {
                Value::Null => true,
                Value::String(s) => s.is_empty(),
                Value::Array(items) => items.is_empty(),
                Value::Object(map) => map.is_empty(),
                Value::Bool(_) | Value::Number(_) => false,
            },
            Test::Matches(re) => matches!(value, Value::String(s) if re.is_match(s)),
        }
    }
}

/// `raw` coerced to the type of `value` and compared; arrays, objects and null never equal.
fn scalar_equals(value: &Value, raw: &str) -> bool {
    match value {
        Value::String(s) => s == raw,
        Value::Bool(b) => super::strconv::parse_bool(raw) == Some(*b),
        Value::Number(n) => number_equals(n, raw),
        Value::Null | Value::Array(_) | Value::Object(_) => false,
    }
}

fn number_equals(n: &Number, raw: &str) -> bool {
    let as_float = || raw.parse::<f64>().ok() == n.as_f64();
    let integer = n
        .as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from));
    match integer {
        Some(i) => parse_go_int(raw).map_or_else(as_float, |lit| lit == i),
        None => as_float(),
    }
}

/// Go's `strconv.ParseInt(raw, 0, _)` without the range check: an optional sign, a `0x`, `0o`,
/// `0b` or bare `0` (octal) prefix, and `_` allowed only between digits or after the prefix.
fn parse_go_int(raw: &str) -> Option<i128> {
    let (negative, body) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    let lower = body.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits, prefixed) = match lower.as_deref() {
        Some("0x") => (16, &body[2..], true),
        Some("0o") => (8, &body[2..], true),
        Some("0b") => (2, &body[2..], true),
        _ if body.len() > 1 && body.starts_with('0') => (8, &body[1..], true),
        _ => (10, body, false),
    };
    // Go's underscoreOK: each `_` follows a digit or the base prefix and precedes a digit.
    let mut after_digit = prefixed;
    for c in digits.chars() {
        match c {
            '_' if after_digit => after_digit = false,
            c if c.is_digit(radix) => after_digit = true,
            _ => return None,
        }
    }
    if !after_digit || digits.is_empty() {
        return None;
    }
    let cleaned: String = digits.chars().filter(|&c| c != '_').collect();
    let magnitude = i128::try_from(u128::from_str_radix(&cleaned, radix).ok()?).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}
