//! Cluster formation and membership: finding the other servers through gossip, bootstrapping
//! once with `bootstrap_expect` of them or joining the cluster they form, and adding a server
//! (a learner first, a voter once it has the log).

use super::forward::Hop;
use super::*;

/// How long a joining server has, as a learner, to receive the log before it would become a
/// voter; one that cannot be reached (or is too slow) is removed again instead. Shorter than
/// the joiner's own call timeout, so it hears the outcome.
const JOIN_CATCH_UP: Duration = Duration::from_secs(20);
/// The first pause after a refused join; it doubles up to [`JOIN_BACKOFF_MAX`].
const JOIN_BACKOFF_MIN: Duration = Duration::from_millis(300);
const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How often a server in the cluster checks that it still is.
const MEMBERSHIP_CHECK_EVERY: Duration = Duration::from_secs(1);

impl Server {
    pub(super) fn self_node(&self) -> ServerNode {
        ServerNode {
            name: self.config.node_name.clone(),
            rpc_addr: self.config.rpc_addr.to_string(),
        }
    }

    pub(super) fn is_initialized(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        m.membership_config
            .membership()
            .voter_ids()
            .next()
            .is_some()
    }

    /// What gossip says of the member named `name`, if it knows one.
    fn gossip_state(&self, name: &str) -> Option<MemberState> {
        let members = self.config.members.as_ref()?;
        let members = members.borrow();
        members.iter().find(|m| m.name == name).map(|m| m.state)
    }

    /// RPC addresses of the other servers gossip reports alive.
    pub(super) fn gossip_servers(&self) -> Vec<SocketAddr> {
        let me = self.config.rpc_addr;
        self.config.members.as_ref().map_or_else(Vec::new, |m| {
            m.borrow()
                .iter()
                .filter(|m| m.role == MemberRole::Server && m.state == MemberState::Alive)
                .map(|m| m.rpc_addr)
                .filter(|a| *a != me)
                .collect()
        })
    }

    /// How many voters the cluster is meant to have (`bootstrap_expect`): a join never takes it
    /// above that.
    fn expected_voters(&self) -> usize {
        match self.config.mode {
            ServerMode::Dev => 1,
            ServerMode::Cluster {
                bootstrap_expect, ..
            } => bootstrap_expect,
        }
    }

