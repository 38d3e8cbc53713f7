//! Snapshots: what a session wrote, kept to start sessions from (fork: any number
//! of them) or to restore a session to.
//!
//! - A session started from an image (or an image snapshot): its writes (the
//!   overlay's upper layer) become a new layer on top of its image (brig-image's
//!   snapshot, the same as `brig run --snapshot-to`). /tmp is not kept (it is a
//!   private tmpfs beside the image root).
//! - A session on the host's system dirs writes only its private /tmp and
//!   /workspace: they become one layer whose tree is `tmp/...` and `workspace/...`
//!   (an image of kind `scratch`, brig-image's `snapshot_scratch`), their whole
//!   content, so deletions need nothing. A fork or restore is a new sandbox on the
//!   host's system dirs whose /tmp and /workspace are filled from it as it starts
//!   (brig-jail's seed: a copy, costing time proportional to the snapshot's size,
//!   bounded by the new session's disk limit).
//!
//! Either is stored in the image store as image `snap-<id>`: one storage and one
//! delete path. The database maps it to its tenant, so one tenant never sees or
//! starts another's; its `image` column is the base image, empty for a host
//! snapshot.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use brig_jail::agent::{AgentReply, AgentRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    freeze, launch_sandbox, limits_of, lookup, persist, prepare_bundles, spec_for, BundleMount,
    Session,
};
use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath};
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_snapshot))
        .routes(routes!(list_snapshots))
        .routes(routes!(get_snapshot, delete_snapshot))
        .routes(routes!(restore_session))
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    pub name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotInfo {
    pub snapshot_id: String,
    pub name: Option<String>,
    pub session_id: String,
    /// The image the session ran (the snapshot's base); empty for a snapshot of a
    /// session on the host's system dirs.
    pub image: String,
    /// What the snapshot holds: "image" (a layer on top of `image`) or "host" (the
    /// /tmp and /workspace of a session on the host's system dirs).
    pub base: String,
    pub created_at: String,
    /// Size of the new layer (compressed).
    pub size_bytes: u64,
    /// The session's bundle mounts (not part of the layer): a fork that gives no
    /// `mounts` gets these. Volumes are never part of a snapshot.
    pub mounts: Vec<BundleMount>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    pub snapshot_id: String,
}

fn image_name(snapshot_id: &str) -> String {
    format!("snap-{}", snapshot_id.trim_start_matches("snap_"))
}

const BASE_IMAGE: &str = "image";
const BASE_HOST: &str = "host";

/// What a session starts from when it starts from a snapshot.
pub struct Source {
    /// The snapshot's image in the store.
    pub image: String,
    /// A snapshot of a session on the host's system dirs.
    pub host: bool,
    /// The bundle mounts of the snapshotted session.
    pub mounts: Vec<BundleMount>,
}

impl Source {
    /// The `image` and `seed` of [`super::launch_sandbox`].
    pub fn start(&self) -> (Option<String>, Option<String>) {
        if self.host {
            (None, Some(self.image.clone()))
        } else {
            (Some(self.image.clone()), None)
        }
    }
}

/// A caller's snapshot to start from (404 for unknown or another tenant's).
pub async fn source(state: &AppState, tenant: &str, snapshot_id: &str) -> Result<Source, ApiError> {
    let info = get(state, tenant, snapshot_id).await?;
    Ok(Source {
        image: image_name(snapshot_id),
        host: info.base == BASE_HOST,
        mounts: info.mounts,
    })
}

