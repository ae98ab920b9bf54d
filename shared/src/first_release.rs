//! The first release's (`v0.1.0`) encodings of the types that have grown since. postcard writes
//! a struct as its fields in order, with no names and no count, so a field added to a type that
//! the first release's servers and agents decode, or that its raft logs and snapshots hold,
//! would change what every existing encoding means. So each such type keeps a mirror here with
//! the first release's fields alone, and the places that carry it to or from the first release
//! (an existing wire variant, the format-3 state) encode it through the mirror: the fields added
//! since are left out, and read back empty. New variants, appended, carry the type whole; they
//! are proposed only from protocol level 2 and asked only by agents of this release.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::catalog::ServiceHealth;
use crate::query::{PreparedQuery, ServiceQuery};

/// [`ServiceQuery`] as the first release encodes it (without `ignore_check_ids`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceQueryV1 {
    pub service: String,
    pub tags: Vec<String>,
    pub only_passing: bool,
    pub node_meta: BTreeMap<String, String>,
    pub service_meta: BTreeMap<String, String>,
    pub failover_nearest_n: i64,
    pub failover_datacenters: Vec<String>,
    pub near: String,
}

/// [`PreparedQuery`] as the first release encodes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedQueryV1 {
    pub id: String,
    pub name: String,
    pub session: String,
    pub token: String,
    pub service: ServiceQueryV1,
    pub dns_ttl: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl From<&PreparedQuery> for PreparedQueryV1 {
    fn from(q: &PreparedQuery) -> PreparedQueryV1 {
        let s = &q.service;
        PreparedQueryV1 {
            id: q.id.clone(),
            name: q.name.clone(),
            session: q.session.clone(),
            token: q.token.clone(),
            service: ServiceQueryV1 {
                service: s.service.clone(),
                tags: s.tags.clone(),
                only_passing: s.only_passing,
                node_meta: s.node_meta.clone(),
                service_meta: s.service_meta.clone(),
                failover_nearest_n: s.failover_nearest_n,
                failover_datacenters: s.failover_datacenters.clone(),
                near: s.near.clone(),
            },
            dns_ttl: q.dns_ttl.clone(),
            create_index: q.create_index,
            modify_index: q.modify_index,
        }
    }
}

impl From<PreparedQueryV1> for PreparedQuery {
    fn from(q: PreparedQueryV1) -> PreparedQuery {
        let s = q.service;
        PreparedQuery {
            id: q.id,
            name: q.name,
            session: q.session,
            token: q.token,
            service: ServiceQuery {
                service: s.service,
                tags: s.tags,
                only_passing: s.only_passing,
                node_meta: s.node_meta,
                service_meta: s.service_meta,
                failover_nearest_n: s.failover_nearest_n,
                failover_datacenters: s.failover_datacenters,
                near: s.near,
                ignore_check_ids: Vec::new(),
            },
            dns_ttl: q.dns_ttl,
            create_index: q.create_index,
            modify_index: q.modify_index,
        }
    }
}

/// `#[serde(with)]` for a [`PreparedQuery`] field the first release decodes.
pub mod prepared_query {
    use super::*;

    pub fn serialize<S: Serializer>(q: &PreparedQuery, s: S) -> Result<S::Ok, S::Error> {
        PreparedQueryV1::from(q).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PreparedQuery, D::Error> {
        PreparedQueryV1::deserialize(d).map(PreparedQuery::from)
    }
}

/// `#[serde(with)]` for a list of [`PreparedQuery`] the first release decodes.
pub mod prepared_queries {
    use super::*;

    pub fn serialize<S: Serializer>(qs: &[PreparedQuery], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(qs.iter().map(PreparedQueryV1::from))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PreparedQuery>, D::Error> {
        let qs = Vec::<PreparedQueryV1>::deserialize(d)?;
        Ok(qs.into_iter().map(PreparedQuery::from).collect())
    }
}

/// `#[serde(with)]` for a prepared query's run (the query and the instances it selected) the
/// first release decodes.
pub mod executed {
    use super::*;

    type Executed = Option<(PreparedQuery, Vec<ServiceHealth>)>;

    pub fn serialize<S: Serializer>(e: &Executed, s: S) -> Result<S::Ok, S::Error> {
        e.as_ref()
            .map(|(q, health)| (PreparedQueryV1::from(q), health))
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Executed, D::Error> {
        let e = Option::<(PreparedQueryV1, Vec<ServiceHealth>)>::deserialize(d)?;
        Ok(e.map(|(q, health)| (PreparedQuery::from(q), health)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query() -> PreparedQuery {
        PreparedQuery {
            id: "q".into(),
            name: "n".into(),
            service: ServiceQuery {
                service: "web".into(),
                tags: vec!["a".into()],
                ignore_check_ids: vec!["c".into()],
                ..ServiceQuery::default()
            },
            create_index: 3,
            modify_index: 4,
            ..PreparedQuery::default()
        }
    }

    #[derive(Serialize, Deserialize)]
    struct Carrier(#[serde(with = "prepared_query")] PreparedQuery);

    #[test]
    fn a_query_encodes_as_the_first_release_and_reads_back_without_the_later_fields() {
        let bytes = postcard::to_allocvec(&Carrier(query())).expect("encodes");
        assert_eq!(
            bytes,
            postcard::to_allocvec(&PreparedQueryV1::from(&query())).expect("encodes")
        );
        let Carrier(back) = postcard::from_bytes(&bytes).expect("decodes");
        let mut expected = query();
        expected.service.ignore_check_ids.clear();
        assert_eq!(back, expected);
    }
}