    /// Why this initialized server is no longer part of the cluster, if it is not: it is not a
    /// voter in the configuration its log holds (it was removed, or its join stopped at the
    /// learner), or it has heard from no leader for longer than an election timeout (since its
    /// start, or since the last AppendEntries), as a server that autopilot removed while it was
    /// paused or down never hears from one again.
    fn stranded(&self) -> Option<&'static str> {
        let timeout = Duration::from_millis(self.config.raft.election_max_ms);
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        if m.running_state.is_err() || m.state == ServerState::Leader {
            return None;
        }
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == self.node_id)
        {
            return Some("not a voter in the raft configuration");
        }
        let heard = self.last_leader_contact.lock().unwrap_or(self.started);
        (heard.elapsed() > timeout).then_some("no leader heard from for an election timeout")
    }

    /// Asks every server gossip reports alive who it is: the address of one that already
    /// belongs to a cluster, if any, and the uninitialized ones (this server included) by node
    /// ID.
    async fn survey(&self) -> (Option<SocketAddr>, BTreeMap<NodeId, ServerNode>) {
        let mut known: BTreeMap<NodeId, ServerNode> =
            BTreeMap::from([(self.node_id, self.self_node())]);
        let mut existing: Option<SocketAddr> = None;
        let hello = Prepared::new(calls::Hello {});
        for addr in self.gossip_servers() {
            let answer = dial::send(
                &self.rpc,
                CallKind::Prompt,
                addr,
                &hello,
                Duration::from_secs(2),
            )
            .await;
            match answer {
                Ok(Ok(info)) if info.initialized => existing = Some(addr),
                Ok(Ok(info)) => {
                    known.insert(info.node_id, info.node);
                }
                Ok(Err(e)) => tracing::warn!(%addr, error = %e, "hello not answered"),
                Err(e) => tracing::debug!(%addr, error = %e, "server not reachable yet"),
            }
        }
        (existing, known)
    }

    /// Asks the server at `addr` (which forwards to its leader) to add this one; true once it
    /// is a voter.
    async fn ask_to_join(&self, addr: SocketAddr) -> bool {
        let join = Prepared::new(calls::Join {
            node_id: self.node_id,
            node: self.self_node(),
        });
        let timeout = Duration::from_secs(30);
        match dial::send(&self.rpc, CallKind::Prompt, addr, &join, timeout).await {
            Ok(Ok(Ok(()))) => {
                tracing::info!(%addr, "joined the cluster");
                true
            }
            other => {
                tracing::info!(%addr, ?other, "join not accepted yet");
                false
            }
        }
    }

    /// Forms a new cluster with `bootstrap_expect` servers found through gossip, or joins the
    /// existing one they belong to; then stays in it. A server that already has raft state
    /// never bootstraps again, and one that finds itself [`stranded`](Server::stranded) asks
    /// to be added again, which the leader does unless that would take the cluster above
    /// `bootstrap_expect` voters or another member holds the server's name or address (see
    /// [`Server::join`]). A refused join is asked again after a pause that doubles from
    /// [`JOIN_BACKOFF_MIN`] to [`JOIN_BACKOFF_MAX`].
    pub(super) async fn stay_in_cluster(self: Arc<Self>, bootstrap_expect: usize) {
        let mut pause = JOIN_BACKOFF_MIN;
        let mut formed = false;
        loop {
            let next = if self.is_initialized() {
                if !formed {
                    tracing::info!("raft cluster membership known");
                    formed = true;
                }
                match self.stranded() {
                    None => {
                        pause = JOIN_BACKOFF_MIN;
                        MEMBERSHIP_CHECK_EVERY
                    }
                    Some(why) => {
                        tracing::info!(why, "this server is not in the cluster; asking to rejoin");
                        crate::telemetry::rejoin_attempt();
                        let joined = match self.survey().await {
                            (Some(addr), _) => self.ask_to_join(addr).await,
                            (None, _) => false,
                        };
                        if joined {
                            pause = JOIN_BACKOFF_MIN;
                            MEMBERSHIP_CHECK_EVERY
                        } else {
                            let wait = pause;
                            pause = (pause * 2).min(JOIN_BACKOFF_MAX);
                            wait
                        }
                    }
                }
            } else {
                match self.survey().await {
                    (Some(addr), _) => {
                        if self.ask_to_join(addr).await {
                            pause = JOIN_BACKOFF_MIN;
                            JOIN_BACKOFF_MIN
                        } else {
                            // A refused joiner backs off instead of asking again every 300 ms.
                            let wait = pause;
                            pause = (pause * 2).min(JOIN_BACKOFF_MAX);
                            wait
                        }
                    }
                    (None, known)
                        if known.len() >= bootstrap_expect
                            && known.keys().next() == Some(&self.node_id) =>
                    {
                        tracing::info!(servers = known.len(), "bootstrapping the raft cluster");
                        if let Err(e) = self.raft.initialize(known).await {
                            tracing::warn!(error = %e, "bootstrap failed");
                        }
                        JOIN_BACKOFF_MIN
                    }
                    (None, _) => JOIN_BACKOFF_MIN,
                }
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(next) => {}
            }
        }
    }

    /// Adds a server to the cluster: as a learner, then as a voter once it has the log
    /// (at the leader). Refused while gossip reports a server of that name
    /// failed or left, and when [`admission`] refuses it.
    pub(super) async fn join(
        &self,
        node_id: NodeId,
        node: ServerNode,
        hop: Hop,
    ) -> Result<(), ServerError> {
        self.at_leader(
            calls::Join { node_id, node },
            hop,
            |calls::Join { node_id, node }| self.join_here(node_id, node),
        )
        .await
    }

    async fn join_here(&self, node_id: NodeId, node: ServerNode) -> Result<(), ServerError> {
        let admission = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            admission(
                m.membership_config.membership(),
                node_id,
                &node,
                self.expected_voters(),
            )
        };
        match admission {
            Admission::AlreadyVoter => return Ok(()),
            Admission::Refused(why) => {
                tracing::warn!(node_id, %node, %why, "join refused");
                return Err(ServerError::Membership(why));
            }
            Admission::Add => {}
        }
        if let Some(state) = self.gossip_state(&node.name)
            && state != MemberState::Alive
        {
            // Autopilot would remove it again as dead: it waits until gossip sees it back.
            return Err(ServerError::Membership(format!(
                "server {node} not added yet: gossip reports it {}; it is added once gossip \
                 sees it alive",
                format!("{state:?}").to_lowercase()
            )));
        }
        // A learner first: it receives the log but does not count for any quorum, so an
        // unreachable or bogus address can never cost the cluster its majority.
        tracing::info!(node_id, %node, "adding server to the cluster as a learner");
        let added = self
            .raft
            .add_learner(node_id, node.clone(), false)
            .await
            .map_err(|e| ServerError::Membership(e.to_string()))?;
        let needed = added.log_id.index;
        let caught_up = self
            .raft
            .wait(Some(JOIN_CATCH_UP))
            .metrics(
                |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&node_id))
                        .and_then(|matched| matched.as_ref())
                        .is_some_and(|matched| matched.index >= needed)
                },
                "joining server caught up",
            )
            .await;
        if caught_up.is_err() {
            tracing::warn!(node_id, %node, "joining server did not catch up; removing it");
            if let Err(e) = self
                .raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([node_id])), false)
                .await
            {
                tracing::warn!(node_id, error = %e, "removing the learner");
            }
            return Err(ServerError::Membership(format!(
                "server {node} did not receive the log within {JOIN_CATCH_UP:?}; not added"
            )));
        }
        tracing::info!(node_id, %node, "promoting caught-up server to voter");
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node_id])), false)
            .await
            .map_err(|e| ServerError::Membership(e.to_string()))?;
        Ok(())
    }
}

