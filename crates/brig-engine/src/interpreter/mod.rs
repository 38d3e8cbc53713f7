//! A stateful Python interpreter per session: contexts, each a long-lived kernel
//! (`kernel.py`) inside the session's sandbox, under its limits, running code as
//! it is sent and keeping its globals and working directory between calls.
//!
//! Calls into one context are serialized (its kernel runs one cell at a time);
//! different contexts run concurrently. A call past its timeout is interrupted
//! (SIGINT: `KeyboardInterrupt` in the user's code, the state kept); one that does
//! not stop within [`INTERRUPT_GRACE`] is killed with its kernel. A kernel that
//! dies is reported as such, and the next call starts a fresh one.
//!
//! Contexts live in the daemon's memory with their session: they end with it
//! (delete, expiry) and with the daemon. A restore keeps the contexts (ids and
//! working directories) but not their kernels, which died with the replaced
//! sandbox: the next call into each starts a fresh one, as a restart would.

mod kernel;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::audit;
use crate::auth::Caller;
use crate::fault::Error as ApiError;
use crate::sessions::{ensure_not_deleted, ensure_running, lookup, Session};
use crate::state::AppState;
use kernel::{Kernel, Next};

/// The most code one call may send.
pub const MAX_CODE_BYTES: usize = 1 << 20;
/// The context a call without one runs in, created on first use.
pub const DEFAULT_CONTEXT: &str = "default";
/// Contexts a session may have at once (each a python3 process).
pub const MAX_CONTEXTS: usize = 16;
/// How long interrupted code may take to stop before its kernel is killed.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);
/// The most results one summary keeps, in bytes of their data.
pub const MAX_SUMMARY_RESULTS: usize = 32 << 20;
/// Events a call builds ahead of its client.
const EVENT_QUEUE: usize = 16;

/// A session's contexts, by id.
#[derive(Default)]
pub struct Contexts {
    map: Mutex<BTreeMap<String, Arc<Context>>>,
}

struct Context {
    id: String,
    cwd: String,
    created_at: String,
    /// Cells run by its current kernel.
    count: AtomicU64,
    /// Held by the call running in it: one at a time.
    kernel: tokio::sync::Mutex<Option<Kernel>>,
    /// The running kernel's job, for a restart or delete that cannot wait for the
    /// call that holds `kernel`.
    job: Mutex<Option<(Arc<dyn crate::backend::Sandbox>, u64)>>,
}

/// A context as listed.
#[derive(Debug, Clone, Serialize)]
pub struct ContextInfo {
    pub id: String,
    pub cwd: String,
    pub created_at: String,
    /// Cells its current kernel has run.
    pub execution_count: u64,
}

impl Context {
    fn info(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            cwd: self.cwd.clone(),
            created_at: self.created_at.clone(),
            execution_count: self.count.load(Ordering::SeqCst),
        }
    }

    fn set_kernel(&self, slot: &mut Option<Kernel>, kernel: Option<Kernel>) {
        *self.job.lock().unwrap_or_else(|e| e.into_inner()) = kernel.as_ref().map(Kernel::job);
        self.count.store(0, Ordering::SeqCst);
        *slot = kernel;
    }

    /// Kills the running kernel without waiting for the call that holds it.
    async fn stop(&self) {
        let job = self.job.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((sandbox, job)) = job {
            crate::sessions::exec::kill_job(&*sandbox, job).await;
        }
    }
}

/// Code to run.
#[derive(Debug, Clone, Default)]
pub struct RunCode {
    pub code: String,
    /// Default: [`DEFAULT_CONTEXT`].
    pub context_id: Option<String>,
    /// Interrupt the code after this long (default and maximum: the daemon's
    /// --max-execute-timeout).
    pub timeout_ms: Option<u64>,
    /// The working directory of the default context if this call starts it
    /// (default: the sandbox's).
    pub cwd: Option<String>,
    /// Environment variables set for this call only (`os.environ`), then restored.
    pub env: BTreeMap<String, String>,
    /// Interrupt the code, as at its timeout, when the caller stops listening
    /// (E2B's semantics: a client that gave up frees the context for the next
    /// call). Otherwise the code runs on to its end.
    pub interrupt_if_abandoned: bool,
}

