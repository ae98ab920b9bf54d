//! The state machine's protocol level in a cluster whose servers may run two releases. An op of
//! a newer level is proposed in the form the older release applies, and its answer read back,
//! until the leader has raised the cluster's level (`Op::SetProtocol`), which it does once every
//! server in the raft configuration advertises the new level in gossip. So two servers never
//! apply one entry differently, and an older server never meets an op it cannot decode.

use vigil_shared::PROTOCOL;
use vigil_shared::catalog::{MemberRole, MemberState, MemberStatus};
use vigil_shared::lock::{LockHold, LockMode, LockOp, LockOutcome};
use vigil_shared::rpc::calls::ServerNode;
use vigil_shared::rpc::{AclOp, Op, Response, ServerError};

/// How to read back the answer of an op proposed in an older form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Proposed as it came.
    AsIs,
    /// A `LockOp::Enqueue` proposed as `LockOp::Acquire`, which answers without the mode.
    Enqueue(LockMode),
    /// A `LockOp::Leave` proposed as `LockOp::Release`.
    Leave,
}

/// `op` as a cluster applying protocol `level` takes it, and how to read its answer; `Err`
/// for an op the older release has no form of (it is not applied: ask again once every server
/// runs this release).
pub fn downgrade(op: Op, level: u32) -> Result<(Op, Reply), ServerError> {
    if level >= PROTOCOL {
        return Ok((op, Reply::AsIs));
    }
    Ok(match op {
        Op::Lock(lock @ LockOp::Enqueue { mode, .. }) => {
            (Op::Lock(lock.downgraded()), Reply::Enqueue(mode))
        }
        Op::Lock(lock @ LockOp::Leave { .. }) => (Op::Lock(lock.downgraded()), Reply::Leave),
        Op::ExpireSession { id } => (Op::DestroySession { id }, Reply::AsIs),
        Op::Txn(_) => {
            return Err(ServerError::Unavailable(
                "catalog operations in a transaction need every server to run this release"
                    .to_owned(),
            ));
        }
        Op::CatalogRegisterFull(registration) => {
            if registration
                .service
                .as_ref()
                .is_some_and(|s| !s.tagged_addresses.is_empty())
            {
                return Err(ServerError::Unavailable(
                    "TaggedAddresses on a service need every server to run this release".to_owned(),
                ));
            }
            (Op::CatalogRegister(registration), Reply::AsIs)
        }
        Op::SetQueryFull { query, update } => {
            if !query.service.ignore_check_ids.is_empty() {
                return Err(ServerError::Unavailable(
                    "IgnoreCheckIDs in a prepared query needs every server to run this release"
                        .to_owned(),
                ));
            }
            (Op::SetQuery { query, update }, Reply::AsIs)
        }
        // The first release's ops, and the level, which the leader raises only once every
        // server applies it: no other form. Decided for every op, so a new one does not
        // compile until someone says which release can apply it.
        op @ (Op::Kv(_)
        | Op::CreateSession(_)
        | Op::DestroySession { .. }
        | Op::RegisterNode { .. }
        | Op::RegisterCheck(_)
        | Op::DeregisterCheck { .. }
        | Op::DeregisterNode { .. }
        | Op::ReapTombstones { .. }
        | Op::CatalogRegister(_)
        | Op::DeregisterService { .. }
        | Op::SetQuery { .. }
        | Op::DeleteQuery { .. }
        | Op::CheckpointTtls { .. }
        | Op::Lock(LockOp::Acquire { .. } | LockOp::Release { .. } | LockOp::Wake { .. })
        | Op::Batch(_)
        | Op::RestoreSnapshot { .. }
        | Op::SetAutopilotConfig { .. }
        | Op::RestoreChunk { .. }
        | Op::Acl(
            AclOp::Init { .. }
            | AclOp::Bootstrap(_)
            | AclOp::SetToken { .. }
            | AclOp::DeleteToken { .. }
            | AclOp::SetPolicy { .. }
            | AclOp::DeletePolicy { .. }
            | AclOp::SetRole { .. }
            | AclOp::DeleteRole { .. },
        )
        | Op::SetProtocol { .. }) => (op, Reply::AsIs),
    })
}

impl Reply {
    /// The answer in the shape the op as asked for it gets.
    pub fn restore(self, response: Response) -> Response {
        let lock = |outcome| Response::Lock(outcome);
        match (self, response) {
            (Reply::Enqueue(mode), Response::Lock(LockOutcome::Held { token })) => {
                lock(LockOutcome::Granted { token, mode })
            }
            (Reply::Enqueue(mode), Response::Lock(LockOutcome::Queued { position, index })) => {
                lock(LockOutcome::Waiting {
                    position,
                    index,
                    mode,
                })
            }
            (Reply::Leave, Response::Lock(LockOutcome::Released { held, queued })) => {
                if held || queued {
                    lock(LockOutcome::Left)
                } else {
                    lock(LockOutcome::Stayed(LockHold::Absent))
                }
            }
            (_, response) => response,
        }
    }
}

