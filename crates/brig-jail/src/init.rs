//! The sandbox side: what the cloned child does, in order, and then its life as the
//! sandbox's PID 1.
//!
//! Setup stages (each needs the ones before it):
//! 1. arrange file descriptors: stdio, the sync pipe at 3, the report pipe at 4,
//!    everything else closed;
//! 2. wait for the parent to write the uid/gid maps;
//! 3. become the sandbox user (keeping capabilities of the new user namespace), arm
//!    the parent-death signal (credential changes reset it, so it comes after);
//! 4. hostname, loopback;
//! 5. build the filesystem and pivot into it;
//! 6. join the cgroup the parent prepared meanwhile, then a new cgroup namespace;
//!    with a seed, fill /tmp and /workspace from it (`seed.rs`);
//! 7. rlimits, then drop every capability, no_new_privs, Landlock, seccomp;
//! 8. report "ready" and fork the command, which execs.
//!
//! As PID 1, init reaps every orphan, forwards signals to the command, and when the
//! command ends kills everything else (`kill(-1)`) and reports the exit status.

use std::ffi::CString;
use std::os::fd::RawFd;

use brig_policy::SandboxSpec;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::fsplan::FsPlan;
use crate::proto::ChildMessage;
use crate::report::NamespaceIds;
use crate::rlimits::RlimitsReport;
use crate::seccomp::SeccompProgram;
use crate::sys::{self, write_all_fd};
use crate::{caps, landlock, mounts, net, Context, JailError};

pub(crate) const SYNC_FD: RawFd = 3;
/// First message on the sync channel: the id maps are written.
pub(crate) const GO_MAPS_WRITTEN: u8 = b'm';
/// Before it, any number of these: image layer mounts, bottom first.
pub(crate) const GO_LAYERS: u8 = b'l';
/// Before it too, with a seed (`Filesystem::seed`): the seed's layer mount.
pub(crate) const GO_SEED: u8 = b's';
/// Root brig, after `GO_MAPS_WRITTEN`: the sources of binds and copies, in plan
/// order (any number of these, then one `GO_SOURCES_DONE`); see `mounts::open_sources`.
pub(crate) const GO_SOURCES: u8 = b'b';
pub(crate) const GO_SOURCES_DONE: u8 = b'B';
/// Then: the cgroup is ready (with its v1 `tasks` files attached) or there is none.
pub(crate) const GO_WITH_CGROUP: u8 = b'c';
pub(crate) const GO_WITHOUT_CGROUP: u8 = b'n';
pub(crate) const REPORT_FD: RawFd = 4;
/// From the sandbox: its overlay's upper layer, for snapshots.
pub(crate) const UPPER_LAYER: u8 = b'u';
/// Session mode: the parent has what it needs and is about to exit; init stops
/// dying with it and answers with `DETACHED`.
pub(crate) const GO_DETACH: u8 = b'd';
pub(crate) const DETACHED: u8 = b'D';
/// Session mode: the agent's listening socket, then the descriptors init holds for
/// the session's lifetime (id lease, image layer locks).
pub(crate) const LISTENER_FD: RawFd = 5;
/// Descriptors one sync message may carry (SCM_MAX_FD is 253).
pub(crate) const MAX_FDS_PER_MESSAGE: usize = 253;

/// Signals init passes on to the command.
pub(crate) const FORWARDED: &[Signal] = &[
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGCONT,
];

/// Everything the child needs, prepared by the parent before clone (the child gets
/// a copy of this memory, so nothing is serialized).
pub(crate) struct ChildPlan<'a> {
    pub spec: &'a SandboxSpec,
    pub plan: &'a FsPlan,
    pub seccomp: Option<&'a SeccompProgram>,
    pub rlimits: &'a RlimitsReport,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    /// Where to look for argv[0], in PATH order (inside the sandbox).
    pub exec_candidates: Vec<CString>,
    pub sync_fd: RawFd,
    pub report_fd: RawFd,
    pub stdout_fd: Option<RawFd>,
    pub stderr_fd: Option<RawFd>,
    pub drop_groups: bool,
    /// Whether the parent opens the sources of binds and copies (root brig) or this
    /// process does.
    pub sources_from_parent: bool,
    /// When the run began (monotonic clock, shared with the parent).
    pub started: std::time::Instant,
    /// The CPU set to restore before the command starts (see `steer_away`).
    pub cpus: Option<nix::sched::CpuSet>,
    /// Session mode: serve exec requests instead of running `argv`.
    pub session: Option<SessionFds>,
}

