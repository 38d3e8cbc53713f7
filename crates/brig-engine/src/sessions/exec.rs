//! Exec in a session: synchronous, streamed (a stream of [`ExecEvent`]s), and the
//! onyx-compatible `bash`.
//!
//! The daemon makes the pipes, hands their far ends to the session's init with the
//! request, and reads output itself: nothing flows through init. Output past the
//! limit is drained and dropped, so a flooding command never blocks and never grows
//! the daemon's memory; it is spliced to `/dev/null` rather than read, since the
//! daemon's CPU is nobody's to spend on it (see [`Output`]).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use brig_jail::agent::{AgentReply, AgentRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{ensure_running, lookup, Session};
use crate::audit;
use crate::auth::{Caller, Permit};
#[cfg(test)]
use crate::backend::namespaces::agent::Agent;
use crate::backend::{Link, Sandbox};
use crate::fault::{Error as ApiError, ErrorCode};
use crate::state::AppState;

/// After the command exits, how long output from processes it left behind (still
/// holding its stdout) is awaited before the result is returned.
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// A command to run in a session, as asked.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// The command and its arguments (searched in PATH).
    pub argv: Option<Vec<String>>,
    /// A shell command line, run with `/bin/sh -c`.
    pub cmd: Option<String>,
    /// Working directory (default: the session's).
    pub cwd: Option<String>,
    /// Added to the session's environment.
    pub env: Option<BTreeMap<String, String>>,
    /// Given to the command on stdin (then EOF).
    pub stdin: Option<String>,
    /// Kill the command's process group after this long (default and maximum:
    /// the daemon's --max-execute-timeout).
    pub timeout_ms: Option<u64>,
}

/// What a command did: its end and the output kept (up to the daemon's limit).
#[derive(Debug, Clone, Default)]
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

/// The end of a streamed exec: the result without the output.
#[derive(Debug, Clone)]
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

impl From<&ExecResult> for ExecExit {
    fn from(r: &ExecResult) -> ExecExit {
        ExecExit {
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            oom_killed: r.oom_killed,
            file_locks_exceeded: r.file_locks_exceeded,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            duration_ms: r.duration_ms,
        }
    }
}

/// What a streamed exec ([`stream`]) yields: its output as it comes, then one end.
#[derive(Debug, Clone)]
pub enum ExecEvent {
    /// Output, never empty and never splitting a character (see [`Utf8Chunker`]).
    Output(Stream, String),
    /// The command ended (or was killed).
    Exit(ExecExit),
    /// The exec failed once started: the last event.
    Failed(ApiError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// A command ready to run: argv, env and cwd resolved against the session.
pub struct Command {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
}

impl Command {
    pub fn from_request(
        state: &AppState,
        session: &Session,
        request: &ExecRequest,
    ) -> Result<Command, ApiError> {
        let argv = match (&request.argv, &request.cmd) {
            (Some(argv), None) if !argv.is_empty() && !argv[0].is_empty() => argv.clone(),
            (None, Some(cmd)) => vec!["/bin/sh".into(), "-c".into(), cmd.clone()],
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give either argv or cmd, not both"))
            }
            _ => return Err(ApiError::invalid("give argv (a non-empty list) or cmd")),
        };
        let max = state.args.max_execute_timeout_ms;
        let timeout_ms = request.timeout_ms.unwrap_or(max);
        if timeout_ms == 0 || timeout_ms > max {
            return Err(ApiError::invalid(format!(
                "timeout_ms must be between 1 and {max} (the daemon's --max-execute-timeout)"
            )));
        }
        let cwd = request
            .cwd
            .clone()
            .unwrap_or_else(|| session.sandbox().facts().cwd.clone());
        if !cwd.starts_with('/') {
            return Err(ApiError::invalid(format!(
                "cwd {cwd:?} must be an absolute path"
            )));
        }
        Ok(Command {
            argv,
            env: merged_env(session, request.env.as_ref())?,
            cwd,
            stdin: request.stdin.clone().map(String::into_bytes),
            timeout: Duration::from_millis(timeout_ms),
        })
    }
}

/// The session's environment with the request's on top, as `K=V` entries.
pub fn merged_env(
    session: &Session,
    extra: Option<&BTreeMap<String, String>>,
) -> Result<Vec<String>, ApiError> {
    let mut env = session.base_env();
    for (key, value) in extra.into_iter().flatten() {
        check_env_var(key, value)?;
        env.insert(key.clone(), value.clone());
    }
    Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}

/// An environment variable a process can be given as `K=V`.
pub fn check_env_var(key: &str, value: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
        return Err(ApiError::invalid(format!(
            "invalid environment variable {key:?}"
        )));
    }
    Ok(())
}

pub fn pipe() -> Result<(OwnedFd, OwnedFd), ApiError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| ApiError::internal(format!("pipe: {e}")))
}

/// A chunk of output as it arrives (for streaming).
pub type Chunks = mpsc::Sender<(Stream, Vec<u8>)>;

