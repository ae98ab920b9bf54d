//! Consul's JSON shapes: responses in PascalCase with Consul's field order and omissions,
//! and request decoding that matches field names case-insensitively, as Go's `encoding/json` does.

pub mod acl;
pub mod agent;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::autopilot::AutopilotConfig;
use crate::kv::KvEntry;
use crate::session::{ServiceCheck, Session};

/// Consul's `DirEntry`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DirEntry {
    pub lock_index: u64,
    pub key: String,
    pub flags: u64,
    /// Standard base64; `null` for an empty value.
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl DirEntry {
    pub fn from_entry(e: &KvEntry) -> DirEntry {
        DirEntry {
            lock_index: e.lock_index,
            key: e.key.clone(),
            flags: e.flags,
            value: (!e.value.is_empty()).then(|| BASE64.encode(&e.value)),
            session: e.session.clone(),
            create_index: e.create_index,
            modify_index: e.modify_index,
        }
    }

    /// Decodes the base64 value (empty when `null`).
    pub fn value_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        self.value
            .as_deref()
            .map_or(Ok(Vec::new()), |v| BASE64.decode(v))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCheckJson {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Namespace", default)]
    pub namespace: String,
}

/// Consul's session JSON (`/v1/session/info` and friends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionJson {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Node")]
    pub node: String,
    /// Nanoseconds.
    #[serde(rename = "LockDelay")]
    pub lock_delay: u64,
    #[serde(rename = "Behavior")]
    pub behavior: String,
    #[serde(rename = "TTL")]
    pub ttl: String,
    #[serde(rename = "NodeChecks")]
    pub node_checks: Vec<String>,
    #[serde(rename = "ServiceChecks")]
    pub service_checks: Option<Vec<ServiceCheckJson>>,
    #[serde(rename = "Checks", default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<String>,
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
}

