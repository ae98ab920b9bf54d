//! The catalog: registered nodes, their services and their health checks. Sessions depend on
//! checks; the state machine turns check, service and node removals here into invalidations.
//! Every service name has its own index, so a health watcher on one service wakes only when
//! an instance of it, one of its checks, or a check of a node it runs on changes.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use vigil_shared::catalog::{Check, HealthStatus, Node, Service, ServiceHealth};
use vigil_shared::rpc::{ApplyError, Registration};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    nodes: BTreeMap<String, Node>,
    /// (node, service ID) → service instance.
    services: BTreeMap<(String, String), Service>,
    /// (node, check ID) → check.
    checks: BTreeMap<(String, String), Check>,
    /// Raft index of the latest change to nodes, services or checks.
    table_index: u64,
    /// Service name → raft index of the latest change that shows in its health. Kept after
    /// the last instance goes, so a watcher sees the removal.
    service_index: BTreeMap<String, u64>,
}

/// What a catalog change touched, for waking blocking queries.
#[derive(Debug, Default)]
pub struct Touched {
    pub any: bool,
    pub services: BTreeSet<String>,
}

fn key(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

/// The entries of `map` whose key starts with `node`.
fn on_node<'a, V>(
    map: &'a BTreeMap<(String, String), V>,
    node: &'a str,
) -> impl Iterator<Item = &'a V> + 'a {
    map.range(key(node, "")..)
        .take_while(move |((n, _), _)| n == node)
        .map(|(_, v)| v)
}

impl Catalog {
    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    /// The index a blocking query on one service's instances or health compares against.
    pub fn service_index(&self, name: &str) -> u64 {
        self.service_index.get(name).copied().unwrap_or(0)
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn check(&self, node: &str, check_id: &str) -> Option<&Check> {
        self.checks.get(&key(node, check_id))
    }

    /// A node's checks with their service's name and tags filled in.
    pub fn node_checks(&self, node: &str) -> Vec<Check> {
        on_node(&self.checks, node)
            .map(|c| self.filled(c))
            .collect()
    }

    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    pub fn node_services<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Service> + 'a {
        on_node(&self.services, node)
    }

    /// Every instance of the service `name`, with its node.
    pub fn instances(&self, name: &str) -> Vec<(Node, Service)> {
        self.services
            .values()
            .filter(|s| s.name == name)
            .filter_map(|s| Some((self.nodes.get(&s.node)?.clone(), s.clone())))
            .collect()
    }

    /// The checks of every instance of the service `name`.
    pub fn service_checks(&self, name: &str) -> Vec<Check> {
        self.checks
            .values()
            .filter(|c| {
                !c.service_id.is_empty()
                    && self
                        .services
                        .get(&key(&c.node, &c.service_id))
                        .is_some_and(|s| s.name == name)
            })
            .map(|c| self.filled(c))
            .collect()
    }

    /// Every check in `state`, or every check when `state` is `None`.
    pub fn checks_in_state(&self, state: Option<HealthStatus>) -> Vec<Check> {
        self.checks
            .values()
            .filter(|c| state.is_none_or(|s| c.status == s))
            .map(|c| self.filled(c))
            .collect()
    }

    /// Every instance of `name` with its node and the checks that apply to it: the node's own
    /// checks first, then the instance's.
    pub fn health(&self, name: &str) -> Vec<ServiceHealth> {
        self.instances(name)
            .into_iter()
            .map(|(node, service)| {
                let checks = on_node(&self.checks, &node.name)
                    .filter(|c| c.service_id.is_empty())
                    .chain(on_node(&self.checks, &node.name).filter(|c| c.service_id == service.id))
                    .map(|c| self.filled(c))
                    .collect();
                ServiceHealth {
                    node,
                    service,
                    checks,
                }
            })
            .collect()
    }

    /// A check as read: with its service's current name and tags.
    fn filled(&self, check: &Check) -> Check {
        let mut out = check.clone();
        if let Some(s) = self.services.get(&key(&check.node, &check.service_id)) {
            out.service_name = s.name.clone();
            out.service_tags = s.tags.clone();
        }
        out
    }