/// Runs `command` in the session to its end (or its timeout) and collects the
/// result; with `chunks`, output is also sent there as it comes.
pub async fn run(
    state: &AppState,
    session: &Session,
    command: Command,
    chunks: Option<Chunks>,
) -> Result<ExecResult, ApiError> {
    run_holding(state, session, command, chunks)
        .await
        .map(|(result, _slot)| result)
}

/// [`run`], also giving back the exec's slot (its count against the tenant's and
/// the daemon's concurrent execs), for the answer to hold until it is sent
/// ([`crate::auth::json_holding`]): an answer is up to ~12 MB of JSON (output
/// escaped), and clients that read slowly must hold no more of them than their
/// tenant's concurrent execs, where each connection could otherwise hold one.
pub(crate) async fn run_holding(
    state: &AppState,
    session: &Session,
    command: Command,
    chunks: Option<Chunks>,
) -> Result<(ExecResult, Permit), ApiError> {
    ensure_running(session)?;
    let _gate = session.gate.read().await;
    if session.deleted.load(Ordering::SeqCst) {
        return Err(ApiError::not_found(format!("no session {}", session.id)));
    }
    ensure_running(session)?;
    let slot = state.auth.exec_permit(&session.tenant)?;
    crate::metrics::exec_started();
    let started = Instant::now();
    let result = run_inner(state, session, command, chunks, started).await;
    let outcome = match &result {
        Ok(r) if r.timed_out => "timeout",
        Ok(r) if r.oom_killed => "oom",
        Ok(r) if r.file_locks_exceeded => "file_locks",
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    };
    crate::metrics::exec_finished(started.elapsed(), outcome);
    result.map(|result| (result, slot))
}

