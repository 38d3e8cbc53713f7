//! Files in a session, from the daemon's side.
//!
//! Every path goes through [`crate::rootfs::SandboxRoot`], opened by the backend on
//! the sandbox's root (namespaces: `/proc/<init>/root`): resolution stays inside the sandbox's root (RESOLVE_IN_ROOT),
//! so a symlink planted by the sandbox can never point the daemon at a host file.
//! Bodies are streamed both ways through a blocking task; nothing is held whole in
//! memory.

use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, DuplexStream, ReadBuf};
use tokio_util::io::SyncIoBridge;

use super::{ensure_running, lookup, workspace_path, FileRef, Session};
use crate::audit;
use crate::auth::Caller;
use crate::backend::Sandbox;
use crate::fault::{Error as ApiError, ErrorCode};
use crate::rootfs::{Direct, ExtractLimits, FillError, Filler, RootfsError, SandboxRoot};
use crate::state::AppState;

/// Entries an uploaded archive may hold.
const MAX_ARCHIVE_ENTRIES: u64 = 100_000;

pub fn rootfs_error(e: RootfsError) -> ApiError {
    match e.code() {
        ErrorCode::Internal => ApiError::internal(e),
        code => ApiError::new(code, e.to_string()),
    }
}

/// The sandbox's root, for file operations as its user.
pub fn root_of(session: &Session) -> Result<SandboxRoot, ApiError> {
    root_in(session, &*session.sandbox())
}

/// The root of `sandbox`, one of the session's (the current one when it was read).
fn root_in(session: &Session, sandbox: &dyn Sandbox) -> Result<SandboxRoot, ApiError> {
    let root = sandbox.root().map_err(rootfs_error)?;
    // Opened by pid: if init has gone, its pid may be another process's by now
    // (one a restarted daemon is not the parent of is reaped by the host's init).
    // Checked after opening: still init's (same start time) now means it was then.
    if !sandbox.is_alive() {
        return Err(ApiError::conflict(format!(
            "session {} has ended (its sandbox is gone)",
            session.id
        )));
    }
    Ok(root)
}

/// A file written: where, and how many bytes.
#[derive(Clone, Debug)]
pub struct Written {
    pub path: String,
    pub size_bytes: u64,
}

/// An archive unpacked: where, and how many entries it held.
#[derive(Clone, Debug)]
pub struct Extracted {
    pub path: String,
    pub entries: u64,
}

/// One entry of a directory.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: String,
    /// "file", "directory", "symlink" or "other".
    pub kind: String,
    pub size_bytes: u64,
    pub mode: u32,
    /// RFC 3339.
    pub modified_at: String,
}

/// A directory's entries.
#[derive(Clone, Debug)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntry>,
}

/// A file opened for reading, and its size.
#[derive(Debug)]
pub struct FileRead {
    pub file: tokio::fs::File,
    pub size_bytes: u64,
}

/// Runs a file operation and records it in the audit log, to its end even if the
/// client goes away meanwhile: its blocking part cannot be stopped halfway, so a
/// request dropped with it would leave work done that the log never saw.
pub(super) async fn audited<T: Send + 'static>(
    state: &AppState,
    caller: &Caller,
    id: &str,
    action: &'static str,
    path: &str,
    operation: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    let (state, caller, id) = (state.clone(), caller.clone(), id.to_string());
    let detail = serde_json::json!({ "path": path });
    tokio::spawn(async move {
        let result = operation.await;
        let outcome = audit::outcome(&result);
        audit::record(&state, &caller, Some(&id), action, detail, outcome).await;
        result
    })
    .await
    .map_err(ApiError::internal)?
}

/// Runs a blocking file operation on the session's root, as the session's user
/// (see `brig_jail::session::act_as`).
pub async fn with_root<T: Send + 'static>(
    session: &Session,
    f: impl FnOnce(SandboxRoot) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    in_sandbox(session, &*session.sandbox(), f).await
}

/// [`with_root`] in `sandbox`.
async fn in_sandbox<T: Send + 'static>(
    session: &Session,
    sandbox: &dyn Sandbox,
    f: impl FnOnce(SandboxRoot) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let root = root_in(session, sandbox)?;
    let user = sandbox.file_user();
    tokio::task::spawn_blocking(move || {
        let _user = user
            .map(|(uid, gid)| brig_jail::session::act_as(uid, gid))
            .transpose()
            .map_err(|e| ApiError::internal(format!("act as the sandbox's user: {e}")))?;
        f(root)
    })
    .await
    .map_err(ApiError::internal)?
}

