//! brig's own REST API (`/v1/...`, docs/API.md): one module per resource, each a
//! set of handlers that parse, call the engine and encode.
pub mod audit;
pub mod exec;
pub mod files;
pub mod interpreter;
pub mod metrics;
pub mod processes;
pub mod sessions;
pub mod snapshots;
pub mod tenants;
pub mod volumes;
