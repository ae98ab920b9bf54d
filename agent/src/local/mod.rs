//! The agent's own services and checks: the source of truth for what this node runs and how
//! healthy it is. [`LocalState`] owns them and their runners; the catalog gets a copy through
//! anti-entropy ([`sync`]).
//!
//! Invariants: the state sits behind one `parking_lot::Mutex`, only ever held for a few
//! instructions and never across an `.await`. Every change stamps the entry with a new
//! generation; a sync marks an entry synced only for the generation it pushed, so a change that
//! races a sync is pushed by the next one. A removed service or check is remembered until its
//! deregistration reached the catalog. A check's runner lives exactly as long as its entry
//! (dropping the [`runner::RunnerHandle`] stops it).

pub mod definition;
pub mod reload;
pub mod runner;
pub mod sync;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_shared::catalog::{Check, HealthStatus, Service};

use crate::backend::Backend;
use crate::config::LocalDefinitions;
use definition::{CheckDefinition, CheckKind, DefinitionError, ServiceDefinition};
use runner::RunnerHandle;

/// Check ID of node maintenance mode.
pub const NODE_MAINTENANCE: &str = "_node_maintenance";
/// Check ID prefix of a service's maintenance mode (`_service_maintenance:<service ID>`).
pub const SERVICE_MAINTENANCE_PREFIX: &str = "_service_maintenance:";
const DEFAULT_NODE_MAINTENANCE_REASON: &str = "Maintenance mode is enabled for this node, but no reason was provided. This is a default message.";
const DEFAULT_SERVICE_MAINTENANCE_REASON: &str = "Maintenance mode is enabled for this service, but no reason was provided. This is a default message.";

/// Why a local change was refused; the HTTP layer maps each to Consul's status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    /// A check names a service this agent does not have (404).
    #[error("ServiceID \"{0}\" does not exist")]
    MissingService(String),
    /// (404)
    #[error("Unknown check ID \"{0}\". Ensure that the check ID is passed, not the check name.")]
    UnknownCheck(String),
    /// (404)
    #[error(
        "Unknown service ID \"{0}\". Ensure that the service ID is passed, not the service name."
    )]
    UnknownService(String),
    /// A TTL update for a check that is not a TTL check.
    #[error("CheckID \"{0}\" does not have associated TTL")]
    NotTtl(String),
    /// A script check registered over HTTP by an agent started without `--enable-script-checks`.
    #[error(
        "Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' to true"
    )]
    ScriptsDisabledRemote,
    /// A script check in the config file of an agent started without `--enable-script-checks`
    /// or `--enable-local-script-checks`.
    #[error(
        "Scripts are disabled on this agent; to enable, configure 'enable_script_checks' or 'enable_local_script_checks' to true"
    )]
    ScriptsDisabledLocal,
}

/// Where a definition came from (Consul treats scripts from the two differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The HTTP API.
    Remote,
    /// The agent's config file.
    Config,
}

/// How the agent's local state is set up.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub node: String,
    /// This node's UUID in the catalog (Consul's `node_id`).
    pub node_id: String,
    /// This node's address in the catalog: the IP of its gossip address, which the leader's
    /// member reconciliation also writes, so the two never undo each other.
    pub address: String,
    /// Script checks allowed from the config file and over HTTP (`--enable-script-checks`).
    pub enable_script_checks: bool,
    /// Script checks allowed from the config file only (`--enable-local-script-checks`).
    pub enable_local_script_checks: bool,
    /// Full anti-entropy period (Consul's 1 min); shortened by tests.
    pub ae_interval: Duration,
    /// Services and checks from the config file, registered at start.
    pub definitions: LocalDefinitions,
}

/// A service as this agent holds it.
#[derive(Debug)]
struct LocalService {
    service: Service,
    generation: u64,
    /// The generation the catalog last acknowledged (0: never).
    synced: u64,
}

