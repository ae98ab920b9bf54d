//! KV domain types: a stored entry and the operations that change or read keys.
//! `(key, lock_index, session)` of a held entry is the lock's sequencer (fencing token).

use serde::{Deserialize, Serialize};

/// One stored key. Indexes are the raft indexes that created and last modified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEntry {
    pub key: String,
    /// Empty means "no value" and reads back as JSON `null`, as in Consul. Encoded as bytes
    /// (one copy) rather than a sequence of numbers; postcard writes both the same way.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub flags: u64,
    /// The session holding the lock on this key, if any.
    pub session: Option<String>,
    /// Number of successful acquisitions; never decreases (Vigil's fencing guarantee).
    pub lock_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A KV verb, as in Consul's txn API. Single-key HTTP writes are one-op transactions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOp {
    /// 0
    Set {
        key: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: u64,
    },
    /// 1: write only if the key's ModifyIndex equals `index` (0: only if absent).
    Cas {
        key: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: u64,
        index: u64,
    },
    /// 2
    Lock {
        key: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: u64,
        session: String,
    },
    /// 3
    Unlock {
        key: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: u64,
        session: String,
    },
    /// 4
    Get { key: String },
    /// 5
    GetOrEmpty { key: String },
    /// 6
    GetTree { prefix: String },
    /// 7
    CheckIndex { key: String, index: u64 },
    /// 8: `session` empty means "the key must be unlocked".
    CheckSession { key: String, session: String },
    /// 9
    CheckNotExists { key: String },
    /// 10
    Delete { key: String },
    /// 11
    DeleteTree { prefix: String },
    /// 12
    DeleteCas { key: String, index: u64 },
}

impl KvOp {
    /// Whether the op changes state (a transaction of reads only skips raft).
    pub fn is_write(&self) -> bool {
        !matches!(
            self,
            KvOp::Get { .. }
                | KvOp::GetOrEmpty { .. }
                | KvOp::GetTree { .. }
                | KvOp::CheckIndex { .. }
                | KvOp::CheckSession { .. }
                | KvOp::CheckNotExists { .. }
        )
    }

    pub fn key(&self) -> &str {
        match self {
            KvOp::Set { key, .. }
            | KvOp::Cas { key, .. }
            | KvOp::Lock { key, .. }
            | KvOp::Unlock { key, .. }
            | KvOp::Get { key }
            | KvOp::GetOrEmpty { key }
            | KvOp::CheckIndex { key, .. }
            | KvOp::CheckSession { key, .. }
            | KvOp::CheckNotExists { key }
            | KvOp::Delete { key }
            | KvOp::DeleteCas { key, .. } => key,
            KvOp::GetTree { prefix } | KvOp::DeleteTree { prefix } => prefix,
        }
    }
}

/// Why one KV op failed. The `Display` text is Consul's `What` string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum KvOpError {
    #[error("missing session")]
    MissingSession,
    #[error("invalid session \"{0}\"")]
    InvalidSession(String),
    #[error("failed to lock key \"{0}\", lock is already held")]
    LockHeld(String),
    #[error("failed to lock key \"{key}\" due to lock delay")]
    LockDelay { key: String, remaining_ms: u64 },
    #[error("failed to unlock key \"{0}\", lock isn't held, or is held by another session")]
    NotHeld(String),
    #[error("failed to set key \"{0}\", index is stale")]
    CasStale(String),
    #[error("failed to delete key \"{0}\", index is stale")]
    DeleteCasStale(String),
    #[error("key \"{0}\" doesn't exist")]
    NotFound(String),
    #[error("failed to check index, key \"{0}\" doesn't exist")]
    CheckIndexMissing(String),
    #[error("failed index check for key \"{key}\", current modify index {current} != {expected}")]
    CheckIndexFailed {
        key: String,
        current: u64,
        expected: u64,
    },
    #[error("failed to check session, key \"{0}\" doesn't exist")]
    CheckSessionMissing(String),
    #[error(
        "failed session check for key \"{key}\", current session \"{current}\" != \"{expected}\""
    )]
    CheckSessionFailed {
        key: String,
        current: String,
        expected: String,
    },
    #[error("key \"{0}\" exists")]
    Exists(String),
    #[error("Must provide key")]
    MissingKey,
    #[error("cannot run a write operation in a read-only transaction")]
    WriteInReadOnly,
}

/// One failed op of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnError {
    pub op_index: usize,
    pub error: KvOpError,
}

/// Outcome of a transaction: either every result, or every error (nothing applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOutcome {
    /// Results in op order; deletes and `check-not-exists` produce none.
    /// Write results carry no value, read results do.
    Committed(Vec<KvEntry>),
    RolledBack(Vec<TxnError>),
}
