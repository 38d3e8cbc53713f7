//! What every front end's handlers share: the error they answer with, and the
//! extractors that turn a request into the engine's typed input (the caller, JSON,
//! path and query) with bad input answered in the API's error shape.
//!
//! A handler parses, calls one engine verb and encodes; it returns
//! [`HttpResult`], so an engine error (`brig_engine::fault::Error`) becomes the
//! documented status and `{"error": {code, message}}` body by `?` alone.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use brig_engine::auth::{Admin, Caller};
use brig_engine::fault::Error;
use brig_engine::state::AppState;

pub mod metrics;
pub mod refusals;
pub mod sse;

// The extractors of request bodies, paths and queries with the API's rejections.
pub use brig_engine::error::{ApiJson, ApiPath, ApiQuery};

/// An engine error on its way out as an HTTP response.
#[derive(Debug)]
pub struct HttpError(pub Error);

/// What a handler returns.
pub type HttpResult<T> = Result<T, HttpError>;

impl From<Error> for HttpError {
    fn from(error: Error) -> HttpError {
        HttpError(error)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// The authenticated caller of a request (401 without a valid key), tagged with
/// the front end whose routes it came in on.
#[derive(Clone, Debug)]
pub struct Authed(pub Caller);

impl FromRequestParts<AppState> for Authed {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> HttpResult<Authed> {
        Ok(Authed(Caller::from_request_parts(parts, state).await?))
    }
}

/// A caller that must be an administrator (401 without a key, 403 with a tenant
/// key), checked before the body is read.
#[derive(Clone, Debug)]
pub struct AdminCaller(pub Caller);

impl FromRequestParts<AppState> for AdminCaller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> HttpResult<AdminCaller> {
        let Admin(caller) = Admin::from_request_parts(parts, state).await?;
        Ok(AdminCaller(caller))
    }
}
