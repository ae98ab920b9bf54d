//! What the lock recipes leave in the KV store, which the recipes write and the agent's lock
//! report (`/v1/vigil/locks`) reads: the flag value marking each recipe's keys, and the
//! semaphore's coordination document, byte for byte as Consul's Go client writes it.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::kv::KvEntry;

/// `api.LockFlagValue` (0x2ddccbc058a50c18): marks a key used as a lock.
pub const LOCK_FLAG_VALUE: u64 = 0x2ddc_cbc0_58a5_0c18;
/// `api.SemaphoreFlagValue` (0xe0f69a2baa414de0).
pub const SEMAPHORE_FLAG_VALUE: u64 = 0xe0f6_9a2b_aa41_4de0;
/// `api.DefaultSemaphoreKey`: the coordination key inside the prefix.
pub const SEMAPHORE_KEY: &str = ".lock";
/// Marks a fair-mutex contender key (ASCII "VigilFai").
pub const FAIR_FLAG_VALUE: u64 = 0x5669_6769_6c46_6169;

/// The value of `<prefix>/.lock` (Go's `semaphoreLock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreLock {
    pub limit: i64,
    /// A set of session IDs (Go's `map[string]bool`, written with sorted keys).
    pub holders: BTreeMap<String, bool>,
}

impl SemaphoreLock {
    pub fn empty(limit: i64) -> SemaphoreLock {
        SemaphoreLock {
            limit,
            holders: BTreeMap::new(),
        }
    }

    /// Go's `json.Marshal`: `{"Limit":2,"Holders":{"a":true,"b":true}}`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!("{{\"Limit\":{},\"Holders\":{{", self.limit);
        for (i, (holder, held)) in self.holders.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&go_json_string(holder));
            out.push(':');
            out.push_str(if *held { "true" } else { "false" });
        }
        out.push_str("}}");
        out.into_bytes()
    }

    /// Go's `decodeLock`: an empty value is an empty lock with the local limit; field names
    /// match case-insensitively, as `encoding/json` does.
    pub fn decode(value: &[u8], local_limit: i64) -> Result<SemaphoreLock, String> {
        if value.is_empty() {
            return Ok(SemaphoreLock::empty(local_limit));
        }
        let fail = |e: &dyn std::fmt::Display| format!("lock decoding failed: {e}");
        let v: Value = serde_json::from_slice(value).map_err(|e| fail(&e))?;
        let obj = v.as_object().ok_or_else(|| fail(&"not an object"))?;
        let mut lock = SemaphoreLock::empty(0);
        for (name, field) in obj {
            match name.to_ascii_lowercase().as_str() {
                "limit" => {
                    lock.limit = field.as_i64().ok_or_else(|| fail(&"Limit is no integer"))?;
                }
                "holders" if field.is_null() => {}
                "holders" => {
                    let map = field
                        .as_object()
                        .ok_or_else(|| fail(&"Holders is no object"))?;
                    for (holder, held) in map {
                        let held = held.as_bool().ok_or_else(|| fail(&"holder is no bool"))?;
                        lock.holders.insert(holder.clone(), held);
                    }
                }
                _ => {}
            }
        }
        Ok(lock)
    }

    /// Drops every holder whose session holds no key in `pairs` (Go's `pruneDeadHolders`).
    pub fn prune(&mut self, pairs: &[KvEntry]) {
        let alive: std::collections::HashSet<&str> =
            pairs.iter().filter_map(|p| p.session.as_deref()).collect();
        self.holders.retain(|h, _| alive.contains(h.as_str()));
    }
}

/// A JSON string as Go's `encoding/json` writes it (HTML-safe escaping of `<`, `>`, `&`).
fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, session: Option<&str>) -> KvEntry {
        KvEntry {
            key: key.into(),
            value: Vec::new(),
            flags: SEMAPHORE_FLAG_VALUE,
            session: session.map(str::to_owned),
            lock_index: 1,
            create_index: 1,
            modify_index: 1,
        }
    }

    #[test]
    fn encodes_like_go_json_marshal() {
        let mut lock = SemaphoreLock::empty(2);
        lock.holders.insert("b".into(), true);
        lock.holders.insert("a".into(), true);
        assert_eq!(
            lock.encode(),
            br#"{"Limit":2,"Holders":{"a":true,"b":true}}"#.to_vec()
        );
        assert_eq!(
            SemaphoreLock::empty(3).encode(),
            br#"{"Limit":3,"Holders":{}}"#.to_vec()
        );
        let mut odd = SemaphoreLock::empty(1);
        odd.holders.insert("<&>\"".into(), true);
        assert_eq!(
            String::from_utf8(odd.encode()).unwrap(),
            r#"{"Limit":1,"Holders":{"\u003c\u0026\u003e\"":true}}"#
        );
    }

    #[test]
    fn decodes_go_output_any_casing_and_empty_values() {
        let lock =
            SemaphoreLock::decode(br#"{"Limit":2,"Holders":{"a":true,"b":true}}"#, 9).unwrap();
        assert_eq!(lock.limit, 2);
        assert_eq!(lock.holders.keys().collect::<Vec<_>>(), ["a", "b"]);
        let round = SemaphoreLock::decode(&lock.encode(), 9).unwrap();
        assert_eq!(round, lock);
        let lower = SemaphoreLock::decode(br#"{"limit":3,"holders":null}"#, 9).unwrap();
        assert_eq!(lower, SemaphoreLock::empty(3));
        assert_eq!(
            SemaphoreLock::decode(b"", 4).unwrap(),
            SemaphoreLock::empty(4)
        );
        let err = SemaphoreLock::decode(b"{", 1).unwrap_err();
        assert!(err.starts_with("lock decoding failed: "), "{err}");
    }

    #[test]
    fn prunes_holders_without_a_live_key() {
        let mut lock = SemaphoreLock::empty(3);
        for h in ["s1", "s2", "s3"] {
            lock.holders.insert(h.into(), true);
        }
        let pairs = [
            pair("p/.lock", None),
            pair("p/s1", Some("s1")),
            pair("p/s3", Some("s3")),
            pair("p/s2", None),
        ];
        lock.prune(&pairs);
        assert_eq!(lock.holders.keys().collect::<Vec<_>>(), ["s1", "s3"]);
    }
}
