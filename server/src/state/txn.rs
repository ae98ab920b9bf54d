//! Transactions with catalog ops ([`Op::Txn`](vigil_shared::rpc::Op::Txn)): KV, node, service
//! and check ops in order, later ops seeing earlier ones, every failure reported, and nothing
//! applied unless all succeed. A catalog change can invalidate sessions, which releases KV
//! locks and native locks, so the ops run on a copy of the whole state that replaces it only
//! when every op succeeded: all or nothing across every table, at the cost of one copy per
//! such transaction (they are rare: registrations, not the lock path).

use vigil_shared::catalog::{Check, Node, Service};
use vigil_shared::kv::{KvOp, TxnOutcome};
use vigil_shared::rpc::{Op, Registration, Response};
use vigil_shared::txn::{
    CatalogOpError, CatalogTxnOutcome, CatalogVerb, TxnFailure, TxnOp, TxnResult,
};

use super::catalog::Touched;
use super::{Effects, StateMachine};

/// Whether a `cas` may write over `existing` (its ModifyIndex): index 0 only creates, any other
/// index must be the current one's.
fn cas_allows(existing: Option<u64>, index: u64) -> bool {
    match existing {
        None => index == 0,
        Some(current) => index != 0 && index == current,
    }
}

/// Whether a `delete-cas` goes ahead: something missing is already deleted (Consul answers it
/// without an error); something present only at the op's index.
fn delete_cas_allows(existing: Option<u64>, index: u64) -> bool {
    existing.is_none_or(|current| current == index)
}

impl StateMachine {
    /// Runs a mixed transaction at `index`; see the module docs.
    pub(super) fn apply_txn(
        &mut self,
        index: u64,
        now_ms: u64,
        ops: Vec<TxnOp>,
        fx: &mut Effects,
    ) -> Response {
        let mut scratch = self.clone();
        let mut scratch_fx = fx.clone();
        let mut results = Vec::new();
        let mut failures = Vec::new();
        for (op_index, op) in ops.into_iter().enumerate() {
            match scratch.txn_op(index, now_ms, op, &mut scratch_fx) {
                Ok(mut out) => results.append(&mut out),
                Err(what) => failures.push(TxnFailure { op_index, what }),
            }
        }
        if !failures.is_empty() {
            return Response::CatalogTxn(CatalogTxnOutcome::RolledBack(failures));
        }
        *self = scratch;
        *fx = scratch_fx;
        Response::CatalogTxn(CatalogTxnOutcome::Committed(results))
    }

    /// One op: its results, or Consul's text for why it failed.
    fn txn_op(
        &mut self,
        index: u64,
        now_ms: u64,
        op: TxnOp,
        fx: &mut Effects,
    ) -> Result<Vec<TxnResult>, String> {
        match op {
            TxnOp::Kv(op) => self.txn_kv(index, now_ms, op, fx),
            TxnOp::Node { verb, node } => self
                .txn_node(index, now_ms, verb, node, fx)
                .map_err(|e| e.to_string()),
            TxnOp::Service { verb, service } => self
                .txn_service(index, now_ms, verb, service, fx)
                .map_err(|e| e.to_string()),
            TxnOp::Check { verb, check } => self
                .txn_check(index, now_ms, verb, check, fx)
                .map_err(|e| e.to_string()),
        }
    }

    fn txn_kv(
        &mut self,
        index: u64,
        now_ms: u64,
        op: KvOp,
        fx: &mut Effects,
    ) -> Result<Vec<TxnResult>, String> {
        match self.apply_kv(&[op], index, now_ms, fx) {
            TxnOutcome::Committed(entries) => Ok(entries.into_iter().map(TxnResult::Kv).collect()),
            TxnOutcome::RolledBack(errors) => Err(errors
                .into_iter()
                .next()
                .map(|e| e.error.to_string())
                .unwrap_or_default()),
        }
    }

    fn txn_node(
        &mut self,
        index: u64,
        now_ms: u64,
        verb: CatalogVerb,
        node: Node,
        fx: &mut Effects,
    ) -> Result<Vec<TxnResult>, CatalogOpError> {
        let existing = self.catalog.node(&node.name).map(|n| n.modify_index);
        match verb {
            CatalogVerb::Get => {
                // By ID when one is given, as Consul looks it up.
                let found = if node.id.is_empty() {
                    self.catalog.node(&node.name)
                } else {
                    self.catalog.nodes().find(|n| n.id == node.id)
                };
                let found = found.ok_or_else(|| CatalogOpError::NodeMissing(node.name.clone()))?;
                Ok(vec![TxnResult::Node(found.clone())])
            }
            CatalogVerb::Set | CatalogVerb::Cas => {
                if verb == CatalogVerb::Cas && !cas_allows(existing, node.modify_index) {
                    return Err(CatalogOpError::NodeCasStale(node.name));
                }
                let registration = Registration {
                    node: node.name.clone(),
                    node_id: node.id,
                    address: node.address,
                    tagged_addresses: node.tagged_addresses,
                    node_meta: node.meta,
                    ..Registration::default()
                };
                let mut t = Touched::default();
                self.catalog.register(&registration, index, &mut t);
                fx.catalog(t);
                let stored = self.catalog.node(&node.name).cloned().unwrap_or_default();
                Ok(vec![TxnResult::Node(stored)])
            }
            CatalogVerb::Delete | CatalogVerb::DeleteCas => {
                if verb == CatalogVerb::DeleteCas && !delete_cas_allows(existing, node.modify_index)
                {
                    return Err(CatalogOpError::NodeDeleteCasStale(node.name));
                }
                self.apply_op(index, now_ms, Op::DeregisterNode { name: node.name }, fx);
                Ok(Vec::new())
            }
        }
    }

