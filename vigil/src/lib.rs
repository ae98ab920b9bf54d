//! The `vigil` command over the agent library: the command line (`vigil agent`'s flags, which
//! become the top layer of the agent's config, and the subcommands), logging, signals. Everything
//! lives here rather than in `main.rs` so that the integration tests build the same command
//! (`vigil-under-test`).

pub mod cli;
pub mod run;
pub mod snapshot;
