//! Anti-entropy: the agent is the source of truth for its own services and checks, and this
//! copies them into the catalog. Changes are pushed as they happen (status changes at once,
//! registrations synchronously before the HTTP reply); a full sync every `ae_interval` (with
//! jitter) compares the catalog's view of this node with ours and repairs drift both ways:
//! what is missing or different is registered again, and what the catalog has on this node that
//! the agent does not know is deregistered, except `serfHealth`, which the leader owns. A failed
//! sync is retried soon. Services whose check stayed critical past
//! `DeregisterCriticalServiceAfter` are reaped here too.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng as _;
use tokio::sync::Notify;
use tokio::time::Instant;
use vigil_shared::catalog::{CONSUL_SERVICE, Check, SERF_HEALTH, Service};
use vigil_shared::rpc::writes::{CatalogRegister, DeregisterCheck, DeregisterService};
use vigil_shared::rpc::{ApplyError, Consistency, QueryOptions, Registration, ServerError, reads};

use super::definition::MIN_DEREGISTER_AFTER;
use super::{Inner, LocalState};

/// Longest wait before a failed sync is tried again (Consul's 15 s).
const RETRY_MAX: Duration = Duration::from_secs(15);
/// How often services whose check stayed critical too long are looked for.
const REAP_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("the catalog refused the change: {0}")]
    Rejected(ApplyError),
}

/// The sync task's controls.
pub struct Syncer {
    interval: Duration,
    /// Something changed that should reach the catalog now.
    trigger: Notify,
    /// A sync outside the task failed; run a full sync soon.
    retry: Notify,
    /// One sync at a time, so pushes keep their order.
    running: tokio::sync::Mutex<()>,
}

impl Syncer {
    pub fn new(interval: Duration) -> Syncer {
        Syncer {
            interval,
            trigger: Notify::new(),
            retry: Notify::new(),
            running: tokio::sync::Mutex::new(()),
        }
    }

    pub fn trigger(&self) {
        self.trigger.notify_one();
    }

    pub fn retry_soon(&self) {
        self.retry.notify_one();
    }

    fn retry_delay(&self) -> Duration {
        let base = self.interval.min(RETRY_MAX);
        base + jitter(base / 2)
    }

    fn next_full(&self) -> Duration {
        self.interval + jitter(self.interval / 4)
    }
}

fn jitter(max: Duration) -> Duration {
    let ns = max.as_nanos().min(u128::from(u64::MAX)) as u64;
    if ns == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rand::thread_rng().gen_range(0..ns))
}

/// The sync task: pushes triggered changes, runs a full sync at start and then every interval,
/// and retries failures. Stops with the agent.
pub async fn run(local: std::sync::Arc<LocalState>) {
    let mut next_full = Instant::now();
    loop {
        let full = tokio::select! {
            biased;
            () = local.shutdown.cancelled() => return,
            () = local.sync.retry.notified() => {
                next_full = next_full.min(Instant::now() + local.sync.retry_delay());
                continue;
            }
            () = local.sync.trigger.notified() => false,
            () = tokio::time::sleep_until(next_full) => true,
        };
        let attempt = async {
            if full {
                full_sync(&local).await
            } else {
                sync_changes(&local).await
            }
        };
        let result = tokio::select! {
            biased;
            () = local.shutdown.cancelled() => return,
            result = attempt => result,
        };
        match result {
            Ok(()) if full => next_full = Instant::now() + local.sync.next_full(),
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, full, "anti-entropy sync failed; retrying");
                next_full = Instant::now() + local.sync.retry_delay();
            }
        }
    }
}

/// Pushes every local change the catalog has not acknowledged.
pub async fn sync_changes(local: &LocalState) -> Result<(), SyncError> {
    let _running = local.sync.running.lock().await;
    push(local, false).await
}

