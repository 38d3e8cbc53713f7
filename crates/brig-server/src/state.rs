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
use crate::config::ServeArgs;
use crate::db::Db;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::sessions::{Holds, Sessions};

/// What every handler shares.
pub struct Shared {
    pub args: ServeArgs,
    /// `--data-dir`, created with mode 0700.
    pub data_dir: PathBuf,
    pub db: Db,
    pub auth: Auth,
    pub metrics: Metrics,
    /// Set once by `server::start` after `Sessions::start`; see [`Shared::sessions`].
    pub sessions: OnceCell<Sessions>,
    /// Volumes and bundles claimed by session creates under way.
    pub holds: Holds,
    shutdown: watch::Sender<bool>,
}

/// The state type of the router.
pub type AppState = Arc<Shared>;

impl Shared {
    /// Creates the data dir (0700) and opens the database, keys and metrics. Does not
    /// validate `args` (see `ServeArgs::validate`), create the admin key or start
    /// sessions: `server::start` does all of that in order.
    pub async fn new(args: ServeArgs) -> anyhow::Result<AppState> {
        let data_dir = args.data_dir.clone();
        create_private_dir(&data_dir)?;
        let db_path = data_dir.join("brig.db");
        let db = tokio::task::spawn_blocking(move || Db::open(&db_path))
            .await
            .context("the database open task failed")??;
        let auth = Auth::new(db.clone(), &args).await?;
        let (shutdown, _) = watch::channel(false);
        Ok(Arc::new(Shared {
            args,
            data_dir,
            db,
            auth,
            metrics: Metrics::global(),
            sessions: OnceCell::new(),
            holds: Holds::default(),
            shutdown,
        }))
    }

    /// The live sandboxes. `server::start` sets them before anything is served, so
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

/// Creates `dir` and its missing parents with mode 0700 (created with the mode, so
/// there is no window with wider permissions). An existing directory is left as is.
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}
