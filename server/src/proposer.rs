//! Turning an [`Op`] into a committed raft entry: stamp it with this leader's clock and
//! `client_write` it, mapping openraft's errors to what a caller can act on.

use openraft::error::{ClientWriteError, RaftError};
use vigil_shared::rpc::{Command, Op, Response, ServerError};

use crate::raft::{NodeId, Raft};

/// Milliseconds since the Unix epoch on this machine's clock.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
        other => ServerError::Raft(other.to_string()),
    }
}
