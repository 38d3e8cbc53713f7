//! `/v1/files` (onyx-compatible): uploads, streamed to disk, and their listing,
//! download and deletion (see `brig_engine::filestore`).

use axum::body::{Body, Bytes};
use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::{DefaultBodyLimit, Multipart, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use brig_engine::config::Config;
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::filestore::{self, FileMeta};
use brig_engine::state::AppState;

use crate::http::ApiJson;
use crate::onyx::error::{OnyxAuthed, OnyxError, OnyxErrorBody, OnyxPath, OnyxResult};

/// Room for the multipart framing and small fields around the file.
const MULTIPART_OVERHEAD: u64 = 1 << 20;
/// Read size when streaming a file out.
const CHUNK: usize = 64 << 10;

/// The multipart form of `POST /v1/files`.
#[derive(ToSchema)]
#[allow(dead_code)] // documents the request body; the handler streams the field
struct UploadForm {
    #[schema(content_media_type = "application/octet-stream")]
    file: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UploadedFile {
    /// 32 hex characters.
    pub file_id: String,
    pub filename: String,
    pub size_bytes: u64,
}

impl From<FileMeta> for UploadedFile {
    fn from(meta: FileMeta) -> UploadedFile {
        let FileMeta {
            file_id,
            filename,
            size_bytes,
            tenant: _,
            sha256: _,
            created_at: _,
            expires_at: _,
        } = meta;
        UploadedFile {
            file_id,
            filename,
            size_bytes,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FileListItem {
    pub file_id: String,
    pub filename: String,
    pub size_bytes: u64,
    /// RFC 3339.
    pub upload_time: String,
}

impl From<FileMeta> for FileListItem {
    fn from(meta: FileMeta) -> FileListItem {
        let FileMeta {
            file_id,
            filename,
            size_bytes,
            created_at,
            tenant: _,
            sha256: _,
            expires_at: _,
        } = meta;
        FileListItem {
            file_id,
            filename,
            size_bytes,
            upload_time: created_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub files: Vec<FileListItem>,
}

/// `/v1/files`. Uploads may exceed `--max-body` (which is for JSON): this router
/// allows bodies up to `--max-file-size` plus the multipart framing.
pub fn routes(args: &Config) -> OpenApiRouter<AppState> {
    let limit = args.max_file_size_bytes.saturating_add(MULTIPART_OVERHEAD);
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    OpenApiRouter::new()
        .routes(routes!(upload, list))
        .routes(routes!(download, delete))
        .layer(DefaultBodyLimit::max(limit))
}

fn multipart_error(err: MultipartError) -> Error {
    if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Error::too_large("upload is over the daemon's limit (--max-file-size)")
    } else {
        Error::bad_request(format!("unreadable multipart body: {}", err.body_text()))
    }
}

/// An upload's refusal in onyx's words where onyx has words for it.
fn upload_error(state: &AppState, error: Error) -> OnyxError {
    if error.code != ErrorCode::PayloadTooLarge {
        return error.into();
    }
    let max = state.args.max_file_size_bytes;
    let limit = if max.is_multiple_of(1 << 20) {
        format!("{} MB", max >> 20)
    } else {
        format!("{max} bytes")
    };
    OnyxError::worded(
        error,
        format!("File size exceeds maximum of {limit} (the daemon's --max-file-size)"),
    )
}

/// FastAPI's 422 for a form without its required `file` field.
fn no_file_field() -> OnyxError {
    OnyxError::validation(vec![serde_json::json!({
        "type": "missing", "loc": ["body", "file"], "msg": "Field required", "input": null
    })])
}

/// onyx's 404 for a file id it does not know.
fn file_error(file_id: &str, error: Error) -> OnyxError {
    if error.code == ErrorCode::NotFound {
        let detail = format!("File with ID '{file_id}' not found");
        return OnyxError::worded(error, detail);
    }
    error.into()
}

/// Upload a file (multipart field `file`), streamed to disk.
#[utoipa::path(
    post,
    operation_id = "upload_file",
    path = "/v1/files",
    tag = "files",
    request_body(content = inline(UploadForm), content_type = "multipart/form-data"),
    responses(
        (status = 201, body = UploadedFile),
        (status = 400, body = OnyxErrorBody),
        (status = 401, body = OnyxErrorBody),
        (status = 413, body = OnyxErrorBody),
        (status = 422, body = OnyxErrorBody),
        (status = 429, body = OnyxErrorBody),
        (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn upload(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    multipart: Result<Multipart, MultipartRejection>,
) -> OnyxResult<impl IntoResponse> {
    // FastAPI reads any other body as a form without the field.
    let Ok(mut multipart) = multipart else {
        return Err(no_file_field());
    };
    loop {
        let field = multipart
            .next_field()
            .await
            .map_err(|e| upload_error(&state, multipart_error(e)))?;
        let Some(field) = field else {
            return Err(no_file_field());
        };
        if field.name() != Some("file") {
            continue;
        }
        let filename = field.file_name().map(str::to_owned);
        // The engine answers a read error carrying one of its errors as that error.
        let body = field.map_err(|e| std::io::Error::other(multipart_error(e)));
        let mut body = tokio_util::io::StreamReader::new(body);
        let meta = filestore::upload(&state, &caller, filename.as_deref(), &mut body)
            .await
            .map_err(|e| upload_error(&state, e))?;
        return Ok((StatusCode::CREATED, ApiJson(UploadedFile::from(meta))));
    }
}

/// List the tenant's files.
#[utoipa::path(
    get,
    operation_id = "list_files",
    path = "/v1/files",
    tag = "files",
    responses(
        (status = 200, body = FileList),
        (status = 401, body = OnyxErrorBody),
        (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn list(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
) -> OnyxResult<ApiJson<FileList>> {
    let files = filestore::list(&state, &caller).await?;
    Ok(ApiJson(FileList {
        files: files.into_iter().map(FileListItem::from).collect(),
    }))
}

/// Download a file's bytes (streamed).
#[utoipa::path(
    get,
    operation_id = "download_file",
    path = "/v1/files/{file_id}",
    tag = "files",
    params(("file_id" = String, Path)),
    responses(
        (status = 200, description = "The file's bytes", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 401, body = OnyxErrorBody),
        (status = 404, body = OnyxErrorBody),
        (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn download(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxPath(file_id): OnyxPath,
) -> OnyxResult<Response> {
    let filestore::Download { meta, len, file } = filestore::download(&state, &caller, &file_id)
        .await
        .map_err(|e| file_error(&file_id, e))?;
    let mut response = file_body(file).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(
        header::CONTENT_DISPOSITION,
        content_disposition(&meta.filename),
    );
    Ok(response)
}

/// Delete a file.
#[utoipa::path(
    delete,
    operation_id = "delete_file",
    path = "/v1/files/{file_id}",
    tag = "files",
    params(("file_id" = String, Path)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, body = OnyxErrorBody),
        (status = 404, body = OnyxErrorBody),
        (status = 409, description = "Mounted by a live session", body = OnyxErrorBody),
        (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody),
    ),
    security(("bearer" = []), ("api_key" = []))
)]
async fn delete(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxPath(file_id): OnyxPath,
) -> OnyxResult<StatusCode> {
    filestore::delete(&state, &caller, &file_id)
        .await
        .map_err(|e| file_error(&file_id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// A response body that streams a file in 64 KiB chunks.
fn file_body(file: tokio::fs::File) -> Body {
    let stream = futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; CHUNK];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(file)))
            }
            // Yield the error once, then end the stream.
            Err(e) => Some((Err(e), None)),
        }
    });
    Body::from_stream(stream)
}

/// `attachment` with an ASCII fallback name and the exact name in RFC 5987 form.
fn content_disposition(filename: &str) -> HeaderValue {
    let fallback: String = filename
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut encoded = String::new();
    for byte in filename.bytes() {
        if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    HeaderValue::from_str(&format!(
        "attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition() {
        assert_eq!(
            content_disposition("a b.txt"),
            "attachment; filename=\"a b.txt\"; filename*=UTF-8''a%20b.txt"
        );
        assert_eq!(
            content_disposition("é\"x"),
            "attachment; filename=\"__x\"; filename*=UTF-8''%C3%A9%22x"
        );
    }
}
