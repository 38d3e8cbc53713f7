//! Transitional: what the engine's remaining HTTP handlers need while they wait to
//! move to brig-server, which has the real versions (the caller extractor is
//! `brig_server::http::Authed`). Deleted with the last of those handlers.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde::Serialize;

use crate::auth::{Caller, CallerSlot, Frontend, Permit};
use crate::error::ApiError;
use crate::state::AppState;

/// The caller of a handler still in the engine: what `brig_server::http::Authed`
/// does, the same way (so the refusal audit and the front-end tag see no
/// difference), with the caller kept in the request for either to find.
impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        let mut caller = state
            .auth
            .authenticate(presented_key(&parts.headers)?)
            .await?;
        if let Some(frontend) = parts.extensions.get::<Frontend>() {
            caller.frontend = *frontend;
        }
        if let Some(slot) = parts.extensions.get::<CallerSlot>() {
            let _ = slot.0.set(caller.clone());
        }
        parts.extensions.insert(caller.clone());
        Ok(caller)
    }
}

/// The key from `Authorization: Bearer <key>` or `X-API-Key: <key>`.
fn presented_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let text = value
            .to_str()
            .map_err(|_| ApiError::unauthorized("unreadable Authorization header"))?;
        let (scheme, token) = text.trim().split_once(' ').unwrap_or((text, ""));
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(ApiError::unauthorized(
                "use Authorization: Bearer <key> or X-API-Key: <key>",
            ));
        }
        return Ok(Some(token.trim()));
    }
    if let Some(value) = headers.get("x-api-key") {
        let text = value
            .to_str()
            .map_err(|_| ApiError::unauthorized("unreadable X-API-Key header"))?;
        return Ok(Some(text.trim()));
    }
    Ok(None)
}

/// `answer` as a JSON response whose body holds `permit` until the client has
/// (nearly) all of it, or its connection is gone: a large answer a client reads
/// slowly then counts against the caps the permit counts in.
pub fn json_holding<T: Serialize>(answer: &T, permit: Permit) -> axum::response::Response {
    match serde_json::to_vec(answer) {
        Ok(json) => bytes_holding("application/json", json.into(), permit),
        Err(e) => ApiError::internal(e).into_response(),
    }
}

/// `bytes` as a response whose body holds `permit`, as [`json_holding`].
pub fn bytes_holding(
    content_type: &'static str,
    bytes: axum::body::Bytes,
    permit: Permit,
) -> axum::response::Response {
    // An answer of one piece goes to hyper's buffer whole anyway: plainly, as any.
    let body = if bytes.len() <= HOLDING_PIECE {
        axum::body::Body::from(bytes)
    } else {
        axum::body::Body::new(Holding {
            rest: bytes,
            _permit: permit,
        })
    };
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

/// What [`Holding`] gives hyper at a time.
const HOLDING_PIECE: usize = 64 << 10;

/// A body given to hyper a piece at a time: it takes the next piece only when it
/// has written out most of the last, so the body (and the permit it holds) lives
/// until the client has read nearly all of it. Given whole, it would be dropped at
/// once.
struct Holding {
    rest: axum::body::Bytes,
    _permit: Permit,
}

impl http_body::Body for Holding {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.rest.is_empty() {
            return std::task::Poll::Ready(None);
        }
        let n = self.rest.len().min(HOLDING_PIECE);
        let piece = self.rest.split_to(n);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.rest.len() as u64)
    }
}
