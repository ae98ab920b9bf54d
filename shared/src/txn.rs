//! Transactions that touch the catalog as well as KV (`/v1/txn` with `Node`, `Service` or
//! `Check` ops, Consul's verbs `get`, `set`, `cas`, `delete`, `delete-cas`): the ops, their
//! results and Consul's error texts. A transaction of KV ops alone stays a [`crate::kv`]
//! transaction; this is the one that mixes.

use serde::{Deserialize, Serialize};

use crate::catalog::{Check, Node, Service};
use crate::kv::{KvEntry, KvOp};

/// What a catalog op does to its node, service or check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatalogVerb {
    /// 0: read it; an error when it does not exist.
    Get,
    /// 1: create or replace it.
    Set,
    /// 2: `set` only while its ModifyIndex is the op's (0: only if absent).
    Cas,
    /// 3: remove it, whether or not it exists.
    Delete,
    /// 4: remove it only while its ModifyIndex is the op's.
    DeleteCas,
}

impl CatalogVerb {
    /// Consul's verb names.
    pub fn parse(verb: &str) -> Option<CatalogVerb> {
        Some(match verb {
            "get" => CatalogVerb::Get,
            "set" => CatalogVerb::Set,
            "cas" => CatalogVerb::Cas,
            "delete" => CatalogVerb::Delete,
            "delete-cas" => CatalogVerb::DeleteCas,
            _ => return None,
        })
    }

    pub fn is_write(self) -> bool {
        self != CatalogVerb::Get
    }
}

/// One op of a mixed transaction. A node is named by `name`; the op's `modify_index` is what
/// `cas` and `delete-cas` compare against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// 0
    Kv(KvOp),
    /// 1
    Node { verb: CatalogVerb, node: Node },
    /// 2: `service.node` names the node.
    Service { verb: CatalogVerb, service: Service },
    /// 3
    Check { verb: CatalogVerb, check: Check },
}

impl TxnOp {
    pub fn is_write(&self) -> bool {
        match self {
            TxnOp::Kv(op) => op.is_write(),
            TxnOp::Node { verb, .. } | TxnOp::Service { verb, .. } | TxnOp::Check { verb, .. } => {
                verb.is_write()
            }
        }
    }
}

/// One result of a committed mixed transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnResult {
    /// 0
    Kv(KvEntry),
    /// 1
    Node(Node),
    /// 2
    Service(Service),
    /// 3
    Check(Check),
}

/// One failed op: its position and Consul's text for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnFailure {
    pub op_index: usize,
    pub what: String,
}

/// A mixed transaction's outcome: every result in op order (deletes give none), or every
/// failure with nothing applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatalogTxnOutcome {
    /// 0
    Committed(Vec<TxnResult>),
    /// 1
    RolledBack(Vec<TxnFailure>),
}

/// Why a catalog op of a transaction failed; the texts are Consul's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogOpError {
    #[error("node {0:?} doesn't exist")]
    NodeMissing(String),
    #[error("failed to set node {0:?}, index is stale")]
    NodeCasStale(String),
    #[error("failed to delete node {0:?}, index is stale")]
    NodeDeleteCasStale(String),
    #[error("service {service:?} on node {node:?} doesn't exist")]
    ServiceMissing { node: String, service: String },
    #[error("failed to set service {service:?} on node {node:?}, index is stale")]
    ServiceCasStale { node: String, service: String },
    #[error("failed to delete service {service:?} on node {node:?}, index is stale")]
    ServiceDeleteCasStale { node: String, service: String },
    #[error("check {check:?} on node {node:?} doesn't exist")]
    CheckMissing { node: String, check: String },
    #[error("failed to set check {check:?} on node {node:?}, index is stale")]
    CheckCasStale { node: String, check: String },
    #[error("failed to delete check {check:?} on node {node:?}, index is stale")]
    CheckDeleteCasStale { node: String, check: String },
    #[error("Missing node registration")]
    MissingNode,
    #[error("Missing service registration")]
    MissingService,
}
