//! Background processes in a session: start, list, read or stream output, write
//! stdin, signal, wait.
//!
//! A background process's stdout and stderr go to files inside the sandbox
//! (`/tmp/.brig/jobs/<id>.out` and `.err`), opened by the daemon through the
//! sandbox's root and passed to init. So output counts against the session's own
//! disk limit (a flood cannot fill the host), and it survives a daemon restart: the
//! files and the process live on in the sandbox, and init keeps each job's exit
//! status for the next daemon to ask. Only stdin (a pipe held by the daemon) ends
//! with the daemon.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use brig_jail::agent::{AgentReply, AgentRequest, JobExit};

use super::exec::{init_not_answering, pipe, sandbox_gone, Command, ExecRequest, Stream};
use super::files::{root_of, rootfs_error, with_root};
use super::{ensure_not_deleted, ensure_running, lookup, Session};
use crate::audit;
use crate::auth::Caller;
use crate::backend::{Link, ANSWER_TIMEOUT};
use crate::db::{NewProcessRow, ProcessRow};
use crate::fault::{Error as ApiError, ErrorCode};
use crate::state::AppState;

/// Where background output lives inside the sandbox.
pub const JOBS_DIR: &str = "/tmp/.brig/jobs";
/// How often a streamed process's output files are checked for new data.
const TAIL_INTERVAL: Duration = Duration::from_millis(50);
/// The most a single output request returns.
const MAX_OUTPUT_READ: u64 = 16 << 20;
/// The most output one followed event carries: with [`STREAM_QUEUE`] events queued a
/// stream holds little for a client that reads slowly, and no event takes long to
/// encode (JSON escaping can make it 6 times larger).
const STREAM_CHUNK: u64 = 64 << 10;
/// Events a process's stream builds ahead of its client.
const STREAM_QUEUE: usize = 4;

/// A background process to start: `argv` or `cmd`, as for an exec.
#[derive(Debug, Clone, Default)]
pub struct StartProcess {
    pub argv: Option<Vec<String>>,
    pub cmd: Option<String>,
    pub cwd: Option<String>,
    pub env: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Clone)]
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
    /// Its pid in the sandbox's pid namespace: known to the start that made it
    /// (not kept: a list or get gives `None`).
    pub sandbox_pid: Option<i32>,
}

/// What following a process's output ([`follow`]) yields: its output from the
/// offsets asked, then its end.
#[derive(Debug, Clone)]
pub enum ProcessEvent {
    /// Output from the file, never splitting a character (text of a partial
    /// character waits for the rest, so it can be empty).
    Output(Stream, String),
    /// The process has ended and all its output was given.
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

/// Where in each output to start following a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Offsets {
    pub stdout: u64,
    pub stderr: u64,
}

/// A process's output file inside the sandbox; `tag` is chosen before the process
/// exists (its id comes from init when it starts).
fn output_path(tag: &str, stream: &str) -> String {
    let ext = if stream == "stderr" { "err" } else { "out" };
    format!("{JOBS_DIR}/{tag}.{ext}")
}

/// Creates an output file owned by the sandbox's user and keeps it open.
fn create_output(
    root: &crate::rootfs::SandboxRoot,
    path: &str,
) -> Result<std::fs::File, crate::rootfs::RootfsError> {
    let mut writer = root.create_write(path, true)?;
    let file = writer
        .file()
        .try_clone()
        .map_err(|source| crate::rootfs::RootfsError::Io {
            context: format!("open {path}"),
            source,
        })?;
    writer.commit()?;
    Ok(file)
}

/// Starts a background process in session `id`; audited as `process.start`.
pub async fn start(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: &StartProcess,
) -> Result<ProcessInfo, ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        ensure_running(&session)?;
        let _gate = session.gate.read().await;
        ensure_not_deleted(&session)?;
        start_in(state, &session, request).await
    }
    .await;
    let outcome = audit::outcome(&result);
    let detail = serde_json::json!({"argv": request.argv, "cmd": request.cmd,
        "process_id": result.as_ref().ok().map(|p| p.process_id)});
    audit::record(state, caller, Some(id), "process.start", detail, outcome).await;
    result
}

