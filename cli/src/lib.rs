//! The `vigil` command's client subcommands: `vigil kv`, `vigil lock`, `vigil session`,
//! `vigil acl`, `vigil tls` and the rest. Each is a client of an agent's HTTP(S) API (see
//! [`cmd`]), or, for `vigil tls`, writes certificate files; none runs an agent. The `vigil`
//! binary puts [`Command`]'s subcommands beside `vigil agent` and hands them to [`run`].

pub mod cmd;
pub mod tls_cmd;

use std::ffi::OsString;

use clap::Subcommand;

use cmd::{acl, debug, elect, keyring, kv, lock, members, monitor, operator, session, watch};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the cluster CA and the certificates it signs.
    Tls(tls_cmd::TlsCommand),
    /// Run a command while holding a lock on a KV prefix; `lock status PREFIX` shows holders.
    Lock(cmd::lock::LockCommand),
    /// Run a command while leader of an election.
    Elect(cmd::elect::ElectArgs),
    /// Read and write the KV store.
    Kv(cmd::kv::KvCommand),
    /// Watch a key, a prefix, services, nodes, a service or checks, running a handler on every
    /// change (`consul watch`).
    Watch(cmd::watch::WatchArgs),
    /// List, create, destroy and renew sessions.
    Session(cmd::session::SessionCommand),
    /// List, install, use (make primary) and remove gossip encryption keys on every member
    /// (`consul keyring`).
    Keyring(cmd::keyring::KeyringArgs),
    /// List the gossip members the local agent knows.
    Members(cmd::members::MembersArgs),
    /// Ask the local agent to join a member's gossip address.
    Join(cmd::members::JoinArgs),
    /// Make the local agent leave the cluster gracefully and stop.
    Leave(cmd::AgentAddr),
    /// Mark a failed member as left (the leader then deregisters it).
    ForceLeave(cmd::members::ForceLeaveArgs),
    /// Cluster operations (`operator raft list-peers|remove-peer|transfer-leader`, `operator autopilot get-config|set-config|state`).
    #[command(subcommand)]
    Operator(cmd::members::OperatorCommand),
    /// Gather the agent's log, metrics and cluster view for a bug report into `<output>.tar.gz`.
    Debug(cmd::debug::DebugArgs),
    /// Follow the local agent's log.
    Monitor(cmd::monitor::MonitorArgs),
    /// Print the local agent's figures (raft, agent, consul sections).
    Info(cmd::AgentAddr),
    /// Re-read the local agent's config file (its services and checks).
    Reload(cmd::AgentAddr),
    /// Bootstrap ACLs and manage tokens, policies and roles (`consul acl`).
    Acl(cmd::acl::AclCommand),
}

/// The command line with Consul's spellings (`vigil lock -n=2 ...`, `vigil watch -type=key`,
/// Go's `-flag=value`) rewritten into the ones clap parses.
pub fn argv(argv: Vec<OsString>) -> Vec<OsString> {
    cmd::go_flags_argv(watch::consul_argv(lock::consul_argv(argv)))
}

/// Runs a client command; every one but `vigil tls` exits the process with its status.
pub async fn run(command: Command) -> anyhow::Result<()> {
    let result = match command {
        Command::Tls(cmd) => return tls_cmd::run(cmd),
        Command::Lock(cmd) => lock::run(cmd).await,
        Command::Elect(args) => elect::run(args).await,
        Command::Kv(cmd) => kv::run(cmd).await,
        Command::Watch(args) => watch::run(args).await,
        Command::Session(cmd) => session::run(cmd).await,
        Command::Keyring(args) => keyring::run(args).await,
        Command::Members(args) => members::members(args).await,
        Command::Join(args) => members::join(args).await,
        Command::Leave(agent) => members::leave(agent).await,
        Command::ForceLeave(args) => members::force_leave(args).await,
        Command::Operator(cmd) => operator::run(cmd).await,
        Command::Acl(cmd) => acl::run(cmd).await,
        Command::Debug(args) => debug::run(args).await,
        Command::Monitor(args) => monitor::monitor(args).await,
        Command::Info(agent) => monitor::info(agent).await,
        Command::Reload(agent) => monitor::reload(agent).await,
    };
    cmd::exit(result)
}