/// What a session's init keeps: the agent's listening socket, and descriptors whose
/// only job is to stay open as long as the sandbox lives.
pub(crate) struct SessionFds {
    pub listener: RawFd,
    pub holds: Vec<RawFd>,
}

fn send(msg: &ChildMessage) {
    // The parent reads until EOF; a failed write means it is gone and the
    // parent-death signal is on its way.
    let _ = write_all_fd(REPORT_FD, &msg.to_line());
}

/// Runs in the cloned child and never returns.
pub(crate) fn child_main(plan: ChildPlan<'_>) -> ! {
    sys::blank_command_line(b"brig-init");
    if let Err(e) = arrange_fds(&plan) {
        // The report pipe may not be at REPORT_FD yet; the parent sees EOF and a 125.
        let _ = write_all_fd(
            plan.report_fd,
            &ChildMessage::Failed {
                code: e.code().into(),
                message: e.to_string(),
            }
            .to_line(),
        );
        sys::exit_now(125);
    }
    let (command, writes, applied) = match setup(&plan) {
        Ok(set_up) => set_up,
        Err(e) => {
            send(&ChildMessage::Failed {
                code: e.code().into(),
                message: e.to_string(),
            });
            sys::exit_now(125);
        }
    };
    if plan.session.is_some() {
        applied.report();
        detach_and_serve(writes, command.oom)
    }
    let code = supervise(command, applied);
    sys::exit_now(code)
}

/// What setup applied, reported as `Ready` once the parts read back from the kernel
/// are read: for a run, after the command started (they cannot change by then, and
/// the command need not wait for them).
struct Applied {
    landlock: crate::landlock::LandlockReport,
    seccomp_installed: bool,
    timings_us: Vec<crate::report::Timing>,
}

impl Applied {
    fn report(self) {
        let namespaces = NamespaceIds::read("/proc/self");
        match caps::read_back() {
            Ok(caps) => send(&ChildMessage::Ready {
                caps,
                landlock: self.landlock,
                seccomp_installed: self.seccomp_installed,
                namespaces,
                timings_us: self.timings_us,
            }),
            Err(e) => send(&ChildMessage::Failed {
                code: e.code().into(),
                message: e.to_string(),
            }),
        }
    }
}

/// Session mode: once the parent says it is done, stop dying with it (it exits
/// now; the daemon re-parents init) and become the exec agent.
fn detach_and_serve(writes: mounts::Writes, oom: Option<crate::oom::OomScore>) -> ! {
    match recv_fds() {
        Ok((Some(GO_DETACH), _)) => {}
        _ => sys::exit_now(125),
    }
    if sys::prctl(libc::PR_SET_PDEATHSIG, 0).is_err() || send_fds(DETACHED, &[]).is_err() {
        sys::exit_now(125);
    }
    let _ = nix::unistd::close(SYNC_FD);
    let _ = nix::unistd::close(REPORT_FD);
    let _ = rustix::thread::set_name(c"brig-init");
    // SAFETY: arrange_fds placed the listening socket at LISTENER_FD and nothing
    // else owns it.
    let listener =
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(LISTENER_FD) };
    crate::agent::serve(crate::agent::Agent {
        listener,
        writes,
        oom,
    })
}

