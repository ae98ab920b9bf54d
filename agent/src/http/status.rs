//! `/v1/status/*`: the leader's RPC address and the raft voters.

use axum::extract::{RawQuery, State};
use axum::response::Response;

use super::params::Params;
use super::{AppState, json};

pub async fn leader(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    json(&params, &state.server.leader_addr().unwrap_or_default())
}

pub async fn peers(State(state): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let params = Params::parse(q.as_deref());
    json(&params, &state.server.peers())
}
