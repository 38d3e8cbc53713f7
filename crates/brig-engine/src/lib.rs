//! brig's session engine: the daemon's domain (sessions, exec, files, snapshots,
//! volumes, tenants, audit), called by every front end (`brig-server`'s REST and
//! onyx routes today; E2B and MCP next). Every verb takes a `Caller` (tenant, key,
//! front end) and typed input, returns typed output or a [`fault::Error`] with a
//! stable code, and writes its own audit event. Nothing here knows HTTP, OpenAPI or
//! the CLI (`tests/architecture.rs` holds it so).
//!
//! | module | concern |
//! |---|---|
//! | `boot` | starting the engine, in order, and its background work |
//! | `config` | the daemon's settings (parsed from `brig serve`'s flags by the server) |
//! | `catalog` | the engine's state behind one trait, all the verbs see of it |
//! | `db` | the catalog in SQLite (WAL), and the row types |
//! | `fault` | the domain error: a stable code and a one-line message, no HTTP |
//! | `auth` | API keys, tenants, callers, quotas |
//! | `backend` | the kinds of sandbox: what the engine asks of one (namespaces now) |
//! | `audit` | recording and querying the audit log |
//! | `egress` | sessions' network policies, tenants' bounds, each session's proxy |
//! | `metrics` | Prometheus metrics |
//! | `filestore` | the tenants' stored files and their expiry |
//! | `rootfs` | files inside a sandbox's root, resolved as with RESOLVE_IN_ROOT |
//! | `sessions` | live sandboxes: create, exec, processes, pause, snapshots, re-attach |
//! | `volumes` | per-tenant persistent disks mounted at `/volume` |
//! | `execute` | one-shot Python execution (onyx's code interpreter) |
//! | `interpreter` | stateful Python: contexts, each a kernel inside its session's sandbox |
//!
//! The daemon is multi-threaded (tokio) and never forks: sandboxes are started by
//! re-executing the brig binary in a hidden helper mode (see `backend::namespaces::launch`).

pub mod audit;
pub mod auth;
pub mod backend;
pub mod boot;
pub mod catalog;
pub mod config;
pub mod db;
pub mod default_image;
pub mod egress;
pub mod execute;
pub mod execute_session;
pub mod fault;
pub mod filestore;
pub mod interpreter;
pub mod metrics;
pub mod rootfs;
pub mod secrets;
pub mod sessions;
pub mod state;
pub mod volumes;

pub use config::Config;

#[cfg(test)]
mod tests;

/// Threads the daemon's runtime may start for blocking work (file operations,
/// SQLite, sandbox launches); whoever builds the daemon's runtime gives it
/// this many (tokio's default, made explicit because caps depend on it).
pub const BLOCKING_THREADS: usize = 512;

/// `value` of flag `flag`, held to `1/divisor` of the open-file limit (a warning
/// says so when it is): connections and background processes hold descriptors for
/// as long as they last, and must leave the rest to sandboxes, execs and files.
pub fn held_to_open_files(value: usize, divisor: u64, flag: &str) -> usize {
    let files = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let cap = value.min(usize::try_from(files / divisor).unwrap_or(usize::MAX));
    if cap < value {
        tracing::warn!(
            flag,
            value,
            open_files = files,
            cap,
            "held to a share of the open-file limit"
        );
    }
    cap.max(1)
}
