//! The parent side of a run: prepares everything, clones the sandbox's init, watches
//! it (output, timeout, signals) and cleans up.
//!
//! Process layout while a sandbox runs:
//!
//! ```text
//! brig (this process, single-threaded)
//!  ├── brig-watchdog   shares brig's memory and holds the id lease; removes the
//!  │                   cgroup once the sandbox is gone, or, if brig dies (even by
//!  │                   SIGKILL), kills the cgroup's processes and removes it
//!  └── init (PID 1 of the sandbox's namespaces, dies with brig via PDEATHSIG)
//!       └── the command
//! ```
//!
//! Mounts live only in the sandbox's mount namespace and vanish with it; no
//! directory is created on the host for a run (the shared /etc trees of `etccache`
//! are kept on purpose). So after any end (normal, timeout, OOM,
//! SIGINT/SIGTERM to brig, SIGKILL of brig) nothing is left behind.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_policy::{IdMapping, NetworkMode, RootSource, SandboxSpec};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cgroup::{Cgroup, CgroupConfig, Layout};
use crate::etccache;
use crate::fsplan;
use crate::idmap;
use crate::ids::{self, IdRange};
use crate::init::{self, ChildPlan};
use crate::mounts;
use crate::proto::{drain_messages, ChildMessage};
use crate::report::*;
use crate::rlimits;
use crate::seccomp;
use crate::sys::{self, CloneResult};
use crate::watchdog::{Removal, Watchdog};
use crate::{Context, JailError};

/// Host-level settings chosen by the operator, not by the sandbox's requester.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub id_range: IdRange,
    pub cgroup: CgroupConfig,
    /// Where root's runs keep the /etc trees they bind (see `etccache`); `None`
    /// writes /etc into every sandbox.
    pub etc_cache: Option<PathBuf>,
}

/// The default [`HostConfig::etc_cache`].
pub const ETC_CACHE_DIR: &str = "/run/brig/etc";

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            id_range: IdRange::default(),
            cgroup: CgroupConfig::default(),
            etc_cache: Some(PathBuf::from(ETC_CACHE_DIR)),
        }
    }
}

/// Where the sandbox's stdio goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// The caller's stdin, stdout and stderr.
    Inherit,
    /// stdin inherited; stdout and stderr captured into the [`Outcome`].
    Capture,
}

/// How long a signalled sandbox gets to exit before it is killed.
const SIGNAL_GRACE: Duration = Duration::from_secs(2);

const CLONE_FLAGS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// The network namespace is made by clone with the others. Creating one takes the
/// kernel some 0.4 ms (per-namespace sysctl tables, loopback); having the child
/// unshare it instead, while this process writes the id maps, was measured and
/// gained nothing end to end (interleaved, 300 runs each: 5.645 vs 5.631 ms): the
/// time only moved onto the child's path, where it ran slower. It would pay only
/// with more work for this process to do meanwhile (the plan, made after clone).
fn clone_flags(spec: &SandboxSpec) -> libc::c_int {
    match spec.network {
        NetworkMode::None | NetworkMode::Egress => CLONE_FLAGS | libc::CLONE_NEWNET,
        NetworkMode::Host => CLONE_FLAGS,
    }
}

/// Runs one sandbox to completion.
///
/// Must be called from a single-threaded process (brig's CLI, or the self-exec
/// helper a daemon starts): the sandbox is created with a fork-like clone.
pub fn run(spec: &SandboxSpec, host: &HostConfig, stdio: Stdio) -> Result<Outcome, JailError> {
    match launch(spec, host, stdio, None, None)? {
        Launched::Finished(outcome) => Ok(*outcome),
        Launched::Session(_) => Err(JailError::Setup("a run became a session".into())),
    }
}

/// [`run`] for a spec with [`NetworkMode::Egress`]: `egress`'s sockets are made in
/// the sandbox's network namespace and served for the life of the run. Needs root.
pub fn run_with_egress(
    spec: &SandboxSpec,
    host: &HostConfig,
    stdio: Stdio,
    egress: crate::net::EgressSetup,
) -> Result<Outcome, JailError> {
    if spec.network != NetworkMode::Egress {
        return Err(JailError::Setup(
            "egress was set up for a sandbox without the egress network mode".into(),
        ));
    }
    match launch(spec, host, stdio, None, Some(egress))? {
        Launched::Finished(outcome) => Ok(*outcome),
        Launched::Session(_) => Err(JailError::Setup("a run became a session".into())),
    }
}

/// What a session's sandbox serves on and holds; see [`start_session`].
pub struct SessionControl {
    /// A bound, listening SOCK_SEQPACKET socket (see [`crate::session::bind_listener`]):
    /// init serves exec requests on it for the sandbox's whole life.
    pub listener: OwnedFd,
    /// Descriptors init keeps open as long as the sandbox lives and never passes on
    /// (e.g. the shared locks that keep the image's layers from gc).
    pub holds: Vec<OwnedFd>,
}

/// Starts a session: a sandbox whose init serves exec requests on `control.listener`
/// (see [`crate::agent`]) instead of running `spec.command`, and which outlives this
/// process. Returns once the sandbox is ready and no longer tied to this process; its
/// cgroup stays until [`crate::session::SessionHandle::destroy`].
///
/// Call it from a single-threaded helper process whose parent (the daemon) is a
/// child subreaper: when the helper exits, the daemon becomes init's parent.
pub fn start_session(
    spec: &SandboxSpec,
    host: &HostConfig,
    control: SessionControl,
) -> Result<crate::session::SessionStarted, JailError> {
    let mut spec = spec.clone();
    if spec.command.is_empty() {
        // Validation wants a command; a session runs none of its own.
        spec.command = vec!["/bin/true".into()];
    }
    // A session's way out is bound by the daemon once the sandbox runs (see
    // [`crate::net::bind_in_namespace_of`]): it outlives this helper, and the
    // daemon binds it again after a restart.
    match launch(&spec, host, Stdio::Inherit, Some(&control), None)? {
        Launched::Session(started) => Ok(*started),
        Launched::Finished(_) => Err(JailError::Setup("a session ended during start".into())),
    }
}

