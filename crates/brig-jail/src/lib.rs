//! How the Linux kernel enforces a brig sandbox.
//!
//! One module per kernel concern; [`run`] ties them together. Every `unsafe` block
//! of brig lives in this crate, each with a SAFETY comment.
//!
//! | module | concern |
//! |---|---|
//! | `supervisor` | the parent side: clone, id maps, cgroup, timeout, signals, cleanup |
//! | `init` | the sandbox side: setup stages, then PID 1 (reaper, signal forwarding) |
//! | `ids` | host uid/gid leases for concurrent sandboxes |
//! | `fsplan` / `mounts` | the root filesystem as data / executing it and pivot_root |
//! | `cgroup` | cgroup v1, v2 and hybrid hosts |
//! | `caps`, `rlimits`, `landlock`, `seccomp`, `net` | one kernel mechanism each |

pub mod caps;
pub mod cgroup;
mod error;
pub mod fsplan;
mod idmap;
pub mod ids;
mod init;
pub mod landlock;
pub mod loopdev;
mod mounts;
mod net;
mod proto;
pub mod report;
pub mod rlimits;
pub mod seccomp;
mod supervisor;
mod sys;

pub use error::{Context, JailError};
pub use report::{Enforced, Outcome};
pub use supervisor::{run, HostConfig, Stdio};

/// What a run of `spec` creates or mounts over in its root (see
/// [`fsplan::FsPlan::placeholders`]).
pub fn placeholders(spec: &brig_policy::SandboxSpec) -> Result<Vec<String>, JailError> {
    Ok(fsplan::plan(spec, std::path::Path::new("/"))?.placeholders())
}
