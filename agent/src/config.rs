//! The agent's config file (`--config FILE`, TOML): the gossip key, the script-check switches,
//! and the services and checks registered every time the agent starts. Each `[[service]]` and
//! `[[check]]` table takes the same fields as the HTTP API's JSON body, in Consul's config-file
//! spelling (snake_case) or the API's:
//!
//! ```toml
//! # The gossip key (`vigil keygen`), as Consul's `encrypt`: here, in a file only the agent's user
//! # can read, it stays out of the command line that every local user sees in /proc.
//! encrypt = "cg8StVXbQJ0gPvMd9o7yrg1Ttd/ZCXtSFKgSbtXaV2k="
//! enable_script_checks = false
//! enable_local_script_checks = true
//! # The HTTP API's listeners (the `--http-addr`, `--https-addr` and `--verify-incoming-https`
//! # flags win): plain HTTP off, HTTPS with the agent's certificate, client certificates required.
//! http_addr = "off"
//! https_addr = "127.0.0.1:8501"
//! verify_incoming_https = true
//! # This node's metadata in the catalog (Consul's `node_meta`; `--node-meta key:value` adds).
//! node_meta = { rack = "r1" }
//!
//! [[service]]
//! name = "web"
//! port = 8080
//! tags = ["v1"]
//! [[service.checks]]
//! http = "http://127.0.0.1:8080/health"
//! interval = "10s"
//!
//! [[check]]
//! id = "worker"
//! name = "Worker heartbeat"
//! ttl = "30s"
//! ```
//!
//! `services` and `checks` are accepted as well as `service` and `check`. A file whose name ends
//! in `.json` is read as JSON, Consul's own config format, with the same keys
//! (`{"service": {"name": "web", "port": 8080}}`); an empty one declares nothing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

use crate::local::definition::{CheckDefinition, ServiceDefinition, parse_check, parse_service};
use vigil_shared::acl::authz::DefaultPolicy;

use crate::acl::AclConfig;
use crate::gossip::Key;

/// Everything a config file sets.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    /// The gossip key (Consul's `encrypt`; `--encrypt` wins over it).
    pub encrypt: Option<Key>,
    /// `http_addr`: the plain-HTTP API's address, `Some(None)` for `"off"` (`--http-addr` wins).
    pub http_addr: Option<Option<SocketAddr>>,
    /// `https_addr`: the HTTPS API's address (`--https-addr` wins).
    pub https_addr: Option<SocketAddr>,
    /// `verify_incoming_https`: HTTPS clients must present a certificate signed by the CA.
    pub verify_incoming_https: bool,
    pub local: LocalDefinitions,
    /// The `[acl]` table, as Consul's `acl` block: `enabled`, `default_policy` and
    /// `[acl.tokens]` `initial_management` and `agent`.
    pub acl: AclConfig,
}

/// What a config file declares for the agent's local state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalDefinitions {
    /// Lets script checks run, from the config file and over HTTP (the same as
    /// `--enable-script-checks`).
    pub enable_script_checks: bool,
    /// Lets script checks of the config file run, not those registered over HTTP (the same as
    /// `--enable-local-script-checks`).
    pub enable_local_script_checks: bool,
    /// This node's metadata in the catalog (Consul's `node_meta`).
    pub node_meta: BTreeMap<String, String>,
    pub services: Vec<ServiceDefinition>,
    pub checks: Vec<CheckDefinition>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// The tables under `key` (`[[key]]` or a single `[key]`).
fn tables(value: Value, key: &str) -> Result<Vec<Value>, String> {
    match value {
        Value::Array(items) => Ok(items),
        table @ Value::Object(_) => Ok(vec![table]),
        _ => Err(format!("`{key}` must be a table or an array of tables")),
    }
}

/// A TOML syntax error without the quoted source line toml's `Display` adds: that line may hold
/// the gossip key, and the error ends up in the log.
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text
                .get(..span.start)
                .map_or(0, |t| t.matches('\n').count())
                + 1;
            format!("line {line}: {}", e.message())
        }
        None => e.message().to_owned(),
    }
}

fn flag(value: &Value, key: &str) -> Result<bool, String> {
    value
        .as_bool()
        .ok_or_else(|| format!("`{key}` must be true or false"))
}

fn string(value: &Value, key: &str) -> Result<String, String> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("`{key}` must be a string"))
}