enum Launched {
    Finished(Box<Outcome>),
    Session(Box<crate::session::SessionStarted>),
}

fn launch(
    spec: &SandboxSpec,
    host: &HostConfig,
    stdio: Stdio,
    session: Option<&SessionControl>,
    egress: Option<crate::net::EgressSetup>,
) -> Result<Launched, JailError> {
    let mut timeline = Timeline::new();
    spec.validate()?;
    if spec.network == NetworkMode::Egress && egress.is_none() && session.is_none() {
        return Err(JailError::Setup(
            "the egress network mode needs brig's proxy (run_with_egress)".into(),
        ));
    }
    let threads = sys::thread_count().context(|| "count threads".into())?;
    if threads != 1 {
        return Err(JailError::MultiThreaded(threads));
    }
    let rootless = !nix::unistd::geteuid().is_root();
    if rootless && egress.is_some() {
        return Err(JailError::Unsupported(
            "egress (--network allow or open) needs brig to run as root for now".into(),
        ));
    }
    if rootless && matches!(spec.filesystem.root, RootSource::Layers(_)) {
        return Err(JailError::Unsupported(
            "images need brig to run as root (layer mounts are idmapped for each sandbox)".into(),
        ));
    }
    if rootless && spec.identity.mapping == IdMapping::Build {
        return Err(JailError::Unsupported(
            "the build id mapping needs brig to run as root".into(),
        ));
    }
    let mut plan = fsplan::plan(spec, std::path::Path::new("/"))?;
    // Held until the sandbox is gone (a session's init keeps a copy).
    let etc_lease = match (&host.etc_cache, &spec.filesystem.root) {
        (Some(cache), RootSource::HostSystem) if !rootless => {
            let user_binds: Vec<String> = spec
                .filesystem
                .binds
                .iter()
                .map(|b| b.target.clone())
                .collect();
            etccache::apply(&mut plan, &user_binds, cache)
        }
        _ => None,
    };
    let seccomp = seccomp::build(&spec.seccomp)?;
    // RLIMIT_NPROC is planned as the fallback for the pids controller; the child
    // drops it once it has joined a cgroup that limits pids.
    let rlimit_plan = rlimits::planned(&spec.limits, false);
    rlimits::check_grantable(&rlimit_plan)?;
    timeline.mark("plan");

    let lease = if rootless || spec.identity.mapping == IdMapping::Build {
        None
    } else {
        Some(ids::lease(host.id_range)?)
    };
    let ids = match &lease {
        Some(lease) => (lease.id, lease.id),
        None if !rootless => (0, 0),
        None => (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        ),
    };
    timeline.mark("id_lease");

    let mut limits = Limiter {
        host,
        limits: &spec.limits,
        rootless,
        session: session.is_some(),
        lease_fd: lease.as_ref().map(|l| l.as_raw_fd()),
        cgroup: None,
        reason: None,
        watchdog: None,
        removal: None,
    };
    let result = run_sandbox(
        &mut timeline,
        spec,
        &plan,
        seccomp.as_ref(),
        &rlimit_plan,
        &mut limits,
        stdio,
        session,
        rootless,
        ids,
        etc_lease.as_ref().map(|l| l.fd().as_raw_fd()),
        egress,
    );
    drop(etc_lease);
    let cgroup = limits.cgroup.take();
    let keep_cgroup = session.is_some() && result.is_ok();
    // The watchdog removed it while the report was written; if it could not, the
    // removal below says why.
    let removed = limits.removal.take().is_some_and(|removal| removal.wait());
    if let Some(cgroup) = cgroup.as_ref().filter(|_| !keep_cgroup && !removed) {
        // Remove the cgroup before letting the watchdog go: until then it must stay
        // ready to clean up if this process dies.
        if let Err(e) = cgroup.remove() {
            tracing::warn!("cgroup cleanup: {e}");
        }
    }
    if let Some(watchdog) = limits.watchdog.take() {
        watchdog.release();
    }
    // A session's init holds its own copy of the lease.
    drop(lease);
    let (mut enforced, stats, finished) = match result? {
        Sandbox::Finished(outcome, stats) => (outcome.enforced.clone(), stats, Some(*outcome)),
        Sandbox::Ready(enforced) => (*enforced, None, None),
    };
    enforced.cgroup = CgroupReport {
        applied: cgroup.is_some(),
        reason: limits.reason.take(),
        details: cgroup.as_ref().map(|c| c.enforced()),
    };
    enforced.rlimits = rlimits::planned(&spec.limits, cgroup.is_some());
    enforced.seccomp = SeccompReport {
        enabled: enforced.seccomp.enabled,
        filter: seccomp.as_ref().map(|p| p.summary.clone()),
    };
    let layered = matches!(spec.filesystem.root, RootSource::Layers(_));
    enforced.filesystem = FilesystemReport {
        pivot_root: true,
        root: match spec.filesystem.root {
            RootSource::HostSystem => "host-system".into(),
            RootSource::Directory(_) => "directory".into(),
            RootSource::Layers(ref layers) => format!("image ({} layers, overlay)", layers.len()),
        },
        read_only_root: !layered,
        writable: plan.writable.clone(),
        disk_bytes: plan.scratch_bytes,
    };
    let Some(mut outcome) = finished else {
        let started = crate::session::SessionStarted {
            handle: crate::session::SessionHandle::new(timeline.child.unwrap_or(0), cgroup, ids)?,
            enforced,
            timings_us: std::mem::take(&mut timeline.marks),
        };
        return Ok(Launched::Session(Box::new(started)));
    };
    outcome.enforced = enforced;
    // What the teardown costs (the cgroup's removal, above all) shows up here.
    outcome.timings_us.push(Timing {
        stage: "cleaned".into(),
        at_us: timeline.started.elapsed().as_micros() as u64,
    });
    if let Some(stats) = stats {
        outcome.oom_killed = stats.oom_kills > 0;
        outcome.memory_peak_bytes = stats.memory_peak_bytes;
        if let Some(ns) = stats.cpu_time_ns {
            outcome.cpu_time_ms = Some(ns / 1_000_000);
        }
    }
    Ok(Launched::Finished(Box::new(outcome)))
}

