//! The code interpreter's API (port 49999 of an E2B sandbox), as e2b-code-interpreter
//! calls it: `POST /execute` answers one JSON object a line (`stdout`, `stderr`,
//! `result`, `error`, `number_of_executions`, then `end_of_execution`), and
//! `/contexts` creates, lists, restarts and removes contexts. brig's stateful
//! interpreter runs the code; this module only translates. E2B's server answers its
//! own errors as plain text and FastAPI's validation errors as `{"detail": [...]}`,
//! so these routes do too.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use brig_engine::fault::{Error, ErrorCode};
use brig_engine::interpreter::{self as engine, CodeEvent, DEFAULT_CONTEXT};
use brig_engine::state::AppState;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::SandboxCall;

/// How often an idle `/execute` answer writes a keepalive line: a client that went
/// away is noticed at a write, and its code is then interrupted.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// The routes of port 49999.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(|| async { Json("OK") }))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{context_id}/restart", post(restart_context))
        .route("/contexts/{context_id}", delete(remove_context))
        .fallback(|| async { plain(StatusCode::NOT_FOUND, ErrorCode::NotFound, "Not Found") })
}

/// What these routes refuse a request with.
enum Refusal {
    /// Plain text, as E2B's server answers its own errors.
    Plain(StatusCode, ErrorCode, String),
    /// FastAPI's 422 for a body it cannot validate: the field, the message, the kind.
    Invalid(&'static str, &'static str, &'static str),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (mut response, code) = match self {
            Refusal::Plain(status, code, message) => ((status, message).into_response(), code),
            Refusal::Invalid(field, message, kind) => {
                let loc: Vec<&str> = ["body"]
                    .into_iter()
                    .chain(Some(field).filter(|f| !f.is_empty()))
                    .collect();
                let body = json!({"detail": [{"type": kind, "loc": loc, "msg": message}]});
                let response = (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response();
                (response, ErrorCode::Invalid)
            }
        };
        response.extensions_mut().insert(code);
        response
    }
}

type Answer = Result<Response, Refusal>;

fn plain(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal::Plain(status, code, message.into())
}

/// An engine error as a plain-text answer with the status brig gives its code.
fn refused(error: Error) -> Refusal {
    plain(
        crate::error::status_of(error.code),
        error.code,
        error.message,
    )
}

fn invalid(field: &'static str, message: &'static str, kind: &'static str) -> Refusal {
    Refusal::Invalid(field, message, kind)
}

/// The body as a JSON object, or FastAPI's 422 (an empty body is `{}` where
/// every field is optional, as for `POST /contexts`).
fn object(body: &Bytes, empty_ok: bool) -> Result<Map<String, Value>, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) && empty_ok {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid(
            "",
            "Input should be a valid dictionary",
            "dict_type",
        )),
        Err(_) => Err(invalid("", "JSON decode error", "json_invalid")),
    }
}

/// An optional string field (null is absent), or FastAPI's 422.
fn string_field(map: &Map<String, Value>, name: &'static str) -> Result<Option<String>, Refusal> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(
            name,
            "Input should be a valid string",
            "string_type",
        )),
    }
}

/// The one language brig's interpreter runs, or the refusal for another.
fn python_only(language: Option<&str>) -> Result<(), Refusal> {
    match language.map(|l| l.trim().to_ascii_lowercase()) {
        None => Ok(()),
        Some(l) if l.is_empty() || l == "python" || l == "python3" => Ok(()),
        Some(other) => Err(plain(
            StatusCode::BAD_REQUEST,
            ErrorCode::Invalid,
            format!("brig's interpreter runs Python only: there is no {other} kernel"),
        )),
    }
}

