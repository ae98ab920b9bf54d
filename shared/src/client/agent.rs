//! Agent membership, local checks and operator calls: `/v1/agent/members`, `join`, `leave`,
//! `force-leave`, `check/register`, `check/pass`, `/v1/operator/raft/configuration`.

use reqwest::Method;

use crate::api::agent::{MemberJson, RaftConfigurationJson};

use super::{Client, ClientError, REQUEST_TIMEOUT, encode_path, with_query};

impl Client {
    /// `GET /v1/agent/members`: gossip members in Consul's shape.
    pub async fn agent_members(&self) -> Result<Vec<MemberJson>, ClientError> {
        let reply = self
            .send(Method::GET, "/v1/agent/members", None, REQUEST_TIMEOUT)
            .await?;
        reply.ok()?.json()
    }

    /// `GET /v1/operator/raft/configuration`: the raft servers in Consul's shape.
    pub async fn raft_configuration(&self) -> Result<RaftConfigurationJson, ClientError> {
        let reply = self
            .send(
                Method::GET,
                "/v1/operator/raft/configuration",
                None,
                REQUEST_TIMEOUT,
            )
            .await?;
        reply.ok()?.json()
    }

    async fn agent_put(&self, path: &str, body: Option<Vec<u8>>) -> Result<(), ClientError> {
        self.send(Method::PUT, path, body, REQUEST_TIMEOUT)
            .await?
            .ok()?;
        Ok(())
    }

    /// `PUT /v1/agent/join/<addr>`: join the cluster through a member's gossip address.
    pub async fn agent_join(&self, addr: &str) -> Result<(), ClientError> {
        self.agent_put(&format!("/v1/agent/join/{}", encode_path(addr)), None)
            .await
    }

    /// `PUT /v1/agent/leave`: leave gracefully and shut the agent down.
    pub async fn agent_leave(&self) -> Result<(), ClientError> {
        self.agent_put("/v1/agent/leave", None).await
    }

    /// `PUT /v1/agent/force-leave/<node>[?prune]`: mark a failed member as left; `prune` also
    /// removes it from the member list at once.
    pub async fn agent_force_leave(&self, node: &str, prune: bool) -> Result<(), ClientError> {
        let path = format!("/v1/agent/force-leave/{}", encode_path(node));
        let path = if prune { format!("{path}?prune") } else { path };
        self.agent_put(&path, None).await
    }

    /// `PUT /v1/agent/check/register`: registers a check with the agent (`definition` in
    /// Consul's JSON: `ID`, `Name`, `TTL` or `HTTP` and `Interval`, ...).
    pub async fn agent_check_register(
        &self,
        definition: &serde_json::Value,
    ) -> Result<(), ClientError> {
        let body = definition.to_string().into_bytes();
        self.agent_put("/v1/agent/check/register", Some(body)).await
    }

    /// `PUT /v1/agent/check/pass/<id>?note=`: passes the agent's TTL check `id`.
    pub async fn agent_check_pass(&self, id: &str, note: &str) -> Result<(), ClientError> {
        let path = format!("/v1/agent/check/pass/{}", encode_path(id));
        self.agent_put(&with_query(&path, &[("note", note.to_owned())]), None)
            .await
    }
}
