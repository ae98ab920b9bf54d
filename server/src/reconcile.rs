//! Member reconciliation: turns the gossip member list into catalog commands (Consul's
//! `leader_registrator_v1`). Alive → node registered with `serfHealth` passing; failed →
//! `serfHealth` critical (which invalidates the sessions bound to it); left → node deregistered
//! (which invalidates all of its sessions). A server's node also carries the `consul` service
//! at its RPC port, as Consul's servers register it, which is how tools find the servers.
//! Pure: member list and catalog in, commands out.
//!
//! Members are keyed by name *and* address: one decision per node name, taken from a live
//! record of that name if there is one; a failed or left record only speaks for the catalog
//! node when it is at the node's catalog address. So a member that took a live node's name from
//! another address and then left or crashed never deregisters or fails the live node.

use std::collections::BTreeMap;

use vigil_shared::catalog::{
    CONSUL_SERVICE, HealthStatus, MemberRole, MemberState, MemberStatus, SERF_HEALTH, Service,
};
use vigil_shared::rpc::{CheckRegistration, Op, Registration};

use crate::state::catalog::Catalog;

const ALIVE_OUTPUT: &str = "Agent alive and reachable";
const FAILED_OUTPUT: &str = "Agent not live or unreachable";

fn serf_check(node: &str, status: HealthStatus, output: &str) -> Op {
    Op::RegisterCheck(CheckRegistration {
        node: node.to_owned(),
        check_id: SERF_HEALTH.to_owned(),
        name: "Serf Health Status".to_owned(),
        status,
        output: output.to_owned(),
        ..CheckRegistration::default()
    })
}

/// The `consul` service of a server member, as Consul's leader registers it.
fn consul_service(member: &MemberStatus) -> Service {
    Service {
        node: member.name.clone(),
        id: CONSUL_SERVICE.to_owned(),
        name: CONSUL_SERVICE.to_owned(),
        port: member.rpc_addr.port(),
        ..Service::default()
    }
}

fn is_live(state: MemberState) -> bool {
    matches!(state, MemberState::Alive | MemberState::Leaving)
}

/// The record that speaks for node `name` among `records` (all named `name`): a live one (the
/// one at the catalog address first), else a down one at the catalog address; a down record
/// elsewhere is about another process and says nothing about the catalog's node. A name the
/// catalog does not have takes its first record.
fn deciding<'a>(
    records: &[&'a MemberStatus],
    catalog_address: Option<&str>,
) -> Option<&'a MemberStatus> {
    let at_node =
        |m: &&&MemberStatus| catalog_address == Some(m.gossip_addr.ip().to_string().as_str());
    let live = || records.iter().filter(|m| is_live(m.state));
    live()
        .find(at_node)
        .or_else(|| live().next())
        .or_else(|| match catalog_address {
            Some(_) => records.iter().find(at_node),
            None => records.first(),
        })
        .copied()
}

