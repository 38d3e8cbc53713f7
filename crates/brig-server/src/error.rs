//! How the daemon's errors leave over HTTP, and the extractors that turn bad input
//! into them.
//!
//! The error itself is the domain's (`crate::fault`): a stable code and a message.
//! This module alone decides each code's status ([`status_of`]). Every error leaves as `{"error": {"code": "<stable_code>", "message": "<one line>"}}`
//! (docs/API.md). Axum's own extractors answer with plain text, so handlers use the
//! wrappers here (`ApiJson`, `ApiQuery`, `ApiPath`), which map each rejection to the
//! documented status and code.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use utoipa::ToSchema;

pub use brig_engine::fault::{Error, ErrorCode};

/// An engine error on its way out as an HTTP response: what every handler's `?`
/// turns an engine error into.
#[derive(Debug)]
pub struct HttpError(pub Error);

/// What a handler returns.
pub type HttpResult<T> = Result<T, HttpError>;

impl From<Error> for HttpError {
    fn from(error: Error) -> HttpError {
        HttpError(error)
    }
}

/// The status each code is answered with: the one place the daemon maps its
/// errors to HTTP (docs/API.md lists the same pairs).
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden | ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound | ErrorCode::NoSuchFile => StatusCode::NOT_FOUND,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorCode::UriTooLong => StatusCode::URI_TOO_LONG,
        ErrorCode::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ErrorCode::Conflict
        | ErrorCode::Busy
        | ErrorCode::NotADirectory
        | ErrorCode::NotAFile
        | ErrorCode::AlreadyExists
        | ErrorCode::NotEmpty
        | ErrorCode::ReadOnly => StatusCode::CONFLICT,
        ErrorCode::Gone => StatusCode::GONE,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::Invalid
        | ErrorCode::InvalidPath
        | ErrorCode::PathEscapes
        | ErrorCode::InvalidArchive => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::Quota => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::NoSpace | ErrorCode::MemoryFull => StatusCode::INSUFFICIENT_STORAGE,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The code that goes with a status when nothing more specific is known: for error
/// responses that did not come from an `Error` (an axum rejection, a layer's
/// answer), which keep their own status.
pub fn code_for_status(status: StatusCode) -> ErrorCode {
    match status {
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::CONFLICT => ErrorCode::Conflict,
        StatusCode::GONE => ErrorCode::Gone,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::Invalid,
        StatusCode::TOO_MANY_REQUESTS => ErrorCode::Quota,
        StatusCode::SERVICE_UNAVAILABLE => ErrorCode::Unavailable,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
    }
}

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

/// `error` answered with `status` rather than its code's own: for rewriting error
/// responses that did not come from an `Error`, whose status is already decided.
/// The code goes into the response's extensions, so middleware (refusal audit,
/// metrics) learns it without parsing the body.
pub fn response_with_status(status: StatusCode, error: Error) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: error.code.as_str().to_string(),
            message: error.message,
        },
    };
    let mut response = (status, axum::Json(body)).into_response();
    response.extensions_mut().insert(error.code);
    response
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        response_with_status(status_of(self.0.code), self.0)
    }
}

/// 404 for any route that does not exist.
pub async fn not_found_fallback() -> HttpError {
    HttpError(Error::not_found("no such route"))
}

/// 405 for a known route called with the wrong method.
pub async fn method_not_allowed_fallback() -> HttpError {
    HttpError(Error::new(
        ErrorCode::MethodNotAllowed,
        "method not allowed for this route",
    ))
}

