//! The one place errors become HTTP responses: plain-text bodies with Consul's messages, 400 for
//! bad input, 500 for what Consul's servers refuse and for our own faults
//! (docs/consul-compatibility.md#errors).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use vigil_shared::operator::{ArchiveError, OperatorError};
use vigil_shared::rpc::ServerError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// Consul's answer to every error that is not an explicit HTTP error: 500 with the text.
    /// Server-side validation failures (a bad TTL, an invalid session) are such errors, and
    /// real clients match on exactly that code and text.
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// Unwinds a handler whose blocking read the front layer waits for (`http::park`): the
    /// front layer drops this answer and runs the request again once the read is answered.
    pub fn parked() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "blocking query parked")
    }
}

impl ApiError {
    /// A response that could not be encoded (its JSON, a header): our fault, so 500.
    pub fn encoding(e: &impl std::fmt::Display) -> ApiError {
        ApiError::server(format!("encoding the response: {e}"))
    }
}

impl From<ServerError> for ApiError {
    fn from(e: ServerError) -> ApiError {
        let status = match &e {
            ServerError::SessionNotFound(_) => StatusCode::NOT_FOUND,
            ServerError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ServerError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ServerError::InvalidSessionTtl(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ServerError::TooManyBlockingQueries => StatusCode::TOO_MANY_REQUESTS,
            ServerError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            ServerError::NoLeader
            | ServerError::NotLeader { .. }
            | ServerError::NoServers
            | ServerError::Indeterminate(_)
            | ServerError::Unavailable(_)
            | ServerError::Membership(_)
            | ServerError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Operator refusals are Consul's RPC errors: 500 with the text.
impl From<OperatorError> for ApiError {
    fn from(e: OperatorError) -> ApiError {
        match e {
            OperatorError::Server(e) => e.into(),
            OperatorError::Archive(e @ ArchiveError::TooLarge { .. }) => {
                ApiError::too_large(e.to_string())
            }
            other => ApiError::server(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.message,
        )
            .into_response()
    }
}
