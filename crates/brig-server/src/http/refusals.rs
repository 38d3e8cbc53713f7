//! Every error response leaves as the API's JSON error, is counted in
//! `brig_failures_total{code}`, and, when it refuses the client (a 4xx or a 503),
//! is audited under the caller's tenant.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{code_for_status, response_with_status, Error as ApiError, ErrorCode};
use brig_engine::audit::{self, MAX_RECORDED_METHOD, MAX_RECORDED_PATH};
use brig_engine::auth::CallerSlot;
use brig_engine::state::AppState;

/// Whether the refusal middleware records a response: the client's errors, and the
/// daemon's "not now" (503: a global cap, shutting down). A 500 is not a refusal:
/// it is logged with its cause instead.
pub fn is_refusal(status: StatusCode) -> bool {
    status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE
}

/// Middleware (outside the routes): makes every error response JSON, counts it in
/// `brig_failures_total{code}`, and audits refusals under the caller's tenant (the
/// caller extractor fills the [`CallerSlot`] it leaves in the request).
pub async fn refusals(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let slot = CallerSlot::default();
    request.extensions_mut().insert(slot.clone());
    // Cut now: the request is gone once answered, and only a cut copy is recorded.
    let method = audit::bounded(request.method().as_str(), MAX_RECORDED_METHOD).into_owned();
    let path = audit::bounded(request.uri().path(), MAX_RECORDED_PATH).into_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let response = ensure_json_error(response).await;
    let code = response
        .extensions()
        .get::<ErrorCode>()
        .copied()
        .unwrap_or_else(|| code_for_status(status))
        .as_str();
    brig_engine::metrics::failure(code);
    if is_refusal(status) {
        audit::record_refusal(&state, slot.0.get(), &method, &path, status.as_u16(), code).await;
    }
    response
}

/// Rewrites an error response that did not come from `ApiError` (an axum rejection
/// in a handler that used a plain extractor) into the API's JSON error shape.
async fn ensure_json_error(response: Response) -> Response {
    if response.extensions().get::<ErrorCode>().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let text = axum::body::to_bytes(body, 4096)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let mut rewritten = response_with_status(status, ApiError::new(code_for_status(status), text));
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().append(name, value.clone());
        }
    }
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_engine::audit::REFUSAL_CODES;

    #[test]
    fn refusal_codes_are_those_of_4xx_and_503_answers_only() {
        for status in 400..=599u16 {
            let status = StatusCode::from_u16(status).unwrap();
            let code = code_for_status(status).as_str();
            assert_eq!(
                REFUSAL_CODES.contains(&code),
                is_refusal(status),
                "{status}: {code}"
            );
        }
        use brig_engine::rootfs::RootfsError as E;
        let s = String::new;
        for e in [
            E::NotFound(s()),
            E::NotADirectory(s()),
            E::NotAFile(s()),
            E::AlreadyExists(s()),
            E::NotEmpty(s()),
            E::InvalidPath(s()),
            E::Escapes(s()),
            E::Busy(s()),
            E::PermissionDenied(s()),
            E::TooLarge(s()),
            E::ReadOnly(s()),
            E::NoSpace(s()),
            E::InvalidArchive(s()),
        ] {
            let refused = is_refusal(crate::error::status_of(e.code()));
            let code = e.code().as_str();
            assert_eq!(REFUSAL_CODES.contains(&code), refused, "{code}");
        }
        // Every code the daemon answers with, not only those a bare status maps to.
        for &code in crate::error::ErrorCode::ALL {
            let refused = is_refusal(crate::error::status_of(code));
            assert_eq!(REFUSAL_CODES.contains(&code.as_str()), refused, "{code}");
        }
        assert!(REFUSAL_CODES.iter().all(|c| crate::error::ErrorCode::ALL
            .iter()
            .any(|k| k.as_str() == *c)));
        // What ran is never a refusal.
        for ran in ["ok", "error", "internal", "timeout", "oom", "client_closed"] {
            assert!(!REFUSAL_CODES.contains(&ran), "{ran}");
        }
    }
}
