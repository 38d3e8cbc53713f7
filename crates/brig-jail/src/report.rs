//! What a run produced, and what isolation was really applied.
//!
//! Every field of [`Enforced`] is read back from the kernel or comes from a step that
//! succeeded; nothing is filled in from the request alone.

use serde::{Deserialize, Serialize};

use crate::caps::CapsReport;
use crate::landlock::LandlockReport;
use crate::rlimits::RlimitsReport;

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The command's exit status; None if it was killed by a signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// Processes were killed for holding more file (record) locks than the sandbox's
    /// budget (`Limits::file_lock_budget`).
    pub file_locks_exceeded: bool,
    /// Captured output (lossy UTF-8); empty when the sandbox used the caller's stdio.
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    pub cpu_time_ms: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    /// Why the command could not be started (e.g. not found), if so.
    pub error: Option<String>,
    /// When each stage of the run finished, in microseconds since brig began the
    /// run: where start-up time goes (see BENCHMARKS.md).
    pub timings_us: Vec<Timing>,
    /// What the sandbox wrote: its overlay's upper directory (an `O_PATH`
    /// descriptor, readable below `/proc/self/fd/N/`), when the spec asked to
    /// capture writes. It outlives the sandbox for as long as it is held.
    #[serde(skip)]
    pub writes: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    pub enforced: Enforced,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Timing {
    pub stage: String,
    pub at_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Enforced {
    /// Namespaces whose identity differs from brig's own (compared by inode).
    pub namespaces: Vec<String>,
    pub identity: IdentityReport,
    pub filesystem: FilesystemReport,
    /// "loopback-only": a private network namespace with `lo` up and nothing else.
    pub network: String,
    pub capabilities: CapsReport,
    pub no_new_privs: bool,
    pub seccomp: SeccompReport,
    pub landlock: LandlockReport,
    pub cgroup: CgroupReport,
    pub rlimits: RlimitsReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdentityReport {
    pub uid: u32,
    pub gid: u32,
    pub host_uid: u32,
    pub host_gid: u32,
    /// /proc/PID/uid_map and gid_map as the kernel reports them.
    pub uid_map: String,
    pub gid_map: String,
    /// True when brig ran unprivileged and could only map the caller's own ids.
    pub rootless: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FilesystemReport {
    pub pivot_root: bool,
    /// "host-system" or "directory".
    pub root: String,
    pub read_only_root: bool,
    pub writable: Vec<String>,
    pub disk_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeccompReport {
    pub enabled: bool,
    pub filter: Option<crate::seccomp::SeccompSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CgroupReport {
    pub applied: bool,
    /// Why no cgroup was used (rootless without delegation).
    pub reason: Option<String>,
    pub details: Option<crate::cgroup::CgroupEnforced>,
}

/// Inodes of the child's namespaces, read inside the sandbox after setup.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NamespaceIds(pub Vec<(String, String)>);

pub const NAMESPACES: &[&str] = &["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"];

impl NamespaceIds {
    pub fn read(proc_dir: &str) -> Self {
        NamespaceIds(
            NAMESPACES
                .iter()
                .filter_map(|ns| {
                    std::fs::read_link(format!("{proc_dir}/ns/{ns}"))
                        .ok()
                        .map(|target| (ns.to_string(), target.to_string_lossy().into_owned()))
                })
                .collect(),
        )
    }

    /// Names of the namespaces in `self` that differ from `host`.
    pub fn differing_from(&self, host: &NamespaceIds) -> Vec<String> {
        self.0
            .iter()
            .filter(|(name, id)| host.0.iter().any(|(n, host_id)| n == name && host_id != id))
            .map(|(name, _)| name.clone())
            .collect()
    }
}