fn arrange_fds(plan: &ChildPlan<'_>) -> Result<(), JailError> {
    use nix::fcntl::{fcntl, FcntlArg};
    if plan.session.is_some() {
        // A session outlives whoever started it: hold none of its pipes open.
        let null = nix::fcntl::open(
            "/dev/null",
            nix::fcntl::OFlag::O_RDWR,
            nix::sys::stat::Mode::empty(),
        )
        .context(|| "open /dev/null".into())?;
        for fd in 0..3 {
            nix::unistd::dup2(null, fd).context(|| "redirect stdio to /dev/null".into())?;
        }
        if null > 2 {
            let _ = nix::unistd::close(null);
        }
    }
    if let Some(fd) = plan.stdout_fd {
        nix::unistd::dup2(fd, 1).context(|| "redirect stdout".into())?;
    }
    if let Some(fd) = plan.stderr_fd {
        nix::unistd::dup2(fd, 2).context(|| "redirect stderr".into())?;
    }
    // Every descriptor to keep moves above every source and every target slot
    // first, then into place: no placement can overwrite one still to be moved
    // (the session's listener is often at 3, where the sync channel goes).
    let session_sources: Vec<RawFd> = plan
        .session
        .iter()
        .flat_map(|s| std::iter::once(s.listener).chain(s.holds.iter().copied()))
        .collect();
    let floor = session_sources
        .iter()
        .chain([&plan.sync_fd, &plan.report_fd])
        .copied()
        .max()
        .unwrap_or(0)
        .max(LISTENER_FD + session_sources.len() as RawFd)
        .max(10)
        + 1;
    let high = |fd: RawFd, what: &str| {
        fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(floor)).context(|| format!("dup {what}"))
    };
    let sync = high(plan.sync_fd, "sync channel")?;
    let report = high(plan.report_fd, "report pipe")?;
    let moved = session_sources
        .iter()
        .map(|&fd| high(fd, "session descriptor"))
        .collect::<Result<Vec<_>, _>>()?;
    nix::unistd::dup3(sync, SYNC_FD, nix::fcntl::OFlag::O_CLOEXEC)
        .context(|| "place sync pipe".into())?;
    nix::unistd::dup3(report, REPORT_FD, nix::fcntl::OFlag::O_CLOEXEC)
        .context(|| "place report pipe".into())?;
    let mut keep_below = REPORT_FD + 1;
    for (i, fd) in moved.into_iter().enumerate() {
        nix::unistd::dup3(fd, LISTENER_FD + i as RawFd, nix::fcntl::OFlag::O_CLOEXEC)
            .context(|| "place session descriptor".into())?;
        keep_below = LISTENER_FD + i as RawFd + 1;
    }
    sys::close_fds_from(keep_below).context(|| "close inherited descriptors".into())?;
    Ok(())
}

/// The prepared command: what the forked process execs.
struct Command {
    argv: Vec<CString>,
    envp: Vec<CString>,
    candidates: Vec<CString>,
    /// Commands start with the highest OOM score (see `oom`).
    oom: Option<crate::oom::OomScore>,
}

