//! Consul's JSON for what an agent reports about itself and the cluster: gossip members
//! (`/v1/agent/members`), the gossip keyring (`/v1/operator/keyring`), the raft servers
//! (`/v1/operator/raft/configuration`) and the figures of `/v1/agent/self`. The agent's
//! handlers write these types; the client and `vigil members`, `keyring`, `operator raft
//! list-peers` and `info` read them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Serf tags as Consul's agents set them (every value a string); `port` is the RPC port, which
/// Vigil's client agents also carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberTagsJson {
    /// `consul` for a server, `node` for a client agent.
    pub role: String,
    pub dc: String,
    pub segment: String,
    pub port: String,
    pub vsn: String,
    pub vsn_min: String,
    pub vsn_max: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft_vsn: Option<String>,
    pub build: String,
}

/// Consul's `api.AgentMember`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MemberJson {
    pub name: String,
    pub addr: String,
    pub port: u16,
    pub tags: MemberTagsJson,
    /// Serf's member status: 1 alive, 2 leaving, 3 left, 4 failed.
    pub status: u8,
    pub protocol_min: u8,
    pub protocol_max: u8,
    pub protocol_cur: u8,
    pub delegate_min: u8,
    pub delegate_max: u8,
    pub delegate_cur: u8,
}

/// One pool's answer to a keyring list: each key and on how many of the pool's members it is
/// installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeyringPoolJson {
    #[serde(rename = "WAN")]
    pub wan: bool,
    pub datacenter: String,
    pub segment: String,
    pub keys: BTreeMap<String, usize>,
    pub primary_keys: BTreeMap<String, usize>,
    pub num_nodes: usize,
}

/// The body of a keyring change: the key, base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeyringRequest {
    pub key: String,
}

/// One raft server in [`RaftConfigurationJson`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RaftServerJson {
    /// The server's raft ID, 16 hex digits.
    #[serde(rename = "ID")]
    pub id: String,
    pub node: String,
    pub address: String,
    pub leader: bool,
    pub voter: bool,
    pub protocol_version: String,
}

/// Consul's `GET /v1/operator/raft/configuration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RaftConfigurationJson {
    pub servers: Vec<RaftServerJson>,
    pub index: u64,
}

/// The part of `/v1/agent/self` that `consul info` prints: figures by section, every value a
/// string (Consul's `Stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentStatsJson {
    pub stats: BTreeMap<String, BTreeMap<String, String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_written_as_consul_writes_it() {
        let member = MemberJson {
            name: "n1".into(),
            addr: "127.0.0.1".into(),
            port: 8301,
            tags: MemberTagsJson {
                role: "node".into(),
                dc: "dc1".into(),
                segment: String::new(),
                port: "8300".into(),
                vsn: "2".into(),
                vsn_min: "2".into(),
                vsn_max: "3".into(),
                raft_vsn: None,
                build: "0.1.0".into(),
            },
            status: 1,
            protocol_min: 1,
            protocol_max: 5,
            protocol_cur: 2,
            delegate_min: 2,
            delegate_max: 5,
            delegate_cur: 4,
        };
        let text = serde_json::to_string(&member).unwrap();
        assert_eq!(
            text,
            r#"{"Name":"n1","Addr":"127.0.0.1","Port":8301,"Tags":{"role":"node","dc":"dc1","segment":"","port":"8300","vsn":"2","vsn_min":"2","vsn_max":"3","build":"0.1.0"},"Status":1,"ProtocolMin":1,"ProtocolMax":5,"ProtocolCur":2,"DelegateMin":2,"DelegateMax":5,"DelegateCur":4}"#
        );
        assert_eq!(serde_json::from_str::<MemberJson>(&text).unwrap(), member);
    }

    #[test]
    fn keyring_and_raft_answers_are_written_as_consul_writes_them() {
        let pool = KeyringPoolJson {
            wan: false,
            datacenter: "dc1".into(),
            segment: String::new(),
            keys: [("k".to_owned(), 3)].into(),
            primary_keys: [("k".to_owned(), 3)].into(),
            num_nodes: 3,
        };
        assert_eq!(
            serde_json::to_string(&pool).unwrap(),
            r#"{"WAN":false,"Datacenter":"dc1","Segment":"","Keys":{"k":3},"PrimaryKeys":{"k":3},"NumNodes":3}"#
        );
        let raft = RaftConfigurationJson {
            servers: vec![RaftServerJson {
                id: "000000000000000a".into(),
                node: "s1".into(),
                address: "127.0.0.1:8300".into(),
                leader: true,
                voter: true,
                protocol_version: "3".into(),
            }],
            index: 7,
        };
        assert_eq!(
            serde_json::to_string(&raft).unwrap(),
            r#"{"Servers":[{"ID":"000000000000000a","Node":"s1","Address":"127.0.0.1:8300","Leader":true,"Voter":true,"ProtocolVersion":"3"}],"Index":7}"#
        );
        assert_eq!(
            serde_json::to_string(&KeyringRequest { key: "a2V5".into() }).unwrap(),
            r#"{"Key":"a2V5"}"#
        );
    }

    #[test]
    fn agent_stats_read_every_section_of_agent_self() {
        let stats: AgentStatsJson = serde_json::from_str(
            r#"{"Config":{"NodeName":"n1"},"Stats":{"raft":{"state":"Leader"},"agent":{"blocking_queries":"0"}}}"#,
        )
        .unwrap();
        assert_eq!(stats.stats["raft"]["state"], "Leader");
        assert_eq!(stats.stats["agent"]["blocking_queries"], "0");
    }
}