async fn start_in(
    state: &AppState,
    session: &Arc<Session>,
    request: &StartProcess,
) -> Result<ProcessInfo, ApiError> {
    let exec = ExecRequest {
        argv: request.argv.clone(),
        cmd: request.cmd.clone(),
        cwd: request.cwd.clone(),
        env: request.env.clone(),
        ..Default::default()
    };
    let command = Command::from_request(state, session, &exec)?;
    let permit = state.auth.process_permit(&session.tenant)?;
    let tag = crate::auth::random_hex(8);
    let (out_path, err_path) = (output_path(&tag, "stdout"), output_path(&tag, "stderr"));
    let paths = (out_path.clone(), err_path.clone());
    let (out, err) = with_root(session, move |root| {
        let out = create_output(&root, &paths.0).map_err(rootfs_error)?;
        let err = create_output(&root, &paths.1).map_err(rootfs_error)?;
        Ok((out, err))
    })
    .await?;
    let (stdin_r, stdin_w) = pipe()?;
    let sandbox = session.sandbox();
    let mut agent = sandbox.connect().map_err(sandbox_gone)?;
    let request = AgentRequest::Exec {
        argv: command.argv.clone(),
        env: command.env,
        cwd: command.cwd,
        // A background process outlives the request that started it.
        bound: false,
    };
    let started = tokio::time::timeout(ANSWER_TIMEOUT, async {
        let stdio = [stdin_r.as_fd(), out.as_fd(), err.as_fd()];
        agent.send(&request, &stdio).await?;
        agent.recv().await
    })
    .await;
    drop((stdin_r, out, err));
    let reply = match started {
        Ok(reply) => reply.map_err(sandbox_gone)?.0,
        Err(_) => return Err(init_not_answering(ANSWER_TIMEOUT)),
    };
    let (job, sandbox_pid, failed) = match reply {
        AgentReply::Started { job, pid } => (Some(job), Some(pid), None),
        AgentReply::ExecFailed { message, exit_code } => (None, None, Some((message, exit_code))),
        AgentReply::Error { message } => return Err(ApiError::invalid(message)),
        other => {
            return Err(ApiError::internal(format!(
                "unexpected agent reply {other:?}"
            )))
        }
    };
    let Some(job) = job else {
        let _ = with_root(session, move |root| {
            let _ = root.remove(&out_path, false);
            let _ = root.remove(&err_path, false);
            Ok(())
        })
        .await;
        let (message, code) = failed.unwrap_or_default();
        return Err(ApiError::invalid(format!("{message} (exit code {code})")));
    };
    let process_id = sandbox.facts().process_id(job);
    let stdin =
        tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w).map_err(ApiError::internal)?;
    session
        .stdin
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(process_id, stdin);
    let started_at = crate::db::now_rfc3339();
    let row = NewProcessRow {
        session_id: session.id.clone(),
        id: process_id.to_string(),
        tenant: session.tenant.clone(),
        argv: serde_json::to_string(&command.argv).unwrap_or_default(),
        started_at: started_at.clone(),
        output: tag,
    };
    state.db.insert_process(row).await?;
    watch(state, session, process_id, Some(agent), permit);
    Ok(ProcessInfo {
        process_id,
        argv: command.argv,
        state: "running".into(),
        exit_code: None,
        signal: None,
        started_at,
        ended_at: None,
        stdout_bytes: 0,
        stderr_bytes: 0,
        sandbox_pid,
    })
}

