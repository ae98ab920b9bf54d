//! The vocabulary Vigil agents and servers share: domain types (KV entries, sessions, catalog),
//! the messages agents and servers exchange (state changes, reads, the client requests and the
//! operator's), Go-style durations, and the Consul JSON shapes.

pub mod acl;
pub mod api;
pub mod autopilot;
pub mod catalog;
pub mod first_release;
pub mod go;
pub mod history;
pub mod kv;
pub mod lock;
pub mod operator;
pub mod query;
pub mod recipe;
pub mod rpc;
pub mod session;
pub mod txn;
pub mod vigil_api;
#[cfg(test)]
mod wire_tests;

/// The state machine's protocol this build applies. Level 2: every op gets its own index (also
/// the ops the leader batches into one raft entry), and the lock queue knows which request
/// holds a contender's place (`LockOp::Enqueue`, `LockOp::Leave`), the state machine keeps each
/// lock's history, and a TTL expiry is its own op (`Op::ExpireSession`). A cluster applies the
/// previous level until every server advertises this one and the leader commits
/// `Op::SetProtocol`, so servers of two releases never apply the same entry differently.
pub const PROTOCOL: u32 = 2;

/// Largest KV value accepted (Consul's `kv_max_value_size`).
pub const KV_MAX_VALUE_SIZE: usize = 512 * 1024;
/// Most ops in one transaction (Consul's limit since 1.14).
pub const TXN_MAX_OPS: usize = 128;
/// Largest transaction body (Consul's `txn_max_req_len`).
pub const TXN_MAX_REQ_LEN: usize = 512 * 1024;
/// Lock-delay is capped to this when applied.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;
/// Default lock-delay of a session created over HTTP.
pub const DEFAULT_LOCK_DELAY_NS: u64 = 15_000_000_000;
/// Longest session TTL (`SessionTTLMax`).
pub const SESSION_TTL_MAX_NS: u64 = 24 * 3600 * 1_000_000_000;
/// The leader arms each TTL timer for TTL times this (Consul's `SessionTTLMultiplier`).
pub const SESSION_TTL_MULTIPLIER: u32 = 2;
