//! Exec in a session: `POST /v1/sessions/{id}/exec` (the result at the end),
//! `.../exec/stream` (Server-Sent Events as output comes); onyx's `.../bash` is in
//! `crate::onyx::bash`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::Response;
use brig_engine::sessions::exec::{self as engine, ExecEvent};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::sse::{self, Frame};
use crate::http::{ApiJson, ApiPath, Authed, HttpResult};
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(exec_sync))
        .routes(routes!(exec_stream))
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The command and its arguments (searched in PATH).
    pub argv: Option<Vec<String>>,
    /// A shell command line, run with `/bin/sh -c`.
    pub cmd: Option<String>,
    /// Working directory (default: the session's, /workspace).
    pub cwd: Option<String>,
    /// Added to the session's environment.
    pub env: Option<BTreeMap<String, String>>,
    /// Given to the command on stdin (then EOF).
    pub stdin: Option<String>,
    /// Kill the command's process group after this long (default and maximum:
    /// the daemon's --max-execute-timeout).
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
}

impl From<ExecRequest> for engine::ExecRequest {
    fn from(r: ExecRequest) -> engine::ExecRequest {
        let ExecRequest {
            argv,
            cmd,
            cwd,
            env,
            stdin,
            timeout_ms,
        } = r;
        engine::ExecRequest {
            argv,
            cmd,
            cwd,
            env,
            stdin,
            timeout_ms,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// `null` when killed by a signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// Killed for holding more file (record) locks than the session's budget: one
    /// per 4 KiB of its memory limit.
    pub file_locks_exceeded: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

impl From<engine::ExecResult> for ExecResult {
    fn from(r: engine::ExecResult) -> ExecResult {
        let engine::ExecResult {
            exit_code,
            signal,
            timed_out,
            oom_killed,
            file_locks_exceeded,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            duration_ms,
        } = r;
        ExecResult {
            exit_code,
            signal,
            timed_out,
            oom_killed,
            file_locks_exceeded,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            duration_ms,
        }
    }
}

/// The exit of a streamed exec (`exit` event): the result without the output.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub file_locks_exceeded: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

impl From<engine::ExecExit> for ExecExit {
    fn from(r: engine::ExecExit) -> ExecExit {
        let engine::ExecExit {
            exit_code,
            signal,
            timed_out,
            oom_killed,
            file_locks_exceeded,
            stdout_truncated,
            stderr_truncated,
            duration_ms,
        } = r;
        ExecExit {
            exit_code,
            signal,
            timed_out,
            oom_killed,
            file_locks_exceeded,
            stdout_truncated,
            stderr_truncated,
            duration_ms,
        }
    }
}

#[utoipa::path(post, path = "/v1/sessions/{id}/exec", tag = "exec",
    params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 200, body = ExecResult), (status = 404, body = crate::error::ErrorBody),
              (status = 409, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn exec_sync(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<ExecRequest>,
) -> HttpResult<Response> {
    let (result, slot) = engine::exec(&state, &caller, &id, &request.into()).await?;
    // The answer holds the exec's slot until the client has it (see run_holding).
    Ok(crate::http::json_holding(&ExecResult::from(result), slot))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/exec/stream", tag = "exec",
    params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 200, description = "Server-Sent Events: `stdout` and `stderr` {data}, then `exit` (ExecExit) or `error` {code, message}", content_type = "text/event-stream")),
    security(("bearer" = [])))]
async fn exec_stream(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<ExecRequest>,
) -> HttpResult<Response> {
    let events = engine::stream(&state, &caller, &id, &request.into()).await?;
    Ok(sse::pump(events, |event| match event {
        ExecEvent::Output(stream, text) => Some(Frame::output(stream.name(), text)),
        ExecEvent::Exit(exit) => Frame::json("exit", &ExecExit::from(exit)),
        ExecEvent::Failed(e) => Frame::json(
            "error",
            &serde_json::json!({"code": e.code.as_str(), "message": e.message}),
        ),
    }))
}