async fn execute(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    body: Bytes,
) -> Answer {
    let request = object(&body, false)?;
    let code = match request.get("code") {
        Some(Value::String(code)) => code.clone(),
        None | Some(Value::Null) => return Err(invalid("code", "Field required", "missing")),
        Some(_) => {
            return Err(invalid(
                "code",
                "Input should be a valid string",
                "string_type",
            ))
        }
    };
    let context_id = string_field(&request, "context_id")?;
    let language = string_field(&request, "language")?;
    if context_id.is_some() && language.is_some() {
        return Err(plain(
            StatusCode::BAD_REQUEST,
            ErrorCode::Invalid,
            "Only one of context_id or language can be provided",
        ));
    }
    python_only(language.as_deref())?;
    let env = match request.get("env_vars") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(vars)) => {
            let mut env = BTreeMap::new();
            for (key, value) in vars {
                let Some(value) = value.as_str() else {
                    return Err(invalid(
                        "env_vars",
                        "Input should be a valid string",
                        "string_type",
                    ));
                };
                env.insert(key.clone(), value.to_string());
            }
            env
        }
        Some(_) => {
            return Err(invalid(
                "env_vars",
                "Input should be a valid dictionary",
                "dict_type",
            ))
        }
    };
    let run = engine::RunCode {
        code,
        context_id,
        cwd: Some(call.home.clone()),
        env,
        interrupt_if_abandoned: true,
        ..Default::default()
    };
    let events = engine::run_code(&state, &call.caller, &call.session_id, run)
        .await
        .map_err(refused)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let session_id = call.session_id.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.reset();
        loop {
            let line = tokio::select! {
                event = events.next() => match event {
                    Some(CodeEvent::End(end)) => {
                        if gone(&state, &session_id) {
                            // Cut, not ended: the SDK then asks whether the sandbox
                            // runs, and says it was killed mid-request.
                            let cut = std::io::Error::other("the sandbox was killed");
                            let _ = tx.send(Err(cut)).await;
                            return;
                        }
                        let count = json!({"type": "number_of_executions",
                            "execution_count": end.execution_count});
                        let _ = tx.send(Ok(line_of(&count))).await;
                        let _ = tx.send(Ok(line_of(&json!({"type": "end_of_execution"})))).await;
                        return;
                    }
                    Some(event) => line_of(&line_for(event)),
                    None => return,
                },
                _ = keepalive.tick() => line_of(&json!({"type": "keepalive"})),
            };
            keepalive.reset();
            // The client is gone: dropping `events` tells the engine so.
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// Whether the session has ended (killed, expired) since the run began.
fn gone(state: &AppState, session_id: &str) -> bool {
    state
        .sessions()
        .get(session_id)
        .is_none_or(|s| s.deleted.load(std::sync::atomic::Ordering::SeqCst))
}

fn line_of(value: &Value) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// One event as E2B's server writes it.
fn line_for(event: CodeEvent) -> Value {
    match event {
        CodeEvent::Stdout(text) => json!({"type": "stdout", "text": text, "timestamp": now()}),
        CodeEvent::Stderr(text) => json!({"type": "stderr", "text": text, "timestamp": now()}),
        CodeEvent::Error(e) => json!({"type": "error", "name": e.name, "value": e.value,
            "traceback": e.traceback}),
        CodeEvent::Result(result) => result_of(result.data, result.main),
        // Handled by the caller: it is the last.
        CodeEvent::End(_) => json!({"type": "end_of_execution"}),
    }
}

/// A MIME bundle as E2B's `Result`: the known types by name, the rest in `extra`.
fn result_of(mut data: Map<String, Value>, main: bool) -> Value {
    const NAMED: [(&str, &str); 12] = [
        ("text/plain", "text"),
        ("text/html", "html"),
        ("text/markdown", "markdown"),
        ("image/svg+xml", "svg"),
        ("image/png", "png"),
        ("image/jpeg", "jpeg"),
        ("application/pdf", "pdf"),
        ("text/latex", "latex"),
        ("application/json", "json"),
        ("application/javascript", "javascript"),
        ("e2b/data", "data"),
        ("e2b/chart", "chart"),
    ];
    let mut out = Map::new();
    out.insert("type".into(), "result".into());
    for (mime, name) in NAMED {
        let mut value = data.remove(mime).unwrap_or(Value::Null);
        if name == "text" {
            // As IPython's repr of a str, quoted: E2B gives the string itself.
            if let Value::String(text) = &value {
                let quoted = text.len() >= 2
                    && ((text.starts_with('\'') && text.ends_with('\''))
                        || (text.starts_with('"') && text.ends_with('"')));
                if quoted {
                    value = Value::String(text[1..text.len() - 1].to_string());
                }
            }
        }
        out.insert(name.into(), value);
    }
    // brig's own description of a chart is for brig's API; E2B's is `chart`.
    data.retain(|mime, _| !mime.starts_with("application/vnd.brig."));
    out.insert("extra".into(), Value::Object(data));
    out.insert("is_main_result".into(), main.into());
    Value::Object(out)
}

fn context_json(id: &str, cwd: &str) -> Value {
    json!({"id": id, "language": "python", "cwd": cwd})
}

async fn create_context(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    body: Bytes,
) -> Answer {
    let request = object(&body, true)?;
    python_only(string_field(&request, "language")?.as_deref())?;
    let cwd = string_field(&request, "cwd")?
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| call.home.clone());
    let context = engine::create_context(&state, &call.caller, &call.session_id, Some(cwd))
        .await
        .map_err(refused)?;
    Ok(Json(context_json(&context.id, &context.cwd)).into_response())
}

