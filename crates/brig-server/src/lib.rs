//! brig's daemon (`brig serve`): the HTTP front ends over the session engine
//! (`brig-engine`). This crate parses requests, calls the engine and encodes its
//! answers; the domain lives in the engine.

pub use brig_engine::{
    audit, auth, backend, db, execute, fault, filestore, held_to_open_files, metrics, rootfs,
    sessions, state, volumes, BLOCKING_THREADS,
};
pub use config::ServeArgs;

pub mod config;
pub mod e2b;
pub mod error;
pub mod http;
pub mod hyper_refusals;
pub mod mcp;
pub mod onyx;
pub mod rest;
pub mod server;