/// How `run_sandbox` ended: the command ran to its end, or a session is ready.
enum Sandbox {
    Finished(Box<Outcome>, Option<crate::cgroup::CgroupStats>),
    Ready(Box<Enforced>),
}

/// The sandbox's cgroup and its watchdog, made while the child builds its root.
struct Limiter<'a> {
    host: &'a HostConfig,
    limits: &'a brig_policy::Limits,
    rootless: bool,
    /// A session's cgroup also accounts CPU time and can be frozen.
    session: bool,
    lease_fd: Option<RawFd>,
    cgroup: Option<Cgroup>,
    /// Why no cgroup is used (rootless without a delegated parent).
    reason: Option<String>,
    watchdog: Option<Watchdog>,
    /// The watchdog removing the cgroup, once the sandbox is gone.
    removal: Option<Removal>,
}

impl Limiter<'_> {
    /// Creates the cgroup with every limit written and the watchdog that removes it if
    /// brig dies, puts `child` in the v2 leaves, and hands the child its v1 `tasks`
    /// files to join by itself (see `Cgroup::self_attach_files`): the kernel checks
    /// the opener's credentials, so the child may be any user by then.
    fn prepare(&mut self, child: Pid, sync: &OwnedFd) -> Result<(), JailError> {
        let name = format!("brig-{:016x}", ids::random_u64());
        // A one-shot run takes its CPU time from rusage and is never paused.
        let uses = crate::cgroup::Uses {
            cpu_accounting: self.session,
            freezer: self.session,
        };
        match Layout::detect().and_then(|layout| {
            Cgroup::create_for(&layout, &self.host.cgroup, &name, self.limits, uses)
        }) {
            Ok(cgroup) => {
                // Recorded first, so it is removed even if a later step fails.
                self.cgroup = Some(cgroup);
            }
            // Unprivileged users rarely have a delegated cgroup; run without and say so.
            Err(e) if self.rootless => self.reason = Some(e.to_string()),
            Err(e) => return Err(e),
        }
        let mut files = Vec::new();
        if let Some(cgroup) = &self.cgroup {
            self.watchdog = Some(Watchdog::spawn(cgroup, self.lease_fd)?);
            cgroup.add_pid_except_self_attached(child.as_raw())?;
            for path in cgroup.self_attach_files() {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .context(|| format!("open {}", path.display()))?;
                files.push(OwnedFd::from(file));
            }
        }
        let flag = if self.cgroup.is_some() {
            init::GO_WITH_CGROUP
        } else {
            init::GO_WITHOUT_CGROUP
        };
        init::send_msg(sync.as_raw_fd(), flag, &files)
    }

    /// A sandbox that died before it was ready, with `oom_kills` in its cgroup, ran
    /// out of memory while it was set up: the kernel killed init, so all the parent
    /// sees is that it exited. The usual cause is a seed (`seed.rs`) larger than the
    /// memory its /tmp and /workspace tmpfs pages are charged to, which is the
    /// caller's to fix, not a failure of the host.
    fn explain_setup_failure(&self, e: JailError, seeded: bool, oom_kills: u64) -> JailError {
        if oom_kills == 0 || matches!(e, JailError::InSandbox { .. }) {
            return e;
        }
        let memory = match self.limits.memory_bytes {
            Some(bytes) => format!("memory of {bytes} bytes"),
            None => "memory".to_string(),
        };
        JailError::MemoryFull(if seeded {
            format!(
                "the snapshot's files do not fit in the sandbox's {memory} \
                 (its /tmp and /workspace are held in memory)"
            )
        } else {
            format!("the sandbox ran out of its {memory} while it was set up")
        })
    }
}

/// Candidate paths for argv[0]: itself if it has a slash, else each PATH entry.
pub(crate) fn exec_candidates(argv0: &str, path: &str) -> Vec<CString> {
    if argv0.contains('/') {
        return CString::new(argv0).into_iter().collect();
    }
    path.split(':')
        .map(|dir| if dir.is_empty() { "." } else { dir })
        .filter_map(|dir| CString::new(format!("{dir}/{argv0}")).ok())
        .collect()
}

fn pipe() -> Result<(OwnedFd, OwnedFd), JailError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context(|| "create pipe".into())
}

