//! Errors of the enforcement layer: one line for humans, a stable code for machines.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error(transparent)]
    Policy(#[from] brig_policy::PolicyError),
    /// A system call failed; `context` says what brig was doing.
    #[error("{context}: {source}")]
    Sys {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("cgroup: {0}")]
    Cgroup(String),
    #[error("landlock is required (--landlock required) but {0}")]
    LandlockRequired(String),
    /// The sandbox could not be set up; the message comes from inside it.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// A setup error reported from inside the sandbox, with its original code.
    #[error("{message}")]
    InSandbox { code: String, message: String },
    #[error("invalid host path {path}: {reason}")]
    HostPath { path: String, reason: String },
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox's disk (its scratch tmpfs) cannot hold what it must start with.
    #[error("{0}")]
    DiskFull(String),
    /// The sandbox's memory cannot hold what it must start with (a seed's files,
    /// which fill tmpfs pages charged to its memory limit).
    #[error("{0}")]
    MemoryFull(String),
    #[error("brig must start sandboxes from a single-threaded process (found {0} threads)")]
    MultiThreaded(usize),
    #[error("no free host id in range {start}-{end}: too many sandboxes at once")]
    IdsExhausted { start: u32, end: u32 },
}

impl JailError {
    /// A stable, machine-readable code for this kind of error.
    pub fn code(&self) -> &'static str {
        match self {
            JailError::Policy(_) => "invalid_policy",
            JailError::Sys { .. } => "system_error",
            JailError::Seccomp(_) => "seccomp_failed",
            JailError::Cgroup(_) => "cgroup_failed",
            JailError::LandlockRequired(_) => "landlock_unavailable",
            JailError::Setup(_) => "setup_failed",
            JailError::InSandbox { code, .. } => match code.as_str() {
                "landlock_unavailable" => "landlock_unavailable",
                "invalid_host_path" => "invalid_host_path",
                "disk_full" => "disk_full",
                "memory_full" => "memory_full",
                _ => "setup_failed",
            },
            JailError::HostPath { .. } => "invalid_host_path",
            JailError::Unsupported(_) => "unsupported",
            JailError::DiskFull(_) => "disk_full",
            JailError::MemoryFull(_) => "memory_full",
            JailError::MultiThreaded(_) => "multi_threaded",
            JailError::IdsExhausted { .. } => "ids_exhausted",
        }
    }

    /// Wraps the current `errno` with what brig was doing.
    pub fn last_os(context: impl Into<String>) -> Self {
        JailError::Sys {
            context: context.into(),
            source: io::Error::last_os_error(),
        }
    }

    pub fn sys(context: impl Into<String>, source: io::Error) -> Self {
        JailError::Sys {
            context: context.into(),
            source,
        }
    }
}

/// Adds context to `io::Result`s.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, JailError>;
}

impl<T> Context<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, JailError> {
        self.map_err(|source| JailError::Sys {
            context: what(),
            source,
        })
    }
}

impl<T> Context<T> for nix::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, JailError> {
        self.map_err(|errno| JailError::Sys {
            context: what(),
            source: io::Error::from_raw_os_error(errno as i32),
        })
    }
}
