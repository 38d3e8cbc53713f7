//! onyx python-sandbox's `POST /v1/execute` and `POST /v1/execute/stream`: code
//! run once in a fresh session (see `brig_engine::execute`).

use std::convert::Infallible;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::rest::sessions::FileRef;
use brig_engine::execute::{self as engine, ExecuteEvent};
use brig_engine::state::AppState;

use crate::http::{ApiJson, Authed, HttpResult};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(execute))
        .routes(routes!(execute_stream))
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub code: String,
    pub stdin: Option<String>,
    /// Default 2000; above the daemon's --max-execute-timeout: 422.
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
    /// Print the value of a final expression, as in a notebook (default true).
    pub last_line_interactive: Option<bool>,
    /// Uploaded files to place in the working directory first.
    pub files: Option<Vec<FileRef>>,
}

impl From<ExecuteRequest> for engine::ExecuteRequest {
    fn from(request: ExecuteRequest) -> engine::ExecuteRequest {
        let ExecuteRequest {
            code,
            stdin,
            timeout_ms,
            last_line_interactive,
            files,
        } = request;
        engine::ExecuteRequest {
            code,
            stdin,
            timeout_ms,
            last_line_interactive,
            files: files.map(|files| files.into_iter().map(Into::into).collect()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OutputFile {
    /// Relative to the working directory.
    pub path: String,
    /// "file" or "directory".
    pub kind: String,
    /// For files: download with GET /v1/files/{file_id}. Directories have none, nor
    /// files that were not stored (over the daemon's --max-file-size or the tenant's
    /// disk quota, ...): a `brig: ...` line at the end of stderr says why.
    pub file_id: Option<String>,
}

impl From<engine::OutputFile> for OutputFile {
    fn from(file: engine::OutputFile) -> OutputFile {
        let engine::OutputFile {
            path,
            kind,
            file_id,
        } = file;
        OutputFile {
            path,
            kind,
            file_id,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecuteResponse {
    pub stdout: String,
    pub stderr: String,
    /// `null` when the code was killed (timeout, memory).
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub files: Vec<OutputFile>,
}

impl From<engine::ExecuteResponse> for ExecuteResponse {
    fn from(response: engine::ExecuteResponse) -> ExecuteResponse {
        let engine::ExecuteResponse {
            stdout,
            stderr,
            exit_code,
            timed_out,
            duration_ms,
            files,
        } = response;
        ExecuteResponse {
            stdout,
            stderr,
            exit_code,
            timed_out,
            duration_ms,
            files: files.into_iter().map(OutputFile::from).collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecuteResult {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub files: Vec<OutputFile>,
}

impl From<engine::ExecuteResult> for ExecuteResult {
    fn from(result: engine::ExecuteResult) -> ExecuteResult {
        let engine::ExecuteResult {
            exit_code,
            timed_out,
            duration_ms,
            files,
        } = result;
        ExecuteResult {
            exit_code,
            timed_out,
            duration_ms,
            files: files.into_iter().map(OutputFile::from).collect(),
        }
    }
}

#[utoipa::path(post, path = "/v1/execute", tag = "execute",
    request_body = ExecuteRequest,
    responses((status = 200, body = ExecuteResponse), (status = 404, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn execute(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiJson(request): ApiJson<ExecuteRequest>,
) -> HttpResult<Response> {
    let (response, slot) = engine::execute(&state, &caller, request.into()).await?;
    Ok(crate::http::json_holding(
        &ExecuteResponse::from(response),
        slot,
    ))
}

#[utoipa::path(post, path = "/v1/execute/stream", tag = "execute",
    request_body = ExecuteRequest,
    responses((status = 200, description = "Server-Sent Events: `output` {stream, data}, then `result` (ExecuteResult) or `error` {message}", content_type = "text/event-stream"),
              (status = 404, body = crate::error::ErrorBody), (status = 422, body = crate::error::ErrorBody),
              (status = 503, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn execute_stream(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiJson(request): ApiJson<ExecuteRequest>,
) -> HttpResult<Response> {
    let events = engine::execute_stream(&state, &caller, request.into()).await?;
    // json_data fails only on data serde cannot write, which these are not.
    let events = events.filter_map(|event| async move { sse_event(event).ok().map(Ok) });
    Ok(sse_response(events))
}

fn sse_event(event: ExecuteEvent) -> Result<Event, axum::Error> {
    match event {
        ExecuteEvent::Output { stream, data } => Event::default()
            .event("output")
            .json_data(serde_json::json!({"stream": stream.name(), "data": data})),
        ExecuteEvent::Result(result) => Event::default()
            .event("result")
            .json_data(ExecuteResult::from(result)),
        ExecuteEvent::Error { message } => Event::default()
            .event("error")
            .json_data(serde_json::json!({"message": message})),
    }
}

/// A Server-Sent Events response. The charset is named: the data is UTF-8 JSON, and
/// without it clients such as Python's `requests` decode `text/*` as ISO-8859-1
/// (RFC 2616's default), garbling every non-ASCII character.
fn sse_response<S>(events: S) -> Response
where
    S: futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
}