/// The contexts, the default one first: it is there from the start in E2B, and
/// brig starts its kernel at its first use.
async fn list_contexts(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
) -> Answer {
    let contexts =
        engine::list_contexts(&state, &call.caller, &call.session_id).map_err(refused)?;
    let mut listed = Vec::with_capacity(contexts.len() + 1);
    if !contexts.iter().any(|c| c.id == DEFAULT_CONTEXT) {
        listed.push(context_json(DEFAULT_CONTEXT, &call.home));
    }
    let (default, others): (Vec<_>, Vec<_>) =
        contexts.iter().partition(|c| c.id == DEFAULT_CONTEXT);
    listed.extend(
        default
            .into_iter()
            .chain(others)
            .map(|c| context_json(&c.id, &c.cwd)),
    );
    Ok(Json(listed).into_response())
}

fn context_not_found(context_id: &str) -> Refusal {
    plain(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        format!("Context {context_id} not found"),
    )
}

async fn restart_context(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    Path(context_id): Path<String>,
) -> Answer {
    match engine::restart_context(&state, &call.caller, &call.session_id, &context_id).await {
        Ok(_) => Ok(Json(Value::Null).into_response()),
        // Never started: it has no state to lose.
        Err(e) if e.code == ErrorCode::NotFound && context_id == DEFAULT_CONTEXT => {
            Ok(Json(Value::Null).into_response())
        }
        Err(e) if e.code == ErrorCode::NotFound => Err(context_not_found(&context_id)),
        Err(e) => Err(refused(e)),
    }
}

async fn remove_context(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    Path(context_id): Path<String>,
) -> Answer {
    match engine::delete_context(&state, &call.caller, &call.session_id, &context_id).await {
        Ok(()) => Ok(Json(Value::Null).into_response()),
        Err(e) if e.code == ErrorCode::NotFound => Err(context_not_found(&context_id)),
        Err(e) => Err(refused(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_name_known_types_strip_a_str_repr_and_keep_the_rest() {
        let mut data = Map::new();
        data.insert("text/plain".into(), "'hi'".into());
        data.insert("image/png".into(), "iVBOR".into());
        data.insert(
            "application/vnd.brig.chart+json".into(),
            json!({"axes": []}),
        );
        let r = result_of(data, true);
        assert_eq!(r["type"], "result");
        assert_eq!(r["text"], "hi");
        assert_eq!(r["png"], "iVBOR");
        assert_eq!(r["html"], Value::Null);
        assert_eq!(r["is_main_result"], true);
        assert_eq!(
            r["extra"],
            json!({}),
            "brig's own chart description is not E2B's"
        );
        let mut data = Map::new();
        data.insert("text/plain".into(), "'".into());
        assert_eq!(result_of(data, false)["text"], "'");
    }

    #[test]
    fn only_python_is_offered() {
        assert!(python_only(None).is_ok());
        assert!(python_only(Some(" Python ")).is_ok());
        assert!(python_only(Some("js")).is_err());
    }
}