/// Compares the catalog's view of this node with local state, marks the differences, and
/// pushes them.
pub async fn full_sync(local: &LocalState) -> Result<(), SyncError> {
    let _running = local.sync.running.lock().await;
    let opts = QueryOptions {
        consistency: Consistency::Default,
        ..QueryOptions::default()
    };
    let node = local.node.clone();
    let (found, _) = local
        .backend
        .read(opts, reads::CatalogNodeFull { node: node.clone() })
        .await?;
    let (checks, _) = local.backend.read(opts, reads::NodeChecks { node }).await?;
    let node_current = found.as_ref().is_some_and(|(node, _)| {
        node.id == local.node_id
            && node.address == local.address
            && node.meta == local.node_meta
            && node.tagged_addresses == tagged_addresses(&local.address)
    });
    let services = found.map(|(_, services)| services).unwrap_or_default();
    reconcile(&mut local.lock(), &local.node, &services, &checks);
    push(local, !node_current).await
}

fn same_service(ours: &Service, theirs: &Service) -> bool {
    Service {
        create_index: 0,
        modify_index: 0,
        ..theirs.clone()
    } == *ours
}

/// Marks what differs between local state and the catalog's view of this node: local entries
/// missing or different there become unsynced, catalog entries unknown here are queued for
/// deregistration (never `serfHealth`, nor the `consul` service the leader gives a server).
fn reconcile(inner: &mut Inner, node: &str, services: &[Service], checks: &[Check]) {
    let catalog_services: BTreeMap<&str, &Service> =
        services.iter().map(|s| (s.id.as_str(), s)).collect();
    for (id, local) in &mut inner.services {
        if !catalog_services
            .get(id.as_str())
            .is_some_and(|theirs| same_service(&local.service, theirs))
        {
            local.synced = 0;
        }
    }
    for id in catalog_services.keys() {
        if *id != CONSUL_SERVICE && !inner.services.contains_key(*id) {
            inner.removed_services.insert((*id).to_owned());
        }
    }
    let catalog_checks: BTreeMap<&str, &Check> = checks
        .iter()
        .filter(|c| c.check_id != SERF_HEALTH)
        .map(|c| (c.check_id.as_str(), c))
        .collect();
    let stale: Vec<String> = inner
        .checks
        .values()
        .filter(|local| {
            !catalog_checks
                .get(local.def.id.as_str())
                .is_some_and(|theirs| inner.catalog_check(node, local).same_content(theirs))
        })
        .map(|local| local.def.id.clone())
        .collect();
    for id in stale {
        if let Some(local) = inner.checks.get_mut(&id) {
            local.synced = 0;
        }
    }
    for id in catalog_checks.keys() {
        if !inner.checks.contains_key(*id) {
            inner.removed_checks.insert((*id).to_owned());
        }
    }
}

/// One catalog write and the entries (with the generation pushed) it acknowledges.
struct Write {
    change: Change,
    services: Vec<(String, u64)>,
    checks: Vec<(String, u64)>,
    /// Deregistrations it acknowledges.
    removed_service: Option<String>,
    removed_check: Option<String>,
}

/// A change to this node's catalog entries: a deregistration always applies, a registration
/// may be refused.
#[derive(Debug)]
enum Change {
    DeregisterService(DeregisterService),
    DeregisterCheck(DeregisterCheck),
    Register(Box<CatalogRegister>),
}

impl Change {
    fn register(registration: Registration) -> Change {
        Change::Register(Box::new(CatalogRegister(registration)))
    }
}

impl Write {
    fn new(change: Change) -> Write {
        Write {
            change,
            services: Vec::new(),
            checks: Vec::new(),
            removed_service: None,
            removed_check: None,
        }
    }
}

/// The node's tagged addresses as Consul's agent registers them: `lan` and `wan`, and
/// `lan_ipv4`/`wan_ipv4` (or the v6 pair) for an IP address.
fn tagged_addresses(address: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let family = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => Some("ipv4"),
        Ok(std::net::IpAddr::V6(_)) => Some("ipv6"),
        Err(_) => None,
    };
    for tag in ["lan", "wan"] {
        out.insert(tag.to_owned(), address.to_owned());
        if let Some(family) = family {
            out.insert(format!("{tag}_{family}"), address.to_owned());
        }
    }
    out
}

