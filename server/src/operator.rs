//! Operating the server set, as Consul's `/v1/operator/*` does: removing a raft peer, handing
//! leadership to another server, autopilot's view of server health, and removing servers
//! gossip has seen dead for a while (`CleanupDeadServers`). Every request runs on the leader
//! (a follower forwards it). No change here may cost the cluster its quorum: a removal that
//! would leave fewer reachable voters than a majority of the new set is refused. The requests
//! and their answers are `vigil_shared::operator`'s.
//!
//! Leadership transfer (`transfer_leader`) is built from what openraft offers rather than on
//! its own `trigger().transfer_leader`, which stops the leader proposing until it loses
//! leadership: a target that could not campaign (its log not flushed in time) would leave the
//! cluster taking no writes. Here the leader stops its heartbeats, waits until the target holds
//! its whole log and the followers' leader leases (one maximum election timeout) have lapsed,
//! then asks the target to campaign at once (`trigger().elect(false)`, no pre-vote). The
//! target's log is the most recent, so it wins before any other follower's own election
//! timeout (lease + election timeout) fires. New entries are held back meanwhile (they would
//! renew the leases and outdate the target's log) and go out, or are redirected to the new
//! leader, when the transfer ends; heartbeats come back whatever happens. If the target loses
//! and this server wins again, it tries again until the deadline.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use openraft::{ChangeMembers, ServerState};
use tokio::time::Instant;
use vigil_shared::catalog::{MemberRole, MemberState};
use vigil_shared::operator::{
    ArchiveError, AutopilotHealth, OperatorError, OperatorReply, OperatorRequest, PeerRef,
    ServerHealth,
};
use vigil_shared::rpc::calls;
use vigil_shared::rpc::{ApplyError, Op, Response, ServerError};

use crate::raft::network::{PeerRequest, PeerResponse};
use crate::raft::{NodeId, Raft};
use crate::server::{Hop, Server};
use crate::snapshot::{Archive, RESTORE_CHUNK};

/// How long a membership change may take to commit before the operator hears it failed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a leadership transfer may take in all.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a leadership transfer looks at raft's progress.
const POLL_TRANSFER: Duration = Duration::from_millis(20);
/// A server gossip reports failed or left for this long is removed from raft by the leader.
pub const DEAD_SERVER_AFTER: Duration = Duration::from_secs(30);
/// How often the leader looks for dead servers.
const CLEANUP_EVERY: Duration = Duration::from_secs(5);

/// Runs an operator request on the leader, forwarding it from a follower.
pub(crate) async fn handle(
    server: &Server,
    request: OperatorRequest,
    hop: Hop,
) -> Result<OperatorReply, OperatorError> {
    let call = calls::Operator { request };
    server
        .at_leader(call, hop, |calls::Operator { request }| {
            run(server, request)
        })
        .await
}

/// Runs an operator request on this server, the leader.
async fn run(server: &Server, request: OperatorRequest) -> Result<OperatorReply, OperatorError> {
    match request {
        OperatorRequest::RemovePeer(peer) => remove_peer(server, peer).await,
        OperatorRequest::TransferLeader { to } => transfer_leader(server, to).await,
        OperatorRequest::AutopilotHealth => Ok(OperatorReply::Health(health(server))),
        OperatorRequest::SnapshotSave => save(server),
        OperatorRequest::SnapshotRestore(bytes) => restore(server, &bytes).await,
        OperatorRequest::AutopilotGet => Ok(OperatorReply::Autopilot(
            server.shared().read().autopilot().clone(),
        )),
        OperatorRequest::AutopilotSet { config, cas } => {
            match server
                .proposer()
                .propose(Op::SetAutopilotConfig { config, cas })
                .await?
            {
                Response::Applied(applied) => Ok(OperatorReply::Applied(applied)),
                other => Err(ServerError::Internal(format!(
                    "autopilot's settings were answered {other:?}"
                ))
                .into()),
            }
        }
    }
}