    fn touch_service(&mut self, name: &str, index: u64, t: &mut Touched) {
        self.service_index.insert(name.to_owned(), index);
        t.services.insert(name.to_owned());
        self.touch(index, t);
    }

    fn touch(&mut self, index: u64, t: &mut Touched) {
        self.table_index = index;
        t.any = true;
    }

    /// A change to a node or its node-level checks shows in the health of all its services.
    fn touch_node(&mut self, node: &str, index: u64, t: &mut Touched) {
        let names: Vec<String> = self.node_services(node).map(|s| s.name.clone()).collect();
        for name in names {
            self.touch_service(&name, index, t);
        }
        self.touch(index, t);
    }

    /// What a change to `check` touches: its service, or for a node check the whole node.
    fn touch_check(&mut self, node: &str, service_id: &str, index: u64, t: &mut Touched) {
        if service_id.is_empty() {
            self.touch_node(node, index, t);
        } else if let Some(name) = self
            .services
            .get(&key(node, service_id))
            .map(|s| s.name.clone())
        {
            self.touch_service(&name, index, t);
        } else {
            self.touch(index, t);
        }
    }

    /// Registers a node from gossip or updates its address; other fields are kept.
    pub fn upsert_node(&mut self, name: &str, address: &str, index: u64, t: &mut Touched) {
        let node = Node {
            name: name.to_owned(),
            address: address.to_owned(),
            ..self.nodes.get(name).cloned().unwrap_or_default()
        };
        self.put_node(node, index, t);
    }

    fn put_node(&mut self, mut node: Node, index: u64, t: &mut Touched) {
        let old = self.nodes.get(&node.name);
        let same = old.is_some_and(|o| {
            o.id == node.id
                && o.address == node.address
                && o.tagged_addresses == node.tagged_addresses
                && o.meta == node.meta
        });
        if same {
            return;
        }
        node.create_index = old.map_or(index, |o| o.create_index);
        node.modify_index = index;
        let name = node.name.clone();
        self.nodes.insert(name.clone(), node);
        self.touch_node(&name, index, t);
    }

    /// Checks a registration without changing anything.
    pub fn validate(&self, reg: &Registration) -> Result<(), ApplyError> {
        for check in &reg.checks {
            let ours = reg
                .service
                .as_ref()
                .is_some_and(|s| s.id == check.service_id);
            if !check.service_id.is_empty()
                && !ours
                && !self
                    .services
                    .contains_key(&key(&reg.node, &check.service_id))
            {
                return Err(ApplyError::UnknownServiceForCheck {
                    service_id: check.service_id.clone(),
                    check_id: check.check_id.clone(),
                });
            }
        }
        Ok(())
    }

    /// Applies a validated registration. `skip_node_update` leaves an existing node alone; a
    /// node not yet in the catalog is created from the registration all the same, as Consul's
    /// `ChangesNode` does.
    pub fn register(&mut self, reg: &Registration, index: u64, t: &mut Touched) {
        if !reg.skip_node_update || !self.nodes.contains_key(&reg.node) {
            let node = Node {
                name: reg.node.clone(),
                id: reg.node_id.clone(),
                address: reg.address.clone(),
                tagged_addresses: reg.tagged_addresses.clone(),
                meta: reg.node_meta.clone(),
                create_index: 0,
                modify_index: 0,
            };
            self.put_node(node, index, t);
        }
        if let Some(service) = &reg.service {
            self.upsert_service(service, index, t);
        }
        for check in &reg.checks {
            self.upsert_check(check, index, t);
        }
    }

    fn upsert_service(&mut self, service: &Service, index: u64, t: &mut Touched) {
        let k = key(&service.node, &service.id);
        let old = self.services.get(&k);
        let new = Service {
            create_index: old.map_or(index, |o| o.create_index),
            modify_index: index,
            ..service.clone()
        };
        if old.is_some_and(|o| {
            Service {
                modify_index: index,
                ..o.clone()
            } == new
        }) {
            return;
        }
        if let Some(old_name) = old.map(|o| o.name.clone())
            && old_name != new.name
        {
            self.touch_service(&old_name, index, t);
        }
        let name = new.name.clone();
        self.services.insert(k, new);
        self.touch_service(&name, index, t);
    }