async fn run_inner(
    state: &AppState,
    session: &Session,
    command: Command,
    chunks: Option<Chunks>,
    started: Instant,
) -> Result<ExecResult, ApiError> {
    let sandbox = session.sandbox();
    let oom_before = sandbox.oom_kills().unwrap_or(0);
    let lock_kills_before = session.lock_kills.load(Ordering::SeqCst);
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let mut agent = sandbox.connect().map_err(sandbox_gone)?;
    let stdio = [stdin_r.as_fd(), stdout_w.as_fd(), stderr_w.as_fd()];
    let deadline = tokio::time::Instant::from_std(started + command.timeout);
    let starting = start_bound(
        &mut *agent,
        command.argv.clone(),
        command.env,
        command.cwd,
        &stdio,
    );
    // The timeout counts from the request: init may not answer at all (see
    // init_not_answering), and the exec must end, and free its slot, anyway.
    let Ok(reply) = tokio::time::timeout_at(deadline, starting).await else {
        let text = format!("brig: {}\n", init_not_answering(command.timeout).message);
        if let Some(chunks) = &chunks {
            let _ = chunks
                .send((Stream::Stderr, text.clone().into_bytes()))
                .await;
        }
        return Ok(ExecResult {
            timed_out: true,
            stderr: text,
            duration_ms: started.elapsed().as_millis() as u64,
            ..Default::default()
        });
    };
    let reply = reply?;
    // The sandbox has its copies; ours would keep the pipes from ever closing.
    drop((stdin_r, stdout_w, stderr_w));
    let job = match reply {
        AgentReply::Started { job, .. } => job,
        AgentReply::ExecFailed { message, exit_code } => {
            let text = format!("brig: {message}\n");
            if let Some(chunks) = &chunks {
                let _ = chunks
                    .send((Stream::Stderr, text.clone().into_bytes()))
                    .await;
            }
            return Ok(ExecResult {
                exit_code: Some(exit_code),
                stderr: text,
                duration_ms: started.elapsed().as_millis() as u64,
                ..Default::default()
            });
        }
        AgentReply::Error { message } => return Err(ApiError::invalid(message)),
        other => {
            return Err(ApiError::internal(format!(
                "unexpected agent reply {other:?}"
            )))
        }
    };

    let stdin_task = match command.stdin {
        Some(data) => Some(tokio::spawn(write_stdin(stdin_w, data))),
        // Closing our end gives the command EOF at once: no task needed.
        None => {
            drop(stdin_w);
            None
        }
    };
    let limit = state.output_limit_bytes();
    let mut stdout = Output::new(stdout_r, Stream::Stdout, limit).of_tenant(&session.tenant);
    let mut stderr = Output::new(stderr_r, Stream::Stderr, limit).of_tenant(&session.tenant);
    let (exit, timed_out) = collect(
        &mut *agent,
        [&mut stdout, &mut stderr],
        chunks.as_ref(),
        deadline,
        OUTPUT_GRACE,
        || kill_job(&*sandbox, job),
    )
    .await;
    if let Some(task) = stdin_task {
        task.abort();
    }
    let exit = match exit {
        Some(Some(exit)) => exit,
        // Killed at its timeout, but init never reported the exit.
        None if timed_out => {
            let (out, out_truncated) = stdout.into_kept();
            let (err, err_truncated) = stderr.into_kept();
            let note = format!(
                "brig: killed at its timeout, but {}\n",
                crate::backend::not_answering()
            );
            return Ok(ExecResult {
                timed_out,
                stdout: String::from_utf8_lossy(&out).into_owned(),
                stderr: String::from_utf8_lossy(&err).into_owned() + &note,
                stdout_truncated: out_truncated,
                stderr_truncated: err_truncated,
                duration_ms: started.elapsed().as_millis() as u64,
                ..Default::default()
            });
        }
        _ => {
            return Err(ApiError::conflict(format!(
                "session {} ended while the command ran",
                session.id
            )))
        }
    };
    let (out, out_truncated) = stdout.into_kept();
    let (err, err_truncated) = stderr.into_kept();
    // Only a SIGKILL can be the OOM killer's: the counter is read again only then.
    let oom_killed =
        exit.signal == Some(libc::SIGKILL) && sandbox.oom_kills().unwrap_or(0) > oom_before;
    let file_locks_exceeded = exit.signal == Some(libc::SIGKILL)
        && session.lock_kills.load(Ordering::SeqCst) > lock_kills_before;
    Ok(ExecResult {
        exit_code: exit.code,
        signal: exit.signal,
        timed_out,
        oom_killed,
        file_locks_exceeded,
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
        stdout_truncated: out_truncated,
        stderr_truncated: err_truncated,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// Waits for the job's exit and reads both streams (one task for all three: each
/// hand-off to another worker thread is a wake-up on the exec's path); kills the job
/// at `deadline` (with `kill`). After the exit, output from processes the command left behind is
/// read until both streams end or `grace` passes. Returns the exit (`Some(None)`:
/// the sandbox ended under the command) and whether the deadline killed it.
///
/// Output written before the grace ended is never lost to timing: when the loop
/// ends, what the pipes hold is read without waiting for the reactor to report it.
/// A daemon starved of CPU can see the exit, and then the grace end, before tokio
/// reports a pipe that already holds the command's output.
async fn collect<F: std::future::Future<Output = ()>>(
    agent: &mut dyn Link,
    [stdout, stderr]: [&mut Output; 2],
    chunks: Option<&Chunks>,
    deadline: tokio::time::Instant,
    grace: Duration,
    kill: impl FnOnce() -> F,
) -> (Option<Option<brig_jail::agent::JobExit>>, bool) {
    let (mut out_buf, mut err_buf) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    let mut timed_out = false;
    let mut exit: Option<Option<brig_jail::agent::JobExit>> = None;
    let mut grace_ends = None;
    let mut kill = Some(kill);
    // Once killed, the exit is waited for no longer than init may take to answer:
    // a wedged init (see backend::ANSWER_TIMEOUT) never reports it.
    let given_up = deadline + crate::backend::ANSWER_TIMEOUT;
    while exit.is_none() || stdout.open() || stderr.open() {
        // Unbiased: a flooding command must not keep the deadline from being seen.
        tokio::select! {
            read = stdout.read(&mut out_buf), if stdout.open() => {
                stdout.keep(read, &out_buf, chunks).await;
            }
            read = stderr.read(&mut err_buf), if stderr.open() => {
                stderr.keep(read, &err_buf, chunks).await;
            }
            reply = agent.recv(), if exit.is_none() => match reply {
                Ok((AgentReply::Exited { exit: done, .. }, _)) => exit = Some(Some(done)),
                Ok(_) => continue,
                Err(_) => exit = Some(None),
            },
            _ = tokio::time::sleep_until(deadline), if !timed_out && exit.is_none() => {
                timed_out = true;
                if let Some(kill) = kill.take() {
                    kill().await;
                }
            }
            _ = tokio::time::sleep_until(grace_ends.unwrap_or(deadline)), if grace_ends.is_some() => break,
            _ = tokio::time::sleep_until(given_up), if timed_out && exit.is_none() => break,
        }
        if exit.is_some() && grace_ends.is_none() {
            grace_ends = Some(tokio::time::Instant::now() + grace);
        }
    }
    stdout.drain_ready(&mut out_buf, chunks).await;
    stderr.drain_ready(&mut err_buf, chunks).await;
    (exit, timed_out)
}

/// Kills a job's process group (over a second connection: the first is waiting).
pub async fn kill_job(sandbox: &dyn Sandbox, job: u64) {
    if let Ok(mut agent) = sandbox.connect() {
        let _ = agent
            .call(&AgentRequest::Signal {
                job,
                signal: libc::SIGKILL,
            })
            .await;
    }
}

/// Starts a command that init kills if this connection closes first (the daemon
/// died, or the request was dropped); returns init's first reply. An init started
/// by an older daemon refuses the `bound` field: the exec is then sent unbound, and
/// runs on if the request is dropped (as every exec did before binding).
pub(crate) async fn start_bound(
    agent: &mut dyn Link,
    argv: Vec<String>,
    env: Vec<String>,
    cwd: String,
    stdio: &[std::os::fd::BorrowedFd<'_>],
) -> Result<AgentReply, ApiError> {
    let mut request = AgentRequest::Exec {
        argv,
        env,
        cwd,
        bound: true,
    };
    let reply = send_exec(agent, &request, stdio).await?;
    match (&reply, &mut request) {
        (AgentReply::Error { message }, AgentRequest::Exec { bound, .. })
            if message.contains("unknown field `bound`") =>
        {
            *bound = false;
            send_exec(agent, &request, stdio).await
        }
        _ => Ok(reply),
    }
}

/// Sends an exec request with its stdio and returns init's first reply.
async fn send_exec(
    agent: &mut dyn Link,
    request: &AgentRequest,
    stdio: &[std::os::fd::BorrowedFd<'_>],
) -> Result<AgentReply, ApiError> {
    agent.send(request, stdio).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            ApiError::too_large(e.to_string())
        } else {
            sandbox_gone(e)
        }
    })?;
    Ok(agent.recv().await.map_err(sandbox_gone)?.0)
}

/// An exec's audit event: [`ExecAudit::record`] writes it with the result, and a
/// request dropped before that (its client hung up; init kills the command, which
/// is bound to the dropped connection) writes it on drop, with outcome
/// [`CLIENT_CLOSED`]: every exec is recorded, abandoned ones too.
pub struct ExecAudit {
    state: AppState,
    caller: Caller,
    session_id: String,
    action: &'static str,
    argv: Option<Vec<String>>,
    cmd: Option<String>,
    recorded: bool,
}

impl ExecAudit {
    pub fn new(
        state: &AppState,
        caller: &Caller,
        session_id: &str,
        action: &'static str,
        request: &ExecRequest,
    ) -> ExecAudit {
        ExecAudit {
            state: state.clone(),
            caller: caller.clone(),
            session_id: session_id.to_string(),
            action,
            argv: request.argv.clone(),
            cmd: request.cmd.clone(),
            recorded: false,
        }
    }

    pub async fn record(mut self, result: Result<&ExecResult, &ApiError>) {
        self.recorded = true;
        let (outcome, detail) = match result {
            Ok(r) => (
                "ok",
                serde_json::json!({"argv": self.argv, "cmd": self.cmd,
                    "exit_code": r.exit_code, "signal": r.signal, "timed_out": r.timed_out,
                    "duration_ms": r.duration_ms}),
            ),
            Err(e) => (
                e.code.as_str(),
                serde_json::json!({"argv": self.argv, "cmd": self.cmd, "error": e.message}),
            ),
        };
        let session_id = Some(self.session_id.as_str());
        audit::record(
            &self.state,
            &self.caller,
            session_id,
            self.action,
            detail,
            outcome,
        )
        .await;
    }
}

impl Drop for ExecAudit {
    fn drop(&mut self) {
        if self.recorded {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let detail = serde_json::json!({"argv": self.argv.take(), "cmd": self.cmd.take(),
            "error": "the client closed the connection before the command ended; it was killed"});
        let (state, caller) = (self.state.clone(), self.caller.clone());
        let (session_id, action) = (std::mem::take(&mut self.session_id), self.action);
        runtime.spawn(async move {
            let session_id = Some(session_id.as_str());
            audit::record(&state, &caller, session_id, action, detail, CLIENT_CLOSED).await;
        });
    }
}

/// The audit outcome of an exec whose client hung up before it ended.
pub const CLIENT_CLOSED: &str = "client_closed";

/// Init did not start a command within `waited` (see [`crate::backend::ANSWER_TIMEOUT`]).
pub fn init_not_answering(waited: Duration) -> ApiError {
    ApiError::conflict(format!(
        "the session's init did not start the command within {} ms: a process in the \
         session may hold it stopped (SIGSTOP); continue that process or delete the session",
        waited.as_millis()
    ))
}

pub fn sandbox_gone(e: std::io::Error) -> ApiError {
    ApiError::conflict(format!("the session's sandbox is not reachable: {e}"))
}

async fn write_stdin(fd: OwnedFd, data: Vec<u8>) {
    if let Ok(mut sender) = tokio::net::unix::pipe::Sender::from_owned_fd(fd) {
        // A command that does not read its stdin closes the pipe: fine.
        let _ = sender.write_all(&data).await;
    }
}

/// The pipe size a stream gets once past its limit: fewer wake-ups per byte
/// drained (the most an unprivileged pipe may have by default, `pipe-max-size`).
const DISCARD_PIPE_SIZE: usize = 1 << 20;

/// How much output past the limit one tenant's commands together drain per second,
/// at most: the daemon's CPU for it grows with the bytes, whatever the mechanism.
/// Per tenant, so that one tenant's floods do not slow another's (one budget for
/// all made another tenant's 200 MB overshoot take 12.6 s instead of 0.6 s).
const DISCARD_RATE: u64 = 256 << 20;

/// How far the discard budget may be drawn ahead after a quiet spell: 64 MiB at
/// [`DISCARD_RATE`], so a command printing that much past its limit is not slowed.
const DISCARD_BURST: Duration = Duration::from_millis(250);

/// Books `bytes` just drained against `tenant`'s budget ([`DISCARD_RATE`]) and
/// returns when the stream may drain again. A tenant's streams book one after
/// another on one timeline, so together they never drain faster than the rate
/// (beyond the burst).
fn book_discard(tenant: &str, bytes: usize) -> tokio::time::Instant {
    type Booked = std::collections::HashMap<String, tokio::time::Instant>;
    static BOOKED: std::sync::Mutex<Option<Booked>> = std::sync::Mutex::new(None);
    let now = tokio::time::Instant::now();
    let earliest = now.checked_sub(DISCARD_BURST).unwrap_or(now);
    let mut booked = BOOKED.lock().unwrap_or_else(|e| e.into_inner());
    let booked = booked.get_or_insert_with(Default::default);
    // Tenants whose bookings have run out are as good as new: kept, they would
    // only grow the map.
    if booked.len() > 64 {
        booked.retain(|_, at| *at > earliest);
    }
    let at = booked.entry(tenant.to_string()).or_insert(earliest);
    let start = (*at).max(earliest);
    let end = start + Duration::from_nanos(bytes as u64 * 1_000_000_000 / DISCARD_RATE);
    *at = end;
    end
}

/// `/dev/null`, opened once, where output past the limit is spliced.
fn dev_null() -> Option<std::os::fd::BorrowedFd<'static>> {
    static NULL: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| {
        rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()
    })
    .as_ref()
    .map(|fd| fd.as_fd())
}

/// One output stream of a command: up to `limit` bytes kept, the rest drained and
/// dropped (so a flooding command never blocks on a full pipe, and one that prints
/// more than the limit and exits ends at once).
///
/// The daemon's CPU is charged to no session, and reading a flood into a buffer to
/// drop it cost ~0.8 CPU-s per GiB (15 floods slowed another tenant's `exec true`
/// tenfold). So the rest is spliced into `/dev/null` from a pipe enlarged to
/// [`DISCARD_PIPE_SIZE`]: nothing is copied, and there are fewer wake-ups and
/// calls (~0.3 CPU-s per GiB, most of it the kernel freeing the pipe's pages, which
/// whoever empties the pipe pays). A cost per byte still grows with what commands
/// can write, so it is bounded in time as well: all streams together drain at most
/// [`DISCARD_RATE`] (see [`book_discard`]); a flooding command then waits on its
/// full pipe, in its own session, instead of the daemon working for it.
struct Output {
    pipe: Option<tokio::net::unix::pipe::Receiver>,
    stream: Stream,
    limit: usize,
    kept: Vec<u8>,
    truncated: bool,
    /// Whose discard budget output past the limit draws on.
    tenant: String,
    /// Past the limit: when the discard budget lets this stream drain again.
    next_drain: Option<tokio::time::Instant>,
}

impl Output {
    fn new(fd: OwnedFd, stream: Stream, limit: u64) -> Output {
        Output {
            pipe: tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok(),
            stream,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            kept: Vec::new(),
            truncated: false,
            tenant: String::new(),
            next_drain: None,
        }
    }

    /// Output past the limit draws on `tenant`'s discard budget.
    fn of_tenant(mut self, tenant: &str) -> Output {
        self.tenant = tenant.to_string();
        self
    }

    fn open(&self) -> bool {
        self.pipe.is_some()
    }

    /// Whether nothing more is kept: what comes now is only counted as truncation.
    fn full(&self) -> bool {
        self.kept.len() >= self.limit
    }

    /// Waits for output (cancel safe: a read that has not completed took nothing).
    /// Past the limit, output is discarded here and only its length returned
    /// (`buf` is left as it was: [`Output::keep`] takes nothing from it then).
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let full = self.full();
        let Some(pipe) = &mut self.pipe else {
            return std::future::pending().await;
        };
        let Some(null) = dev_null().filter(|_| full) else {
            return pipe.read(buf).await;
        };
        let pipe = &*pipe;
        if let Some(at) = self.next_drain {
            tokio::time::sleep_until(at).await;
        }
        loop {
            pipe.readable().await?;
            match pipe.try_io(|| Self::discard(pipe, null)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                done => {
                    if let Ok(bytes) = done {
                        self.next_drain = Some(book_discard(&self.tenant, bytes));
                    }
                    return done;
                }
            }
        }
    }

    /// Moves what the pipe holds to `null` without copying it (the pipe is
    /// non-blocking: `WouldBlock` when empty, 0 at its end).
    fn discard(pipe: &impl AsFd, null: std::os::fd::BorrowedFd<'_>) -> std::io::Result<usize> {
        loop {
            match rustix::pipe::splice(
                pipe,
                None,
                null,
                None,
                DISCARD_PIPE_SIZE,
                rustix::pipe::SpliceFlags::NONBLOCK,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                other => return other.map_err(std::io::Error::from),
            }
        }
    }

    /// Keeps what a read returned (and sends it to `chunks`); the end of the stream,
    /// or an error, closes it.
    async fn keep(&mut self, read: std::io::Result<usize>, buf: &[u8], chunks: Option<&Chunks>) {
        let n = match read {
            Ok(0) | Err(_) => {
                self.pipe = None;
                return;
            }
            Ok(n) => n,
        };
        let take = n.min(self.limit.saturating_sub(self.kept.len()));
        if take < n {
            if !self.truncated {
                if let Some(pipe) = &self.pipe {
                    // Refused past the host's limits on pipe memory: drained all the
                    // same, only with more wake-ups.
                    let _ = rustix::pipe::fcntl_setpipe_size(pipe, DISCARD_PIPE_SIZE);
                }
            }
            self.truncated = true;
        }
        if take > 0 {
            self.kept.extend_from_slice(&buf[..take]);
            if let Some(chunks) = chunks {
                let _ = chunks.send((self.stream, buf[..take].to_vec())).await;
            }
        }
    }

    /// Keeps what the pipe holds now, reading it directly: the reactor may not have
    /// reported it readable yet (a read through tokio would wait for that). At most
    /// the pipe's capacity is read, so a writer still flooding it cannot hold this up.
    async fn drain_ready(&mut self, buf: &mut [u8], chunks: Option<&Chunks>) {
        let mut budget = match &self.pipe {
            Some(pipe) => rustix::pipe::fcntl_getpipe_size(pipe).unwrap_or(1 << 20),
            None => return,
        };
        while let (Some(pipe), true) = (&self.pipe, budget > 0) {
            // The pipe is non-blocking (tokio made it so): EAGAIN means empty.
            let read = match dev_null().filter(|_| self.full()) {
                Some(null) => Self::discard(pipe, null),
                None => rustix::io::read(pipe, &mut *buf).map_err(std::io::Error::from),
            };
            let read = match read {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => other,
            };
            budget = budget.saturating_sub(*read.as_ref().unwrap_or(&budget));
            self.keep(read, buf, chunks).await;
        }
    }

    fn into_kept(self) -> (Vec<u8>, bool) {
        (self.kept, self.truncated)
    }
}

