//! `vigil acl bootstrap|token|policy|role ...`: Consul's `consul acl` commands through the local
//! agent's HTTP API. Results print as Consul's CLI prints them, or as the API's JSON with
//! `--format json`.

use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{Value, json};

use super::AgentAddr;
use super::operator::call_with;

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum Format {
    #[default]
    Pretty,
    Json,
}

#[derive(Debug, Args)]
pub struct AclCommand {
    #[command(subcommand)]
    pub action: AclAction,
    #[command(flatten)]
    pub agent: AgentAddr,
    /// How to print results.
    #[arg(long, value_enum, default_value_t, global = true)]
    pub format: Format,
}

#[derive(Debug, Subcommand)]
pub enum AclAction {
    /// Create the first management token (once).
    Bootstrap,
    #[command(subcommand)]
    Token(TokenAction),
    #[command(subcommand)]
    Policy(PolicyAction),
    #[command(subcommand)]
    Role(RoleAction),
}

/// Links to policies and roles, and identities, as `consul acl token create` takes them.
#[derive(Debug, Args, Default)]
pub struct Grants {
    /// Policy to link, by ID (repeatable).
    #[arg(long = "policy-id")]
    policy_ids: Vec<String>,
    /// Policy to link, by name (repeatable).
    #[arg(long = "policy-name")]
    policy_names: Vec<String>,
    /// Role to link, by ID (repeatable).
    #[arg(long = "role-id")]
    role_ids: Vec<String>,
    /// Role to link, by name (repeatable).
    #[arg(long = "role-name")]
    role_names: Vec<String>,
    /// A service identity, `NAME` or `NAME:DC1,DC2` (repeatable).
    #[arg(long = "service-identity")]
    service_identities: Vec<String>,
    /// A node identity, `NODE:DC` (repeatable).
    #[arg(long = "node-identity")]
    node_identities: Vec<String>,
}

impl Grants {
    /// A token or role body with the links and identities added.
    fn into_body(self, mut body: Value, with_roles: bool) -> anyhow::Result<Value> {
        let links = |ids: Vec<String>, names: Vec<String>| -> Vec<Value> {
            ids.into_iter()
                .map(|id| json!({ "ID": id }))
                .chain(names.into_iter().map(|name| json!({ "Name": name })))
                .collect()
        };
        let policies = links(self.policy_ids, self.policy_names);
        if !policies.is_empty() {
            body["Policies"] = policies.into();
        }
        let roles = links(self.role_ids, self.role_names);
        if !roles.is_empty() {
            anyhow::ensure!(with_roles, "a role cannot link roles");
            body["Roles"] = roles.into();
        }
        let services: Vec<Value> = self
            .service_identities
            .iter()
            .map(|s| match s.split_once(':') {
                Some((name, dcs)) => json!({
                    "ServiceName": name,
                    "Datacenters": dcs.split(',').collect::<Vec<_>>(),
                }),
                None => json!({ "ServiceName": s }),
            })
            .collect();
        if !services.is_empty() {
            body["ServiceIdentities"] = services.into();
        }
        let nodes = self
            .node_identities
            .iter()
            .map(|n| {
                let (node, dc) = n
                    .split_once(':')
                    .ok_or_else(|| anyhow::anyhow!("--node-identity must be NODE:DC, not {n:?}"))?;
                Ok(json!({ "NodeName": node, "Datacenter": dc }))
            })
            .collect::<anyhow::Result<Vec<Value>>>()?;
        if !nodes.is_empty() {
            body["NodeIdentities"] = nodes.into();
        }
        Ok(body)
    }
}

/// What `consul acl token create` takes.
#[derive(Debug, Args)]
pub struct NewToken {
    #[arg(long, default_value = "")]
    description: String,
    #[command(flatten)]
    grants: Grants,
    /// The token expires this long after it is created (Go duration).
    #[arg(long = "expires-ttl")]
    expires_ttl: Option<String>,
    /// Local to this datacenter.
    #[arg(long)]
    local: bool,
    /// Use this secret instead of a random one.
    #[arg(long)]
    secret: Option<String>,
}

impl NewToken {
    fn into_body(self) -> anyhow::Result<Value> {
        let body = json!({ "Description": self.description, "Local": self.local });
        let mut body = self.grants.into_body(body, true)?;
        if let Some(ttl) = self.expires_ttl {
            body["ExpirationTTL"] = ttl.into();
        }
        if let Some(secret) = self.secret {
            body["SecretID"] = secret.into();
        }
        Ok(body)
    }
}

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Create a token.
    Create(NewToken),
    /// Show a token by accessor ID, or the one in use with --self.
    Read {
        #[arg(long, required_unless_present = "self_")]
        id: Option<String>,
        #[arg(long = "self")]
        self_: bool,
    },
    /// Replace a token's description and links.
    Update {
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        grants: Grants,
    },
    /// A new token with the same links.
    Clone {
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Delete a token.
    Delete {
        #[arg(long)]
        id: String,
    },
    /// Every token.
    List,
}

