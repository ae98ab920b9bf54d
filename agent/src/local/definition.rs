//! Service and check definitions as Consul's agent API and config files spell them, parsed and
//! validated into typed values. Field names match case-insensitively (Go's `encoding/json`), the
//! config file's snake_case spellings (`deregister_critical_service_after`) and Consul's aliases
//! (`args`, `script_args`) name the same fields, unknown fields are refused with Go's message,
//! and durations are Go strings or nanosecond numbers. Every refusal carries Consul's text.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use vigil_shared::catalog::{HealthStatus, Service, ServiceAddress, Weights};
use vigil_shared::go::duration::{duration_ns_from_json, format_go_duration, parse_go_duration_ns};

/// Checks never run more often than this (Consul's `checks.MinInterval`).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// `DeregisterCriticalServiceAfter` is raised to at least this.
pub const MIN_DEREGISTER_AFTER: Duration = Duration::from_secs(60);
/// Captured check output is capped at this many bytes unless a check asks for less.
pub const DEFAULT_OUTPUT_MAX: usize = 4096;

/// Why a definition was refused. The HTTP layer maps each to its status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// The body is not JSON of the right shape: `Request decode failed: …` (400).
    #[error("Request decode failed: {0}")]
    Decode(String),
    #[error("Missing check name")]
    MissingCheckName,
    #[error("Bad check status")]
    BadCheckStatus,
    /// A TTL update with a status other than passing, warning or critical.
    #[error("Invalid check status: '{0}'")]
    InvalidCheckStatus(String),
    #[error("Status for checks must 'passing', 'warning', 'critical'")]
    BadServiceCheckStatus,
    /// A check that breaks Consul's type rules: `Invalid check: …`.
    #[error("Invalid check: {0}")]
    InvalidCheck(String),
    #[error("Missing service name")]
    MissingServiceName,
    #[error("Invalid service address")]
    InvalidServiceAddress,
    /// A `lan_ipv4`/`wan_ipv4` (`…_ipv6`) tagged address that is not such an address.
    #[error("Service tagged address {0:?} must be a valid {1} address")]
    InvalidTaggedAddress(String, &'static str),
    #[error("Invalid Weights: {0}")]
    InvalidWeights(String),
    #[error("Invalid Service Meta: {0}")]
    InvalidMeta(String),
    /// A Consul feature Vigil does not implement (Connect, gRPC checks, ...), named.
    #[error("{0}")]
    Unsupported(String),
}

/// What a check runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// Updated through `/v1/agent/check/{pass,warn,fail,update}`; critical once `ttl` passes
    /// without an update.
    Ttl {
        ttl: Duration,
    },
    Http(HttpCheck),
    /// Passing when a TCP connection to `addr` succeeds.
    Tcp {
        addr: String,
        interval: Duration,
    },
    /// Runs `args` (no shell): exit 0 passing, 1 warning, anything else critical.
    Script {
        args: Vec<String>,
        interval: Duration,
    },
    /// Follows a local process (Vigil's `ProcessID`): passing while it runs, critical the
    /// moment it exits (Linux pidfd). A stopped or slow process is still running.
    Process {
        pid: u32,
    },
    /// Node or service maintenance mode: critical while it exists, no runner.
    Maintenance,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCheck {
    pub url: String,
    /// Empty means GET.
    pub method: String,
    pub header: BTreeMap<String, Vec<String>>,
    pub body: String,
    pub disable_redirects: bool,
    pub tls_server_name: String,
    pub tls_skip_verify: bool,
    pub interval: Duration,
}

/// Consul's failure and success thresholds for interval checks (0: report at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Thresholds {
    pub success_before_passing: u32,
    pub failures_before_warning: u32,
    pub failures_before_critical: u32,
}

/// A validated check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckDefinition {
    pub id: String,
    pub name: String,
    pub notes: String,
    /// Empty for a node-level check.
    pub service_id: String,
    /// The status it starts in (Consul: critical unless given).
    pub initial_status: HealthStatus,
    pub kind: CheckKind,
    /// As given; each runner applies its own default when unset.
    pub timeout: Option<Duration>,
    /// As given (the reaper raises it to [`MIN_DEREGISTER_AFTER`]).
    pub deregister_critical_after: Option<Duration>,
    pub thresholds: Thresholds,
    /// Cap on captured output in bytes (already defaulted and capped at [`DEFAULT_OUTPUT_MAX`]).
    pub output_max_size: usize,
}

