//! The onyx code-interpreter routes (`/v1/execute`, `/v1/files`): handlers that
//! parse onyx's requests, call the engine and answer in onyx's shapes.

pub mod execute;
pub mod files;
