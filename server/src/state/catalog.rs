//! The catalog: registered nodes and their health checks. Sessions depend on these; the
//! state machine turns check and node changes here into session invalidations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vigil_shared::catalog::{Check, Node};
use vigil_shared::rpc::CheckRegistration;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    nodes: BTreeMap<String, Node>,
    /// (node, check ID) → check.
    checks: BTreeMap<(String, String), Check>,
    /// Raft index of the latest change to nodes or checks.
    table_index: u64,
}

impl Catalog {
    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn check(&self, node: &str, check_id: &str) -> Option<&Check> {
        self.checks.get(&(node.to_owned(), check_id.to_owned()))
    }

    pub fn node_checks(&self, node: &str) -> impl Iterator<Item = &Check> {
        let start = (node.to_owned(), String::new());
        self.checks
            .range(start..)
            .take_while(move |((n, _), _)| n == node)
            .map(|(_, c)| c)
    }

    /// Registers or updates a node; an identical re-registration changes nothing.
    pub fn upsert_node(&mut self, name: &str, address: &str, index: u64) {
        match self.nodes.get_mut(name) {
            Some(n) if n.address == address => {}
            Some(n) => {
                n.address = address.to_owned();
                n.modify_index = index;
                self.table_index = index;
            }
            None => {
                self.nodes.insert(
                    name.to_owned(),
                    Node {
                        name: name.to_owned(),
                        address: address.to_owned(),
                        create_index: index,
                        modify_index: index,
                    },
                );
                self.table_index = index;
            }
        }
    }

    /// Registers or updates a check of an existing node.
    pub fn upsert_check(&mut self, reg: &CheckRegistration, index: u64) {
        let key = (reg.node.clone(), reg.check_id.clone());
        let create_index = self.checks.get(&key).map_or(index, |c| c.create_index);
        let new = Check {
            node: reg.node.clone(),
            check_id: reg.check_id.clone(),
            name: reg.name.clone(),
            status: reg.status,
            output: reg.output.clone(),
            service_id: reg.service_id.clone(),
            create_index,
            modify_index: index,
        };
        let unchanged = self.checks.get(&key).is_some_and(|c| {
            c.name == new.name
                && c.status == new.status
                && c.output == new.output
                && c.service_id == new.service_id
        });
        if !unchanged {
            self.checks.insert(key, new);
            self.table_index = index;
        }
    }

    pub fn remove_check(&mut self, node: &str, check_id: &str, index: u64) -> bool {
        let removed = self
            .checks
            .remove(&(node.to_owned(), check_id.to_owned()))
            .is_some();
        if removed {
            self.table_index = index;
        }
        removed
    }

    /// Removes a node and its checks; returns the IDs of the checks removed.
    pub fn remove_node(&mut self, name: &str, index: u64) -> Option<Vec<String>> {
        self.nodes.remove(name)?;
        let ids: Vec<String> = self.node_checks(name).map(|c| c.check_id.clone()).collect();
        for id in &ids {
            self.checks.remove(&(name.to_owned(), id.clone()));
        }
        self.table_index = index;
        Some(ids)
    }
}
