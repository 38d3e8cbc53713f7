//! envd's `/files`: `GET` downloads a file, `POST` writes files from multipart
//! `file` parts or (envd >= 0.5.7) from an `application/octet-stream` body,
//! gzip-encoded or not. Errors are envd's `{"code": <status>, "message"}`, which
//! the SDK maps by status (404: NotFoundException, 507: NotEnoughSpaceException...).

use std::collections::HashMap;
use std::io::Read;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::TryStreamExt;
use serde_json::{json, Value};
use tokio_util::io::{ReaderStream, StreamReader, SyncIoBridge};

use brig_engine::fault::{Error as ApiError, ErrorCode};
use brig_engine::sessions::{entries, files};
use brig_engine::state::AppState;

use super::{resolve_path, user_of, UserCheck};
use crate::e2b::{plain_error, SandboxCall};

type Params = Query<HashMap<String, String>>;

fn error(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    plain_error(status, code, message, Value::Null)
}

/// An engine error as envd's HTTP API answers it.
fn engine_error(e: ApiError) -> Response {
    let status = match e.code {
        ErrorCode::NotFound | ErrorCode::NoSuchFile => StatusCode::NOT_FOUND,
        ErrorCode::BadRequest
        | ErrorCode::Invalid
        | ErrorCode::InvalidPath
        | ErrorCode::NotADirectory
        | ErrorCode::NotAFile
        | ErrorCode::AlreadyExists
        | ErrorCode::InvalidArchive => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden | ErrorCode::PermissionDenied | ErrorCode::PathEscapes => {
            StatusCode::FORBIDDEN
        }
        ErrorCode::NoSpace | ErrorCode::MemoryFull => StatusCode::INSUFFICIENT_STORAGE,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::Quota => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorCode::Conflict | ErrorCode::Busy | ErrorCode::NotEmpty | ErrorCode::ReadOnly => {
            StatusCode::CONFLICT
        }
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.code, e.message)
}

/// The `username` query parameter, checked as envd checks it.
fn check_username(params: &HashMap<String, String>) -> Result<(), Box<Response>> {
    match user_of(params.get("username").map(String::as_str)) {
        UserCheck::Ok => Ok(()),
        UserCheck::Root(message) => Err(Box::new(error(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            message,
        ))),
        UserCheck::Unknown(message) => Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            message,
        ))),
    }
}

fn resolved(params: &HashMap<String, String>, home: &str) -> Result<String, Box<Response>> {
    resolve_path(params.get("path").map(String::as_str).unwrap_or(""), home).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidPath,
            e.message,
        ))
    })
}

pub async fn download(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    Query(params): Params,
) -> Response {
    if let Err(refused) = check_username(&params) {
        return *refused;
    }
    let path = match resolved(&params, &call.home) {
        Ok(path) => path,
        Err(refused) => return *refused,
    };
    match entries::stat(&state, &call.caller, &call.session_id, &path).await {
        Err(e) if e.code == ErrorCode::NoSuchFile => {
            return error(
                StatusCode::NOT_FOUND,
                ErrorCode::NoSuchFile,
                format!("path '{path}' does not exist"),
            )
        }
        Err(e) => return engine_error(e),
        Ok(_) => {}
    }
    let read = match files::read(&state, &call.caller, &call.session_id, &path).await {
        Ok(read) => read,
        Err(e) if e.code == ErrorCode::NotAFile => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::NotAFile,
                format!("path '{path}' is a directory"),
            )
        }
        Err(e) => return engine_error(e),
    };
    let name = path.rsplit('/').next().unwrap_or_default().replace('"', "");
    let mut response = Body::from_stream(ReaderStream::new(read.file)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(read.size_bytes));
    if let Ok(value) = HeaderValue::from_str(&format!("inline; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

fn written(path: &str) -> Value {
    let name = path.rsplit('/').next().unwrap_or_default();
    json!({"name": name, "type": "file", "path": path})
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

pub async fn upload(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    Query(params): Params,
    request: Request,
) -> Response {
    if let Err(refused) = check_username(&params) {
        return *refused;
    }
    let headers = request.headers().clone();
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" => true,
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                format!("error decompressing request body: unsupported Content-Encoding {other:?}"),
            )
        }
    };
    let body = request.into_body().into_data_stream();
    let body = StreamReader::new(body.map_err(std::io::Error::other));
    let body: Box<dyn tokio::io::AsyncRead + Send + Unpin> = if gzip {
        Box::new(gunzip(body))
    } else {
        Box::new(body)
    };
    let media = media_type(&headers);
    let result = if media == "application/octet-stream" {
        if params.get("path").is_none_or(|p| p.is_empty()) {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "path query parameter is required for raw body upload",
            );
        }
        let path = match resolved(&params, &call.home) {
            Ok(path) => path,
            Err(refused) => return *refused,
        };
        files::write(&state, &call.caller, &call.session_id, &path, body)
            .await
            .map(|_| vec![written(&path)])
            .map_err(|e| Box::new(engine_error(e)))
    } else if media.starts_with("multipart/") {
        multipart(&state, &call, &params, &headers, body).await
    } else {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!(
                "unsupported content type: {media}, expected multipart/form-data or application/octet-stream"
            ),
        );
    };
    match result {
        Ok(list) => axum::Json(list).into_response(),
        Err(refused) => *refused,
    }
}

/// A gzip body, decoded off the runtime's workers as it is read.
fn gunzip(
    body: impl tokio::io::AsyncRead + Send + Unpin + 'static,
) -> impl tokio::io::AsyncRead + Send + Unpin + 'static {
    let (reader, writer) = tokio::io::duplex(64 << 10);
    tokio::task::spawn_blocking(move || {
        let mut decoder = flate2::read::GzDecoder::new(SyncIoBridge::new(body));
        let mut out = SyncIoBridge::new(writer);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match decoder.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if std::io::Write::write_all(&mut out, &buf[..n]).is_err() {
                        break;
                    }
                }
                // The reader then sees the body end early: the engine writes nothing
                // it has not seen whole (its writes are atomic), so a cut file is
                // never left; the client sees the error of a short body.
                Err(_) => break,
            }
        }
    });
    reader
}

async fn multipart(
    state: &AppState,
    call: &SandboxCall,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
) -> Result<Vec<Value>, Box<Response>> {
    let bad = |message: String| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            message,
        ))
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| bad(format!("error parsing multipart form: {e}")))?;
    let stream = ReaderStream::new(body);
    let mut form = multer::Multipart::new(stream, boundary);
    let mut done: Vec<Value> = Vec::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => return Err(bad(format!("error reading form: {e}"))),
        };
        if field.name() != Some("file") {
            continue;
        }
        let asked = match params.get("path").filter(|p| !p.is_empty()) {
            Some(path) => path.clone(),
            None => field.file_name().unwrap_or_default().to_string(),
        };
        let path = resolve_path(&asked, &call.home).map_err(|e| bad(e.message))?;
        if done.iter().any(|d| d["path"] == path.as_str()) {
            return Err(bad(format!(
                "you cannot upload multiple files to the same path '{path}' in one upload request, only the first specified file was uploaded"
            )));
        }
        let reader = StreamReader::new(field.map_err(std::io::Error::other));
        files::write(state, &call.caller, &call.session_id, &path, reader)
            .await
            .map_err(|e| Box::new(engine_error(e)))?;
        done.push(written(&path));
    }
    Ok(done)
}
