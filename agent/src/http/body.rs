//! Request bodies, read within a limit. The declared `Content-Length` is checked before a byte
//! of the body is read, and the body is counted while it streams in, so a chunked body is cut
//! off at the limit: a handler never holds more than the limit of any body. Every route that
//! reads a body reads it here ([`RequestBody`], or [`read`] for KV and txn, which check their
//! parameters first, as Consul does).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use bytes::BytesMut;
use http_body_util::BodyExt as _;
use vigil_shared::{KV_MAX_VALUE_SIZE, TXN_MAX_REQ_LEN};

use super::error::ApiError;
use super::limits;

/// A body over its limit but no longer than this is read to its end and thrown away before the
/// 413 goes out, so a client that sent a little too much reads the answer on a connection that
/// stays usable. A longer one is answered at once and the connection closed (the client may
/// then see a reset instead of the 413, as with Consul).
const DRAIN_MAX: usize = 1024 * 1024;
/// How long that draining may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Which limit applies, and with it which of Consul's 413 texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A KV value (`kv_max_value_size`).
    KvValue,
    /// A transaction (`txn_max_req_len`).
    Txn,
    /// Every other body.
    Other,
}

impl Limit {
    pub fn max(self) -> usize {
        match self {
            Limit::KvValue => KV_MAX_VALUE_SIZE,
            Limit::Txn => TXN_MAX_REQ_LEN,
            Limit::Other => limits::BODY_MAX,
        }
    }

    /// Consul's 413 text: with the declared length when there was one, pointing at the setting
    /// that raises the limit where Consul has one.
    fn too_large(self, declared: Option<u64>) -> ApiError {
        let max = self.max();
        let setting = match self {
            Limit::KvValue => Some("kv_max_value_size"),
            Limit::Txn => Some("txn_max_req_len"),
            Limit::Other => None,
        };
        ApiError::too_large(match (declared, setting) {
            (Some(n), Some(setting)) => format!(
                "Request body({n} bytes) too large, max size: {max} bytes. See https://developer.hashicorp.com/docs/agent/config/config-files#{setting}."
            ),
            (Some(n), None) => format!("Request body({n} bytes) too large, max size: {max} bytes"),
            (None, _) => format!("Request body too large, max size: {max} bytes"),
        })
    }
}

/// The body's declared length; `None` when absent (chunked) or unreadable.
fn declared_len(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Reads the whole body if it fits `limit`; a larger one is refused with Consul's 413.
pub async fn read(headers: &HeaderMap, body: Body, limit: Limit) -> Result<Bytes, ApiError> {
    let max = limit.max();
    let declared = declared_len(headers);
    if let Some(n) = declared.filter(|n| *n > max as u64) {
        if n <= DRAIN_MAX as u64 {
            drain(body, 0).await;
        }
        return Err(limit.too_large(Some(n)));
    }
    let capacity = declared.map_or(0, |n| n as usize);
    let mut buf = BytesMut::with_capacity(capacity);
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("Failed to read body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > max {
            drain(body, buf.len() + data.len()).await;
            return Err(limit.too_large(declared));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// Reads and drops the rest of a body, up to [`DRAIN_MAX`] bytes in all and [`DRAIN_TIMEOUT`].
async fn drain(mut body: Body, mut seen: usize) {
    let rest = async {
        while seen <= DRAIN_MAX {
            match body.frame().await {
                Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len()),
                Some(Err(_)) | None => return,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, rest).await;
}

/// A request body within [`Limit::Other`], and, when it is JSON, within the shape limits of
/// [`limits::json_shape`].
pub struct RequestBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RequestBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<RequestBody, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = read(&parts.headers, body, Limit::Other).await?;
        limits::json_shape(&bytes)?;
        Ok(RequestBody(bytes))
    }
}