/// The commands that make the catalog agree with `members`. `leader` is this server's node
/// name: the leader never marks itself failed or deregisters itself.
pub fn plan(members: &[MemberStatus], catalog: &Catalog, leader: &str) -> Vec<Op> {
    let mut by_name: BTreeMap<&str, Vec<&MemberStatus>> = BTreeMap::new();
    for member in members {
        by_name.entry(&member.name).or_default().push(member);
    }
    let mut ops = Vec::new();
    for (name, records) in by_name {
        let node = catalog.node(name);
        let Some(member) = deciding(&records, node.map(|n| n.address.as_str())) else {
            continue;
        };
        let address = member.gossip_addr.ip().to_string();
        let check = catalog.check(name, SERF_HEALTH);
        let state = if name == leader {
            MemberState::Alive
        } else {
            member.state
        };
        // A live member's node is (re)registered at its address; a failed one's only if missing.
        let (register, status, output) = match state {
            MemberState::Alive | MemberState::Leaving => (
                node.is_none_or(|n| n.address != address),
                HealthStatus::Passing,
                ALIVE_OUTPUT,
            ),
            MemberState::Failed => (node.is_none(), HealthStatus::Critical, FAILED_OUTPUT),
            MemberState::Left => {
                if node.is_some() {
                    ops.push(Op::DeregisterNode {
                        name: name.to_owned(),
                    });
                }
                continue;
            }
        };
        if register {
            ops.push(Op::RegisterNode {
                name: name.to_owned(),
                address: address.clone(),
            });
        }
        if check.is_none_or(|c| c.status != status) {
            ops.push(serf_check(name, status, output));
        }
        if member.role == MemberRole::Server && is_live(state) {
            let service = consul_service(member);
            let current =
                node.and_then(|_| catalog.node_services(name).find(|s| s.id == CONSUL_SERVICE));
            let same = current.is_some_and(|c| {
                Service {
                    create_index: 0,
                    modify_index: 0,
                    ..c.clone()
                } == service
            });
            if !same {
                ops.push(Op::CatalogRegister(Registration {
                    node: name.to_owned(),
                    address,
                    skip_node_update: true,
                    service: Some(service),
                    ..Registration::default()
                }));
            }
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_shared::rpc::Command;

    use crate::state::StateMachine;

    fn member(name: &str, state: MemberState) -> MemberStatus {
        MemberStatus {
            name: name.to_owned(),
            gossip_addr: "127.0.0.7:8301".parse().unwrap(),
            rpc_addr: "127.0.0.7:8300".parse().unwrap(),
            role: MemberRole::Client,
            datacenter: "dc1".to_owned(),
            state,
            pruned: false,
            protocol: vigil_shared::PROTOCOL,
        }
    }

    /// A state machine that ops are applied to as the leader applies them, at raft indexes
    /// 1, 2, …
    #[derive(Default)]
    struct Leader {
        sm: StateMachine,
        index: u64,
    }

    impl Leader {
        fn apply(&mut self, op: Op) {
            self.index += 1;
            self.sm.apply(self.index, Command { now_ms: 1_000, op });
        }

        /// Applies the plan for `members`, then plans again: a converged catalog needs nothing
        /// more.
        fn converge(&mut self, members: &[MemberStatus]) -> Vec<Op> {
            let ops = plan(members, self.catalog(), "leader");
            for op in ops.clone() {
                self.apply(op);
            }
            assert_eq!(plan(members, self.catalog(), "leader"), Vec::new());
            ops
        }

        fn catalog(&self) -> &Catalog {
            self.sm.catalog()
        }

        fn serf_status(&self, node: &str) -> HealthStatus {
            self.catalog().check(node, SERF_HEALTH).unwrap().status
        }
    }

    #[test]
    fn alive_member_is_registered_with_passing_serf_health() {
        // TestLeader_RegisterMember: an alive member gets a node and a passing serfHealth.
        let mut leader = Leader::default();
        let ops = leader.converge(&[member("c1", MemberState::Alive)]);
        assert_eq!(ops.len(), 2);
        let check = leader.catalog().check("c1", SERF_HEALTH).unwrap();
        assert_eq!(check.status, HealthStatus::Passing);
        assert_eq!(leader.catalog().node("c1").unwrap().address, "127.0.0.7");
    }

    #[test]
    fn a_live_server_carries_the_consul_service_and_a_client_does_not() {
        // TestLeader_RegisterMember for a server: its node gets service `consul` at its RPC port.
        let mut leader = Leader::default();
        let server = MemberStatus {
            role: MemberRole::Server,
            ..member("s1", MemberState::Alive)
        };
        leader.converge(&[server.clone(), member("c1", MemberState::Alive)]);
        let consul: Vec<_> = leader
            .catalog()
            .services()
            .filter(|s| s.name == CONSUL_SERVICE)
            .collect();
        assert_eq!(consul.len(), 1);
        assert_eq!((consul[0].node.as_str(), consul[0].port), ("s1", 8300));
        // A failed server keeps it (its serfHealth is what goes critical).
        leader.converge(&[MemberStatus {
            state: MemberState::Failed,
            ..server
        }]);
        assert_eq!(leader.catalog().node_services("s1").count(), 1);
    }

    #[test]
    fn failed_member_goes_critical_and_loses_its_sessions() {
        // TestLeader_FailedMember: a failed member's serfHealth is critical, which invalidates
        // the sessions bound to it.
        let mut leader = Leader::default();
        leader.converge(&[member("c1", MemberState::Alive)]);
        let session = vigil_shared::session::Session {
            node_checks: vec![SERF_HEALTH.into()],
            id: "s1".to_owned(),
            node: "c1".to_owned(),
            ..Default::default()
        };
        leader.apply(Op::CreateSession(session));
        assert!(leader.sm.sessions().get("s1").is_some());

        let ops = leader.converge(&[member("c1", MemberState::Failed)]);
        assert_eq!(
            ops,
            vec![serf_check("c1", HealthStatus::Critical, FAILED_OUTPUT)]
        );
        assert!(leader.sm.sessions().get("s1").is_none());

        // Coming back flips it to passing again (the session stays gone).
        leader.converge(&[member("c1", MemberState::Alive)]);
        assert_eq!(leader.serf_status("c1"), HealthStatus::Passing);
    }

    #[test]
    fn failed_member_unknown_to_the_catalog_is_registered_critical() {
        let mut leader = Leader::default();
        leader.converge(&[member("c9", MemberState::Failed)]);
        assert_eq!(leader.serf_status("c9"), HealthStatus::Critical);
    }

    #[test]
    fn left_member_is_deregistered() {
        // TestLeader_LeftMember: the node is deregistered; a left node not in the catalog needs
        // nothing.
        let mut leader = Leader::default();
        leader.converge(&[member("c1", MemberState::Alive)]);
        let ops = leader.converge(&[member("c1", MemberState::Left)]);
        assert_eq!(ops, vec![Op::DeregisterNode { name: "c1".into() }]);
        assert!(leader.catalog().node("c1").is_none());
        assert_eq!(
            plan(
                &[member("c2", MemberState::Left)],
                leader.catalog(),
                "leader"
            ),
            Vec::new()
        );
    }

    #[test]
    fn leader_never_fails_or_deregisters_itself() {
        // TestLeader_ReapOrLeftMember_IgnoreSelf.
        let mut leader = Leader::default();
        leader.converge(&[member("leader", MemberState::Alive)]);
        for state in [MemberState::Failed, MemberState::Left] {
            assert_eq!(
                plan(&[member("leader", state)], leader.catalog(), "leader"),
                Vec::new()
            );
        }
    }

    fn at(name: &str, state: MemberState, gossip_addr: &str) -> MemberStatus {
        MemberStatus {
            gossip_addr: gossip_addr.parse().unwrap(),
            ..member(name, state)
        }
    }

    #[test]
    fn an_impostors_down_record_never_touches_the_live_node() {
        // A member took c1's name from another address (another host, or another port of the
        // same host) and then left or crashed, while the real c1 lives.
        let mut leader = Leader::default();
        let real = member("c1", MemberState::Alive);
        leader.converge(std::slice::from_ref(&real));
        for impostor_addr in ["127.0.0.9:8301", "127.0.0.7:9301"] {
            for state in [MemberState::Left, MemberState::Failed] {
                let impostor = at("c1", state, impostor_addr);
                for list in [
                    vec![real.clone(), impostor.clone()],
                    vec![impostor.clone(), real.clone()],
                ] {
                    assert_eq!(
                        plan(&list, leader.catalog(), "leader"),
                        Vec::new(),
                        "{list:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_down_record_at_another_address_says_nothing_about_the_node() {
        // Only the impostor's record is known (the real c1 is registered at .7).
        let mut leader = Leader::default();
        leader.converge(&[member("c1", MemberState::Alive)]);
        for state in [MemberState::Left, MemberState::Failed] {
            let impostor = at("c1", state, "127.0.0.9:8301");
            assert_eq!(plan(&[impostor], leader.catalog(), "leader"), Vec::new());
        }
        // The record at the node's address still decides.
        let ops = leader.converge(&[
            at("c1", MemberState::Left, "127.0.0.9:8301"),
            member("c1", MemberState::Failed),
        ]);
        assert_eq!(
            ops,
            vec![serf_check("c1", HealthStatus::Critical, FAILED_OUTPUT)]
        );
    }

    #[test]
    fn address_change_reregisters_the_node() {
        let mut leader = Leader::default();
        leader.converge(&[member("c1", MemberState::Alive)]);
        let mut moved = member("c1", MemberState::Alive);
        moved.gossip_addr = "127.0.0.8:8301".parse().unwrap();
        let ops = leader.converge(&[moved]);
        assert_eq!(
            ops,
            vec![Op::RegisterNode {
                name: "c1".into(),
                address: "127.0.0.8".into()
            }]
        );
    }
}