#[allow(clippy::too_many_arguments)]
fn run_sandbox(
    timeline: &mut Timeline,
    spec: &SandboxSpec,
    plan: &fsplan::FsPlan,
    seccomp: Option<&seccomp::SeccompProgram>,
    rlimit_plan: &rlimits::RlimitsReport,
    limiter: &mut Limiter<'_>,
    stdio: Stdio,
    session: Option<&SessionControl>,
    rootless: bool,
    (host_uid, host_gid): (u32, u32),
    etc_lease: Option<RawFd>,
    egress: Option<crate::net::EgressSetup>,
) -> Result<Sandbox, JailError> {
    let env = spec.effective_env();
    let to_c = |s: &[u8]| {
        CString::new(s).map_err(|_| JailError::Policy(brig_policy::PolicyError::NulInCommand))
    };
    let argv = spec
        .command
        .iter()
        .map(|a| to_c(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = env
        .iter()
        .map(|(k, v)| to_c(format!("{k}={v}").as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let candidates = exec_candidates(
        &spec.command[0],
        env.get("PATH").map(String::as_str).unwrap_or(""),
    );

    let (sync_parent, sync_child) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .context(|| "socketpair".into())?;
    let (report_r, report_w) = pipe()?;
    let capture = match stdio {
        Stdio::Capture => Some((pipe()?, pipe()?)),
        Stdio::Inherit => None,
    };

    // Signals for brig are read from a signalfd; blocking them before clone means
    // none is lost between here and the loop.
    let mut handled = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        handled.add(sig);
    }
    let mut old_mask = SigSet::empty();
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled), Some(&mut old_mask))
        .context(|| "block signals".into())?;
    let restore_mask = RestoreMask(old_mask);
    let signal_fd = SignalFd::with_flags(&handled, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .context(|| "signalfd".into())?;

    let child_plan = ChildPlan {
        spec,
        plan,
        seccomp,
        rlimits: rlimit_plan,
        argv,
        envp,
        exec_candidates: candidates,
        sync_fd: sync_child.as_raw_fd(),
        report_fd: report_w.as_raw_fd(),
        stdout_fd: capture.as_ref().map(|((_, w), _)| w.as_raw_fd()),
        stderr_fd: capture.as_ref().map(|(_, (_, w))| w.as_raw_fd()),
        drop_groups: !rootless,
        sources_from_parent: !rootless,
        cpus: nix::sched::sched_getaffinity(Pid::from_raw(0)).ok(),
        started: timeline.started,
        session: session.map(|control| init::SessionFds {
            listener: control.listener.as_raw_fd(),
            holds: control
                .holds
                .iter()
                .map(|fd| fd.as_raw_fd())
                .chain(limiter.lease_fd)
                .chain(etc_lease)
                .collect(),
        }),
    };

    let started = Instant::now();
    // A leased uid owns the sandbox's user namespace (see clone_process_owned_by);
    // rootless, the caller does anyway, and a build's namespace maps host ids 1:1.
    let cloned = match limiter.lease_fd {
        // SAFETY: run() checked that this process has a single thread, and a lease
        // is taken only as root.
        Some(_) => unsafe { sys::clone_process_owned_by(host_uid, clone_flags(spec)) },
        // SAFETY: run() checked that this process has a single thread.
        None => unsafe { sys::clone_process(clone_flags(spec)) },
    };
    let child = match cloned {
        Ok(CloneResult::Child) => init::child_main(child_plan),
        Ok(CloneResult::Parent { child }) => Pid::from_raw(child),
        Err(e) => {
            let hint = if e.raw_os_error() == Some(libc::EPERM)
                || e.raw_os_error() == Some(libc::ENOSPC)
            {
                " (are user namespaces allowed? see user.max_user_namespaces)"
            } else {
                ""
            };
            return Err(JailError::Unsupported(format!(
                "cannot create the sandbox's namespaces: {e}{hint}"
            )));
        }
    };
    // The child's copies are its own; ours would keep the pipes from ever closing.
    drop(sync_child);
    drop(report_w);
    let capture = capture.map(|((out_r, out_w), (err_r, err_w))| {
        drop(out_w);
        drop(err_w);
        (out_r, err_r)
    });

    timeline.mark("clone");
    timeline.child = Some(child.as_raw());
    steer_away(child);
    // The way out, made while the child waits for its id maps: before its command
    // can run. Served only once the cgroup (and its watchdog) are set up, since
    // serving may start threads.
    let egress = match egress {
        Some(setup) => match crate::net::bind_in(child, &setup.listen, setup.capture) {
            Ok(fds) => Some((setup.serve, fds)),
            Err(e) => {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Err(e);
            }
        },
        None => None,
    };
    let identity = match prepare_child(
        child,
        spec,
        plan,
        rootless,
        host_uid,
        host_gid,
        &sync_parent,
    )
    .and_then(|identity| {
        timeline.mark("id_maps");
        limiter.prepare(child, &sync_parent)?;
        Ok(identity)
    }) {
        Ok(identity) => identity,
        Err(e) => {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            // A child that failed first broke the channel: its reason is the one to give.
            return Err(failure_reported(&report_r).unwrap_or(e));
        }
    };
    timeline.mark("cgroup");
    if let Some((serve, fds)) = egress {
        if let Err(e) = serve(fds) {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            return Err(JailError::Setup(format!("egress proxy: {e}")));
        }
        timeline.mark("egress");
    }
    // Only the report needs them: read while the child still builds its root.
    let host_namespaces = NamespaceIds::read("/proc/self");
    if session.is_some() {
        return match detach(child, &report_r, &sync_parent) {
            Ok(ready) => {
                let (caps, landlock, seccomp_installed, namespaces, child_timings) = ready;
                timeline.marks.extend(child_timings);
                timeline.marks.sort_by_key(|t| t.at_us);
                Ok(Sandbox::Ready(Box::new(enforced_report(
                    spec,
                    identity,
                    caps,
                    landlock,
                    seccomp_installed,
                    namespaces.differing_from(&host_namespaces),
                    rlimit_plan,
                ))))
            }
            Err(e) => {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                let oom_kills = limiter.cgroup.as_ref().map_or(0, |c| c.oom_kills());
                Err(limiter.explain_setup_failure(e, plan.seed.is_some(), oom_kills))
            }
        };
    }
    let mut watch = Watch::new(spec, started, child);
    watch.locks = limiter
        .cgroup
        .clone()
        .zip(spec.limits.file_lock_budget())
        .map(|(cgroup, budget)| LockWatch {
            cgroup,
            budget,
            next: Instant::now() + crate::locks::CHECK_INTERVAL,
        });
    watch.run(&report_r, capture.as_ref(), &signal_fd)?;
    timeline.mark("sandbox_gone");
    // The sandbox sent its upper layer before it reported ready; the message stays
    // queued after it is gone.
    let layered = matches!(spec.filesystem.root, RootSource::Layers(_));
    let writes = if spec.filesystem.capture_writes && layered && watch.ready.is_some() {
        match init::recv_msg(
            sync_parent.as_raw_fd(),
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        )? {
            (Some(init::UPPER_LAYER), mut fds) if fds.len() == 1 => fds.pop().map(Arc::new),
            _ => {
                return Err(JailError::Setup(
                    "the sandbox did not hand over its writes".into(),
                ))
            }
        }
    } else {
        None
    };
    drop(sync_parent);
    drop(restore_mask);
    let duration_ms = started.elapsed().as_millis() as u64;
    let stats = limiter.cgroup.as_ref().map(|c| c.stats());
    // Nothing is left in the cgroup but its accounting, now read: the watchdog
    // removes it while this process writes the report.
    limiter.removal = limiter.watchdog.take().map(Watchdog::remove_cgroup);

    if let Some(message) = watch.failed {
        return Err(message);
    }
    let ready = watch.ready.ok_or_else(|| {
        // From the stats read above: the cgroup may be gone by now.
        limiter.explain_setup_failure(
            JailError::Setup("the sandbox exited during setup".into()),
            plan.seed.is_some(),
            stats.as_ref().map_or(0, |s| s.oom_kills),
        )
    })?;
    let (caps, landlock, seccomp_installed, namespaces, child_timings) = ready;
    timeline.marks.extend(child_timings);
    if let Some(at) = watch.exited_at {
        timeline.marks.push(Timing {
            stage: "command_exited".into(),
            at_us: at.duration_since(timeline.started).as_micros() as u64,
        });
    }
    timeline.marks.sort_by_key(|t| t.at_us);
    let (exit_code, signal) = match watch.exited {
        Some((code, signal)) => (code, signal),
        // init itself was killed (timeout, OOM, a signal to brig): so was the command.
        None => (None, watch.init_signal.or(Some(libc::SIGKILL))),
    };
    // Everything in the sandbox was reaped into init and init into us; without its
    // report (init was killed) its setup stays in the count.
    let cpu_time_ms = sys::cpu_time_us(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .saturating_sub(watch.init_cpu_us)
        / 1000;
    let outcome = Outcome {
        exit_code,
        signal,
        timed_out: watch.timed_out,
        oom_killed: false,
        file_locks_exceeded: watch.locks_exceeded,
        stdout: String::from_utf8_lossy(&watch.stdout.data).into_owned(),
        stderr: String::from_utf8_lossy(&watch.stderr.data).into_owned(),
        stdout_truncated: watch.stdout.truncated,
        stderr_truncated: watch.stderr.truncated,
        duration_ms,
        cpu_time_ms: Some(cpu_time_ms),
        memory_peak_bytes: None,
        error: watch.exec_error,
        timings_us: std::mem::take(&mut timeline.marks),
        writes,
        enforced: enforced_report(
            spec,
            identity,
            caps,
            landlock,
            seccomp_installed,
            namespaces.differing_from(&host_namespaces),
            rlimit_plan,
        ),
    };
    Ok(Sandbox::Finished(Box::new(outcome), stats))
}

/// The failure the child reported before it exited, if any (it writes the report
/// and then exits, so once it is reaped the message is in the pipe).
fn failure_reported(report: &OwnedFd) -> Option<JailError> {
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = nix::fcntl::fcntl(
        report.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    );
    while let Ok(n @ 1..) = nix::unistd::read(report.as_raw_fd(), &mut buf) {
        pending.extend_from_slice(&buf[..n]);
    }
    drain_messages(&mut pending)
        .into_iter()
        .find_map(|message| match message {
            ChildMessage::Failed { code, message } => Some(JailError::InSandbox { code, message }),
            _ => None,
        })
}

/// What the child reported as applied; the caller adds what the parent knows
/// (cgroup, seccomp filter summary, filesystem).
fn enforced_report(
    spec: &SandboxSpec,
    identity: IdentityReport,
    caps: crate::caps::CapsReport,
    landlock: crate::landlock::LandlockReport,
    seccomp_installed: bool,
    namespaces: Vec<String>,
    rlimit_plan: &rlimits::RlimitsReport,
) -> Enforced {
    Enforced {
        namespaces,
        identity,
        filesystem: FilesystemReport {
            pivot_root: true,
            root: String::new(),
            read_only_root: true,
            writable: vec![],
            disk_bytes: 0,
        },
        network: match spec.network {
            NetworkMode::None => "loopback-only".into(),
            NetworkMode::Host => "host".into(),
            NetworkMode::Egress => "loopback-only, egress through brig's proxy".into(),
        },
        no_new_privs: caps.no_new_privs,
        capabilities: caps,
        seccomp: SeccompReport {
            enabled: seccomp_installed,
            filter: None,
        },
        landlock,
        cgroup: CgroupReport {
            applied: false,
            reason: None,
            details: None,
        },
        rlimits: rlimit_plan.clone(),
    }
}

/// How long a session's sandbox may take to become ready.
const SESSION_SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Session mode: waits for the child's "ready", then lets it go (it stops dying with
/// this process) and waits for its acknowledgement, so this process may exit.
fn detach(child: Pid, report: &OwnedFd, sync: &OwnedFd) -> Result<Ready, JailError> {
    let deadline = Instant::now() + SESSION_SETUP_TIMEOUT;
    let mut buf = vec![0u8; 64 << 10];
    let mut pending = Vec::new();
    let ready = 'wait: loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(JailError::Setup(format!(
                "the session's sandbox was not ready after {} s",
                SESSION_SETUP_TIMEOUT.as_secs()
            )));
        }
        let mut fds = [PollFd::new(report.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(JailError::sys("poll", e.into())),
        }
        match nix::unistd::read(report.as_raw_fd(), &mut buf) {
            Ok(0) => {
                return Err(JailError::Setup(
                    "the session's sandbox exited during setup".into(),
                ))
            }
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                for message in drain_messages(&mut pending) {
                    match message {
                        ChildMessage::Ready {
                            caps,
                            landlock,
                            seccomp_installed,
                            namespaces,
                            timings_us,
                        } => {
                            break 'wait (caps, landlock, seccomp_installed, namespaces, timings_us)
                        }
                        ChildMessage::Failed { code, message } => {
                            return Err(JailError::InSandbox { code, message })
                        }
                        _ => {}
                    }
                }
            }
            Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => return Err(JailError::sys("read the sandbox's report", e.into())),
        }
    };
    init::send_msg(sync.as_raw_fd(), init::GO_DETACH, &[])?;
    match init::recv_msg(sync.as_raw_fd(), nix::sys::socket::MsgFlags::empty())? {
        (Some(init::DETACHED), _) => Ok(ready),
        _ => Err(JailError::Setup(format!(
            "the session's init (pid {child}) did not detach"
        ))),
    }
}