impl CheckDefinition {
    /// Consul's `Type` string.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            CheckKind::Ttl { .. } => "ttl",
            CheckKind::Http(_) => "http",
            CheckKind::Tcp { .. } => "tcp",
            CheckKind::Script { .. } => "script",
            CheckKind::Process { .. } => "process",
            CheckKind::Maintenance => "maintenance",
        }
    }

    /// How often an interval check runs, as registered (`None` for TTL and maintenance).
    pub fn interval(&self) -> Option<Duration> {
        match &self.kind {
            CheckKind::Http(h) => Some(h.interval),
            CheckKind::Tcp { interval, .. } | CheckKind::Script { interval, .. } => Some(*interval),
            CheckKind::Ttl { .. } | CheckKind::Process { .. } | CheckKind::Maintenance => None,
        }
    }

    pub fn is_script(&self) -> bool {
        matches!(self.kind, CheckKind::Script { .. })
    }

    /// Consul's `Definition` object (`HealthCheckDefinition`): the check's target and timing,
    /// every member omitted when empty, durations as Go strings.
    pub fn definition_json(&self) -> Value {
        let mut out = Map::new();
        let mut duration = |name: &str, d: Option<Duration>| {
            if let Some(d) = d.filter(|d| !d.is_zero()) {
                out.insert(name.to_owned(), Value::from(format_go_duration(d)));
            }
        };
        duration("Interval", self.interval());
        duration("Timeout", self.timeout);
        duration(
            "DeregisterCriticalServiceAfter",
            self.deregister_critical_after,
        );
        if self.output_max_size != DEFAULT_OUTPUT_MAX {
            out.insert("OutputMaxSize".into(), Value::from(self.output_max_size));
        }
        match &self.kind {
            CheckKind::Http(h) => {
                out.insert("HTTP".into(), Value::from(h.url.as_str()));
                if !h.tls_server_name.is_empty() {
                    out.insert(
                        "TLSServerName".into(),
                        Value::from(h.tls_server_name.as_str()),
                    );
                }
                if h.tls_skip_verify {
                    out.insert("TLSSkipVerify".into(), Value::Bool(true));
                }
                if !h.header.is_empty() {
                    let header = h
                        .header
                        .iter()
                        .map(|(k, v)| (k.clone(), Value::from(v.clone())))
                        .collect();
                    out.insert("Header".into(), Value::Object(header));
                }
                if !h.method.is_empty() {
                    out.insert("Method".into(), Value::from(h.method.as_str()));
                }
                if !h.body.is_empty() {
                    out.insert("Body".into(), Value::from(h.body.as_str()));
                }
                if h.disable_redirects {
                    out.insert("DisableRedirects".into(), Value::Bool(true));
                }
            }
            CheckKind::Tcp { addr, .. } => {
                out.insert("TCP".into(), Value::from(addr.as_str()));
            }
            CheckKind::Script { args, .. } => {
                out.insert("ScriptArgs".into(), Value::from(args.clone()));
            }
            CheckKind::Process { pid } => {
                out.insert("ProcessID".into(), Value::from(*pid));
            }
            CheckKind::Ttl { .. } | CheckKind::Maintenance => {}
        }
        Value::Object(out)
    }
}

/// A validated service with the checks declared inside it (their IDs already assigned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceDefinition {
    /// The service; its node and indexes are left for the agent and the catalog to fill in.
    pub service: Service,
    pub checks: Vec<CheckDefinition>,
}

/// The members of a check object, normalized (see [`normalize_key`]). `id`/`checkid` and the
/// `proxy*` members appear in service checks, `token`/`serviceid` in check registrations.
const CHECK_FIELDS: &[&str] = &[
    "id",
    "checkid",
    "name",
    "notes",
    "serviceid",
    "token",
    "status",
    "scriptargs",
    "args",
    "http",
    "header",
    "method",
    "body",
    "disableredirects",
    "tcp",
    "tcpusetls",
    "udp",
    "interval",
    "timeout",
    "ttl",
    "deregistercriticalserviceafter",
    "dockercontainerid",
    "shell",
    "grpc",
    "grpcusetls",
    "h2ping",
    "h2pingusetls",
    "osservice",
    "tlsservername",
    "tlsskipverify",
    "aliasnode",
    "aliasservice",
    "successbeforepassing",
    "failuresbeforewarning",
    "failuresbeforecritical",
    "outputmaxsize",
    "processid",
    "proxyhttp",
    "proxygrpc",
];

const SERVICE_FIELDS: &[&str] = &[
    "kind",
    "id",
    "name",
    "tags",
    "address",
    "taggedaddresses",
    "meta",
    "port",
    "socketpath",
    "check",
    "checks",
    "weights",
    "token",
    "enabletagoverride",
    "proxy",
    "connect",
    "locality",
];

const WEIGHTS_FIELDS: &[&str] = &["passing", "warning"];

