//! The onyx code-interpreter routes (`/v1/execute`, `/v1/files`,
//! `/v1/sessions/{id}/bash` beside brig's own; all of onyx's API under `/onyx`,
//! `mount`): handlers that parse onyx's requests, call the engine and answer in
//! onyx's shapes, errors included (`error`: FastAPI's `{"detail"}`).

pub mod bash;
pub mod error;
pub mod execute;
pub mod files;
pub mod mount;
pub mod sessions;
