//! The daemon's shared state, handed to every handler as `State<AppState>`.
//!
//! `Shared` is built in two steps: [`Shared::new`] opens everything the foundation
//! owns (database, keys, metrics); live sandboxes (`crate::sessions::Sessions`) start
//! afterwards with the finished `Shared` and are put in [`Shared::sessions`]. Handlers
//! reach them through [`Shared::sessions`] (set before the daemon serves).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::{watch, OnceCell};

use crate::auth::Auth;
use crate::catalog::Catalog;
use crate::config::Config;
use crate::db::Db;
// The domain error; the front ends decide how it is answered.
use crate::fault::Error as ApiError;
use crate::metrics::Metrics;
use crate::sessions::{Holds, Sessions};

/// What every handler shares.
pub struct Shared {
    /// The daemon's settings (named `args` after the flags they come from).
    pub args: Config,
    /// `--data-dir`, created with mode 0700.
    pub data_dir: PathBuf,
    /// The state of tenants, sessions, files and the rest (see [`Catalog`]).
    pub db: Arc<dyn Catalog>,
    pub auth: Auth,
    pub metrics: Metrics,
    /// The kind of sandbox this daemon starts (`Config::backend`).
    pub backend: Arc<dyn crate::backend::Backend>,
    /// Set once by `boot::start` after `Sessions::start`; see [`Shared::sessions`].
    pub sessions: OnceCell<Sessions>,
    /// Volumes and bundles claimed by session creates under way.
    pub holds: Holds,
    /// Refusals recorded one by one; the rest are summed up (`audit::RefusalBudget`).
    pub refusals: crate::audit::RefusalBudget,
    /// The egress settings and the audit channel of sessions' proxies.
    pub egress: crate::egress::Egress,
    /// A background build of the default image, if one is under way or failed.
    pub default_image_build: crate::default_image::DefaultImageBuild,
    shutdown: watch::Sender<bool>,
    /// Held for as long as the state lives; see [`DataDirLock`].
    _data_dir_lock: DataDirLock,
}

/// The state type of the router.
pub type AppState = Arc<Shared>;

/// Runs `job` at once and then every `interval` (a late run delays the next, never
/// doubles it), for as long as the state lives: the task holds it only weakly, so
/// a stopped daemon's state is dropped rather than kept by its housekeeping.
pub fn spawn_periodic<F, Fut>(
    state: &AppState,
    interval: std::time::Duration,
    job: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(AppState) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let weak = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(state) = weak.upgrade() else { return };
            job(state).await;
        }
    })
}

impl Shared {
    /// Creates the data dir (0700) and opens the database, keys and metrics. Does not
    /// validate `args` (see `Config::validate`), create the admin key or start
    /// sessions: `boot::start` does all of that in order.
    pub async fn new(args: Config) -> anyhow::Result<AppState> {
        let backend = crate::backend::from_config(&args);
        Shared::with_backend(args, backend).await
    }

    /// [`Shared::new`] with a backend of the caller's (the engine's tests: a fake).
    pub async fn with_backend(
        args: Config,
        backend: Arc<dyn crate::backend::Backend>,
    ) -> anyhow::Result<AppState> {
        let data_dir = args.data_dir.clone();
        create_private_dir(&data_dir)?;
        let data_dir_lock = DataDirLock::acquire(&data_dir)?;
        let db_path = data_dir.join("brig.db");
        let db: Arc<dyn Catalog> = Arc::new(
            tokio::task::spawn_blocking(move || Db::open(&db_path))
                .await
                .context("the database open task failed")??,
        );
        let auth = Auth::new(db.clone(), &args).await?;
        let egress = crate::egress::Egress::new(&args)?;
        let (shutdown, _) = watch::channel(false);
        Ok(Arc::new(Shared {
            args,
            data_dir,
            db,
            auth,
            metrics: Metrics::global(),
            backend,
            sessions: OnceCell::new(),
            holds: Holds::default(),
            refusals: Default::default(),
            egress,
            default_image_build: Default::default(),
            shutdown,
            _data_dir_lock: data_dir_lock,
        }))
    }

    /// The live sandboxes. `boot::start` sets them before anything is served, so
    /// handlers may rely on them.
    ///
    /// # Panics
    /// If called before `Sessions::start` finished (a bug in the startup order, never
    /// a consequence of a request). Use [`Shared::try_sessions`] where that can happen.
    pub fn sessions(&self) -> &Sessions {
        match self.sessions.get() {
            Some(sessions) => sessions,
            None => panic!("Shared::sessions() used before Sessions::start"),
        }
    }

