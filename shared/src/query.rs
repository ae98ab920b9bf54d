//! Prepared queries: a named, stored service lookup (`/v1/query`). A query bound to a session
//! is deleted when that session is invalidated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The service lookup a prepared query runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceQuery {
    pub service: String,
    /// Tags every instance must have; a tag written `!t` excludes instances tagged `t`.
    pub tags: Vec<String>,
    /// Leave out instances with a warning check (critical ones are always left out).
    pub only_passing: bool,
    pub node_meta: BTreeMap<String, String>,
    pub service_meta: BTreeMap<String, String>,
    /// Kept and echoed; Vigil has one datacenter, so there is nowhere to fail over to.
    pub failover_nearest_n: i64,
    pub failover_datacenters: Vec<String>,
    pub near: String,
    /// Checks that do not count against an instance's health when the query runs. Not in the
    /// first release (see [`crate::first_release`]).
    pub ignore_check_ids: Vec<String>,
}

/// A stored prepared query. In a create or update the indexes are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedQuery {
    pub id: String,
    pub name: String,
    /// Empty, or the session whose invalidation deletes this query.
    pub session: String,
    pub token: String,
    pub service: ServiceQuery,
    /// The DNS TTL (a Go duration string, possibly empty).
    pub dns_ttl: String,
    pub create_index: u64,
    pub modify_index: u64,
}