/// [`with_root`] for an operation that changes a session's files: the session
/// must be running (not paused), as for every write.
pub(super) async fn change_root<T: Send + 'static>(
    state: &AppState,
    caller: &Caller,
    id: &str,
    f: impl FnOnce(SandboxRoot) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let session = lookup(state, caller, id)?;
    ensure_running(&session)?;
    change(&session, f).await
}

/// [`with_root`] for a change, answered truthfully: 404 if the session was deleted
/// while it ran, 409 if a restore replaced the sandbox it wrote to (the change is
/// not in the session). It takes no gate: an upload lasts as long as its client
/// takes to send it, and would hold off a restore (and every exec queued behind
/// that) as long. Checked once it is done instead: a restore or delete that comes
/// after the check comes after the change too.
async fn change<T: Send + 'static>(
    session: &Session,
    f: impl FnOnce(SandboxRoot) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let Some(_changing) = session.cut.begin_change() else {
        return Err(ApiError::conflict(format!(
            "a snapshot of session {} is being taken; change its files once it is done",
            session.id
        )));
    };
    let sandbox = session.sandbox();
    let result = in_sandbox(session, &*sandbox, f).await;
    changed(session, &sandbox, result)
}

/// [`change`] writing file data: `f` gets the copier of the sandbox it writes to,
/// which writes the data (namespaces: see `backend::namespaces::copy_in`: the pages are the session's memory).
async fn change_filled<T: Send + 'static>(
    session: &Session,
    idle: Duration,
    f: impl FnOnce(SandboxRoot, Copier) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let sandbox = session.sandbox();
    let result = filled_in(session, &*sandbox, idle, f).await;
    changed(session, &sandbox, result)
}

/// [`in_sandbox`] with the sandbox's copier, connected as the daemon (the sandbox's
/// user, which the operation acts as, cannot reach init's socket).
async fn filled_in<T: Send + 'static>(
    session: &Session,
    sandbox: &dyn Sandbox,
    idle: Duration,
    f: impl FnOnce(SandboxRoot, Copier) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let copier = sandbox.filler(idle).map_err(super::exec::sandbox_gone)?;
    in_sandbox(session, sandbox, move |root| f(root, copier)).await
}

/// What writes file data into a sandbox (namespaces: its copier).
type Copier = Box<dyn Filler + Send>;

/// The answer of a change made in `sandbox`: see [`change`].
fn changed<T>(
    session: &Session,
    sandbox: &std::sync::Arc<dyn Sandbox>,
    result: Result<T, ApiError>,
) -> Result<T, ApiError> {
    if session.deleted.load(Ordering::SeqCst) {
        return Err(ApiError::not_found(format!("no session {}", session.id)));
    }
    if !std::sync::Arc::ptr_eq(sandbox, &session.sandbox()) {
        return Err(ApiError::conflict(format!(
            "session {} was restored from a snapshot meanwhile: this went to the sandbox \
             the restore replaced and is not in the session; do it again",
            session.id
        )));
    }
    result
}

/// Reads what is left of a refused upload's body, so that its client, still
/// sending, gets the answer rather than a broken pipe (HTTP/1.1 clients write the
/// whole body before they read). Bounded like the upload: at most the daemon's
/// --max-file-size, and the first stall or error ends it.
fn drain_after<T, E>(outcome: &Result<T, E>, reader: &mut impl Read) {
    if outcome.is_err() {
        let _ = std::io::copy(reader, &mut std::io::sink());
    }
}

/// A body reader that fails once more than `limit` bytes came.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "upload over the daemon's --max-file-size",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// An upload's body as a blocking reader, at most --max-file-size bytes.
type BodyReader<R> = Capped<SyncIoBridge<R>>;

/// What an upload needs before its body is read: the running session, a transfer
/// permit (held until the upload ends), and the body as a bounded reader.
fn start_upload<R: AsyncRead + Unpin>(
    state: &AppState,
    caller: &Caller,
    id: &str,
    body: R,
) -> Result<(std::sync::Arc<Session>, crate::auth::Permit, BodyReader<R>), ApiError> {
    let session = lookup(state, caller, id)?;
    ensure_running(&session)?;
    let permit = state.auth.transfer_permit(&caller.tenant)?;
    // A stalled client is the front end's to cut off (under --body-timeout): its
    // error reaches the reader as an io error of kind `TimedOut`.
    let reader = Capped {
        inner: SyncIoBridge::new(body),
        left: state.args.max_file_size_bytes,
    };
    Ok((session, permit, reader))
}

