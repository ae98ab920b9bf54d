//! `PUT /v1/agent/reload` (re-read the config file's services and checks) and
//! `GET /v1/agent/monitor?loglevel=` (stream the agent's log), as Consul has them.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tokio::sync::broadcast::error::RecvError;

use vigil_shared::acl::authz::{Access, Resource};

use super::error::ApiError;
use super::{AppState, Ctx};
use crate::monitor::{parse_level, subscribe};

/// `PUT /v1/agent/reload`.
pub async fn reload(State(state): State<AppState>) -> Result<Response, ApiError> {
    state
        .reloader
        .reload(&state.local)
        .map_err(|e| ApiError::server(e.to_string()))?;
    Ok(StatusCode::OK.into_response())
}

/// `GET /v1/agent/monitor`: the agent's log lines at `loglevel` (default `info`) and above (as
/// JSON with `?logjson`), as they are written, until the client goes away or the agent stops. Only what the agent's own
/// `--log-level` lets through can be shown.
pub async fn monitor(cx: Ctx) -> Result<Response, ApiError> {
    cx.check(Resource::Agent, Access::Read, &cx.state.node_name)?;
    let name = cx.params.get("loglevel").unwrap_or("info");
    let level = parse_level(name)
        .ok_or_else(|| ApiError::bad_request(format!("Unknown log level: {name}")))?;
    // `?logjson`: each line as hclog's JSON object, as Consul's monitor sends it then.
    let as_json = cx.params.has("logjson");
    let shutdown = cx.state.shutdown.clone();
    let lines = futures::stream::unfold(subscribe(), move |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(line) if line.level <= level => {
                    let line = if as_json { &line.json } else { &line.text };
                    let text = Bytes::from(format!("{line}\n"));
                    return Some((Ok::<Bytes, Infallible>(text), rx));
                }
                // Below the level asked for, or missed by a monitor that fell behind.
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return None,
            }
        }
    })
    .take_until(async move { shutdown.cancelled().await });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(lines),
    )
        .into_response())
}
