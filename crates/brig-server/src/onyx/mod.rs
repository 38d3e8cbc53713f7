//! The onyx code-interpreter routes (`/health`'s shape, `/v1/execute`, `/v1/files`,
//! `/v1/sessions/{id}/bash`): handlers that parse onyx's requests, call the engine
//! and answer in onyx's shapes, errors included (`error`: FastAPI's `{"detail"}`).

pub mod bash;
pub mod error;
pub mod execute;
pub mod files;
