//! Snapshots: a session's writes become a new image layer on top of its image
//! (brig-image's snapshot, the same as `brig run --snapshot-to`). Sessions start
//! from a snapshot (fork: any number of them), and a session can be restored to one.
//!
//! A snapshot is stored in the image store as image `snap-<id>`; the database maps
//! it to its tenant, so one tenant never sees or starts another's.

use std::os::fd::AsFd;
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
    /// The image the session ran (the snapshot's base).
    pub image: String,
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

/// The store image of a caller's snapshot (404 for unknown or another tenant's).
pub async fn image_of(
    state: &AppState,
    tenant: &str,
    snapshot_id: &str,
) -> Result<String, ApiError> {
    get(state, tenant, snapshot_id).await?;
    Ok(image_name(snapshot_id))
}

/// [`image_of`] and the bundle mounts of the snapshotted session.
pub async fn image_and_mounts(
    state: &AppState,
    tenant: &str,
    snapshot_id: &str,
) -> Result<(String, Vec<BundleMount>), ApiError> {
    let info = get(state, tenant, snapshot_id).await?;
    Ok((image_name(snapshot_id), info.mounts))
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
    Ok(SnapshotInfo {
        snapshot_id: row.get(0)?,
        name: row.get(1)?,
        session_id: row.get(2)?,
        image: row.get(3)?,
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

/// Pauses the session, turns its upper layer into a new image, resumes it.
pub async fn snapshot(
    state: &AppState,
    session: &Arc<Session>,
    name: Option<String>,
) -> Result<SnapshotInfo, ApiError> {
    let sandbox = session.sandbox();
    let Some(base) = sandbox.image.clone() else {
        return Err(ApiError::conflict(
            "only sessions started from an image (or a snapshot) can be snapshotted",
        ));
    };
    let _gate = session.gate.write().await;
    let was_paused = session.paused.load(std::sync::atomic::Ordering::SeqCst);
    // Init is in the sandbox's cgroup: frozen, it cannot answer. So the upper layer's
    // descriptor is taken while it runs (a paused session is thawed for that moment).
    if was_paused {
        freeze(session, false).await?;
    }
    let upper = async {
        let (reply, mut fds) = super::agent::call(&sandbox.control_socket, &AgentRequest::Upper)
            .await
            .map_err(super::exec::sandbox_gone)?;
        match (reply, fds.pop()) {
            (AgentReply::Done, Some(fd)) => Ok(fd),
            (AgentReply::Error { message }, _) => Err(ApiError::conflict(message)),
            (other, _) => Err(ApiError::internal(format!(
                "unexpected agent reply {other:?}"
            ))),
        }
    }
    .await;
    // Frozen, so the layer is one consistent moment of the session's files.
    freeze(session, true).await?;
    let result = async {
        let writes = upper?;
        let snapshot_id = format!("snap_{}", crate::auth::random_hex(12));
        let image = image_name(&snapshot_id);
        let store_dir = state.args.store.clone();
        let placeholders = sandbox.placeholders.clone();
        let base_name = base.clone();
        let (record, base_layers) = tokio::task::spawn_blocking(move || {
            let store = brig_image::store::Store::open(&store_dir)?;
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
            image: base,
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
        let image = image_of(&state, &caller.tenant, &request.snapshot_id).await?;
        let _gate = session.gate.write().await;
        let limits = limits_of(&session.request)?;
        // The session keeps its own mounts and volume (held while it lives).
        let spec = spec_for(&state, &caller.tenant, &session.request, &limits)?;
        prepare_bundles(&state, &caller.tenant, &session.request).await?;
        // The new sandbox gets its own socket beside the old one, then replaces it.
        let launched = launch_sandbox(&state, &session.id, spec, Some(image), false).await?;
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