/// Keeps the child off this process's CPU while both work on setup: the wakeups on
/// the sync channel would otherwise queue it behind this process, and the two halves
/// of setup would run one after the other. The child restores its CPU set before
/// the command starts. Returns whether anything was changed.
fn steer_away(child: Pid) -> bool {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    // SAFETY: sched_getcpu has no preconditions.
    let here = unsafe { libc::sched_getcpu() };
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else {
        return false;
    };
    let mut elsewhere = CpuSet::new();
    let mut count = 0;
    for cpu in 0..CpuSet::count() {
        if cpu as i32 != here && allowed.is_set(cpu).unwrap_or(false) {
            let _ = elsewhere.set(cpu);
            count += 1;
        }
    }
    count > 0 && sched_setaffinity(child, &elsewhere).is_ok()
}

struct RestoreMask(SigSet);

impl Drop for RestoreMask {
    fn drop(&mut self) {
        let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&self.0), None);
    }
}

/// Writes the id maps, hands over the image's layer mounts and lets the child start
/// building its root.
fn prepare_child(
    child: Pid,
    spec: &SandboxSpec,
    plan: &fsplan::FsPlan,
    rootless: bool,
    host_uid: u32,
    host_gid: u32,
    sync_w: &OwnedFd,
) -> Result<IdentityReport, JailError> {
    let proc_dir = format!("/proc/{child}");
    let id = &spec.identity;
    if rootless {
        // An unprivileged writer may map only its own ids, and only after denying
        // setgroups (otherwise dropping a group could grant access: CVE-2014-8989).
        std::fs::write(format!("{proc_dir}/setgroups"), "deny")
            .context(|| "deny setgroups".into())?;
    }
    let (uid_map, gid_map) = match id.mapping {
        IdMapping::Single => (
            format!("{} {host_uid} 1\n", id.uid),
            format!("{} {host_gid} 1\n", id.gid),
        ),
        IdMapping::Build => ("0 0 65536\n".to_string(), "0 0 65536\n".to_string()),
    };
    std::fs::write(format!("{proc_dir}/uid_map"), uid_map).context(|| "write uid_map".into())?;
    std::fs::write(format!("{proc_dir}/gid_map"), gid_map).context(|| "write gid_map".into())?;
    let binds_idmapped = plan
        .ops
        .iter()
        .any(|op| matches!(op, fsplan::FsOp::Bind { idmapped: true, .. }));
    // A seed's files are on-disk root's, like an image's: the sandbox reads them
    // through the same idmap (a 0600 file would be unreadable as `nobody`'s).
    let seed_idmapped = plan.seed.is_some() && id.mapping == IdMapping::Single;
    let squash = if rootless {
        None
    } else {
        idmap::squash_for(
            &plan.layers,
            binds_idmapped || seed_idmapped,
            id.mapping,
            host_uid,
            host_gid,
        )?
    };
    if !plan.layers.is_empty() {
        let layers = idmap::layer_mounts(&plan.layers, squash.as_ref())?;
        for chunk in layers.chunks(init::MAX_FDS_PER_MESSAGE) {
            init::send_msg(sync_w.as_raw_fd(), init::GO_LAYERS, chunk)?;
        }
    }
    if let Some(seed) = &plan.seed {
        if rootless {
            return Err(JailError::Unsupported(
                "starting from a snapshot of /tmp and /workspace needs brig to run as root".into(),
            ));
        }
        let seed = idmap::layer_mounts(std::slice::from_ref(seed), squash.as_ref())?;
        init::send_msg(sync_w.as_raw_fd(), init::GO_SEED, &seed)?;
    }
    sys::write_all_fd(sync_w.as_raw_fd(), &[init::GO_MAPS_WRITTEN])
        .context(|| "start the sandbox".into())?;
    if !rootless {
        // Cloned while the child sets up its identity and namespaces, which it does
        // before it needs them.
        let sources = mounts::open_sources(plan, squash.as_ref(), Some((host_uid, host_gid)))?;
        for chunk in sources.chunks(init::MAX_FDS_PER_MESSAGE) {
            init::send_msg(sync_w.as_raw_fd(), init::GO_SOURCES, chunk)?;
        }
        init::send_msg(sync_w.as_raw_fd(), init::GO_SOURCES_DONE, &[])?;
    }
    // What the kernel holds is what is reported: read back once the child has all it
    // needs to go on.
    let read_map = |name: &str| {
        std::fs::read_to_string(format!("{proc_dir}/{name}"))
            .map(|m| m.split_whitespace().collect::<Vec<_>>().join(" "))
            .context(|| format!("read {name}"))
    };
    Ok(IdentityReport {
        uid: id.uid,
        gid: id.gid,
        host_uid,
        host_gid,
        uid_map: read_map("uid_map")?,
        gid_map: read_map("gid_map")?,
        rootless,
    })
}

