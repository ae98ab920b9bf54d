//! Bounds on what one request may carry, so that no request can make an agent or the raft log
//! hold an unbounded amount of memory. Consul's own limits and texts where it has them (KV value
//! and txn sizes in [`super::body`], metadata here); elsewhere a 400 naming the field and the
//! limit. README.md lists them under "Limits a client can hit".

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::ApiError;
use crate::local::definition::CheckDefinition;

/// Largest body of any route but KV and txn (which have Consul's 512 KiB limits).
pub const BODY_MAX: usize = 512 * 1024;
/// Longest name or ID (node, session name, service, check, prepared query) and service tag.
pub const NAME_MAX: usize = 1024;
/// Longest string anywhere in a JSON body (notes, a check's HTTP body, an argument, ...).
pub const STRING_MAX: usize = 64 * 1024;
/// Most entries in one JSON array, or members in one JSON object.
pub const ITEMS_MAX: usize = 1024;
/// Deepest nesting of a JSON body.
pub const DEPTH_MAX: usize = 32;
/// Consul's metadata limits (`metaMaxKeyPairs`, `metaKeyMaxLength`, `metaValueMaxLength`).
pub const META_PAIRS_MAX: usize = 64;
pub const META_KEY_MAX: usize = 128;
pub const META_VALUE_MAX: usize = 512;

/// Checks every string, array and object of a JSON body against [`STRING_MAX`], [`ITEMS_MAX`]
/// and [`DEPTH_MAX`]. A body that is not JSON passes: its decoder reports that in its own words.
pub fn json_shape(body: &[u8]) -> Result<(), ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(value) => shape(&value, &mut String::new(), 0)
            .map_err(|e| ApiError::bad_request(format!("Request decode failed: {e}"))),
        Err(_) => Ok(()),
    }
}

/// Where in the body `path` is, as an error says it.
fn at(path: &str) -> &str {
    if path.is_empty() { "the body" } else { path }
}

/// An array's entries or an object's members (`what`) within [`ITEMS_MAX`].
fn items(len: usize, what: &str, path: &str) -> Result<(), String> {
    if len > ITEMS_MAX {
        return Err(format!(
            "{} has {len} {what}, more than the limit of {ITEMS_MAX}",
            at(path)
        ));
    }
    Ok(())
}

fn shape(value: &Value, path: &mut String, depth: usize) -> Result<(), String> {
    if depth > DEPTH_MAX {
        return Err(format!("{} is nested more than {DEPTH_MAX} deep", at(path)));
    }
    match value {
        Value::String(s) if s.len() > STRING_MAX => Err(format!(
            "{} is {} bytes long, more than the limit of {STRING_MAX}",
            at(path),
            s.len()
        )),
        Value::Array(entries) => {
            items(entries.len(), "entries", path)?;
            for (i, item) in entries.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                shape(item, path, depth + 1)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(members) => {
            items(members.len(), "members", path)?;
            for (name, member) in members {
                if name.len() > NAME_MAX {
                    return Err(format!(
                        "a member name in {} is {} bytes long, more than the limit of {NAME_MAX}",
                        at(path),
                        name.len()
                    ));
                }
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(name);
                shape(member, path, depth + 1)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A name or ID within [`NAME_MAX`]; `what` names the field as the client wrote it.
pub fn name(what: &str, value: &str) -> Result<(), ApiError> {
    if value.len() > NAME_MAX {
        return Err(ApiError::bad_request(format!(
            "{what} is {} bytes long, more than the limit of {NAME_MAX}",
            value.len()
        )));
    }
    Ok(())
}

/// Every tag within [`NAME_MAX`].
pub fn tags(what: &str, tags: &[String]) -> Result<(), ApiError> {
    tags.iter().try_for_each(|t| name(what, t))
}

/// A check definition's ID and name within [`NAME_MAX`] (everything else in it is bounded by
/// [`json_shape`]).
pub fn check(check: &CheckDefinition) -> Result<(), ApiError> {
    name("Name", &check.name)?;
    name("CheckID", &check.id)
}

/// Consul's size limits on a metadata map, with its texts (`structs.validateMetadata`), after
/// `prefix` (e.g. `Invalid NodeMeta: `).
pub fn meta(prefix: &str, meta: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let fail = |problem: String| Err(ApiError::bad_request(format!("{prefix}{problem}")));
    if meta.len() > META_PAIRS_MAX {
        return fail(format!(
            "Node metadata cannot contain more than {META_PAIRS_MAX} key/value pairs"
        ));
    }
    for (key, value) in meta {
        let problem = if key.len() > META_KEY_MAX {
            format!("Key is too long (limit: {META_KEY_MAX} characters)")
        } else if value.len() > META_VALUE_MAX {
            format!("Value is too long (limit: {META_VALUE_MAX} characters)")
        } else {
            continue;
        };
        return fail(format!(
            "Couldn't load metadata pair ('{key}', '{value}'): {problem}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refusal(body: &Value) -> String {
        json_shape(body.to_string().as_bytes()).unwrap_err().message
    }

    #[test]
    fn json_shape_names_the_field_and_the_limit() {
        assert!(json_shape(b"not json").is_ok());
        assert!(
            json_shape(
                json!({"Name": "x".repeat(STRING_MAX)})
                    .to_string()
                    .as_bytes()
            )
            .is_ok()
        );
        assert_eq!(
            refusal(&json!({"Service": {"Tags": ["a", "x".repeat(STRING_MAX + 1)]}})),
            format!(
                "Request decode failed: Service.Tags[1] is {} bytes long, more than the limit of {STRING_MAX}",
                STRING_MAX + 1
            )
        );
        assert_eq!(
            refusal(&json!({"Checks": vec![""; ITEMS_MAX + 1]})),
            format!(
                "Request decode failed: Checks has {} entries, more than the limit of {ITEMS_MAX}",
                ITEMS_MAX + 1
            )
        );
        let mut deep = json!(1);
        for _ in 0..=DEPTH_MAX {
            deep = json!([deep]);
        }
        assert!(refusal(&deep).ends_with(&format!("is nested more than {DEPTH_MAX} deep")));
    }

    #[test]
    fn meta_uses_consuls_texts() {
        let pairs = |n: usize, key: &str, value: &str| -> BTreeMap<String, String> {
            (0..n)
                .map(|i| (format!("{key}{i}"), value.to_owned()))
                .collect()
        };
        assert!(meta("", &pairs(META_PAIRS_MAX, "k", "v")).is_ok());
        assert_eq!(
            meta("Invalid NodeMeta: ", &pairs(META_PAIRS_MAX + 1, "k", "v"))
                .unwrap_err()
                .message,
            "Invalid NodeMeta: Node metadata cannot contain more than 64 key/value pairs"
        );
        let long_value = "v".repeat(META_VALUE_MAX + 1);
        assert_eq!(
            meta("", &pairs(1, "k", &long_value)).unwrap_err().message,
            format!(
                "Couldn't load metadata pair ('k0', '{long_value}'): Value is too long (limit: 512 characters)"
            )
        );
        let long_key = "k".repeat(META_KEY_MAX);
        assert!(
            meta("", &pairs(1, &long_key, "v"))
                .unwrap_err()
                .message
                .ends_with("Key is too long (limit: 128 characters)")
        );
    }
}