/// A check as this agent holds it.
#[derive(Debug)]
struct LocalCheck {
    def: CheckDefinition,
    status: HealthStatus,
    output: String,
    /// The output of the last TTL update, quoted when the TTL expires.
    ttl_output: String,
    /// Since when the check has been critical (for `DeregisterCriticalServiceAfter`).
    critical_since: Option<Instant>,
    generation: u64,
    synced: u64,
    runner: Option<RunnerHandle>,
}

impl LocalCheck {
    fn set_status(&mut self, status: HealthStatus, output: String, now: Instant) {
        if status != HealthStatus::Critical {
            self.critical_since = None;
        } else if self.status != HealthStatus::Critical || self.critical_since.is_none() {
            self.critical_since = Some(now);
        }
        self.status = status;
        self.output = output;
    }
}

#[derive(Debug, Default)]
struct Inner {
    services: BTreeMap<String, LocalService>,
    checks: BTreeMap<String, LocalCheck>,
    /// Deregistrations the catalog has not acknowledged yet.
    removed_services: BTreeSet<String>,
    removed_checks: BTreeSet<String>,
    /// Last generation handed out (entries' and runners').
    generation: u64,
}

impl Inner {
    fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Check `id`, if runner `runner` still runs it (it was not replaced or removed since).
    fn run_by(&mut self, id: &str, runner: u64) -> Option<&mut LocalCheck> {
        self.checks
            .get_mut(id)
            .filter(|c| c.runner.as_ref().is_some_and(|r| r.id == runner))
    }

    /// The check as the catalog should hold it, with its service's name and tags.
    fn catalog_check(&self, node: &str, check: &LocalCheck) -> Check {
        let service = self.services.get(&check.def.service_id);
        let duration = |d: Option<Duration>| {
            d.filter(|d| !d.is_zero())
                .map(vigil_shared::go::duration::format_go_duration)
                .unwrap_or_default()
        };
        Check {
            node: node.to_owned(),
            check_id: check.def.id.clone(),
            name: check.def.name.clone(),
            status: check.status,
            notes: check.def.notes.clone(),
            output: check.output.clone(),
            service_id: check.def.service_id.clone(),
            service_name: service.map(|s| s.service.name.clone()).unwrap_or_default(),
            service_tags: service.map(|s| s.service.tags.clone()).unwrap_or_default(),
            kind: check.def.type_name().to_owned(),
            interval: duration(check.def.interval()),
            timeout: duration(check.def.timeout),
            definition: check.def.definition_json().to_string(),
            create_index: 0,
            modify_index: 0,
        }
    }
}