/// Records the process's end when it comes: on the connection that started it, or
/// (after a daemon restart) by asking init to `wait`.
/// Waits for a background process's exit and records it; `permit` counts the
/// process (and the descriptors it holds) until then.
pub fn watch(
    state: &AppState,
    session: &std::sync::Arc<Session>,
    process_id: u64,
    agent: Option<Box<dyn Link>>,
    permit: crate::auth::Permit,
) {
    let state = state.clone();
    let session = session.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let exit = match agent {
            Some(mut agent) => wait_on(&mut *agent).await,
            None => {
                let sandbox = session.sandbox();
                let Some(job) = sandbox.facts().job(process_id) else {
                    record_exit(&state, &session, process_id, KILLED).await;
                    return;
                };
                match sandbox.connect() {
                    Ok(mut agent) => {
                        if agent.send(&AgentRequest::Wait { job }, &[]).await.is_err() {
                            return;
                        }
                        match wait_reply(&mut *agent).await {
                            JobWait::Exited(exit) => Some(exit),
                            // Init no longer knows the job (it keeps the ends of
                            // finished ones only so long): ended, how unknown.
                            JobWait::Unknown => Some(UNKNOWN_END),
                            JobWait::Lost => None,
                        }
                    }
                    Err(_) => return,
                }
            }
        };
        if let Some(exit) = exit {
            record_exit(&state, &session, process_id, exit).await;
        }
    });
}

/// How a process ended whose end init no longer knows.
const UNKNOWN_END: JobExit = JobExit {
    code: None,
    signal: None,
};

/// How a process of a sandbox that a restore replaced ended: killed with it.
const KILLED: JobExit = JobExit {
    code: None,
    signal: Some(libc::SIGKILL),
};

/// The process id a restore's new sandbox numbers its processes after: the highest
/// the session has used (its rows stay while it lives), never below the current
/// sandbox's own base.
pub async fn next_base(state: &AppState, session: &Session) -> Result<u64, ApiError> {
    let highest = state.db.highest_process_id(&session.id).await?;
    Ok(highest.max(session.sandbox().facts().process_base))
}

/// Once a restore has replaced the sandbox: the processes of the old one were
/// killed with it. Their watchers see only their connection close (no exit
/// status), so their rows are ended here, and their stdin pipes dropped. A failure
/// is only logged: the restore is done, and `wait` ends such a row by itself.
pub async fn end_replaced(state: &AppState, session: &Session, base: u64) {
    session
        .stdin
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|process_id, _| *process_id > base);
    let ended = state
        .db
        .end_processes_through(&session.id, base, KILLED.signal)
        .await;
    if let Err(e) = ended {
        tracing::warn!(session = %session.id, "cannot end the processes of the replaced sandbox: {}", e.message);
    }
}

async fn wait_on(agent: &mut dyn Link) -> Option<JobExit> {
    match wait_reply(agent).await {
        JobWait::Exited(exit) => Some(exit),
        JobWait::Unknown | JobWait::Lost => None,
    }
}

/// What init answers to a `wait` (or a start) on one connection.
enum JobWait {
    Exited(JobExit),
    /// Init refused it: a job it does not know.
    Unknown,
    /// The connection ended first: the sandbox is gone or replaced.
    Lost,
}

async fn wait_reply(agent: &mut dyn Link) -> JobWait {
    loop {
        match agent.recv().await {
            Ok((AgentReply::Exited { exit, .. }, _)) => return JobWait::Exited(exit),
            Ok((AgentReply::Error { .. }, _)) => return JobWait::Unknown,
            Err(_) => return JobWait::Lost,
            Ok(_) => continue,
        }
    }
}

async fn record_exit(state: &AppState, session: &Session, job: u64, exit: JobExit) {
    session
        .stdin
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&job);
    let _ = state
        .db
        .end_process(&session.id, &job.to_string(), exit.code, exit.signal)
        .await;
    session.process_ended.notify_waiters();
}

