//! A session made for code, as onyx python-sandbox's `POST /v1/sessions` makes one:
//! in the image `/v1/execute` runs in (the daemon's `--default-image`), with uploaded
//! files placed in its working directory, and refused for what a run is refused for
//! (503 while that image is missing or being built, 404 for an unknown file, 422
//! for a path that leaves the working directory), before anything is made.

use crate::auth::Caller;
use crate::fault::Error as ApiError;
use crate::sessions::{self, CreateSession, FileRef, SessionInfo};
use crate::state::AppState;

pub async fn create(
    state: &AppState,
    caller: &Caller,
    ttl_seconds: u64,
    files: Vec<FileRef>,
) -> Result<SessionInfo, ApiError> {
    crate::execute::ready(state, caller, &files).await?;
    sessions::create_session(
        state,
        caller,
        CreateSession {
            image: crate::execute::default_image(state),
            files: (!files.is_empty()).then_some(files),
            ttl_seconds: Some(ttl_seconds),
            ..Default::default()
        },
    )
    .await
}
