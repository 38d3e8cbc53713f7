//! One-shot code execution, compatible with onyx python-sandbox's API:
//! `POST /v1/execute` and `POST /v1/execute/stream`.
//!
//! Each request runs in a fresh session (from the warm pool when one is ready) in
//! the image named by `--default-image`, which is deleted afterwards. The code runs
//! through `execute_driver.py` (notebook-style display of the last expression); the
//! files it creates or changes in its working directory are stored in the file
//! store, so they can be downloaded with `GET /v1/files/{id}`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use crate::audit;
use crate::auth::{Caller, Permit};
use crate::fault::{Error as ApiError, ErrorCode};
use crate::rootfs::{EntryKind, RootfsError, SandboxRoot};
use crate::sessions::exec::{self, Command, ExecResult, Stream};
use crate::sessions::files::{root_of, with_root, write_file};
use crate::sessions::{self, CreateSession, FileRef, Session};
use crate::state::AppState;

/// The driver, written into each sandbox next to the code (outside the working dir).
const DRIVER: &str = include_str!("execute_driver.py");
const DRIVER_PATH: &str = "/tmp/.brig/execute/driver.py";
const CODE_PATH: &str = "/tmp/.brig/execute/code.py";
/// onyx's default.
const DEFAULT_TIMEOUT_MS: u64 = 2000;
/// Most entries of the working directory compared before and after the run, and so
/// listed as its outputs.
const MAX_SCANNED: usize = 10_000;
/// How long listing and storing a run's outputs may take: its client waits for
/// them after the code has ended (onyx's gives up `timeout_ms / 1000 + 10` s after
/// sending the request, the run itself counted).
const COLLECT_TIME: Duration = Duration::from_secs(5);
/// Appended to an output stream cut at `--output-limit`, as onyx marks it.
const TRUNCATED: &str = "\n...[truncated]";

/// Code to run once, in a session of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExecuteRequest {
    pub code: String,
    pub stdin: Option<String>,
    /// Default 2000; at most the daemon's `--max-execute-timeout`.
    pub timeout_ms: Option<u64>,
    /// Print the value of a final expression, as in a notebook (default true).
    pub last_line_interactive: Option<bool>,
    /// Uploaded files to place in the working directory first.
    pub files: Option<Vec<FileRef>>,
}

/// A file or directory the code created or changed in its working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputFile {
    /// Relative to the working directory.
    pub path: String,
    /// "file" or "directory".
    pub kind: String,
    /// The stored file, for files; `None` for directories and for files that were
    /// not stored (a `brig: ...` line at the end of stderr says why).
    pub file_id: Option<String>,
}

/// A finished run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecuteResponse {
    pub stdout: String,
    pub stderr: String,
    /// `None` when the code was killed (timeout, memory).
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub files: Vec<OutputFile>,
}

/// How a streamed run ended (its output went out as [`ExecuteEvent::Output`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecuteResult {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub files: Vec<OutputFile>,
}

/// What a streamed run sends, in order: its output as it comes, then one
/// `Result` or `Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecuteEvent {
    /// Output text, cut at UTF-8 character boundaries.
    Output {
        stream: Stream,
        data: String,
    },
    Result(ExecuteResult),
    /// The run failed after the request was accepted.
    Error {
        message: String,
    },
}

/// Checks a request's values before anything is started (its files' paths are
/// checked after its files are found, in onyx's order).
fn validate(state: &AppState, request: &ExecuteRequest) -> Result<u64, ApiError> {
    let max = state.args.max_execute_timeout_ms;
    let timeout_ms = request.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms == 0 {
        return Err(ApiError::invalid("timeout_ms must be at least 1"));
    }
    if timeout_ms > max {
        return Err(ApiError::invalid(format!(
            "timeout_ms exceeds maximum of {max} ms (the daemon's --max-execute-timeout)"
        )));
    }
    Ok(timeout_ms)
}

