//! Turning an [`Op`] into a committed raft entry: stamp it with this leader's clock and
//! `client_write` it, mapping openraft's errors to what a caller can act on. No entry larger
//! than [`MAX_COMMAND_BYTES`] is ever proposed: the HTTP API refuses large bodies long before,
//! and this is the bound that holds whatever path a change comes by (every entry must cross
//! to a follower within one AppendEntries).

use openraft::error::{ClientWriteError, RaftError};
use vigil_shared::rpc::{Command, Op, Response, ServerError};

use crate::raft::{NodeId, Raft};

/// Milliseconds since the Unix epoch on this machine's clock.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The largest encoded [`Command`] a raft entry may carry: above the largest request the HTTP
/// API admits (a 512 KiB KV value or txn body) with room to spare.
pub const MAX_COMMAND_BYTES: usize = 2 * 1024 * 1024;

#[derive(Clone)]
pub struct Proposer {
    raft: Raft,
}

impl Proposer {
    pub fn new(raft: Raft) -> Proposer {
        Proposer { raft }
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Commits `op` through raft and returns what applying it produced.
    pub async fn propose(&self, op: Op) -> Result<Response, ServerError> {
        let cmd = Command {
            now_ms: wall_ms(),
            op,
        };
        let size = postcard::experimental::serialized_size(&cmd)
            .map_err(|e| ServerError::Raft(format!("encoding a command: {e}")))?;
        if size > MAX_COMMAND_BYTES {
            return Err(ServerError::TooLarge {
                size,
                limit: MAX_COMMAND_BYTES,
            });
        }
        match self.raft.client_write(cmd).await {
            Ok(written) => Ok(written.data),
            Err(e) => Err(map_write_error(e)),
        }
    }
}

fn map_write_error(
    e: RaftError<NodeId, ClientWriteError<NodeId, crate::raft::Node>>,
) -> ServerError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => match f.leader_node {
            Some(node) => ServerError::NotLeader {
                leader: Some(node.rpc_addr),
            },
            None => ServerError::NoLeader,
        },
        RaftError::Fatal(openraft::error::Fatal::Stopped) => ServerError::ShuttingDown,
        // The entry may have reached other servers before the log failed here: the outcome is
        // unknown. The cause goes to this server's log, not to the client.
        RaftError::Fatal(fatal) => {
            tracing::error!(error = %fatal, "raft has stopped on this server");
            ServerError::Raft(
                "the raft log on this server failed; the change may or may not have been applied"
                    .to_owned(),
            )
        }
        other => ServerError::Raft(other.to_string()),
    }
}