/// Lowercased with underscores dropped: `DeregisterCriticalServiceAfter`,
/// `deregistercriticalserviceafter` and `deregister_critical_service_after` are one field.
fn normalize_key(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Checks `obj`'s members against `allowed`, then returns it with normalized keys and without
/// `null` members (Go leaves a field at its zero value for `null`). Members named in `opaque`
/// (free-form maps) are passed through untouched.
fn normalize_object(
    obj: Map<String, Value>,
    allowed: &[&str],
) -> Result<Map<String, Value>, DefinitionError> {
    let mut out = Map::new();
    for (key, value) in obj {
        let norm = normalize_key(&key);
        if !allowed.contains(&norm.as_str()) {
            return Err(DefinitionError::Decode(format!(
                "json: unknown field {}",
                serde_json::to_string(&key).unwrap_or(key)
            )));
        }
        if !value.is_null() {
            out.insert(norm, value);
        }
    }
    Ok(out)
}

fn expect_object(value: Value, what: &str) -> Result<Map<String, Value>, DefinitionError> {
    match value {
        Value::Object(map) => Ok(map),
        other => Err(DefinitionError::Decode(format!(
            "json: cannot unmarshal {} into Go value of type {what}",
            json_kind(&other)
        ))),
    }
}

/// Go's name for a JSON value's kind in decode errors.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn decode<T: for<'de> Deserialize<'de>>(map: Map<String, Value>) -> Result<T, DefinitionError> {
    serde_json::from_value(Value::Object(map)).map_err(|e| DefinitionError::Decode(e.to_string()))
}

/// A check object as sent, members normalized.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawCheck {
    id: String,
    checkid: String,
    name: String,
    notes: String,
    serviceid: String,
    status: String,
    scriptargs: Vec<String>,
    args: Vec<String>,
    http: String,
    header: BTreeMap<String, Vec<String>>,
    method: String,
    body: String,
    disableredirects: bool,
    tcp: String,
    tcpusetls: bool,
    udp: String,
    interval: Option<Value>,
    timeout: Option<Value>,
    ttl: Option<Value>,
    deregistercriticalserviceafter: Option<Value>,
    dockercontainerid: String,
    grpc: String,
    h2ping: String,
    osservice: String,
    tlsservername: String,
    tlsskipverify: bool,
    aliasnode: String,
    aliasservice: String,
    successbeforepassing: i64,
    failuresbeforewarning: i64,
    failuresbeforecritical: i64,
    outputmaxsize: i64,
    processid: i64,
}

/// A duration member: a Go duration string or a number of nanoseconds (signed, as Go's
/// `time.Duration`; validation rejects what must be positive).
fn duration_ns(value: Option<&Value>) -> Result<i64, DefinitionError> {
    match value {
        None => Ok(0),
        Some(Value::String(s)) => {
            parse_go_duration_ns(s).map_err(|e| DefinitionError::Decode(e.to_string()))
        }
        Some(Value::Number(n)) => {
            duration_ns_from_json(n).map_err(|e| DefinitionError::Decode(e.to_string()))
        }
        Some(other) => Err(DefinitionError::Decode(format!(
            "json: cannot unmarshal {} into a duration",
            json_kind(other)
        ))),
    }
}

