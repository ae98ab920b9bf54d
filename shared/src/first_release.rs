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

use crate::catalog::{Check, Node, Service, ServiceHealth, Weights};
use crate::query::{PreparedQuery, ServiceQuery};
use crate::rpc::Registration;

/// [`Service`] as the first release encodes it (without `tagged_addresses`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceV1 {
    pub node: String,
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub address: String,
    pub port: u16,
    pub meta: BTreeMap<String, String>,
    pub weights: Weights,
    pub enable_tag_override: bool,
    pub create_index: u64,
    pub modify_index: u64,
}

impl From<&Service> for ServiceV1 {
    fn from(s: &Service) -> ServiceV1 {
        ServiceV1 {
            node: s.node.clone(),
            id: s.id.clone(),
            name: s.name.clone(),
            tags: s.tags.clone(),
            address: s.address.clone(),
            port: s.port,
            meta: s.meta.clone(),
            weights: s.weights,
            enable_tag_override: s.enable_tag_override,
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

impl From<ServiceV1> for Service {
    fn from(s: ServiceV1) -> Service {
        Service {
            node: s.node,
            id: s.id,
            name: s.name,
            tags: s.tags,
            address: s.address,
            port: s.port,
            tagged_addresses: BTreeMap::new(),
            meta: s.meta,
            weights: s.weights,
            enable_tag_override: s.enable_tag_override,
            create_index: s.create_index,
            modify_index: s.modify_index,
        }
    }
}

/// [`ServiceHealth`] as the first release encodes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceHealthV1 {
    pub node: Node,
    pub service: ServiceV1,
    pub checks: Vec<Check>,
}

impl From<&ServiceHealth> for ServiceHealthV1 {
    fn from(h: &ServiceHealth) -> ServiceHealthV1 {
        ServiceHealthV1 {
            node: h.node.clone(),
            service: ServiceV1::from(&h.service),
            checks: h.checks.clone(),
        }
    }
}

impl From<ServiceHealthV1> for ServiceHealth {
    fn from(h: ServiceHealthV1) -> ServiceHealth {
        ServiceHealth {
            node: h.node,
            service: h.service.into(),
            checks: h.checks,
        }
    }
}

/// [`Registration`] as the first release encodes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationV1 {
    pub node: String,
    pub node_id: String,
    pub address: String,
    pub tagged_addresses: BTreeMap<String, String>,
    pub node_meta: BTreeMap<String, String>,
    pub skip_node_update: bool,
    pub service: Option<ServiceV1>,
    pub checks: Vec<Check>,
}

impl From<&Registration> for RegistrationV1 {
    fn from(r: &Registration) -> RegistrationV1 {
        RegistrationV1 {
            node: r.node.clone(),
            node_id: r.node_id.clone(),
            address: r.address.clone(),
            tagged_addresses: r.tagged_addresses.clone(),
            node_meta: r.node_meta.clone(),
            skip_node_update: r.skip_node_update,
            service: r.service.as_ref().map(ServiceV1::from),
            checks: r.checks.clone(),
        }
    }
}

impl From<RegistrationV1> for Registration {
    fn from(r: RegistrationV1) -> Registration {
        Registration {
            node: r.node,
            node_id: r.node_id,
            address: r.address,
            tagged_addresses: r.tagged_addresses,
            node_meta: r.node_meta,
            skip_node_update: r.skip_node_update,
            service: r.service.map(Service::from),
            checks: r.checks,
        }
    }
}

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

/// The first release's encoding of a list.
fn list<T, V: From<T>>(items: Vec<T>) -> Vec<V> {
    items.into_iter().map(V::from).collect()
}

/// `#[serde(with)]` for a prepared query's run (the query and the instances it selected) the
/// first release decodes.
pub mod executed {
    use super::*;

    type Executed = Option<(PreparedQuery, Vec<ServiceHealth>)>;

