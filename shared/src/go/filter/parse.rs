//! The parser: go-bexpr's PEG grammar rule by rule, as ordered choices over byte offsets.
//!
//! Each rule takes the offset to start at and answers `Ok(Some((value, end)))` on a match,
//! `Ok(None)` to let the caller try its next alternative, or `Err` for the grammar's own
//! error checks (bexpr's `&{ return false, errors.New(..) }` predicates), which fail the whole
//! parse. Like pigeon, every terminal that fails to match is remembered at the farthest offset
//! reached, so input no rule accepts is reported as "no match found, expected: ...".
//!
//! Two restructurings keep the work linear without changing the accepted language: `and`/`or`
//! chains and `not` prefixes are loops instead of right recursion, and a parenthesised group
//! whose inner expression parsed but whose `)` is missing is reported at once (bexpr's third
//! grouping alternative re-parses the same inner expression to reach the same verdict).

use std::collections::BTreeSet;

use regex_lite::Regex;

use super::{Expr, FilterError, MAX_NESTING, Match, Test};

/// How pigeon names the end of the input among the things it expected.
const EOF: &str = "EOF";

/// The outcome of one rule at one offset; see the module doc.
type Step<T> = Result<Option<(T, usize)>, FilterError>;

pub(super) fn parse(src: &str) -> Result<Expr, FilterError> {
    let mut p = Parser {
        src,
        farthest: 0,
        expected: BTreeSet::new(),
        nesting: 0,
    };
    let start = p.opt_ws(0);
    if let Some((expr, end)) = p.or_expr(start)? {
        let end = p.opt_ws(end);
        if end == src.len() {
            return Ok(expr);
        }
        p.fail(end, Label::Class(EOF));
    }
    Err(p.no_match())
}

struct Parser<'a> {
    src: &'a str,
    /// The farthest offset at which a terminal failed to match...
    farthest: usize,
    /// ...and what was tried there, in pigeon's notation (sorted, as pigeon prints them).
    expected: BTreeSet<String>,
    /// Parentheses currently open, bounded by [`MAX_NESTING`].
    nesting: usize,
}

