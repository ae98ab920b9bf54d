//! `vigil acl bootstrap|token|policy|role ...`: Consul's `consul acl` commands through the local
//! agent's HTTP API. Results print as Consul's CLI prints them, or as the API's JSON with
//! `--format json`.

use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use vigil_shared::api::acl::{
    GrantsJson, LinkJson, NodeIdentityJson, PolicyJson, PolicyRequest, RoleJson, RoleRequest,
    ServiceIdentityJson, TokenJson, TokenRequest,
};

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
    /// The links and identities the flags name.
    fn into_json(self, with_roles: bool) -> anyhow::Result<GrantsJson> {
        let links = |ids: Vec<String>, names: Vec<String>| -> Vec<LinkJson> {
            ids.into_iter()
                .map(|id| LinkJson {
                    id,
                    name: String::new(),
                })
                .chain(names.into_iter().map(|name| LinkJson {
                    id: String::new(),
                    name,
                }))
                .collect()
        };
        let roles = links(self.role_ids, self.role_names);
        anyhow::ensure!(with_roles || roles.is_empty(), "a role cannot link roles");
        let service_identities = self
            .service_identities
            .iter()
            .map(|s| match s.split_once(':') {
                Some((name, dcs)) => ServiceIdentityJson {
                    service_name: name.to_owned(),
                    datacenters: dcs.split(',').map(str::to_owned).collect(),
                },
                None => ServiceIdentityJson {
                    service_name: s.clone(),
                    datacenters: Vec::new(),
                },
            })
            .collect();
        let node_identities = self
            .node_identities
            .iter()
            .map(|n| {
                let (node, dc) = n
                    .split_once(':')
                    .ok_or_else(|| anyhow::anyhow!("--node-identity must be NODE:DC, not {n:?}"))?;
                Ok(NodeIdentityJson {
                    node_name: node.to_owned(),
                    datacenter: dc.to_owned(),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(GrantsJson {
            policies: links(self.policy_ids, self.policy_names),
            roles,
            service_identities,
            node_identities,
        })
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
    fn into_request(self) -> anyhow::Result<TokenRequest> {
        Ok(TokenRequest {
            description: self.description,
            local: self.local,
            grants: self.grants.into_json(true)?,
            expiration_ttl: self.expires_ttl,
            secret_id: self.secret,
        })
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
    fn into_request(self) -> anyhow::Result<PolicyRequest> {
        let rules = match self.rules.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading rules from {path}: {e}"))?,
            None => self.rules,
        };
        Ok(PolicyRequest {
            name: self.name,
            description: self.description,
            rules,
        })
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

async fn send<T: DeserializeOwned>(
    agent: &AgentAddr,
    method: Method,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<T> {
    let response = call_with(agent, method, path, body).await?;
    Ok(response.json().await?)
}

async fn get<T: DeserializeOwned>(agent: &AgentAddr, path: &str) -> anyhow::Result<T> {
    send(agent, Method::GET, path, None).await
}

async fn put<T: DeserializeOwned>(
    agent: &AgentAddr,
    path: &str,
    body: &impl Serialize,
) -> anyhow::Result<T> {
    send(agent, Method::PUT, path, Some(serde_json::to_string(body)?)).await
}

/// A policy or role, by what both have.
trait Named: DeserializeOwned {
    /// `policy` or `role`, as the API's paths and Consul's texts say it.
    const KIND: &'static str;
    fn id(&self) -> &str;
}

impl Named for PolicyJson {
    const KIND: &'static str = "policy";
    fn id(&self) -> &str {
        &self.id
    }
}

impl Named for RoleJson {
    const KIND: &'static str = "role";
    fn id(&self) -> &str {
        &self.id
    }
}

/// The ID given, or the ID of the policy or role with the name given.
async fn id_of<T: Named>(agent: &AgentAddr, which: IdOrName) -> anyhow::Result<String> {
    match (which.id, which.name) {
        (Some(id), _) => Ok(id),
        (None, Some(name)) => {
            let found: T = get(agent, &format!("/v1/acl/{}/name/{name}", T::KIND)).await?;
            Ok(found.id().to_owned())
        }
        (None, None) => anyhow::bail!("give --id or --name"),
    }
}

/// The policy or role by ID or name.
async fn read<T: Named>(agent: &AgentAddr, which: IdOrName) -> anyhow::Result<T> {
    let id = id_of::<T>(agent, which).await?;
    get(agent, &format!("/v1/acl/{}/{id}", T::KIND)).await
}

/// Deletes the policy or role by ID or name.
async fn delete_named<T: Named>(agent: &AgentAddr, which: IdOrName) -> anyhow::Result<()> {
    let id = id_of::<T>(agent, which).await?;
    delete(agent, T::KIND, &id).await
}

/// Deletes the token, policy or role `id` (`kind`) and says so, as Consul's CLI does.
async fn delete(agent: &AgentAddr, kind: &str, id: &str) -> anyhow::Result<()> {
    call_with(agent, Method::DELETE, &format!("/v1/acl/{kind}/{id}"), None).await?;
    let mut title = kind.to_owned();
    title[..1].make_ascii_uppercase();
    println!("{title} \"{id}\" deleted successfully");
    Ok(())
}

/// The first lines of a policy or role.
fn print_named(id: &str, name: &str, description: &str) {
    println!("ID:           {id}");
    println!("Name:         {name}");
    println!("Description:  {description}");
}

fn print_links(title: &str, links: &[LinkJson]) {
    if !links.is_empty() {
        println!("{title}:");
        for l in links {
            println!("   {} - {}", l.id, l.name);
        }
    }
}

fn print_grants(grants: &GrantsJson) {
    print_links("Policies", &grants.policies);
    print_links("Roles", &grants.roles);
    if !grants.service_identities.is_empty() {
        println!("Service Identities:");
        for s in &grants.service_identities {
            let dcs = if s.datacenters.is_empty() {
                "all".to_owned()
            } else {
                s.datacenters.join(", ")
            };
            println!("   {} (Datacenters: {dcs})", s.service_name);
        }
    }
    if !grants.node_identities.is_empty() {
        println!("Node Identities:");
        for n in &grants.node_identities {
            println!("   {} (Datacenter: {})", n.node_name, n.datacenter);
        }
    }
}

fn print_token(t: &TokenJson) {
    println!("AccessorID:       {}", t.accessor_id);
    println!("SecretID:         {}", t.secret_id);
    println!("Description:      {}", t.description);
    println!("Local:            {}", t.local);
    println!("Create Time:      {}", t.create_time);
    if let Some(at) = &t.expiration_time {
        println!("Expiration Time:  {at}");
    }
    print_grants(&t.grants);
}

fn print_policy(p: &PolicyJson) {
    print_named(&p.id, &p.name, &p.description);
    println!("Datacenters:  {}", p.datacenters.join(", "));
    if let Some(rules) = &p.rules {
        println!("Rules:");
        println!("{rules}");
    }
}

fn print_role(r: &RoleJson) {
    print_named(&r.id, &r.name, &r.description);
    print_grants(&r.grants);
}

/// What a command answered: one item or a list.
enum Answer<T> {
    One(T),
    List(Vec<T>),
}

/// Prints an answer in the chosen format; a list's items with a blank line between them.
fn output<T: Serialize>(format: Format, answer: Answer<T>, print: fn(&T)) -> anyhow::Result<()> {
    match (format, answer) {
        (Format::Json, Answer::One(item)) => {
            println!("{}", serde_json::to_string_pretty(&item)?)
        }
        (Format::Json, Answer::List(items)) => {
            println!("{}", serde_json::to_string_pretty(&items)?)
        }
        (Format::Pretty, Answer::One(item)) => print(&item),
        (Format::Pretty, Answer::List(items)) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print(item);
            }
        }
    }
    Ok(())
}

pub async fn run(cmd: AclCommand) -> anyhow::Result<i32> {
    let agent = &cmd.agent;
    let format = cmd.format;
    match cmd.action {
        AclAction::Bootstrap => {
            let token = send(agent, Method::PUT, "/v1/acl/bootstrap", None).await?;
            output(format, Answer::One(token), print_token)?;
        }
        AclAction::Token(action) => token(agent, format, action).await?,
        AclAction::Policy(action) => policy(agent, format, action).await?,
        AclAction::Role(action) => role(agent, format, action).await?,
    }
    Ok(0)
}

async fn token(agent: &AgentAddr, format: Format, action: TokenAction) -> anyhow::Result<()> {
    let answer = match action {
        TokenAction::Create(new) => {
            Answer::One(put(agent, "/v1/acl/token", &new.into_request()?).await?)
        }
        TokenAction::Read { id, self_ } => {
            let path = match id.filter(|_| !self_) {
                Some(id) => format!("/v1/acl/token/{id}"),
                None => "/v1/acl/token/self".to_owned(),
            };
            Answer::One(get(agent, &path).await?)
        }
        TokenAction::Update {
            id,
            description,
            grants,
        } => {
            let body = TokenRequest {
                description,
                grants: grants.into_json(true)?,
                ..TokenRequest::default()
            };
            Answer::One(put(agent, &format!("/v1/acl/token/{id}"), &body).await?)
        }
        TokenAction::Clone { id, description } => {
            let body = TokenRequest {
                description,
                ..TokenRequest::default()
            };
            Answer::One(put(agent, &format!("/v1/acl/token/{id}/clone"), &body).await?)
        }
        TokenAction::Delete { id } => return delete(agent, "token", &id).await,
        TokenAction::List => Answer::List(get(agent, "/v1/acl/tokens").await?),
    };
    output(format, answer, print_token)
}

async fn policy(agent: &AgentAddr, format: Format, action: PolicyAction) -> anyhow::Result<()> {
    let answer = match action {
        PolicyAction::Create(fields) => {
            Answer::One(put(agent, "/v1/acl/policy", &fields.into_request()?).await?)
        }
        PolicyAction::Read(which) => Answer::One(read::<PolicyJson>(agent, which).await?),
        PolicyAction::Update { id, fields } => Answer::One(
            put(
                agent,
                &format!("/v1/acl/policy/{id}"),
                &fields.into_request()?,
            )
            .await?,
        ),
        PolicyAction::Delete(which) => return delete_named::<PolicyJson>(agent, which).await,
        PolicyAction::List => Answer::List(get(agent, "/v1/acl/policies").await?),
    };
    output(format, answer, print_policy)
}

async fn role(agent: &AgentAddr, format: Format, action: RoleAction) -> anyhow::Result<()> {
    let answer = match action {
        RoleAction::Create {
            name,
            description,
            grants,
        } => {
            let body = RoleRequest {
                name,
                description,
                grants: grants.into_json(false)?,
            };
            Answer::One(put(agent, "/v1/acl/role", &body).await?)
        }
        RoleAction::Read(which) => Answer::One(read::<RoleJson>(agent, which).await?),
        RoleAction::Delete(which) => return delete_named::<RoleJson>(agent, which).await,
        RoleAction::List => Answer::List(get(agent, "/v1/acl/roles").await?),
    };
    output(format, answer, print_role)
}
