//! Agent membership and operator calls: `/v1/agent/members`, `join`, `leave`, `force-leave`,
//! `/v1/operator/raft/configuration`.

use reqwest::Method;

use super::{Client, ClientError, REQUEST_TIMEOUT, encode_path};

impl Client {
    /// `GET /v1/agent/members`: gossip members in Consul's shape.
    pub async fn agent_members(&self) -> Result<serde_json::Value, ClientError> {
        let reply = self
            .send(Method::GET, "/v1/agent/members", None, REQUEST_TIMEOUT)
            .await?;
        if reply.status != 200 {
            return Err(ClientError::api(&reply));
        }
        serde_json::from_slice(&reply.body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// `GET /v1/operator/raft/configuration`: the raft servers in Consul's shape.
    pub async fn raft_configuration(&self) -> Result<serde_json::Value, ClientError> {
        let reply = self
            .send(
                Method::GET,
                "/v1/operator/raft/configuration",
                None,
                REQUEST_TIMEOUT,
            )
            .await?;
        if reply.status != 200 {
            return Err(ClientError::api(&reply));
        }
        serde_json::from_slice(&reply.body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    async fn agent_put(&self, path: &str) -> Result<(), ClientError> {
        let reply = self.send(Method::PUT, path, None, REQUEST_TIMEOUT).await?;
        if reply.status != 200 {
            return Err(ClientError::api(&reply));
        }
        Ok(())
    }

    /// `PUT /v1/agent/join/<addr>`: join the cluster through a member's gossip address.
    pub async fn agent_join(&self, addr: &str) -> Result<(), ClientError> {
        self.agent_put(&format!("/v1/agent/join/{}", encode_path(addr)))
            .await
    }

    /// `PUT /v1/agent/leave`: leave gracefully and shut the agent down.
    pub async fn agent_leave(&self) -> Result<(), ClientError> {
        self.agent_put("/v1/agent/leave").await
    }

    /// `PUT /v1/agent/force-leave/<node>`: mark a failed member as left.
    pub async fn agent_force_leave(&self, node: &str) -> Result<(), ClientError> {
        self.agent_put(&format!("/v1/agent/force-leave/{}", encode_path(node)))
            .await
    }
}
