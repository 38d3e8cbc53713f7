//! What a session uses now: memory, tasks, CPU time and its writable storage, next
//! to its limits, for a platform to show, bill or act on (a session near its memory
//! limit, one that has spun for an hour). Reading them is not activity: polling a
//! session's stats does not keep it from its idle timeout.

use super::{files::root_of, find};
use crate::auth::Caller;
use crate::fault::Error as ApiError;
use crate::state::AppState;

/// A session's use of its resources, read when asked. A value the host does not
/// report is null.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionStats {
    pub session_id: String,
    /// Memory charged to the session now: its processes', and the page cache and
    /// the files it wrote (`/tmp`, `/workspace` and changes to the image are in
    /// memory), as its memory limit counts them.
    pub memory_bytes: Option<u64>,
    /// The most memory charged to it at once so far.
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    /// CPU time used by all its processes since it started.
    pub cpu_seconds: Option<f64>,
    /// CPU bandwidth it may use, in CPUs.
    pub cpus_limit: Option<f64>,
    /// Processes and threads now.
    pub tasks: Option<u64>,
    pub tasks_limit: Option<u64>,
    /// Bytes its writes take of its writable storage (`limits.disk`); its volume
    /// is counted apart.
    pub disk_used_bytes: Option<u64>,
    pub disk_limit_bytes: u64,
    /// With a volume: bytes in use on it (what `df` calls Used, shared with the
    /// other sessions that mount it), and its size as its filesystem reports it (a
    /// little less than its capacity: the filesystem's own structures).
    pub volume_used_bytes: Option<u64>,
    pub volume_size_bytes: Option<u64>,
    /// Processes in it killed for want of memory.
    pub oom_kills: u64,
}

/// What one of the caller's sessions uses now (not activity: see the module).
pub async fn session_stats(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<SessionStats, ApiError> {
    let session = find(state, caller, id)?;
    // A few small files under /sys and a statfs: quick, but blocking calls.
    let stats = tokio::task::spawn_blocking(move || {
        let sandbox = session.sandbox();
        let (accounting, usage) = sandbox.stats();
        // Every writable place of a session but its volume is on its one scratch
        // filesystem.
        let root = root_of(&session).ok();
        let usage_of = |path: &str| root.as_ref().and_then(|r| r.disk_usage(path).ok());
        let disk = usage_of(brig_policy::defaults::WORKSPACE);
        let volume = session
            .request
            .volume
            .as_ref()
            .and_then(|_| usage_of(crate::volumes::MOUNT_PATH));
        let limits = &session.limits;
        SessionStats {
            session_id: session.id.clone(),
            memory_bytes: usage.memory_bytes,
            memory_peak_bytes: accounting.memory_peak_bytes,
            memory_limit_bytes: limits.memory_bytes,
            cpu_seconds: accounting.cpu_time_ns.map(|ns| ns as f64 / 1e9),
            cpus_limit: limits.cpus_millis.map(|m| f64::from(m) / 1000.0),
            tasks: usage.tasks,
            tasks_limit: limits.pids,
            disk_used_bytes: disk.map(|d| d.used_bytes),
            disk_limit_bytes: limits.disk_bytes,
            volume_used_bytes: volume.as_ref().map(|v| v.used_bytes),
            volume_size_bytes: volume.as_ref().map(|v| v.size_bytes),
            oom_kills: accounting.oom_kills,
        }
    })
    .await
    .map_err(ApiError::internal)?;
    Ok(stats)
}
