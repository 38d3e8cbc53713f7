//! Files in a session (`/v1/sessions/{id}/files`, `/dir`, `/archive`): the engine
//! does the work and the audit (`brig_engine::sessions::files`); this streams bodies
//! in and out.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use brig_engine::sessions::files as engine;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::io::{ReaderStream, StreamReader};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::{ApiPath, ApiQuery, Authed, HttpResult};
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(download, upload, remove))
        .routes(routes!(list_dir, make_dir))
        .routes(routes!(download_archive, upload_archive))
}

#[derive(Clone, Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// For DELETE: remove a directory and everything in it.
    pub recursive: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Written {
    pub path: String,
    pub size_bytes: u64,
}

impl From<engine::Written> for Written {
    fn from(written: engine::Written) -> Written {
        let engine::Written { path, size_bytes } = written;
        Written { path, size_bytes }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Extracted {
    pub path: String,
    pub entries: u64,
}

impl From<engine::Extracted> for Extracted {
    fn from(extracted: engine::Extracted) -> Extracted {
        let engine::Extracted { path, entries } = extracted;
        Extracted { path, entries }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DirEntry {
    pub name: String,
    /// "file", "directory", "symlink" or "other".
    pub kind: String,
    pub size_bytes: u64,
    pub mode: u32,
    /// RFC 3339.
    pub modified_at: String,
}

impl From<engine::DirEntry> for DirEntry {
    fn from(entry: engine::DirEntry) -> DirEntry {
        let engine::DirEntry {
            name,
            kind,
            size_bytes,
            mode,
            modified_at,
        } = entry;
        DirEntry {
            name,
            kind,
            size_bytes,
            mode,
            modified_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntry>,
}

impl From<engine::DirListing> for DirListing {
    fn from(listing: engine::DirListing) -> DirListing {
        let engine::DirListing { path, entries } = listing;
        DirListing {
            path,
            entries: entries.into_iter().map(DirEntry::from).collect(),
        }
    }
}

/// The request body as a reader for the engine. A stalled client is cut off by the
/// router (`server::body_deadline`, under --body-timeout): its io error is passed on
/// as it is, so the engine sees kind `TimedOut` and answers 408.
fn body_reader(body: Body) -> impl tokio::io::AsyncRead + Send + Unpin + 'static {
    let chunks = body.into_data_stream().map(|chunk| {
        chunk.map_err(|e| match e.into_inner().downcast::<std::io::Error>() {
            Ok(e) => *e,
            Err(e) => std::io::Error::other(e),
        })
    });
    StreamReader::new(Box::pin(chunks))
}

/// A body the engine writes as the client reads it; a failure cuts it off.
fn streamed(download: engine::Download) -> Body {
    Body::from_stream(ReaderStream::new(download))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "files", operation_id = "download_session_file",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, description = "the file's bytes", content_type = "application/octet-stream"),
              (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn download(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> HttpResult<Response> {
    let file = engine::read(&state, &caller, &id, &query.path).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, file.size_bytes.to_string()),
        ],
        Body::from_stream(ReaderStream::new(file.file)),
    )
        .into_response())
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files", tag = "files", operation_id = "upload_session_file",
    params(("id" = String, Path), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = Written), (status = 404, body = crate::error::ErrorBody),
              (status = 413, body = crate::error::ErrorBody), (status = 422, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn upload(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
    body: Body,
) -> HttpResult<impl IntoResponse> {
    let written = engine::write(&state, &caller, &id, &query.path, body_reader(body)).await?;
    Ok((StatusCode::CREATED, axum::Json(Written::from(written))))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/files", tag = "files", operation_id = "remove_session_file",
    params(("id" = String, Path), PathQuery),
    responses((status = 204), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn remove(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> HttpResult<StatusCode> {
    let recursive = query.recursive.unwrap_or(false);
    engine::remove(&state, &caller, &id, &query.path, recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/dir", tag = "files",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, body = DirListing), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn list_dir(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> HttpResult<Response> {
    let body = engine::list(&state, &caller, &id, &query.path, |listing, out| {
        serde_json::to_writer(out, &DirListing::from(listing)).map_err(|e| e.to_string())
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], streamed(body)).into_response())
}

#[utoipa::path(post, path = "/v1/sessions/{id}/dir", tag = "files",
    params(("id" = String, Path), PathQuery),
    responses((status = 201), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn make_dir(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> HttpResult<StatusCode> {
    engine::mkdir(&state, &caller, &id, &query.path).await?;
    Ok(StatusCode::CREATED)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/archive", tag = "files",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, description = "a tar of the directory", content_type = "application/x-tar"),
              (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn download_archive(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> HttpResult<Response> {
    let body = engine::read_archive(&state, &caller, &id, &query.path).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        streamed(body),
    )
        .into_response())
}

#[utoipa::path(put, path = "/v1/sessions/{id}/archive", tag = "files",
    params(("id" = String, Path), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 201, body = Extracted), (status = 413, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn upload_archive(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
    body: Body,
) -> HttpResult<impl IntoResponse> {
    let extracted =
        engine::write_archive(&state, &caller, &id, &query.path, body_reader(body)).await?;
    Ok((StatusCode::CREATED, axum::Json(Extracted::from(extracted))))
}
