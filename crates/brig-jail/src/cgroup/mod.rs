//! cgroup v1, v2 and hybrid hosts: one sandbox's memory, pids and CPU limits, its
//! accounting, freezing and killing.
//!
//! - [`Layout`] finds where each controller lives (`layout.rs`).
//! - [`Cgroup::create`] makes the sandbox's leaf cgroup(s) and writes every limit
//!   before any process joins: one leaf per v1 hierarchy used (`v1.rs`) and/or one
//!   v2 leaf (`v2.rs`). On a hybrid host each controller comes from v2 if the v2 root
//!   lists it in `cgroup.controllers`, else from v1.
//! - Where leaves go: on v1 under the caller's own cgroup of each hierarchy (so limits
//!   put on brig itself still apply), on v2 under the v2 root (a v2 cgroup holding
//!   processes cannot have controllers enabled for its children). `CgroupConfig::parent`
//!   overrides both; on systemd hosts operators should pass a parent delegated to brig
//!   (e.g. a `Delegate=yes` slice). Missing parent directories are created and kept.
//! - Nothing is removed implicitly: dropping a [`Cgroup`] leaves the kernel state alone
//!   (the watchdog relies on it), and [`Cgroup::remove`] only ever removes the leaves this
//!   `Cgroup` created, never parents and never anything found by name.

mod fs;
mod layout;
mod v1;
mod v2;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use brig_policy::Limits;
use serde::{Deserialize, Serialize};

pub use layout::{CgroupVersion, Controller, Hierarchy, Layout, V1Hierarchy, V2Hierarchy};

use crate::JailError;
use fs::Backend;

/// How long `remove` retries a leaf that is still busy (processes exiting).
const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `kill_all` keeps killing before giving up.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `freeze` waits for the requested state.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `kill_all` waits for a freeze before killing anyway.
const KILL_FREEZE_TIMEOUT: Duration = Duration::from_millis(500);
const POLL: Duration = Duration::from_millis(10);
/// The CFS period brig uses; the quota is `cpus_millis * 100` µs of it.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Where the sandboxes' cgroups go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupConfig {
    /// A path relative to each hierarchy's root (e.g. `brig.slice/sandboxes`); `None`
    /// means the caller's own cgroup on v1 and the v2 root on v2.
    pub parent: Option<String>,
}

/// What a sandbox's cgroups enforce, for logs and the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupEnforced {
    pub version: CgroupVersion,
    /// Each controller in use: the hierarchy it comes from, its leaf, and the
    /// interface files written with their values (only limits that were asked for).
    pub controllers: BTreeMap<Controller, ControllerEnforced>,
    /// Every leaf created, in creation order.
    pub leaves: Vec<PathBuf>,
    /// What is not enforced or not available, one line each (e.g. swap not limited).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerEnforced {
    pub hierarchy: Hierarchy,
    pub leaf: PathBuf,
    /// Interface file name → value written, e.g. `"memory.max": "67108864"`.
    pub written: BTreeMap<String, String>,
}

/// Accounting read from the sandbox's cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Processes killed by the OOM killer inside the sandbox (0 if unknown).
    pub oom_kills: u64,
    /// Highest memory use seen; `None` when the kernel does not report it.
    pub memory_peak_bytes: Option<u64>,
    /// CPU time used by all the sandbox's processes.
    pub cpu_time_ns: Option<u64>,
}

/// What a sandbox uses at the moment it is read (as its limits count it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupUsage {
    /// Memory charged to the sandbox: its processes' and the page cache and tmpfs
    /// files it made (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub memory_bytes: Option<u64>,
    /// Processes and threads (`pids.current`; without a pids controller, the tasks
    /// listed in the memory cgroup).
    pub tasks: Option<u64>,
}

/// One sandbox's cgroup(s). Dropping it removes nothing; see [`Cgroup::remove`].
///
/// It serializes to its [`CgroupEnforced`], so a restarted daemon can rebuild it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroup {
    enforced: CgroupEnforced,
    #[serde(skip)]
    backend: Backend,
}

/// What a sandbox uses its cgroup for besides its limits. Memory accounting (peak,
/// OOM kills) is always wanted; on v1, where every controller is a hierarchy of its
/// own, each unneeded one saves a leaf to create and remove per sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uses {
    /// CPU time from `cpuacct` (a one-shot run gets it from rusage instead).
    pub cpu_accounting: bool,
    /// Pause and resume (sessions).
    pub freezer: bool,
}

