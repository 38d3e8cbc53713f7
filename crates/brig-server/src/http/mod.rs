//! What every front end's handlers share: the error they answer with, and the
//! extractors that turn a request into the engine's typed input (the caller, JSON,
//! path and query) with bad input answered in the API's error shape.
//!
//! A handler parses, calls one engine verb and encodes; it returns
//! [`HttpResult`], so an engine error (`brig_engine::fault::Error`) becomes the
//! documented status and `{"error": {code, message}}` body by `?` alone.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};

use brig_engine::auth::{Caller, CallerSlot, Frontend};
use brig_engine::fault::Error;
use brig_engine::state::AppState;

mod holding;
pub mod metrics;
pub mod refusals;
pub mod sse;

// The error and the extractors of request bodies, paths and queries with the
// API's rejections.
pub use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError, HttpResult};
// Answers that hold a permit until the client has read them.
pub use holding::{bytes_holding, json_holding};

/// The authenticated caller of a request (401 without a valid key), tagged with
/// the front end whose routes it came in on.
#[derive(Clone, Debug)]
pub struct Authed(pub Caller);

impl FromRequestParts<AppState> for Authed {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> HttpResult<Authed> {
        // A request is authenticated once, whichever extractors ask.
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(Authed(caller.clone()));
        }
        let key = presented_key(&parts.headers)?;
        let mut caller = state.auth.authenticate(key).await?;
        // The router tags each front end's routes (see `server::api_router`). On
        // brig's REST routes a client working for an MCP session (`brig mcp`
        // against a daemon) says so, and is audited as `mcp`: a label the key's
        // holder chooses among its own front ends, not a permission.
        if let Some(frontend) = parts.extensions.get::<Frontend>() {
            caller.frontend = *frontend;
        } else if parts
            .headers
            .get("x-brig-frontend")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"mcp"))
        {
            caller.frontend = Frontend::Mcp;
        }
        // So that the refusal audit records a refused request under its tenant.
        if let Some(slot) = parts.extensions.get::<CallerSlot>() {
            let _ = slot.0.set(caller.clone());
        }
        parts.extensions.insert(caller.clone());
        Ok(Authed(caller))
    }
}

/// The key from `Authorization: Bearer <key>` or `X-API-Key: <key>`.
pub(crate) fn presented_key(headers: &HeaderMap) -> Result<Option<&str>, Error> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let text = value
            .to_str()
            .map_err(|_| Error::unauthorized("unreadable Authorization header"))?;
        let (scheme, token) = text.trim().split_once(' ').unwrap_or((text, ""));
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(Error::unauthorized(
                "use Authorization: Bearer <key> or X-API-Key: <key>",
            ));
        }
        return Ok(Some(token.trim()));
    }
    if let Some(value) = headers.get("x-api-key") {
        let text = value
            .to_str()
            .map_err(|_| Error::unauthorized("unreadable X-API-Key header"))?;
        return Ok(Some(text.trim()));
    }
    Ok(None)
}

/// A caller that must be an administrator (401 without a key, 403 with a tenant
/// key), checked before the body is read.
#[derive(Clone, Debug)]
pub struct AdminCaller(pub Caller);

impl FromRequestParts<AppState> for AdminCaller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> HttpResult<AdminCaller> {
        let Authed(caller) = Authed::from_request_parts(parts, state).await?;
        caller.require_admin()?;
        Ok(AdminCaller(caller))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h).unwrap(), None);
        h.insert("x-api-key", "k1".parse().unwrap());
        assert_eq!(presented_key(&h).unwrap(), Some("k1"));
        h.insert("authorization", "bearer  k2 ".parse().unwrap());
        assert_eq!(presented_key(&h).unwrap(), Some("k2"));
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(presented_key(&h).unwrap_err().code.as_str(), "unauthorized");
        h.insert("authorization", "Bearer".parse().unwrap());
        assert_eq!(presented_key(&h).unwrap_err().code.as_str(), "unauthorized");
    }
}
