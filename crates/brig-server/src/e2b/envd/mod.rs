//! envd, the in-sandbox daemon of E2B, answered by brig's daemon: the process and
//! filesystem services over Connect, `/files`, `/health`.

use axum::Router;
use brig_engine::state::AppState;

/// The routes of port 49983.
pub fn router() -> Router<AppState> {
    Router::new()
}