/// After a restart: watch every process the previous daemon left running.
pub async fn rewatch(state: &AppState, session: &std::sync::Arc<Session>) {
    let jobs = state
        .db
        .running_process_ids(&session.id)
        .await
        .unwrap_or_default();
    for job in jobs.iter().filter_map(|j| j.parse().ok()) {
        let permit = state.auth.running_process(&session.tenant);
        watch(state, session, job, None, permit);
    }
}

/// A process as stored, with the tag of its output files.
struct Loaded {
    info: ProcessInfo,
    tag: String,
}

async fn load(
    state: &AppState,
    session: &Session,
    job: Option<u64>,
) -> Result<Vec<Loaded>, ApiError> {
    let rows = state.db.processes(&session.id, job).await?;
    let root = root_of(session).ok();
    let mut list = Vec::with_capacity(rows.len());
    for ProcessRow {
        id,
        argv,
        started_at,
        ended_at,
        exit_code,
        signal,
        output: tag,
    } in rows
    {
        let process_id: u64 = id.parse().unwrap_or(0);
        let tag = tag.unwrap_or_default();
        let size = |stream: &str| {
            root.as_ref()
                .and_then(|r| r.open_read(&output_path(&tag, stream)).ok())
                .map_or(0, |(_, meta)| meta.size_bytes)
        };
        let info = ProcessInfo {
            process_id,
            argv: serde_json::from_str(&argv).unwrap_or_default(),
            state: if ended_at.is_some() {
                "exited"
            } else {
                "running"
            }
            .into(),
            exit_code,
            signal,
            started_at,
            ended_at,
            stdout_bytes: size("stdout"),
            stderr_bytes: size("stderr"),
            sandbox_pid: None,
        };
        list.push(Loaded { info, tag });
    }
    Ok(list)
}

async fn load_one(state: &AppState, session: &Session, job: u64) -> Result<Loaded, ApiError> {
    load(state, session, Some(job))
        .await?
        .pop()
        .ok_or_else(|| ApiError::not_found(format!("no process {job} in session {}", session.id)))
}

/// The processes of session `id`, oldest first.
pub async fn list(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Vec<ProcessInfo>, ApiError> {
    let session = lookup(state, caller, id)?;
    Ok(load(state, &session, None)
        .await?
        .into_iter()
        .map(|p| p.info)
        .collect())
}

/// Process `pid` of session `id`.
pub async fn get(
    state: &AppState,
    caller: &Caller,
    id: &str,
    pid: u64,
) -> Result<ProcessInfo, ApiError> {
    let session = lookup(state, caller, id)?;
    Ok(load_one(state, &session, pid).await?.info)
}

fn stream_name(stream: Option<&str>) -> Result<&'static str, ApiError> {
    match stream.unwrap_or("stdout") {
        "stdout" => Ok("stdout"),
        "stderr" => Ok("stderr"),
        other => Err(ApiError::invalid(format!(
            "stream must be stdout or stderr, not {other:?}"
        ))),
    }
}

/// Process `pid`'s output (`stream`: "stdout", the default, or "stderr") from
/// `offset`, at most 16 MiB of it; `None` when there is nothing there.
pub async fn output(
    state: &AppState,
    caller: &Caller,
    id: &str,
    pid: u64,
    stream: Option<&str>,
    offset: u64,
) -> Result<Option<impl tokio::io::AsyncRead + Send + Unpin + 'static>, ApiError> {
    let session = lookup(state, caller, id)?;
    let tag = load_one(state, &session, pid).await?.tag;
    let stream = stream_name(stream)?;
    let root = root_of(&session)?;
    // Read as the caller takes it (up to 16 MiB): read into memory first, each
    // unread answer held its 16 MiB for as long as its connection lasted.
    let file = tokio::task::spawn_blocking(move || open_at(&root, &tag, stream, offset))
        .await
        .map_err(ApiError::internal)??;
    Ok(file.map(|file| {
        use tokio::io::AsyncReadExt;
        tokio::fs::File::from_std(file).take(MAX_OUTPUT_READ)
    }))
}

