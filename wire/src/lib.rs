//! Vigil's wire layer, shared by agents and servers: mutual TLS with role-bearing certificates
//! ([`tls`]) and request/response RPC over QUIC ([`transport`]). It moves bytes and proves who
//! sent them; the messages themselves are defined by the crates that speak them.

pub mod tls;
pub mod transport;
