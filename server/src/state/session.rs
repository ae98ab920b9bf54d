//! The sessions table: live sessions by lowercase ID, with secondary indexes by node and by
//! (node, check), so node and check events find the sessions they invalidate directly.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use vigil_shared::session::Session;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStore {
    by_id: BTreeMap<String, Session>,
    by_node: HashMap<String, BTreeSet<String>>,
    by_check: HashMap<(String, String), BTreeSet<String>>,
    /// Raft index of the latest create or destroy of any session.
    table_index: u64,
}

impl SessionStore {
    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    /// Looks a session up; IDs match case-insensitively.
    pub fn get(&self, id: &str) -> Option<&Session> {
        self.by_id.get(&id.to_ascii_lowercase())
    }

    pub fn list(&self) -> impl Iterator<Item = &Session> {
        self.by_id.values()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn on_node(&self, node: &str) -> Vec<String> {
        self.by_node
            .get(node)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn on_check(&self, node: &str, check_id: &str) -> Vec<String> {
        self.by_check
            .get(&(node.to_owned(), check_id.to_owned()))
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn insert(&mut self, session: Session, index: u64) {
        let id = session.id.to_ascii_lowercase();
        self.by_node
            .entry(session.node.clone())
            .or_default()
            .insert(id.clone());
        for check in session.all_checks() {
            self.by_check
                .entry((session.node.clone(), check))
                .or_default()
                .insert(id.clone());
        }
        self.by_id.insert(id, session);
        self.table_index = index;
    }

    pub fn remove(&mut self, id: &str, index: u64) -> Option<Session> {
        let id = id.to_ascii_lowercase();
        let session = self.by_id.remove(&id)?;
        remove_from(&mut self.by_node, &session.node, &id);
        for check in session.all_checks() {
            remove_from(&mut self.by_check, &(session.node.clone(), check), &id);
        }
        self.table_index = index;
        Some(session)
    }
}

fn remove_from<K: std::hash::Hash + Eq>(
    index: &mut HashMap<K, BTreeSet<String>>,
    key: &K,
    id: &str,
) {
    if let Some(ids) = index.get_mut(key) {
        ids.remove(id);
        if ids.is_empty() {
            index.remove(key);
        }
    }
}