/// Runs a command in session `id` to its end and gives back its result with the
/// exec's slot, for the answer to hold until it is sent (see [`run_holding`]).
/// Audited as `exec`, also when the caller gives up on it (see [`ExecAudit`]).
pub async fn exec(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: &ExecRequest,
) -> Result<(ExecResult, Permit), ApiError> {
    let audit = ExecAudit::new(state, caller, id, "exec", request);
    let ran = async {
        let session = lookup(state, caller, id)?;
        let command = Command::from_request(state, &session, request)?;
        run_holding(state, &session, command, None).await
    }
    .await;
    audit.record(ran.as_ref().map(|(result, _)| result)).await;
    ran
}

/// Turns output chunks into UTF-8 text without splitting a character across two
/// events: an incomplete sequence at the end waits for the next chunk.
#[derive(Default)]
pub struct Utf8Chunker {
    pending: Vec<u8>,
}

impl Utf8Chunker {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Invalid bytes (not just incomplete): pass everything on, lossily.
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(valid);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        text
    }

    pub fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Runs a command in session `id`, its output yielded as it comes and then its
/// end. Problems found before anything runs are the error; once it runs, a failure
/// is the last event. Dropping the stream kills the command (its client hung up),
/// audited as [`CLIENT_CLOSED`]; the exec's slot is held until the stream is done.
pub async fn stream(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: &ExecRequest,
) -> Result<impl futures_util::Stream<Item = ExecEvent> + Send + 'static, ApiError> {
    let session = lookup(state, caller, id)?;
    let command = Command::from_request(state, &session, request)?;
    ensure_running(&session)?;
    let (events_tx, events_rx) = mpsc::channel::<ExecEvent>(64);
    let (chunks_tx, mut chunks_rx) = mpsc::channel::<(Stream, Vec<u8>)>(64);
    let task_state = state.clone();
    let audit = ExecAudit::new(state, caller, id, "exec.stream", request);
    let client = events_tx.clone();
    let (slot, held) = held_slot();
    let runner = tokio::spawn(async move {
        let result = tokio::select! {
            result = run_holding(&task_state, &session, command, Some(chunks_tx)) => result,
            // The client hung up: nobody reads the rest. The run is dropped, and with
            // it its connection to init, which kills the command; `audit` records it.
            _ = client.closed() => {
                return Err(ApiError::conflict("the client closed the connection"));
            }
        };
        let result = result.map(|(result, permit)| slot.keep(permit, result));
        audit.record(result.as_ref()).await;
        result
    });
    tokio::spawn(async move {
        let mut text = [Utf8Chunker::default(), Utf8Chunker::default()];
        while let Some((stream, bytes)) = chunks_rx.recv().await {
            let data = text[stream as usize].push(&bytes);
            if !data.is_empty() {
                let _ = events_tx.send(ExecEvent::Output(stream, data)).await;
            }
        }
        for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let data = text[i].flush();
            if !data.is_empty() {
                let _ = events_tx.send(ExecEvent::Output(stream, data)).await;
            }
        }
        let last = match runner.await {
            Ok(Ok(r)) => ExecEvent::Exit(ExecExit::from(&r)),
            Ok(Err(e)) => ExecEvent::Failed(e),
            Err(e) => ExecEvent::Failed(ApiError::new(ErrorCode::Internal, e.to_string())),
        };
        let _ = events_tx.send(last).await;
    });
    Ok(held.on(events_rx))
}

