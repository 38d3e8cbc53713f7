//! Starting a session's sandbox from a multi-threaded daemon.
//!
//! The daemon never forks. Each launch runs a single-threaded helper, forked by the
//! daemon's launch zygote (`brig __session-zygote`, its own binary exec'd once; see
//! `brig_jail::zygote` for why), that reads a [`LaunchRequest`] on stdin, resolves
//! and locks the image, binds the agent socket, starts the sandbox with
//! [`brig_jail::start_session`] and prints a [`LaunchReply`] on stdout. The helper
//! exits at once; because the daemon is a child subreaper, the sandbox's init becomes
//! the daemon's child. Measured costs: see BENCHMARKS.md.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_policy::SandboxSpec;
use serde::{Deserialize, Serialize};

use crate::backend::Launch;
use crate::fault::Error as ApiError;

/// What the daemon asks the helper for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// The sandbox, rooted on the host's system dirs; the helper swaps in the image.
    pub spec: SandboxSpec,
    /// An image in `store` to use as the root (its user becomes the sandbox's user
    /// unless `user` is set).
    pub image: Option<String>,
    /// Without `image`: a snapshot of a session's /tmp and /workspace in `store` (an
    /// image of kind `scratch`) that fills this sandbox's (`Filesystem::seed`).
    #[serde(default)]
    pub seed: Option<String>,
    pub user: Option<(u32, u32)>,
    pub store: PathBuf,
    /// Where the session's init will listen (the helper binds it).
    pub control_socket: PathBuf,
    pub id_range: Option<(u32, u32)>,
    pub cgroup_parent: Option<String>,
    /// Started ahead of need (a warm pool's refill): the helper and the sandbox run
    /// at idle priority until the sandbox is taken (`SessionHandle::to_foreground`).
    #[serde(default)]
    pub background: bool,
}

/// What the helper answers: the session, or why it could not start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchReply {
    Started(Box<Launched>),
    Failed { code: String, message: String },
}

/// A started sandbox: everything the namespace backend keeps to manage it, also
/// across restarts (stored as the session's `runtime` JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Launched {
    pub handle: brig_jail::session::SessionHandle,
    pub control_socket: PathBuf,
    /// What isolation was applied (brig-jail's `Enforced`), for the API.
    pub enforced: serde_json::Value,
    /// The environment every exec starts from: brig's defaults, the image's env.
    pub env: Vec<(String, String)>,
    /// The default working directory.
    pub cwd: String,
    /// The image it was started from, if any (for snapshots).
    pub image: Option<String>,
    pub uid: u32,
    pub gid: u32,
    /// What brig itself placed in the root (mount points, generated /etc files):
    /// left out of snapshots.
    pub placeholders: Vec<String>,
    pub timings_us: Vec<brig_jail::report::Timing>,
    /// See `backend::Facts::process_base` (a restore's init counts from 1 again).
    #[serde(default)]
    pub process_base: u64,
}

/// The launch helper: runs in a single-threaded process forked by the zygote.
pub fn helper_main() -> std::process::ExitCode {
    let reply = match read_request().and_then(start) {
        Ok(launched) => LaunchReply::Started(Box::new(launched)),
        Err((code, message)) => LaunchReply::Failed { code, message },
    };
    let ok = matches!(reply, LaunchReply::Started(_));
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &reply).is_ok() && out.flush().is_ok();
    if ok && written {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(125)
    }
}

type Failure = (String, String);

fn read_request() -> Result<LaunchRequest, Failure> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| ("internal".to_string(), format!("read launch request: {e}")))?;
    serde_json::from_str(&text)
        .map_err(|e| ("internal".to_string(), format!("bad launch request: {e}")))
}

/// The launch record beside a sandbox's socket (`agent-XXXX.json`): the helper
/// writes what it started there before it replies, so a daemon that dies between
/// launching a sandbox and storing it (create, restore, pool fill) leaves its
/// successor what it needs to destroy the sandbox (see `Sessions::sweep`). The helper
/// holds an exclusive lock on it while it works: the successor waits for a launch
/// still under way instead of missing it.
pub fn record_path(control_socket: &Path) -> PathBuf {
    control_socket.with_extension("json")
}

/// How long a daemon waits for a launch under way to finish its record.
const RECORD_WAIT: Duration = Duration::from_secs(10);