/// What running code yields, in order; [`CodeEvent::End`] is always last.
#[derive(Debug, Clone)]
pub enum CodeEvent {
    Stdout(String),
    Stderr(String),
    /// A rich result: the last expression's value (`main`), a `display()`ed
    /// object or a matplotlib figure.
    Result(CodeResult),
    Error(CodeError),
    End(CodeEnd),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CodeResult {
    /// MIME type to data: text, base64 for images, JSON for `application/json`.
    pub data: serde_json::Map<String, serde_json::Value>,
    /// The value of the cell's last expression (else a displayed object).
    pub main: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CodeError {
    /// The exception's class (`KernelDied` when the kernel itself ended).
    pub name: String,
    pub value: String,
    pub traceback: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CodeEnd {
    pub context_id: String,
    /// The cell's number in its kernel (0: it never reached one).
    pub execution_count: u64,
    pub timed_out: bool,
    pub duration_ms: u64,
}

/// A whole call, collected ([`run_code_summary`]); the REST API's JSON answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CodeSummary {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub results: Vec<CodeResult>,
    /// Results past [`MAX_SUMMARY_RESULTS`] were left out.
    pub results_truncated: bool,
    pub error: Option<CodeError>,
    pub context_id: String,
    pub execution_count: u64,
    pub timed_out: bool,
    pub duration_ms: u64,
}

fn unknown(session: &Session, id: &str) -> ApiError {
    ApiError::not_found(format!("no context {id} in session {}", session.id))
}

fn find(session: &Session, id: &str) -> Option<Arc<Context>> {
    session
        .interpreter
        .map
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .cloned()
}

/// Adds a context, refused past [`MAX_CONTEXTS`]; with `id` (the default one),
/// the one already there if any.
fn add(session: &Session, id: Option<&str>, cwd: String) -> Result<Arc<Context>, ApiError> {
    let mut map = session
        .interpreter
        .map
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(found) = id.and_then(|id| map.get(id)) {
        return Ok(found.clone());
    }
    if map.len() >= MAX_CONTEXTS {
        return Err(ApiError::quota(format!(
            "session {} has {MAX_CONTEXTS} contexts, the most it may have; delete one first",
            session.id
        )));
    }
    let id = id.map_or_else(
        || format!("ctx_{}", crate::auth::random_hex(8)),
        str::to_string,
    );
    let context = Arc::new(Context {
        id: id.clone(),
        cwd,
        created_at: crate::db::now_rfc3339(),
        count: AtomicU64::new(0),
        kernel: tokio::sync::Mutex::new(None),
        job: Mutex::new(None),
    });
    map.insert(id, context.clone());
    Ok(context)
}

fn remove(session: &Session, id: &str) -> Option<Arc<Context>> {
    session
        .interpreter
        .map
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id)
}

/// Creates a context working in `cwd` (default: the session's) and starts its
/// kernel; audited as `code.context.create`.
pub async fn create_context(
    state: &AppState,
    caller: &Caller,
    id: &str,
    cwd: Option<String>,
) -> Result<ContextInfo, ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        ensure_running(&session)?;
        let cwd = cwd.unwrap_or_else(|| session.sandbox().facts().cwd.clone());
        if !cwd.starts_with('/') {
            return Err(ApiError::invalid(format!(
                "cwd {cwd:?} must be an absolute path"
            )));
        }
        let _gate = session.gate.read().await;
        ensure_not_deleted(&session)?;
        let context = add(&session, None, cwd)?;
        let mut slot = context.kernel.lock().await;
        match Kernel::start(state, &session, &context.cwd).await {
            Ok(kernel) => context.set_kernel(&mut slot, Some(kernel)),
            Err(e) => {
                remove(&session, &context.id);
                return Err(e);
            }
        }
        Ok(context.info())
    }
    .await;
    let detail = serde_json::json!({"context_id": result.as_ref().ok().map(|c| &c.id)});
    audit::record(
        state,
        caller,
        Some(id),
        "code.context.create",
        detail,
        audit::outcome(&result),
    )
    .await;
    result
}

