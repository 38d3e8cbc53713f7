//! `/onyx`: onyx python-sandbox's whole API, to the letter, for onyx's client
//! (`CODE_INTERPRETER_BASE_URL=http://<brig>/onyx`). Beside brig's own routes onyx
//! gets `/v1/execute`, `/v1/files` and `/v1/sessions/{id}/bash`; its `/health` and
//! `/v1/sessions` collide with brig's (brig's version, brig's session object), and
//! nothing in onyx's requests tells them apart from brig's clients', so they are
//! onyx's only here. Outside the OpenAPI document (it describes brig's API), as
//! the E2B and MCP front ends are.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Router};
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::state::AppState;
use serde::Serialize;

use crate::auth::Frontend;
use crate::config::Config;
use crate::onyx::error::{method_not_allowed, OnyxError};
use crate::server::ImageHealth;

/// The python-sandbox release whose API this is (onyx-dot-app/python-sandbox
/// 8950ead). onyx's client turns its session and bash tools on from 0.4.0; the API
/// has not changed since (0.4.1 to 0.4.4 changed the service, not its routes).
pub const ONYX_VERSION: &str = "0.4.4";

pub fn router(args: &Config) -> Router<AppState> {
    let (onyx, _) = crate::onyx::files::routes(args)
        .merge(crate::onyx::execute::routes())
        .merge(crate::onyx::bash::routes())
        .split_for_parts();
    onyx.route("/health", get(health))
        .route("/v1/sessions", post(crate::onyx::sessions::create))
        .route("/v1/sessions/{id}", delete(crate::onyx::sessions::delete))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(Frontend::Onyx))
}

/// onyx's `HealthResponse` (`status`, `message`, `version`), with brig's own
/// version and its default image's state beside.
#[derive(Debug, Serialize)]
pub struct Health {
    /// `ok`, or `error` (with `message`) while the default image cannot run code,
    /// as onyx's server reports an executor that is not operational.
    pub status: &'static str,
    pub message: Option<String>,
    pub version: &'static str,
    pub brig_version: &'static str,
    pub images: BTreeMap<String, ImageHealth>,
}

async fn health(State(state): State<AppState>) -> axum::Json<Health> {
    let (name, image) = crate::server::default_image_health(state).await;
    let message = match image.state.as_str() {
        "ready" => None,
        "building" => Some(format!(
            "the default image {name} is being built ({})",
            image.step.as_deref().unwrap_or("starting")
        )),
        _ => Some(format!(
            "the default image {name} is {}: {}",
            image.state,
            image
                .message
                .as_deref()
                .or(image.error.as_deref())
                .unwrap_or("see the daemon's log")
        )),
    };
    axum::Json(Health {
        status: if message.is_none() { "ok" } else { "error" },
        message,
        version: ONYX_VERSION,
        brig_version: env!("CARGO_PKG_VERSION"),
        images: [(name, image)].into(),
    })
}

/// FastAPI's 404 for a path it does not route.
async fn not_found() -> Response {
    OnyxError::from(Error::new(ErrorCode::NotFound, "Not Found")).into_response()
}