/// Gossip's view of the servers by node name.
fn serf_states(server: &Server) -> Option<HashMap<String, MemberState>> {
    let members = server.config().members.as_ref()?;
    Some(
        members
            .borrow()
            .iter()
            .filter(|m| m.role == MemberRole::Server)
            .map(|m| (m.name.clone(), m.state))
            .collect(),
    )
}

pub(crate) fn format_id(id: NodeId) -> String {
    format!("{id:016x}")
}

async fn remove_peer(server: &Server, peer: PeerRef) -> Result<OperatorReply, OperatorError> {
    let metrics = server.raft().metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership();
    let id = match &peer {
        PeerRef::Id(id) => membership
            .get_node(id)
            .map(|_| *id)
            .ok_or_else(|| OperatorError::UnknownId(format_id(*id)))?,
        PeerRef::Address(address) => membership
            .nodes()
            .find(|(_, node)| node.rpc_addr == *address)
            .map(|(id, _)| *id)
            .ok_or_else(|| OperatorError::UnknownAddress(address.clone()))?,
    };
    if id == server.node_id() {
        return Err(OperatorError::RemoveLeader(format_id(id)));
    }
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let remaining: Vec<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
    if let Some(states) = serf_states(server) {
        let alive = remaining
            .iter()
            .filter(|v| {
                **v == server.node_id()
                    || membership
                        .get_node(v)
                        .is_some_and(|n| states.get(&n.name).copied() == Some(MemberState::Alive))
            })
            .count();
        if voters.contains(&id) && alive <= remaining.len() / 2 {
            return Err(OperatorError::WouldLoseQuorum {
                peer: format_id(id),
                alive,
                voters: remaining.len(),
            });
        }
    }
    let change = if voters.contains(&id) {
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    } else {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    };
    tracing::info!(peer = %format_id(id), "removing raft peer");
    match tokio::time::timeout(
        CHANGE_TIMEOUT,
        server.raft().change_membership(change, false),
    )
    .await
    {
        Ok(Ok(_)) => Ok(OperatorReply::Done),
        Ok(Err(e)) => Err(ServerError::Membership(e.to_string()).into()),
        Err(_) => Err(ServerError::Membership(format!(
            "removing {} did not commit within {CHANGE_TIMEOUT:?}",
            format_id(id)
        ))
        .into()),
    }
}

/// Turns the leader's heartbeats back on when the transfer ends, however it ends.
struct HeartbeatsOff<'a>(&'a Raft);

impl<'a> HeartbeatsOff<'a> {
    fn new(raft: &'a Raft) -> HeartbeatsOff<'a> {
        raft.runtime_config().heartbeat(false);
        HeartbeatsOff(raft)
    }
}

impl Drop for HeartbeatsOff<'_> {
    fn drop(&mut self) {
        self.0.runtime_config().heartbeat(true);
    }
}