impl Uses {
    pub const ALL: Uses = Uses {
        cpu_accounting: true,
        freezer: true,
    };

    fn wants(self, controller: Controller, limits: &Limits) -> bool {
        match controller {
            Controller::Memory => true,
            Controller::Cpuacct => self.cpu_accounting,
            Controller::Freezer => self.freezer,
            Controller::Pids | Controller::Cpu => limit(controller, limits).is_some(),
        }
    }
}

impl Cgroup {
    /// Creates the leaf named `name` in every hierarchy used and writes every limit
    /// before any process joins. Fails, removing what it created, if a requested limit
    /// cannot be applied. A hierarchy no limit needs is skipped (with a note) when its
    /// leaf cannot be made.
    pub fn create(
        layout: &Layout,
        config: &CgroupConfig,
        name: &str,
        limits: &Limits,
    ) -> Result<Cgroup, JailError> {
        Self::create_for(layout, config, name, limits, Uses::ALL)
    }

    /// [`Cgroup::create`], skipping v1 hierarchies that neither a limit nor `uses` needs.
    pub fn create_for(
        layout: &Layout,
        config: &CgroupConfig,
        name: &str,
        limits: &Limits,
        uses: Uses,
    ) -> Result<Cgroup, JailError> {
        validate_name(name)?;
        let parent = parse_parent(config.parent.as_deref())?;

        // Check every requested limit has a controller before touching anything.
        for controller in [Controller::Memory, Controller::Pids, Controller::Cpu] {
            if limit(controller, limits).is_some() && layout.source(controller).is_none() {
                return Err(no_controller(layout, controller));
            }
        }

        let mut builder = Builder {
            backend: layout.backend,
            created: Vec::new(),
            enforced: CgroupEnforced {
                version: layout.version(),
                controllers: BTreeMap::new(),
                leaves: Vec::new(),
                notes: Vec::new(),
            },
        };
        match builder.build(layout, parent.as_deref(), name, limits, uses) {
            Ok(()) => {
                builder.enforced.leaves = builder.created.clone();
                tracing::debug!(leaves = ?builder.created, "cgroup created");
                Ok(Cgroup {
                    enforced: builder.enforced,
                    backend: layout.backend,
                })
            }
            Err(err) => {
                builder.rollback();
                Err(err)
            }
        }
    }

    /// Moves `pid` into every leaf (writes `cgroup.procs`).
    pub fn add_pid(&self, pid: i32) -> Result<(), JailError> {
        for leaf in &self.enforced.leaves {
            let procs = leaf.join("cgroup.procs");
            fs::write(&procs, &pid.to_string())
                .map_err(|err| write_error(&procs, &pid.to_string(), &err))?;
        }
        Ok(())
    }