/// Why a file's path cannot be placed in the working directory, in onyx's words
/// (its clients show them).
fn path_problem(path: &str) -> Option<&'static str> {
    if path.starts_with('/') {
        return Some("File paths must be relative.");
    }
    if path.split('/').any(|part| part == "..") {
        return Some("File paths must not contain '..'.");
    }
    if path.split('/').all(|part| part.is_empty() || part == ".") {
        return Some("File path must not be empty.");
    }
    if path.contains('\0') {
        return Some("File paths must not contain NUL characters.");
    }
    None
}

/// Why the daemon's `--default-image` cannot run code, if it cannot: an image that
/// is not in the store, or not a root filesystem. Blocking (it reads the store).
pub fn default_image_problem(store: &std::path::Path, name: &str) -> Option<String> {
    if name == "host" {
        return None;
    }
    let build = if name == "python" {
        "build it with `brig image build python -f images/python.toml`".to_string()
    } else {
        format!("build or import it (`brig image build {name} -f RECIPE`)")
    };
    let record = match brig_image::store::Store::at(store).image(name) {
        Ok(record) => record,
        Err(brig_image::ImageError::NoSuchImage(_)) => {
            return Some(format!(
                "the daemon's default image '{name}' (--default-image) is not in its image \
                 store: {build}, or start the daemon with `--default-image host` (the host's \
                 python3)"
            ))
        }
        // Anything else (a damaged record) is the launch's to report, as for any image.
        Err(_) => return None,
    };
    record
        .check_root()
        .err()
        .map(|e| format!("the daemon's default image (--default-image) cannot run code: {e}"))
}

/// Everything about a request that can be refused before it is answered, so that
/// the stream refuses with a status, as the plain route does, and never answers
/// 200 with only an `error` event: bad values (422), the default image missing
/// (503: the operator's to fix, not an unknown id of the client's), unknown files
/// (404).
async fn precheck(
    state: &AppState,
    caller: &Caller,
    request: &ExecuteRequest,
) -> Result<u64, ApiError> {
    let timeout_ms = validate(state, request)?;
    ready(state, caller, request.files.as_deref().unwrap_or_default()).await?;
    Ok(timeout_ms)
}

/// The default image is there to run in and `files` can be placed in the working
/// directory: what a run of code, or a session made for code
/// ([`crate::execute_session`]), is refused for before anything is made.
pub(crate) async fn ready(
    state: &AppState,
    caller: &Caller,
    files: &[FileRef],
) -> Result<(), ApiError> {
    if let Some(problem) = state.default_image_build.problem(&state.args.default_image) {
        return Err(ApiError::unavailable(problem));
    }
    let (store, name) = (state.args.store.clone(), state.args.default_image.clone());
    let problem = tokio::task::spawn_blocking(move || default_image_problem(&store, &name))
        .await
        .map_err(ApiError::internal)?;
    if let Some(problem) = problem {
        return Err(ApiError::unavailable(problem));
    }
    for file in files {
        crate::filestore::open(state, &caller.tenant, &file.file_id)
            .await
            .map_err(|e| match e.code {
                ErrorCode::NotFound => ApiError::not_found(format!(
                    "File with ID '{}' not found for path '{}'.",
                    file.file_id, file.path
                )),
                _ => e,
            })?;
    }
    for file in files {
        if let Some(problem) = path_problem(&file.path) {
            return Err(ApiError::invalid(problem));
        }
        sessions::workspace_path(&file.path, "/workspace")?;
    }
    Ok(())
}

/// The image argument of a session in the daemon's default image ("host": none,
/// the host's read-only system dirs and its python3).
pub(crate) fn default_image(state: &AppState) -> Option<String> {
    (state.args.default_image != "host").then(|| state.args.default_image.clone())
}

/// What the working directory held: path -> (is dir, size, mtime).
type Listing = BTreeMap<String, (bool, u64, i64)>;

/// Why a listing of the working directory stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// [`MAX_SCANNED`] entries, or a directory of more than a listing takes.
    Entries,
    /// [`COLLECT_TIME`] spent.
    Time,
}

