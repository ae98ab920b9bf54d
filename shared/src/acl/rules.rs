//! The rule language ACL policies are written in, as Consul's (`acl/policy.go`): HCL1 such as
//! `key_prefix "app/" { policy = "write" }` and `operator = "read"`, or the same as JSON
//! (`{"key_prefix": {"app/": {"policy": "write"}}}`).
//!
//! [`parse`] reads the text into a small tree (HCL and JSON give the same tree), then reads
//! the tree into [`Rules`]: per resource, exact and prefix rules from segment to [`Level`],
//! plus the unsegmented levels (`acl`, `operator`, `keyring`, `mesh`, `peering`). A segment
//! named twice keeps the level with the highest precedence, as when policies merge
//! ([`Rules::merge`]). Levels are validated in Consul's order with Consul's messages, so a
//! client sees the same error text for the same bad policy.

use std::collections::BTreeMap;
use std::fmt;

use crate::go::strconv::quote as go_quote;

/// An access level a rule grants. Merging keeps the one with the highest
/// [`precedence`](Level::precedence): deny > write > list > read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    Deny,
    Read,
    /// Read and list keys under a prefix; only valid for `key` and `key_prefix`.
    List,
    Write,
}

impl Level {
    /// Consul's `AccessLevelFromString`: case-insensitive.
    fn from_text(text: &str) -> Option<Level> {
        match text.to_ascii_lowercase().as_str() {
            "deny" => Some(Level::Deny),
            "read" => Some(Level::Read),
            "list" => Some(Level::List),
            "write" => Some(Level::Write),
            _ => None,
        }
    }

    /// Consul's `takesPrecedenceOver` as a rank: higher wins when rules meet.
    pub fn precedence(self) -> u8 {
        match self {
            Level::Read => 1,
            Level::List => 2,
            Level::Write => 3,
            Level::Deny => 4,
        }
    }

    /// The level of the two that wins a merge.
    pub fn strongest(self, other: Level) -> Level {
        if other.precedence() > self.precedence() {
            other
        } else {
            self
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Deny => "deny",
            Level::Read => "read",
            Level::List => "list",
            Level::Write => "write",
        }
    }
}

/// The rules for one segmented resource (`key`/`key_prefix`, `node`/`node_prefix`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentRules {
    /// `key "a"`: applies to the name `a` only, and beats every prefix rule for it.
    pub exact: BTreeMap<String, Level>,
    /// `key_prefix "a"`: applies to every name starting with `a`; the longest wins.
    pub prefix: BTreeMap<String, Level>,
}

impl SegmentRules {
    fn add(&mut self, prefix: bool, segment: &str, level: Level) {
        let map = if prefix {
            &mut self.prefix
        } else {
            &mut self.exact
        };
        map.entry(segment.to_owned())
            .and_modify(|held| *held = held.strongest(level))
            .or_insert(level);
    }

    fn merge(&mut self, other: &SegmentRules) {
        for (segment, level) in &other.exact {
            self.add(false, segment, *level);
        }
        for (segment, level) in &other.prefix {
            self.add(true, segment, *level);
        }
    }

    /// The rule that governs `name`: its exact rule, else the longest prefix rule.
    pub fn lookup(&self, name: &str) -> Option<Level> {
        if let Some(level) = self.exact.get(name) {
            return Some(*level);
        }
        self.prefix
            .iter()
            .filter(|(segment, _)| name.starts_with(segment.as_str()))
            .max_by_key(|(segment, _)| segment.len())
            .map(|(_, level)| *level)
    }
}

/// A parsed policy, or several merged. `None` for an unsegmented resource: no rule, so the
/// default policy decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub agent: SegmentRules,
    pub event: SegmentRules,
    pub key: SegmentRules,
    pub node: SegmentRules,
    pub query: SegmentRules,
    pub service: SegmentRules,
    pub session: SegmentRules,
    pub acl: Option<Level>,
    pub keyring: Option<Level>,
    pub operator: Option<Level>,
    /// Accepted so Consul's policies (global-management among them) parse; Vigil has no mesh.
    pub mesh: Option<Level>,
    /// Accepted so Consul's policies parse; Vigil has no peering.
    pub peering: Option<Level>,
}