/// An exec's slot, kept after its run by the stream of its events until the client
/// has had them: up to ~12 MB of escaped output can be queued for a client that
/// reads slowly, which must count against its tenant's concurrent execs as an
/// unread answer does (see [`run_holding`]).
pub(crate) fn held_slot() -> (SlotKeeper, HeldSlot) {
    let cell = std::sync::Arc::new(std::sync::Mutex::new(None));
    (SlotKeeper(cell.clone()), HeldSlot { _cell: cell })
}

/// The run's side of [`held_slot`].
pub(crate) struct SlotKeeper(std::sync::Arc<std::sync::Mutex<Option<Permit>>>);

impl SlotKeeper {
    pub(crate) fn keep<T>(&self, permit: Permit, result: T) -> T {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(permit);
        result
    }
}

/// The stream's side of [`held_slot`]: the slot is dropped with the last side.
pub(crate) struct HeldSlot {
    _cell: std::sync::Arc<std::sync::Mutex<Option<Permit>>>,
}

impl HeldSlot {
    /// The events, holding the slot until they are all sent or the client is gone.
    pub(crate) fn on<T>(self, events: mpsc::Receiver<T>) -> impl futures_util::Stream<Item = T> {
        use futures_util::StreamExt;
        tokio_stream::wrappers::ReceiverStream::new(events).map(move |event| {
            let _held = &self;
            event
        })
    }
}

