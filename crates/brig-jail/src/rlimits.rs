//! Per-process resource limits (setrlimit).
//!
//! These complement cgroups: RLIMIT_CPU and RLIMIT_FSIZE have no cgroup equivalent,
//! RLIMIT_NOFILE bounds kernel memory per process, RLIMIT_CORE=0 keeps crash dumps
//! (which may hold secrets) from being written, and RLIMIT_NPROC stands in for the
//! pids controller when no cgroup could be used (counted per user namespace since 5.14).

use brig_policy::Limits;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde::{Deserialize, Serialize};

use crate::{Context, JailError};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RlimitsReport {
    pub nofile: u64,
    pub core: u64,
    pub cpu_secs: Option<u64>,
    pub file_size_bytes: Option<u64>,
    pub nproc: Option<u64>,
}

/// The limits brig will set for `limits`; `pids_by_cgroup` says whether the pids
/// controller already bounds the process count.
pub fn planned(limits: &Limits, pids_by_cgroup: bool) -> RlimitsReport {
    RlimitsReport {
        nofile: limits.nofile,
        core: 0,
        cpu_secs: limits.cpu_time_secs,
        file_size_bytes: limits.file_size_bytes,
        nproc: if pids_by_cgroup { None } else { limits.pids },
    }
}

/// Fails early, in the parent, for limits this host cannot grant: raising a hard
/// limit needs CAP_SYS_RESOURCE in the initial user namespace, which even root may lack.
pub fn check_grantable(plan: &RlimitsReport) -> Result<(), JailError> {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).context(|| "getrlimit NOFILE".into())?;
    if plan.nofile > hard {
        return Err(JailError::Unsupported(format!(
            "--nofile {} exceeds this host's hard limit of {hard} open files (raising it needs CAP_SYS_RESOURCE)",
            plan.nofile
        )));
    }
    Ok(())
}

pub fn apply(plan: &RlimitsReport) -> Result<(), JailError> {
    let set = |resource, value: u64, name: &str| {
        setrlimit(resource, value, value).context(|| format!("setrlimit {name}={value}"))
    };
    set(Resource::RLIMIT_NOFILE, plan.nofile, "NOFILE")?;
    set(Resource::RLIMIT_CORE, 0, "CORE")?;
    if let Some(secs) = plan.cpu_secs {
        // SIGXCPU at the soft limit lets a program notice; SIGKILL one second later.
        setrlimit(Resource::RLIMIT_CPU, secs, secs + 1)
            .context(|| format!("setrlimit CPU={secs}"))?;
    }
    if let Some(bytes) = plan.file_size_bytes {
        set(Resource::RLIMIT_FSIZE, bytes, "FSIZE")?;
    }
    if let Some(n) = plan.nproc {
        set(Resource::RLIMIT_NPROC, n, "NPROC")?;
    }
    Ok(())
}