/// Reads a launch record once no helper is writing it; `None` if it holds none (the
/// launch failed before starting anything) or is still locked after [`RECORD_WAIT`].
pub fn read_record(path: &Path) -> Option<Launched> {
    use rustix::fs::{flock, FlockOperation};
    let mut file = std::fs::File::open(path).ok()?;
    let deadline = Instant::now() + RECORD_WAIT;
    while flock(&file, FlockOperation::NonBlockingLockShared).is_err() {
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

fn start(request: LaunchRequest) -> Result<Launched, Failure> {
    let internal = |what: &str, e: std::io::Error| ("internal".to_string(), format!("{what}: {e}"));
    if request.background {
        // At normal priority it still works, only it competes with requests.
        let _ = brig_jail::session::start_in_background();
    }
    // Created and locked before anything is started (see `record_path`).
    let mut record = std::fs::File::create(record_path(&request.control_socket))
        .map_err(|e| internal("create the launch record", e))?;
    rustix::fs::flock(&record, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| internal("lock the launch record", e.into()))?;
    let mut spec = request.spec;
    let mut holds: Vec<OwnedFd> = Vec::new();
    if let Some(name) = &request.image {
        let image_error = |e: brig_image::ImageError| (e.code().to_string(), e.to_string());
        let store = brig_image::store::Store::open(&request.store).map_err(image_error)?;
        let record = store.image(name).map_err(image_error)?;
        record
            .check_root()
            .map_err(|e| ("wrong_image_kind".to_string(), e.to_string()))?;
        let layers = store.use_layers(&record).map_err(image_error)?;
        let chosen = brig_image::Chosen {
            user: request.user,
            cwd: None,
        };
        record
            .config
            .apply(&mut spec, &layers.mounts, &chosen)
            .map_err(|e| ("bad_image".to_string(), e))?;
        holds.extend(layers.into_locks().into_iter().map(OwnedFd::from));
    } else if let Some((uid, gid)) = request.user {
        spec.identity.uid = uid;
        spec.identity.gid = gid;
    }
    // Locked against gc until the sandbox has copied it (it does before it is ready).
    let mut _seed_layer = None;
    if let Some(name) = &request.seed {
        let image_error = |e: brig_image::ImageError| (e.code().to_string(), e.to_string());
        let store = brig_image::store::Store::open(&request.store).map_err(image_error)?;
        let record = store.image(name).map_err(image_error)?;
        if record.kind != brig_image::store::ImageKind::Scratch || record.layers.len() != 1 {
            return Err((
                "wrong_image_kind".to_string(),
                format!("image {name} is not a snapshot of a session's /tmp and /workspace"),
            ));
        }
        let layers = store.use_layers(&record).map_err(image_error)?;
        spec.filesystem.seed = layers.mounts.first().cloned();
        _seed_layer = Some(layers);
    }
    // Every session can be snapshotted: its init keeps what the sandbox writes
    // reachable (an image's upper layer, else its private /tmp and /workspace).
    spec.filesystem.capture_writes = true;
    let (uid, gid) = (spec.identity.uid, spec.identity.gid);
    let cwd = spec.cwd.clone();
    let env: Vec<(String, String)> = spec.effective_env().into_iter().collect();

    let placeholders =
        brig_jail::placeholders(&spec).map_err(|e| (e.code().to_string(), e.to_string()))?;
    let listener = brig_jail::session::bind_listener(&request.control_socket).map_err(|e| {
        (
            "internal".to_string(),
            format!("bind {}: {e}", request.control_socket.display()),
        )
    })?;
    let mut host = brig_jail::HostConfig::default();
    if let Some((start, end)) = request.id_range {
        host.id_range = brig_jail::ids::IdRange { start, end };
    }
    host.cgroup.parent = request.cgroup_parent;
    let started =
        brig_jail::start_session(&spec, &host, brig_jail::SessionControl { listener, holds })
            .map_err(|e| (e.code().to_string(), e.to_string()))?;
    let enforced = serde_json::to_value(&started.enforced)
        .map_err(|e| ("internal".to_string(), e.to_string()))?;
    let launched = Launched {
        handle: started.handle,
        control_socket: request.control_socket,
        enforced,
        env,
        cwd,
        image: request.image,
        uid,
        gid,
        placeholders,
        timings_us: started.timings_us,
        process_base: 0,
    };
    let written = serde_json::to_vec(&launched)
        .map_err(std::io::Error::other)
        .and_then(|bytes| record.write_all(&bytes));
    if let Err(e) = written {
        let _ = launched.handle.destroy();
        return Err(internal("write the launch record", e));
    }
    Ok(launched)
}

/// Starts a sandbox through the launch helper (the daemon's side of it): from `image` (a root) or the host's
/// system dirs, whose /tmp and /workspace `seed` (a host snapshot's store image)
/// fills.
pub(super) async fn start_sandbox(
    store: &Path,
    id_range: Option<(u32, u32)>,
    zygote: &ZygoteSlot,
    launch: Launch,
) -> Result<Launched, ApiError> {
    let Launch {
        dir,
        spec,
        image,
        seed,
        background,
        process_base: _,
    } = launch;
    let made_dir = !dir.exists();
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(ApiError::internal)?;
    // A fresh name per sandbox: a restore starts the new one beside the old.
    let socket = dir.join(format!("agent-{}.sock", crate::auth::random_hex(4)));
    let disk_bytes = spec.limits.disk_bytes;
    let request = LaunchRequest {
        spec,
        image,
        seed,
        user: None,
        store: store.to_path_buf(),
        control_socket: socket.clone(),
        id_range,
        cgroup_parent: None,
        background,
    };
    let input = serde_json::to_vec(&request).map_err(ApiError::internal)?;
    let output = run_helper(zygote, &input).await?;
    let reply: LaunchReply = serde_json::from_slice(&output.stdout).map_err(|e| {
        ApiError::internal(format!(
            "launch helper answered badly ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    })?;
    match reply {
        LaunchReply::Started(launched) => Ok(*launched),
        LaunchReply::Failed { code, message } => {
            let _ = tokio::fs::remove_file(&socket).await;
            let _ = tokio::fs::remove_file(record_path(&socket)).await;
            if made_dir {
                let _ = tokio::fs::remove_dir_all(&dir).await;
            }
            Err(match code.as_str() {
                "no_such_image" | "image_not_found" | "not_found" => ApiError::not_found(message),
                // "unsupported": an image no sandbox can stack (stored by an older brig).
                "bad_name" | "invalid_name" | "policy" | "wrong_image_kind" | "unsupported" => {
                    ApiError::invalid(message)
                }
                // A snapshot larger than the disk asked for: the request's to fix.
                "disk_full" => ApiError::invalid(format!(
                    "{message}: ask for a larger limits.disk (this one is {disk_bytes} bytes)"
                )),
                // The same for its memory, which a host snapshot's files fill (tmpfs).
                "memory_full" => {
                    ApiError::invalid(format!("{message}: ask for a larger limits.memory"))
                }
                _ => ApiError::internal(format!("{code}: {message}")),
            })
        }
    }
}

/// What a launch helper wrote before it exited.
struct HelperOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs one launch helper, forked by the zygote, on `input`. Dropping the future
/// (a create whose caller went away) kills the helper, as an exec'd one was killed.
async fn run_helper(zygote: &ZygoteSlot, input: &[u8]) -> Result<HelperOutput, ApiError> {
    use rustix::pipe::{pipe_with, PipeFlags};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::unix::pipe;
    let pipes =
        || pipe_with(PipeFlags::CLOEXEC).map_err(|e| ApiError::internal(format!("pipe: {e}")));
    let (stdin_theirs, stdin_ours) = pipes()?;
    let (stdout_ours, stdout_theirs) = pipes()?;
    let (stderr_ours, stderr_theirs) = pipes()?;
    let zygote = zygote.clone();
    let pidfd = tokio::task::spawn_blocking(move || {
        zygote.fork(brig_jail::zygote::HelperStdio {
            stdin: stdin_theirs.as_fd(),
            stdout: stdout_theirs.as_fd(),
            stderr: stderr_theirs.as_fd(),
        })
        // The helper's ends close here: ours see EOF when the helper exits.
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| ApiError::internal(format!("start the launch helper: {e}")))?;
    let helper = KillOnDrop(Some(pidfd));
    let talk = |e: std::io::Error| ApiError::internal(format!("talk to the launch helper: {e}"));
    let mut stdin = pipe::Sender::from_owned_fd(stdin_ours).map_err(talk)?;
    let mut stdout = pipe::Receiver::from_owned_fd(stdout_ours).map_err(talk)?;
    let mut stderr = pipe::Receiver::from_owned_fd(stderr_ours).map_err(talk)?;
    let mut output = HelperOutput {
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    let write = async {
        stdin.write_all(input).await?;
        drop(stdin);
        Ok::<_, std::io::Error>(())
    };
    let (written, out, err) = tokio::join!(
        write,
        stdout.read_to_end(&mut output.stdout),
        stderr.read_to_end(&mut output.stderr)
    );
    written.and(out).and(err).map_err(talk)?;
    // Its pipes close as it exits; once the pidfd is readable it has exited, as an
    // exec'd helper had when the daemon reaped it.
    let pidfd = helper.disarm();
    tokio::task::spawn_blocking(move || {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
        poll(&mut fds, None)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| talk(e.into()))?;
    Ok(output)
}

/// The launch helper's pidfd, killed if the launch is abandoned.
struct KillOnDrop(Option<OwnedFd>);

impl KillOnDrop {
    fn disarm(mut self) -> OwnedFd {
        self.0.take().expect("armed until disarmed")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pidfd) = &self.0 {
            let _ = brig_jail::zygote::kill(pidfd.as_fd());
        }
    }
}

/// A daemon's launch zygote, started at its first launch (again if it died).
#[derive(Clone, Default)]
pub(super) struct ZygoteSlot(Arc<std::sync::Mutex<Option<brig_jail::zygote::Zygote>>>);

impl ZygoteSlot {
    /// Forks a helper on `stdio`. Blocks for the length of one fork (and one exec the
    /// first time).
    fn fork(&self, stdio: brig_jail::zygote::HelperStdio<'_>) -> std::io::Result<OwnedFd> {
        let mut zygote = self.lock();
        if let Some(running) = zygote.as_mut() {
            if !running.alive() {
                *zygote = None;
            }
        }
        let running = match zygote.as_mut() {
            Some(running) => running,
            None => zygote.insert(brig_jail::zygote::Zygote::spawn(
                &helper_binary(),
                "__session-zygote",
            )?),
        };
        running.fork(stdio)
    }

    /// Ends the zygote and reaps it (its helpers finish on their own).
    pub(super) fn stop(&self) {
        drop(self.lock().take());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<brig_jail::zygote::Zygote>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The brig binary, for the launch helper. Tests and packagers may point elsewhere.
fn helper_binary() -> PathBuf {
    std::env::var_os("BRIG_HELPER_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"))
}
