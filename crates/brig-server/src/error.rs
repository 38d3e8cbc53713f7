//! The API's error type and the extractors that turn bad input into it.
//!
//! Every error leaves as `{"error": {"code": "<stable_code>", "message": "<one line>"}}`
//! (docs/API.md). Axum's own extractors answer with plain text, so handlers use the
//! wrappers here (`ApiJson`, `ApiQuery`, `ApiPath`), which map each rejection to the
//! documented status and code.

use std::fmt;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use utoipa::ToSchema;

/// An error answered to the client. `code` is stable (clients match on it);
/// `message` is one line for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// Put into the extensions of every error response, so middleware (refusal audit,
/// metrics) learns the code without parsing the body.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

/// The JSON body of an error.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `not_found`.
    pub code: String,
    /// One line for humans.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        let mut message = message.into();
        // The contract promises one line; serde and io messages occasionally carry more.
        if message.contains('\n') {
            message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        ApiError {
            status,
            code,
            message,
        }
    }

    /// 400: malformed JSON, bad query string, unreadable body.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401: missing or unknown API key.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 403: an admin-only endpoint called with a tenant key.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404: unknown id, or an id owned by another tenant (never 403: ids do not leak).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 404 `no_such_file`: a path that does not exist inside a session.
    pub fn no_such_file(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "no_such_file", message)
    }

    /// 409: name taken, session paused, directory not empty...
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 413: body or upload over its limit.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    /// 422: well-formed input with unknown fields, wrong types, bad values, bad paths.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    /// 429: a per-tenant quota (sessions, concurrent execs, disk).
    pub fn quota(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
    }

    /// 503: a global cap, or the daemon is shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// 500: logs `detail` (which may name host paths or internals) and answers a
    /// generic message, so nothing about the host leaks to the client.
    pub fn internal(detail: impl fmt::Display) -> ApiError {
        tracing::error!(error = %detail, "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the daemon's log",
        )
    }

    /// The code that goes with a status when nothing more specific is known
    /// (used to rewrite error responses that did not come from `ApiError`).
    pub fn code_for_status(status: StatusCode) -> &'static str {
        match status {
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::CONFLICT => "conflict",
            StatusCode::GONE => "gone",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid_request",
            StatusCode::TOO_MANY_REQUESTS => "quota_exceeded",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            s if s.is_server_error() => "internal",
            _ => "bad_request",
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code,
            self.status.as_u16(),
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        response.extensions_mut().insert(ErrorCode(self.code));
        response
    }
}

/// Database failures are host failures: logged, answered as 500.
impl From<rusqlite::Error> for ApiError {
    fn from(err: rusqlite::Error) -> ApiError {
        ApiError::internal(format_args!("database: {err}"))
    }
}

/// Unexpected I/O failures are host failures: logged, answered as 500. Handlers that
/// expect a particular io error (not found, too large) map it before `?`.
impl From<std::io::Error> for ApiError {
    fn from(err: std::io::Error) -> ApiError {
        ApiError::internal(format_args!("i/o: {err}"))
    }
}

/// 404 for any route that does not exist.
pub async fn not_found_fallback() -> ApiError {
    ApiError::not_found("no such route")
}

/// 405 for a known route called with the wrong method.
pub async fn method_not_allowed_fallback() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed for this route",
    )
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        // Well-formed JSON that does not fit the request type: unknown field
        // (`deny_unknown_fields`), wrong type, missing field.
        JsonRejection::JsonDataError(e) => ApiError::invalid(e.body_text()),
        JsonRejection::JsonSyntaxError(e) => ApiError::bad_request(e.body_text()),
        JsonRejection::MissingJsonContentType(_) => {
            ApiError::bad_request("expected a JSON body with Content-Type: application/json")
        }
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::too_large("request body is over the daemon's limit (--max-body)")
        }
        other => ApiError::bad_request(other.body_text()),
    }
}

/// `axum::Json` with the API's error mapping: syntax errors and a wrong content type
/// are 400, data errors 422, a body over `--max-body` 413. Also a response type.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Query` with bad query strings answered as 400 `bad_request`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => {
                Err(ApiError::bad_request(e.body_text()))
            }
            Err(other) => Err(ApiError::bad_request(other.body_text())),
        }
    }
}

/// `axum::extract::Path` with bad path parameters answered as 400 `bad_request`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(e @ PathRejection::MissingPathParams(_)) => Err(ApiError::internal(e.body_text())),
            Err(other) => Err(ApiError::bad_request(other.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line() {
        let e = ApiError::invalid("a\nb\r\n  c");
        assert_eq!(e.message, "a b c");
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.code, "invalid_request");
    }

    #[test]
    fn internal_hides_the_detail() {
        let e = ApiError::internal("open /secret/path: permission denied");
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.message.contains("/secret"));
    }

    #[tokio::test]
    async fn response_shape() {
        let response = ApiError::quota("too many sessions").into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response.extensions().get::<ErrorCode>().map(|c| c.0),
            Some("quota_exceeded")
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"error": {"code": "quota_exceeded", "message": "too many sessions"}})
        );
    }

    #[test]
    fn status_codes() {
        for (status, code) in [
            (StatusCode::NOT_FOUND, "not_found"),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            (StatusCode::BAD_REQUEST, "bad_request"),
            (StatusCode::BAD_GATEWAY, "internal"),
        ] {
            assert_eq!(ApiError::code_for_status(status), code);
        }
    }
}
