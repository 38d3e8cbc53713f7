//! What the control plane's handlers share: its error (`{"code": <status>,
//! "message"}`, as E2B's API answers) and extractors whose rejections have that
//! shape too: the caller (an API key), JSON bodies, path segments.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use brig_engine::auth::{Caller, Frontend};
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::state::AppState;

use crate::http::{Authed, HttpError};

/// An engine error answered in E2B's shape.
#[derive(Debug)]
pub struct E2bError(pub Error);

pub type E2bResult<T> = Result<T, E2bError>;

impl From<Error> for E2bError {
    fn from(error: Error) -> E2bError {
        E2bError(error)
    }
}

/// The status E2B answers for what brig calls `code`: its API validates bodies
/// itself and answers 400 where brig says 422; the rest is brig's mapping.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::Invalid
        | ErrorCode::InvalidPath
        | ErrorCode::PathEscapes
        | ErrorCode::InvalidArchive => StatusCode::BAD_REQUEST,
        code => crate::error::status_of(code),
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let E2bError(error) = self;
        super::super::plain_error(
            status_of(error.code),
            error.code,
            error.message,
            serde_json::Value::Null,
        )
    }
}

/// The caller, from its brig API key (`X-API-KEY`, as the SDK sends it, or
/// `Authorization: Bearer`), audited as front end `e2b`.
#[derive(Clone, Debug)]
pub struct E2bCaller(pub Caller);

impl FromRequestParts<AppState> for E2bCaller {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> E2bResult<E2bCaller> {
        match Authed::from_request_parts(parts, state).await {
            Ok(Authed(caller)) => Ok(E2bCaller(Caller {
                frontend: Frontend::E2b,
                ..caller
            })),
            Err(HttpError(error)) => Err(E2bError(error)),
        }
    }
}

/// A JSON body. E2B's API ignores fields it does not know (newer SDKs send more);
/// an empty body is `{}`, so a body with only optional fields may be left out.
#[derive(Debug)]
pub struct E2bJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for E2bJson<T> {
    type Rejection = E2bError;

    async fn from_request(request: Request, state: &AppState) -> E2bResult<E2bJson<T>> {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let essence = v.split(';').next().unwrap_or("").trim();
                essence.eq_ignore_ascii_case("application/json")
                    || essence.to_ascii_lowercase().ends_with("+json")
            });
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Error::too_large("request body is over the daemon's limit (--max-body)")
            } else {
                Error::bad_request(e.body_text())
            }
        })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else if json == Some(false) {
            return Err(Error::bad_request(
                "expected a JSON body with Content-Type: application/json",
            )
            .into());
        } else {
            &bytes
        };
        serde_json::from_slice(text)
            .map(E2bJson)
            .map_err(|e| Error::bad_request(format!("request body: {e}")).into())
    }
}

/// A sandbox id (or another single path segment).
#[derive(Debug)]
pub struct E2bPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for E2bPath {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> E2bResult<E2bPath> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(id)| E2bPath(id))
            .map_err(|e| E2bError(Error::bad_request(e.body_text())))
    }
}

/// 404 for a path under E2B's routes that none of them serves.
pub async fn no_route() -> E2bError {
    E2bError(Error::not_found("no such route"))
}

/// 405 for one of E2B's routes called with a method it does not take.
pub async fn wrong_method() -> E2bError {
    E2bError(Error::new(
        ErrorCode::MethodNotAllowed,
        "method not allowed on this route",
    ))
}