/// The session's contexts, by id.
pub fn list_contexts(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Vec<ContextInfo>, ApiError> {
    let session = lookup(state, caller, id)?;
    let map = session
        .interpreter
        .map
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Ok(map.values().map(|c| c.info()).collect())
}

/// Gives the context a fresh kernel: its state is cleared (a call running in it
/// is ended, and told so). Audited as `code.context.restart`.
pub async fn restart_context(
    state: &AppState,
    caller: &Caller,
    id: &str,
    context_id: &str,
) -> Result<ContextInfo, ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        ensure_running(&session)?;
        let context = find(&session, context_id).ok_or_else(|| unknown(&session, context_id))?;
        context.stop().await;
        let mut slot = context.kernel.lock().await;
        let _gate = session.gate.read().await;
        ensure_not_deleted(&session)?;
        context.set_kernel(&mut slot, None);
        let kernel = Kernel::start(state, &session, &context.cwd).await?;
        context.set_kernel(&mut slot, Some(kernel));
        Ok(context.info())
    }
    .await;
    let detail = serde_json::json!({"context_id": context_id});
    audit::record(
        state,
        caller,
        Some(id),
        "code.context.restart",
        detail,
        audit::outcome(&result),
    )
    .await;
    result
}

/// Deletes a context and ends its kernel (a call running in it is ended, and
/// told so). Audited as `code.context.delete`.
pub async fn delete_context(
    state: &AppState,
    caller: &Caller,
    id: &str,
    context_id: &str,
) -> Result<(), ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        let context = remove(&session, context_id).ok_or_else(|| unknown(&session, context_id))?;
        context.stop().await;
        Ok(())
    }
    .await;
    let detail = serde_json::json!({"context_id": context_id});
    audit::record(
        state,
        caller,
        Some(id),
        "code.context.delete",
        detail,
        audit::outcome(&result),
    )
    .await;
    result
}