async fn get(state: &AppState, tenant: &str, id: &str) -> Result<SnapshotInfo, ApiError> {
    let (tenant, id) = (tenant.to_string(), id.to_string());
    let missing = ApiError::not_found(format!("no snapshot {id}"));
    state
        .db
        .call(move |conn| {
            conn.query_row(
                "SELECT id, name, session_id, image, created_at, size_bytes, mounts FROM snapshots
                 WHERE id = ?1 AND tenant = ?2",
                rusqlite::params![id, tenant],
                row_to_info,
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
        })
        .await?
        .ok_or(missing)
}

fn row_to_info(row: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotInfo> {
    let image: String = row.get(3)?;
    Ok(SnapshotInfo {
        snapshot_id: row.get(0)?,
        name: row.get(1)?,
        session_id: row.get(2)?,
        base: if image.is_empty() {
            BASE_HOST
        } else {
            BASE_IMAGE
        }
        .to_string(),
        image,
        created_at: row.get(4)?,
        size_bytes: row.get::<_, i64>(5)? as u64,
        mounts: row
            .get::<_, Option<String>>(6)?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
    })
}

#[utoipa::path(post, path = "/v1/sessions/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path)), request_body = CreateSnapshot,
    responses((status = 201, body = SnapshotInfo), (status = 404, body = crate::error::ErrorBody),
              (status = 409, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn create_snapshot(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CreateSnapshot>,
) -> Result<impl IntoResponse, ApiError> {
    let result = async {
        let session = lookup(&state, &caller, &id)?;
        snapshot(&state, &session, request.name.clone()).await
    }
    .await;
    let outcome = audit::outcome(&result);
    let detail = serde_json::json!({
        "name": request.name,
        "snapshot_id": result.as_ref().ok().map(|s| s.snapshot_id.clone()),
    });
    audit::record(
        &state,
        &caller,
        Some(&id),
        "snapshot.create",
        detail,
        outcome,
    )
    .await;
    Ok((StatusCode::CREATED, ApiJson(result?)))
}

/// Pauses the session, turns what it wrote into a new image, resumes it.
pub async fn snapshot(
    state: &AppState,
    session: &Arc<Session>,
    name: Option<String>,
) -> Result<SnapshotInfo, ApiError> {
    let sandbox = session.sandbox();
    let base = sandbox.image.clone();
    let _gate = session.gate.write().await;
    let was_paused = session.paused.load(std::sync::atomic::Ordering::SeqCst);
    // Init is in the sandbox's cgroup: frozen, it cannot answer. So the descriptors
    // of what it writes are taken while it runs (a paused session is thawed for
    // that moment).
    if was_paused {
        freeze(session, false).await?;
    }
    let request = match base {
        Some(_) => AgentRequest::Upper,
        None => AgentRequest::Scratch,
    };
    let writes = async {
        let (reply, fds) = super::agent::call(&sandbox.control_socket, &request)
            .await
            .map_err(super::exec::sandbox_gone)?;
        match reply {
            AgentReply::Done if fds.len() == 1 => Ok(Writes::Upper(fds)),
            AgentReply::Scratch { names } if names.len() == fds.len() && !fds.is_empty() => {
                Ok(Writes::Scratch(names.into_iter().zip(fds).collect()))
            }
            AgentReply::Error { message } => Err(ApiError::conflict(message)),
            other => Err(ApiError::internal(format!(
                "unexpected agent reply {other:?} with {} descriptors",
                fds.len()
            ))),
        }
    }
    .await;
    // Frozen, so the layer is one consistent moment of the session's files.
    freeze(session, true).await?;
    let result = async {
        let writes = writes?;
        let snapshot_id = format!("snap_{}", crate::auth::random_hex(12));
        let image = image_name(&snapshot_id);
        let store_dir = state.args.store.clone();
        let placeholders = sandbox.placeholders.clone();
        let base_name = base.clone();
        let origin = format!("snapshot of session {}", session.id);
        let (record, base_layers) = tokio::task::spawn_blocking(move || {
            let store = brig_image::store::Store::open(&store_dir)?;
            match (base_name, writes) {
                (Some(base_name), Writes::Upper(mut upper)) => {
                    let writes = upper.pop().expect("one descriptor, checked above");
                    let base = store.image(&base_name)?;
                    let base_layers = base.layers.len();
                    brig_image::ops::snapshot(
                        &store,
                        &brig_image::ops::Snapshot {
                            base: &base,
                            name: &image,
                            writes: writes.as_fd(),
                            placeholders: &placeholders,
                            // One mapped id: what the sandbox wrote belongs to it, and it
                            // stands for the image's root (see `brig run --snapshot-to`).
                            force_owner: Some((0, 0)),
                            replace: false,
                        },
                        &brig_image::Silent,
                    )
                    .map(|record| (record, base_layers))
                }
                (_, Writes::Scratch(dirs)) => {
                    let dirs: Vec<(&str, std::os::fd::BorrowedFd<'_>)> = dirs
                        .iter()
                        .map(|(name, fd)| (name.as_str(), fd.as_fd()))
                        .collect();
                    brig_image::ops::snapshot_scratch(
                        &store,
                        &brig_image::ops::ScratchSnapshot {
                            name: &image,
                            dirs: &dirs,
                            exclude: &scratch_exclusions(&placeholders),
                            // Everything there is the session user's: a fork's copy
                            // is its own user's, whatever is stored.
                            force_owner: Some((0, 0)),
                            origin: &origin,
                        },
                        &brig_image::Silent,
                    )
                    .map(|record| (record, 0))
                }
                (None, Writes::Upper(_)) => Err(brig_image::ImageError::Unsupported(
                    "an upper layer without a base image".into(),
                )),
            }
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::internal(format!("snapshot: {e}")))?;
        // The new top layer, unless the session wrote nothing (same layers as before).
        let size_bytes = match record.layers.last() {
            Some(top) if record.layers.len() > base_layers => {
                let hex = top.rsplit(':').next().unwrap_or(top);
                std::fs::metadata(state.args.store.join("layers").join(format!("{hex}.erofs")))
                    .map(|m| m.len())
                    .unwrap_or(0)
            }
            _ => 0,
        };
        let info = SnapshotInfo {
            snapshot_id: snapshot_id.clone(),
            name,
            session_id: session.id.clone(),
            base: if base.is_some() { BASE_IMAGE } else { BASE_HOST }.to_string(),
            image: base.unwrap_or_default(),
            created_at: crate::db::now_rfc3339(),
            size_bytes,
            mounts: session.request.mounts.clone().unwrap_or_default(),
        };
        let mounts = serde_json::to_string(&info.mounts).map_err(ApiError::internal)?;
        let row = (info.clone(), session.tenant.clone(), mounts);
        state
            .db
            .call(move |conn| {
                let (info, tenant, mounts) = row;
                conn.execute(
                    "INSERT INTO snapshots (id, tenant, name, session_id, image, created_at, size_bytes, mounts)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    rusqlite::params![
                        info.snapshot_id,
                        tenant,
                        info.name,
                        info.session_id,
                        info.image,
                        info.created_at,
                        info.size_bytes as i64,
                        mounts
                    ],
                )
            })
            .await?;
        Ok(info)
    }
    .await;
    if !was_paused {
        freeze(session, false).await?;
    }
    result
}

/// What a session hands over for its snapshot (see brig-jail's `mounts::Writes`).
enum Writes {
    /// Its image root's upper layer (one descriptor).
    Upper(Vec<OwnedFd>),
    /// Its private directories by name (`tmp`, `workspace`).
    Scratch(Vec<(String, OwnedFd)>),
}

/// What a host snapshot leaves out, relative to its tree: the daemon's own files
/// in /tmp (background processes' output, the execute driver) and the mount points
/// brig made below /tmp and /workspace (empty directories over which bundles were
/// bound; a fork that mounts them makes them again).
fn scratch_exclusions(placeholders: &[String]) -> Vec<PathBuf> {
    // Where `processes::JOBS_DIR` and the execute driver live.
    let mut exclude = vec![PathBuf::from("tmp/.brig")];
    for path in placeholders {
        let below = ["/tmp/", "/workspace/"]
            .iter()
            .any(|dir| path.starts_with(dir) && path.len() > dir.len());
        if below {
            exclude.push(PathBuf::from(path.trim_start_matches('/')));
        }
    }
    exclude
}

#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList)), security(("bearer" = [])))]
async fn list_snapshots(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<ApiJson<SnapshotList>, ApiError> {
    let tenant = caller.tenant.clone();
    let snapshots = state
        .db
        .call(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT id, name, session_id, image, created_at, size_bytes, mounts FROM snapshots
                 WHERE tenant = ?1 ORDER BY created_at, id",
            )?;
            let rows = stmt
                .query_map(rusqlite::params![tenant], row_to_info)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await?;
    Ok(ApiJson(SnapshotList { snapshots }))
}

#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 200, body = SnapshotInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn get_snapshot(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<SnapshotInfo>, ApiError> {
    Ok(ApiJson(get(&state, &caller.tenant, &id).await?))
}

#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn delete_snapshot(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let result = async {
        get(&state, &caller.tenant, &id).await?;
        let image = image_name(&id);
        let store_dir = state.args.store.clone();
        // Sessions running from it keep their layers (they hold them locked); the
        // layer files go at the next `brig image gc`.
        tokio::task::spawn_blocking(move || {
            let store = brig_image::store::Store::open(&store_dir)?;
            if store.has_image(&image) {
                store.remove_image(&image)?;
            }
            Ok::<_, brig_image::ImageError>(())
        })
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::internal(format!("remove snapshot image: {e}")))?;
        let row = id.clone();
        state
            .db
            .call(move |conn| {
                conn.execute(
                    "DELETE FROM snapshots WHERE id = ?1",
                    rusqlite::params![row],
                )
            })
            .await?;
        Ok(())
    }
    .await;
    let outcome = audit::outcome(&result);
    audit::record(
        &state,
        &caller,
        None,
        "snapshot.delete",
        serde_json::json!({"snapshot_id": id}),
        outcome,
    )
    .await;
    result.map(|()| StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/restore", tag = "snapshots",
    params(("id" = String, Path)), request_body = RestoreRequest,
    responses((status = 200, body = super::SessionInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn restore_session(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<RestoreRequest>,
) -> Result<ApiJson<super::SessionInfo>, ApiError> {
    let result = async {
        let session = lookup(&state, &caller, &id)?;
        let (image, seed) = source(&state, &caller.tenant, &request.snapshot_id)
            .await?
            .start();
        let _gate = session.gate.write().await;
        let limits = limits_of(&session.request)?;
        // The session keeps its own mounts and volume (held while it lives).
        let spec = spec_for(&state, &caller.tenant, &session.request, &limits)?;
        prepare_bundles(&state, &caller.tenant, &session.request).await?;
        // The new sandbox gets its own socket beside the old one, then replaces it.
        // Nothing of the old sandbox changes until the new one is ready (a snapshot
        // larger than the session's disk fails here).
        let launched = launch_sandbox(&state, &session.id, spec, image, seed, false).await?;
        let old = session.replace_sandbox(launched);
        let handle = old.handle.clone();
        let _ = tokio::task::spawn_blocking(move || handle.destroy()).await;
        if old.control_socket != session.sandbox().control_socket {
            let _ = tokio::fs::remove_file(&old.control_socket).await;
            let _ = tokio::fs::remove_file(super::launch::record_path(&old.control_socket)).await;
        }
        session
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
        persist(&state, &session, "running").await?;
        super::watch_exit(&state, &session);
        Ok(session.info())
    }
    .await;
    let outcome = audit::outcome(&result);
    audit::record(
        &state,
        &caller,
        Some(&id),
        "session.restore",
        serde_json::json!({"snapshot_id": request.snapshot_id}),
        outcome,
    )
    .await;
    result.map(ApiJson)
}
