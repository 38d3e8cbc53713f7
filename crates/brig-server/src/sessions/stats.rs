//! What a session uses now: memory, tasks, CPU time and its writable storage, next
//! to its limits, for a platform to show, bill or act on (a session near its memory
//! limit, one that has spun for an hour). Reading them is not activity: polling a
//! session's stats does not keep it from its idle timeout.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{files::root_of, find};
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath};
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(session_stats))
}

/// A session's use of its resources, read when asked. A value the host does not
/// report is null.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
    /// Bytes its writes take of its writable storage (`limits.disk`).
    pub disk_used_bytes: Option<u64>,
    pub disk_limit_bytes: u64,
    /// Processes in it killed for want of memory.
    pub oom_kills: u64,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/stats", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionStats), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn session_stats(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<SessionStats>, ApiError> {
    let session = find(&state, &caller, &id)?;
    // A few small files under /sys and a statfs: quick, but blocking calls.
    let stats = tokio::task::spawn_blocking(move || {
        let sandbox = session.sandbox();
        let accounting = sandbox.handle.stats().unwrap_or_default();
        let usage = sandbox.handle.usage().unwrap_or_default();
        // Every writable place of a session is on its one scratch filesystem.
        let disk = root_of(&session)
            .and_then(|root| {
                root.disk_usage(brig_policy::defaults::WORKSPACE)
                    .map_err(super::files::rootfs_error)
            })
            .ok();
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
            oom_kills: accounting.oom_kills,
        }
    })
    .await
    .map_err(ApiError::internal)?;
    Ok(ApiJson(stats))
}