fn stalled(idle: Duration, verb: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the client {verb} nothing for {} s (--body-timeout)",
            idle.as_secs_f64()
        ),
    )
}

/// A blocking writer into the response body that fails once the client has read
/// nothing for `idle`, letting go of the blocking thread that writes it.
struct ResponseWriter<W> {
    inner: W,
    runtime: tokio::runtime::Handle,
    idle: Duration,
}

impl<W: tokio::io::AsyncWrite + Unpin> Write for ResponseWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use tokio::io::AsyncWriteExt;
        let idle = self.idle;
        self.runtime.block_on(async {
            tokio::time::timeout(idle, self.inner.write(buf))
                .await
                .unwrap_or_else(|_| Err(stalled(idle, "read")))
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let idle = self.idle;
        self.runtime.block_on(async {
            tokio::time::timeout(idle, self.inner.flush())
                .await
                .unwrap_or_else(|_| Err(stalled(idle, "read")))
        })
    }
}

/// A response body written on a blocking thread as the client reads it, for a file
/// operation whose answer is large (an archive, a listing).
struct BlockingBody {
    /// The operation's audit action: its event (outcome ok) is written as the body
    /// starts, so one that is not finished gets a second event saying so.
    action: &'static str,
    path: String,
    /// Held until the body is written or given up.
    transfer: crate::auth::Permit,
}

impl BlockingBody {
    /// Runs `write` on a blocking thread into the body. A client that reads nothing
    /// for --body-timeout is cut off, letting go of the thread and the permit. The
    /// status went out with the first bytes, so a failure ends the body with an
    /// error, which cuts the response off: the client sees a failed download rather
    /// than a short one that looks whole.
    fn start(
        self,
        state: &AppState,
        caller: &Caller,
        id: &str,
        write: impl FnOnce(&mut dyn Write) -> Result<(), String> + Send + 'static,
    ) -> Download {
        let (reader, writer) = tokio::io::duplex(256 << 10);
        let (finished, outcome) = tokio::sync::oneshot::channel();
        let (state, caller, id) = (state.clone(), caller.clone(), id.to_string());
        let runtime = tokio::runtime::Handle::current();
        let idle = body_timeout(&state);
        tokio::task::spawn_blocking(move || {
            let Self {
                action,
                path,
                transfer,
            } = self;
            let mut out = ResponseWriter {
                inner: writer,
                runtime: runtime.clone(),
                idle,
            };
            let written = write(&mut out).and_then(|()| out.flush().map_err(|e| e.to_string()));
            drop(transfer);
            if let Err(e) = &written {
                tracing::warn!("{action} of {path}: {e}");
                let detail = serde_json::json!({"path": path, "error": e, "finished": false});
                runtime.spawn(async move {
                    audit::record(&state, &caller, Some(&id), action, detail, "error").await;
                });
            }
            let _ = finished.send(written);
        });
        Download {
            reader,
            outcome: Some(outcome),
        }
    }
}

/// The body of a large answer (an archive, a listing), read as it is written: it
/// ends with an error rather than early if writing it failed, so that a front end
/// cuts the response off instead of sending a short one that looks whole. Dropping
/// it (the client went away) stops the writing.
pub struct Download {
    reader: DuplexStream,
    /// The writer's outcome, until it is read at the end of the bytes.
    outcome: Option<tokio::sync::oneshot::Receiver<Result<(), String>>>,
}

impl AsyncRead for Download {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.reader).poll_read(cx, buf))?;
        // No room to read into looks like the end: only a real end reads the outcome.
        if buf.filled().len() > before || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let Some(outcome) = self.outcome.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let outcome = ready!(Pin::new(outcome).poll(cx));
        self.outcome = None;
        Poll::Ready(match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(std::io::Error::other(message)),
            Err(_) => Err(std::io::Error::other("the body was not finished")),
        })
    }
}

fn body_timeout(state: &AppState) -> Duration {
    Duration::from_millis(state.args.body_timeout_ms)
}

fn io_to_api(e: std::io::Error) -> ApiError {
    match e.kind() {
        std::io::ErrorKind::FileTooLarge => ApiError::too_large(e.to_string()),
        std::io::ErrorKind::StorageFull => ApiError::new(
            ErrorCode::NoSpace,
            "the session's disk is full (its --disk limit)",
        ),
        std::io::ErrorKind::TimedOut => ApiError::request_timeout(format!("upload stalled: {e}")),
        _ => ApiError::bad_request(format!("upload interrupted: {e}")),
    }
}

