//! What the engine needs of a kind of sandbox, and nothing more: the sessions code
//! holds an `Arc<dyn Backend>` (one per daemon, chosen by `Config::backend`) and an
//! `Arc<dyn Sandbox>` per live sandbox, and never reaches past them into `/proc`,
//! cgroups or the agent socket. So a sandbox without `/proc/<pid>/root` or
//! fd-passing (gVisor) can be added as another `Backend`, and the engine can be
//! tested without root through `fake` (the engine's tests' own).
//!
//! Exec goes through a [`Link`]: the request/reply exchange with the sandbox's init
//! of brig-jail's agent protocol, with the command's stdio handed over as
//! descriptors the engine made. The namespace backend sends them over init's
//! socket (`SCM_RIGHTS`); another backend may use them as the stdio of whatever
//! starts the command in its sandbox. Keeping the protocol's types lets exec,
//! processes and snapshots stay what they are for every backend.

#[cfg(test)]
pub mod fake;
pub mod namespaces;

use std::any::Any;
use std::future::Future;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use brig_jail::agent::{AgentReply, AgentRequest};
use brig_jail::cgroup::{Cgroup, CgroupStats, CgroupUsage};
use brig_policy::SandboxSpec;

use crate::fault::Error as ApiError;
use crate::rootfs::{Filler, RootfsError, SandboxRoot};

/// How long init may take to answer a request (other than an exec's wait for its
/// command). It answers nothing while a process in the sandbox holds the command
/// it is starting stopped (SIGSTOP before its execve, which init waits for), so
/// every wait for it is bounded.
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Init did not answer within [`ANSWER_TIMEOUT`].
pub fn not_answering() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the session's init did not answer within {} s: a process in the session may \
             hold the command it is starting stopped (SIGSTOP); continue that process or \
             delete the session",
            ANSWER_TIMEOUT.as_secs()
        ),
    )
}

/// Object-safe async methods: boxed futures (no `async_trait` dependency).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The kinds of sandbox a daemon can run. A session's row records its kind (the
/// `backend` column): a daemon re-attaches the rows of its own kind and leaves the
/// others for one that runs theirs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// Linux namespaces, cgroups, seccomp and Landlock, started by the launch helper.
    #[default]
    Namespaces,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Namespaces => "namespaces",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendKind, String> {
        match s {
            "namespaces" => Ok(BackendKind::Namespaces),
            other => Err(format!("unknown sandbox backend {other:?}")),
        }
    }
}

/// The backend a daemon runs with `config`.
pub fn from_config(config: &crate::Config) -> Arc<dyn Backend> {
    match config.backend {
        BackendKind::Namespaces => Arc::new(namespaces::Namespaces::new(config)),
    }
}

/// What a session asks to be started.
pub struct Launch {
    /// The session's directory, where the backend may keep what it needs (made by
    /// the backend; removed by the engine when the session ends).
    pub dir: PathBuf,
    pub spec: SandboxSpec,
    /// An image of the store as the root.
    pub image: Option<String>,
    /// A host snapshot's store image that fills /tmp and /workspace.
    pub seed: Option<String>,
    /// Started ahead of need (the warm pool): may run at a lower priority until
    /// [`Sandbox::to_foreground`].
    pub background: bool,
    /// See [`Facts::process_base`].
    pub process_base: u64,
}

/// Starts and finds sandboxes of one kind.
pub trait Backend: Send + Sync {
    /// The name in a session's `backend` column.
    fn kind(&self) -> &'static str;

    /// Once, before anything is launched or re-attached.
    fn prepare(&self) -> anyhow::Result<()>;

    fn launch(&self, launch: Launch) -> BoxFuture<'_, Result<Arc<dyn Sandbox>, ApiError>>;

    /// The sandbox a stored `runtime` (see [`Sandbox::runtime`]) describes, if it
    /// can be read; it may have ended meanwhile (see [`Sandbox::reachable`]).
    fn reattach(&self, runtime: &str) -> Option<Arc<dyn Sandbox>>;

    /// Destroys what the session directory `dir` holds of sandboxes a previous
    /// daemon started but never stored (it died between a launch and its row), but
    /// `current`, the session's live sandbox.
    fn sweep<'a>(&'a self, dir: &'a Path, current: Option<&'a dyn Sandbox>) -> BoxFuture<'a, ()>;

    /// Once, as the daemon stops: ends what the backend runs for itself. Sandboxes
    /// are not among it: they outlive the daemon.
    fn shutdown(&self) {}
}

/// What the engine reads of a started sandbox, whatever its kind.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// What isolation was applied, for the API.
    pub enforced: serde_json::Value,
    /// The environment every exec starts from (brig's defaults, the image's).
    pub env: Vec<(String, String)>,
    /// The default working directory.
    pub cwd: String,
    /// The image it was started from, if any (for snapshots).
    pub image: Option<String>,
    /// What brig itself placed in the root (left out of snapshots).
    pub placeholders: Vec<String>,
    /// What the API adds to init's job ids to make process ids: 0 for a session's
    /// first sandbox; a restore's sandbox starts after the highest process id the
    /// session has used, so an id never names two processes of one session.
    pub process_base: u64,
}

