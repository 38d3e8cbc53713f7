//! The code interpreter's API (port 49999 of an E2B sandbox): `/execute` and the
//! contexts, served by brig's stateful interpreter.

use axum::Router;
use brig_engine::state::AppState;

/// The routes of port 49999.
pub fn router() -> Router<AppState> {
    Router::new()
}