impl Rules {
    /// Folds `other` in as Consul's policy merger does: per resource, segment and kind
    /// (exact or prefix), and per unsegmented resource, the level of highest precedence wins.
    pub fn merge(&mut self, other: &Rules) {
        self.agent.merge(&other.agent);
        self.event.merge(&other.event);
        self.key.merge(&other.key);
        self.node.merge(&other.node);
        self.query.merge(&other.query);
        self.service.merge(&other.service);
        self.session.merge(&other.session);
        for (held, theirs) in [
            (&mut self.acl, other.acl),
            (&mut self.keyring, other.keyring),
            (&mut self.operator, other.operator),
            (&mut self.mesh, other.mesh),
            (&mut self.peering, other.peering),
        ] {
            if let Some(theirs) = theirs {
                *held = Some(held.map_or(theirs, |level| level.strongest(theirs)));
            }
        }
    }
}

/// Why rules were rejected. The texts are Consul's, so clients see what Consul would say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    /// The text is neither valid HCL nor valid JSON.
    #[error("Failed to parse ACL rules: At {line}:{column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// The same attribute was given twice in one block (HCL's duplicate-key error).
    #[error(
        "Failed to parse ACL rules: The argument \"{name}\" at {line}:{column} was already set. Each argument can only be defined once"
    )]
    Duplicate {
        name: String,
        line: usize,
        column: usize,
    },
    /// A top-level name that is no resource Consul knows (Consul's HCL decoder would drop
    /// it silently; a typo there would quietly grant nothing, so it is rejected).
    #[error("Failed to parse ACL rules: At {line}:{column}: unknown ACL resource \"{name}\"")]
    UnknownResource {
        name: String,
        line: usize,
        column: usize,
    },
    /// A rule whose level is not one the resource accepts, shown as Consul shows it: the
    /// rule in Go's `%#v` form (e.g. `Invalid key policy: &acl.KeyRule{...}`).
    #[error("Invalid {what} policy: {rule}")]
    InvalidLevel { what: String, rule: String },
}

/// Parses policy rules written as HCL or JSON. Empty text (or only comments) is no rules.
pub fn parse(text: &str) -> Result<Rules, RulesError> {
    let items = if text.trim_start().starts_with('{') {
        json_items(text)?
    } else {
        Parser::new(text).body(false)?
    };
    let raw = RawPolicy::read(&items)?;
    raw.validate()
}

// ---------------------------------------------------------------------------------------
// The tree both syntaxes parse into.

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pos {
    line: usize,
    column: usize,
}

/// `name = value`, or `name "label" { ... }` (which HCL1 reads as `name = { label = {...} }`).
#[derive(Debug)]
struct Item {
    name: String,
    pos: Pos,
    value: Value,
}

#[derive(Debug)]
enum Value {
    Text(String),
    /// A number or a boolean, kept as written: Consul's decoder turns it into a string.
    Literal(String),
    Object(Vec<Item>),
    List(Vec<Value>),
}

// ---------------------------------------------------------------------------------------
// HCL1, the subset policies use: attributes, labelled blocks, objects, lists, strings,
// numbers, booleans and the three comment styles. Commas and newlines between items are
// optional, as in HCL1.

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Text(String),
    Literal(String),
    Assign,
    Comma,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Eof,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Ident(name) => format!("IDENT {name}"),
            Token::Text(text) => format!("STRING {text:?}"),
            Token::Literal(text) => format!("NUMBER {text}"),
            Token::Assign => "ASSIGN".into(),
            Token::Comma => "COMMA".into(),
            Token::LBrace => "LBRACE".into(),
            Token::RBrace => "RBRACE".into(),
            Token::LBracket => "LBRACK".into(),
            Token::RBracket => "RBRACK".into(),
            Token::Eof => "EOF".into(),
        }
    }
}

struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    column: usize,
    /// One token of lookahead, with where it starts.
    peeked: Option<(Token, Pos)>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser {
            chars: text.chars().peekable(),
            line: 1,
            column: 1,
            peeked: None,
        }
    }

    fn here(&self) -> Pos {
        Pos {
            line: self.line,
            column: self.column,
        }
    }

    fn syntax(pos: Pos, message: impl Into<String>) -> RulesError {
        RulesError::Syntax {
            line: pos.line,
            column: pos.column,
            message: message.into(),
        }
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    /// Skips whitespace and comments.
    fn skip_trivia(&mut self) -> Result<(), RulesError> {
        loop {
            match self.chars.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => self.skip_line(),
                Some('/') => {
                    let start = self.here();
                    self.bump();
                    match self.bump() {
                        Some('/') => self.skip_line(),
                        Some('*') => self.skip_block_comment(start)?,
                        _ => return Err(Self::syntax(start, "illegal char")),
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.bump() {
            if c == '\n' {
                return;
            }
        }
    }

    fn skip_block_comment(&mut self, start: Pos) -> Result<(), RulesError> {
        let mut previous = ' ';
        while let Some(c) = self.bump() {
            if previous == '*' && c == '/' {
                return Ok(());
            }
            previous = c;
        }
        Err(Self::syntax(start, "comment not terminated"))
    }

    fn next_token(&mut self) -> Result<(Token, Pos), RulesError> {
        if let Some(peeked) = self.peeked.take() {
            return Ok(peeked);
        }
        self.skip_trivia()?;
        let pos = self.here();
        let Some(&c) = self.chars.peek() else {
            return Ok((Token::Eof, pos));
        };
        let token = match c {
            '=' | ',' | '{' | '}' | '[' | ']' => {
                self.bump();
                match c {
                    '=' => Token::Assign,
                    ',' => Token::Comma,
                    '{' => Token::LBrace,
                    '}' => Token::RBrace,
                    '[' => Token::LBracket,
                    _ => Token::RBracket,
                }
            }
            '"' => Token::Text(self.string(pos)?),
            c if c.is_ascii_digit() || c == '-' => Token::Literal(self.word()),
            c if c.is_alphabetic() || c == '_' => match self.word() {
                word if word == "true" || word == "false" => Token::Literal(word),
                word => Token::Ident(word),
            },
            other => return Err(Self::syntax(pos, format!("illegal char {other:?}"))),
        };
        Ok((token, pos))
    }

    fn peek_token(&mut self) -> Result<&Token, RulesError> {
        if self.peeked.is_none() {
            let next = self.next_token()?;
            self.peeked = Some(next);
        }
        Ok(&self.peeked.as_ref().expect("just filled").0)
    }

    /// An identifier or a number: letters, digits, `_`, `-`, `.`.
    fn word(&mut self) -> String {
        let mut word = String::new();
        while let Some(&c) = self.chars.peek() {
            if c.is_alphanumeric() || matches!(c, '_' | '-' | '.') {
                word.push(c);
                self.bump();
            } else {
                break;
            }
        }
        word
    }

    /// A double-quoted string with HCL's escapes; the opening quote is next.
    fn string(&mut self, start: Pos) -> Result<String, RulesError> {
        self.bump();
        let mut text = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => return Err(Self::syntax(start, "literal not terminated")),
                Some('"') => return Ok(text),
                Some('\\') => {
                    let escape_pos = self.here();
                    match self.bump() {
                        Some('"') => text.push('"'),
                        Some('\\') => text.push('\\'),
                        Some('n') => text.push('\n'),
                        Some('t') => text.push('\t'),
                        Some('r') => text.push('\r'),
                        Some('/') => text.push('/'),
                        Some('u') => text.push(self.unicode_escape(escape_pos, 4)?),
                        Some('U') => text.push(self.unicode_escape(escape_pos, 8)?),
                        _ => return Err(Self::syntax(escape_pos, "unknown escape sequence")),
                    }
                }
                Some(c) => text.push(c),
            }
        }
    }

    fn unicode_escape(&mut self, pos: Pos, digits: usize) -> Result<char, RulesError> {
        let mut code = 0u32;
        for _ in 0..digits {
            let digit = self
                .bump()
                .and_then(|c| c.to_digit(16))
                .ok_or_else(|| Self::syntax(pos, "illegal char escape"))?;
            code = code * 16 + digit;
        }
        char::from_u32(code).ok_or_else(|| Self::syntax(pos, "escape sequence is invalid Unicode"))
    }

    /// Items until `}` (when `nested`) or the end of the text.
    fn body(&mut self, nested: bool) -> Result<Vec<Item>, RulesError> {
        let mut items = Vec::new();
        loop {
            let (token, pos) = self.next_token()?;
            let name = match token {
                Token::RBrace if nested => return Ok(items),
                Token::Eof if !nested => return Ok(items),
                Token::Ident(name) | Token::Text(name) => name,
                other => {
                    return Err(Self::syntax(
                        pos,
                        format!("expected: IDENT | STRING got: {}", other.describe()),
                    ));
                }
            };
            let value = self.item_value(pos)?;
            items.push(Item { name, pos, value });
            if *self.peek_token()? == Token::Comma {
                self.next_token()?;
            }
        }
    }

    /// What follows an item's name: `= value`, `{ body }`, or labels then `{ body }`.
    fn item_value(&mut self, name_pos: Pos) -> Result<Value, RulesError> {
        let (token, pos) = self.next_token()?;
        match token {
            Token::Assign => self.value(),
            Token::LBrace => Ok(Value::Object(self.body(true)?)),
            Token::Text(label) | Token::Ident(label) => {
                let inner = self.item_value(pos)?;
                if !matches!(inner, Value::Object(_)) {
                    return Err(Self::syntax(
                        name_pos,
                        "nested object expected: LBRACE got: ASSIGN",
                    ));
                }
                Ok(Value::Object(vec![Item {
                    name: label,
                    pos,
                    value: inner,
                }]))
            }
            other => Err(Self::syntax(
                pos,
                format!("expected: ASSIGN | LBRACE got: {}", other.describe()),
            )),
        }
    }

    fn value(&mut self) -> Result<Value, RulesError> {
        let (token, pos) = self.next_token()?;
        match token {
            Token::Text(text) => Ok(Value::Text(text)),
            Token::Literal(text) => Ok(Value::Literal(text)),
            Token::LBrace => Ok(Value::Object(self.body(true)?)),
            Token::LBracket => {
                let mut values = Vec::new();
                loop {
                    if *self.peek_token()? == Token::RBracket {
                        self.next_token()?;
                        return Ok(Value::List(values));
                    }
                    values.push(self.value()?);
                    match self.next_token()? {
                        (Token::Comma, _) => {}
                        (Token::RBracket, _) => return Ok(Value::List(values)),
                        (other, pos) => {
                            return Err(Self::syntax(
                                pos,
                                format!("expected: COMMA | RBRACK got: {}", other.describe()),
                            ));
                        }
                    }
                }
            }
            other => Err(Self::syntax(
                pos,
                format!("Unknown token: {}", other.describe()),
            )),
        }
    }
}

// ---------------------------------------------------------------------------------------
// JSON, through serde_json, into the same tree. JSON carries no positions worth keeping.

fn json_items(text: &str) -> Result<Vec<Item>, RulesError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|err| RulesError::Syntax {
            line: err.line(),
            column: err.column(),
            message: err.to_string(),
        })?;
    match json_value(value) {
        Value::Object(items) => Ok(items),
        _ => Err(Parser::syntax(Pos::default(), "expected a JSON object")),
    }
}