#[derive(Default)]
struct Captured {
    data: Vec<u8>,
    truncated: bool,
    open: bool,
}

impl Captured {
    /// Keeps up to `limit` bytes and keeps draining the pipe past it, so the
    /// command never blocks on a full pipe.
    fn take(&mut self, fd: RawFd, limit: u64, buf: &mut [u8]) {
        match nix::unistd::read(fd, buf) {
            Ok(0) => self.open = false,
            Ok(n) => {
                let room = (limit as usize).saturating_sub(self.data.len());
                if n > room {
                    self.truncated = true;
                }
                self.data.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(_) => self.open = false,
        }
    }
}

type Ready = (
    crate::caps::CapsReport,
    crate::landlock::LandlockReport,
    bool,
    NamespaceIds,
    Vec<Timing>,
);

/// The event loop's state.
struct Watch {
    child: Pid,
    output_limit: u64,
    deadline: Option<Instant>,
    grace_deadline: Option<Instant>,
    reaped: bool,
    report_open: bool,
    report_buf: Vec<u8>,
    stdout: Captured,
    stderr: Captured,
    ready: Option<Ready>,
    failed: Option<JailError>,
    exec_error: Option<String>,
    exited: Option<(Option<i32>, Option<i32>)>,
    exited_at: Option<Instant>,
    /// init's own CPU time when the command ended (see `ChildMessage::Exited`).
    init_cpu_us: u64,
    init_signal: Option<i32>,
    timed_out: bool,
    /// Counting the sandbox's record locks, when it has a cgroup and a budget.
    locks: Option<LockWatch>,
    /// Processes were killed for holding more locks than the budget.
    locks_exceeded: bool,
}

/// When and against what the event loop next counts the sandbox's locks.
struct LockWatch {
    cgroup: Cgroup,
    budget: u64,
    next: Instant,
}

impl Watch {
    fn new(spec: &SandboxSpec, started: Instant, child: Pid) -> Self {
        Watch {
            child,
            output_limit: spec.limits.output_limit_bytes,
            deadline: spec
                .limits
                .timeout_ms
                .map(|ms| started + Duration::from_millis(ms)),
            grace_deadline: None,
            reaped: false,
            report_open: true,
            report_buf: Vec::new(),
            stdout: Captured {
                open: true,
                ..Default::default()
            },
            stderr: Captured {
                open: true,
                ..Default::default()
            },
            ready: None,
            failed: None,
            exec_error: None,
            exited: None,
            exited_at: None,
            init_cpu_us: 0,
            init_signal: None,
            timed_out: false,
            locks: None,
            locks_exceeded: false,
        }
    }