fn setup(plan: &ChildPlan<'_>) -> Result<(Command, mounts::Writes, Applied), JailError> {
    let mut timings = Vec::with_capacity(8);
    let mut mark = |stage: &str| {
        timings.push(crate::report::Timing {
            stage: stage.to_string(),
            at_us: plan.started.elapsed().as_micros() as u64,
        })
    };
    // Stage 2: the parent writes our maps, then one byte with the image's layer
    // mounts (if any). EOF means it died.
    let mut layers = Vec::new();
    let mut seed = None;
    loop {
        match recv_fds()? {
            (Some(GO_LAYERS), fds) => layers.extend(fds),
            (Some(GO_SEED), fds) => seed = fds.into_iter().next(),
            (Some(GO_MAPS_WRITTEN), _) => break,
            _ => sys::exit_now(125),
        }
    }

    // Stage 3: become the sandbox user. Supplementary groups inherited from the host
    // (root's included) must go; rootless brig cannot (setgroups is denied there) and
    // keeps only the caller's own groups, which map to nobody.
    let id = &plan.spec.identity;
    if plan.drop_groups {
        nix::unistd::setgroups(&[]).context(|| "drop supplementary groups".into())?;
    }
    caps::keep_across_setuid()?;
    let gid = nix::unistd::Gid::from_raw(id.gid);
    let uid = nix::unistd::Uid::from_raw(id.uid);
    nix::unistd::setresgid(gid, gid, gid).context(|| format!("setresgid {}", id.gid))?;
    nix::unistd::setresuid(uid, uid, uid).context(|| format!("setresuid {}", id.uid))?;
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .context(|| "set parent-death signal".into())?;
    // The parent may have died before the signal was armed: its end of the sync
    // channel is then closed (POLLHUP; POLLIN alone may just be its next message).
    let mut poll = [nix::poll::PollFd::new(
        // SAFETY: SYNC_FD is open for the whole of setup.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(SYNC_FD) },
        nix::poll::PollFlags::POLLIN,
    )];
    let _ = nix::poll::poll(&mut poll, nix::poll::PollTimeout::ZERO);
    if poll[0]
        .revents()
        .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLHUP))
    {
        sys::exit_now(125);
    }

    mark("child_identity");
    // Stage 4.
    nix::unistd::sethostname(&id.hostname).context(|| "set hostname".into())?;
    if plan.spec.network != brig_policy::NetworkMode::Host {
        net::loopback_up()?;
    }

    mark("child_namespaces");
    // Stage 5.
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let mut receive_sources = || {
        let mut sources = Vec::new();
        loop {
            match recv_fds()? {
                (Some(GO_SOURCES), fds) => sources.extend(fds),
                (Some(GO_SOURCES_DONE), _) => return Ok(sources),
                _ => sys::exit_now(125),
            }
        }
    };
    let sources = if plan.sources_from_parent {
        mounts::Sources::FromParent(&mut receive_sources)
    } else {
        mounts::Sources::Here
    };
    let mut writes = mounts::build_root(
        plan.plan,
        layers,
        sources,
        plan.spec.filesystem.capture_writes,
    )?;
    if plan.session.is_none() {
        // A run hands back an image's upper layer only (see `capture_writes`).
        if let mounts::Writes::Upper(upper) = std::mem::replace(&mut writes, mounts::Writes::None) {
            send_fds(UPPER_LAYER, &[upper])?;
        }
    }
    enter_cwd(&plan.spec.cwd)?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));

    mark("child_filesystem");

    // Join the cgroup the parent prepared meanwhile; only then does a new cgroup
    // namespace root the sandbox's view at its own cgroup.
    let mut rlimits = plan.rlimits.clone();
    if recv_go()? {
        rlimits.nproc = None;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .context(|| "new cgroup namespace".into())?;
    mark("child_cgroup");
    if let (Some(seed), Some(_)) = (&seed, &plan.plan.seed) {
        // In the cgroup, so the tmpfs pages it fills are charged to the sandbox's
        // memory, not to whoever started it; before rlimits (a file size limit
        // must not cut a copy) and while capabilities still let it read and set
        // any mode.
        crate::seed::fill(seed, plan.plan)?;
        mark("child_seed");
    }

    // Stage 7.
    crate::rlimits::apply(&rlimits)?;
    match plan.spec.identity.mapping {
        brig_policy::IdMapping::Single => caps::drop_all()?,
        brig_policy::IdMapping::Build => caps::keep_build_set()?,
    }
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).context(|| "set no_new_privs".into())?;
    // Before Landlock, which refuses writes to /proc; and while init is dumpable (the
    // change of uid made it not), or its /proc files are root's. Nothing of the
    // sandbox runs before init is made non-dumpable again below.
    let oom = sys::prctl(libc::PR_SET_DUMPABLE, 1)
        .ok()
        .and_then(|_| crate::oom::OomScore::open());
    let landlock = landlock::restrict(plan.spec.landlock, &plan.plan.writable, &plan.plan.devices)?;
    mark("child_landlock");
    if let Some(program) = plan.seccomp {
        program.install()?;
    }
    mark("child_seccomp");
    if let Some(cpus) = &plan.cpus {
        let _ = nix::sched::sched_setaffinity(Pid::from_raw(0), cpus);
    }
    // The command runs as the same uid as init; it must not be able to ptrace init
    // or read its memory even where ptrace is allowed.
    sys::prctl(libc::PR_SET_DUMPABLE, 0).context(|| "set non-dumpable".into())?;

    Ok((
        Command {
            argv: plan.argv.clone(),
            envp: plan.envp.clone(),
            candidates: plan.exec_candidates.clone(),
            oom,
        },
        writes,
        Applied {
            landlock,
            seccomp_installed: plan.seccomp.is_some(),
            timings_us: timings,
        },
    ))
}