/// Runs a command line with `bash -c` in session `id` (with `/bin/sh -c` where the
/// root has no bash), as [`exec`] does; audited as `bash`.
pub async fn bash(
    state: &AppState,
    caller: &Caller,
    id: &str,
    cmd: &str,
    timeout_ms: Option<u64>,
) -> Result<(ExecResult, Permit), ApiError> {
    let exec = ExecRequest {
        argv: Some(vec!["bash".into(), "-c".into(), cmd.to_string()]),
        timeout_ms,
        ..Default::default()
    };
    let audit = ExecAudit::new(state, caller, id, "bash", &exec);
    let result = async {
        let session = lookup(state, caller, id)?;
        let command = Command::from_request(state, &session, &exec)?;
        let ran = run_holding(state, &session, command, None).await?;
        let result = &ran.0;
        if result.exit_code == Some(127) && result.stderr.starts_with("brig: command not found") {
            drop(ran);
            // No bash in this root: a POSIX shell does for most command lines.
            let fallback = ExecRequest {
                argv: None,
                cmd: Some(cmd.to_string()),
                ..exec.clone()
            };
            let command = Command::from_request(state, &session, &fallback)?;
            return run_holding(state, &session, command, None).await;
        }
        Ok(ran)
    }
    .await;
    audit
        .record(result.as_ref().map(|(result, _)| result))
        .await;
    result
}

