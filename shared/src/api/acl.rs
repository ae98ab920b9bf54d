//! Consul's JSON for ACL tokens, policies and roles: what `/v1/acl/*` answers (the agent's
//! handlers write these types, `vigil acl` reads them) and the bodies `vigil acl` sends.
//! Fields Consul leaves out when empty (`omitempty`) are left out here too, in Consul's order.

use serde::{Deserialize, Serialize};

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A link to a policy or role. In an answer both fields are set; a body names one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LinkJson {
    #[serde(rename = "ID", default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Consul's `ACLServiceIdentity`; no datacenters means every one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceIdentityJson {
    pub service_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
}

/// Consul's `ACLNodeIdentity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeIdentityJson {
    pub node_name: String,
    pub datacenter: String,
}

/// What a token or role links to and the identities it carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GrantsJson {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<LinkJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<LinkJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_identities: Vec<ServiceIdentityJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_identities: Vec<NodeIdentityJson>,
}

/// Consul's `ACLToken` as the API answers it. `ExpirationTTL` is in nanoseconds (Go's
/// `time.Duration`); times are RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TokenJson {
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    pub description: String,
    #[serde(flatten)]
    pub grants: GrantsJson,
    pub local: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<String>,
    #[serde(rename = "ExpirationTTL", default, skip_serializing_if = "is_zero")]
    pub expiration_ttl: u64,
    pub create_time: String,
    pub create_index: u64,
    pub modify_index: u64,
    /// Set in a list (`/v1/acl/tokens`): Vigil has no legacy tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy: Option<bool>,
}

/// Consul's `ACLPolicy`; in a list (`/v1/acl/policies`) without its rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct PolicyJson {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// Consul's `ACLRole`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RoleJson {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(flatten)]
    pub grants: GrantsJson,
    pub create_index: u64,
    pub modify_index: u64,
}

/// The body of a token create, update or clone (`consul acl token create` sends these fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TokenRequest {
    pub description: String,
    #[serde(skip_serializing_if = "is_false")]
    pub local: bool,
    #[serde(flatten)]
    pub grants: GrantsJson,
    /// A Go duration (`"1h"`), as Consul's CLI sends it.
    #[serde(rename = "ExpirationTTL", skip_serializing_if = "Option::is_none")]
    pub expiration_ttl: Option<String>,
    #[serde(rename = "SecretID", skip_serializing_if = "Option::is_none")]
    pub secret_id: Option<String>,
}

/// The body of a policy create or update.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct PolicyRequest {
    pub name: String,
    pub description: String,
    pub rules: String,
}

/// The body of a role create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct RoleRequest {
    pub name: String,
    pub description: String,
    #[serde(flatten)]
    pub grants: GrantsJson,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes Consul's clients read: field names, their order and what is left out.
    #[test]
    fn a_token_is_written_as_consul_writes_it() {
        let token = TokenJson {
            accessor_id: "a".into(),
            secret_id: "s".into(),
            description: "d".into(),
            grants: GrantsJson {
                policies: vec![LinkJson {
                    id: "p1".into(),
                    name: "ops".into(),
                }],
                service_identities: vec![ServiceIdentityJson {
                    service_name: "web".into(),
                    datacenters: vec![],
                }],
                ..GrantsJson::default()
            },
            local: false,
            expiration_time: None,
            expiration_ttl: 0,
            create_time: "2026-11-28T10:00:00Z".into(),
            create_index: 5,
            modify_index: 6,
            legacy: None,
        };
        let text = serde_json::to_string(&token).unwrap();
        assert_eq!(
            text,
            r#"{"AccessorID":"a","SecretID":"s","Description":"d","Policies":[{"ID":"p1","Name":"ops"}],"ServiceIdentities":[{"ServiceName":"web"}],"Local":false,"CreateTime":"2026-11-28T10:00:00Z","CreateIndex":5,"ModifyIndex":6}"#
        );
        assert_eq!(serde_json::from_str::<TokenJson>(&text).unwrap(), token);
    }

    #[test]
    fn a_policy_in_a_list_has_no_rules_and_a_role_no_roles() {
        let policy = PolicyJson {
            id: "p".into(),
            name: "n".into(),
            description: String::new(),
            rules: None,
            datacenters: vec!["dc1".into()],
            create_index: 1,
            modify_index: 2,
        };
        assert_eq!(
            serde_json::to_string(&policy).unwrap(),
            r#"{"ID":"p","Name":"n","Description":"","Datacenters":["dc1"],"CreateIndex":1,"ModifyIndex":2}"#
        );
        let role = RoleJson {
            id: "r".into(),
            name: "n".into(),
            description: "d".into(),
            grants: GrantsJson {
                node_identities: vec![NodeIdentityJson {
                    node_name: "n1".into(),
                    datacenter: "dc1".into(),
                }],
                ..GrantsJson::default()
            },
            create_index: 1,
            modify_index: 1,
        };
        assert_eq!(
            serde_json::to_string(&role).unwrap(),
            r#"{"ID":"r","Name":"n","Description":"d","NodeIdentities":[{"NodeName":"n1","Datacenter":"dc1"}],"CreateIndex":1,"ModifyIndex":1}"#
        );
    }

    #[test]
    fn a_token_body_names_only_what_the_command_set() {
        let body = TokenRequest {
            description: "ci".into(),
            grants: GrantsJson {
                policies: vec![LinkJson {
                    id: String::new(),
                    name: "ops".into(),
                }],
                ..GrantsJson::default()
            },
            expiration_ttl: Some("1h".into()),
            ..TokenRequest::default()
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"Description":"ci","Policies":[{"Name":"ops"}],"ExpirationTTL":"1h"}"#
        );
    }
}