/// The answer to an archive upload that failed: reading the body is the client's
/// doing (too much of it, or a stall), everything else as for other file operations.
fn archive_error(e: RootfsError) -> ApiError {
    match e {
        RootfsError::Io { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::FileTooLarge | std::io::ErrorKind::TimedOut
            ) =>
        {
            io_to_api(source)
        }
        other => rootfs_error(other),
    }
}

/// Opens `path` in session `id` for reading (audited as `file.read`).
pub async fn read(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<FileRead, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let session = lookup(&state, &caller, &id)?;
            let (file, meta) = with_root(&session, move |root| {
                root.open_read(&path).map_err(rootfs_error)
            })
            .await?;
            Ok(FileRead {
                file: tokio::fs::File::from_std(file),
                size_bytes: meta.size_bytes,
            })
        }
    };
    audited(state, caller, id, "file.read", path, operation).await
}

/// Writes `body` to `path` in session `id` (parents made), replacing the file
/// atomically; at most --max-file-size bytes (audited as `file.write`). A refused
/// body is read to its end, bounded as the upload, so that its client gets the
/// answer (see [`drain_after`]).
pub async fn write(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
    body: impl AsyncRead + Send + Unpin + 'static,
) -> Result<Written, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let (session, _transfer, reader) = start_upload(&state, &caller, &id, body)?;
            let target = path.clone();
            let size = change_filled(&session, body_timeout(&state), move |root, mut copier| {
                let mut reader = reader;
                let written = fill_file(&root, &target, &mut reader, None, &mut *copier);
                drain_after(&written, &mut reader);
                written
            })
            .await?;
            Ok(Written {
                path,
                size_bytes: size,
            })
        }
    };
    audited(state, caller, id, "file.write", path, operation).await
}

/// Writes `reader` to `path` (parents made), replacing the file atomically. The
/// daemon writes the data itself, so it is the daemon's memory: for its own small
/// files (`/v1/execute`'s code and driver, bounded by --max-body); a caller's data
/// goes through [`fill_file`].
pub fn write_file(root: &SandboxRoot, path: &str, reader: impl Read) -> Result<u64, ApiError> {
    fill_file(root, path, reader, None, &mut Direct::new())
}

/// Writes `reader` (`len` bytes if known) to `path` through `filler` (parents
/// made), replacing the file atomically.
pub fn fill_file(
    root: &SandboxRoot,
    path: &str,
    mut reader: impl Read,
    len: Option<u64>,
    filler: &mut dyn Filler,
) -> Result<u64, ApiError> {
    let mut writer = root.create_write(path, true).map_err(rootfs_error)?;
    let copied = match writer.fill(filler, &mut reader, len) {
        Ok(copied) => copied,
        Err(FillError::Input(e)) => return Err(io_to_api(e)),
        Err(FillError::Output(e)) => return Err(rootfs_error(e)),
    };
    if len.is_some_and(|len| copied != len) {
        return Err(ApiError::internal(format!(
            "{path}: {copied} of {len:?} bytes written"
        )));
    }
    writer.commit().map_err(rootfs_error)?;
    Ok(copied)
}

/// Removes `path` in session `id`, a directory with everything in it if
/// `recursive` (audited as `file.delete`).
pub async fn remove(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
    recursive: bool,
) -> Result<(), ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            change_root(&state, &caller, &id, move |root| {
                root.remove(&path, recursive).map_err(rootfs_error)
            })
            .await
        }
    };
    audited(state, caller, id, "file.delete", path, operation).await
}

/// Lists directory `path` in session `id` (audited as `file.list`), written out
/// by `encode` as the client reads it.
pub async fn list(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
    encode: impl FnOnce(DirListing, &mut dyn Write) -> Result<(), String> + Send + 'static,
) -> Result<Download, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let session = lookup(&state, &caller, &id)?;
            // A listing of 100,000 long names is tens of MB: it counts as a transfer,
            // and is written out as the client reads it, so a slow reader holds
            // neither more than its share nor longer than --body-timeout.
            let transfer = state.auth.transfer_permit(&caller.tenant)?;
            let dir = path.clone();
            let entries = with_root(&session, move |root| {
                root.list_dir(&dir).map_err(rootfs_error)
            })
            .await?;
            let listing = DirListing {
                path: path.clone(),
                entries: entries
                    .into_iter()
                    .map(|e| DirEntry {
                        name: e.name,
                        kind: e.kind.as_str().to_string(),
                        size_bytes: e.size_bytes,
                        mode: e.mode,
                        modified_at: super::rfc3339(e.modified),
                    })
                    .collect(),
            };
            let body = BlockingBody {
                action: "file.list",
                path,
                transfer,
            }
            .start(&state, &caller, &id, move |out| {
                let mut out = std::io::BufWriter::with_capacity(64 << 10, out);
                encode(listing, &mut out)?;
                out.flush().map_err(|e| e.to_string())
            });
            Ok(body)
        }
    };
    audited(state, caller, id, "file.list", path, operation).await
}

