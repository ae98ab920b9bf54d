//! The session contract, replayed over the committed log: which sessions exist after each
//! entry, and which entry invalidated each one. A session is created only on a registered node
//! whose checks it binds all exist and none is critical; it is invalidated by its destroy, by
//! its TTL expiry, by one of its checks going critical or being deregistered, and by its
//! node's deregistration. The checks hold the servers to it: what they serve must agree with
//! this replay, whatever faults struck between the entries.

use std::collections::{BTreeMap, BTreeSet};

use vigil_shared::catalog::HealthStatus;
use vigil_shared::rpc::Op;

/// What a session binds: its node and the checks of that node it depends on.
pub type Binding = (String, Vec<String>);

/// The contract's view of the sessions after some prefix of the committed log.
#[derive(Default)]
pub struct Contract {
    nodes: BTreeSet<String>,
    /// (node, check ID) → whether the check is critical.
    checks: BTreeMap<(String, String), bool>,
    /// Sessions alive, with what they bind.
    pub alive: BTreeMap<String, Binding>,
    /// Each invalidated session: the index and clock (ms) of the entry that ended it.
    pub invalidated: BTreeMap<String, (u64, u64)>,
}

impl Contract {
    /// Replays committed ops in order, each with its index and the clock it was applied with;
    /// `bindings` is what each session was created to bind, as its client asked.
    pub fn replay<'a>(
        ops: impl IntoIterator<Item = (u64, &'a Op, u64)>,
        bindings: &BTreeMap<String, Binding>,
    ) -> Contract {
        let mut contract = Contract::default();
        for (index, op, stamp) in ops {
            contract.apply(op, index, stamp, bindings);
        }
        contract
    }

    fn apply(&mut self, op: &Op, index: u64, stamp: u64, bindings: &BTreeMap<String, Binding>) {
        match op {
            Op::Batch(ops) => {
                for op in ops {
                    self.apply(op, index, stamp, bindings);
                }
            }
            Op::RegisterNode { name, .. } => {
                self.nodes.insert(name.clone());
            }
            Op::RegisterCheck(check) if self.nodes.contains(&check.node) => {
                let critical = check.status == HealthStatus::Critical;
                let key = (check.node.clone(), check.check_id.clone());
                self.checks.insert(key.clone(), critical);
                if critical {
                    let ends = |_: &str, (node, checks): &Binding| {
                        *node == key.0 && checks.contains(&key.1)
                    };
                    self.end(ends, index, stamp);
                }
            }
            Op::DeregisterCheck { node, check_id } => {
                let key = (node.clone(), check_id.clone());
                if self.checks.remove(&key).is_some() {
                    let ends =
                        |_: &str, (n, checks): &Binding| n == node && checks.contains(check_id);
                    self.end(ends, index, stamp);
                }
            }
            Op::DeregisterNode { name } => {
                self.nodes.remove(name);
                self.checks.retain(|(node, _), _| node != name);
                self.end(|_, (node, _)| node == name, index, stamp);
            }
            Op::CreateSession(session) => {
                let binding = bindings
                    .get(&session.id)
                    .cloned()
                    .unwrap_or_else(|| (session.node.clone(), session.all_checks()));
                let healthy = binding.1.iter().all(|check| {
                    self.checks.get(&(binding.0.clone(), check.clone())) == Some(&false)
                });
                let new = !self.alive.contains_key(&session.id)
                    && !self.invalidated.contains_key(&session.id);
                if self.nodes.contains(&binding.0) && healthy && new {
                    self.alive.insert(session.id.clone(), binding);
                }
            }
            Op::DestroySession { id } | Op::ExpireSession { id } => {
                self.end(|session, _| session == id, index, stamp);
            }
            _ => {}
        }
    }

    /// Invalidates every live session `ends` selects (by its ID and binding).
    fn end(&mut self, ends: impl Fn(&str, &Binding) -> bool, index: u64, stamp: u64) {
        let ended: Vec<String> = self
            .alive
            .iter()
            .filter(|(id, binding)| ends(id, binding))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            self.alive.remove(&id);
            self.invalidated.insert(id, (index, stamp));
        }
    }
}

#[cfg(test)]
mod tests {
    use vigil_shared::catalog::Check;
    use vigil_shared::session::Session;

    use super::*;

    fn check(status: HealthStatus) -> Op {
        Op::RegisterCheck(Check {
            node: "n".to_owned(),
            check_id: "c".to_owned(),
            status,
            ..Check::default()
        })
    }

    fn create(id: &str) -> Op {
        Op::CreateSession(Session {
            id: id.to_owned(),
            node: "n".to_owned(),
            ..Session::default()
        })
    }

    /// Replays `ops` at indexes 1, 2, … up to `upto`.
    fn replay(ops: Vec<Op>, upto: u64) -> Contract {
        let bindings = [
            ("bound".to_owned(), ("n".to_owned(), vec!["c".to_owned()])),
            ("free".to_owned(), ("n".to_owned(), Vec::new())),
        ]
        .into();
        let ops = (1..=upto).zip(&ops).map(|(index, op)| (index, op, 0));
        Contract::replay(ops, &bindings)
    }

    #[test]
    fn a_critical_check_ends_the_sessions_bound_to_it_and_a_deregistered_node_all_of_its() {
        let node = Op::RegisterNode {
            name: "n".to_owned(),
            address: String::new(),
        };
        let deregister = Op::DeregisterNode {
            name: "n".to_owned(),
        };
        let ops = vec![
            node.clone(),
            check(HealthStatus::Passing),
            create("bound"),
            create("free"),
            check(HealthStatus::Critical),
            deregister,
        ];
        let at_critical = replay(ops.clone(), 5);
        assert_eq!(at_critical.invalidated.get("bound"), Some(&(5, 0)));
        assert!(at_critical.alive.contains_key("free"));
        assert_eq!(replay(ops, 6).invalidated.get("free"), Some(&(6, 0)));
    }

    #[test]
    fn a_session_is_not_created_on_a_critical_check_or_a_missing_node() {
        let ops = vec![create("free"), check(HealthStatus::Critical)];
        assert!(replay(ops, 2).alive.is_empty());
        let node = Op::RegisterNode {
            name: "n".to_owned(),
            address: String::new(),
        };
        let ops = vec![
            node,
            check(HealthStatus::Critical),
            create("bound"),
            create("free"),
        ];
        let contract = replay(ops, 4);
        assert_eq!(contract.alive.keys().collect::<Vec<_>>(), ["free"]);
        assert!(contract.invalidated.is_empty());
    }
}
