//! A session's sandbox seen from the host: found again by a restarted daemon,
//! paused, measured, and torn down.
//!
//! A [`SessionHandle`] is plain data (it serializes): the daemon stores it and any
//! later process can act on the sandbox with it. Its init is identified by pid plus
//! start time, so a recycled pid is never mistaken for it, and signalled through a
//! pidfd, so a signal never reaches a process that merely took over its pid.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cgroup::{Cgroup, CgroupStats, CgroupUsage};
use crate::report::{Enforced, Timing};
use crate::JailError;

/// What [`crate::start_session`] returns.
#[derive(Debug, Clone, Serialize)]
pub struct SessionStarted {
    pub handle: SessionHandle,
    pub enforced: Enforced,
    pub timings_us: Vec<Timing>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHandle {
    /// The sandbox's init, in the host's pid namespace.
    pub pid: i32,
    /// Its start time (clock ticks after boot, /proc/PID/stat field 22).
    pub start_time: u64,
    pub cgroup: Option<Cgroup>,
    /// The host ids the sandbox's user maps to (files written for it get these).
    pub host_uid: u32,
    pub host_gid: u32,
}

/// How long `destroy` waits for the sandbox's processes to be gone.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(5);

impl SessionHandle {
    pub(crate) fn new(
        pid: i32,
        cgroup: Option<Cgroup>,
        (host_uid, host_gid): (u32, u32),
    ) -> Result<SessionHandle, JailError> {
        let start_time =
            start_time(pid).map_err(|e| JailError::sys("read the session's init", e))?;
        Ok(SessionHandle {
            pid,
            start_time,
            cgroup,
            host_uid,
            host_gid,
        })
    }

    /// A pidfd for init, or `None` if it is gone (or its pid now belongs to another
    /// process). Readable once init has exited.
    pub fn pidfd(&self) -> io::Result<Option<OwnedFd>> {
        let fd = match pidfd_open(self.pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
            Err(e) => return Err(e),
        };
        // Checked after taking the pidfd: if the start time still matches, the pidfd
        // refers to init, whatever happens to the pid later.
        match start_time(self.pid) {
            Ok(t) if t == self.start_time => Ok(Some(fd)),
            _ => Ok(None),
        }
    }

    /// Back to normal priority, for a sandbox started at idle priority ahead of
    /// need ([`start_in_background`]) and now in use. Init is single-threaded, and
    /// what it starts from now on inherits the policy. The caller must be init's
    /// parent (the daemon, a child subreaper): then init's pid cannot be reused
    /// before the caller reaps it.
    pub fn to_foreground(&self) -> Result<(), JailError> {
        crate::sys::set_sched_idle(self.pid, false)
            .map_err(|e| JailError::sys("restore the sandbox's priority", e))
    }

    pub fn is_alive(&self) -> bool {
        matches!(self.pidfd(), Ok(Some(fd)) if !exited(&fd))
    }

    /// Kills the sandbox (SIGKILL to its init takes every process of its pid
    /// namespace), reaps init if this process is its parent, and removes its cgroup.
    /// Safe to call again, or for a sandbox already gone.
    pub fn destroy(&self) -> Result<(), JailError> {
        if let Some(pidfd) = self.pidfd().map_err(|e| JailError::sys("pidfd_open", e))? {
            let _ = pidfd_send_signal(&pidfd, libc::SIGKILL);
            // A paused (frozen) sandbox takes the SIGKILL only once thawed.
            if let Some(cgroup) = &self.cgroup {
                let _ = cgroup.freeze(false);
            }
            let deadline = Instant::now() + DESTROY_TIMEOUT;
            while !exited(&pidfd) && Instant::now() < deadline {
                wait_readable(&pidfd, Duration::from_millis(100));
            }
            reap(&pidfd);
        }
        if let Some(cgroup) = &self.cgroup {
            // Normally empty by now; kill_all covers anything that escaped the pid
            // namespace's teardown while it ran.
            cgroup.kill_all()?;
            cgroup.remove()?;
        }
        Ok(())
    }

    /// Freezes (pause) or thaws (resume) every process of the sandbox.
    pub fn freeze(&self, frozen: bool) -> Result<(), JailError> {
        match &self.cgroup {
            Some(cgroup) => cgroup.freeze(frozen),
            None => Err(JailError::Unsupported(
                "this session has no cgroup, so it cannot be paused".into(),
            )),
        }
    }

    pub fn stats(&self) -> Option<CgroupStats> {
        self.cgroup.as_ref().map(|c| c.stats())
    }

    /// What the sandbox uses now (memory, tasks).
    pub fn usage(&self) -> Option<CgroupUsage> {
        self.cgroup.as_ref().map(|c| c.usage())
    }