/// Makes directory `path` in session `id`, and its parents (audited as
/// `file.mkdir`).
pub async fn mkdir(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<(), ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            change_root(&state, &caller, &id, move |root| {
                root.mkdir_all(&path).map_err(rootfs_error)
            })
            .await
        }
    };
    audited(state, caller, id, "file.mkdir", path, operation).await
}

/// A tar of directory `path` in session `id`, written as the client reads it
/// (audited as `file.archive.read`).
pub async fn read_archive(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<Download, ApiError> {
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let session = lookup(&state, &caller, &id)?;
            let transfer = state.auth.transfer_permit(&caller.tenant)?;
            let root = root_of(&session)?;
            // Checked first, so a missing directory is a 404 rather than a cut stream.
            let probe = path.clone();
            let root = tokio::task::spawn_blocking(move || root.check_dir(&probe).map(|()| root))
                .await
                .map_err(ApiError::internal)?
                .map_err(rootfs_error)?;
            let dir = path.clone();
            let body = BlockingBody {
                action: "file.archive.read",
                path,
                transfer,
            }
            .start(&state, &caller, &id, move |out| {
                root.write_tar(&dir, out).map_err(|e| e.to_string())
            });
            Ok(body)
        }
    };
    audited(state, caller, id, "file.archive.read", path, operation).await
}

/// Unpacks the tar `body` into directory `path` in session `id`: at most
/// --max-file-size bytes and [`MAX_ARCHIVE_ENTRIES`] entries (audited as
/// `file.archive.write`). A refused body is read to its end as for [`write`].
pub async fn write_archive(
    state: &AppState,
    caller: &Caller,
    id: &str,
    path: &str,
    body: impl AsyncRead + Send + Unpin + 'static,
) -> Result<Extracted, ApiError> {
    let limit = state.args.max_file_size_bytes;
    let operation = {
        let (state, caller, id, path) = (
            state.clone(),
            caller.clone(),
            id.to_string(),
            path.to_string(),
        );
        async move {
            let (session, _transfer, reader) = start_upload(&state, &caller, &id, body)?;
            let dir = path.clone();
            let summary = change_filled(&session, body_timeout(&state), move |root, mut copier| {
                let mut reader = reader;
                let extracted = root
                    .extract_tar_with(
                        &dir,
                        &mut reader,
                        ExtractLimits {
                            max_bytes: limit,
                            max_entries: MAX_ARCHIVE_ENTRIES,
                        },
                        &mut *copier,
                    )
                    .map_err(archive_error);
                drain_after(&extracted, &mut reader);
                extracted
            })
            .await?;
            Ok(Extracted {
                path,
                entries: summary.entries,
            })
        }
    };
    audited(state, caller, id, "file.archive.write", path, operation).await
}

/// Copies uploaded files (`/v1/files`) into the session's working directory.
pub async fn copy_uploads(
    state: &AppState,
    session: &Session,
    files: &[FileRef],
) -> Result<(), ApiError> {
    let sandbox = session.sandbox();
    let cwd = sandbox.facts().cwd.clone();
    let mut sources = Vec::with_capacity(files.len());
    for file in files {
        let target = workspace_path(&file.path, &cwd)?;
        let (_, source) = crate::filestore::open(state, &session.tenant, &file.file_id).await?;
        // Opened as the daemon: the store is private to it, and `with_root` runs as
        // the sandbox's user, who may not read it.
        let reader = tokio::fs::File::open(&source)
            .await
            .map_err(ApiError::internal)?
            .into_std()
            .await;
        sources.push((target, reader));
    }
    // One copier for them all; each file's length told, as it shares one pipe.
    filled_in(
        session,
        &*sandbox,
        body_timeout(state),
        move |root, mut copier| {
            for (target, reader) in sources {
                let len = reader.metadata().map_err(ApiError::internal)?.len();
                fill_file(&root, &target, reader, Some(len), &mut *copier)?;
            }
            Ok(())
        },
    )
    .await?;
    if session.deleted.load(Ordering::SeqCst) {
        return Err(ApiError::not_found(format!("no session {}", session.id)));
    }
    Ok(())
}
