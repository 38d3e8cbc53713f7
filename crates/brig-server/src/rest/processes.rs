//! Background processes in a session: `/v1/sessions/{id}/processes/...` (start,
//! list, get, output, stream, stdin, signal, wait).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brig_engine::sessions::processes::{self as engine, Offsets, ProcessEvent};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::sse::{self, Frame};
use crate::http::{ApiJson, ApiPath, ApiQuery, Authed, HttpResult};
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(start_process, list_processes))
        .routes(routes!(get_process))
        .routes(routes!(process_output))
        .routes(routes!(process_stream))
        .routes(routes!(process_stdin))
        .routes(routes!(process_signal))
        .routes(routes!(process_wait))
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    pub argv: Option<Vec<String>>,
    pub cmd: Option<String>,
    pub cwd: Option<String>,
    pub env: Option<std::collections::BTreeMap<String, String>>,
}

impl From<StartProcess> for engine::StartProcess {
    fn from(r: StartProcess) -> engine::StartProcess {
        let StartProcess {
            argv,
            cmd,
            cwd,
            env,
        } = r;
        engine::StartProcess {
            argv,
            cmd,
            cwd,
            env,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    /// Unique within the session, also across restores: a restored sandbox's
    /// processes are numbered on from the highest id the session has used.
    pub process_id: u64,
    pub argv: Vec<String>,
    /// "running" or "exited".
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

impl From<engine::ProcessInfo> for ProcessInfo {
    fn from(p: engine::ProcessInfo) -> ProcessInfo {
        let engine::ProcessInfo {
            process_id,
            argv,
            state,
            exit_code,
            signal,
            started_at,
            ended_at,
            stdout_bytes,
            stderr_bytes,
            sandbox_pid: _,
        } = p;
        ProcessInfo {
            process_id,
            argv,
            state,
            exit_code,
            signal,
            started_at,
            ended_at,
            stdout_bytes,
            stderr_bytes,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes", tag = "processes",
    params(("id" = String, Path)), request_body = StartProcess,
    responses((status = 201, body = ProcessInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn start_process(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<StartProcess>,
) -> HttpResult<impl IntoResponse> {
    let info = engine::start(&state, &caller, &id, &request.into()).await?;
    Ok((StatusCode::CREATED, ApiJson(ProcessInfo::from(info))))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes", tag = "processes",
    params(("id" = String, Path)),
    responses((status = 200, body = ProcessList), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn list_processes(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath(id): ApiPath<String>,
) -> HttpResult<ApiJson<ProcessList>> {
    let processes = engine::list(&state, &caller, &id).await?;
    Ok(ApiJson(ProcessList {
        processes: processes.into_iter().map(ProcessInfo::from).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    responses((status = 200, body = ProcessInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn get_process(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, pid)): ApiPath<(String, u64)>,
) -> HttpResult<ApiJson<ProcessInfo>> {
    let info = engine::get(&state, &caller, &id, pid).await?;
    Ok(ApiJson(info.into()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// "stdout" (default) or "stderr".
    pub stream: Option<String>,
    /// Byte offset to start from (0 to 2^64-1; past the end of the output, nothing).
    pub offset: Option<u64>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), OutputQuery),
    responses((status = 200, description = "raw bytes from the offset", content_type = "application/octet-stream")),
    security(("bearer" = [])))]
async fn process_output(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, pid)): ApiPath<(String, u64)>,
    ApiQuery(query): ApiQuery<OutputQuery>,
) -> HttpResult<Response> {
    let stream = query.stream.as_deref();
    let offset = query.offset.unwrap_or(0);
    let output = engine::output(&state, &caller, &id, pid, stream, offset).await?;
    let body = match output {
        Some(output) => Body::from_stream(tokio_util::io::ReaderStream::new(output)),
        None => Body::empty(),
    };
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/stream", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    responses((status = 200, description = "Server-Sent Events: `stdout`/`stderr` {data} from the start, then `exit` {exit_code, signal}", content_type = "text/event-stream")),
    security(("bearer" = [])))]
async fn process_stream(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, pid)): ApiPath<(String, u64)>,
) -> HttpResult<Response> {
    let events = engine::follow(&state, &caller, &id, pid, Offsets::default()).await?;
    Ok(sse::pump(events, |event| match event {
        ProcessEvent::Output(stream, text) => Some(Frame::output(stream.name(), text)),
        ProcessEvent::Exit { exit_code, signal } => Frame::json(
            "exit",
            &serde_json::json!({"exit_code": exit_code, "signal": signal}),
        ),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StdinQuery {
    /// Close stdin after writing the body (the process sees end of file).
    pub close: Option<bool>,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), StdinQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn process_stdin(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, pid)): ApiPath<(String, u64)>,
    ApiQuery(query): ApiQuery<StdinQuery>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<StatusCode> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let close = query.close.unwrap_or(false);
    let body = body.into_data_stream();
    engine::write_stdin(&state, &caller, &id, pid, declared, body, close).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A name ("TERM", "SIGKILL") or a number.
    #[schema(schema_with = signal_schema)]
    pub signal: serde_json::Value,
}

/// `signal` is taken as any JSON value and checked by the engine
/// (`processes::parse_signal`); the document says which values it accepts.
fn signal_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples(["TERM"]),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .examples([15]),
        )
        .description(Some("A name (\"TERM\", \"SIGKILL\") or a number."))
        .into()
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)), request_body = SignalRequest,
    responses((status = 204), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn process_signal(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, pid)): ApiPath<(String, u64)>,
    ApiJson(request): ApiJson<SignalRequest>,
) -> HttpResult<StatusCode> {
    engine::signal(&state, &caller, &id, pid, &request.signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Give up (answering the still-running process) after this long; default 30 s.
    pub timeout_ms: Option<u64>,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), WaitQuery),
    responses((status = 200, body = ProcessInfo), (status = 404, body = crate::error::ErrorBody)),
    security(("bearer" = [])))]
async fn process_wait(
    State(state): State<AppState>,
    Authed(caller): Authed,
    ApiPath((id, pid)): ApiPath<(String, u64)>,
    ApiQuery(query): ApiQuery<WaitQuery>,
) -> HttpResult<ApiJson<ProcessInfo>> {
    let info = engine::wait(&state, &caller, &id, pid, query.timeout_ms).await?;
    Ok(ApiJson(info.into()))
}