async fn transfer_leader(
    server: &Server,
    to: Option<NodeId>,
) -> Result<OperatorReply, OperatorError> {
    let me = server.node_id();
    let raft = server.raft();
    let metrics = raft.metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership().clone();
    let matched = |id: &NodeId| {
        metrics
            .replication
            .as_ref()
            .and_then(|r| r.get(id))
            .and_then(|m| m.as_ref())
            .map_or(0, |l| l.index)
    };
    let others: Vec<NodeId> = membership.voter_ids().filter(|v| *v != me).collect();
    let target = match to {
        Some(id) if id == me => return Err(OperatorError::TransferToSelf),
        Some(id) if others.contains(&id) => id,
        Some(id) => return Err(OperatorError::UnknownId(format_id(id))),
        None => *others
            .iter()
            .max_by_key(|id| matched(id))
            .ok_or(OperatorError::NoOtherVoters)?,
    };
    let address: std::net::SocketAddr = membership
        .get_node(&target)
        .and_then(|n| n.rpc_addr.parse().ok())
        .ok_or_else(|| OperatorError::UnknownId(format_id(target)))?;
    let config = raft.config();
    let lease = Duration::from_millis(config.election_timeout_max + config.heartbeat_interval);
    let deadline = Instant::now() + TRANSFER_TIMEOUT;
    tracing::info!(target = %format_id(target), "transferring leadership");
    let _off = HeartbeatsOff::new(raft);
    let _held = server.proposer().hold();
    // The last index this leader's log grew to, and when.
    let mut quiet = (
        raft.metrics().borrow_watched().last_log_index,
        Instant::now(),
    );
    loop {
        let (state, last, term, target_has) = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            let target_has = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&target))
                .and_then(|l| l.as_ref())
                .map(|l| l.index);
            (m.state, m.last_log_index, m.current_term, target_has)
        };
        let now = Instant::now();
        if state != ServerState::Leader || now >= deadline {
            return Err(OperatorError::TransferTimeout);
        }
        if last != quiet.0 {
            quiet = (last, now);
        }
        // The target must hold the whole log, or the others refuse it their votes; and the
        // followers' leases on this leader lapse one election timeout after its last message
        // (an entry in flight when writes were held renews them): only then do they vote.
        if target_has < last || now < quiet.1 + lease {
            tokio::time::sleep(POLL_TRANSFER).await;
            continue;
        }
        let timeout = Duration::from_secs(2);
        match server
            .peers()
            .call_typed(address, &PeerRequest::Campaign, timeout)
            .await
        {
            Ok(PeerResponse::Campaign(Ok(()))) => {}
            other => tracing::warn!(?other, "transfer target did not campaign"),
        }
        // Leadership has moved, or this server won it back in a later term (the target lost
        // its election): then try again.
        let settled = raft
            .wait(Some(deadline.saturating_duration_since(Instant::now())))
            .metrics(
                |m| {
                    m.current_leader.is_some_and(|l| l != me)
                        || (m.state == ServerState::Leader && m.current_term > term)
                },
                "leadership settled",
            )
            .await;
        match settled {
            Ok(m) if m.current_leader == Some(target) => return Ok(OperatorReply::Done),
            Ok(m) if m.state == ServerState::Leader => {
                tracing::info!(
                    term = m.current_term,
                    "leadership came back: transferring again"
                );
                quiet = (m.last_log_index, Instant::now());
            }
            _ => return Err(OperatorError::TransferTimeout),
        }
    }
}

/// The leader's state as an archive, at the index it has applied (the index of its latest
/// op, which is above the raft index when batched ops took indexes of their own).
fn save(server: &Server) -> Result<OperatorReply, OperatorError> {
    let applied = server
        .raft()
        .metrics()
        .borrow_watched()
        .last_applied
        .map_or(0, |l| l.index);
    let state = server.shared().read();
    let index = applied.max(state.index());
    let archive = Archive::of(&state, index)?;
    drop(state);
    Ok(OperatorReply::Snapshot {
        index,
        archive: archive.encode(),
    })
}

/// Checks an archive and, if it is sound, replaces the state with it on every server: the state
/// travels in parts of [`RESTORE_CHUNK`] bytes, one raft entry each, and the last part's entry
/// replaces it at once (fencing tokens carried over by `state::restore`). A restore cut short
/// (leadership lost) leaves its parts staged until the next restore replaces them. The state
/// travels in the format every server of the cluster reads (the first release's below
/// protocol level 2).
async fn restore(server: &Server, bytes: &[u8]) -> Result<OperatorReply, OperatorError> {
    let level = server.shared().read().protocol();
    let archive = Archive::decode(bytes)?.at_level(level)?;
    for part in restore_parts(&archive) {
        part_restored(server.proposer().propose(part).await?)?;
    }
    Ok(OperatorReply::Done)
}