/// Consul's `acl` block: ACLs are on with `enabled = true` (default policy `allow`) or with a
/// `default_policy`.
fn parse_acl(value: &Value) -> Result<AclConfig, String> {
    let table = value.as_object().ok_or("`acl` must be a table")?;
    let mut acl = AclConfig::default();
    let mut enabled = false;
    for (key, value) in table {
        match key.as_str() {
            "enabled" => enabled = flag(value, "acl.enabled")?,
            "default_policy" => {
                acl.default_policy = Some(match value.as_str() {
                    Some("allow") => DefaultPolicy::Allow,
                    Some("deny") => DefaultPolicy::Deny,
                    _ => return Err("`acl.default_policy` must be \"allow\" or \"deny\"".into()),
                });
            }
            "tokens" => {
                let tokens = value.as_object().ok_or("`acl.tokens` must be a table")?;
                for (key, value) in tokens {
                    match key.as_str() {
                        "initial_management" => {
                            acl.initial_management =
                                Some(string(value, "acl.tokens.initial_management")?);
                        }
                        "agent" => acl.agent_token = Some(string(value, "acl.tokens.agent")?),
                        other => {
                            return Err(format!(
                                "unknown key `acl.tokens.{other}` (expected initial_management or agent)"
                            ));
                        }
                    }
                }
            }
            other => {
                return Err(format!(
                    "unknown key `acl.{other}` (expected enabled, default_policy or tokens)"
                ));
            }
        }
    }
    if enabled && acl.default_policy.is_none() {
        acl.default_policy = Some(DefaultPolicy::Allow);
    }
    Ok(acl)
}

/// Parses a config file's text (TOML).
pub fn parse(text: &str) -> Result<ConfigFile, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
    let doc = serde_json::to_value(&doc).map_err(|e| e.to_string())?;
    match doc {
        Value::Object(doc) => parse_keys(doc),
        _ => Err("a TOML document is a table".to_owned()),
    }
}

/// Parses a config file's text as JSON (Consul's own config format): an object with the keys
/// of the TOML file; empty text declares nothing. A syntax error names its line and column,
/// never the text (which may hold the gossip key).
pub fn parse_json(text: &str) -> Result<ConfigFile, String> {
    if text.trim().is_empty() {
        return Ok(ConfigFile::default());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(doc)) => parse_keys(doc),
        Ok(_) => Err("a JSON config file is an object".to_owned()),
        Err(e) => Err(format!(
            "line {} column {}: invalid JSON",
            e.line(),
            e.column()
        )),
    }
}

fn parse_keys(doc: serde_json::Map<String, Value>) -> Result<ConfigFile, String> {
    let mut out = ConfigFile::default();
    let local = &mut out.local;
    for (key, value) in doc {
        match key.as_str() {
            "encrypt" => {
                let key = value.as_str().ok_or("`encrypt` must be a string")?;
                out.encrypt = Some(Key::from_base64(key).map_err(|e| format!("encrypt: {e}"))?);
            }
            "http_addr" => {
                let addr = value.as_str().ok_or("`http_addr` must be a string")?;
                out.http_addr =
                    Some(parse_listen_addr(addr).map_err(|e| format!("http_addr: {e}"))?);
            }
            "https_addr" => {
                let addr = value.as_str().ok_or("`https_addr` must be a string")?;
                out.https_addr = Some(
                    addr.parse()
                        .map_err(|_| format!("https_addr: {addr:?} is not HOST:PORT"))?,
                );
            }
            "verify_incoming_https" => out.verify_incoming_https = flag(&value, &key)?,
            "enable_script_checks" => local.enable_script_checks = flag(&value, &key)?,
            "enable_local_script_checks" => local.enable_local_script_checks = flag(&value, &key)?,
            "node_meta" => {
                local.node_meta = serde_json::from_value(value)
                    .map_err(|_| "`node_meta` must be a table of strings".to_owned())?;
            }
            "service" | "services" => {
                for (i, table) in tables(value, &key)?.into_iter().enumerate() {
                    let service =
                        parse_service(table).map_err(|e| format!("{key} #{}: {e}", i + 1))?;
                    local.services.push(service);
                }
            }
            "check" | "checks" => {
                for (i, table) in tables(value, &key)?.into_iter().enumerate() {
                    let check = parse_check(table).map_err(|e| format!("{key} #{}: {e}", i + 1))?;
                    local.checks.push(check);
                }
            }
            "acl" => out.acl = parse_acl(&value)?,
            other => {
                return Err(format!(
                    "unknown key `{other}` (expected encrypt, http_addr, https_addr, \
                     verify_incoming_https, enable_script_checks, \
                     enable_local_script_checks, node_meta, acl, service or check)"
                ));
            }
        }
    }
    Ok(out)
}

/// A listener's address, `HOST:PORT`, or `off` for none (Consul's port -1, also accepted).
pub fn parse_listen_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    match s.trim() {
        "off" | "-1" => Ok(None),
        addr => addr
            .parse()
            .map(Some)
            .map_err(|_| format!("{s:?} is neither HOST:PORT nor off")),
    }
}