fn json_value(value: serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match value {
        Json::String(text) => Value::Text(text),
        Json::Object(map) => Value::Object(
            map.into_iter()
                .map(|(name, value)| Item {
                    name,
                    pos: Pos::default(),
                    value: json_value(value),
                })
                .collect(),
        ),
        Json::Array(values) => Value::List(values.into_iter().map(json_value).collect()),
        Json::Null => Value::Literal(String::new()),
        other => Value::Literal(other.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// From the tree to rules: first the policy as written (levels still text), then Consul's
// validation, in Consul's order.

/// Which block a rule came from; names it in errors the way Consul's Go types do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RuleKind {
    Agent,
    AgentPrefix,
    Key,
    KeyPrefix,
    Node,
    NodePrefix,
    Service,
    ServicePrefix,
    Session,
    SessionPrefix,
    Event,
    EventPrefix,
    Query,
    QueryPrefix,
}

impl RuleKind {
    /// Consul's validation order.
    const ALL: [RuleKind; 14] = [
        RuleKind::Agent,
        RuleKind::AgentPrefix,
        RuleKind::Key,
        RuleKind::KeyPrefix,
        RuleKind::Node,
        RuleKind::NodePrefix,
        RuleKind::Service,
        RuleKind::ServicePrefix,
        RuleKind::Session,
        RuleKind::SessionPrefix,
        RuleKind::Event,
        RuleKind::EventPrefix,
        RuleKind::Query,
        RuleKind::QueryPrefix,
    ];

    fn name(self) -> &'static str {
        match self {
            RuleKind::Agent => "agent",
            RuleKind::AgentPrefix => "agent_prefix",
            RuleKind::Key => "key",
            RuleKind::KeyPrefix => "key_prefix",
            RuleKind::Node => "node",
            RuleKind::NodePrefix => "node_prefix",
            RuleKind::Service => "service",
            RuleKind::ServicePrefix => "service_prefix",
            RuleKind::Session => "session",
            RuleKind::SessionPrefix => "session_prefix",
            RuleKind::Event => "event",
            RuleKind::EventPrefix => "event_prefix",
            RuleKind::Query => "query",
            RuleKind::QueryPrefix => "query_prefix",
        }
    }

    fn from_name(name: &str) -> Option<RuleKind> {
        RuleKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    fn is_prefix(self) -> bool {
        self.name().ends_with("_prefix")
    }

    /// Only Consul's `ServiceRule` has an `intentions` field; elsewhere it is ignored.
    fn has_intentions(self) -> bool {
        matches!(self, RuleKind::Service | RuleKind::ServicePrefix)
    }

    fn allows_list(self) -> bool {
        matches!(self, RuleKind::Key | RuleKind::KeyPrefix)
    }

    fn target(self, rules: &mut Rules) -> &mut SegmentRules {
        match self {
            RuleKind::Agent | RuleKind::AgentPrefix => &mut rules.agent,
            RuleKind::Key | RuleKind::KeyPrefix => &mut rules.key,
            RuleKind::Node | RuleKind::NodePrefix => &mut rules.node,
            RuleKind::Service | RuleKind::ServicePrefix => &mut rules.service,
            RuleKind::Session | RuleKind::SessionPrefix => &mut rules.session,
            RuleKind::Event | RuleKind::EventPrefix => &mut rules.event,
            RuleKind::Query | RuleKind::QueryPrefix => &mut rules.query,
        }
    }
}

/// One block as written, its level not yet checked.
#[derive(Debug)]
struct RawRule {
    kind: RuleKind,
    segment: String,
    policy: String,
    intentions: String,
}

impl RawRule {
    /// The rule as Go's `%#v` prints Consul's rule struct (CE build), for error texts.
    fn go_syntax(&self) -> String {
        let segment = go_quote(&self.segment);
        let policy = go_quote(&self.policy);
        const ENTERPRISE: &str = "EnterpriseRule:acl.EnterpriseRule{}";
        match self.kind {
            RuleKind::Agent | RuleKind::AgentPrefix => {
                format!("&acl.AgentRule{{Node:{segment}, Policy:{policy}}}")
            }
            RuleKind::Key | RuleKind::KeyPrefix => {
                format!("&acl.KeyRule{{Prefix:{segment}, Policy:{policy}, {ENTERPRISE}}}")
            }
            RuleKind::Node | RuleKind::NodePrefix => {
                format!("&acl.NodeRule{{Name:{segment}, Policy:{policy}, {ENTERPRISE}}}")
            }
            RuleKind::Service | RuleKind::ServicePrefix => format!(
                "&acl.ServiceRule{{Name:{segment}, Policy:{policy}, Intentions:{}, {ENTERPRISE}}}",
                go_quote(&self.intentions)
            ),
            RuleKind::Session | RuleKind::SessionPrefix => {
                format!("&acl.SessionRule{{Node:{segment}, Policy:{policy}}}")
            }
            RuleKind::Event | RuleKind::EventPrefix => {
                format!("&acl.EventRule{{Event:{segment}, Policy:{policy}}}")
            }
            RuleKind::Query | RuleKind::QueryPrefix => {
                format!("&acl.PreparedQueryRule{{Prefix:{segment}, Policy:{policy}}}")
            }
        }
    }
}

/// The unsegmented resources, in Consul's validation order.
const SCALARS: [&str; 5] = ["acl", "keyring", "operator", "mesh", "peering"];

#[derive(Debug, Default)]
struct RawPolicy {
    rules: Vec<RawRule>,
    /// Indexed as [`SCALARS`]; empty when unset.
    scalars: [String; 5],
}

impl RawPolicy {
    fn read(items: &[Item]) -> Result<RawPolicy, RulesError> {
        let mut raw = RawPolicy::default();
        let mut seen_scalars = [false; 5];
        for item in items {
            if let Some(index) = SCALARS.iter().position(|name| *name == item.name) {
                if std::mem::replace(&mut seen_scalars[index], true) {
                    return Err(duplicate(item));
                }
                raw.scalars[index] = scalar_text(item)?;
            } else if let Some(kind) = RuleKind::from_name(&item.name) {
                raw.read_segments(kind, &item.value, item.pos)?;
            } else {
                return Err(RulesError::UnknownResource {
                    name: item.name.clone(),
                    line: item.pos.line,
                    column: item.pos.column,
                });
            }
        }
        Ok(raw)
    }

    /// `{ "segment": { policy = ... }, ... }`, or a list of such objects (HCL-as-JSON).
    fn read_segments(&mut self, kind: RuleKind, value: &Value, pos: Pos) -> Result<(), RulesError> {
        match value {
            Value::Object(segments) => {
                for segment in segments {
                    self.read_rule(kind, &segment.name, &segment.value, segment.pos)?;
                }
                Ok(())
            }
            Value::List(values) => values
                .iter()
                .try_for_each(|value| self.read_segments(kind, value, pos)),
            _ => Err(Parser::syntax(
                pos,
                format!(
                    "{}: expected a block such as {} \"name\" {{ policy = \"read\" }}",
                    kind.name(),
                    kind.name()
                ),
            )),
        }
    }

    /// A block's body: `policy` and, for services, `intentions` (validated, otherwise
    /// unused: Vigil has no intentions); other attributes are ignored, as Consul's decoder
    /// ignores them. A list of bodies is one rule per body.
    fn read_rule(
        &mut self,
        kind: RuleKind,
        segment: &str,
        body: &Value,
        pos: Pos,
    ) -> Result<(), RulesError> {
        let attributes = match body {
            Value::Object(attributes) => attributes,
            Value::List(bodies) => {
                return bodies
                    .iter()
                    .try_for_each(|body| self.read_rule(kind, segment, body, pos));
            }
            _ => {
                return Err(Parser::syntax(
                    pos,
                    format!("{}: expected a block for {segment:?}", kind.name()),
                ));
            }
        };
        let mut rule = RawRule {
            kind,
            segment: segment.to_owned(),
            policy: String::new(),
            intentions: String::new(),
        };
        let (mut seen_policy, mut seen_intentions) = (false, false);
        for attribute in attributes {
            let (field, seen) = match attribute.name.as_str() {
                "policy" => (&mut rule.policy, &mut seen_policy),
                "intentions" if kind.has_intentions() => {
                    (&mut rule.intentions, &mut seen_intentions)
                }
                _ => continue,
            };
            if std::mem::replace(seen, true) {
                return Err(duplicate(attribute));
            }
            *field = scalar_text(attribute)?;
        }
        self.rules.push(rule);
        Ok(())
    }

    /// Consul's `PolicyRules.Validate`, then the rules it describes.
    fn validate(self) -> Result<Rules, RulesError> {
        let invalid = |what: &str, rule: String| RulesError::InvalidLevel {
            what: what.to_owned(),
            rule,
        };
        let scalar = |index: usize| -> Result<Option<Level>, RulesError> {
            let text = &self.scalars[index];
            if text.is_empty() {
                return Ok(None);
            }
            match Level::from_text(text) {
                Some(Level::List) | None => Err(invalid(SCALARS[index], go_quote(text))),
                level => Ok(level),
            }
        };

        let mut rules = Rules {
            acl: scalar(0)?,
            ..Rules::default()
        };
        for kind in RuleKind::ALL {
            for raw in self.rules.iter().filter(|raw| raw.kind == kind) {
                let level = match Level::from_text(&raw.policy) {
                    Some(Level::List) if !kind.allows_list() => None,
                    level => level,
                };
                let Some(level) = level else {
                    return Err(invalid(kind.name(), raw.go_syntax()));
                };
                let bad_intentions = !raw.intentions.is_empty()
                    && !matches!(
                        Level::from_text(&raw.intentions),
                        Some(Level::Deny | Level::Read | Level::Write)
                    );
                if bad_intentions {
                    let what = format!("{} intentions", kind.name());
                    return Err(invalid(&what, raw.go_syntax()));
                }
                kind.target(&mut rules)
                    .add(kind.is_prefix(), &raw.segment, level);
            }
        }
        rules.keyring = scalar(1)?;
        rules.operator = scalar(2)?;
        rules.mesh = scalar(3)?;
        rules.peering = scalar(4)?;
        Ok(rules)
    }
}

fn duplicate(item: &Item) -> RulesError {
    RulesError::Duplicate {
        name: item.name.clone(),
        line: item.pos.line,
        column: item.pos.column,
    }
}

/// An attribute that must be a single value (`operator = "read"`, `policy = "write"`).
fn scalar_text(item: &Item) -> Result<String, RulesError> {
    match &item.value {
        Value::Text(text) | Value::Literal(text) => Ok(text.clone()),
        _ => Err(Parser::syntax(
            item.pos,
            format!("{}: expected a string", item.name),
        )),
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
