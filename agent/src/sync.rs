//! Keeps this agent's own node registered in the catalog with a `serfHealth` check, the way
//! Consul's anti-entropy keeps an agent's node entry: checked at start and periodically, written
//! only when missing or different.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;
use vigil_shared::catalog::{HealthStatus, SERF_HEALTH};
use vigil_shared::rpc::{
    CheckRegistration, Consistency, Op, QueryOptions, QueryResult, ReadQuery, Response, ServerError,
};

use crate::backend::Backend;

/// How often the registration is checked once it is in place.
const SYNC_INTERVAL: Duration = Duration::from_secs(30);
/// How soon to retry after a failure (e.g. no leader yet).
const RETRY: Duration = Duration::from_millis(500);

pub struct NodeSync {
    pub backend: Arc<Backend>,
    pub node: String,
    pub address: String,
}

impl NodeSync {
    /// Registers the node and its `serfHealth` check unless both are already in place.
    pub async fn sync_once(&self) -> Result<(), ServerError> {
        let opts = QueryOptions {
            consistency: Consistency::Stale,
            ..QueryOptions::default()
        };
        let nodes = self.backend.query(opts, ReadQuery::CatalogNodes).await?.0;
        let registered = matches!(&nodes, QueryResult::Nodes(n)
            if n.iter().any(|n| n.name == self.node && n.address == self.address));
        if !registered {
            self.apply(Op::RegisterNode {
                name: self.node.clone(),
                address: self.address.clone(),
            })
            .await?;
        }
        let checks = self
            .backend
            .query(
                opts,
                ReadQuery::NodeChecks {
                    node: self.node.clone(),
                },
            )
            .await?
            .0;
        let healthy = matches!(&checks, QueryResult::Checks(c)
            if c.iter().any(|c| c.check_id == SERF_HEALTH && c.status == HealthStatus::Passing));
        if !healthy {
            self.apply(Op::RegisterCheck(CheckRegistration {
                node: self.node.clone(),
                check_id: SERF_HEALTH.to_owned(),
                name: "Serf Health Status".to_owned(),
                status: HealthStatus::Passing,
                output: "Agent alive and reachable".to_owned(),
                service_id: String::new(),
            }))
            .await?;
        }
        Ok(())
    }

    async fn apply(&self, op: Op) -> Result<(), ServerError> {
        match self.backend.write(op).await? {
            Response::Rejected(e) => Err(ServerError::Raft(e.to_string())),
            _ => Ok(()),
        }
    }

    /// Re-checks the registration periodically (with jitter) until shutdown.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let pause = match self.sync_once().await {
                Ok(()) => {
                    let jitter =
                        rand::thread_rng().gen_range(0..SYNC_INTERVAL.as_millis() as u64 / 4);
                    SYNC_INTERVAL + Duration::from_millis(jitter)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "node registration not in place yet");
                    RETRY
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}