    pub fn serialize<S: Serializer>(e: &Executed, s: S) -> Result<S::Ok, S::Error> {
        e.as_ref()
            .map(|(q, health)| {
                let health: Vec<ServiceHealthV1> = health.iter().map(Into::into).collect();
                (PreparedQueryV1::from(q), health)
            })
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Executed, D::Error> {
        let e = Option::<(PreparedQueryV1, Vec<ServiceHealthV1>)>::deserialize(d)?;
        Ok(e.map(|(q, health)| (PreparedQuery::from(q), list(health))))
    }
}

/// `#[serde(with)]` for a [`Registration`] the first release decodes.
pub mod registration {
    use super::*;

    pub fn serialize<S: Serializer>(r: &Registration, s: S) -> Result<S::Ok, S::Error> {
        RegistrationV1::from(r).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Registration, D::Error> {
        RegistrationV1::deserialize(d).map(Registration::from)
    }
}

/// `#[serde(with)]` for a list of [`Service`] the first release decodes.
pub mod services {
    use super::*;

    pub fn serialize<S: Serializer>(services: &[Service], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(services.iter().map(ServiceV1::from))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Service>, D::Error> {
        Vec::<ServiceV1>::deserialize(d).map(list)
    }
}

/// `#[serde(with)]` for `(node, service)` pairs the first release decodes.
pub mod service_nodes {
    use super::*;