/// A process's output file, positioned at `offset`; `None` if it has none yet, or
/// nothing at or past `offset`.
fn open_at(
    root: &crate::rootfs::SandboxRoot,
    tag: &str,
    stream: &str,
    offset: u64,
) -> Result<Option<std::fs::File>, ApiError> {
    let (mut file, _) = match root.open_read(&output_path(tag, stream)) {
        Ok(found) => found,
        Err(crate::rootfs::RootfsError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(super::files::rootfs_error(e)),
    };
    // Nothing to read there yet, and not asked of the kernel: it refuses a seek past
    // i64::MAX, and a read where offset + length would pass it (EINVAL), which made
    // an offset a client chose a 500, or a body cut short.
    let len = file.metadata().map_err(ApiError::internal)?.len();
    if offset >= len {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(offset))
        .map_err(ApiError::internal)?;
    Ok(Some(file))
}

fn read_from(
    root: &crate::rootfs::SandboxRoot,
    tag: &str,
    stream: &str,
    offset: u64,
    max: u64,
) -> Result<Vec<u8>, ApiError> {
    let Some(file) = open_at(root, tag, stream, offset)? else {
        return Ok(Vec::new());
    };
    let mut data = Vec::new();
    file.take(max)
        .read_to_end(&mut data)
        .map_err(ApiError::internal)?;
    Ok(data)
}

/// Follows process `pid`'s output from `from` as it is written, then gives its
/// end. The follower holds one of the tenant's streams while it lasts, builds at
/// most a few events ahead, and stops for a caller that takes none for
/// --body-timeout, or that drops the stream.
pub async fn follow(
    state: &AppState,
    caller: &Caller,
    id: &str,
    pid: u64,
    from: Offsets,
) -> Result<impl futures_util::Stream<Item = ProcessEvent> + Send + 'static, ApiError> {
    let session = lookup(state, caller, id)?;
    let tag = Arc::new(load_one(state, &session, pid).await?.tag);
    let root = Arc::new(root_of(&session)?);
    // Held while the stream is open: each holds what it built for its client.
    let permit = state.auth.stream_permit(&caller.tenant)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<ProcessEvent>(STREAM_QUEUE);
    // A client that takes nothing for this long is let go, with what was built for it.
    let idle = Duration::from_millis(state.args.body_timeout_ms);
    let state = state.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let mut offsets = [from.stdout, from.stderr];
        let mut text = [
            super::exec::Utf8Chunker::default(),
            super::exec::Utf8Chunker::default(),
        ];
        let mut got = false;
        loop {
            // Armed before the end state is read: an end recorded from then on
            // wakes the wait below at once.
            let woken = session.process_ended.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Read the end state before the output, so nothing written before the
            // exit is missed; not while output keeps coming (the stream cannot end
            // on a round that got some).
            let after_output = got;
            let ended = match got {
                true => None,
                false => load_one(&state, &session, pid)
                    .await
                    .ok()
                    .map(|p| p.info)
                    .filter(|p| p.ended_at.is_some()),
            };
            got = false;
            for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
                let (root, tag) = (root.clone(), tag.clone());
                let offset = offsets[i];
                let mut chunker = std::mem::take(&mut text[i]);
                // Read off the runtime's workers.
                let built = tokio::task::spawn_blocking(move || {
                    let data = read_from(&root, &tag, stream.name(), offset, STREAM_CHUNK)
                        .ok()
                        .unwrap_or_default();
                    let text = (!data.is_empty()).then(|| chunker.push(&data));
                    (data.len() as u64, text, chunker)
                })
                .await;
                let Ok((read, text_read, chunker)) = built else {
                    return;
                };
                text[i] = chunker;
                let Some(text_read) = text_read else {
                    continue;
                };
                got = true;
                offsets[i] += read;
                let event = ProcessEvent::Output(stream, text_read);
                match tokio::time::timeout(idle, tx.send(event)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        tracing::debug!(pid, "a process stream's client read nothing for {idle:?}");
                        return;
                    }
                }
            }
            if let Some(process) = ended {
                if !got {
                    // A character cut by the end never gets the rest: given as
                    // the replacement character, not dropped.
                    for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
                        let rest = text[i].flush();
                        if !rest.is_empty() {
                            let event = ProcessEvent::Output(stream, rest);
                            if !matches!(
                                tokio::time::timeout(idle, tx.send(event)).await,
                                Ok(Ok(()))
                            ) {
                                return;
                            }
                        }
                    }
                    let event = ProcessEvent::Exit {
                        exit_code: process.exit_code,
                        signal: process.signal,
                    };
                    let _ = tokio::time::timeout(idle, tx.send(event)).await;
                    return;
                }
            } else if !got {
                if session.deleted.load(Ordering::SeqCst) || tx.is_closed() {
                    return;
                }
                if after_output {
                    // The output ran dry: look at the end state now, not after a wait.
                    continue;
                }
                tokio::select! {
                    () = tokio::time::sleep(TAIL_INTERVAL) => {}
                    () = &mut woken => {}
                }
            }
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Writes `body` to process `pid`'s stdin as the process takes it; `declared` is
/// the length the caller announced, if any (refused at once past --max-body).
/// Stdin stays open unless the process closed it or `close` asks for it (after a
/// whole body only: a write cut short closes nothing).
pub async fn write_stdin<B, E>(
    state: &AppState,
    caller: &Caller,
    id: &str,
    pid: u64,
    declared: Option<u64>,
    body: impl futures_util::Stream<Item = Result<B, E>>,
    close: bool,
) -> Result<(), ApiError>
where
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    let limit = state.args.max_body_bytes;
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(format!(
            "stdin body over the daemon's --max-body of {limit} bytes"
        )));
    }
    let session = lookup(state, caller, id)?;
    load_one(state, &session, pid).await?;
    let sender = session
        .stdin
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&pid);
    let Some(mut sender) = sender else {
        return Err(ApiError::conflict(format!(
            "process {pid} has no open stdin (it exited, stdin was closed, or the daemon restarted)"
        )));
    };
    let outcome = pipe_body(state, pid, body, &mut sender).await;
    let keep = match &outcome {
        Ok(_) => !close,
        Err(e) => e.code != ErrorCode::Conflict,
    };
    if keep {
        session
            .stdin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, sender);
    }
    outcome.map(|_| ())
}

