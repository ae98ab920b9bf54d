//! Decoders for the config's typed fields. Each error says what the key must be, in the words the
//! config file's errors have always used (`` `enable_script_checks` must be true or false ``,
//! `https_addr: "x" is not HOST:PORT`); [`super::describe`] puts the key in front.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::{Deserialize, Deserializer, Error};
use serde_json::Value;
use vigil_shared::acl::authz::DefaultPolicy;
use vigil_shared::go::duration::parse_go_duration;

use super::ListenAddr;
use vigil_gossip::{Key, TimingProfile};

pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(b) => Ok(b),
        _ => Err(D::Error::custom("must be true or false")),
    }
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        _ => Err(D::Error::custom("must be a string")),
    }
}

fn parse_addr<E: Error>(s: &str) -> Result<SocketAddr, E> {
    s.trim()
        .parse()
        .map_err(|_| E::custom(format!("{s:?} is not HOST:PORT")))
}

pub fn addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    parse_addr(&text(d)?)
}

pub fn optional_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    addr(d).map(Some)
}

pub fn addrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
    match Value::deserialize(d)? {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => parse_addr(s),
                _ => Err(D::Error::custom("must be a list of HOST:PORT strings")),
            })
            .collect(),
        _ => Err(D::Error::custom("must be a list of HOST:PORT strings")),
    }
}

pub fn listen_addr<'de, D: Deserializer<'de>>(d: D) -> Result<ListenAddr, D::Error> {
    text(d)?.parse().map_err(D::Error::custom)
}

pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = text(d)?;
    parse_go_duration(&s).map_err(|e| D::Error::custom(format!("{s:?}: {e}")))
}

pub fn key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Key>, D::Error> {
    Key::from_base64(&text(d)?)
        .map(Some)
        .map_err(D::Error::custom)
}

pub fn profile<'de, D: Deserializer<'de>>(d: D) -> Result<TimingProfile, D::Error> {
    match text(d)?.as_str() {
        "lan" => Ok(TimingProfile::Lan),
        "local" => Ok(TimingProfile::Local),
        other => Err(D::Error::custom(format!(
            "must be \"lan\" or \"local\", not {other:?}"
        ))),
    }
}

pub fn policy<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DefaultPolicy>, D::Error> {
    match Value::deserialize(d)?.as_str() {
        Some("allow") => Ok(Some(DefaultPolicy::Allow)),
        Some("deny") => Ok(Some(DefaultPolicy::Deny)),
        _ => Err(D::Error::custom("must be \"allow\" or \"deny\"")),
    }
}

pub fn bootstrap_expect<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    match Value::deserialize(d)?.as_u64() {
        Some(n @ (1 | 3 | 5)) => Ok(Some(n as usize)),
        _ => Err(D::Error::custom("must be 1, 3 or 5")),
    }
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    Value::deserialize(d)?
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| D::Error::custom("must be a whole number"))
}

pub fn whole<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    count(d)
}

pub fn optional_whole<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    count(d).map(Some)
}

pub fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    match count(d) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(D::Error::custom("must be a whole number of at least 1")),
    }
}

pub fn node_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    crate::node_id::parse(&text(d)?)
        .map(Some)
        .map_err(D::Error::custom)
}

pub fn node_meta<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    BTreeMap::deserialize(d).map_err(|_| D::Error::custom("must be a table of strings"))
}

/// The tables under a key (`[[key]]` or a single `[key]`), each decoded later by the HTTP API's
/// own service or check decoder.
pub fn tables<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    match Value::deserialize(d)? {
        Value::Array(items) => Ok(items),
        table @ Value::Object(_) => Ok(vec![table]),
        _ => Err(D::Error::custom("must be a table or an array of tables")),
    }
}