    pub fn serialize<S: Serializer>(pairs: &[(Node, Service)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(pairs.iter().map(|(n, svc)| (n, ServiceV1::from(svc))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(Node, Service)>, D::Error> {
        let pairs = Vec::<(Node, ServiceV1)>::deserialize(d)?;
        Ok(pairs.into_iter().map(|(n, s)| (n, s.into())).collect())
    }
}

/// `#[serde(with)]` for a node and its services the first release decodes.
pub mod node_services {
    use super::*;

    type NodeServices = Option<(Node, Vec<Service>)>;

    pub fn serialize<S: Serializer>(found: &NodeServices, s: S) -> Result<S::Ok, S::Error> {
        found
            .as_ref()
            .map(|(n, services)| {
                let services: Vec<ServiceV1> = services.iter().map(Into::into).collect();
                (n, services)
            })
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NodeServices, D::Error> {
        let found = Option::<(Node, Vec<ServiceV1>)>::deserialize(d)?;
        Ok(found.map(|(n, services)| (n, list(services))))
    }
}

/// `#[serde(with)]` for a list of [`ServiceHealth`] the first release decodes.
pub mod health {
    use super::*;

    pub fn serialize<S: Serializer>(health: &[ServiceHealth], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(health.iter().map(ServiceHealthV1::from))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ServiceHealth>, D::Error> {
        Vec::<ServiceHealthV1>::deserialize(d).map(list)
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

    #[derive(Serialize, Deserialize)]
    struct Registered(#[serde(with = "registration")] Registration);

    #[test]
    fn a_registration_encodes_as_the_first_release_and_reads_back_without_tagged_addresses() {
        use crate::catalog::ServiceAddress;
        let service = Service {
            node: "n".into(),
            id: "web".into(),
            name: "web".into(),
            port: 80,
            tagged_addresses: BTreeMap::from([(
                "lan".to_owned(),
                ServiceAddress {
                    address: "10.0.0.1".into(),
                    port: 8080,
                },
            )]),
            ..Service::default()
        };
        let registration = Registration {
            node: "n".into(),
            address: "10.0.0.1".into(),
            service: Some(service),
            ..Registration::default()
        };
        let bytes = postcard::to_allocvec(&Registered(registration.clone())).expect("encodes");
        assert_eq!(
            bytes,
            postcard::to_allocvec(&RegistrationV1::from(&registration)).expect("encodes")
        );
        let Registered(back) = postcard::from_bytes(&bytes).expect("decodes");
        let mut expected = registration;
        if let Some(s) = expected.service.as_mut() {
            s.tagged_addresses.clear();
        }
        assert_eq!(back, expected);
    }

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

    /// The first release's requests to servers, as it encodes them (`rpc::calls`): a request
    /// a server forwards to the leader is its own variant with `forwarded: true`. (A box
    /// encodes as what it holds.)
    #[derive(Debug, Serialize, Deserialize)]
    enum RequestV1 {
        Hello {},
        Write {
            op: Box<crate::rpc::Op>,
            forwarded: bool,
        },
        Query {
            opts: crate::rpc::QueryOptions,
            query: crate::rpc::ReadQuery,
            forwarded: bool,
        },
        Renew {
            id: String,
            forwarded: bool,
        },
        Join {
            node_id: u64,
            node: crate::rpc::calls::ServerNode,
            forwarded: bool,
        },
        Status {},
        Operator {
            request: crate::operator::OperatorRequest,
            forwarded: bool,
        },
    }

    #[test]
    fn requests_and_their_forwarded_envelope_encode_as_the_first_release() {
        use crate::operator::OperatorRequest;
        use crate::rpc::calls::{self, Forwarded, RpcRequest, ServerNode};
        use crate::rpc::{Consistency, Op, QueryOptions, ReadQuery};

        let op = || Op::DestroySession { id: "s".into() };
        let opts = QueryOptions {
            consistency: Consistency::Consistent,
            min_index: 7,
            wait_ms: 1000,
        };
        let query = || ReadQuery::KvGet { key: "k".into() };
        let node = || ServerNode {
            name: "s2".into(),
            rpc_addr: "127.0.0.1:8300".into(),
        };
        let operator = || OperatorRequest::TransferLeader { to: Some(2) };
        let pairs = |forwarded: bool| {
            let hop = |request: Forwarded, direct: RpcRequest| {
                if forwarded {
                    RpcRequest::Forwarded(request)
                } else {
                    direct
                }
            };
            [
                (
                    hop(
                        calls::Write { op: op() }.into(),
                        RpcRequest::Write { op: op() },
                    ),
                    RequestV1::Write {
                        op: Box::new(op()),
                        forwarded,
                    },
                ),
                (
                    hop(
                        Forwarded::Query(calls::Query {
                            opts,
                            query: query(),
                        }),
                        RpcRequest::Query {
                            opts,
                            query: query(),
                        },
                    ),
                    RequestV1::Query {
                        opts,
                        query: query(),
                        forwarded,
                    },
                ),
                (
                    hop(
                        Forwarded::Renew(calls::Renew { id: "s".into() }),
                        RpcRequest::Renew { id: "s".into() },
                    ),
                    RequestV1::Renew {
                        id: "s".into(),
                        forwarded,
                    },
                ),
                (
                    hop(
                        Forwarded::Join(calls::Join {
                            node_id: 2,
                            node: node(),
                        }),
                        RpcRequest::Join {
                            node_id: 2,
                            node: node(),
                        },
                    ),
                    RequestV1::Join {
                        node_id: 2,
                        node: node(),
                        forwarded,
                    },
                ),
                (
                    hop(
                        Forwarded::Operator(calls::Operator {
                            request: operator(),
                        }),
                        RpcRequest::Operator {
                            request: operator(),
                        },
                    ),
                    RequestV1::Operator {
                        request: operator(),
                        forwarded,
                    },
                ),
            ]
        };
        let always = [
            (RpcRequest::Hello {}, RequestV1::Hello {}),
            (RpcRequest::Status {}, RequestV1::Status {}),
        ];
        for (request, v1) in pairs(false).into_iter().chain(pairs(true)).chain(always) {
            let bytes = postcard::to_allocvec(&request).expect("encodes");
            let v1_bytes = postcard::to_allocvec(&v1).expect("encodes");
            assert_eq!(bytes, v1_bytes, "{request:?}");
            // What the first release sends reads back as the same request, envelope and all.
            let back: RpcRequest = postcard::from_bytes(&v1_bytes).expect("decodes");
            assert_eq!(
                matches!(back, RpcRequest::Forwarded(_)),
                matches!(request, RpcRequest::Forwarded(_)),
                "{request:?}"
            );
            assert_eq!(postcard::to_allocvec(&back).expect("encodes"), v1_bytes);
            let _: RequestV1 = postcard::from_bytes(&bytes).expect("the first release decodes it");
        }
    }
}