/// Streams a request body into a process's stdin as the process takes it, so a
/// process that reads slowly holds a chunk of it, not the whole body (up to
/// --max-body). Either side that moves nothing for --body-timeout ends it with 408;
/// the error says how much went in. Returns the bytes written.
async fn pipe_body<B, E>(
    state: &AppState,
    pid: u64,
    body: impl futures_util::Stream<Item = Result<B, E>>,
    sender: &mut tokio::net::unix::pipe::Sender,
) -> Result<u64, ApiError>
where
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let (limit, idle) = (
        state.args.max_body_bytes,
        Duration::from_millis(state.args.body_timeout_ms),
    );
    let stalled = |who: &str, written: u64| {
        ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "{who} for {} s (--body-timeout): {written} bytes were written to process \
                 {pid}'s stdin, which stays open",
                idle.as_secs_f64()
            ),
        )
    };
    let mut chunks = std::pin::pin!(body);
    let mut written = 0u64;
    loop {
        let chunk = match tokio::time::timeout(idle, chunks.next()).await {
            Ok(None) => return Ok(written),
            Ok(Some(Ok(chunk))) => chunk,
            Ok(Some(Err(e))) => {
                return Err(ApiError::bad_request(format!(
                    "stdin body interrupted after {written} bytes: {e}"
                )))
            }
            Err(_) => return Err(stalled("the client sent nothing", written)),
        };
        let chunk = chunk.as_ref();
        if written + chunk.len() as u64 > limit {
            return Err(ApiError::too_large(format!(
                "stdin body over the daemon's --max-body of {limit} bytes: {written} bytes \
                 were written to process {pid}'s stdin, which stays open"
            )));
        }
        let mut at = 0;
        while at < chunk.len() {
            match tokio::time::timeout(idle, sender.write(&chunk[at..])).await {
                Ok(Ok(n)) => {
                    at += n;
                    written += n as u64;
                }
                Ok(Err(e)) => {
                    return Err(ApiError::conflict(format!("write to process {pid}: {e}")))
                }
                Err(_) => return Err(stalled("the process read nothing", written)),
            }
        }
    }
}