#[cfg(test)]
mod tests {
    use super::Utf8Chunker;
    use super::{book_discard, DISCARD_RATE};
    use std::time::Duration;

    #[test]
    fn one_tenants_floods_do_not_slow_anothers_drain() {
        let now = tokio::time::Instant::now();
        // A tenant that has drained ten seconds' worth waits that long...
        let flooder = book_discard("flooder", 10 * DISCARD_RATE as usize);
        assert!(flooder > now + Duration::from_secs(9));
        // ...another drains at once, within its own burst.
        let other = book_discard("other", 1 << 20);
        assert!(other < tokio::time::Instant::now() + Duration::from_millis(10));
        // And the flooder's next booking comes after its last.
        assert!(book_discard("flooder", 1 << 20) > flooder);
    }

    /// A fake init on a unix socket that answers each exec with what `answer` says;
    /// returns the socket's path and a thread that ends with the requests it got.
    fn fake_init(
        dir: &std::path::Path,
        answer: fn(&[u8]) -> serde_json::Value,
    ) -> (std::path::PathBuf, std::thread::JoinHandle<Vec<String>>) {
        use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};
        let path = dir.join("agent.sock");
        let listener =
            rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        rustix::net::bind(&listener, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        rustix::net::listen(&listener, 1).unwrap();
        let server = std::thread::spawn(move || {
            let conn = rustix::net::accept(&listener).unwrap();
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            // The descriptors that come with a request are not received: the kernel
            // closes them.
            while let Ok((n, _)) = rustix::net::recv(&conn, &mut buf[..], RecvFlags::empty()) {
                if n == 0 {
                    break;
                }
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let reply = serde_json::to_vec(&answer(&buf[..n])).unwrap();
                rustix::net::send(&conn, &reply, SendFlags::empty()).unwrap();
            }
            seen
        });
        (path, server)
    }