fn json_rejection(rejection: JsonRejection) -> Error {
    match rejection {
        // Well-formed JSON that does not fit the request type: unknown field
        // (`deny_unknown_fields`), wrong type, missing field.
        JsonRejection::JsonDataError(e) => Error::invalid(e.body_text()),
        JsonRejection::JsonSyntaxError(e) => Error::bad_request(e.body_text()),
        JsonRejection::MissingJsonContentType(_) => {
            Error::bad_request("expected a JSON body with Content-Type: application/json")
        }
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Error::too_large("request body is over the daemon's limit (--max-body)")
        }
        other => Error::bad_request(other.body_text()),
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
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(HttpError(json_rejection(rejection))),
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
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => {
                Err(Error::bad_request(e.body_text()).into())
            }
            Err(other) => Err(Error::bad_request(other.body_text()).into()),
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
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(e @ PathRejection::MissingPathParams(_)) => {
                Err(Error::internal(e.body_text()).into())
            }
            Err(other) => Err(Error::bad_request(other.body_text()).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code with the status it has always been answered with: a change here
    /// is a change of the API (docs/API.md), not a refactoring.
    const STATUSES: &[(ErrorCode, &str, u16)] = &[
        (ErrorCode::BadRequest, "bad_request", 400),
        (ErrorCode::Unauthorized, "unauthorized", 401),
        (ErrorCode::Forbidden, "forbidden", 403),
        (ErrorCode::PermissionDenied, "permission_denied", 403),
        (ErrorCode::NotFound, "not_found", 404),
        (ErrorCode::NoSuchFile, "no_such_file", 404),
        (ErrorCode::MethodNotAllowed, "method_not_allowed", 405),
        (ErrorCode::RequestTimeout, "request_timeout", 408),
        (ErrorCode::UriTooLong, "uri_too_long", 414),
        (ErrorCode::HeadersTooLarge, "headers_too_large", 431),
        (ErrorCode::Conflict, "conflict", 409),
        (ErrorCode::Busy, "busy", 409),
        (ErrorCode::NotADirectory, "not_a_directory", 409),
        (ErrorCode::NotAFile, "not_a_file", 409),
        (ErrorCode::AlreadyExists, "already_exists", 409),
        (ErrorCode::NotEmpty, "not_empty", 409),
        (ErrorCode::ReadOnly, "read_only", 409),
        (ErrorCode::Gone, "gone", 410),
        (ErrorCode::PayloadTooLarge, "payload_too_large", 413),
        (ErrorCode::Invalid, "invalid_request", 422),
        (ErrorCode::InvalidPath, "invalid_path", 422),
        (ErrorCode::PathEscapes, "path_escapes", 422),
        (ErrorCode::InvalidArchive, "invalid_archive", 422),
        (ErrorCode::Quota, "quota_exceeded", 429),
        (ErrorCode::Internal, "internal", 500),
        (ErrorCode::Unavailable, "unavailable", 503),
        (ErrorCode::NoSpace, "no_space", 507),
        (ErrorCode::MemoryFull, "memory_full", 507),
    ];

    #[test]
    fn every_code_has_its_status() {
        for &(code, text, status) in STATUSES {
            assert_eq!(code.as_str(), text);
            assert_eq!(status_of(code).as_u16(), status, "{text}");
        }
        for code in ErrorCode::ALL {
            assert!(
                STATUSES.iter().any(|(c, _, _)| c == code),
                "{code} is not in the table"
            );
        }
        assert_eq!(STATUSES.len(), ErrorCode::ALL.len());
    }

    /// Failures are what HTTP calls server errors; the audit of uploads relies on it.
    #[test]
    fn failures_are_server_errors() {
        for &code in ErrorCode::ALL {
            assert_eq!(
                code.is_failure(),
                status_of(code).is_server_error(),
                "{code}"
            );
        }
    }

    #[test]
    fn codes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
        }
    }

    #[tokio::test]
    async fn response_shape() {
        let response = HttpError(Error::quota("too many sessions")).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response.extensions().get::<ErrorCode>().map(|c| c.as_str()),
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
    fn internal_is_a_500() {
        let e = Error::internal("open /secret/path: permission denied");
        assert_eq!(status_of(e.code), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn codes_for_statuses() {
        for (status, code) in [
            (StatusCode::NOT_FOUND, "not_found"),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            (StatusCode::BAD_REQUEST, "bad_request"),
            (StatusCode::BAD_GATEWAY, "internal"),
        ] {
            assert_eq!(code_for_status(status).as_str(), code);
        }
    }
}
