//! Prepared queries: stored by ID, looked up by ID or name, and run against the catalog. The
//! state machine deletes a query when the session it is bound to is invalidated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vigil_shared::catalog::{HealthStatus, ServiceHealth};
use vigil_shared::query::PreparedQuery;
use vigil_shared::rpc::ApplyError;

use super::catalog::Catalog;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryStore {
    queries: BTreeMap<String, PreparedQuery>,
    /// Raft index of the latest create, update or delete.
    table_index: u64,
}

impl QueryStore {
    pub fn table_index(&self) -> u64 {
        self.table_index
    }

    pub fn list(&self) -> impl Iterator<Item = &PreparedQuery> {
        self.queries.values()
    }

    /// A query by ID, or else by exact name.
    pub fn lookup(&self, id_or_name: &str) -> Option<&PreparedQuery> {
        self.queries.get(id_or_name).or_else(|| {
            self.queries
                .values()
                .find(|q| !q.name.is_empty() && q.name == id_or_name)
        })
    }

    /// Checks a create or update; `session_exists` says whether its session is live.
    pub fn validate(&self, query: &PreparedQuery, session_exists: bool) -> Result<(), ApplyError> {
        if !query.session.is_empty() && !session_exists {
            return Err(ApplyError::InvalidQuerySession(query.session.clone()));
        }
        if !query.name.is_empty()
            && self
                .queries
                .values()
                .any(|q| q.id != query.id && q.name == query.name)
        {
            return Err(ApplyError::DuplicateQueryName(query.name.clone()));
        }
        Ok(())
    }

    /// Creates the query, or replaces the one with its ID keeping its `CreateIndex`.
    pub fn set(&mut self, query: PreparedQuery, index: u64) {
        let create_index = self
            .queries
            .get(&query.id)
            .map_or(index, |q| q.create_index);
        let query = PreparedQuery {
            create_index,
            modify_index: index,
            ..query
        };
        self.queries.insert(query.id.clone(), query);
        self.table_index = index;
    }

    pub fn contains(&self, id: &str) -> bool {
        self.queries.contains_key(id)
    }

    pub fn delete(&mut self, id: &str, index: u64) -> bool {
        let removed = self.queries.remove(id).is_some();
        if removed {
            self.table_index = index;
        }
        removed
    }

    /// Deletes every query bound to `session`; true if any went.
    pub fn delete_for_session(&mut self, session: &str, index: u64) -> bool {
        let before = self.queries.len();
        self.queries.retain(|_, q| q.session != session);
        let removed = self.queries.len() != before;
        if removed {
            self.table_index = index;
        }
        removed
    }
}

/// The store as the first release encodes it (snapshot format 3): each query without the fields
/// added since, read back empty (a state below protocol level 2 has none: the op that sets them
/// is not proposed there).
pub mod first_release {
    use serde::{Deserializer, Serializer};
    use vigil_shared::first_release::PreparedQueryV1;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct QueryStoreV1 {
        queries: BTreeMap<String, PreparedQueryV1>,
        table_index: u64,
    }

    pub fn serialize<S: Serializer>(store: &&QueryStore, s: S) -> Result<S::Ok, S::Error> {
        QueryStoreV1 {
            queries: store
                .queries
                .iter()
                .map(|(id, q)| (id.clone(), PreparedQueryV1::from(q)))
                .collect(),
            table_index: store.table_index,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QueryStore, D::Error> {
        let store = QueryStoreV1::deserialize(d)?;
        Ok(QueryStore {
            queries: store
                .queries
                .into_iter()
                .map(|(id, q)| (id, PreparedQuery::from(q)))
                .collect(),
            table_index: store.table_index,
        })
    }
}

/// The healthy instances a query selects: never one with a critical check, with
/// `OnlyPassing` not one with a warning either, checks named in `IgnoreCheckIDs` not
/// counting (they are still listed); tags (a `!` prefix excludes, compared without
/// case as Consul does) and node and service metadata must match.
pub fn execute(query: &PreparedQuery, catalog: &Catalog) -> Vec<ServiceHealth> {
    let q = &query.service;
    catalog
        .health(&q.service)
        .into_iter()
        .filter(|h| {
            h.checks
                .iter()
                .filter(|c| !q.ignore_check_ids.contains(&c.check_id))
                .all(|c| match c.status {
                    HealthStatus::Passing => true,
                    HealthStatus::Warning => !q.only_passing,
                    HealthStatus::Critical => false,
                })
        })
        .filter(|h| {
            q.tags.iter().all(|tag| {
                let has = |t: &str| h.service.tags.iter().any(|s| s.eq_ignore_ascii_case(t));
                match tag.strip_prefix('!') {
                    Some(excluded) => !has(excluded),
                    None => has(tag),
                }
            })
        })
        .filter(|h| {
            q.node_meta
                .iter()
                .all(|(k, v)| h.node.meta.get(k) == Some(v))
                && q.service_meta
                    .iter()
                    .all(|(k, v)| h.service.meta.get(k) == Some(v))
        })
        .collect()
}