fn scan(root: &SandboxRoot, cwd: &str, deadline: Instant) -> (Listing, Option<Cut>) {
    let mut listing = Listing::new();
    let mut pending = vec![String::new()];
    while let Some(relative) = pending.pop() {
        if Instant::now() >= deadline {
            return (listing, Some(Cut::Time));
        }
        let dir = if relative.is_empty() {
            cwd.to_string()
        } else {
            format!("{cwd}/{relative}")
        };
        let entries = match root.list_dir(&dir) {
            Ok(entries) => entries,
            Err(RootfsError::TooLarge(_)) => return (listing, Some(Cut::Entries)),
            // Gone, or not the sandbox user's to read: not an output it can have made.
            Err(_) => continue,
        };
        for entry in entries {
            if listing.len() >= MAX_SCANNED {
                return (listing, Some(Cut::Entries));
            }
            let path = if relative.is_empty() {
                entry.name.clone()
            } else {
                format!("{relative}/{}", entry.name)
            };
            match entry.kind {
                EntryKind::Directory => {
                    listing.insert(path.clone(), (true, 0, entry.modified_ns()));
                    pending.push(path);
                }
                EntryKind::File => {
                    listing.insert(path, (false, entry.size_bytes, entry.modified_ns()));
                }
                _ => {}
            }
        }
    }
    (listing, None)
}

/// Runs the code in a session of its own, deleted after; the answer comes with the
/// exec's slot, for it to hold until it is sent (see `exec::run_holding`).
async fn run(
    state: &AppState,
    caller: &Caller,
    request: &ExecuteRequest,
    chunks: Option<exec::Chunks>,
) -> Result<(ExecuteResponse, Permit), ApiError> {
    let timeout_ms = precheck(state, caller, request).await?;
    let session = sessions::create(
        state,
        caller,
        CreateSession {
            image: default_image(state),
            files: request.files.clone(),
            // A backstop: the session is deleted right after the run.
            ttl_seconds: Some(timeout_ms / 1000 + 300),
            ..Default::default()
        },
    )
    .await?;
    let result = run_in(state, &session, request, timeout_ms, chunks).await;
    let cleanup_state = state.clone();
    tokio::spawn(async move {
        let _ = sessions::delete(&cleanup_state, &session).await;
    });
    result
}

async fn run_in(
    state: &AppState,
    session: &Arc<Session>,
    request: &ExecuteRequest,
    timeout_ms: u64,
    chunks: Option<exec::Chunks>,
) -> Result<(ExecuteResponse, Permit), ApiError> {
    let cwd = session.sandbox().facts().cwd.clone();
    let code = request.code.clone();
    let scan_cwd = cwd.clone();
    let before = with_root(session, move |root| {
        write_file(&root, DRIVER_PATH, DRIVER.as_bytes())?;
        write_file(&root, CODE_PATH, code.as_bytes())?;
        Ok(scan(&root, &scan_cwd, Instant::now() + COLLECT_TIME).0)
    })
    .await?;

    let mut env = BTreeMap::new();
    env.insert("MPLBACKEND".to_string(), "Agg".to_string());
    let interactive = if request.last_line_interactive.unwrap_or(true) {
        "1"
    } else {
        "0"
    };
    let command = Command {
        argv: vec![
            "python3".into(),
            "-u".into(),
            DRIVER_PATH.into(),
            CODE_PATH.into(),
            interactive.into(),
        ],
        env: exec::merged_env(session, Some(&env))?,
        cwd: cwd.clone(),
        stdin: request.stdin.clone().map(String::into_bytes),
        timeout: std::time::Duration::from_millis(timeout_ms),
    };
    // The notes at the end go the way the output went.
    let notes_to = chunks.clone();
    let (result, slot) = exec::run_holding(state, session, command, chunks).await?;
    let (files, mut notes) = collect_outputs(state, session, &cwd, &before).await?;
    if result.oom_killed {
        let limit = session
            .limits
            .memory_bytes
            .map(|bytes| format!(" (limit {} MiB)", bytes >> 20))
            .unwrap_or_default();
        notes.insert(0, format!("killed: out of memory{limit}"));
    }
    if result.file_locks_exceeded {
        let budget = session.limits.file_lock_budget().unwrap_or(0);
        notes.insert(
            0,
            format!(
                "killed: held more than {budget} file locks (one per 4 KiB of the memory limit)"
            ),
        );
    }
    let limit = state.args.output_limit_bytes;
    for (cut, name) in [
        (result.stderr_truncated, "stderr"),
        (result.stdout_truncated, "stdout"),
    ] {
        if cut {
            notes.insert(
                0,
                format!("{name} was cut at {limit} bytes (--output-limit)"),
            );
        }
    }
    let (stdout_tail, stderr_tail) = tails(&result, &notes);
    if let Some(chunks) = &notes_to {
        for (stream, tail) in [
            (Stream::Stdout, &stdout_tail),
            (Stream::Stderr, &stderr_tail),
        ] {
            if !tail.is_empty() {
                let _ = chunks.send((stream, tail.clone().into_bytes())).await;
            }
        }
    }
    let response = ExecuteResponse {
        stdout: result.stdout + &stdout_tail,
        stderr: result.stderr + &stderr_tail,
        exit_code: result.exit_code,
        timed_out: result.timed_out,
        duration_ms: result.duration_ms,
        files,
    };
    Ok((response, slot))
}

