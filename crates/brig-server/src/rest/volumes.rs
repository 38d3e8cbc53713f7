//! `/v1/volumes`: the tenant's persistent volumes (see `brig_engine::volumes`).

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::rest::sessions::Size;
use brig_engine::state::AppState;
use brig_engine::volumes;

use crate::http::{ApiJson, ApiPath, Authed, HttpResult};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeInfo {
    pub name: String,
    /// Bytes in use in it (what `df` calls Used): live while the daemon has it
    /// mounted, else as it was when last unmounted.
    pub size_bytes: u64,
    /// The most it can hold: set when it was made, more after a `PATCH`; what the
    /// tenant's disk quota counts.
    pub capacity_bytes: u64,
    pub created_at: String,
    /// Live sessions that mount it now.
    pub sessions: Vec<String>,
}

impl From<volumes::VolumeInfo> for VolumeInfo {
    fn from(info: volumes::VolumeInfo) -> VolumeInfo {
        let volumes::VolumeInfo {
            name,
            size_bytes,
            capacity_bytes,
            created_at,
            sessions,
        } = info;
        VolumeInfo {
            name,
            size_bytes,
            capacity_bytes,
            created_at,
            sessions,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeInfo>,
}

/// `PATCH /v1/volumes/{name}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateVolume {
    /// The new capacity, more than the current one (volumes only grow) and at most
    /// 1 TiB: e.g. "20G", or a number of bytes.
    pub capacity: Size,
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_volumes))
        .routes(routes!(update_volume, delete_volume))
}

/// The tenant's volumes.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList), (status = 401, body = crate::error::ErrorBody)),
    security(("bearer" = []), ("api_key" = [])))]
async fn list_volumes(
    State(state): State<AppState>,
    Authed(caller): Authed,
) -> HttpResult<ApiJson<VolumeList>> {
    let volumes = volumes::list(&state, &caller).await?;
    Ok(ApiJson(VolumeList {
        volumes: volumes.into_iter().map(VolumeInfo::from).collect(),
    }))
}

/// Grow a volume to a larger capacity, also while sessions use it (they see the
/// room at once); its data stays. Returns the volume as listed.
#[utoipa::path(patch, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)), request_body = UpdateVolume,
    responses((status = 200, body = VolumeInfo), (status = 401, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody)),
    security(("bearer" = []), ("api_key" = [])))]
async fn update_volume(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<UpdateVolume>,
) -> HttpResult<ApiJson<VolumeInfo>> {
    let UpdateVolume { capacity } = request;
    let info = volumes::update(&state, &caller, &name, &capacity.into()).await?;
    Ok(ApiJson(info.into()))
}

/// Delete a volume and its files: 409 while a session uses it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = crate::error::ErrorBody),
              (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody)),
    security(("bearer" = []), ("api_key" = [])))]
async fn delete_volume(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(name): ApiPath<String>,
) -> HttpResult<StatusCode> {
    volumes::delete(&state, &caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