    fn kill(&mut self) {
        let _ = nix::sys::signal::kill(self.child, Signal::SIGKILL);
    }

    fn run(
        &mut self,
        report: &OwnedFd,
        capture: Option<&(OwnedFd, OwnedFd)>,
        signals: &SignalFd,
    ) -> Result<(), JailError> {
        if capture.is_none() {
            self.stdout.open = false;
            self.stderr.open = false;
        }
        let mut buf = vec![0u8; 64 << 10];
        while !self.reaped || self.report_open || self.stdout.open || self.stderr.open {
            let now = Instant::now();
            self.count_locks(now);
            let next = [self.deadline, self.grace_deadline]
                .into_iter()
                .flatten()
                .min();
            if let Some(at) = next {
                if now >= at {
                    if Some(at) == self.deadline && self.exited.is_none() && !self.reaped {
                        self.timed_out = true;
                    }
                    self.kill();
                    self.deadline = None;
                    self.grace_deadline = None;
                    continue;
                }
            }
            let wake = [next, self.locks.as_ref().map(|l| l.next)]
                .into_iter()
                .flatten()
                .min();
            let timeout = match wake {
                Some(at) => PollTimeout::try_from(
                    at.saturating_duration_since(now).as_millis().min(60_000) as i32 + 1,
                )
                .unwrap_or(PollTimeout::MAX),
                None => PollTimeout::NONE,
            };
            let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
            let report_at = self.report_open.then(|| {
                fds.push(PollFd::new(report.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let out_at = match capture {
                Some((out, _)) if self.stdout.open => {
                    fds.push(PollFd::new(out.as_fd(), PollFlags::POLLIN));
                    Some(fds.len() - 1)
                }
                _ => None,
            };
            let err_at = match capture {
                Some((_, err)) if self.stderr.open => {
                    fds.push(PollFd::new(err.as_fd(), PollFlags::POLLIN));
                    Some(fds.len() - 1)
                }
                _ => None,
            };
            match nix::poll::poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(JailError::sys("poll", e.into())),
            }
            let ready = |i: Option<usize>| {
                i.is_some_and(|i| fds[i].revents().is_some_and(|r| !r.is_empty()))
            };
            let (sig_ready, report_ready, out_ready, err_ready) = (
                ready(Some(0)),
                ready(report_at),
                ready(out_at),
                ready(err_at),
            );
            drop(fds);
            if report_ready {
                match nix::unistd::read(report.as_raw_fd(), &mut buf) {
                    Ok(0) => self.report_open = false,
                    Ok(n) => {
                        self.report_buf.extend_from_slice(&buf[..n]);
                        for msg in drain_messages(&mut self.report_buf) {
                            self.on_message(msg);
                        }
                    }
                    Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
                    Err(_) => self.report_open = false,
                }
            }
            if out_ready {
                let fd = capture.map(|(o, _)| o.as_raw_fd()).unwrap_or(-1);
                self.stdout.take(fd, self.output_limit, &mut buf);
            }
            if err_ready {
                let fd = capture.map(|(_, e)| e.as_raw_fd()).unwrap_or(-1);
                self.stderr.take(fd, self.output_limit, &mut buf);
            }
            if sig_ready {
                while let Ok(Some(info)) = signals.read_signal() {
                    self.on_signal(info.ssi_signo as i32, info.ssi_code);
                }
            }
        }
        Ok(())
    }

    /// Counts the host's locks when due and, if there are more than the sandbox may
    /// hold, the sandbox's own (`crate::locks`).
    fn count_locks(&mut self, now: Instant) {
        let Some(watch) = self.locks.as_mut().filter(|w| now >= w.next) else {
            return;
        };
        watch.next = now + crate::locks::CHECK_INTERVAL;
        let host = crate::locks::held_on_host_at_most();
        if self.reaped || host.is_some_and(|n| n <= watch.budget) {
            return;
        }
        // The supervisor records the overrun before it next looks at the child.
        let counted =
            crate::locks::enforce(&watch.cgroup, self.child.as_raw(), watch.budget, || {});
        watch.next = crate::locks::next_count(now, now.elapsed());
        match counted {
            Ok(Some(overrun)) => {
                tracing::warn!("{overrun}");
                self.locks_exceeded = true;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("counting the sandbox's file locks: {e}"),
        }
    }

    fn on_message(&mut self, msg: ChildMessage) {
        match msg {
            ChildMessage::Ready {
                caps,
                landlock,
                seccomp_installed,
                namespaces,
                timings_us,
            } => self.ready = Some((caps, landlock, seccomp_installed, namespaces, timings_us)),
            ChildMessage::Failed { code, message } => {
                self.failed = Some(JailError::InSandbox { code, message })
            }
            ChildMessage::ExecFailed { message, .. } => self.exec_error = Some(message),
            ChildMessage::Exited {
                code,
                signal,
                init_cpu_us,
            } => {
                self.exited = Some((code, signal));
                self.exited_at = Some(Instant::now());
                self.init_cpu_us = init_cpu_us;
            }
        }
    }

    fn on_signal(&mut self, signo: i32, code: i32) {
        if signo == libc::SIGCHLD {
            if !self.reaped {
                match waitpid(self.child, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(..)) => self.reaped = true,
                    Ok(WaitStatus::Signaled(_, sig, _)) => {
                        self.reaped = true;
                        self.init_signal = Some(sig as i32);
                    }
                    _ => {}
                }
            }
            return;
        }
        if self.reaped {
            return;
        }
        if self.grace_deadline.is_some() {
            // Asked twice: stop waiting.
            self.kill();
            return;
        }
        // A terminal's ^C already reached the command (same process group); only
        // signals sent by a process are passed on, so the command sees each once.
        if code == libc::SI_USER || code == libc::SI_QUEUE {
            if let Ok(sig) = Signal::try_from(signo) {
                let _ = nix::sys::signal::kill(self.child, sig);
            }
        }
        self.grace_deadline = Some(Instant::now() + SIGNAL_GRACE);
    }
}

/// When each stage of a run finished.
struct Timeline {
    started: Instant,
    marks: Vec<Timing>,
    /// The sandbox's init, once cloned.
    child: Option<i32>,
}

impl Timeline {
    fn new() -> Self {
        Timeline {
            started: Instant::now(),
            marks: Vec::with_capacity(16),
            child: None,
        }
    }

    fn mark(&mut self, stage: &str) {
        self.marks.push(Timing {
            stage: stage.to_string(),
            at_us: self.started.elapsed().as_micros() as u64,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_candidates_follow_path() {
        let c = exec_candidates("python3", "/usr/local/bin:/usr/bin");
        assert_eq!(
            c,
            vec![
                CString::new("/usr/local/bin/python3").unwrap(),
                CString::new("/usr/bin/python3").unwrap()
            ]
        );
        assert_eq!(
            exec_candidates("./x", "/bin"),
            vec![CString::new("./x").unwrap()]
        );
        assert_eq!(
            exec_candidates("/bin/true", "/usr/bin"),
            vec![CString::new("/bin/true").unwrap()]
        );
    }
}
