//! The operator requests an agent makes (`/v1/operator/*`, `/v1/snapshot`), each a type
//! implementing [`Operation`] with the answer it gets: the one place an [`OperatorReply`] is
//! taken apart, as `vigil_shared::rpc::writes` is for writes. On the wire they travel as
//! [`OperatorRequest`] and [`OperatorReply`].

use vigil_shared::autopilot::AutopilotConfig;

use crate::operator::{AutopilotHealth, OperatorReply, OperatorRequest, PeerRef};
use crate::raft::NodeId;

/// An operator request that names its answer: a caller gets `O::Output` from the agent's
/// `Backend::operate::<O>`, never an [`OperatorReply`] to match.
pub trait Operation: Into<OperatorRequest> {
    type Output;
    /// The answer out of its wire form, or the reply back when it answers another request (a
    /// protocol bug: a server of another build).
    fn output(reply: OperatorReply) -> Result<Self::Output, OperatorReply>;
}

/// `Done`, the answer of a request that only succeeds or fails.
fn done(reply: OperatorReply) -> Result<(), OperatorReply> {
    match reply {
        OperatorReply::Done => Ok(()),
        other => Err(other),
    }
}

/// Removes a server from the raft configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovePeer(pub PeerRef);

impl From<RemovePeer> for OperatorRequest {
    fn from(RemovePeer(peer): RemovePeer) -> OperatorRequest {
        OperatorRequest::RemovePeer(peer)
    }
}

impl Operation for RemovePeer {
    type Output = ();

    fn output(reply: OperatorReply) -> Result<(), OperatorReply> {
        done(reply)
    }
}

/// Hands leadership to `to`, or with `None` to the most caught-up voter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferLeader {
    pub to: Option<NodeId>,
}

impl From<TransferLeader> for OperatorRequest {
    fn from(TransferLeader { to }: TransferLeader) -> OperatorRequest {
        OperatorRequest::TransferLeader { to }
    }
}

impl Operation for TransferLeader {
    type Output = ();

    fn output(reply: OperatorReply) -> Result<(), OperatorReply> {
        done(reply)
    }
}

/// Autopilot's view of the servers' health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health;

impl From<Health> for OperatorRequest {
    fn from(Health: Health) -> OperatorRequest {
        OperatorRequest::AutopilotHealth
    }
}

impl Operation for Health {
    type Output = AutopilotHealth;

    fn output(reply: OperatorReply) -> Result<AutopilotHealth, OperatorReply> {
        match reply {
            OperatorReply::Health(health) => Ok(health),
            other => Err(other),
        }
    }
}

/// The leader's whole state as a snapshot archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveSnapshot;

/// A snapshot archive and the raft index it was taken at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub index: u64,
    pub archive: Vec<u8>,
}

impl From<SaveSnapshot> for OperatorRequest {
    fn from(SaveSnapshot: SaveSnapshot) -> OperatorRequest {
        OperatorRequest::SnapshotSave
    }
}

impl Operation for SaveSnapshot {
    type Output = Saved;

    fn output(reply: OperatorReply) -> Result<Saved, OperatorReply> {
        match reply {
            OperatorReply::Snapshot { index, archive } => Ok(Saved { index, archive }),
            other => Err(other),
        }
    }
}

/// Replaces the state with a snapshot archive's, through raft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSnapshot(pub Vec<u8>);

impl From<RestoreSnapshot> for OperatorRequest {
    fn from(RestoreSnapshot(archive): RestoreSnapshot) -> OperatorRequest {
        OperatorRequest::SnapshotRestore(archive)
    }
}

impl Operation for RestoreSnapshot {
    type Output = ();

    fn output(reply: OperatorReply) -> Result<(), OperatorReply> {
        done(reply)
    }
}

/// Autopilot's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetAutopilot;

impl From<GetAutopilot> for OperatorRequest {
    fn from(GetAutopilot: GetAutopilot) -> OperatorRequest {
        OperatorRequest::AutopilotGet
    }
}

impl Operation for GetAutopilot {
    type Output = AutopilotConfig;

    fn output(reply: OperatorReply) -> Result<AutopilotConfig, OperatorReply> {
        match reply {
            OperatorReply::Autopilot(config) => Ok(config),
            other => Err(other),
        }
    }
}

/// Replaces autopilot's settings; with `cas`, only if it is their `modify_index`. Answers
/// whether they were replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAutopilot {
    pub config: AutopilotConfig,
    pub cas: Option<u64>,
}

impl From<SetAutopilot> for OperatorRequest {
    fn from(SetAutopilot { config, cas }: SetAutopilot) -> OperatorRequest {
        OperatorRequest::AutopilotSet { config, cas }
    }
}

impl Operation for SetAutopilot {
    type Output = bool;

    fn output(reply: OperatorReply) -> Result<bool, OperatorReply> {
        match reply {
            OperatorReply::Applied(applied) => Ok(applied),
            other => Err(other),
        }
    }
}