/// Sends one sync message: `flag` and descriptors (cgroup `tasks` files, layer
/// mounts or the upper layer). Either side uses it on its end of the channel.
pub(crate) fn send_msg(
    sync: RawFd,
    flag: u8,
    files: &[std::os::fd::OwnedFd],
) -> Result<(), JailError> {
    use std::os::fd::AsRawFd;
    let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(std::slice::from_ref(&flag))];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&raw)];
    let cmsgs: &[nix::sys::socket::ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    nix::sys::socket::sendmsg::<()>(sync, &iov, cmsgs, nix::sys::socket::MsgFlags::empty(), None)
        .context(|| "send on the sync channel".into())?;
    Ok(())
}

fn send_fds(flag: u8, files: &[std::os::fd::OwnedFd]) -> Result<(), JailError> {
    send_msg(SYNC_FD, flag, files)
}

/// Receives one sync message: its flag (None when the channel is closed or the
/// message is empty and `MSG_DONTWAIT` found nothing) and the descriptors it carries.
pub(crate) fn recv_msg(
    sync: RawFd,
    flags: nix::sys::socket::MsgFlags,
) -> Result<(Option<u8>, Vec<std::os::fd::OwnedFd>), JailError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::FromRawFd;
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]);
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let msg = match recvmsg::<()>(
        sync,
        &mut iov,
        Some(&mut space),
        flags | MsgFlags::MSG_CMSG_CLOEXEC,
    ) {
        Ok(msg) => msg,
        Err(nix::errno::Errno::EAGAIN) => return Ok((None, Vec::new())),
        Err(e) => return Err(JailError::sys("receive on the sync channel", e.into())),
    };
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(JailError::Setup(
            "too many descriptors in one sync message".into(),
        ));
    }
    let mut fds = Vec::new();
    for cmsg in msg
        .cmsgs()
        .map_err(|e| JailError::sys("read control message", e.into()))?
    {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS just installed these descriptors in this process;
            // nothing else owns them.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let flag = (msg.bytes == 1).then_some(iov[0][0]);
    Ok((flag, fds))
}

fn recv_fds() -> Result<(Option<u8>, Vec<std::os::fd::OwnedFd>), JailError> {
    recv_msg(SYNC_FD, nix::sys::socket::MsgFlags::empty())
}

/// Waits for the second sync message and joins the cgroup files it carries by
/// writing "0" (this thread) to each. Returns whether a cgroup is in use.
fn recv_go() -> Result<bool, JailError> {
    use std::os::fd::AsRawFd;
    let (flag, fds) = recv_fds()?;
    let Some(flag) = flag else {
        // The parent is gone.
        sys::exit_now(125);
    };
    for fd in &fds {
        sys::write_all_fd(fd.as_raw_fd(), b"0").context(|| "join the sandbox's cgroup".into())?;
    }
    drop(fds);
    match flag {
        GO_WITH_CGROUP => Ok(true),
        GO_WITHOUT_CGROUP => Ok(false),
        _ => Err(JailError::Setup(
            "unexpected message on the sync channel".into(),
        )),
    }
}