/// The agent's services and checks, their runners, and the anti-entropy that copies them into
/// the catalog.
pub struct LocalState {
    node: String,
    node_id: String,
    address: String,
    /// This node's metadata in the catalog (`node_meta`, `--node-meta`).
    node_meta: BTreeMap<String, String>,
    /// Script checks may come over HTTP (Consul's `EnableRemoteScriptChecks`).
    remote_scripts: bool,
    /// Script checks may come from the config file (Consul's `EnableLocalScriptChecks`).
    local_scripts: bool,
    backend: Arc<Backend>,
    inner: Mutex<Inner>,
    /// Bumped on every change, for blocking reads of local state.
    changes: watch::Sender<u64>,
    sync: sync::Syncer,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl LocalState {
    /// Registers what the config file declares, then starts anti-entropy (a full sync at once,
    /// then periodically) and the reaper of long-critical services.
    pub fn start(
        options: LocalOptions,
        backend: Arc<Backend>,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Arc<LocalState>, LocalError> {
        let defs = &options.definitions;
        let remote_scripts = options.enable_script_checks || defs.enable_script_checks;
        let local_scripts =
            remote_scripts || options.enable_local_script_checks || defs.enable_local_script_checks;
        let local = Arc::new(LocalState {
            node: options.node,
            node_id: options.node_id,
            address: options.address,
            node_meta: options.definitions.node_meta.clone(),
            remote_scripts,
            local_scripts,
            backend,
            inner: Mutex::new(Inner::default()),
            changes: watch::channel(0).0,
            sync: sync::Syncer::new(options.ae_interval),
            tasks: tasks.clone(),
            shutdown: shutdown.child_token(),
        });
        for service in options.definitions.services {
            local.add_service(service, false, Source::Config)?;
        }
        for check in options.definitions.checks {
            local.add_check(check, Source::Config)?;
        }
        tasks.spawn(sync::run(Arc::clone(&local)));
        tasks.spawn(sync::reap(Arc::clone(&local)));
        Ok(local)
    }

    /// Stops the check runners and anti-entropy. A graceful leave calls this first, so no
    /// sync can register the departing node again after the leader has removed it.
    pub fn stop(&self) {
        self.shutdown.cancel();
    }

    /// This node's metadata in the catalog.
    pub fn node_meta(&self) -> &BTreeMap<String, String> {
        &self.node_meta
    }

    /// Whether script checks may be registered over HTTP.
    pub fn remote_scripts(&self) -> bool {
        self.remote_scripts
    }

    /// Whether the config file's script checks may run.
    pub fn local_scripts(&self) -> bool {
        self.local_scripts
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Call after every change: wakes blocking reads, and the sync task when `push` (a status
    /// or definition change; output-only changes wait for the next sync).
    fn changed(&self, push: bool) {
        self.changes.send_modify(|n| *n += 1);
        if push {
            self.sync.trigger();
        }
    }

    /// Makes a change that can be refused, under the lock; once made, wakes blocking reads and
    /// the sync task.
    fn change(
        &self,
        apply: impl FnOnce(&mut Inner) -> Result<(), LocalError>,
    ) -> Result<(), LocalError> {
        apply(&mut self.lock())?;
        self.changed(true);
        Ok(())
    }

    /// A receiver that sees every change to local state.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn check_scripts_allowed(
        &self,
        check: &CheckDefinition,
        source: Source,
    ) -> Result<(), LocalError> {
        match source {
            _ if !check.is_script() => Ok(()),
            Source::Remote if self.remote_scripts => Ok(()),
            Source::Config if self.local_scripts => Ok(()),
            Source::Remote => Err(LocalError::ScriptsDisabledRemote),
            Source::Config => Err(LocalError::ScriptsDisabledLocal),
        }
    }

    /// Inserts (or replaces) a check and starts its runner. A replaced check keeps its status
    /// and output, so re-registering does not flap.
    fn insert_check(self: &Arc<Self>, inner: &mut Inner, def: CheckDefinition) {
        let generation = inner.next_generation();
        let runner = runner::spawn(self, &def, generation);
        let old = inner.checks.remove(&def.id);
        let now = Instant::now();
        let mut check = LocalCheck {
            status: def.initial_status,
            output: String::new(),
            ttl_output: String::new(),
            critical_since: (def.initial_status == HealthStatus::Critical).then_some(now),
            def,
            generation,
            synced: 0,
            runner,
        };
        if let Some(old) = old {
            check.status = old.status;
            check.output = old.output;
            check.ttl_output = old.ttl_output;
            check.critical_since = old.critical_since;
        }
        // A runner that knows the status from the start (a process check) wins over both.
        if let Some((status, output)) = check.runner.as_ref().and_then(|r| r.initial.clone()) {
            check.set_status(status, output, now);
        }
        inner.removed_checks.remove(&check.def.id);
        inner.checks.insert(check.def.id.clone(), check);
    }

    /// `PUT /v1/agent/check/register` (and config-file checks).
    pub fn add_check(
        self: &Arc<Self>,
        def: CheckDefinition,
        source: Source,
    ) -> Result<(), LocalError> {
        self.check_scripts_allowed(&def, source)?;
        self.change(|inner| {
            if !def.service_id.is_empty() && !inner.services.contains_key(&def.service_id) {
                return Err(LocalError::MissingService(def.service_id));
            }
            self.insert_check(inner, def);
            Ok(())
        })
    }

    /// `PUT /v1/agent/service/register` (and config-file services): the service and its checks;
    /// with `replace_existing_checks`, the service's other checks are removed.
    pub fn add_service(
        self: &Arc<Self>,
        def: ServiceDefinition,
        replace_existing_checks: bool,
        source: Source,
    ) -> Result<(), LocalError> {
        for check in &def.checks {
            self.check_scripts_allowed(check, source)?;
        }
        {
            let mut inner = self.lock();
            let generation = inner.next_generation();
            let id = def.service.id.clone();
            let service = Service {
                node: self.node.clone(),
                ..def.service
            };
            inner.removed_services.remove(&id);
            inner.services.insert(
                id.clone(),
                LocalService {
                    service,
                    generation,
                    synced: 0,
                },
            );
            let keep: BTreeSet<String> = def.checks.iter().map(|c| c.id.clone()).collect();
            for check in def.checks {
                self.insert_check(&mut inner, check);
            }
            if replace_existing_checks {
                let stale: Vec<String> = inner
                    .checks
                    .values()
                    .filter(|c| c.def.service_id == id && !keep.contains(&c.def.id))
                    .map(|c| c.def.id.clone())
                    .collect();
                for id in stale {
                    inner.checks.remove(&id);
                    inner.removed_checks.insert(id);
                }
            }
        }
        self.changed(true);
        Ok(())
    }

    /// `PUT /v1/agent/check/deregister/<id>`.
    pub fn remove_check(&self, id: &str) -> Result<(), LocalError> {
        self.change(|inner| {
            if inner.checks.remove(id).is_none() {
                return Err(LocalError::UnknownCheck(id.to_owned()));
            }
            inner.removed_checks.insert(id.to_owned());
            Ok(())
        })
    }

    /// `PUT /v1/agent/service/deregister/<id>`: the service and all its checks.
    pub fn remove_service(&self, id: &str) -> Result<(), LocalError> {
        self.change(|inner| {
            if inner.services.remove(id).is_none() {
                return Err(LocalError::UnknownService(id.to_owned()));
            }
            inner.checks.retain(|_, c| c.def.service_id != id);
            inner.removed_services.insert(id.to_owned());
            Ok(())
        })
    }

    /// `PUT /v1/agent/check/{pass,warn,fail,update}/<id>`: sets a TTL check's status and output
    /// (truncated to its cap) and pushes its deadline back by the TTL.
    pub fn update_ttl(
        &self,
        id: &str,
        status: HealthStatus,
        output: &str,
    ) -> Result<(), LocalError> {
        self.change(|inner| {
            let generation = inner.next_generation();
            let check = inner
                .checks
                .get_mut(id)
                .ok_or_else(|| LocalError::UnknownCheck(id.to_owned()))?;
            let CheckKind::Ttl { ttl } = check.def.kind else {
                return Err(LocalError::NotTtl(id.to_owned()));
            };
            let output = runner::truncate_output(output, check.def.output_max_size);
            check.ttl_output = output.clone();
            check.set_status(status, output, Instant::now());
            check.generation = generation;
            if let Some(runner) = &check.runner {
                runner.reset_ttl(ttl);
            }
            Ok(())
        })
    }

    /// A runner's (already thresholded) result. Ignored if the check was replaced or removed
    /// since the runner started.
    fn runner_result(&self, id: &str, runner: u64, status: HealthStatus, output: String) {
        let push = {
            let mut inner = self.lock();
            let generation = inner.next_generation();
            let Some(check) = inner.run_by(id, runner) else {
                return;
            };
            if check.status == status && check.output == output {
                return;
            }
            let push = check.status != status;
            check.set_status(status, output, Instant::now());
            check.generation = generation;
            push
        };
        self.changed(push);
    }

    /// A TTL check's deadline passed without an update: critical, quoting the last output.
    fn ttl_expired(&self, id: &str, runner: u64) {
        {
            let mut inner = self.lock();
            let generation = inner.next_generation();
            let Some(check) = inner.run_by(id, runner) else {
                return;
            };
            let output = if check.ttl_output.is_empty() {
                "TTL expired".to_owned()
            } else {
                format!(
                    "TTL expired (last output before timeout follows): {}",
                    check.ttl_output
                )
            };
            check.set_status(HealthStatus::Critical, output, Instant::now());
            check.generation = generation;
        }
        tracing::warn!(check = id, "check missed its TTL, is now critical");
        self.changed(true);
    }

    /// `PUT /v1/agent/maintenance?enable=`: adds or removes the `_node_maintenance` check.
    pub fn node_maintenance(self: &Arc<Self>, enable: bool, reason: &str) {
        {
            let mut inner = self.lock();
            match (enable, inner.checks.contains_key(NODE_MAINTENANCE)) {
                (true, false) => {
                    let reason = if reason.is_empty() {
                        DEFAULT_NODE_MAINTENANCE_REASON
                    } else {
                        reason
                    };
                    let def = maintenance_check(
                        NODE_MAINTENANCE.to_owned(),
                        "Node Maintenance Mode",
                        reason,
                        "",
                    );
                    self.insert_check(&mut inner, def);
                }
                (false, true) => {
                    inner.checks.remove(NODE_MAINTENANCE);
                    inner.removed_checks.insert(NODE_MAINTENANCE.to_owned());
                }
                _ => return,
            }
        }
        self.changed(true);
    }

    /// `PUT /v1/agent/service/maintenance/<id>?enable=`: adds or removes
    /// `_service_maintenance:<id>`.
    pub fn service_maintenance(
        self: &Arc<Self>,
        service_id: &str,
        enable: bool,
        reason: &str,
    ) -> Result<(), LocalError> {
        let check_id = format!("{SERVICE_MAINTENANCE_PREFIX}{service_id}");
        {
            let mut inner = self.lock();
            if !inner.services.contains_key(service_id) {
                return Err(LocalError::UnknownService(service_id.to_owned()));
            }
            let exists = inner.checks.contains_key(&check_id);
            match (enable, exists) {
                (true, false) => {
                    let reason = if reason.is_empty() {
                        DEFAULT_SERVICE_MAINTENANCE_REASON
                    } else {
                        reason
                    };
                    let def =
                        maintenance_check(check_id, "Service Maintenance Mode", reason, service_id);
                    self.insert_check(&mut inner, def);
                }
                (false, true) => {
                    inner.checks.remove(&check_id);
                    inner.removed_checks.insert(check_id);
                }
                _ => return Ok(()),
            }
        }
        self.changed(true);
        Ok(())
    }

    /// Every local check as the catalog would hold it (service name and tags filled in).
    pub fn checks(&self) -> Vec<Check> {
        let inner = self.lock();
        inner
            .checks
            .values()
            .map(|c| inner.catalog_check(&self.node, c))
            .collect()
    }

    pub fn services(&self) -> Vec<Service> {
        self.lock()
            .services
            .values()
            .map(|s| s.service.clone())
            .collect()
    }

    pub fn service(&self, id: &str) -> Option<Service> {
        self.lock().services.get(id).map(|s| s.service.clone())
    }

    /// Pushes pending changes to the catalog now (the HTTP API replies after this). A failure
    /// is logged and left to the retrying sync task, as Consul does: the local change stands.
    pub async fn sync_now(&self) {
        if let Err(e) = sync::sync_changes(self).await {
            tracing::warn!(error = %e, "syncing local changes to the catalog failed; will retry");
            self.sync.retry_soon();
        }
    }
}

fn maintenance_check(id: String, name: &str, notes: &str, service_id: &str) -> CheckDefinition {
    CheckDefinition {
        id,
        name: name.to_owned(),
        notes: notes.to_owned(),
        service_id: service_id.to_owned(),
        initial_status: HealthStatus::Critical,
        kind: CheckKind::Maintenance,
        timeout: None,
        deregister_critical_after: None,
        thresholds: definition::Thresholds::default(),
        output_max_size: definition::DEFAULT_OUTPUT_MAX,
    }
}