pub fn parse_signal(value: &serde_json::Value) -> Result<i32, ApiError> {
    let bad = || ApiError::invalid(format!("unknown signal {value}"));
    match value {
        serde_json::Value::Number(n) => n
            .as_i64()
            .filter(|n| (1..=64).contains(n))
            .map(|n| n as i32)
            .ok_or_else(bad),
        serde_json::Value::String(name) => {
            let upper = name.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            full.parse::<brig_jail::agent::Signal>()
                .map(|s| s as i32)
                .map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// Sends `signal` (a name such as "TERM" or "SIGKILL", or a number) to process
/// `pid`; audited as `process.signal`. A process that has ended takes it as done.
pub async fn signal(
    state: &AppState,
    caller: &Caller,
    id: &str,
    pid: u64,
    signal: &serde_json::Value,
) -> Result<(), ApiError> {
    let result = async {
        let session = lookup(state, caller, id)?;
        load_one(state, &session, pid).await?;
        let signal = parse_signal(signal)?;
        let sandbox = session.sandbox();
        // A process of a sandbox a restore replaced has ended (killed with it):
        // like any ended process, a signal to it changes nothing.
        let Some(job) = sandbox.facts().job(pid) else {
            return Ok(());
        };
        let (reply, _) = sandbox
            .connect()
            .map_err(sandbox_gone)?
            .call(&AgentRequest::Signal { job, signal })
            .await
            .map_err(sandbox_gone)?;
        match reply {
            AgentReply::Done => Ok(()),
            AgentReply::Error { message } => Err(ApiError::not_found(message)),
            other => Err(ApiError::internal(format!(
                "unexpected agent reply {other:?}"
            ))),
        }
    }
    .await;
    let outcome = audit::outcome(&result);
    audit::record(
        state,
        caller,
        Some(id),
        "process.signal",
        serde_json::json!({"process_id": pid, "signal": signal}),
        outcome,
    )
    .await;
    result
}

/// Waits for process `pid` to end, at most `timeout_ms` (default 30 s, at most an
/// hour), and gives it as it then is: ended, or still running.
pub async fn wait(
    state: &AppState,
    caller: &Caller,
    id: &str,
    pid: u64,
    timeout_ms: Option<u64>,
) -> Result<ProcessInfo, ApiError> {
    let session = lookup(state, caller, id)?;
    let info = load_one(state, &session, pid).await?.info;
    if info.ended_at.is_some() {
        return Ok(info);
    }
    let timeout = Duration::from_millis(timeout_ms.unwrap_or(30_000).min(3_600_000));
    let sandbox = session.sandbox();
    let Some(job) = sandbox.facts().job(pid) else {
        // Of a sandbox a restore replaced (a daemon killed during that restore did
        // not get to end its row).
        record_exit(state, &session, pid, KILLED).await;
        return Ok(load_one(state, &session, pid).await?.info);
    };
    let waited = tokio::time::timeout(timeout, async {
        let mut agent = sandbox.connect().ok()?;
        agent.send(&AgentRequest::Wait { job }, &[]).await.ok()?;
        wait_on(&mut *agent).await
    })
    .await;
    if let Ok(Some(exit)) = waited {
        record_exit(state, &session, pid, exit).await;
    }
    Ok(load_one(state, &session, pid).await?.info)
}