/// A policy or role by `--id`, or by `--name`.
#[derive(Debug, Args)]
pub struct IdOrName {
    #[arg(long, required_unless_present = "name")]
    id: Option<String>,
    #[arg(long)]
    name: Option<String>,
}

/// What a policy holds, as `consul acl policy create` and `update` take it.
#[derive(Debug, Args)]
pub struct PolicyFields {
    #[arg(long)]
    name: String,
    #[arg(long, default_value = "")]
    description: String,
    #[arg(long, default_value = "")]
    rules: String,
}

impl PolicyFields {
    /// The policy body; `--rules @FILE` reads the rules from the file, as Consul's CLI does.
    fn into_body(self) -> anyhow::Result<Value> {
        let rules = match self.rules.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading rules from {path}: {e}"))?,
            None => self.rules,
        };
        Ok(json!({ "Name": self.name, "Description": self.description, "Rules": rules }))
    }
}

#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Create a policy; `--rules @FILE` reads them from a file.
    Create(PolicyFields),
    /// Show a policy by ID or name.
    Read(IdOrName),
    /// Replace a policy's name, description and rules.
    Update {
        #[arg(long)]
        id: String,
        #[command(flatten)]
        fields: PolicyFields,
    },
    /// Delete a policy by ID or name.
    Delete(IdOrName),
    /// Every policy.
    List,
}

#[derive(Debug, Subcommand)]
pub enum RoleAction {
    /// Create a role.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        grants: Grants,
    },
    /// Show a role by ID or name.
    Read(IdOrName),
    /// Delete a role by ID or name.
    Delete(IdOrName),
    /// Every role.
    List,
}

async fn send(
    agent: &AgentAddr,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let response = call_with(agent, method, path, body.map(|b| b.to_string())).await?;
    Ok(response.json().await?)
}

async fn get(agent: &AgentAddr, path: &str) -> anyhow::Result<Value> {
    send(agent, Method::GET, path, None).await
}

async fn put(agent: &AgentAddr, path: &str, body: Value) -> anyhow::Result<Value> {
    send(agent, Method::PUT, path, Some(body)).await
}

/// The ID given, or the ID of the policy or role (`kind`) with the name given.
async fn id_of(agent: &AgentAddr, kind: &str, which: IdOrName) -> anyhow::Result<String> {
    match (which.id, which.name) {
        (Some(id), _) => Ok(id),
        (None, Some(name)) => {
            let found = get(agent, &format!("/v1/acl/{kind}/name/{name}")).await?;
            Ok(found["ID"].as_str().unwrap_or_default().to_owned())
        }
        (None, None) => anyhow::bail!("give --id or --name"),
    }
}

/// The policy or role (`kind`) by ID or name.
async fn read(agent: &AgentAddr, kind: &str, which: IdOrName) -> anyhow::Result<Value> {
    let id = id_of(agent, kind, which).await?;
    get(agent, &format!("/v1/acl/{kind}/{id}")).await
}

/// Deletes the policy or role (`kind`) by ID or name.
async fn delete_named(agent: &AgentAddr, kind: &str, which: IdOrName) -> anyhow::Result<()> {
    let id = id_of(agent, kind, which).await?;
    delete(agent, kind, &id).await
}