impl Parser<'_> {
    // ---- Logic: OrExpression, AndExpression, NotExpression, ParenthesizedExpression ----

    /// `AndExpression (_ "or" _ AndExpression)*`
    fn or_expr(&mut self, at: usize) -> Step<Expr> {
        self.chain(at, "or", Self::and_expr, Expr::Or)
    }

    /// `NotExpression (_ "and" _ NotExpression)*`
    fn and_expr(&mut self, at: usize) -> Step<Expr> {
        self.chain(at, "and", Self::not_expr, Expr::And)
    }

    fn chain(
        &mut self,
        at: usize,
        keyword: &'static str,
        term: fn(&mut Self, usize) -> Step<Expr>,
        build: fn(Vec<Expr>) -> Expr,
    ) -> Step<Expr> {
        let Some((first, mut end)) = term(self, at)? else {
            return Ok(None);
        };
        let mut terms = vec![first];
        while let Some(next) = self.keywords(end, &[keyword], true) {
            let Some((t, after)) = term(self, next)? else {
                break;
            };
            terms.push(t);
            end = after;
        }
        let expr = if terms.len() == 1 {
            terms.remove(0)
        } else {
            build(terms)
        };
        Ok(Some((expr, end)))
    }

    /// `"not" _ NotExpression / ParenthesizedExpression`. A `not` whose operand fails to
    /// parse is given back, since it may be a selector (`not == 1` tests a field named `not`).
    fn not_expr(&mut self, at: usize) -> Step<Expr> {
        // Where an operand could start: after zero, one, two... leading `not`s.
        let mut starts = vec![at];
        let mut next = at;
        while let Some(after) = self.lit(next, "not").and_then(|p| self.ws(p)) {
            starts.push(after);
            next = after;
        }
        while let Some(start) = starts.pop() {
            if let Some((mut expr, end)) = self.paren_expr(start)? {
                // The `not`s before `start` apply; `not not x` is `x`, as bexpr folds it.
                if starts.len() % 2 == 1 {
                    expr = Expr::Not(Box::new(expr));
                }
                return Ok(Some((expr, end)));
            }
        }
        Ok(None)
    }

    /// `"(" _? OrExpression _? ")" / MatchExpression`, and "Unmatched parentheses".
    fn paren_expr(&mut self, at: usize) -> Step<Expr> {
        if let Some(open) = self.lit(at, "(") {
            if self.nesting == MAX_NESTING {
                return Err(self.error(
                    at,
                    "grouping",
                    &format!("Parentheses nest deeper than {MAX_NESTING} levels"),
                ));
            }
            self.nesting += 1;
            let inner = self.opt_ws(open);
            let parsed = self.or_expr(inner);
            self.nesting -= 1;
            if let Some((expr, end)) = parsed? {
                let end = self.opt_ws(end);
                return match self.lit(end, ")") {
                    Some(close) => Ok(Some((expr, close))),
                    None => Err(self.error(end, "grouping", "Unmatched parentheses")),
                };
            }
        }
        self.match_expr(at)
    }

    // ---- MatchExpression ----

    /// `Selector Op Value / Selector (is empty | is not empty) / Value (in | not in) Selector`
    fn match_expr(&mut self, at: usize) -> Step<Expr> {
        if let Some((selector, after_sel)) = self.selector(at)? {
            if let Some((kind, negated, after_op)) = self.value_op(after_sel)
                && let Some((raw, end)) = self.value(after_op)?
            {
                let test = match kind {
                    ValueOp::Equal => Test::Equal(raw),
                    ValueOp::Contains => Test::Contains(raw),
                    ValueOp::Matches => Test::Matches(compile(&raw)?),
                };
                return Ok(Some((matcher(selector, test, negated), end)));
            }
            if let Some((negated, end)) = self.empty_op(after_sel) {
                return Ok(Some((matcher(selector, Test::IsEmpty, negated), end)));
            }
        }
        if let Some((raw, after_value)) = self.value(at)? {
            let in_op = self
                .keywords(after_value, &["in"], true)
                .map(|p| (false, p))
                .or_else(|| {
                    self.keywords(after_value, &["not", "in"], true)
                        .map(|p| (true, p))
                });
            if let Some((negated, after_op)) = in_op {
                return match self.selector(after_op)? {
                    Some((selector, end)) => {
                        Ok(Some((matcher(selector, Test::Contains(raw), negated), end)))
                    }
                    None => Err(self.error(after_op, "match", "Invalid selector")),
                };
            }
        }
        Ok(None)
    }

    /// The operators followed by a value, in the grammar's order of trial: the operator, whether
    /// it is negated, and where the value starts.
    fn value_op(&mut self, at: usize) -> Option<(ValueOp, bool, usize)> {
        for (symbol, negated) in [("==", false), ("!=", true)] {
            let start = self.opt_ws(at);
            if let Some(end) = self.lit(start, symbol) {
                return Some((ValueOp::Equal, negated, self.opt_ws(end)));
            }
        }
        let worded: [(&[&'static str], ValueOp, bool); 4] = [
            (&["contains"], ValueOp::Contains, false),
            (&["not", "contains"], ValueOp::Contains, true),
            (&["matches"], ValueOp::Matches, false),
            (&["not", "matches"], ValueOp::Matches, true),
        ];
        worded.into_iter().find_map(|(words, op, negated)| {
            self.keywords(at, words, true).map(|end| (op, negated, end))
        })
    }

    /// `_ "is" _ "empty"` or `_ "is" _ "not" _ "empty"`; answers whether it was negated.
    fn empty_op(&mut self, at: usize) -> Option<(bool, usize)> {
        if let Some(end) = self.keywords(at, &["is", "empty"], false) {
            return Some((false, end));
        }
        self.keywords(at, &["is", "not", "empty"], false)
            .map(|end| (true, end))
    }

    // ---- Selector, Value, literals ----

    /// `Identifier ("." Identifier / "[" _? StringLiteral _? "]")*`
    fn selector(&mut self, at: usize) -> Step<Vec<String>> {
        let Some((first, mut end)) = self.identifier(at) else {
            return Ok(None);
        };
        let mut path = vec![first];
        loop {
            if let Some((field, after)) = self.lit(end, ".").and_then(|p| self.identifier(p)) {
                path.push(field);
                end = after;
                continue;
            }
            let Some(open) = self.lit(end, "[") else {
                break;
            };
            let key_at = self.opt_ws(open);
            let Some((key, after_key)) = self.string_lit(key_at)? else {
                return Err(self.error(key_at, "index", "Invalid index"));
            };
            let close_at = self.opt_ws(after_key);
            let Some(after) = self.lit(close_at, "]") else {
                return Err(self.error(close_at, "index", "Unclosed index expression"));
            };
            path.push(key);
            end = after;
        }
        Ok(Some((path, end)))
    }

    /// `[a-zA-Z] [a-zA-Z0-9_]*`
    fn identifier(&mut self, at: usize) -> Option<(String, usize)> {
        let bytes = self.src.as_bytes();
        if !bytes.get(at).is_some_and(u8::is_ascii_alphabetic) {
            self.fail(at, Label::Class("[a-zA-Z]"));
            return None;
        }
        let mut end = at + 1;
        while bytes
            .get(end)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        {
            end += 1;
        }
        self.fail(end, Label::Class("[a-zA-Z0-9_]"));
        Some((self.src[at..end].to_owned(), end))
    }

    /// `Selector / NumberLiteral / StringLiteral`, as the raw text bexpr coerces later; a
    /// selector stands for its dotted path.
    fn value(&mut self, at: usize) -> Step<String> {
        if let Some((path, end)) = self.selector(at)? {
            return Ok(Some((path.join("."), end)));
        }
        if let Some(found) = self.number(at)? {
            return Ok(Some(found));
        }
        self.string_lit(at)
    }

    /// `"-"? ("0" / [1-9][0-9]*) ("." [0-9]+)?`, which must be followed by whitespace, `)` or
    /// the end ("Invalid number literal" otherwise, so `10.0.0.1` must be quoted).
    fn number(&mut self, at: usize) -> Step<String> {
        let bytes = self.src.as_bytes();
        let digits_from = |p: &mut Self, mut end: usize| {
            while bytes.get(end).is_some_and(u8::is_ascii_digit) {
                end += 1;
            }
            p.fail(end, Label::Class("[0-9]"));
            end
        };
        let start = self.lit(at, "-").unwrap_or(at);
        let mut end = if let Some(end) = self.lit(start, "0") {
            end
        } else if bytes.get(start).is_some_and(|b| (b'1'..=b'9').contains(b)) {
            digits_from(self, start + 1)
        } else {
            self.fail(start, Label::Class("[1-9]"));
            return Ok(None);
        };
        if let Some(dot) = self.lit(end, ".") {
            if bytes.get(dot).is_some_and(u8::is_ascii_digit) {
                end = digits_from(self, dot + 1);
            } else {
                self.fail(dot, Label::Class("[0-9]"));
            }
        }
        let followed_ok = match bytes.get(end) {
            None => true,
            Some(b' ' | b'\t' | b'\r' | b'\n' | b')') => true,
            Some(_) => false,
        };
        if !followed_ok {
            return Err(self.error(end, "number", "Invalid number literal"));
        }
        Ok(Some((self.src[at..end].to_owned(), end)))
    }

    /// `` `raw` `` or `"escaped"`, unquoted as Go's `strconv.Unquote` does.
    fn string_lit(&mut self, at: usize) -> Step<String> {
        let rest = &self.src[at..];
        let (quote, body) = if let Some(body) = rest.strip_prefix('`') {
            ('`', body)
        } else if let Some(body) = rest.strip_prefix('"') {
            ('"', body)
        } else {
            self.fail(at, Label::Literal("\""));
            self.fail(at, Label::Literal("`"));
            return Ok(None);
        };
        let close = if quote == '`' {
            body.find('`')
        } else {
            closing_quote(body)
        };
        let Some(len) = close else {
            return Err(self.error(self.src.len(), "string", "Unterminated string literal"));
        };
        let text = &body[..len];
        let end = at + 1 + len + 1;
        let value = if quote == '`' {
            Some(text.replace('\r', ""))
        } else {
            unescape(text)
        };
        match value {
            Some(value) => Ok(Some((value, end))),
            None => Err(self.error(at, "string", "invalid syntax")),
        }
    }

    // ---- Terminals ----

    /// Each word preceded by mandatory whitespace (`_ "not" _ "in"`), and followed by it too
    /// when `trailing_ws`.
    fn keywords(&mut self, at: usize, words: &[&'static str], trailing_ws: bool) -> Option<usize> {
        let mut end = at;
        for word in words {
            end = self.ws(end)?;
            end = self.lit(end, word)?;
        }
        if trailing_ws { self.ws(end) } else { Some(end) }
    }

    /// `_`: one or more of `[ \t\r\n]`.
    fn ws(&mut self, at: usize) -> Option<usize> {
        let end = self.opt_ws(at);
        (end > at).then_some(end)
    }

    /// `_?`
    fn opt_ws(&mut self, at: usize) -> usize {
        let skipped = self.src.as_bytes()[at..]
            .iter()
            .take_while(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
            .count();
        self.fail(at + skipped, Label::Class("[ \\t\\r\\n]"));
        at + skipped
    }

    fn lit(&mut self, at: usize, text: &'static str) -> Option<usize> {
        if self.src[at..].starts_with(text) {
            return Some(at + text.len());
        }
        self.fail(at, Label::Literal(text));
        None
    }

    fn fail(&mut self, at: usize, expected: Label) {
        if at > self.farthest {
            self.farthest = at;
            self.expected.clear();
        }
        if at == self.farthest {
            self.expected.insert(match expected {
                Label::Literal(text) => format!("{text:?}"),
                Label::Class(class) => class.to_owned(),
            });
        }
    }

    // ---- Errors, worded as pigeon words them ----

    /// pigeon lists what it expected sorted, with `EOF` moved to the end.
    fn no_match(&self) -> FilterError {
        let mut expected: Vec<&str> = self
            .expected
            .iter()
            .map(String::as_str)
            .filter(|e| *e != EOF)
            .collect();
        if self.expected.contains(EOF) {
            expected.push(EOF);
        }
        let list = match expected.split_last() {
            Some((last, init)) if !init.is_empty() => format!("{} or {last}", init.join(", ")),
            _ => expected.join(""),
        };
        let at = position(self.src, self.farthest);
        FilterError {
            detail: format!("{at}: no match found, expected: {list}"),
        }
    }

    fn error(&self, offset: usize, rule: &str, message: &str) -> FilterError {
        let at = position(self.src, offset);
        FilterError {
            detail: format!("{at}: rule \"{rule}\": {message}"),
        }
    }
}

/// The positive form of an operator that takes a value after it.
#[derive(Clone, Copy)]
enum ValueOp {
    Equal,
    Contains,
    Matches,
}

fn matcher(selector: Vec<String>, test: Test, negated: bool) -> Expr {
    Expr::Match(Match {
        selector,
        test,
        negated,
    })
}

fn compile(pattern: &str) -> Result<Regex, FilterError> {
    Regex::new(pattern).map_err(|e| FilterError {
        detail: format!("Failed to compile regular expression {pattern:?}: {e}"),
    })
}

/// pigeon's `line:column (offset)`: 1-based line and column in characters, 0-based bytes.
fn position(src: &str, offset: usize) -> String {
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    format!("{line}:{column} ({offset})")
}

/// A terminal that failed to match, as pigeon lists it: a literal Go-quoted, a character
/// class (or `EOF`) as written in the grammar.
#[derive(Clone, Copy)]
enum Label {
    Literal(&'static str),
    Class(&'static str),
}

/// The length of a double-quoted body up to its closing `"`, skipping escaped characters.
fn closing_quote(body: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, b) in body.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// Go's double-quoted string escapes (`strconv.Unquote`), plus `\"` inside; `None` where Go
/// answers "invalid syntax" (an unknown escape, `\'`, a raw newline, invalid UTF-8 from
/// `\x`/octal bytes, a surrogate or out-of-range `\u`/`\U`).
fn unescape(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\n' => return None,
            '\\' => {}
            _ => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                continue;
            }
        }
        let simple = match chars.next()? {
            'a' => b'\x07',
            'b' => b'\x08',
            'f' => b'\x0c',
            'n' => b'\n',
            'r' => b'\r',
            't' => b'\t',
            'v' => b'\x0b',
            '\\' => b'\\',
            '"' => b'"',
            'x' => u8::from_str_radix(&take(&mut chars, 2)?, 16).ok()?,
            d @ '0'..='7' => {
                let digits = format!("{d}{}", take(&mut chars, 2)?);
                u8::from_str_radix(&digits, 8).ok()?
            }
            width @ ('u' | 'U') => {
                let hex = take(&mut chars, if width == 'u' { 4 } else { 8 })?;
                let c = char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?;
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                continue;
            }
            _ => return None,
        };
        out.push(simple);
    }
    String::from_utf8(out).ok()
}

/// The next `n` characters, which must all be hex digits (octal digits are checked by the
/// radix parse).
fn take(chars: &mut std::str::Chars<'_>, n: usize) -> Option<String> {
    let taken: String = chars.by_ref().take(n).collect();
    (taken.chars().count() == n && taken.chars().all(|c| c.is_ascii_hexdigit())).then_some(taken)
}
