//! Vigil's additions under `/v1/vigil/`: the linearizable sequencer (fencing token) check.

use axum::extract::{OriginalUri, State};
use axum::response::Response;
use serde_json::json as json_value;
use vigil_shared::rpc::{Consistency, QueryOptions, QueryResult, ReadQuery};

use super::error::ApiError;
use super::kv::unexpected;
use super::params::Params;
use super::{AppState, json, with_meta};

/// `GET /v1/vigil/sequencer?key=K&lock-index=N&session=S` → `{"Valid":true}` while S holds K at
/// LockIndex N, else `{"Valid":false,"Reason":…}`. Always a read-index (linearizable) read.
pub async fn sequencer(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> Result<Response, ApiError> {
    let params = Params::parse(uri.query());
    let key = params
        .get("key")
        .filter(|k| !k.is_empty())
        .ok_or_else(|| ApiError::bad_request("Missing key"))?;
    let session = params
        .get("session")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_request("Missing session"))?;
    let lock_index = params
        .u64("lock-index")?
        .ok_or_else(|| ApiError::bad_request("Missing lock-index"))?;
    let opts = QueryOptions {
        consistency: Consistency::Consistent,
        ..QueryOptions::default()
    };
    let query = ReadQuery::Sequencer {
        key: key.to_owned(),
        lock_index,
        session: session.to_owned(),
    };
    let (result, meta) = state.backend.query(opts, query).await?;
    let body = match result {
        QueryResult::Sequencer(Ok(())) => json_value!({ "Valid": true }),
        QueryResult::Sequencer(Err(reason)) => json_value!({ "Valid": false, "Reason": reason }),
        other => return Err(unexpected(other)),
    };
    Ok(with_meta(meta, json(&params, &body)))
}