impl Facts {
    /// The API's id of this sandbox's job `job`.
    pub fn process_id(&self, job: u64) -> u64 {
        self.process_base + job
    }

    /// This sandbox's job of process `process_id`; `None` for a process of a sandbox
    /// a restore replaced.
    pub fn job(&self, process_id: u64) -> Option<u64> {
        process_id
            .checked_sub(self.process_base)
            .filter(|job| *job > 0)
    }
}

/// What a sandbox wrote, as its init hands it over for a snapshot.
pub enum Captured {
    /// The upper layer of an image's root.
    Upper(OwnedFd),
    /// A host sandbox's private directories, by name (`tmp`, `workspace`).
    Scratch(Vec<(String, OwnedFd)>),
}

/// One started sandbox.
pub trait Sandbox: Send + Sync {
    fn facts(&self) -> &Facts;

    /// What a session's row stores to find the sandbox again ([`Backend::reattach`]).
    fn runtime(&self) -> Result<String, ApiError>;

    /// For a backend's own downcasts (its `sweep`).
    fn as_any(&self) -> &dyn Any;

    /// Its init still runs (the same process it started as).
    fn is_alive(&self) -> bool;

    /// Alive and still reachable: worth re-attaching to.
    fn reachable(&self) -> bool;

    /// Resolves when the sandbox ends by itself (`true`), or at once with `false`
    /// if it cannot be watched.
    fn ended(&self) -> BoxFuture<'static, bool>;

    /// Kills everything in it and frees what it held on the host.
    fn destroy(&self) -> BoxFuture<'static, Result<(), String>>;

    /// Removes what it left beside its session's other sandboxes (a restore's old
    /// one: its socket and launch record), once destroyed.
    fn forget(&self) -> BoxFuture<'static, ()>;

    fn freeze(&self, frozen: bool) -> BoxFuture<'static, Result<(), ApiError>>;

    /// A pooled sandbox taken: back to normal priority.
    fn to_foreground(&self) -> Result<(), String>;

    /// The same sandbox once its session directory has been renamed to `dir`.
    fn moved_to(&self, dir: &Path) -> Arc<dyn Sandbox>;

    /// A new connection to its init.
    fn connect(&self) -> io::Result<Box<dyn Link>>;

    /// The root, for file operations resolved inside it.
    fn root(&self) -> Result<SandboxRoot, RootfsError>;

    /// Whom blocking file operations act as (host uid and gid); `None`: the daemon.
    fn file_user(&self) -> Option<(u32, u32)>;

    /// What writes file data into it, charged to the sandbox (blocking).
    fn filler(&self, idle: std::time::Duration) -> io::Result<Box<dyn Filler + Send>>;

    /// What it wrote, for a snapshot (`upper`: it runs on an image).
    fn capture_writes(&self, upper: bool) -> BoxFuture<'_, Result<Captured, ApiError>>;

    /// Its cgroup accounting and usage (blocking; defaults where there is none).
    fn stats(&self) -> (CgroupStats, CgroupUsage);

    /// The OOM killer's kills in it so far, if counted.
    fn oom_kills(&self) -> Option<u64>;

    /// The cgroup and init pid of its processes, to count their file locks.
    fn lock_scope(&self) -> Option<(&Cgroup, i32)>;

    /// The cgroup files that work done for it (snapshot packing) may join.
    fn charge_to(&self) -> Vec<PathBuf>;

    /// Makes `listen`'s sockets (and `capture`'s rules) inside its network
    /// namespace, for brig's egress proxy (blocking). A backend without one says so.
    fn bind_net(
        &self,
        listen: &[brig_jail::net::Listen],
        capture: Option<brig_jail::net::Capture>,
    ) -> Result<Vec<OwnedFd>, String> {
        let _ = (listen, capture);
        Err("this sandbox backend offers no egress".into())
    }
}

/// A connection to a sandbox's init speaking brig-jail's agent protocol.
pub trait Link: Send {
    /// Sends a request; `fds` go with it (an exec's stdin, stdout, stderr).
    fn send<'a>(
        &'a self,
        request: &'a AgentRequest,
        fds: &'a [BorrowedFd<'a>],
    ) -> BoxFuture<'a, io::Result<()>>;

    /// The next reply; an error when init closed the connection (it exited).
    fn recv(&mut self) -> BoxFuture<'_, io::Result<(AgentReply, Vec<OwnedFd>)>>;
}

impl dyn Link {
    /// One request, one reply, within [`ANSWER_TIMEOUT`].
    pub async fn call(&mut self, request: &AgentRequest) -> io::Result<(AgentReply, Vec<OwnedFd>)> {
        let answer = async {
            self.send(request, &[]).await?;
            self.recv().await
        };
        tokio::time::timeout(ANSWER_TIMEOUT, answer)
            .await
            .unwrap_or_else(|_| Err(not_answering()))
    }
}