fn positive(ns: i64) -> Option<Duration> {
    (ns > 0).then(|| Duration::from_nanos(ns as u64))
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

impl RawCheck {
    fn parse(value: Value) -> Result<RawCheck, DefinitionError> {
        let obj = expect_object(value, "structs.CheckDefinition")?;
        decode(normalize_object(obj, CHECK_FIELDS)?)
    }

    /// Consul's `CheckType.IsEmpty`: a `Check: {}` in a service is ignored.
    fn is_empty(&self) -> bool {
        self.scriptargs.is_empty()
            && self.args.is_empty()
            && self.http.is_empty()
            && self.tcp.is_empty()
            && self.udp.is_empty()
            && self.grpc.is_empty()
            && self.h2ping.is_empty()
            && self.osservice.is_empty()
            && self.aliasnode.is_empty()
            && self.aliasservice.is_empty()
            && self.dockercontainerid.is_empty()
            && self.processid == 0
            && self.interval.is_none()
            && self.ttl.is_none()
            && self.timeout.is_none()
            && self.name.is_empty()
            && self.id.is_empty()
            && self.checkid.is_empty()
            && self.status.is_empty()
            && self.notes.is_empty()
    }

    fn script_args(&self) -> &[String] {
        if self.scriptargs.is_empty() {
            &self.args
        } else {
            &self.scriptargs
        }
    }

    /// Consul's `CheckType.Validate`, then Vigil's refusal of check types it does not run.
    fn kind(&self) -> Result<(CheckKind, Option<Duration>), DefinitionError> {
        let invalid = |m: &str| Err(DefinitionError::InvalidCheck(m.to_owned()));
        let interval = duration_ns(self.interval.as_ref())?;
        let ttl = duration_ns(self.ttl.as_ref())?;
        let timeout = duration_ns(self.timeout.as_ref())?;
        let script = !self.script_args().is_empty();
        let alias = !self.aliasnode.is_empty() || !self.aliasservice.is_empty();
        let interval_check = script
            || !self.http.is_empty()
            || !self.tcp.is_empty()
            || !self.udp.is_empty()
            || !self.grpc.is_empty()
            || !self.h2ping.is_empty()
            || !self.osservice.is_empty();
        if self.processid != 0 {
            return self.process_kind(interval, ttl, interval_check || alias);
        }
        if interval > 0 && ttl > 0 {
            return invalid("Interval and TTL cannot both be specified");
        }
        if interval_check && interval <= 0 {
            return invalid(
                "Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or OSService checks",
            );
        }
        if interval_check && alias {
            return invalid("Interval cannot be set for Alias checks");
        }
        if alias && ttl > 0 {
            return invalid("TTL must be not be set for Alias checks");
        }
        if !interval_check && !alias && ttl <= 0 {
            return invalid("TTL must be > 0 for TTL checks");
        }
        if self.outputmaxsize < 0 {
            return invalid("MaxOutputMaxSize must be positive");
        }
        if self.failuresbeforewarning > self.failuresbeforecritical {
            return invalid("FailuresBeforeWarning can't be higher than FailuresBeforeCritical");
        }
        let interval = Duration::from_nanos(interval.max(0) as u64);
        let unsupported = |what: &str| {
            Err(DefinitionError::Unsupported(format!(
                "Invalid check: {what} checks are not supported by Vigil (TTL, HTTP, TCP and script checks are)"
            )))
        };
        // Consul's type precedence: grpc, http, ttl, tcp, udp, alias, docker, script, h2ping,
        // os_service.
        let kind = if !self.grpc.is_empty() {
            return unsupported("gRPC");
        } else if !self.http.is_empty() {
            if self
                .http
                .get(..8)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
            {
                return unsupported("HTTPS");
            }
            CheckKind::Http(HttpCheck {
                url: self.http.clone(),
                method: self.method.clone(),
                header: self.header.clone(),
                body: self.body.clone(),
                disable_redirects: self.disableredirects,
                tls_server_name: self.tlsservername.clone(),
                tls_skip_verify: self.tlsskipverify,
                interval,
            })
        } else if ttl > 0 {
            CheckKind::Ttl {
                ttl: Duration::from_nanos(ttl as u64),
            }
        } else if !self.tcp.is_empty() {
            if self.tcpusetls {
                return unsupported("TCP-over-TLS");
            }
            CheckKind::Tcp {
                addr: self.tcp.clone(),
                interval,
            }
        } else if !self.udp.is_empty() {
            return unsupported("UDP");
        } else if alias {
            return unsupported("Alias");
        } else if !self.dockercontainerid.is_empty() {
            return unsupported("Docker");
        } else if script {
            CheckKind::Script {
                args: self.script_args().to_vec(),
                interval,
            }
        } else if !self.h2ping.is_empty() {
            return unsupported("H2PING");
        } else {
            return unsupported("OSService");
        };
        Ok((kind, positive(timeout)))
    }

    /// A `ProcessID` check (Vigil's own kind): the process alone decides, so nothing that
    /// schedules or names another kind of check may come with it.
    fn process_kind(
        &self,
        interval: i64,
        ttl: i64,
        other_kind: bool,
    ) -> Result<(CheckKind, Option<Duration>), DefinitionError> {
        let invalid = |m: &str| Err(DefinitionError::InvalidCheck(m.to_owned()));
        if other_kind || interval != 0 || ttl != 0 {
            return invalid(
                "ProcessID cannot be combined with another check type, Interval or TTL",
            );
        }
        let Some(pid) = u32::try_from(self.processid).ok().filter(|&p| p > 0) else {
            return invalid("ProcessID must be a positive process ID");
        };
        if !cfg!(target_os = "linux") {
            return Err(DefinitionError::Unsupported(
                "Invalid check: process checks need Linux (pidfd)".to_owned(),
            ));
        }
        Ok((CheckKind::Process { pid }, None))
    }

    /// Everything but the ID, name and service, which the two callers fill in differently.
    fn definition(&self, initial_status: HealthStatus) -> Result<CheckDefinition, DefinitionError> {
        let (kind, timeout) = self.kind()?;
        let failures_before_critical = count(self.failuresbeforecritical);
        let failures_before_warning = match count(self.failuresbeforewarning) {
            // Unset takes FailuresBeforeCritical's value.
            0 => failures_before_critical,
            n => n,
        };
        let output_max_size = match usize::try_from(self.outputmaxsize).unwrap_or(0) {
            0 => DEFAULT_OUTPUT_MAX,
            n => n.min(DEFAULT_OUTPUT_MAX),
        };
        Ok(CheckDefinition {
            id: String::new(),
            name: String::new(),
            notes: self.notes.clone(),
            service_id: String::new(),
            initial_status,
            kind,
            timeout,
            deregister_critical_after: positive(duration_ns(
                self.deregistercriticalserviceafter.as_ref(),
            )?),
            thresholds: Thresholds {
                success_before_passing: count(self.successbeforepassing),
                failures_before_warning,
                failures_before_critical,
            },
            output_max_size,
        })
    }
}

fn parse_json(body: &[u8]) -> Result<Value, DefinitionError> {
    serde_json::from_slice(body).map_err(|e| DefinitionError::Decode(e.to_string()))
}

/// `PUT /v1/agent/check/register`'s body (and a config file's `check`), validated in Consul's
/// order: decode, name, status, type rules. Whether `ServiceID` exists is the caller's question.
pub fn parse_check(value: Value) -> Result<CheckDefinition, DefinitionError> {
    let raw = RawCheck::parse(value)?;
    if raw.name.is_empty() {
        return Err(DefinitionError::MissingCheckName);
    }
    let status = match raw.status.as_str() {
        "" => HealthStatus::Critical,
        s => HealthStatus::parse(s).ok_or(DefinitionError::BadCheckStatus)?,
    };
    let mut check = raw.definition(status)?;
    check.id = [&raw.id, &raw.checkid, &raw.name]
        .into_iter()
        .find(|s| !s.is_empty())
        .cloned()
        .unwrap_or_default();
    check.name = raw.name;
    check.service_id = raw.serviceid;
    Ok(check)
}

pub fn parse_check_body(body: &[u8]) -> Result<CheckDefinition, DefinitionError> {
    parse_check(parse_json(body)?)
}

const UPDATE_FIELDS: &[&str] = &["status", "output"];

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawUpdate {
    status: String,
    output: String,
}

/// `PUT /v1/agent/check/update/<id>`'s body `{"Status": ..., "Output": ...}`: the status and
/// output (not yet truncated).
pub fn parse_check_update(body: &[u8]) -> Result<(HealthStatus, String), DefinitionError> {
    let obj = normalize_object(
        expect_object(parse_json(body)?, "agent.checkUpdate")?,
        UPDATE_FIELDS,
    )?;
    let raw: RawUpdate = decode(obj)?;
    let status = HealthStatus::parse(&raw.status)
        .ok_or_else(|| DefinitionError::InvalidCheckStatus(raw.status.clone()))?;
    Ok((status, raw.output))
}

#[derive(Debug, Deserialize)]
struct RawWeights {
    #[serde(default)]
    passing: i64,
    #[serde(default)]
    warning: i64,
}

/// A service object as sent, members normalized; `check`/`checks` are parsed separately.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawService {
    kind: String,
    id: String,
    name: String,
    tags: Vec<String>,
    address: String,
    taggedaddresses: BTreeMap<String, Value>,
    meta: BTreeMap<String, String>,
    port: u16,
    socketpath: String,
    enabletagoverride: bool,
    proxy: Option<Value>,
    connect: Option<Value>,
    locality: Option<Value>,
}