/// Whether the leader adds a server asking to join.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// It is a voter already: nothing to do.
    AlreadyVoter,
    /// Added as a learner, then promoted.
    Add,
    /// Not added, and why.
    Refused(String),
}

/// The quorum guard of a join of `node_id` as `node` into `membership`: another member holding
/// the same name or RPC address is a conflict (a server restarted with a fresh data directory
/// under the old one's name, or a misconfigured one; the operator removes the stale peer
/// first), and a cluster that already has `expected` voters (`bootstrap_expect`) takes no
/// more, so a server autopilot removed and the one that replaced it never both count.
pub(super) fn admission(
    membership: &crate::raft::Membership,
    node_id: NodeId,
    node: &ServerNode,
    expected: usize,
) -> Admission {
    if membership.voter_ids().any(|id| id == node_id) {
        return Admission::AlreadyVoter;
    }
    let conflict = membership.nodes().find(|(id, other)| {
        **id != node_id && (other.name == node.name || other.rpc_addr == node.rpc_addr)
    });
    if let Some((id, other)) = conflict {
        return Admission::Refused(format!(
            "server {node} not added: peer {} ({other}) has its name or address; remove that \
             peer first",
            crate::operator::format_id(*id)
        ));
    }
    let voters = membership.voter_ids().count();
    if voters >= expected {
        return Admission::Refused(format!(
            "server {node} not added: the cluster already has {voters} voters of the {expected} \
             expected (--bootstrap-expect)"
        ));
    }
    Admission::Add
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::Membership;

    fn node(name: &str, port: u16) -> ServerNode {
        ServerNode {
            name: name.to_owned(),
            rpc_addr: format!("127.0.0.1:{port}"),
        }
    }

    /// Voters `voters` and learners `learners`, node `i` named `s<i>` at port `8300 + i`.
    fn membership(voters: &[NodeId], learners: &[NodeId]) -> Membership {
        let nodes = voters
            .iter()
            .chain(learners)
            .map(|&i| (i, node(&format!("s{i}"), 8300 + i as u16)))
            .collect::<BTreeMap<_, _>>();
        Membership::new(vec![voters.iter().copied().collect()], nodes).expect("a membership")
    }

    #[test]
    fn a_join_is_guarded_by_the_expected_voters_and_identities() {
        let two = membership(&[1, 2], &[]);
        // A voter asking again: nothing to do.
        assert_eq!(
            admission(&two, 1, &node("s1", 8301), 3),
            Admission::AlreadyVoter
        );
        // A removed server coming back, below the expected count: added.
        assert_eq!(admission(&two, 3, &node("s3", 8303), 3), Admission::Add);
        // A learner of its own (a join that stopped half way) is no conflict.
        let with_learner = membership(&[1, 2], &[3]);
        assert_eq!(
            admission(&with_learner, 3, &node("s3", 8303), 3),
            Admission::Add
        );
        // The cluster has its three voters: a fourth (say the old server its replacement
        // took the place of) is refused.
        let three = membership(&[1, 2, 4], &[]);
        let Admission::Refused(why) = admission(&three, 3, &node("s3", 8303), 3) else {
            panic!("a fourth voter was admitted");
        };
        assert!(why.contains("already has 3 voters"), "{why}");
        // Another node ID under a member's name, or at its address: a conflict.
        for joiner in [node("s2", 9999), node("other", 8302)] {
            let Admission::Refused(why) = admission(&two, 7, &joiner, 3) else {
                panic!("{joiner} conflicts with s2 but was admitted");
            };
            assert!(why.contains("0000000000000002"), "{why}");
        }
    }
}
