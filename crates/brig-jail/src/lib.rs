//! How the Linux kernel enforces a brig sandbox.
//!
//! One module per kernel concern; [`run`] ties them together. Every `unsafe` block
//! of brig lives in this crate and in `brig-sys` (the kernel calls it shares with
//! the image crate), each with a SAFETY comment.
//!
//! | module | concern |
//! |---|---|
//! | `supervisor` | the parent side: clone, id maps, cgroup, timeout, signals, cleanup |
//! | `init` | the sandbox side: setup stages, then PID 1 (reaper, signal forwarding) |
//! | `agent` | a session's init serving exec requests, and the daemon's client for it |
//! | `session` | a session's sandbox from the host: re-attach, pause, destroy |
//! | `ids` | host uid/gid leases for concurrent sandboxes |
//! | `watchdog` | cleans up the cgroup of a brig that died (shares brig's memory) |
//! | `fsplan` / `mounts` | the root filesystem as data / executing it and pivot_root |
//! | `etccache` | the synthesized /etc, written once on the host and bound read-only |
//! | `cgroup` | cgroup v1, v2 and hybrid hosts |
//! | `caps`, `rlimits`, `landlock`, `seccomp`, `net` | one kernel mechanism each |

pub mod agent;
pub mod caps;
pub mod cgroup;
mod copier;
pub mod disk;
mod error;
mod etccache;
pub mod fsplan;
mod idmap;
pub mod ids;
mod init;
pub mod landlock;
pub mod locks;
mod mounts;
pub mod net;
mod oom;
mod proto;
pub mod report;
pub mod rlimits;
pub mod seccomp;
mod seed;
pub mod session;
mod supervisor;
mod sys;
pub mod watchdog;
pub mod zygote;

pub use brig_sys::process::die_with_parent;
pub use brig_sys::{loopdev, resolve, sparse};
pub use error::{Context, JailError};
pub use net::EgressSetup;
pub use report::{Enforced, Outcome};
pub use supervisor::{
    run, run_with_egress, start_session, HostConfig, SessionControl, Stdio, ETC_CACHE_DIR,
};

/// What a run of `spec` creates or mounts over in its root (see
/// [`fsplan::FsPlan::placeholders`]).
pub fn placeholders(spec: &brig_policy::SandboxSpec) -> Result<Vec<String>, JailError> {
    Ok(fsplan::plan(spec, std::path::Path::new("/"))?.placeholders())
}
