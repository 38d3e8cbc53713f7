//! The request metrics every route is counted in (`brig_http_requests_total`,
//! `brig_http_request_duration_seconds`; the engine's `metrics` keeps the names).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

/// Middleware: counts and times every request by its route template (never the raw
/// path, which would make a label per id).
pub async fn track_requests(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    brig_engine::metrics::http_request(
        route,
        method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The `method` label: the methods HTTP defines, or `other`. A client may send any
/// token as a method, and a label per token would grow the registry (and every
/// scrape) without bound.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}
