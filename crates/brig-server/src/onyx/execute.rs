//! onyx python-sandbox's `POST /v1/execute` and `POST /v1/execute/stream`: code
//! run once in a fresh session (see `brig_engine::execute`).

use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::rest::sessions::FileRef;
use brig_engine::execute::{self as engine, ExecuteEvent};
use brig_engine::state::AppState;

use crate::http::sse::{self, Frame};
use crate::onyx::error::{Fields, OnyxAuthed, OnyxErrorBody, OnyxJson, OnyxModel, OnyxResult};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(execute))
        .routes(routes!(execute_stream))
}

/// onyx's `ExecuteRequest`: unknown fields are ignored, as pydantic does.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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

impl OnyxModel for engine::ExecuteRequest {
    fn from_body(body: &serde_json::Value) -> Result<Self, Vec<serde_json::Value>> {
        let mut fields =
            Fields::of(body, vec!["body".into()], "ExecuteRequest").map_err(|error| vec![error])?;
        let code = fields.string("code", true, false);
        let stdin = fields.string("stdin", false, true);
        let timeout_ms = fields.int_at_least("timeout_ms", 1);
        let last_line_interactive = fields.boolean("last_line_interactive");
        let files = fields.files("files");
        fields.finish(|| {
            Some(engine::ExecuteRequest {
                code: code?,
                stdin,
                timeout_ms,
                last_line_interactive,
                files: Some(files),
            })
        })
    }
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
    responses((status = 200, body = ExecuteResponse), (status = 404, body = OnyxErrorBody),
              (status = 422, body = OnyxErrorBody), (status = 503, body = OnyxErrorBody),
              (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody)),
    security(("bearer" = [])))]
async fn execute(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxJson(request): OnyxJson<engine::ExecuteRequest>,
) -> OnyxResult<Response> {
    let (response, slot) = engine::execute(&state, &caller, request).await?;
    Ok(crate::http::json_holding(
        &ExecuteResponse::from(response),
        slot,
    ))
}

#[utoipa::path(post, path = "/v1/execute/stream", tag = "execute",
    request_body = ExecuteRequest,
    responses((status = 200, description = "Server-Sent Events: `output` {stream, data}, then `result` (ExecuteResult) or `error` {message}", content_type = "text/event-stream"),
              (status = 404, body = OnyxErrorBody), (status = 422, body = OnyxErrorBody),
              (status = 503, body = OnyxErrorBody),
              (status = "default", description = "An error: `{\"detail\": ...}`", body = OnyxErrorBody)),
    security(("bearer" = [])))]
async fn execute_stream(
    State(state): State<AppState>,
    OnyxAuthed(caller): OnyxAuthed,
    OnyxJson(request): OnyxJson<engine::ExecuteRequest>,
) -> OnyxResult<Response> {
    let events = engine::execute_stream(&state, &caller, request).await?;
    Ok(sse::pump(events, |event| match event {
        ExecuteEvent::Output { stream, data } => Frame::json(
            "output",
            &serde_json::json!({"stream": stream.name(), "data": data}),
        ),
        ExecuteEvent::Result(result) => Frame::json("result", &ExecuteResult::from(result)),
        ExecuteEvent::Error { message } => {
            Frame::json("error", &serde_json::json!({"message": message}))
        }
    }))
}
