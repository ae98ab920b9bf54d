//! Vigil's server role: the replicated state machine, raft, leader duties and blocking-query
//! wakeups.

pub mod api;
pub mod dial;
pub mod leader;
pub mod operator;
pub mod proposer;
pub mod protocol;
pub mod raft;
pub mod reconcile;
pub mod server;
pub mod snapshot;
pub mod state;
pub mod telemetry;
pub mod turns;
pub mod watch;

#[cfg(test)]
mod message_fuzz;

pub use api::ServerApi;
pub use server::{
    RaftTiming, Server, ServerConfig, ServerMode, StartError, raft_config, read_lease,
};