impl SessionJson {
    pub fn from_session(s: &Session) -> SessionJson {
        SessionJson {
            id: s.id.clone(),
            name: s.name.clone(),
            node: s.node.clone(),
            lock_delay: s.lock_delay_ns,
            behavior: s.behavior.as_str().to_owned(),
            ttl: s.ttl.clone(),
            node_checks: s.node_checks.clone(),
            service_checks: s.service_checks.as_ref().map(|v| {
                v.iter()
                    .map(|c: &ServiceCheck| ServiceCheckJson {
                        id: c.id.clone(),
                        namespace: c.namespace.clone(),
                    })
                    .collect()
            }),
            checks: s.checks.clone(),
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

/// Autopilot's settings in Consul's shape (and, lowercased, what a `PUT` decodes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AutopilotJson {
    pub cleanup_dead_servers: bool,
    pub last_contact_threshold: String,
    pub max_trailing_logs: u64,
    pub min_quorum: u64,
    pub server_stabilization_time: String,
    pub redundancy_zone_tag: String,
    pub disable_upgrade_migration: bool,
    pub upgrade_version_tag: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl From<AutopilotConfig> for AutopilotJson {
    fn from(c: AutopilotConfig) -> AutopilotJson {
        AutopilotJson {
            cleanup_dead_servers: c.cleanup_dead_servers,
            last_contact_threshold: c.last_contact_threshold,
            max_trailing_logs: c.max_trailing_logs,
            min_quorum: c.min_quorum,
            server_stabilization_time: c.server_stabilization_time,
            redundancy_zone_tag: c.redundancy_zone_tag,
            disable_upgrade_migration: c.disable_upgrade_migration,
            upgrade_version_tag: c.upgrade_version_tag,
            create_index: c.create_index,
            modify_index: c.modify_index,
        }
    }
}

/// Consul's `/v1/operator/autopilot/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AutopilotHealthJson {
    pub healthy: bool,
    pub failure_tolerance: usize,
    pub servers: Vec<ServerHealthJson>,
}

/// One server in [`AutopilotHealthJson`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServerHealthJson {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub address: String,
    pub serf_status: String,
    pub version: String,
    pub leader: bool,
    pub last_term: u64,
    pub last_index: u64,
    pub healthy: bool,
    pub voter: bool,
}

/// Decodes `bytes` into `T` whose serde names are all lowercase, matching the object keys of the
/// input case-insensitively. A member whose value is `null` is dropped, so it decodes as absent
/// (the field's default): Go's `encoding/json` writes a nil slice, map or pointer as `null` and
/// reads `null` as that type's zero value, which is what absent means unless a handler fills
/// in a default first (see [`decode_case_insensitive_nullable`]). Objects under a key listed
/// in `opaque` (free-form maps such as `Meta`) keep their keys and members as sent.
pub fn decode_case_insensitive<T: DeserializeOwned>(
    bytes: &[u8],
    opaque: &[&str],
) -> Result<T, serde_json::Error> {
    decode_case_insensitive_nullable(bytes, opaque, &[])
}

/// [`decode_case_insensitive`], but a `null` member named (lowercase) in `nullable` is kept, for
/// a field whose handler starts from a default that Go's `null` replaces with nothing (a
/// session's `Checks`).
pub fn decode_case_insensitive_nullable<T: DeserializeOwned>(
    bytes: &[u8],
    opaque: &[&str],
    nullable: &[&str],
) -> Result<T, serde_json::Error> {
    let mut value: Value = serde_json::from_slice(bytes)?;
    lowercase_keys(&mut value, opaque, nullable);
    serde_json::from_value(value)
}

fn lowercase_keys(value: &mut Value, opaque: &[&str], nullable: &[&str]) {
    match value {
        Value::Object(map) => {
            let old = std::mem::take(map);
            for (k, mut v) in old {
                let lower = k.to_ascii_lowercase();
                if v.is_null() && !nullable.contains(&lower.as_str()) {
                    continue;
                }
                if !opaque.contains(&lower.as_str()) {
                    lowercase_keys(&mut v, opaque, nullable);
                }
                // An exact lowercase spelling wins over another casing of the same name.
                if k == lower || !map.contains_key(&lower) {
                    map.insert(lower, v);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| lowercase_keys(v, opaque, nullable)),
        _ => {}
    }
}

/// Consul's `?keys&separator=` listing: cut each key just after the first separator that follows
/// the prefix, and drop duplicates (input sorted, output sorted).
pub fn collapse_keys(prefix: &str, keys: &[&str], separator: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(keys.len());
    for key in keys {
        let cut = match separator.filter(|s| !s.is_empty()) {
            Some(sep) => key[prefix.len()..]
                .find(sep)
                .map_or(*key, |at| &key[..prefix.len() + at + sep.len()]),
            None => key,
        };
        if out.last().map(String::as_str) != Some(cut) {
            out.push(cut.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Probe {
        name: String,
        #[serde(default)]
        meta: std::collections::BTreeMap<String, String>,
    }

    #[test]
    fn decodes_any_casing_but_keeps_opaque_maps() {
        let p: Probe =
            decode_case_insensitive(br#"{"NAME":"x","Meta":{"Key":"V"}}"#, &["meta"]).unwrap();
        assert_eq!(p.name, "x");
        assert_eq!(p.meta.get("Key").map(String::as_str), Some("V"));
    }

    #[test]
    fn null_members_decode_as_absent_at_any_depth() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct Outer {
            #[serde(default)]
            list: Vec<String>,
            inner: Option<Probe>,
        }
        let o: Outer = decode_case_insensitive(
            br#"{"List":null,"Inner":{"Name":"x","Meta":null}}"#,
            &["meta"],
        )
        .unwrap();
        assert!(o.list.is_empty());
        let inner = o.inner.expect("inner decoded");
        assert_eq!(inner.name, "x");
        assert!(inner.meta.is_empty());
        // Inside a free-form map a null stays what it is.
        let kept: Result<Probe, _> =
            decode_case_insensitive(br#"{"Name":"x","Meta":{"k":null}}"#, &["meta"]);
        assert!(kept.is_err());
    }

    #[test]
    fn collapses_keys_at_separator() {
        let keys = [
            "/test/key1",
            "/test/key2",
            "/test/sub/key3",
            "/test/sub/key4",
        ];
        assert_eq!(
            collapse_keys("/test/", &keys, Some("/")),
            vec!["/test/key1", "/test/key2", "/test/sub/"]
        );
        assert_eq!(collapse_keys("/test/", &keys, None).len(), 4);
    }

    #[test]
    fn autopilot_shapes_are_consuls() {
        let config = AutopilotJson::from(AutopilotConfig::default());
        let text = concat!(
            r#"{"CleanupDeadServers":true,"LastContactThreshold":"200ms","MaxTrailingLogs":250,"#,
            r#""MinQuorum":0,"ServerStabilizationTime":"10s","RedundancyZoneTag":"","#,
            r#""DisableUpgradeMigration":false,"UpgradeVersionTag":"","CreateIndex":0,"#,
            r#""ModifyIndex":0}"#
        );
        assert_eq!(serde_json::to_string(&config).unwrap(), text);
        assert_eq!(serde_json::from_str::<AutopilotJson>(text).unwrap(), config);
        let health = AutopilotHealthJson {
            healthy: false,
            failure_tolerance: 0,
            servers: vec![ServerHealthJson {
                id: "00000000000000a1".to_owned(),
                name: "s1".to_owned(),
                address: "127.0.0.1:8300".to_owned(),
                serf_status: "alive".to_owned(),
                version: "0.1.0".to_owned(),
                leader: true,
                last_term: 3,
                last_index: 42,
                healthy: false,
                voter: true,
            }],
        };
        let text = concat!(
            r#"{"Healthy":false,"FailureTolerance":0,"Servers":[{"ID":"00000000000000a1","#,
            r#""Name":"s1","Address":"127.0.0.1:8300","SerfStatus":"alive","Version":"0.1.0","#,
            r#""Leader":true,"LastTerm":3,"LastIndex":42,"Healthy":false,"Voter":true}]}"#
        );
        assert_eq!(serde_json::to_string(&health).unwrap(), text);
        assert_eq!(
            serde_json::from_str::<AutopilotHealthJson>(text).unwrap(),
            health
        );
    }

    #[test]
    fn empty_value_is_null() {
        let e = KvEntry {
            key: "k".into(),
            value: vec![],
            flags: 0,
            session: None,
            lock_index: 0,
            create_index: 1,
            modify_index: 1,
        };
        let json = serde_json::to_string(&DirEntry::from_entry(&e)).unwrap();
        assert_eq!(
            json,
            r#"{"LockIndex":0,"Key":"k","Flags":0,"Value":null,"CreateIndex":1,"ModifyIndex":1}"#
        );
    }
}
