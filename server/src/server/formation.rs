//! Cluster formation and membership: finding the other servers through gossip, bootstrapping
//! once with `bootstrap_expect` of them or joining the cluster they form, and adding a server
//! (a learner first, a voter once it has the log).

use super::*;

/// How long a joining server has, as a learner, to receive the log before it would become a
/// voter; one that cannot be reached (or is too slow) is removed again instead. Shorter than
/// the joiner's own call timeout, so it hears the outcome.
const JOIN_CATCH_UP: Duration = Duration::from_secs(20);
/// The first pause after a refused join; it doubles up to [`JOIN_BACKOFF_MAX`].
const JOIN_BACKOFF_MIN: Duration = Duration::from_millis(300);
const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(10);

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

    /// Forms a new cluster with `bootstrap_expect` servers found through gossip, or joins the
    /// existing one they belong to. A server that already has raft state never bootstraps again.
    pub(super) async fn form_cluster(self: Arc<Self>, bootstrap_expect: usize) {
        let mut pause = JOIN_BACKOFF_MIN;
        loop {
            if self.is_initialized() {
                tracing::info!("raft cluster membership known");
                return;
            }
            let join = self.gossip_servers();
            let mut known: BTreeMap<NodeId, ServerNode> =
                BTreeMap::from([(self.node_id, self.self_node())]);
            let mut existing: Option<SocketAddr> = None;
            let hello = Prepared::new(calls::Hello {});
            for addr in &join {
                let answer = dial::send(
                    &self.rpc,
                    CallKind::Prompt,
                    *addr,
                    &hello,
                    Duration::from_secs(2),
                )
                .await;
                match answer {
                    Ok(Ok(info)) if info.initialized => existing = Some(*addr),
                    Ok(Ok(info)) => {
                        known.insert(info.node_id, info.node);
                    }
                    Ok(Err(e)) => tracing::warn!(%addr, error = %e, "hello not answered"),
                    Err(e) => tracing::debug!(%addr, error = %e, "server not reachable yet"),
                }
            }
            if let Some(addr) = existing {
                let join = Prepared::new(calls::Join {
                    node_id: self.node_id,
                    node: self.self_node(),
                    forwarded: false,
                });
                let timeout = Duration::from_secs(30);
                match dial::send(&self.rpc, CallKind::Prompt, addr, &join, timeout).await {
                    Ok(Ok(Ok(()))) => tracing::info!(%addr, "joined the cluster"),
                    other => {
                        // A refused joiner backs off instead of asking again every 300 ms.
                        tracing::info!(%addr, ?other, retry_in = ?pause, "join not accepted yet");
                        tokio::select! {
                            _ = self.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(JOIN_BACKOFF_MAX);
                        continue;
                    }
                }
            } else if known.len() >= bootstrap_expect && known.keys().next() == Some(&self.node_id)
            {
                tracing::info!(servers = known.len(), "bootstrapping the raft cluster");
                if let Err(e) = self.raft.initialize(known).await {
                    tracing::warn!(error = %e, "bootstrap failed");
                }
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(JOIN_BACKOFF_MIN) => {}
            }
        }
    }

    /// Adds a server to the cluster: as a learner, then as a voter once it has the log
    /// (leader only; followers forward).
    pub(super) async fn join(
        &self,
        node_id: NodeId,
        node: ServerNode,
        forwarded: bool,
    ) -> Result<(), ServerError> {
        if !self.is_leader() {
            if forwarded {
                return Err(ServerError::NoLeader);
            }
            let request = calls::Join {
                node_id,
                node,
                forwarded: true,
            };
            return self.forward(request, Duration::ZERO).await?;
        }
        let is_voter = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.membership_config
                .membership()
                .voter_ids()
                .any(|id| id == node_id)
        };
        if is_voter {
            return Ok(());
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
