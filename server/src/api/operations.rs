//! The operator requests an agent makes (`/v1/operator/*`, `/v1/snapshot`), each a type
//! implementing [`Operation`] with the answer it gets: the one place an [`OperatorReply`] is
//! taken apart, as `vigil_shared::rpc::writes` is for writes. On the wire they travel as
//! [`OperatorRequest`] and [`OperatorReply`].

use vigil_shared::autopilot::AutopilotConfig;
use vigil_shared::operator::{AutopilotHealth, OperatorReply, OperatorRequest, PeerRef};
use vigil_shared::rpc::Request;

use crate::raft::NodeId;

/// An operator request that names its answer (the [`Request`] convention): a caller gets
/// `O::Output` from the agent's `Backend::operate::<O>`, never an [`OperatorReply`] to match.
pub trait Operation: Request<Answer = OperatorReply> + Into<OperatorRequest> {}

/// For each operation: the request it travels as, and the reply that answers it (`Done` for
/// a request that only succeeds or fails).
macro_rules! operations {
    ($(
        $name:ident: $fields:pat => $request:expr,
            answers $output:ty: $reply:pat => $answer:expr;
    )*) => {$(
        impl From<$name> for OperatorRequest {
            fn from($fields: $name) -> OperatorRequest {
                $request
            }
        }

        impl Operation for $name {}

        impl Request for $name {
            type Answer = OperatorReply;
            type Output = $output;

            fn output(reply: OperatorReply) -> Result<$output, OperatorReply> {
                match reply {
                    $reply => Ok($answer),
                    other => Err(other),
                }
            }
        }
    )*};
}

/// Removes a server from the raft configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovePeer(pub PeerRef);

/// Hands leadership to `to`, or with `None` to the most caught-up voter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferLeader {
    pub to: Option<NodeId>,
}

/// Autopilot's view of the servers' health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health;

/// The leader's whole state as a snapshot archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveSnapshot;

/// A snapshot archive and the raft index it was taken at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub index: u64,
    pub archive: Vec<u8>,
}

/// Replaces the state with a snapshot archive's, through raft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSnapshot(pub Vec<u8>);

/// Autopilot's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetAutopilot;

/// Replaces autopilot's settings; with `cas`, only if it is their `modify_index`. Answers
/// whether they were replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAutopilot {
    pub config: AutopilotConfig,
    pub cas: Option<u64>,
}

operations! {
    RemovePeer: RemovePeer(peer) => OperatorRequest::RemovePeer(peer),
        answers (): OperatorReply::Done => ();
    TransferLeader: TransferLeader { to } => OperatorRequest::TransferLeader { to },
        answers (): OperatorReply::Done => ();
    Health: Health => OperatorRequest::AutopilotHealth,
        answers AutopilotHealth: OperatorReply::Health(health) => health;
    SaveSnapshot: SaveSnapshot => OperatorRequest::SnapshotSave,
        answers Saved: OperatorReply::Snapshot { index, archive } => Saved { index, archive };
    RestoreSnapshot: RestoreSnapshot(archive) => OperatorRequest::SnapshotRestore(archive),
        answers (): OperatorReply::Done => ();
    GetAutopilot: GetAutopilot => OperatorRequest::AutopilotGet,
        answers AutopilotConfig: OperatorReply::Autopilot(config) => config;
    SetAutopilot: SetAutopilot { config, cas } => OperatorRequest::AutopilotSet { config, cas },
        answers bool: OperatorReply::Applied(applied) => applied;
}