/// Whether every server of the raft configuration is a live gossip member (by node name and
/// RPC address) whose build applies `level`.
pub fn every_server_at<'a>(
    level: u32,
    servers: impl IntoIterator<Item = &'a ServerNode>,
    members: &[MemberStatus],
) -> bool {
    servers.into_iter().all(|server| {
        members.iter().any(|m| {
            m.role == MemberRole::Server
                && matches!(m.state, MemberState::Alive | MemberState::Leaving)
                && m.name == server.name
                && m.rpc_addr.to_string() == server.rpc_addr
                && m.protocol >= level
        })
    })
}

#[cfg(test)]
mod tests {
    use vigil_shared::catalog::{Service, ServiceAddress};
    use vigil_shared::query::{PreparedQuery, ServiceQuery};
    use vigil_shared::rpc::Registration;

    use super::*;

    fn enqueue(request: u64) -> Op {
        Op::Lock(LockOp::Enqueue {
            name: "l".into(),
            session: "s".into(),
            mode: LockMode::Shared,
            limit: 1,
            try_only: false,
            request,
        })
    }

    #[test]
    fn new_lock_ops_go_out_as_the_first_release_knows_them_below_the_level() {
        let (op, reply) = downgrade(enqueue(7), 0).unwrap();
        assert!(matches!(op, Op::Lock(LockOp::Acquire { .. })));
        assert_eq!(
            reply.restore(Response::Lock(LockOutcome::Held { token: 3 })),
            Response::Lock(LockOutcome::Granted {
                token: 3,
                mode: LockMode::Shared
            })
        );
        let leave = Op::Lock(LockOp::Leave {
            name: "l".into(),
            session: "s".into(),
            request: 7,
        });
        let (op, reply) = downgrade(leave, 1).unwrap();
        assert!(matches!(op, Op::Lock(LockOp::Release { .. })));
        assert_eq!(
            reply.restore(Response::Lock(LockOutcome::Released {
                held: false,
                queued: false
            })),
            Response::Lock(LockOutcome::Stayed(LockHold::Absent))
        );
        assert_eq!(
            downgrade(enqueue(7), PROTOCOL),
            Ok((enqueue(7), Reply::AsIs))
        );
        assert!(downgrade(Op::Txn(Vec::new()), 1).is_err());
        // A TTL expiry is a plain destroy to the first release (its history is not kept).
        let expire = || Op::ExpireSession { id: "s".into() };
        assert_eq!(
            downgrade(expire(), 1),
            Ok((Op::DestroySession { id: "s".into() }, Reply::AsIs))
        );
        assert_eq!(downgrade(expire(), PROTOCOL), Ok((expire(), Reply::AsIs)));
        let query = |ignore: &[&str]| PreparedQuery {
            id: "q".into(),
            service: ServiceQuery {
                service: "web".into(),
                ignore_check_ids: ignore.iter().map(|&c| c.to_owned()).collect(),
                ..ServiceQuery::default()
            },
            ..PreparedQuery::default()
        };
        let full = |ignore| Op::SetQueryFull {
            query: query(ignore),
            update: false,
        };
        assert_eq!(
            downgrade(full(&[]), 1),
            Ok((
                Op::SetQuery {
                    query: query(&[]),
                    update: false
                },
                Reply::AsIs
            ))
        );
        assert!(downgrade(full(&["c"]), 1).is_err());
        assert_eq!(
            downgrade(full(&["c"]), PROTOCOL),
            Ok((full(&["c"]), Reply::AsIs))
        );

        let register = |tagged: &[&str]| {
            let tagged_addresses = tagged
                .iter()
                .map(|&t| (t.to_owned(), ServiceAddress::default()))
                .collect();
            Registration {
                node: "n".into(),
                service: Some(Service {
                    id: "web".into(),
                    tagged_addresses,
                    ..Service::default()
                }),
                ..Registration::default()
            }
        };
        assert_eq!(
            downgrade(Op::CatalogRegisterFull(register(&[])), 1),
            Ok((Op::CatalogRegister(register(&[])), Reply::AsIs))
        );
        assert!(downgrade(Op::CatalogRegisterFull(register(&["lan"])), 1).is_err());
        let whole = Op::CatalogRegisterFull(register(&["lan"]));
        assert_eq!(downgrade(whole.clone(), PROTOCOL), Ok((whole, Reply::AsIs)));
    }

    #[test]
    fn the_level_rises_only_when_every_configured_server_has_it() {
        let member = |name: &str, port: u16, protocol| MemberStatus {
            name: name.into(),
            gossip_addr: ([127, 0, 0, 1], port + 10).into(),
            rpc_addr: ([127, 0, 0, 1], port).into(),
            role: MemberRole::Server,
            datacenter: "dc1".into(),
            state: MemberState::Alive,
            pruned: false,
            protocol,
        };
        let servers = [
            ServerNode {
                name: "s1".into(),
                rpc_addr: "127.0.0.1:7301".into(),
            },
            ServerNode {
                name: "s2".into(),
                rpc_addr: "127.0.0.1:7302".into(),
            },
        ];
        let both = [member("s1", 7301, 2), member("s2", 7302, 2)];
        assert!(every_server_at(2, &servers, &both));
        let old = [member("s1", 7301, 2), member("s2", 7302, 1)];
        assert!(!every_server_at(2, &servers, &old));
        let unseen = [member("s1", 7301, 2)];
        assert!(!every_server_at(2, &servers, &unseen));
        let mut failed = both.clone();
        failed[1].state = MemberState::Failed;
        assert!(!every_server_at(2, &servers, &failed));
    }
}
