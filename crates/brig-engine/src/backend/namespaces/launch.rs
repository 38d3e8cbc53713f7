//! Starting a session's sandbox from a multi-threaded daemon.
//!
//! The daemon never forks: it runs `brig __session-start` (its own binary, through
//! /proc/self/exe), a single-threaded helper that reads a [`LaunchRequest`] on stdin,
//! resolves and locks the image, binds the agent socket, starts the sandbox with
//! [`brig_jail::start_session`] and prints a [`LaunchReply`] on stdout. The helper
//! exits at once; because the daemon is a child subreaper, the sandbox's init becomes
//! the daemon's child. Measured cost of the extra exec: see BENCHMARKS.md.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
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

/// `brig __session-start`: runs in a fresh single-threaded process.
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
    let mut child = tokio::process::Command::new(helper_binary())
        .arg("__session-start")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ApiError::internal(format!("start the launch helper: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        stdin
            .write_all(&input)
            .await
            .map_err(|e| ApiError::internal(format!("talk to the launch helper: {e}")))?;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| ApiError::internal(format!("wait for the launch helper: {e}")))?;
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

/// The brig binary, for the launch helper. Tests and packagers may point elsewhere.
fn helper_binary() -> PathBuf {
    std::env::var_os("BRIG_HELPER_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"))
}
