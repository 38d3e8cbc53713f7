//! `/mcp`: MCP over streamable HTTP (rmcp's server transport), behind the REST
//! API's keys. Each MCP session (its `Mcp-Session-Id`) has a server of its own
//! and so a sandbox of its own; the sandbox is deleted when the session ends: the
//! client's `DELETE`, or the session's idle expiry (`--mcp-idle-timeout`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::{Extension, Router};
use brig_engine::auth::Frontend;
use brig_engine::state::AppState;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::{Brig, EngineWorkspace};
use crate::http::Authed;

/// The `/mcp` routes: every request needs a key (401 otherwise), as the REST API's.
pub fn routes(state: &AppState) -> Router<AppState> {
    let shutdown = CancellationToken::new();
    {
        let (state, shutdown) = (state.clone(), shutdown.clone());
        tokio::spawn(async move {
            state.shutdown_requested().await;
            shutdown.cancel();
        });
    }
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive =
        Some(Duration::from_millis(state.args.mcp_idle_timeout_ms));
    let config = StreamableHttpServerConfig::default()
        // Keys guard this route; under --no-auth the daemon's own check holds
        // requests to loopback names (see `server::loopback_only`).
        .disable_allowed_hosts()
        .with_max_request_body_bytes(
            usize::try_from(state.args.max_body_bytes).unwrap_or(usize::MAX),
        )
        .with_cancellation_token(shutdown);
    let engine = state.clone();
    let service = StreamableHttpService::new(
        move || Ok(Brig::new(EngineWorkspace::new(engine.clone(), None))),
        Arc::new(sessions),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
        .layer(from_fn_with_state(state.clone(), authenticate))
        .layer(Extension(Frontend::Mcp))
}

/// Refuses a request without a valid key before rmcp sees it; the caller it
/// stands for rides in the request's extensions to the tools (see `Brig::call_tool`).
async fn authenticate(
    State(_): State<AppState>,
    _caller: Authed,
    request: Request,
    next: Next,
) -> Response {
    next.run(request).await
}