    /// The live sandboxes, or 503 `unavailable` before they started.
    pub fn try_sessions(&self) -> Result<&Sessions, ApiError> {
        self.sessions
            .get()
            .ok_or_else(|| ApiError::unavailable("sessions are not available yet"))
    }

    /// `--output-limit`: captured output per stream and exec.
    pub fn output_limit_bytes(&self) -> u64 {
        self.args.output_limit_bytes
    }

    /// Where uploaded files live: `<data-dir>/files`.
    pub fn files_dir(&self) -> PathBuf {
        self.data_dir.join("files")
    }

    /// Marks the daemon as shutting down (new work should answer 503).
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Resolves once shutdown has begun (at once if it already has).
    pub async fn shutdown_requested(&self) {
        let mut rx = self.shutdown.subscribe();
        // wait_for fails only if the sender is dropped, which cannot happen while
        // `self` is alive.
        let _ = rx.wait_for(|down| *down).await;
    }
}

/// One daemon per data dir: an exclusive `flock` on `<data-dir>/daemon.lock`, which
/// holds the owner's pid for the message. A second daemon on the same data dir would
/// take the first one's sessions and pool sandboxes for those of a dead predecessor
/// and destroy or re-attach them; it stops here instead, before touching anything.
/// The kernel drops the lock when the daemon dies, however it dies (the descriptor is
/// close-on-exec, so no sandbox inherits it), so a restart after a crash is never
/// refused.
struct DataDirLock {
    _file: std::fs::File,
}

impl DataDirLock {
    fn acquire(data_dir: &Path) -> anyhow::Result<DataDirLock> {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let path = data_dir.join("daemon.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if let Err(e) =
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        {
            if e != rustix::io::Errno::WOULDBLOCK {
                anyhow::bail!("cannot lock {}: {e}", path.display());
            }
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            let owner = match owner.trim() {
                "" => String::new(),
                pid => format!(" (pid {pid})"),
            };
            anyhow::bail!(
                "another brig serve{owner} is using {}: stop it first, or give this one \
                 another --data-dir",
                data_dir.display()
            );
        }
        // A predecessor's address is no longer this daemon's: until this one has
        // bound its own, the CLI must find none (see `running_daemon_address`).
        match std::fs::remove_file(data_dir.join(LISTEN_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!(
                "cannot remove {}: {e}",
                data_dir.join(LISTEN_FILE).display()
            ),
        }
        // Best effort: the pid only makes the message above more helpful.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(DataDirLock { _file: file })
    }
}

/// The file in the data dir naming the address the daemon holding the data dir's
/// lock serves on. The CLI, as root on the daemon's host, sends the admin key only
/// to that address: to any other (a mistyped or copied `BRIG_URL`, or a port another
/// user bound while the daemon was down) it would hand over the daemon.
pub const LISTEN_FILE: &str = "listen";

/// Records the address the daemon on `data_dir` serves on (after it holds the lock).
pub fn record_listen_address(data_dir: &Path, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let path = data_dir.join(LISTEN_FILE);
    std::fs::write(&path, format!("{addr}\n"))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The address of the daemon running on `data_dir`: `None` when none is (nobody
/// holds its lock, so whatever listens at an old address is not it) or it has not
/// recorded one yet.
pub fn running_daemon_address(data_dir: &Path) -> Option<std::net::SocketAddr> {
    if !flock_is_held(&data_dir.join("daemon.lock"))? {
        return None;
    }
    std::fs::read_to_string(data_dir.join(LISTEN_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether some process holds a `flock` on the file at `path`, read from
/// `/proc/locks` rather than by trying to take it: a daemon starting at that moment
/// would find it taken and refuse to start.
fn flock_is_held(path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let id = format!(
        "{:02x}:{:02x}:{}",
        rustix::fs::major(meta.dev()),
        rustix::fs::minor(meta.dev()),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`; a waiter's line has `->`
    // after the number, and holds nothing.
    Some(locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"FLOCK") && fields.get(5) == Some(&id.as_str())
    }))
}

/// Creates `dir` and its missing parents with mode 0700 (created with the mode, so
/// there is no window with wider permissions). An existing directory that group or
/// others may enter is made 0700 too: one made by `mkdir` or systemd's
/// `StateDirectory=` is 0755, and the database (every tenant's audit), the sessions'
/// directories and the listen file are created inside it with modes that count on
/// the data dir to keep other users out.
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("cannot read the mode of {}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private (0700)", dir.display()))?;
        tracing::warn!(
            dir = %dir.display(),
            was = format_args!("{:o}", mode & 0o7777),
            "the data dir was open to other users; made it 0700"
        );
    }
    Ok(())
}