/// What is appended to a run's stdout and stderr: [`TRUNCATED`] after a stream
/// that was cut, and on stderr a line `brig: NOTE` per note, which says what the
/// result alone would not (as `brig run` does): why the code was killed, why
/// output files were not stored, or not all listed.
fn tails(result: &ExecResult, notes: &[String]) -> (String, String) {
    let mut stdout = String::new();
    if result.stdout_truncated {
        stdout.push_str(TRUNCATED);
    }
    let mut stderr = String::new();
    if result.stderr_truncated {
        stderr.push_str(TRUNCATED);
    }
    if !notes.is_empty() {
        let ends_a_line = if stderr.is_empty() {
            result.stderr.is_empty() || result.stderr.ends_with('\n')
        } else {
            false
        };
        if !ends_a_line {
            stderr.push('\n');
        }
        for note in notes {
            stderr.push_str(&format!("brig: {note}\n"));
        }
    }
    (stdout, stderr)
}

/// Why an output file has no `file_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum NotStored {
    TooLarge,
    NoRoom,
    Unreadable,
    NoTime,
}

/// Lists the files and directories the code created or changed in `cwd`, storing
/// the files (in one batch, so thousands of them cost one transaction, not one
/// each), and notes on what was not stored or listed. Bounded in entries and time
/// ([`MAX_SCANNED`], [`COLLECT_TIME`]). A file that cannot be stored is listed
/// without a `file_id`: the code has run, and its output, exit code and other files
/// must not be lost to one file (a client retrying would run it again).
async fn collect_outputs(
    state: &AppState,
    session: &Arc<Session>,
    cwd: &str,
    before: &Listing,
) -> Result<(Vec<OutputFile>, Vec<String>), ApiError> {
    let deadline = Instant::now() + COLLECT_TIME;
    let scan_cwd = cwd.to_string();
    let (after, cut) = with_root(session, move |root| Ok(scan(&root, &scan_cwd, deadline))).await?;
    let mut files = Vec::new();
    let mut wanted = Vec::new();
    for (path, (is_dir, size, mtime)) in after {
        if before.get(&path) == Some(&(is_dir, size, mtime)) {
            continue;
        }
        if is_dir {
            if !before.contains_key(&path) {
                files.push(OutputFile {
                    path,
                    kind: "directory".into(),
                    file_id: None,
                });
            }
            continue;
        }
        wanted.push(files.len());
        files.push(OutputFile {
            path,
            kind: "file".into(),
            file_id: None,
        });
    }

    // Read as the daemon: the blobs go to its own store. `rootfs` checks what the
    // sandbox's user may read itself.
    let root = Arc::new(root_of(session)?);
    let paths: Vec<String> = wanted.iter().map(|&i| files[i].path.clone()).collect();
    let (task_state, tenant, cwd) = (state.clone(), session.tenant.clone(), cwd.to_string());
    // Files the quota has no room for are not copied at all: a sparse file costs
    // its writer next to nothing, and its copy would be written in full.
    let mut room = if paths.is_empty() {
        0
    } else {
        crate::filestore::disk_room(state, &session.tenant).await?.0
    };
    let taken = tokio::task::spawn_blocking(move || {
        let mut taken = Vec::with_capacity(paths.len());
        for path in paths {
            if Instant::now() >= deadline {
                taken.push(Err(NotStored::NoTime));
                continue;
            }
            let (mut file, meta) = match root.open_read(&format!("{cwd}/{path}")) {
                Ok(opened) => opened,
                Err(_) => {
                    taken.push(Err(NotStored::Unreadable));
                    continue;
                }
            };
            if meta.size_bytes > task_state.args.max_file_size_bytes {
                taken.push(Err(NotStored::TooLarge));
                continue;
            }
            if crate::db::charged_file_bytes(meta.size_bytes) > room {
                taken.push(Err(NotStored::NoRoom));
                continue;
            }
            let name = path.rsplit('/').next().unwrap_or(&path);
            match crate::filestore::take_blob(&task_state, &tenant, name, &mut file) {
                Ok(blob) => {
                    room = room.saturating_sub(crate::db::charged_file_bytes(blob.size_bytes()));
                    taken.push(Ok(blob))
                }
                Err(e) if e.code == ErrorCode::PayloadTooLarge => {
                    taken.push(Err(NotStored::TooLarge))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(taken)
    })
    .await
    .map_err(ApiError::internal)??;

    let mut outcomes: Vec<Result<(), NotStored>> = Vec::with_capacity(taken.len());
    let mut blobs = Vec::new();
    for blob in taken {
        match blob {
            Ok(blob) => {
                outcomes.push(Ok(()));
                blobs.push(blob);
            }
            Err(why) => outcomes.push(Err(why)),
        }
    }
    let mut recorded = crate::filestore::record_blobs(state, &session.tenant, blobs)
        .await?
        .into_iter();
    let mut not_stored: BTreeMap<NotStored, (usize, String)> = BTreeMap::new();
    for (&index, outcome) in wanted.iter().zip(outcomes) {
        let outcome = match outcome {
            Ok(()) => match recorded.next().flatten() {
                Some(meta) => {
                    files[index].file_id = Some(meta.file_id);
                    continue;
                }
                None => NotStored::NoRoom,
            },
            Err(why) => why,
        };
        let entry = not_stored
            .entry(outcome)
            .or_insert_with(|| (0, files[index].path.clone()));
        entry.0 += 1;
    }

    let mut notes = Vec::new();
    for (why, (count, first)) in not_stored {
        let which = if count == 1 {
            format!("output file {first} was")
        } else {
            format!("{count} output files ({first}, ...) were")
        };
        let reason = match why {
            NotStored::TooLarge => format!(
                "over the daemon's --max-file-size ({} bytes)",
                state.args.max_file_size_bytes
            ),
            NotStored::NoRoom => format!(
                "over the tenant's disk quota (max_disk_bytes; GET /v1/tenants/{} shows \
                 what counts)",
                session.tenant
            ),
            NotStored::Unreadable => "gone, or not readable by the sandbox's user".to_string(),
            NotStored::NoTime => format!(
                "not stored within {} s, the time outputs are given",
                COLLECT_TIME.as_secs()
            ),
        };
        notes.push(format!("{which} not stored ({reason}); file_id is null"));
    }
    match cut {
        Some(Cut::Entries) => notes.push(format!(
            "output files: only the first {MAX_SCANNED} entries of the working directory \
             were compared; more may have changed"
        )),
        Some(Cut::Time) => notes.push(format!(
            "output files: the working directory was not all compared within {} s; \
             more may have changed",
            COLLECT_TIME.as_secs()
        )),
        None => {}
    }
    Ok((files, notes))
}

/// Runs `request`'s code in a fresh session and gives back its result, with the
/// exec's slot for the answer to hold until it is sent (see
/// `exec::run_holding`). Audited as `execute`.
pub async fn execute(
    state: &AppState,
    caller: &Caller,
    request: ExecuteRequest,
) -> Result<(ExecuteResponse, Permit), ApiError> {
    // In its own task, audit included: a client that hangs up must not leave a
    // session half made, nor a run unrecorded. The run is short (its timeout is
    // capped by --max-execute-timeout) and cleans up after itself.
    let (state, caller) = (state.clone(), caller.clone());
    tokio::spawn(async move {
        let result = run(&state, &caller, &request, None).await;
        audit_execute(&state, &caller, &request, result.as_ref().map(|(r, _)| r)).await;
        result
    })
    .await
    .map_err(ApiError::internal)?
}

async fn audit_execute(
    state: &AppState,
    caller: &Caller,
    request: &ExecuteRequest,
    result: Result<&ExecuteResponse, &ApiError>,
) {
    let (outcome, detail) = match result {
        Ok(r) => (
            "ok",
            serde_json::json!({"code": request.code, "exit_code": r.exit_code,
                "timed_out": r.timed_out, "duration_ms": r.duration_ms, "files": r.files.len()}),
        ),
        Err(e) => (
            e.code.as_str(),
            serde_json::json!({"code": request.code, "error": e.message}),
        ),
    };
    audit::record(state, caller, None, "execute", detail, outcome).await;
}

/// [`execute`], its output streamed as it comes. Everything that can be refused
/// before the run is refused here, as an error; once the stream is given, a failure
/// is its last event. The stream holds the exec's slot until it is dropped.
/// Audited as `execute`.
pub async fn execute_stream(
    state: &AppState,
    caller: &Caller,
    request: ExecuteRequest,
) -> Result<impl futures_util::Stream<Item = ExecuteEvent> + Send + 'static, ApiError> {
    use futures_util::StreamExt;
    precheck(state, caller, &request).await?;
    let (events_tx, events_rx) = mpsc::channel::<ExecuteEvent>(64);
    let (chunks_tx, mut chunks_rx) = mpsc::channel::<(Stream, Vec<u8>)>(64);
    let (task_state, caller) = (state.clone(), caller.clone());
    let (slot, held) = exec::held_slot();
    let runner = tokio::spawn(async move {
        let result = run(&task_state, &caller, &request, Some(chunks_tx))
            .await
            .map(|(response, permit)| slot.keep(permit, response));
        audit_execute(&task_state, &caller, &request, result.as_ref()).await;
        result
    });
    tokio::spawn(async move {
        let mut text = [exec::Utf8Chunker::default(), exec::Utf8Chunker::default()];
        while let Some((stream, bytes)) = chunks_rx.recv().await {
            let data = text[stream as usize].push(&bytes);
            if !data.is_empty() {
                let _ = events_tx.send(ExecuteEvent::Output { stream, data }).await;
            }
        }
        for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let data = text[i].flush();
            if !data.is_empty() {
                let _ = events_tx.send(ExecuteEvent::Output { stream, data }).await;
            }
        }
        let last = match runner.await {
            Ok(Ok(r)) => ExecuteEvent::Result(ExecuteResult {
                exit_code: r.exit_code,
                timed_out: r.timed_out,
                duration_ms: r.duration_ms,
                files: r.files,
            }),
            Ok(Err(e)) => ExecuteEvent::Error { message: e.message },
            Err(e) => ExecuteEvent::Error {
                message: e.to_string(),
            },
        };
        let _ = events_tx.send(last).await;
    });
    Ok(
        tokio_stream::wrappers::ReceiverStream::new(events_rx).map(move |event| {
            let _held = &held;
            event
        }),
    )
}