/// This node as the agent registers it.
#[derive(Clone, Copy)]
struct NodeInfo<'a> {
    name: &'a str,
    id: &'a str,
    address: &'a str,
    meta: &'a BTreeMap<String, String>,
}

/// The writes that bring the catalog up to date: deregistrations first, then each unsynced
/// service with all its checks, then the remaining unsynced checks in one registration. With
/// `register_node`, a registration goes out even when nothing else is pending.
fn plan(inner: &Inner, node: &NodeInfo<'_>, register_node: bool) -> Vec<Write> {
    let NodeInfo {
        name: node,
        id,
        address,
        meta,
    } = *node;
    let registration = |service: Option<Service>, checks: Vec<Check>| Registration {
        node: node.to_owned(),
        node_id: id.to_owned(),
        address: address.to_owned(),
        node_meta: meta.clone(),
        tagged_addresses: tagged_addresses(address),
        skip_node_update: false,
        service,
        checks,
    };
    let mut writes = Vec::new();
    for id in &inner.removed_services {
        let mut w = Write::new(Change::DeregisterService(DeregisterService {
            node: node.to_owned(),
            service_id: id.clone(),
        }));
        w.removed_service = Some(id.clone());
        writes.push(w);
    }
    for id in &inner.removed_checks {
        let mut w = Write::new(Change::DeregisterCheck(DeregisterCheck {
            node: node.to_owned(),
            check_id: id.clone(),
        }));
        w.removed_check = Some(id.clone());
        writes.push(w);
    }
    let mut covered = Vec::new();
    for (id, local) in &inner.services {
        if local.synced == local.generation {
            continue;
        }
        let own: Vec<_> = inner
            .checks
            .values()
            .filter(|c| c.def.service_id == *id)
            .collect();
        let checks = own.iter().map(|c| inner.catalog_check(node, c)).collect();
        let service = Some(local.service.clone());
        let mut w = Write::new(Change::register(registration(service, checks)));
        w.services.push((id.clone(), local.generation));
        w.checks = own
            .iter()
            .map(|c| (c.def.id.clone(), c.generation))
            .collect();
        covered.extend(own.iter().map(|c| c.def.id.clone()));
        writes.push(w);
    }
    let rest: Vec<_> = inner
        .checks
        .values()
        .filter(|c| c.synced != c.generation && !covered.contains(&c.def.id))
        .collect();
    if !rest.is_empty() || (register_node && writes.is_empty()) {
        let checks = rest.iter().map(|c| inner.catalog_check(node, c)).collect();
        let mut w = Write::new(Change::register(registration(None, checks)));
        w.checks = rest
            .iter()
            .map(|c| (c.def.id.clone(), c.generation))
            .collect();
        writes.push(w);
    }
    writes
}

/// Sends the planned writes in order; each success is recorded at once, so a failure part-way
/// leaves only the rest pending.
async fn push(local: &LocalState, register_node: bool) -> Result<(), SyncError> {
    let node = NodeInfo {
        name: &local.node,
        id: &local.node_id,
        address: &local.address,
        meta: &local.node_meta,
    };
    let writes = plan(&local.lock(), &node, register_node);
    for write in writes {
        let backend = &local.backend;
        let applied = match write.change {
            Change::DeregisterService(service) => Ok(backend.write(service).await?),
            Change::DeregisterCheck(check) => Ok(backend.write(check).await?),
            Change::Register(registration) => backend.write(*registration).await?,
        };
        if let Err(e) = applied {
            // The catalog lost a service a check of ours needs: register it again next time.
            if let ApplyError::UnknownServiceForCheck { service_id, .. } = &e
                && let Some(service) = local.lock().services.get_mut(service_id)
            {
                service.synced = 0;
            }
            return Err(SyncError::Rejected(e));
        }
        let mut inner = local.lock();
        if let Some(id) = write.removed_service {
            inner.removed_services.remove(&id);
        }
        if let Some(id) = write.removed_check {
            inner.removed_checks.remove(&id);
        }
        for (id, generation) in write.services {
            if let Some(s) = inner.services.get_mut(&id) {
                s.synced = generation;
                // Consul's line for the same event, which `/v1/agent/monitor` followers see.
                tracing::info!(service = %id, "Synced service");
            }
        }
        for (id, generation) in write.checks {
            if let Some(c) = inner.checks.get_mut(&id) {
                c.synced = generation;
            }
        }
    }
    Ok(())
}