/// Changes into the working directory, creating it if it lies in writable scratch.
fn enter_cwd(cwd: &str) -> Result<(), JailError> {
    if nix::unistd::chdir(cwd).is_ok() {
        return Ok(());
    }
    let writable = ["/tmp/", "/workspace/"].iter().any(|p| cwd.starts_with(p));
    if writable {
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(cwd)
            .context(|| format!("create working directory {cwd}"))?;
    }
    nix::unistd::chdir(cwd)
        .map_err(|e| JailError::Setup(format!("working directory {cwd}: {}", e.desc())))
}

/// Forks and execs the command, then acts as PID 1 until it ends. Returns init's exit code.
fn supervise(mut command: Command, applied: Applied) -> i32 {
    let mut watched = SigSet::empty();
    watched.add(Signal::SIGCHLD);
    for sig in FORWARDED {
        watched.add(*sig);
    }
    if nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&watched), None).is_err() {
        return 125;
    }
    // Like vfork: the command shares init's memory until it execs, so none of it is
    // copied (init is a copy of brig, plan and all); init waits meanwhile.
    let mut stack = vec![0u8; 256 << 10];
    let mut oom = command.oom.take();
    let start = Box::new(|| -> isize { exec_command(&command) });
    let clone = || {
        // SAFETY: init is single-threaded and suspended until the child execs or
        // exits; the child only adjusts its own signal state, execs, or reports and
        // _exits, and its stack is `stack`, which outlives the call.
        unsafe {
            nix::sched::clone(
                start,
                &mut stack,
                nix::sched::CloneFlags::CLONE_VM | nix::sched::CloneFlags::CLONE_VFORK,
                Some(libc::SIGCHLD),
            )
        }
    };
    let spawned = match &mut oom {
        Some(oom) => oom.for_command(clone),
        None => clone(),
    };
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            send(&ChildMessage::Failed {
                code: "setup_failed".into(),
                message: format!("fork the command: {e}"),
            });
            return 125;
        }
    };
    applied.report();

    loop {
        let sig = match watched.wait() {
            Ok(sig) => sig,
            Err(_) => continue,
        };
        if sig != Signal::SIGCHLD {
            let _ = nix::sys::signal::kill(child, sig);
            continue;
        }
        // Reap everything that has exited: the command, and orphans re-parented to us.
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => {
                    return finish(Some(code), None)
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                    return finish(None, Some(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }
}

/// The command is gone: everything else in the sandbox goes with it.
fn finish(code: Option<i32>, signal: Option<i32>) -> i32 {
    let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
    send(&ChildMessage::Exited {
        code,
        signal,
        init_cpu_us: crate::sys::cpu_time_us(nix::sys::resource::UsageWho::RUSAGE_SELF),
    });
    match (code, signal) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 125,
    }
}

/// In the forked command process: restore a clean signal state and exec.
fn exec_command(command: &Command) -> ! {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // Rust's runtime ignores SIGPIPE in brig; an ignored disposition survives execve,
    // and `yes | head` must behave as it does outside.
    // SAFETY: restoring the default disposition of SIGPIPE has no memory-safety effect.
    unsafe {
        let _ = nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl);
    }
    let mut denied = false;
    let mut last_error = nix::errno::Errno::ENOENT;
    for candidate in &command.candidates {
        // execve only returns on failure.
        let err = nix::unistd::execve(candidate, &command.argv, &command.envp).unwrap_err();
        match err {
            nix::errno::Errno::EACCES => denied = true,
            nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR => {}
            other => {
                last_error = other;
                break;
            }
        }
    }
    let name = command.argv[0].to_string_lossy();
    let (message, exit_code) = if last_error != nix::errno::Errno::ENOENT {
        (format!("cannot execute {name}: {}", last_error.desc()), 126)
    } else if denied {
        (format!("cannot execute {name}: permission denied"), 126)
    } else {
        (format!("command not found: {name}"), 127)
    };
    send(&ChildMessage::ExecFailed { message, exit_code });
    sys::exit_now(exit_code)
}
