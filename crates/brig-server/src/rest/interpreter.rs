//! The stateful interpreter: `POST /v1/sessions/{id}/code` (Server-Sent Events, or
//! one JSON summary) and its contexts, `/v1/sessions/{id}/contexts/...`.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brig_engine::interpreter::{self as engine, CodeEvent};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::sse::{self, Frame};
use crate::http::{ApiJson, ApiPath, Authed, HttpResult};
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(run_code))
        .routes(routes!(create_context, list_contexts))
        .routes(routes!(restart_context))
        .routes(routes!(delete_context))
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// Python source, at most 1 MiB. The value of its last line, if an
    /// expression, comes back as the main result.
    pub code: String,
    /// Default: the session's `default` context, created on first use.
    pub context_id: Option<String>,
    /// Interrupt the code (KeyboardInterrupt, state kept) after this long (default
    /// and maximum: the daemon's --max-execute-timeout).
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
    /// Answer with Server-Sent Events (as `Accept: text/event-stream` does).
    pub stream: Option<bool>,
}

/// A rich result: MIME type to data (`text/plain`, `text/html`, `image/png`
/// base64, `image/svg+xml`, `application/json`, ...).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    #[schema(value_type = Object)]
    pub data: serde_json::Map<String, serde_json::Value>,
    /// The value of the code's last expression (else a displayed object or a
    /// matplotlib figure).
    pub main: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeError {
    /// The exception's class; `KernelDied` when the kernel itself ended (its state
    /// is lost), `KernelError` when none could start.
    pub name: String,
    pub value: String,
    /// The user's frames only.
    pub traceback: String,
}

/// The `end` event.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeEnd {
    pub context_id: String,
    /// The code's cell number in its kernel (counts from 1; 0: it reached none).
    pub execution_count: u64,
    /// Interrupted at its timeout.
    pub timed_out: bool,
    pub duration_ms: u64,
}

/// A call's whole outcome (without `stream`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CodeSummary {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub results: Vec<CodeResult>,
    /// Results past 32 MiB (of their data) were left out: stream to get them all.
    pub results_truncated: bool,
    pub error: Option<CodeError>,
    pub context_id: String,
    pub execution_count: u64,
    pub timed_out: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// Its working directory (default: the session's).
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ContextInfo {
    pub id: String,
    pub cwd: String,
    pub created_at: String,
    /// Cells its current kernel has run.
    pub execution_count: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ContextList {
    pub contexts: Vec<ContextInfo>,
}

fn result(r: engine::CodeResult) -> CodeResult {
    CodeResult {
        data: r.data,
        main: r.main,
    }
}

fn error(e: engine::CodeError) -> CodeError {
    CodeError {
        name: e.name,
        value: e.value,
        traceback: e.traceback,
    }
}

fn context(c: engine::ContextInfo) -> ContextInfo {
    ContextInfo {
        id: c.id,
        cwd: c.cwd,
        created_at: c.created_at,
        execution_count: c.execution_count,
    }
}

fn wants_events(headers: &HeaderMap, stream: Option<bool>) -> bool {
    stream.unwrap_or_else(|| {
        headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("text/event-stream"))
    })
}

#[utoipa::path(post, path = "/v1/sessions/{id}/code", tag = "interpreter",
    params(("id" = String, Path)), request_body = RunCode,
    responses(
        (status = 200, description = "Without `stream` (or `Accept: text/event-stream`): the whole outcome (JSON). With it, Server-Sent Events: `stdout` and `stderr` {data}, `result` (CodeResult), `error` (CodeError), then `end` (CodeEnd).",
            content((CodeSummary = "application/json"), (String = "text/event-stream"))),
        (status = 404, body = crate::error::ErrorBody, description = "No such session or context"),
        (status = 413, body = crate::error::ErrorBody, description = "Code over 1 MiB"),
        (status = 429, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn run_code(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<RunCode>,
) -> HttpResult<Response> {
    let events = wants_events(&headers, request.stream);
    let request = engine::RunCode {
        code: request.code,
        context_id: request.context_id,
        timeout_ms: request.timeout_ms,
        ..Default::default()
    };
    if !events {
        let s = engine::run_code_summary(&state, &caller, &id, request).await?;
        let summary = CodeSummary {
            stdout: s.stdout,
            stderr: s.stderr,
            stdout_truncated: s.stdout_truncated,
            stderr_truncated: s.stderr_truncated,
            results: s.results.into_iter().map(result).collect(),
            results_truncated: s.results_truncated,
            error: s.error.map(error),
            context_id: s.context_id,
            execution_count: s.execution_count,
            timed_out: s.timed_out,
            duration_ms: s.duration_ms,
        };
        return Ok(ApiJson(summary).into_response());
    }
    let events = engine::run_code(&state, &caller, &id, request).await?;
    Ok(sse::pump(events, |event| match event {
        CodeEvent::Stdout(text) => Some(Frame::output("stdout", text)),
        CodeEvent::Stderr(text) => Some(Frame::output("stderr", text)),
        CodeEvent::Result(r) => Frame::json("result", &result(r)),
        CodeEvent::Error(e) => Frame::json("error", &error(e)),
        CodeEvent::End(end) => Frame::json(
            "end",
            &CodeEnd {
                context_id: end.context_id,
                execution_count: end.execution_count,
                timed_out: end.timed_out,
                duration_ms: end.duration_ms,
            },
        ),
    }))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/contexts", tag = "interpreter",
    params(("id" = String, Path)), request_body = CreateContext,
    responses((status = 201, body = ContextInfo), (status = 404, body = crate::error::ErrorBody),
              (status = 422, body = crate::error::ErrorBody, description = "No interpreter could start (no python3, or no such cwd)"),
              (status = 429, body = crate::error::ErrorBody, description = "The session has 16 contexts")),
    security(("bearer" = [])))]
async fn create_context(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<CreateContext>,
) -> HttpResult<impl IntoResponse> {
    let info = engine::create_context(&state, &caller, &id, request.cwd).await?;
    Ok((StatusCode::CREATED, ApiJson(context(info))))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/contexts", tag = "interpreter",
    params(("id" = String, Path)),
    responses((status = 200, body = ContextList), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn list_contexts(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<ContextList>> {
    let contexts = engine::list_contexts(&state, &caller, &id)?;
    Ok(ApiJson(ContextList {
        contexts: contexts.into_iter().map(context).collect(),
    }))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/contexts/{context_id}/restart", tag = "interpreter",
    params(("id" = String, Path), ("context_id" = String, Path)),
    responses((status = 200, body = ContextInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn restart_context(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, context_id)): ApiPath<(String, String)>,
) -> HttpResult<ApiJson<ContextInfo>> {
    let info = engine::restart_context(&state, &caller, &id, &context_id).await?;
    Ok(ApiJson(context(info)))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/contexts/{context_id}", tag = "interpreter",
    params(("id" = String, Path), ("context_id" = String, Path)),
    responses((status = 204, description = "Deleted, its kernel ended"), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn delete_context(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, context_id)): ApiPath<(String, String)>,
) -> HttpResult<StatusCode> {
    engine::delete_context(&state, &caller, &id, &context_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