/// Consul's `ValidateWeights`.
fn weights(value: Option<Value>) -> Result<Weights, DefinitionError> {
    let Some(value) = value else {
        return Ok(Weights::default());
    };
    let obj = normalize_object(expect_object(value, "structs.Weights")?, WEIGHTS_FIELDS)?;
    let w: RawWeights = decode(obj)?;
    let invalid = |m: &str| Err(DefinitionError::InvalidWeights(m.to_owned()));
    if w.passing < 1 {
        return invalid("Passing must be greater than 0");
    }
    if w.warning < 0 {
        return invalid("Warning must be greater or equal than 0");
    }
    if w.passing > 65535 || w.warning > 65535 {
        return invalid("DNS Weight must be between 0 and 65535");
    }
    Ok(Weights {
        passing: w.passing,
        warning: w.warning,
    })
}

/// Consul's `ValidateServiceMetadata` (limits on pairs, key syntax and lengths, `consul-`).
pub fn validate_meta(meta: &BTreeMap<String, String>) -> Result<(), DefinitionError> {
    const MAX_PAIRS: usize = 64;
    const MAX_KEY: usize = 128;
    const MAX_VALUE: usize = 512;
    if meta.len() > MAX_PAIRS {
        return Err(DefinitionError::InvalidMeta(format!(
            "Node metadata cannot contain more than {MAX_PAIRS} key/value pairs"
        )));
    }
    for (key, value) in meta {
        let problem = if key.is_empty() {
            Some("Key cannot be blank".to_owned())
        } else if !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            Some("Key contains invalid characters".to_owned())
        } else if key.len() > MAX_KEY {
            Some(format!("Key is too long (limit: {MAX_KEY} characters)"))
        } else if key.starts_with("consul-") {
            Some("Key prefix 'consul-' is reserved for internal use".to_owned())
        } else if value.len() > MAX_VALUE {
            Some(format!("Value is too long (limit: {MAX_VALUE} characters)"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(DefinitionError::InvalidMeta(format!(
                "Couldn't load metadata pair ('{key}', '{value}'): {problem}"
            )));
        }
    }
    Ok(())
}

/// `PUT /v1/agent/service/register`'s body (and a config file's `service`), validated in
/// Consul's order. Embedded checks get `service:<id>` IDs (`service:<id>:<n>` when there are
/// several) and the name `Service '<name>' check` unless they carry their own.
pub fn parse_service(value: Value) -> Result<ServiceDefinition, DefinitionError> {
    let mut obj = normalize_object(
        expect_object(value, "structs.ServiceDefinition")?,
        SERVICE_FIELDS,
    )?;
    let check = obj.remove("check");
    let checks = obj.remove("checks");
    let weights_value = obj.remove("weights");
    let raw: RawService = decode(obj)?;
    if raw.name.is_empty() {
        return Err(DefinitionError::MissingServiceName);
    }
    if raw
        .address
        .trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
    {
        return Err(DefinitionError::InvalidServiceAddress);
    }
    let unsupported = |field: &str| {
        Err(DefinitionError::Unsupported(format!(
            "Vigil does not support {field} on services"
        )))
    };
    if !raw.kind.is_empty() {
        return unsupported("Kind (Connect proxies and gateways)");
    }
    if !raw.socketpath.is_empty() {
        return unsupported("SocketPath");
    }
    let tagged_addresses = service_addresses(raw.taggedaddresses)?;
    check_tagged_families(&tagged_addresses)?;
    let present = |v: &Option<Value>| {
        v.as_ref()
            .is_some_and(|v| !matches!(v, Value::Object(m) if m.is_empty()))
    };
    if present(&raw.proxy) || present(&raw.connect) {
        return unsupported("Connect");
    }
    if present(&raw.locality) {
        return unsupported("Locality");
    }
    let weights = weights(weights_value)?;
    validate_meta(&raw.meta)?;

    let id = if raw.id.is_empty() {
        raw.name.clone()
    } else {
        raw.id.clone()
    };
    let mut raw_checks = Vec::new();
    if let Some(check) = check {
        let check = RawCheck::parse(check)?;
        if !check.is_empty() {
            raw_checks.push(check);
        }
    }
    match checks {
        None => {}
        Some(Value::Array(items)) => {
            for item in items {
                raw_checks.push(RawCheck::parse(item)?);
            }
        }
        Some(other) => {
            return Err(DefinitionError::Decode(format!(
                "json: cannot unmarshal {} into Go struct field ServiceDefinition.Checks of type structs.CheckTypes",
                json_kind(&other)
            )));
        }
    }
    // Type rules first for every check, then statuses, as Consul's handler does.
    let mut definitions = raw_checks
        .iter()
        .map(|c| c.definition(HealthStatus::Critical))
        .collect::<Result<Vec<_>, _>>()?;
    let several = raw_checks.len() > 1;
    for (i, (raw_check, def)) in raw_checks.iter().zip(&mut definitions).enumerate() {
        def.initial_status = match raw_check.status.as_str() {
            "" => HealthStatus::Critical,
            s => HealthStatus::parse(s).ok_or(DefinitionError::BadServiceCheckStatus)?,
        };
        def.id = [&raw_check.checkid, &raw_check.id]
            .into_iter()
            .find(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| {
                if several {
                    format!("service:{id}:{}", i + 1)
                } else {
                    format!("service:{id}")
                }
            });
        def.name = if raw_check.name.is_empty() {
            format!("Service '{}' check", raw.name)
        } else {
            raw_check.name.clone()
        };
        def.service_id = id.clone();
    }
    Ok(ServiceDefinition {
        service: Service {
            id,
            name: raw.name,
            tags: raw.tags,
            address: raw.address,
            port: raw.port,
            tagged_addresses,
            meta: raw.meta,
            weights,
            enable_tag_override: raw.enabletagoverride,
            ..Service::default()
        },
        checks: definitions,
    })
}

/// A service's `TaggedAddresses` (`{"lan": {"Address": "…", "Port": 8080}, …}`, the inner
/// names in any case).
pub fn service_addresses(
    tagged: BTreeMap<String, Value>,
) -> Result<BTreeMap<String, ServiceAddress>, DefinitionError> {
    let mut out = BTreeMap::new();
    for (tag, value) in tagged {
        let obj = normalize_object(
            expect_object(value, "structs.ServiceAddress")?,
            &["address", "port"],
        )?;
        let address: RawServiceAddress = decode(obj)?;
        out.insert(
            tag,
            ServiceAddress {
                address: address.address,
                port: address.port,
            },
        );
    }
    Ok(out)
}

/// Consul's agent check that `lan_ipv4`/`wan_ipv4` hold an IPv4 address and
/// `lan_ipv6`/`wan_ipv6` an IPv6 one.
fn check_tagged_families(tagged: &BTreeMap<String, ServiceAddress>) -> Result<(), DefinitionError> {
    for (tag, address) in tagged {
        let (name, v4) = match tag.as_str() {
            "lan_ipv4" | "wan_ipv4" => ("ipv4", true),
            "lan_ipv6" | "wan_ipv6" => ("ipv6", false),
            _ => continue,
        };
        let ok = match address.address.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => v4,
            Ok(IpAddr::V6(_)) => !v4,
            Err(_) => false,
        };
        if !ok {
            return Err(DefinitionError::InvalidTaggedAddress(tag.clone(), name));
        }
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawServiceAddress {
    address: String,
    port: u16,
}

pub fn parse_service_body(body: &[u8]) -> Result<ServiceDefinition, DefinitionError> {
    parse_service(parse_json(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_err(v: Value) -> String {
        parse_check(v).unwrap_err().to_string()
    }

    #[test]
    fn ttl_check_with_defaults() {
        let c = parse_check(json!({"Name": "mem", "TTL": "15s"})).unwrap();
        assert_eq!(c.id, "mem", "ID defaults to Name");
        assert_eq!(c.initial_status, HealthStatus::Critical);
        assert_eq!(
            c.kind,
            CheckKind::Ttl {
                ttl: Duration::from_secs(15)
            }
        );
        assert_eq!(c.type_name(), "ttl");
        assert_eq!(c.output_max_size, DEFAULT_OUTPUT_MAX);
        assert_eq!(c.definition_json(), json!({}));
    }

    #[test]
    fn field_names_match_in_any_case_and_snake_case() {
        let c = parse_check(json!({
            "name": "web", "id": "w1", "http": "http://x/", "interval": 2_000_000_000u64,
            "Service_ID": "", "tls_skip_verify": true, "DEREGISTER_CRITICAL_SERVICE_AFTER": "90s",
            "Header": {"X-Custom": ["a"]}, "status": "passing", "Notes": null,
        }))
        .unwrap();
        assert_eq!(c.id, "w1");
        assert_eq!(c.initial_status, HealthStatus::Passing);
        let CheckKind::Http(h) = &c.kind else {
            panic!("not HTTP: {:?}", c.kind)
        };
        assert_eq!(
            h.interval,
            Duration::from_secs(2),
            "a number is nanoseconds"
        );
        assert!(h.tls_skip_verify);
        assert_eq!(h.header["X-Custom"], ["a"], "header names keep their case");
        assert_eq!(c.deregister_critical_after, Some(Duration::from_secs(90)));
        assert_eq!(
            c.definition_json(),
            json!({"Interval": "2s", "DeregisterCriticalServiceAfter": "1m30s",
                   "HTTP": "http://x/", "TLSSkipVerify": true, "Header": {"X-Custom": ["a"]}})
        );
    }

    #[test]
    fn script_aliases() {
        for key in ["Args", "ScriptArgs", "script_args", "args"] {
            let c =
                parse_check(json!({"Name": "s", key: ["/bin/true"], "Interval": "1s"})).unwrap();
            assert_eq!(
                c.kind,
                CheckKind::Script {
                    args: vec!["/bin/true".into()],
                    interval: Duration::from_secs(1)
                },
                "{key}"
            );
        }
    }

    #[test]
    fn consul_validation_messages() {
        assert_eq!(check_err(json!({"TTL": "1s"})), "Missing check name");
        assert_eq!(
            check_err(json!({"Name": "x", "TTL": "1s", "Status": "up"})),
            "Bad check status"
        );
        assert_eq!(
            check_err(json!({"Name": "x", "TTL": "1s", "Interval": "1s"})),
            "Invalid check: Interval and TTL cannot both be specified"
        );
        assert_eq!(
            check_err(json!({"Name": "x", "HTTP": "http://x/"})),
            "Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or OSService checks"
        );
        assert_eq!(
            check_err(json!({"Name": "x"})),
            "Invalid check: TTL must be > 0 for TTL checks"
        );
        assert_eq!(
            check_err(json!({"Name": "x", "TTL": "-1s"})),
            "Invalid check: TTL must be > 0 for TTL checks"
        );
        assert_eq!(
            check_err(json!({"Name": "x", "TTL": "1s", "FailuresBeforeWarning": 2})),
            "Invalid check: FailuresBeforeWarning can't be higher than FailuresBeforeCritical"
        );
        assert_eq!(
            check_err(json!({"Name": "x", "TTL": "1s", "Bogus": 1})),
            "Request decode failed: json: unknown field \"Bogus\""
        );
        assert_eq!(
            check_err(json!({"Name": "x", "TTL": "10z"})),
            "Request decode failed: time: unknown unit \"z\" in duration \"10z\""
        );
        assert!(
            check_err(json!({"Name": "x", "GRPC": "h:1", "Interval": "1s"}))
                .contains("gRPC checks are not supported")
        );
        assert!(
            check_err(json!({"Name": "x", "HTTP": "HTTPS://h/", "Interval": "1s"}))
                .contains("HTTPS checks are not supported")
        );
    }

    #[test]
    fn check_update_bodies() {
        assert_eq!(
            parse_check_update(br#"{"status":"warning","Output":"slow"}"#).unwrap(),
            (HealthStatus::Warning, "slow".to_owned())
        );
        let err = |b: &[u8]| parse_check_update(b).unwrap_err().to_string();
        assert_eq!(err(br#"{"Status":"up"}"#), "Invalid check status: 'up'");
        assert_eq!(err(br#"{"Output":"x"}"#), "Invalid check status: ''");
        assert_eq!(
            err(br#"{"Status":"passing","Note":"x"}"#),
            "Request decode failed: json: unknown field \"Note\""
        );
        assert!(err(b"nope").starts_with("Request decode failed: "));
    }

    #[test]
    fn thresholds_default_warning_to_critical() {
        let c = parse_check(json!({"Name": "x", "TCP": "h:1", "Interval": "1s",
            "FailuresBeforeCritical": 3, "SuccessBeforePassing": 2}))
        .unwrap();
        assert_eq!(
            c.thresholds,
            Thresholds {
                success_before_passing: 2,
                failures_before_warning: 3,
                failures_before_critical: 3
            }
        );
    }

    #[test]
    fn output_max_size_only_lowers_the_cap() {
        let size = |n: u64| {
            parse_check(json!({"Name": "x", "TTL": "1s", "OutputMaxSize": n}))
                .unwrap()
                .output_max_size
        };
        assert_eq!(size(0), DEFAULT_OUTPUT_MAX);
        assert_eq!(size(100), 100);
        assert_eq!(size(100_000), DEFAULT_OUTPUT_MAX);
    }

    #[test]
    fn service_with_checks_gets_consul_ids_and_names() {
        let s = parse_service(json!({
            "Name": "web", "Port": 80, "Tags": ["a"], "Meta": {"Env": "x"},
            "Checks": [{"TTL": "5s"}, {"TCP": "h:1", "Interval": "1s", "Name": "tcp"}],
        }))
        .unwrap();
        assert_eq!(s.service.id, "web");
        assert_eq!(s.service.weights, Weights::default());
        assert_eq!(s.service.meta["Env"], "x");
        let ids: Vec<&str> = s.checks.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["service:web:1", "service:web:2"]);
        assert_eq!(s.checks[0].name, "Service 'web' check");
        assert_eq!(s.checks[1].name, "tcp");
        assert!(s.checks.iter().all(|c| c.service_id == "web"));

        let one =
            parse_service(json!({"name": "db", "id": "db1", "check": {"ttl": "5s"}})).unwrap();
        assert_eq!(one.checks[0].id, "service:db1");
        let empty = parse_service(json!({"Name": "db", "Check": {}})).unwrap();
        assert!(empty.checks.is_empty(), "an empty Check is ignored");
    }

    #[test]
    fn service_validation_messages() {
        let err = |v: Value| parse_service(v).unwrap_err().to_string();
        assert_eq!(err(json!({"Port": 1})), "Missing service name");
        assert_eq!(
            err(json!({"Name": "a", "Address": "0.0.0.0"})),
            "Invalid service address"
        );
        assert_eq!(
            err(json!({"Name": "a", "Weights": {"Passing": 0, "Warning": 1}})),
            "Invalid Weights: Passing must be greater than 0"
        );
        assert_eq!(
            err(json!({"Name": "a", "Meta": {"consul-x": "1"}})),
            "Invalid Service Meta: Couldn't load metadata pair ('consul-x', '1'): Key prefix 'consul-' is reserved for internal use"
        );
        assert_eq!(
            err(json!({"Name": "a", "Check": {"TTL": "1s", "Status": "bad"}})),
            "Status for checks must 'passing', 'warning', 'critical'"
        );
        assert_eq!(
            err(json!({"Name": "a", "Checks": [{"HTTP": "http://x/"}]})),
            "Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or OSService checks"
        );
        assert_eq!(
            err(json!({"Name": "a", "Nope": 1})),
            "Request decode failed: json: unknown field \"Nope\""
        );
        assert!(err(json!({"Name": "a", "Connect": {"Native": true}})).contains("Connect"));
    }
}