    async fn start(path: &std::path::Path) -> brig_jail::agent::AgentReply {
        use std::os::fd::AsFd;
        let mut agent = super::Agent::connect(path).unwrap();
        let (r, w) = super::pipe().unwrap();
        let stdio = [r.as_fd(), w.as_fd(), w.as_fd()];
        let argv = vec!["true".to_string()];
        super::start_bound(&mut agent, argv, vec![], "/".into(), &stdio)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn execs_are_bound_and_unbound_for_an_init_that_predates_binding() {
        use brig_jail::agent::AgentReply;
        let started = serde_json::json!({"type": "started", "job": 1, "pid": 2});
        // An init of this version takes the field.
        let dir = tempfile::tempdir().unwrap();
        let (path, server) = fake_init(
            dir.path(),
            |_| serde_json::json!({"type": "started", "job": 1, "pid": 2}),
        );
        assert_eq!(
            start(&path).await,
            serde_json::from_value::<AgentReply>(started.clone()).unwrap()
        );
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].contains(r#""bound":true"#), "{seen:?}");

        // An older init knows exec without it, and refuses unknown fields (its
        // request type, and the error text serde gives it).
        #[derive(serde::Deserialize)]
        #[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
        #[allow(dead_code)]
        enum OldRequest {
            Exec {
                argv: Vec<String>,
                env: Vec<String>,
                cwd: String,
            },
        }
        let dir = tempfile::tempdir().unwrap();
        let (path, server) = fake_init(dir.path(), |packet| {
            match serde_json::from_slice::<OldRequest>(packet) {
                Ok(_) => serde_json::json!({"type": "started", "job": 1, "pid": 2}),
                Err(e) => {
                    serde_json::json!({"type": "error", "message": format!("bad request: {e}")})
                }
            }
        });
        assert_eq!(
            start(&path).await,
            serde_json::from_value::<AgentReply>(started).unwrap()
        );
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(!seen[1].contains("bound"), "{seen:?}");
    }

    /// Output already in the pipe when the exit is known is kept even if the reactor
    /// never reports the pipe readable before the grace ends, as happens when the
    /// daemon is starved of CPU for longer than the grace (100 sessions running
    /// execs on 2 cores lost `echo hello`'s output about once in a thousand).
    /// Here the pipes are registered with a second runtime that is never driven,
    /// so only reading them directly can find the output.
    #[tokio::test]
    async fn output_in_the_pipe_is_kept_though_the_reactor_never_reported_it() {
        use super::{collect, Output, Stream};
        use brig_jail::agent::{AgentReply, JobExit};
        use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketType};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener =
            rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        rustix::net::bind(&listener, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        rustix::net::listen(&listener, 1).unwrap();
        let mut agent = super::Agent::connect(&path).unwrap();
        let init = rustix::net::accept(&listener).unwrap();

        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (out_r, out_w) = super::pipe().unwrap();
        let (err_r, err_w) = super::pipe().unwrap();
        let (mut stdout, mut stderr) = {
            let _in_idle = idle.enter();
            (
                Output::new(out_r, Stream::Stdout, 1 << 20),
                Output::new(err_r, Stream::Stderr, 1 << 20),
            )
        };
        rustix::io::write(&out_w, b"hello\n").unwrap();
        drop((out_w, err_w));
        let exited = AgentReply::Exited {
            job: 1,
            exit: JobExit {
                code: Some(0),
                signal: None,
            },
        };
        let packet = serde_json::to_vec(&exited).unwrap();
        rustix::net::send(&init, &packet, SendFlags::empty()).unwrap();

        let far = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        let (exit, timed_out) = collect(
            &mut agent,
            [&mut stdout, &mut stderr],
            None,
            far,
            std::time::Duration::from_millis(20),
            || async {},
        )
        .await;
        assert_eq!(exit.flatten().and_then(|e| e.code), Some(0));
        assert!(!timed_out);
        assert!(
            !stdout.open() && !stderr.open(),
            "both ends seen by the drain"
        );
        assert_eq!(stdout.into_kept().0, b"hello\n");
        drop(stderr);
        // Not dropped here: a runtime cannot be dropped inside another one.
        idle.shutdown_background();
    }

    /// What the pipe holds is read at once, before the reactor has seen it, and no
    /// more than its capacity while a writer keeps filling it.
    #[tokio::test]
    async fn a_drain_reads_what_the_pipe_holds_without_waiting() {
        use super::{Output, Stream};
        let (r, w) = super::pipe().unwrap();
        let mut output = Output::new(r, Stream::Stdout, u64::MAX);
        let mut buf = vec![0u8; 4096];
        output.drain_ready(&mut buf, None).await;
        assert!(output.open());
        rustix::io::write(&w, b"left in the pipe").unwrap();
        output.drain_ready(&mut buf, None).await;
        assert!(output.open(), "the writer is still there");
        drop(w);
        output.drain_ready(&mut buf, None).await;
        assert!(!output.open(), "end of stream");
        assert_eq!(output.into_kept().0, b"left in the pipe");

        // A writer that never stops: the drain still returns.
        let (r, w) = super::pipe().unwrap();
        let capacity = rustix::pipe::fcntl_getpipe_size(&r).unwrap();
        let writer = std::thread::spawn(move || {
            let chunk = [b'x'; 4096];
            while rustix::io::write(&w, &chunk).is_ok() {}
        });
        let mut output = Output::new(r, Stream::Stdout, u64::MAX);
        while output.kept.is_empty() {
            output.drain_ready(&mut buf, None).await;
        }
        assert!(output.kept.len() <= capacity + buf.len());
        drop(output);
        writer.join().unwrap();
    }

    #[test]
    fn chunker_keeps_characters_whole() {
        let mut c = Utf8Chunker::default();
        let bytes = "héllo".as_bytes();
        assert_eq!(c.push(&bytes[..2]), "h");
        assert_eq!(c.push(&bytes[2..]), "éllo");
        assert_eq!(c.push(b"\xff"), "\u{fffd}");
        assert_eq!(c.flush(), "");
    }
}
