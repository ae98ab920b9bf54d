//! Leader failover on evidence of death. A follower that stops hearing from its leader for a
//! heartbeat and a half (the leader's read lease) checks the leader's RPC port ([`dial::port_closed`]): closed means the leader's process is gone (a stopped or
//! slow leader still owns its socket and is never accused), and the follower campaigns at once
//! instead of waiting out its leader lease and election timeout (3-4 s with `lan` timing).
//!
//! The voters it asks hold the same lease on the dead leader and would refuse a vote until it
//! expires; each checks the port itself before waiving its lease for that vote
//! ([`Server::waive_lease_for`]), so a live leader is never voted out this way: a server back
//! from a pause finds the leader's port open, and its own timer-driven election goes through
//! pre-vote, which the healthy majority refuses.
//!
//! A closed port is strong evidence, not proof: a firewall's `REJECT` looks the same. So no
//! server campaigns, or waives its lease, before it has gone a whole read lease
//! ([`Server::read_lease`]) without hearing from the leader, and the leader answers reads and
//! renewals alone only within that lease of a quorum's acknowledgement. A majority that elects
//! a successor includes a server that acknowledged the old leader's latest quorum, so the
//! election ends after the old leader's lease has: a live leader taken for dead can no longer
//! answer from its old term once the new one commits.
//!
//! The followers rank themselves by node ID and the first campaigns at once, each next one a
//! heartbeat later unless an election has started meanwhile: two candidates at once would
//! split the vote and leave it to the election timers.

use super::*;

/// How long a check of the leader's port waits for the kernel's refusal: a round trip on any
/// LAN, and short enough not to hold up a vote request noticeably when the leader is alive.
const PORT_CHECK_WAIT: Duration = Duration::from_millis(100);

/// A leader found dead: its node ID in the term it led.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DeadLeader {
    leader: NodeId,
    term: u64,
}

/// The leader this follower follows now, with its RPC address, while raft runs.
struct Following {
    leader: DeadLeader,
    addr: SocketAddr,
    voters: Vec<NodeId>,
}

impl Server {
    fn following(&self) -> Option<Following> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        m.running_state.as_ref().ok()?;
        if m.state != ServerState::Follower {
            return None;
        }
        let leader = m.current_leader.filter(|l| *l != self.node_id)?;
        let membership = m.membership_config.membership();
        let addr = membership.get_node(&leader)?.rpc_addr.parse().ok()?;
        Some(Following {
            leader: DeadLeader {
                leader,
                term: m.current_term,
            },
            addr,
            voters: membership.voter_ids().collect(),
        })
    }

    /// Whether `following`'s leader is known dead, checking its port if it was not yet.
    async fn leader_dead(&self, following: &Following) -> bool {
        if *self.dead_leader.lock() == Some(following.leader) {
            return true;
        }
        if !dial::port_closed(following.addr, PORT_CHECK_WAIT).await {
            return false;
        }
        *self.dead_leader.lock() = Some(following.leader);
        tracing::info!(leader = following.leader.leader, addr = %following.addr, term = following.leader.term,
            "the leader's port is closed: its process is gone");
        true
    }

    /// Whether a vote request may pass this follower's leader lease: only when the leader the
    /// lease protects is dead (its port closed, checked now if not known yet) and this
    /// follower has not heard from it for the leader's read lease. A port can also look
    /// closed when it is not (a firewall's `REJECT`): the silence keeps a live leader from
    /// answering from its lease while a successor commits (see [`Server::confirmed_leader`]).
    /// A leadership transfer passes anyway.
    pub(super) async fn waive_lease_for(&self) -> bool {
        match self.following() {
            Some(following) => self.leader_silent() && self.leader_dead(&following).await,
            None => false,
        }
    }

    /// Whether the leader this server would forward to is dead: known to be, or silent for a
    /// heartbeat and a half and its port closed (see [`Server::forward`]).
    pub(super) async fn leader_gone(&self) -> bool {
        let Some(following) = self.following() else {
            return false;
        };
        if *self.dead_leader.lock() == Some(following.leader) {
            return true;
        }
        self.leader_silent() && self.leader_dead(&following).await
    }

    /// Waits, for at most the largest election timeout, while this server has no live leader
    /// but is sure to have one soon: its leader was found dead (a campaign follows at once), or
    /// it heard a leader within that time and an election is under way. Consul holds a
    /// request for a leader the same way (`RPCHoldTimeout`); a request that waited is forwarded
    /// (or answered here) as soon as a leader is named, instead of the caller retrying. A
    /// server cut off for longer holds nothing: the caller moves on to another.
    pub(super) async fn await_leader(&self) {
        let limit = Duration::from_millis(self.config.raft.election_max_ms);
        if !self.electing(limit) {
            return;
        }
        let mut metrics = self.raft.server_metrics();
        let elected = async {
            while self.electing(limit) {
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(limit, elected).await;
    }

    /// Whether an election this server is waiting for is under way (see
    /// [`Server::await_leader`]).
    fn electing(&self, recent: Duration) -> bool {
        let current = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            if m.running_state.is_err() || m.state == ServerState::Leader {
                return false;
            }
            m.current_leader.map(|leader| DeadLeader {
                leader,
                term: m.current_term,
            })
        };
        match current {
            Some(leader) => *self.dead_leader.lock() == Some(leader),
            None => self
                .last_leader_contact
                .lock()
                .is_some_and(|t| t.elapsed() < recent),
        }
    }

    /// Whether no AppendEntries came for the leader's read lease (a heartbeat and a half).
    fn leader_silent(&self) -> bool {
        let heard = self.last_leader_contact.lock().unwrap_or(self.started);
        heard.elapsed() >= self.read_lease()
    }

    /// Watches the leader and campaigns when it is found dead (see the module docs), until
    /// shutdown.
    pub(super) async fn campaign_on_evidence(self: Arc<Self>) {
        let heartbeat = Duration::from_millis(self.config.raft.heartbeat_ms);
        let mut tick = tokio::time::interval(heartbeat / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut campaigned = None;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(following) = self.following() else {
                continue;
            };
            if campaigned == Some(following.leader) {
                continue;
            }
            // Not before the leader's read lease has run out: this server's own vote must not
            // cut it short.
            if !self.leader_silent() || !self.leader_dead(&following).await {
                continue;
            }
            campaigned = Some(following.leader);
            let mut others: Vec<NodeId> = following
                .voters
                .iter()
                .copied()
                .filter(|v| *v != following.leader.leader)
                .collect();
            others.sort_unstable();
            let Some(rank) = others.iter().position(|v| *v == self.node_id) else {
                // Not a voter: nothing to campaign for.
                continue;
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(heartbeat * rank as u32) => {}
            }
            // Someone else campaigned first (this server's term moved with its vote request):
            // a second candidate would only split the vote.
            if self.raft.metrics().borrow_watched().current_term > following.leader.term {
                continue;
            }
            tracing::info!(
                dead = following.leader.leader,
                term = following.leader.term,
                "campaigning at once: the leader's process is gone"
            );
            crate::telemetry::election_on_evidence();
            if let Err(e) = self.raft.trigger().elect(false).await {
                tracing::warn!(error = %e, "could not start an election");
            }
        }
    }
}