/// Whether a service must be reaped: its check has been critical for longer than its
/// `DeregisterCriticalServiceAfter` (raised to at least one minute).
pub fn reap_due(after: Option<Duration>, critical_since: Option<Instant>, now: Instant) -> bool {
    match (after, critical_since) {
        (Some(after), Some(since)) => {
            now.saturating_duration_since(since) > after.max(MIN_DEREGISTER_AFTER)
        }
        _ => false,
    }
}

/// The reaper task: every 30 s, deregisters services whose check stayed critical too long.
pub async fn reap(local: std::sync::Arc<LocalState>) {
    loop {
        tokio::select! {
            biased;
            () = local.shutdown.cancelled() => return,
            () = tokio::time::sleep(REAP_INTERVAL) => {}
        }
        let now = Instant::now();
        let due: Vec<String> = local
            .lock()
            .checks
            .values()
            .filter(|c| !c.def.service_id.is_empty())
            .filter(|c| reap_due(c.def.deregister_critical_after, c.critical_since, now))
            .map(|c| c.def.service_id.clone())
            .collect();
        for service in due {
            if local.remove_service(&service).is_ok() {
                tracing::info!(
                    service,
                    "deregistered a service whose check stayed critical"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::definition::{CheckDefinition, CheckKind, DEFAULT_OUTPUT_MAX, Thresholds};
    use crate::local::{LocalCheck, LocalService};
    use vigil_shared::catalog::HealthStatus;

    fn local_state() -> Inner {
        let mut inner = Inner::default();
        let service = Service {
            node: "n1".into(),
            id: "web".into(),
            name: "web".into(),
            ..Service::default()
        };
        inner.services.insert(
            "web".into(),
            LocalService {
                service,
                generation: 1,
                synced: 1,
            },
        );
        for (id, service_id) in [("disk", ""), ("service:web", "web")] {
            let def = CheckDefinition {
                id: id.into(),
                name: id.into(),
                notes: String::new(),
                service_id: service_id.into(),
                initial_status: HealthStatus::Passing,
                kind: CheckKind::Ttl {
                    ttl: Duration::from_secs(30),
                },
                timeout: None,
                deregister_critical_after: None,
                thresholds: Thresholds::default(),
                output_max_size: DEFAULT_OUTPUT_MAX,
            };
            inner.checks.insert(
                id.into(),
                LocalCheck {
                    def,
                    status: HealthStatus::Passing,
                    output: String::new(),
                    ttl_output: String::new(),
                    critical_since: None,
                    generation: 2,
                    synced: 2,
                    runner: None,
                },
            );
        }
        inner.generation = 2;
        inner
    }

    #[test]
    fn full_sync_repairs_drift_both_ways() {
        let mut inner = local_state();
        let web = inner.services["web"].service.clone();
        let serf = Check {
            node: "n1".into(),
            check_id: SERF_HEALTH.into(),
            ..Check::default()
        };
        let stray = Check {
            node: "n1".into(),
            check_id: "stray".into(),
            ..Check::default()
        };
        let mut web_check = inner.catalog_check("n1", &inner.checks["service:web"]);
        web_check.create_index = 7;
        web_check.service_name = "web".into();
        // The catalog: the service and its check as ours, `disk` deleted, a stray check and
        // another service unknown here, and the leader's serfHealth and `consul` service.
        let other = Service {
            id: "other".into(),
            ..web.clone()
        };
        let consul = Service {
            id: CONSUL_SERVICE.into(),
            name: CONSUL_SERVICE.into(),
            ..web.clone()
        };
        reconcile(
            &mut inner,
            "n1",
            &[web, other, consul],
            &[serf, stray, web_check],
        );
        assert_eq!(
            inner.services["web"].synced, 1,
            "same as the catalog: still synced"
        );
        assert_eq!(inner.checks["service:web"].synced, 2);
        assert_eq!(
            inner.checks["disk"].synced, 0,
            "missing there: pushed again"
        );
        assert_eq!(inner.removed_checks, ["stray".to_owned()].into());
        assert_eq!(inner.removed_services, ["other".to_owned()].into());

        let meta = BTreeMap::from([("rack".to_owned(), "r1".to_owned())]);
        let writes = plan(&inner, &n1("127.0.0.1", &meta), false);
        let changes: Vec<&Change> = writes.iter().map(|w| &w.change).collect();
        assert!(matches!(changes[0], Change::DeregisterService(d) if d.service_id == "other"));
        assert!(matches!(changes[1], Change::DeregisterCheck(d) if d.check_id == "stray"));
        let Change::Register(registration) = changes[2] else {
            panic!("{:?}", changes[2])
        };
        let CatalogRegister(reg) = &**registration;
        assert_eq!(changes.len(), 3);
        assert_eq!(
            (reg.node.as_str(), reg.address.as_str()),
            ("n1", "127.0.0.1")
        );
        assert!(!reg.skip_node_update);
        assert_eq!(reg.node_meta, meta);
        assert!(reg.service.is_none());
        let ids: Vec<&str> = reg.checks.iter().map(|c| c.check_id.as_str()).collect();
        assert_eq!(ids, ["disk"]);
    }

    fn n1<'a>(address: &'a str, meta: &'a BTreeMap<String, String>) -> NodeInfo<'a> {
        NodeInfo {
            name: "n1",
            id: "",
            address,
            meta,
        }
    }

    #[test]
    fn an_unsynced_service_goes_with_all_its_checks() {
        let mut inner = local_state();
        inner.services.get_mut("web").expect("web").synced = 0;
        let writes = plan(&inner, &n1("127.0.0.1", &BTreeMap::new()), false);
        assert_eq!(writes.len(), 1);
        let Change::Register(registration) = &writes[0].change else {
            panic!("{:?}", writes[0].change)
        };
        let CatalogRegister(reg) = &**registration;
        assert_eq!(reg.service.as_ref().map(|s| s.id.as_str()), Some("web"));
        assert_eq!(reg.checks.len(), 1);
        assert_eq!(writes[0].checks, [("service:web".to_owned(), 2)]);

        // Nothing pending: no write, unless the node itself must be registered.
        let synced = local_state();
        assert!(plan(&synced, &n1("a", &BTreeMap::new()), false).is_empty());
        assert_eq!(plan(&synced, &n1("a", &BTreeMap::new()), true).len(), 1);
    }

    #[test]
    fn reaping_waits_for_the_timeout_and_at_least_a_minute() {
        let since = Instant::now();
        let at = |s: u64| since + Duration::from_secs(s);
        let after = |s: u64| Some(Duration::from_secs(s));
        assert!(!reap_due(None, Some(since), at(3600)), "no timeout set");
        assert!(!reap_due(after(90), None, at(3600)), "not critical");
        assert!(!reap_due(after(90), Some(since), at(60)));
        assert!(reap_due(after(90), Some(since), at(91)));
        assert!(
            !reap_due(after(5), Some(since), at(30)),
            "raised to one minute"
        );
        assert!(reap_due(after(5), Some(since), at(61)));
    }
}