    /// The `cgroup.procs` file of every leaf: writing a pid to each puts that
    /// process in this cgroup, every controller of it.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.enforced
            .leaves
            .iter()
            .map(|leaf| leaf.join("cgroup.procs"))
            .collect()
    }

    /// The v1 `tasks` files of this cgroup. A single-threaded process that writes "0"
    /// to them moves itself without the kernel's global threadgroup lock, whose first
    /// write-lock waits for an RCU grace period: 10-20 ms per sandbox measured on this
    /// host, against microseconds for the self-move (see BENCHMARKS.md).
    pub fn self_attach_files(&self) -> Vec<PathBuf> {
        self.enforced
            .leaves
            .iter()
            .filter(|leaf| self.leaf_hierarchy(leaf) == Some(Hierarchy::V1))
            .map(|leaf| leaf.join("tasks"))
            .collect()
    }

    /// Moves `pid` into the leaves that [`Cgroup::self_attach_files`] does not cover (v2).
    pub fn add_pid_except_self_attached(&self, pid: i32) -> Result<(), JailError> {
        for leaf in &self.enforced.leaves {
            if self.leaf_hierarchy(leaf) == Some(Hierarchy::V1) {
                continue;
            }
            let procs = leaf.join("cgroup.procs");
            fs::write(&procs, pid.to_string().as_str())
                .map_err(|err| write_error(&procs, &pid.to_string(), &err))?;
        }
        Ok(())
    }

    fn leaf_hierarchy(&self, leaf: &Path) -> Option<Hierarchy> {
        self.enforced
            .controllers
            .values()
            .find(|c| c.leaf == leaf)
            .map(|c| c.hierarchy)
    }

    pub fn enforced(&self) -> CgroupEnforced {
        self.enforced.clone()
    }

    pub fn leaf_paths(&self) -> Vec<PathBuf> {
        self.enforced.leaves.clone()
    }

    /// The `oom_kills` of [`Cgroup::stats`] alone: one file read instead of three,
    /// for a caller that wants nothing else (around every exec).
    pub fn oom_kills(&self) -> u64 {
        let Some(memory) = self.controller(Controller::Memory) else {
            return 0;
        };
        match memory.hierarchy {
            Hierarchy::V1 => v1::oom_kills(&memory.leaf),
            Hierarchy::V2 => v2::oom_kills(&memory.leaf),
        }
        .unwrap_or(0)
    }

    /// Reads the accounting; anything unreadable is reported as unknown (or 0 OOM kills).
    pub fn stats(&self) -> CgroupStats {
        let mut stats = CgroupStats::default();
        if let Some(memory) = self.controller(Controller::Memory) {
            let (oom, peak) = match memory.hierarchy {
                Hierarchy::V1 => (v1::oom_kills(&memory.leaf), v1::memory_peak(&memory.leaf)),
                Hierarchy::V2 => (v2::oom_kills(&memory.leaf), v2::memory_peak(&memory.leaf)),
            };
            stats.oom_kills = oom.unwrap_or(0);
            stats.memory_peak_bytes = peak;
        }
        if let Some(cpu) = self.controller(Controller::Cpuacct) {
            stats.cpu_time_ns = match cpu.hierarchy {
                Hierarchy::V1 => v1::cpu_time_ns(&cpu.leaf),
                Hierarchy::V2 => v2::cpu_time_ns(&cpu.leaf),
            };
        }
        stats
    }

    /// Reads what the sandbox uses now; anything unreadable is unknown.
    pub fn usage(&self) -> CgroupUsage {
        let memory = self.controller(Controller::Memory);
        let memory_bytes = memory.and_then(|m| match m.hierarchy {
            Hierarchy::V1 => v1::memory_now(&m.leaf),
            Hierarchy::V2 => v2::memory_now(&m.leaf),
        });
        let tasks = match self.controller(Controller::Pids) {
            Some(pids) => fs::read(&pids.leaf.join("pids.current"))
                .ok()
                .and_then(|text| fs::single_value(&text)),
            None => memory.and_then(|m| {
                let list = match m.hierarchy {
                    Hierarchy::V1 => "tasks",
                    Hierarchy::V2 => "cgroup.threads",
                };
                fs::read(&m.leaf.join(list))
                    .ok()
                    .map(|text| text.lines().filter(|l| !l.trim().is_empty()).count() as u64)
            }),
        };
        CgroupUsage {
            memory_bytes,
            tasks,
        }
    }

    /// Kills every process in the sandbox's cgroups and waits until they are gone.
    ///
    /// v2 with `cgroup.kill` (Linux 5.14+): one write, then wait. Otherwise: freeze
    /// (when a freezer is available, so nothing can fork or exit meanwhile), SIGKILL
    /// every listed process, thaw, until the lists are empty. Processes are signalled
    /// through a pidfd taken before re-checking membership, so a recycled pid of an
    /// unrelated process is never hit. Bounded by a few seconds.
    pub fn kill_all(&self) -> Result<(), JailError> {
        let deadline = Instant::now() + KILL_TIMEOUT;
        if let Some(leaf) = self.v2_leaf() {
            let kill = leaf.join("cgroup.kill");
            if kill.exists() {
                fs::write(&kill, "1").map_err(|err| write_error(&kill, "1", &err))?;
                return self.wait_empty(deadline);
            }
        }
        let has_freezer = self.controller(Controller::Freezer).is_some();
        loop {
            // Usually empty already (init's death ended its pid namespace). Freezing an
            // empty group would be wasted and is not cheap on v1: the first group
            // frozen on the host flips a static key, which rewrites kernel text with
            // an interrupt to every CPU, and thawing flips it back.
            if self.procs()?.is_empty() {
                return Ok(());
            }
            let froze = has_freezer && self.request_freeze(true).is_ok();
            if froze {
                // Killing a half-frozen group still works: keep going after the timeout.
                let _ = self.wait_frozen(true, Instant::now() + KILL_FREEZE_TIMEOUT);
            }
            let signalled = self.signal_members();
            if froze {
                // SIGKILLed tasks only die once thawed.
                self.request_freeze(false)?;
            }
            if !signalled? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(JailError::Cgroup(format!(
                    "processes still alive in {} after {} s of SIGKILL: check for tasks stuck in the kernel (state D)",
                    self.describe_leaves(),
                    KILL_TIMEOUT.as_secs()
                )));
            }
            sleep(POLL);
        }
    }

    /// Removes every leaf this `Cgroup` created, retrying briefly while one is busy
    /// (its processes still exiting). A leaf already gone is fine.
    pub fn remove(&self) -> Result<(), JailError> {
        let deadline = Instant::now() + REMOVE_TIMEOUT;
        let mut first_error = None;
        for leaf in self.enforced.leaves.iter().rev() {
            loop {
                match self.backend.rmdir(leaf) {
                    Ok(()) => break,
                    Err(err) if err.kind() == io::ErrorKind::NotFound => break,
                    Err(err)
                        if err.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        sleep(POLL)
                    }
                    Err(err) => {
                        let what = if err.raw_os_error() == Some(libc::EBUSY) {
                            "it still holds processes or child cgroups: call kill_all first"
                        } else {
                            fs::hint(&err)
                        };
                        first_error.get_or_insert(JailError::Cgroup(format!(
                            "cannot remove {}: {err}; {what}",
                            leaf.display()
                        )));
                        break;
                    }
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(err) => Err(err),
        }
    }

    /// Freezes (`true`) or thaws (`false`) every process of the sandbox and waits until
    /// the state is reached: v2 `cgroup.freeze`, v1 `freezer.state`.
    pub fn freeze(&self, frozen: bool) -> Result<(), JailError> {
        self.request_freeze(frozen)?;
        self.wait_frozen(frozen, Instant::now() + FREEZE_TIMEOUT)
    }

    fn controller(&self, controller: Controller) -> Option<&ControllerEnforced> {
        self.enforced.controllers.get(&controller)
    }

    fn v2_leaf(&self) -> Option<&Path> {
        self.enforced
            .controllers
            .values()
            .find(|c| c.hierarchy == Hierarchy::V2)
            .map(|c| c.leaf.as_path())
    }

    fn freezer(&self) -> Result<&ControllerEnforced, JailError> {
        self.controller(Controller::Freezer).ok_or_else(|| {
            JailError::Cgroup(
                "no freezer for this sandbox (no v1 freezer hierarchy and no v2 leaf): pause/resume is unavailable on this host"
                    .to_string(),
            )
        })
    }

    fn request_freeze(&self, frozen: bool) -> Result<(), JailError> {
        let freezer = self.freezer()?;
        let (file, value) = match freezer.hierarchy {
            Hierarchy::V1 => ("freezer.state", if frozen { "FROZEN" } else { "THAWED" }),
            Hierarchy::V2 => ("cgroup.freeze", if frozen { "1" } else { "0" }),
        };
        let path = freezer.leaf.join(file);
        fs::write(&path, value).map_err(|err| write_error(&path, value, &err))
    }

    fn wait_frozen(&self, frozen: bool, deadline: Instant) -> Result<(), JailError> {
        let freezer = self.freezer()?;
        loop {
            let reached = match freezer.hierarchy {
                Hierarchy::V1 => fs::read(&freezer.leaf.join("freezer.state"))
                    .is_ok_and(|state| state.trim() == if frozen { "FROZEN" } else { "THAWED" }),
                Hierarchy::V2 => {
                    fs::read(&freezer.leaf.join("cgroup.events"))
                        .ok()
                        .and_then(|events| fs::keyed_value(&events, "frozen"))
                        == Some(u64::from(frozen))
                }
            };
            if reached {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(JailError::Cgroup(format!(
                    "{} did not become {} within {} ms: a task may be stuck in the kernel; retry or kill the sandbox",
                    freezer.leaf.display(),
                    if frozen { "frozen" } else { "thawed" },
                    FREEZE_TIMEOUT.as_millis()
                )));
            }
            // v1 may stay FREEZING while tasks are busy; writing FROZEN again retries them.
            if frozen && freezer.hierarchy == Hierarchy::V1 {
                let _ = self.request_freeze(true);
            }
            sleep(POLL);
        }
    }

    /// Every process listed in any leaf.
    pub(crate) fn procs(&self) -> Result<BTreeSet<i32>, JailError> {
        let mut pids = BTreeSet::new();
        for leaf in &self.enforced.leaves {
            let path = leaf.join("cgroup.procs");
            match fs::read(&path) {
                Ok(text) => pids.extend(fs::pid_list(&text)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(JailError::Cgroup(format!(
                        "cannot read {}: {err}; {}",
                        path.display(),
                        fs::hint(&err)
                    )))
                }
            }
        }
        Ok(pids)
    }

    /// SIGKILLs every member; returns whether there were any.
    fn signal_members(&self) -> Result<bool, JailError> {
        let pids = self.procs()?;
        if pids.is_empty() {
            return Ok(false);
        }
        if self.backend == Backend::FakeTree {
            // The pids of a fake tree are not real processes.
            return Ok(true);
        }
        let mut pinned = Vec::new();
        let mut unpinned = Vec::new();
        for &pid in &pids {
            match pidfd_open(pid) {
                Ok(fd) => pinned.push((pid, fd)),
                Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
                Err(_) => unpinned.push(pid),
            }
        }
        // A pid still listed after its pidfd was taken is ours: the pidfd cannot
        // refer to a process that replaced it.
        let still = self.procs()?;
        for (pid, fd) in &pinned {
            if still.contains(pid) {
                let _ = pidfd_send_sigkill(fd);
            }
        }
        for pid in unpinned {
            if still.contains(&pid) {
                // Kernel without pidfds (< 5.3): a small pid-reuse window remains.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        Ok(true)
    }

    fn wait_empty(&self, deadline: Instant) -> Result<(), JailError> {
        loop {
            if self.procs()?.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(JailError::Cgroup(format!(
                    "processes still alive in {} after {} s: check for tasks stuck in the kernel (state D)",
                    self.describe_leaves(),
                    KILL_TIMEOUT.as_secs()
                )));
            }
            sleep(POLL);
        }
    }

    fn describe_leaves(&self) -> String {
        self.enforced
            .leaves
            .iter()
            .map(|leaf| leaf.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Collects what `create` made, so a failure can undo exactly that.
struct Builder {
    backend: Backend,
    created: Vec<PathBuf>,
    enforced: CgroupEnforced,
}

impl Builder {
    fn build(
        &mut self,
        layout: &Layout,
        parent: Option<&Path>,
        name: &str,
        limits: &Limits,
        uses: Uses,
    ) -> Result<(), JailError> {
        if layout.uses_v2_leaf() {
            let hierarchy = layout.v2().expect("a v2 leaf implies a v2 hierarchy");
            v2::create(self, layout, hierarchy, parent, name, limits)?;
        }
        for (index, hierarchy) in layout.v1_hierarchies().iter().enumerate() {
            let roles: Vec<Controller> = Controller::ALL
                .into_iter()
                .filter(|&c| {
                    layout.source(c) == Some(Hierarchy::V1)
                        && layout.v1_index(c) == Some(index)
                        && uses.wants(c, limits)
                })
                .collect();
            if !roles.is_empty() {
                v1::create(self, hierarchy, &roles, parent, name, limits)?;
            }
        }
        Ok(())
    }

    /// Creates the directories of `parent` below `root` that are missing. They are
    /// shared by all sandboxes and never removed by brig.
    fn ensure_parent(&self, root: &Path, parent: Option<&Path>) -> Result<PathBuf, JailError> {
        let mut dir = root.to_path_buf();
        if let Some(parent) = parent {
            for component in parent.components() {
                dir.push(component);
                match self.backend.mkdir(&dir) {
                    Ok(()) => tracing::debug!(dir = %dir.display(), "cgroup parent created"),
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(err) => return Err(mkdir_error(&dir, &err)),
                }
            }
        }
        Ok(dir)
    }

    /// Creates a leaf; it must not exist yet (a leaf found there is not ours to adopt).
    fn make_leaf(&mut self, leaf: &Path) -> io::Result<()> {
        self.backend.mkdir(leaf)?;
        self.created.push(leaf.to_path_buf());
        Ok(())
    }

    fn use_controller(&mut self, controller: Controller, hierarchy: Hierarchy, leaf: &Path) {
        self.enforced
            .controllers
            .entry(controller)
            .or_insert_with(|| ControllerEnforced {
                hierarchy,
                leaf: leaf.to_path_buf(),
                written: BTreeMap::new(),
            });
    }

    /// Writes a limit file of `controller`'s leaf and records it.
    fn write(&mut self, controller: Controller, file: &str, value: &str) -> Result<(), JailError> {
        let entry = self
            .enforced
            .controllers
            .get_mut(&controller)
            .expect("use_controller before write");
        let path = entry.leaf.join(file);
        fs::write(&path, value).map_err(|err| write_error(&path, value, &err))?;
        entry.written.insert(file.to_string(), value.to_string());
        Ok(())
    }

    fn note(&mut self, note: String) {
        tracing::debug!("cgroup: {note}");
        self.enforced.notes.push(note);
    }

    fn rollback(&mut self) {
        for leaf in self.created.drain(..).rev() {
            if let Err(err) = self.backend.rmdir(&leaf) {
                tracing::warn!(
                    "cgroup: cannot remove {} after a failed setup: {err}",
                    leaf.display()
                );
            }
        }
    }
}

/// The limit a controller enforces, if one was asked for.
fn limit(controller: Controller, limits: &Limits) -> Option<u64> {
    match controller {
        Controller::Memory => limits.memory_bytes,
        Controller::Pids => limits.pids,
        Controller::Cpu => limits.cpus_millis.map(u64::from),
        Controller::Cpuacct | Controller::Freezer => None,
    }
}

fn cpu_quota_us(cpus_millis: u64) -> u64 {
    cpus_millis * CPU_PERIOD_US / 1000
}

fn no_controller(layout: &Layout, controller: Controller) -> JailError {
    let name = controller.name();
    let limit = match controller {
        Controller::Memory => "memory",
        Controller::Pids => "pids",
        _ => "cpus",
    };
    let place = match layout.version() {
        CgroupVersion::V1 => format!("no v1 '{name}' hierarchy is mounted"),
        CgroupVersion::V2 => format!("the cgroup v2 root does not list '{name}' in cgroup.controllers"),
        CgroupVersion::Hybrid => format!(
            "neither the cgroup v2 root lists '{name}' in cgroup.controllers nor a v1 '{name}' hierarchy is mounted"
        ),
    };
    JailError::Cgroup(format!(
        "a {limit} limit was requested but {place}: enable the {name} controller or run without a {limit} limit"
    ))
}

fn write_error(path: &Path, value: &str, err: &io::Error) -> JailError {
    JailError::Cgroup(format!(
        "cannot write '{value}' to {}: {err}; {}",
        path.display(),
        fs::hint(err)
    ))
}

fn mkdir_error(path: &Path, err: &io::Error) -> JailError {
    JailError::Cgroup(format!(
        "cannot create {}: {err}; {}",
        path.display(),
        fs::hint(err)
    ))
}

fn validate_name(name: &str) -> Result<(), JailError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 200
        || name.contains(['/', '\0', '\n']);
    if bad {
        return Err(JailError::Cgroup(format!(
            "invalid cgroup name {name:?}: use 1-200 characters without '/', NUL or newline, not '.' or '..'"
        )));
    }
    Ok(())
}

/// The parent as a relative path of plain components ("" is the hierarchy root).
fn parse_parent(parent: Option<&str>) -> Result<Option<PathBuf>, JailError> {
    let Some(parent) = parent else {
        return Ok(None);
    };
    let mut path = PathBuf::new();
    for component in parent.split('/').filter(|c| !c.is_empty()) {
        if component == "." || component == ".." || component.contains(['\0', '\n']) {
            return Err(JailError::Cgroup(format!(
                "invalid cgroup parent {parent:?}: use a path relative to the hierarchy root without '.' or '..'"
            )));
        }
        path.push(component);
    }
    Ok(Some(path))
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1;
    // no memory is shared with the kernel.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn pidfd_send_sigkill(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: `fd` is a valid pidfd; a null siginfo is allowed (the kernel fills it in
    // as for kill(2)); flags must be 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
