//! Request bodies, read within a limit. The declared `Content-Length` is checked before a byte
//! of the body is read, and the body is counted while it streams in, so a chunked body is cut
//! off at the limit: a handler never holds more than the limit of any body. Every route that
//! reads a body reads it here ([`RequestBody`], or [`read`] for KV and txn, which check their
//! parameters first, as Consul does).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use bytes::BytesMut;
use http_body_util::BodyExt as _;
use vigil_shared::go::duration::format_go_duration;
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
/// How long a body may take to arrive once the request's headers have (the header timeout of
/// [`super::serve`] stops counting there), so a request cannot hold its connection forever by
/// never finishing its body.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Which limit applies, and with it which of Consul's 413 texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A KV value (`kv_max_value_size`).
    KvValue,
    /// A transaction (`txn_max_req_len`).
    Txn,
    /// A snapshot archive to restore (`PUT /v1/snapshot`): compressed, it is rarely larger
    /// than the state, which must fit one raft entry.
    Snapshot,
    /// Every other body.
    Other,
}

impl Limit {
    pub fn max(self) -> usize {
        match self {
            Limit::KvValue => KV_MAX_VALUE_SIZE,
            Limit::Txn => TXN_MAX_REQ_LEN,
            Limit::Snapshot => vigil_server::snapshot::MAX_ARCHIVE_BYTES,
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
            Limit::Snapshot | Limit::Other => None,
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
    read_within(headers, body, limit, BODY_TIMEOUT).await
}

async fn read_within(
    headers: &HeaderMap,
    body: Body,
    limit: Limit,
    within: Duration,
) -> Result<Bytes, ApiError> {
    let max = limit.max();
    let declared = declared_len(headers);
    if let Some(n) = declared.filter(|n| *n > max as u64) {
        if n <= DRAIN_MAX as u64 {
            drain(body, 0).await;
        }
        return Err(limit.too_large(Some(n)));
    }
    let capacity = declared.map_or(0, |n| n as usize);
    let collect = async move {
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
    };
    tokio::time::timeout(within, collect)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "Request body not received within {}",
                    format_go_duration(within)
                ),
            ))
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    fn headers(content_length: Option<u64>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(n) = content_length {
            headers.insert(header::CONTENT_LENGTH, n.into());
        }
        headers
    }

    /// A chunked body of `chunks` chunks of 64 KiB.
    fn chunked(chunks: usize) -> Body {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        Body::from_stream(stream::iter(
            (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
        ))
    }

    #[tokio::test]
    async fn bodies_within_the_limit_are_read_whole() {
        let body = read(&headers(None), chunked(8), Limit::KvValue).await;
        assert_eq!(body.map(|b| b.len()), Ok(512 * 1024));
        let body = read(&headers(Some(3)), Body::from("abc"), Limit::Other).await;
        assert_eq!(body, Ok(Bytes::from("abc")));
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_unread() {
        // A body that would never end: refused from its Content-Length alone.
        let never = Body::from_stream(stream::pending::<Result<Bytes, std::io::Error>>());
        let err = read(&headers(Some(1 << 30)), never, Limit::Txn)
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            err.message
                .starts_with("Request body(1073741824 bytes) too large")
        );
    }

    #[tokio::test]
    async fn a_chunked_body_is_cut_off_at_the_limit() {
        // 1 GiB of chunks, produced lazily: refused after the limit plus the drain allowance.
        let err = read(&headers(None), chunked(16 * 1024), Limit::Other)
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            err.message,
            "Request body too large, max size: 524288 bytes"
        );
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_times_out() {
        let never = Body::from_stream(stream::pending::<Result<Bytes, std::io::Error>>());
        let err = read_within(
            &headers(Some(10)),
            never,
            Limit::Other,
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
        assert_eq!(err.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(err.message, "Request body not received within 50ms");
    }
}