/// The entries that restore `archive`, in order: its state in parts of [`RESTORE_CHUNK`] bytes,
/// under a fresh restore id.
pub(crate) fn restore_parts(archive: &Archive) -> impl Iterator<Item = Op> + '_ {
    let id = format!("{:016x}", rand::random::<u64>());
    tracing::info!(
        index = archive.index,
        bytes = archive.state.len(),
        restore = %id,
        "restoring a snapshot archive"
    );
    // A decoded state is never empty, so there is always a last part.
    let parts = archive.state.chunks(RESTORE_CHUNK);
    let count = parts.len();
    parts.enumerate().map(move |(n, bytes)| Op::RestoreChunk {
        id: id.clone(),
        offset: (n * RESTORE_CHUNK) as u64,
        bytes: bytes.to_vec(),
        last: n + 1 == count,
    })
}

/// What applying one part of a restore said, as the operator hears it.
pub(crate) fn part_restored(response: Response) -> Result<(), OperatorError> {
    match response {
        Response::Done => Ok(()),
        Response::Rejected(ApplyError::RestoreInterrupted) => Err(ArchiveError::Interrupted.into()),
        Response::Rejected(e) => Err(ArchiveError::Decode(e.to_string()).into()),
        other => Err(ArchiveError::Decode(format!("{other:?}")).into()),
    }
}