/// Reads and parses the config file at `path`: JSON when its name ends in `.json`, else TOML.
pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        parse_json(&text)
    } else {
        parse(&text)
    };
    parsed.map_err(|message| ConfigError::Invalid {
        path: path.display().to_string(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::definition::CheckKind;
    use std::time::Duration;

    #[test]
    fn consuls_json_config_declares_the_same() {
        let json = parse_json(
            r#"{"service": {"name": "redis", "port": 1234, "Meta": {"some": "meta"}},
                "node_meta": {"rack": "r1"}}"#,
        )
        .expect("parses");
        let toml = parse(
            "node_meta = { rack = \"r1\" }\n[service]\nname = \"redis\"\nport = 1234\n\
             Meta = { some = \"meta\" }\n",
        )
        .expect("parses");
        assert_eq!(json.local, toml.local);
        assert_eq!(json.local.services[0].service.port, 1234);
        assert_eq!(
            parse_json(" \n").expect("empty").local,
            LocalDefinitions::default()
        );
        let err = parse_json("{\"encrypt\": \"secret\",").unwrap_err();
        assert!(
            err.starts_with("line 1 column") && !err.contains("secret"),
            "{err}"
        );
        assert!(parse_json("[1]").is_err());
    }

    #[test]
    fn the_shipped_example_config_parses() {
        let defs = parse(include_str!("../../docs/vigil.example.toml"))
            .unwrap()
            .local;
        assert!(!defs.enable_script_checks);
        assert_eq!(defs.services.len(), 1);
        assert_eq!(defs.checks.len(), 2);
    }

    #[test]
    fn the_acl_table_is_consuls_acl_block() {
        let file = parse(
            "[acl]\ndefault_policy = \"deny\"\n[acl.tokens]\ninitial_management = \"root\"\nagent = \"a\"\n",
        )
        .unwrap();
        assert_eq!(
            file.acl,
            AclConfig {
                default_policy: Some(DefaultPolicy::Deny),
                initial_management: Some("root".into()),
                agent_token: Some("a".into()),
            }
        );
        let enabled = parse("[acl]\nenabled = true\n").unwrap();
        assert_eq!(enabled.acl.default_policy, Some(DefaultPolicy::Allow));
        assert_eq!(parse("").unwrap().acl, AclConfig::default());
        assert!(parse("[acl]\ndefault_policy = \"maybe\"\n").is_err());
        let err = parse("[acl]\ntokens = { master = \"x\" }\n").unwrap_err();
        assert!(err.contains("acl.tokens.master"), "{err}");
    }

    #[test]
    fn services_and_checks_in_config_spelling() {
        let defs = parse(
            r#"
            enable_script_checks = true

            [[service]]
            name = "web"
            port = 8080
            tags = ["v1"]
            meta = { Team = "core" }
            [[service.checks]]
            http = "http://127.0.0.1:8080/health"
            interval = "10s"
            deregister_critical_service_after = "5m"

            [[check]]
            id = "worker"
            name = "Worker heartbeat"
            ttl = "30s"

            [[checks]]
            name = "disk"
            args = ["/bin/true"]
            interval = "1m"
            "#,
        )
        .unwrap()
        .local;
        assert!(defs.enable_script_checks);
        assert_eq!(defs.services.len(), 1);
        let web = &defs.services[0];
        assert_eq!((web.service.id.as_str(), web.service.port), ("web", 8080));
        assert_eq!(web.service.meta["Team"], "core");
        assert_eq!(web.checks[0].id, "service:web");
        assert_eq!(
            web.checks[0].deregister_critical_after,
            Some(Duration::from_secs(300))
        );
        assert_eq!(defs.checks.len(), 2);
        assert_eq!(defs.checks[0].id, "worker");
        assert!(matches!(defs.checks[1].kind, CheckKind::Script { .. }));
    }

    #[test]
    fn errors_name_the_entry() {
        assert_eq!(
            parse("[[check]]\nname = \"x\"\n").unwrap_err(),
            "check #1: Invalid check: TTL must be > 0 for TTL checks"
        );
        assert_eq!(
            parse("[[service]]\nport = 1\n").unwrap_err(),
            "service #1: Missing service name"
        );
        assert!(
            parse("servce = 1")
                .unwrap_err()
                .contains("unknown key `servce`")
        );
        assert!(parse("[[check]\n").is_err(), "TOML syntax error");
    }

    #[test]
    fn the_gossip_key_and_the_script_switches() {
        let key = crate::gossip::generate_key();
        let file = parse(&format!(
            "encrypt = \"{key}\"\nenable_local_script_checks = true\n"
        ))
        .unwrap();
        assert!(file.encrypt.is_some());
        assert!(file.local.enable_local_script_checks);
        assert!(!file.local.enable_script_checks);
        assert!(parse("").unwrap().encrypt.is_none());
        assert_eq!(
            parse("enable_local_script_checks = 1").unwrap_err(),
            "`enable_local_script_checks` must be true or false"
        );
        let err = parse("encrypt = \"c2hvcnQ=\"").unwrap_err();
        assert!(
            err.starts_with("encrypt: the gossip key must decode to 16, 24 or 32 bytes"),
            "{err}"
        );
    }

    #[test]
    fn errors_never_quote_the_gossip_key() {
        let key = crate::gossip::generate_key();
        for text in [
            format!("encrypt = \"{key}"),
            format!("encrypt = \"{key}\" x"),
            format!("encrypt = \"{key}!\""),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(!err.contains(&key), "{err}");
            assert!(!err.contains(&key[..8]), "{err}");
        }
        assert!(
            parse(&format!("[[check]]\nname = \"x\"\nencrypt = \"{key}\" x\n"))
                .unwrap_err()
                .starts_with("line 3: "),
        );
    }
}