/// Runs code in a context of session `id`, giving its events as they come (see
/// [`CodeEvent`]). Refused at once: code over [`MAX_CODE_BYTES`] (413), an unknown
/// session or context (404), a bad timeout; anything after that (a kernel that
/// cannot start or dies) comes as an error event. Audited as `code.run` at its end.
pub async fn run_code(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: RunCode,
) -> Result<impl futures_util::Stream<Item = CodeEvent> + Send + 'static, ApiError> {
    let started = prepare(state, caller, id, &request);
    let (session, context, timeout, permit) = match started {
        Ok(started) => started,
        Err(e) => {
            let detail = serde_json::json!({"context_id": request.context_id,
                "code_bytes": request.code.len()});
            audit::record(state, caller, Some(id), "code.run", detail, e.code.as_str()).await;
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let (state, caller, id) = (state.clone(), caller.clone(), id.to_string());
    tokio::spawn(async move {
        let _permit = permit;
        let sink = Sink::new(tx, Duration::from_millis(state.args.body_timeout_ms));
        let end = run_in(&state, &session, &context, &request, timeout, &sink).await;
        let outcome = if end.timed_out { "timeout" } else { "ok" };
        let detail = serde_json::json!({"context_id": context.id,
            "code_bytes": request.code.len(), "execution_count": end.execution_count,
            "duration_ms": end.duration_ms});
        sink.send(CodeEvent::End(end)).await;
        audit::record(&state, &caller, Some(&id), "code.run", detail, outcome).await;
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

type Prepared = (Arc<Session>, Arc<Context>, Duration, crate::auth::Permit);

fn prepare(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: &RunCode,
) -> Result<Prepared, ApiError> {
    if request.code.len() > MAX_CODE_BYTES {
        return Err(ApiError::too_large(format!(
            "code of {} bytes is over the limit of {MAX_CODE_BYTES}",
            request.code.len()
        )));
    }
    for (key, value) in &request.env {
        crate::sessions::exec::check_env_var(key, value)?;
    }
    let session = lookup(state, caller, id)?;
    ensure_running(&session)?;
    let max = state.args.max_execute_timeout_ms;
    let timeout_ms = request.timeout_ms.unwrap_or(max);
    if timeout_ms == 0 || timeout_ms > max {
        return Err(ApiError::invalid(format!(
            "timeout_ms must be between 1 and {max} (the daemon's --max-execute-timeout)"
        )));
    }
    let permit = state.auth.exec_permit(&session.tenant)?;
    let context = match request.context_id.as_deref() {
        None | Some(DEFAULT_CONTEXT) => {
            let cwd = request
                .cwd
                .clone()
                .unwrap_or_else(|| session.sandbox().facts().cwd.clone());
            add(&session, Some(DEFAULT_CONTEXT), cwd)?
        }
        Some(other) => find(&session, other).ok_or_else(|| unknown(&session, other))?,
    };
    Ok((session, context, Duration::from_millis(timeout_ms), permit))
}

/// Where a call's events go: a client that takes none for --body-timeout is let
/// go, and the call runs on to its end without it.
struct Sink {
    tx: mpsc::Sender<CodeEvent>,
    idle: Duration,
    gone: std::sync::atomic::AtomicBool,
}

impl Sink {
    fn new(tx: mpsc::Sender<CodeEvent>, idle: Duration) -> Sink {
        Sink {
            tx,
            idle,
            gone: Default::default(),
        }
    }

    async fn send(&self, event: CodeEvent) {
        if self.gone.load(Ordering::SeqCst) {
            return;
        }
        if !matches!(
            tokio::time::timeout(self.idle, self.tx.send(event)).await,
            Ok(Ok(()))
        ) {
            self.gone.store(true, Ordering::SeqCst);
        }
    }

    async fn error(&self, name: &str, value: String) {
        self.send(CodeEvent::Error(CodeError {
            name: name.into(),
            value,
            traceback: String::new(),
        }))
        .await;
    }
}

async fn run_in(
    state: &AppState,
    session: &Arc<Session>,
    context: &Arc<Context>,
    request: &RunCode,
    timeout: Duration,
    sink: &Sink,
) -> CodeEnd {
    let started = Instant::now();
    let mut end = CodeEnd {
        context_id: context.id.clone(),
        execution_count: 0,
        timed_out: false,
        duration_ms: 0,
    };
    let mut slot = context.kernel.lock().await;
    let _gate = session.gate.read().await;
    if let Err(e) = ensure_not_deleted(session) {
        sink.error("SessionGone", e.message).await;
        return end;
    }
    let sandbox = session.sandbox();
    if slot.as_ref().is_some_and(|k| !k.in_sandbox(&sandbox)) {
        // Restored: its kernel died with the old sandbox.
        context.set_kernel(&mut slot, None);
    }
    if let Some(how) = slot.as_ref().and_then(Kernel::has_ended) {
        let note = format!(
            "brig: this context's kernel ended since its last call ({how}); its state is \
             lost, and this code runs in a fresh kernel\n"
        );
        sink.send(CodeEvent::Stderr(note)).await;
        context.set_kernel(&mut slot, None);
    }
    if slot.is_none() {
        match Kernel::start(state, session, &context.cwd).await {
            Ok(kernel) => context.set_kernel(&mut slot, Some(kernel)),
            Err(e) => {
                sink.error("KernelError", e.message).await;
                end.duration_ms = started.elapsed().as_millis() as u64;
                return end;
            }
        }
    }
    let Some(kernel) = slot.as_mut() else {
        return end;
    };
    let n = context.count.fetch_add(1, Ordering::SeqCst) + 1;
    end.execution_count = n;
    let deadline = tokio::time::Instant::from_std(started + timeout);
    let mut died = None;
    if kernel.send(&request.code, &request.env, n).await.is_err() {
        died = Some(match kernel.next().await {
            Next::Ended(how) => how,
            _ => "it stopped reading its input".into(),
        });
    }
    let mut interrupted: Option<tokio::time::Instant> = None;
    let mut killed = false;
    while died.is_none() {
        let grace_end = interrupted.map(|at| at + INTERRUPT_GRACE);
        tokio::select! {
            next = kernel.next() => match next {
                Next::Event(event) => {
                    if event["type"] == "end" {
                        break;
                    }
                    if let Some(event) = to_event(event) {
                        sink.send(event).await;
                    }
                }
                Next::Junk(line) => sink.send(CodeEvent::Stderr(line + "\n")).await,
                Next::Ended(how) => died = Some(how),
            },
            _ = tokio::time::sleep_until(deadline), if interrupted.is_none() => {
                end.timed_out = true;
                interrupted = Some(tokio::time::Instant::now());
                kernel.interrupt().await;
            }
            () = sink.tx.closed(), if request.interrupt_if_abandoned && interrupted.is_none() => {
                interrupted = Some(tokio::time::Instant::now());
                kernel.interrupt().await;
            }
            _ = tokio::time::sleep_until(grace_end.unwrap_or(deadline)), if grace_end.is_some() && !killed => {
                killed = true;
                kernel.kill().await;
            }
            // Killed, but init never reported the end (see backend::ANSWER_TIMEOUT).
            _ = tokio::time::sleep_until(grace_end.unwrap_or(deadline) + crate::backend::ANSWER_TIMEOUT), if killed => {
                died = Some(crate::backend::not_answering().to_string());
            }
        }
    }
    if let Some(how) = died {
        let value = if killed {
            format!(
                "the code did not stop within {} s of its interrupt at the timeout, so its \
                 kernel was killed: the context's state is lost, and the next call starts a \
                 fresh kernel",
                INTERRUPT_GRACE.as_secs()
            )
        } else {
            format!(
                "the context's kernel ended while it ran ({how}): its state is lost, and the \
                 next call starts a fresh kernel"
            )
        };
        sink.error("KernelDied", value).await;
        context.set_kernel(&mut slot, None);
        end.execution_count = n;
    }
    end.duration_ms = started.elapsed().as_millis() as u64;
    end
}

/// A kernel's event as the caller gets it; `None` for what is not one.
fn to_event(event: serde_json::Value) -> Option<CodeEvent> {
    let text = |key: &str| event[key].as_str().unwrap_or_default().to_string();
    Some(match event["type"].as_str()? {
        "stdout" => CodeEvent::Stdout(text("text")),
        "stderr" => CodeEvent::Stderr(text("text")),
        "result" => CodeEvent::Result(CodeResult {
            data: event["data"].as_object()?.clone(),
            main: event["main"].as_bool().unwrap_or(false),
        }),
        "error" => CodeEvent::Error(CodeError {
            name: text("name"),
            value: text("value"),
            traceback: text("traceback"),
        }),
        _ => return None,
    })
}

/// [`run_code`], collected into one answer: output kept up to the daemon's
/// --output-limit per stream.
pub async fn run_code_summary(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: RunCode,
) -> Result<CodeSummary, ApiError> {
    use futures_util::StreamExt;
    let context_id = request
        .context_id
        .clone()
        .unwrap_or_else(|| DEFAULT_CONTEXT.into());
    let events = run_code(state, caller, id, request).await?;
    let mut summary = Summary::new(state.output_limit_bytes() as usize, context_id);
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        summary.add(event);
    }
    Ok(summary.0)
}

struct Summary(CodeSummary, usize, usize);

impl Summary {
    fn new(limit: usize, context_id: String) -> Summary {
        Summary(
            CodeSummary {
                stdout: String::new(),
                stderr: String::new(),
                stdout_truncated: false,
                stderr_truncated: false,
                results: Vec::new(),
                results_truncated: false,
                error: None,
                context_id,
                execution_count: 0,
                timed_out: false,
                duration_ms: 0,
            },
            limit,
            0,
        )
    }

    fn add(&mut self, event: CodeEvent) {
        let limit = self.1;
        let s = &mut self.0;
        match event {
            CodeEvent::Stdout(text) => keep(&mut s.stdout, &mut s.stdout_truncated, &text, limit),
            CodeEvent::Stderr(text) => keep(&mut s.stderr, &mut s.stderr_truncated, &text, limit),
            CodeEvent::Result(result) => {
                let size: usize = result
                    .data
                    .values()
                    .map(|v| v.as_str().map_or(64, str::len))
                    .sum();
                self.2 += size;
                match self.2 <= MAX_SUMMARY_RESULTS {
                    true => s.results.push(result),
                    false => s.results_truncated = true,
                }
            }
            // The first is the code's; any after it (the kernel's end) say more.
            CodeEvent::Error(error) => match &mut s.error {
                None => s.error = Some(error),
                Some(first) => {
                    first.value = format!("{}; then {}: {}", first.value, error.name, error.value)
                }
            },
            CodeEvent::End(end) => {
                s.context_id = end.context_id;
                s.execution_count = end.execution_count;
                s.timed_out = end.timed_out;
                s.duration_ms = end.duration_ms;
            }
        }
    }
}

/// Appends `text` to `kept` up to `limit` bytes, never splitting a character.
fn keep(kept: &mut String, truncated: &mut bool, text: &str, limit: usize) {
    let room = limit.saturating_sub(kept.len());
    if text.len() <= room {
        kept.push_str(text);
        return;
    }
    let mut cut = room;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    kept.push_str(&text[..cut]);
    *truncated = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_kept_to_the_limit_on_a_character_boundary() {
        let (mut kept, mut truncated) = (String::new(), false);
        keep(&mut kept, &mut truncated, "ab", 3);
        assert!(!truncated);
        keep(&mut kept, &mut truncated, "é!", 3);
        assert_eq!(kept, "ab");
        assert!(truncated);
    }

    #[test]
    fn kernel_events_become_code_events_and_junk_does_not() {
        let event = |v: serde_json::Value| to_event(v);
        assert!(matches!(
            event(serde_json::json!({"type": "stdout", "text": "hi"})),
            Some(CodeEvent::Stdout(t)) if t == "hi"
        ));
        let result = event(serde_json::json!({"type": "result",
            "data": {"text/plain": "2"}, "main": true}));
        assert!(
            matches!(result, Some(CodeEvent::Result(r)) if r.main && r.data["text/plain"] == "2")
        );
        assert!(event(serde_json::json!({"type": "result", "data": 3})).is_none());
        assert!(event(serde_json::json!({"type": "ready"})).is_none());
    }

    #[test]
    fn a_summary_keeps_the_first_error_and_adds_what_followed() {
        let mut summary = Summary::new(10, "default".into());
        let error = |name: &str| {
            CodeEvent::Error(CodeError {
                name: name.into(),
                value: "v".into(),
                traceback: String::new(),
            })
        };
        summary.add(error("KeyboardInterrupt"));
        summary.add(error("KernelDied"));
        let kept = summary.0.error.unwrap();
        assert_eq!(kept.name, "KeyboardInterrupt");
        assert!(kept.value.contains("KernelDied"), "{}", kept.value);
    }
}