/// Autopilot's health view, from the leader's replication progress and gossip.
fn health(server: &Server) -> AutopilotHealth {
    let metrics = server.raft().metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let states = serf_states(server);
    let last = metrics.last_log_index.unwrap_or(0);
    let max_trailing = server.shared().read().autopilot().max_trailing_logs;
    let servers: Vec<ServerHealth> = membership
        .nodes()
        .map(|(id, node)| {
            let leader = *id == server.node_id();
            let progress = if leader {
                metrics.last_applied
            } else {
                metrics
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id))
                    .and_then(|l| *l)
            };
            let serf = match states.as_ref() {
                None if leader => MemberStateName::Alive,
                None => MemberStateName::None,
                Some(s) => MemberStateName::of(s.get(&node.name).copied()),
            };
            let last_index = if leader {
                last
            } else {
                progress.map_or(0, |l| l.index)
            };
            ServerHealth {
                id: *id,
                name: node.name.clone(),
                address: node.rpc_addr.clone(),
                serf_status: serf.label().to_owned(),
                leader,
                voter: voters.contains(id),
                last_index,
                last_term: progress.map_or(0, |l| l.leader_id.term),
                healthy: serf == MemberStateName::Alive
                    && last.saturating_sub(last_index) <= max_trailing,
            }
        })
        .collect();
    let healthy_voters = servers.iter().filter(|s| s.voter && s.healthy).count();
    let quorum = voters.len() / 2 + 1;
    AutopilotHealth {
        healthy: servers.iter().all(|s| s.healthy),
        failure_tolerance: healthy_voters.saturating_sub(quorum),
        servers,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberStateName {
    Alive,
    Failed,
    Left,
    None,
}

impl MemberStateName {
    fn of(state: Option<MemberState>) -> MemberStateName {
        match state {
            Some(MemberState::Alive) => MemberStateName::Alive,
            Some(MemberState::Failed) => MemberStateName::Failed,
            Some(MemberState::Left) => MemberStateName::Left,
            _ => MemberStateName::None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            MemberStateName::Alive => "alive",
            MemberStateName::Failed => "failed",
            MemberStateName::Left => "left",
            MemberStateName::None => "none",
        }
    }
}

/// Which voters to remove now: those gossip has reported failed or left since at least
/// [`DEAD_SERVER_AFTER`] ago (`dead_since`, by node name), one at a time, and only while the
/// alive voters are a majority (so the removal can commit and the quorum stays).
pub fn dead_to_remove(
    voters: &[(NodeId, String)],
    alive: &dyn Fn(&str) -> bool,
    dead_since: &HashMap<String, Instant>,
    now: Instant,
) -> Option<NodeId> {
    let alive_count = voters.iter().filter(|(_, name)| alive(name)).count();
    if alive_count <= voters.len() / 2 {
        return None;
    }
    voters
        .iter()
        .find(|(_, name)| {
            !alive(name)
                && dead_since
                    .get(name)
                    .is_some_and(|since| now.duration_since(*since) >= DEAD_SERVER_AFTER)
        })
        .map(|(id, _)| *id)
}

/// Autopilot's `CleanupDeadServers`: while this server leads, removes from raft every voter
/// gossip has seen failed or left for [`DEAD_SERVER_AFTER`], never below a quorum.
pub async fn cleanup_dead_servers(server: Arc<Server>) {
    let Some(members) = server.config().members.clone() else {
        return;
    };
    let mut dead_since: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(CLEANUP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = server.shutdown_token().cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let states: HashMap<String, MemberState> = members
            .borrow()
            .iter()
            .filter(|m| m.role == MemberRole::Server)
            .map(|m| (m.name.clone(), m.state))
            .collect();
        for (name, state) in &states {
            if matches!(state, MemberState::Failed | MemberState::Left) {
                dead_since.entry(name.clone()).or_insert(now);
            } else {
                dead_since.remove(name);
            }
        }
        if !server.is_leader() || !server.shared().read().autopilot().cleanup_dead_servers {
            continue;
        }
        let voters: Vec<(NodeId, String)> = {
            let metrics = server.raft().metrics();
            let m = metrics.borrow_watched();
            let membership = m.membership_config.membership();
            membership
                .voter_ids()
                .filter_map(|id| membership.get_node(&id).map(|n| (id, n.name.clone())))
                .collect()
        };
        let me = server.config().node_name.clone();
        let alive = |name: &str| {
            name == me
                || states
                    .get(name)
                    .is_some_and(|s| !matches!(s, MemberState::Failed | MemberState::Left))
        };
        if let Some(id) = dead_to_remove(&voters, &alive, &dead_since, now) {
            tracing::info!(peer = %format_id(id), "autopilot: removing dead server");
            if let Err(e) = remove_peer(&server, PeerRef::Id(id)).await {
                tracing::warn!(peer = %format_id(id), error = %e, "autopilot: removal failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_servers_go_one_at_a_time_and_never_below_a_quorum() {
        let now = Instant::now();
        let long_ago = now - DEAD_SERVER_AFTER;
        let voters: Vec<(NodeId, String)> = (1..=5).map(|i| (i, format!("s{i}"))).collect();
        let dead = |names: &[&str], since: Instant| -> HashMap<String, Instant> {
            names.iter().map(|n| ((*n).to_owned(), since)).collect()
        };

        // One failed long enough: removed.
        let since = dead(&["s4"], long_ago);
        let alive = |n: &str| n != "s4";
        assert_eq!(dead_to_remove(&voters, &alive, &since, now), Some(4));

        // Failed only just now: kept for a while (a restart is not a death).
        let since = dead(&["s4"], now);
        assert_eq!(dead_to_remove(&voters, &alive, &since, now), None);

        // Three of five down: no quorum, nothing is removed.
        let since = dead(&["s3", "s4", "s5"], long_ago);
        let alive = |n: &str| !["s3", "s4", "s5"].contains(&n);
        assert_eq!(dead_to_remove(&voters, &alive, &since, now), None);

        // Two of five down: one is removed, then the other.
        let since = dead(&["s4", "s5"], long_ago);
        let alive = |n: &str| !["s4", "s5"].contains(&n);
        assert_eq!(dead_to_remove(&voters, &alive, &since, now), Some(4));
        let rest: Vec<(NodeId, String)> = voters.iter().filter(|v| v.0 != 4).cloned().collect();
        assert_eq!(dead_to_remove(&rest, &alive, &since, now), Some(5));
    }
}