/// Deletes the token, policy or role `id` (`kind`) and says so, as Consul's CLI does.
async fn delete(agent: &AgentAddr, kind: &str, id: &str) -> anyhow::Result<()> {
    send(agent, Method::DELETE, &format!("/v1/acl/{kind}/{id}"), None).await?;
    let mut title = kind.to_owned();
    title[..1].make_ascii_uppercase();
    println!("{title} \"{id}\" deleted successfully");
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The `Datacenters` list of a policy or service identity.
fn datacenters(v: &Value) -> Vec<&str> {
    v["Datacenters"]
        .as_array()
        .map(|d| d.iter().map(text).collect())
        .unwrap_or_default()
}

/// The first lines of a policy or role.
fn print_named(v: &Value) {
    println!("ID:           {}", text(&v["ID"]));
    println!("Name:         {}", text(&v["Name"]));
    println!("Description:  {}", text(&v["Description"]));
}

fn print_links(title: &str, links: &Value) {
    if let Some(links) = links.as_array().filter(|l| !l.is_empty()) {
        println!("{title}:");
        for l in links {
            println!("   {} - {}", text(&l["ID"]), text(&l["Name"]));
        }
    }
}

fn print_identities(v: &Value) {
    if let Some(ids) = v["ServiceIdentities"].as_array() {
        println!("Service Identities:");
        for s in ids {
            let dcs = datacenters(s);
            let dcs = if dcs.is_empty() {
                "all".to_owned()
            } else {
                dcs.join(", ")
            };
            println!("   {} (Datacenters: {dcs})", text(&s["ServiceName"]));
        }
    }
    if let Some(ids) = v["NodeIdentities"].as_array() {
        println!("Node Identities:");
        for n in ids {
            println!(
                "   {} (Datacenter: {})",
                text(&n["NodeName"]),
                text(&n["Datacenter"])
            );
        }
    }
}

fn print_token(t: &Value) {
    println!("AccessorID:       {}", text(&t["AccessorID"]));
    println!("SecretID:         {}", text(&t["SecretID"]));
    println!("Description:      {}", text(&t["Description"]));
    println!("Local:            {}", t["Local"]);
    println!("Create Time:      {}", text(&t["CreateTime"]));
    if let Some(at) = t["ExpirationTime"].as_str() {
        println!("Expiration Time:  {at}");
    }
    print_links("Policies", &t["Policies"]);
    print_links("Roles", &t["Roles"]);
    print_identities(t);
}

fn print_policy(p: &Value) {
    print_named(p);
    println!("Datacenters:  {}", datacenters(p).join(", "));
    if let Some(rules) = p["Rules"].as_str() {
        println!("Rules:");
        println!("{rules}");
    }
}

fn print_role(r: &Value) {
    print_named(r);
    print_links("Policies", &r["Policies"]);
    print_identities(r);
}

/// Prints one result, or a list (blank line between items), in the chosen format.
fn output(format: Format, value: &Value, print: fn(&Value)) -> anyhow::Result<()> {
    match (format, value.as_array()) {
        (Format::Json, _) => println!("{}", serde_json::to_string_pretty(value)?),
        (Format::Pretty, Some(items)) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print(item);
            }
        }
        (Format::Pretty, None) => print(value),
    }
    Ok(())
}

pub async fn run(cmd: AclCommand) -> anyhow::Result<i32> {
    let agent = &cmd.agent;
    let format = cmd.format;
    match cmd.action {
        AclAction::Bootstrap => {
            let token = send(agent, Method::PUT, "/v1/acl/bootstrap", None).await?;
            output(format, &token, print_token)?;
        }
        AclAction::Token(action) => token(agent, format, action).await?,
        AclAction::Policy(action) => policy(agent, format, action).await?,
        AclAction::Role(action) => role(agent, format, action).await?,
    }
    Ok(0)
}

async fn token(agent: &AgentAddr, format: Format, action: TokenAction) -> anyhow::Result<()> {
    let result = match action {
        TokenAction::Create(new) => put(agent, "/v1/acl/token", new.into_body()?).await?,
        TokenAction::Read { id, self_ } => {
            let path = match id.filter(|_| !self_) {
                Some(id) => format!("/v1/acl/token/{id}"),
                None => "/v1/acl/token/self".to_owned(),
            };
            get(agent, &path).await?
        }
        TokenAction::Update {
            id,
            description,
            grants,
        } => {
            let body = grants.into_body(json!({ "Description": description }), true)?;
            put(agent, &format!("/v1/acl/token/{id}"), body).await?
        }
        TokenAction::Clone { id, description } => {
            let body = json!({ "Description": description });
            put(agent, &format!("/v1/acl/token/{id}/clone"), body).await?
        }
        TokenAction::Delete { id } => return delete(agent, "token", &id).await,
        TokenAction::List => get(agent, "/v1/acl/tokens").await?,
    };
    output(format, &result, print_token)
}

async fn policy(agent: &AgentAddr, format: Format, action: PolicyAction) -> anyhow::Result<()> {
    let result = match action {
        PolicyAction::Create(fields) => put(agent, "/v1/acl/policy", fields.into_body()?).await?,
        PolicyAction::Read(which) => read(agent, "policy", which).await?,
        PolicyAction::Update { id, fields } => {
            put(agent, &format!("/v1/acl/policy/{id}"), fields.into_body()?).await?
        }
        PolicyAction::Delete(which) => return delete_named(agent, "policy", which).await,
        PolicyAction::List => get(agent, "/v1/acl/policies").await?,
    };
    output(format, &result, print_policy)
}

async fn role(agent: &AgentAddr, format: Format, action: RoleAction) -> anyhow::Result<()> {
    let result = match action {
        RoleAction::Create {
            name,
            description,
            grants,
        } => {
            let body =
                grants.into_body(json!({ "Name": name, "Description": description }), false)?;
            put(agent, "/v1/acl/role", body).await?
        }
        RoleAction::Read(which) => read(agent, "role", which).await?,
        RoleAction::Delete(which) => return delete_named(agent, "role", which).await,
        RoleAction::List => get(agent, "/v1/acl/roles").await?,
    };
    output(format, &result, print_role)
}