    /// Registers or updates a check of an existing node; an identical one changes nothing.
    pub fn upsert_check(&mut self, reg: &Check, index: u64, t: &mut Touched) {
        let k = key(&reg.node, &reg.check_id);
        let old = self.checks.get(&k);
        if old.is_some_and(|o| o.same_content(reg)) {
            return;
        }
        let new = Check {
            service_name: String::new(),
            service_tags: Vec::new(),
            create_index: old.map_or(index, |o| o.create_index),
            modify_index: index,
            ..reg.clone()
        };
        // A check that moved to another service leaves the old one's health too.
        if let Some(old_service) = old.map(|o| o.service_id.clone())
            && old_service != new.service_id
        {
            self.touch_check(&reg.node, &old_service, index, t);
        }
        self.checks.insert(k, new);
        self.touch_check(&reg.node, &reg.service_id, index, t);
    }

    pub fn remove_check(
        &mut self,
        node: &str,
        check_id: &str,
        index: u64,
        t: &mut Touched,
    ) -> bool {
        match self.checks.remove(&key(node, check_id)) {
            Some(c) => {
                self.touch_check(node, &c.service_id, index, t);
                true
            }
            None => false,
        }
    }

    /// Removes a service instance and its checks; returns the IDs of the checks removed.
    pub fn remove_service(
        &mut self,
        node: &str,
        service_id: &str,
        index: u64,
        t: &mut Touched,
    ) -> Option<Vec<String>> {
        let service = self.services.remove(&key(node, service_id))?;
        let ids: Vec<String> = on_node(&self.checks, node)
            .filter(|c| c.service_id == service_id)
            .map(|c| c.check_id.clone())
            .collect();
        for id in &ids {
            self.checks.remove(&key(node, id));
        }
        self.touch_service(&service.name, index, t);
        Some(ids)
    }

    /// Removes a node with its services and checks; returns the IDs of the checks removed.
    pub fn remove_node(&mut self, name: &str, index: u64, t: &mut Touched) -> Option<Vec<String>> {
        self.nodes.get(name)?;
        self.touch_node(name, index, t);
        self.nodes.remove(name);
        let services: Vec<String> = self.node_services(name).map(|s| s.id.clone()).collect();
        for id in services {
            self.services.remove(&key(name, &id));
        }
        let ids: Vec<String> = on_node(&self.checks, name)
            .map(|c| c.check_id.clone())
            .collect();
        for id in &ids {
            self.checks.remove(&key(name, id));
        }
        Some(ids)
    }
}

/// The catalog as the first release encodes it (snapshot format 3): each service without the
/// fields added since, read back empty (a state below protocol level 2 has none: the op that
/// sets them is not proposed there).
pub mod first_release {
    use serde::{Deserializer, Serializer};
    use vigil_shared::first_release::ServiceV1;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct CatalogV1 {
        nodes: BTreeMap<String, Node>,
        services: BTreeMap<(String, String), ServiceV1>,
        checks: BTreeMap<(String, String), Check>,
        table_index: u64,
        service_index: BTreeMap<String, u64>,
    }

    pub fn serialize<S: Serializer>(catalog: &&Catalog, s: S) -> Result<S::Ok, S::Error> {
        CatalogV1 {
            nodes: catalog.nodes.clone(),
            services: catalog
                .services
                .iter()
                .map(|(k, svc)| (k.clone(), ServiceV1::from(svc)))
                .collect(),
            checks: catalog.checks.clone(),
            table_index: catalog.table_index,
            service_index: catalog.service_index.clone(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Catalog, D::Error> {
        let c = CatalogV1::deserialize(d)?;
        Ok(Catalog {
            nodes: c.nodes,
            services: c
                .services
                .into_iter()
                .map(|(k, svc)| (k, Service::from(svc)))
                .collect(),
            checks: c.checks,
            table_index: c.table_index,
            service_index: c.service_index,
        })
    }
}
