//! Snapshots (`/v1/snapshots`, `/v1/sessions/{id}/snapshots`, `.../restore`): the
//! engine takes, deletes and restores them (`brig_engine::sessions::snapshots`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use brig_engine::sessions::snapshots as engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::{ApiJson, ApiPath, Authed, HttpResult};
use crate::rest::sessions::{BundleMount, SessionInfo};
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

impl From<engine::SnapshotInfo> for SnapshotInfo {
    fn from(info: engine::SnapshotInfo) -> SnapshotInfo {
        let engine::SnapshotInfo {
            snapshot_id,
            name,
            session_id,
            image,
            base,
            created_at,
            size_bytes,
            mounts,
        } = info;
        SnapshotInfo {
            snapshot_id,
            name,
            session_id,
            image,
            base,
            created_at,
            size_bytes,
            mounts: mounts.into_iter().map(BundleMount::from).collect(),
        }
    }
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

#[utoipa::path(post, path = "/v1/sessions/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path)), request_body = CreateSnapshot,
    responses((status = 201, body = SnapshotInfo), (status = 404, body = crate::error::ErrorBody),
              (status = 409, body = crate::error::ErrorBody),
              (status = 429, description = "No room for it in the tenant's disk quota, or the \
               tenant takes its maximum of snapshots at once (--tenant-max-snapshots)",
               body = crate::error::ErrorBody),
              (status = 503, description = "The daemon takes its maximum of snapshots at once \
               (--max-snapshots)", body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn create_snapshot(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CreateSnapshot>,
) -> HttpResult<impl IntoResponse> {
    let CreateSnapshot { name } = request;
    let info = engine::create(&state, &caller, &id, name).await?;
    Ok((StatusCode::CREATED, ApiJson(SnapshotInfo::from(info))))
}

#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList)), security(("bearer" = [])))]
async fn list_snapshots(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> HttpResult<ApiJson<SnapshotList>> {
    let snapshots = engine::list(&state, &caller).await?;
    Ok(ApiJson(SnapshotList {
        snapshots: snapshots.into_iter().map(SnapshotInfo::from).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 200, body = SnapshotInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn get_snapshot(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<SnapshotInfo>> {
    Ok(ApiJson(engine::get(&state, &caller, &id).await?.into()))
}

#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn delete_snapshot(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<StatusCode> {
    engine::delete(&state, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/restore", tag = "snapshots",
    params(("id" = String, Path)), request_body = RestoreRequest,
    responses((status = 200, body = SessionInfo), (status = 404, body = crate::error::ErrorBody),
              (status = 422, description = "The snapshot does not fit in the session's disk or memory",
               body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn restore_session(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<RestoreRequest>,
) -> HttpResult<ApiJson<SessionInfo>> {
    let RestoreRequest { snapshot_id } = request;
    let info = engine::restore(&state, &caller, &id, &snapshot_id).await?;
    Ok(ApiJson(info.into()))
}
