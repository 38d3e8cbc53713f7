//! E2B's control plane: sandboxes created, listed, connected to, paused, resumed,
//! timed out and killed with an API key (brig's keys).

use axum::Router;
use brig_engine::state::AppState;

/// The control plane's routes.
pub fn routes() -> Router<AppState> {
    Router::new()
}