    fn txn_service(
        &mut self,
        index: u64,
        now_ms: u64,
        verb: CatalogVerb,
        service: Service,
        fx: &mut Effects,
    ) -> Result<Vec<TxnResult>, CatalogOpError> {
        let current = |sm: &StateMachine| {
            sm.catalog
                .node_services(&service.node)
                .find(|s| s.id == service.id)
                .cloned()
        };
        let existing = current(self).map(|s| s.modify_index);
        let missing = || CatalogOpError::ServiceMissing {
            node: service.node.clone(),
            service: service.id.clone(),
        };
        match verb {
            CatalogVerb::Get => Ok(vec![TxnResult::Service(current(self).ok_or_else(missing)?)]),
            CatalogVerb::Set | CatalogVerb::Cas => {
                if verb == CatalogVerb::Cas && !cas_allows(existing, service.modify_index) {
                    return Err(CatalogOpError::ServiceCasStale {
                        node: service.node,
                        service: service.id,
                    });
                }
                if self.catalog.node(&service.node).is_none() {
                    return Err(CatalogOpError::MissingNode);
                }
                let registration = Registration {
                    node: service.node.clone(),
                    skip_node_update: true,
                    service: Some(service.clone()),
                    ..Registration::default()
                };
                let mut t = Touched::default();
                self.catalog.register(&registration, index, &mut t);
                fx.catalog(t);
                Ok(vec![TxnResult::Service(current(self).ok_or_else(missing)?)])
            }
            CatalogVerb::Delete | CatalogVerb::DeleteCas => {
                if verb == CatalogVerb::DeleteCas
                    && !delete_cas_allows(existing, service.modify_index)
                {
                    return Err(CatalogOpError::ServiceDeleteCasStale {
                        node: service.node,
                        service: service.id,
                    });
                }
                let op = Op::DeregisterService {
                    node: service.node,
                    service_id: service.id,
                };
                self.apply_op(index, now_ms, op, fx);
                Ok(Vec::new())
            }
        }
    }

    fn txn_check(
        &mut self,
        index: u64,
        now_ms: u64,
        verb: CatalogVerb,
        check: Check,
        fx: &mut Effects,
    ) -> Result<Vec<TxnResult>, CatalogOpError> {
        let current = |sm: &StateMachine| {
            sm.catalog
                .node_checks(&check.node)
                .into_iter()
                .find(|c| c.check_id == check.check_id)
        };
        let existing = current(self).map(|c| c.modify_index);
        let missing = || CatalogOpError::CheckMissing {
            node: check.node.clone(),
            check: check.check_id.clone(),
        };
        match verb {
            CatalogVerb::Get => Ok(vec![TxnResult::Check(current(self).ok_or_else(missing)?)]),
            CatalogVerb::Set | CatalogVerb::Cas => {
                if verb == CatalogVerb::Cas && !cas_allows(existing, check.modify_index) {
                    return Err(CatalogOpError::CheckCasStale {
                        node: check.node,
                        check: check.check_id,
                    });
                }
                if self.catalog.node(&check.node).is_none() {
                    return Err(CatalogOpError::MissingNode);
                }
                if !check.service_id.is_empty()
                    && !self
                        .catalog
                        .node_services(&check.node)
                        .any(|s| s.id == check.service_id)
                {
                    return Err(CatalogOpError::MissingService);
                }
                let mut t = Touched::default();
                self.catalog.upsert_check(&check, index, &mut t);
                fx.catalog(t);
                self.invalidate_if_critical(&check, index, now_ms, fx);
                Ok(vec![TxnResult::Check(current(self).ok_or_else(missing)?)])
            }
            CatalogVerb::Delete | CatalogVerb::DeleteCas => {
                if verb == CatalogVerb::DeleteCas
                    && !delete_cas_allows(existing, check.modify_index)
                {
                    return Err(CatalogOpError::CheckDeleteCasStale {
                        node: check.node,
                        check: check.check_id,
                    });
                }
                let op = Op::DeregisterCheck {
                    node: check.node,
                    check_id: check.check_id,
                };
                self.apply_op(index, now_ms, op, fx);
                Ok(Vec::new())
            }
        }
    }
}