    /// `stats().oom_kills` without reading the rest.
    pub fn oom_kills(&self) -> Option<u64> {
        self.cgroup.as_ref().map(|c| c.oom_kills())
    }
}

/// Makes the calling (single-threaded) process, and every process it starts from now
/// on, run at idle priority (`SCHED_IDLE`): for a sandbox started ahead of need (a
/// warm pool), whose setup must not slow down the requests being served meanwhile.
/// [`SessionHandle::to_foreground`] undoes it for the sandbox once it is used.
pub fn start_in_background() -> Result<(), JailError> {
    crate::sys::set_sched_idle(0, true).map_err(|e| JailError::sys("lower the priority", e))
}

/// While alive, the calling thread touches files as a sandbox's user: its fsuid and
/// fsgid are the sandbox's host ids and it has no supplementary groups. Created
/// files belong to that user, permission checks are the user's (setting a non-zero
/// fsuid drops the file capabilities), and the kernel accepts new inodes on the
/// sandbox's own filesystems (tmpfs and overlay mounted in its user namespace take
/// only owners mapped there: host root gets EOVERFLOW). Everything is restored on
/// drop. Per thread: the raw syscalls, unlike libc's set*id wrappers, change only
/// the calling thread's credentials.
pub struct ActingAs {
    groups: Vec<libc::gid_t>,
    fsuid: libc::uid_t,
    fsgid: libc::gid_t,
}

pub fn act_as(uid: u32, gid: u32) -> io::Result<ActingAs> {
    let mut groups = vec![0 as libc::gid_t; 256];
    // SAFETY: getgroups writes at most `groups.len()` ids into the buffer.
    let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    // SAFETY: setgroups with a null list and a count of 0 clears this thread's
    // supplementary groups; it reads no memory.
    if unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setfsgid/setfsuid take an id and return the previous one; they cannot
    // fail in a way that touches memory (a refused change returns the old id).
    let fsgid = unsafe { libc::syscall(libc::SYS_setfsgid, gid) } as libc::gid_t;
    // SAFETY: as for setfsgid above.
    let fsuid = unsafe { libc::syscall(libc::SYS_setfsuid, uid) } as libc::uid_t;
    Ok(ActingAs {
        groups,
        fsuid,
        fsgid,
    })
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // SAFETY: as in act_as; the groups buffer outlives the call.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, self.fsuid);
            libc::syscall(libc::SYS_setfsgid, self.fsgid);
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
        }
    }
}

/// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER):
/// a daemon calls it before starting sessions, so each session's init becomes its
/// child when the launch helper exits, and is reaped by it.
pub fn become_subreaper() -> io::Result<()> {
    crate::sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1).map(|_| ())
}

/// Reaps init if it has exited and this process is its parent (a daemon that set
/// itself as child subreaper and started the session); otherwise does nothing.
pub fn reap(pidfd: &OwnedFd) {
    // SAFETY: waitid with P_PIDFD on a valid pidfd and a zeroed siginfo to fill.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        );
    }
}

/// Whether the process behind `pidfd` has exited (the pidfd is readable then).
pub fn exited(pidfd: &OwnedFd) -> bool {
    wait_readable(pidfd, Duration::ZERO)
}

fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let timeout = nix::poll::PollTimeout::try_from(timeout.as_millis().min(60_000) as i32)
        .unwrap_or(nix::poll::PollTimeout::ZERO);
    matches!(nix::poll::poll(&mut fds, timeout), Ok(n) if n > 0)
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Field 22 of /proc/PID/stat (after the parenthesised command name, which may
/// itself hold spaces and parentheses).
fn start_time(pid: i32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat"))?;
    // `after` starts with field 3 (state); start time is field 22.
    after
        .split_whitespace()
        .nth(19)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat"))
}

/// Binds the socket a session's init will serve on: SOCK_SEQPACKET at `path`
/// (replacing a stale socket file), mode 0600 so only root can connect.
pub fn bind_listener(path: &Path) -> io::Result<OwnedFd> {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let socket = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // The socket file is created with the umask applied; make it 0600 from birth.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = bind(socket.as_raw_fd(), &UnixAddr::new(path)?);
    nix::sys::stat::umask(old);
    bound?;
    listen(&socket, Backlog::new(256).unwrap_or(Backlog::MAXCONN))?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    #[test]
    fn start_time_of_self_is_stable() {
        let pid = std::process::id() as i32;
        let a = super::start_time(pid).unwrap();
        let b = super::start_time(pid).unwrap();
        assert_eq!(a, b);
        assert!(a > 0);
    }
}
