//! Record locks: kernel memory that no cgroup pays for, bounded by counting.
//!
//! Every POSIX byte-range lock (`fcntl(F_SETLK)`, `lockf`) is a ~200-byte kernel object.
//! Linux 6.8 took them out of memory cgroup accounting again, and `RLIMIT_LOCKS` has
//! not been enforced since 2.4, so nothing in the kernel bounds how many a process
//! holds: from a sandbox limited to 64 MiB, 7.9 million locks on a few files took 1.5 GB
//! of the host's memory, at ~60 MB/s per CPU. Refusing the calls would break SQLite
//! and every program that locks a file, so brig counts instead: whoever runs a sandbox
//! (`brig run`, the daemon) reads [`held_on_host_at_most`] every [`CHECK_INTERVAL`], and
//! when the host may hold more locks than a sandbox may, [`enforce`] counts that
//! sandbox's locks and kills its processes that hold locks if they are over its budget.
//! What a sandbox can take is then its budget plus what it makes in one interval.
//!
//! The count is exact because a POSIX lock belongs to a process's descriptor table:
//! `/proc/PID/fdinfo/FD` lists the locks taken through that descriptor by the table's
//! owner, and they go when the process does. Locks on an open file description (OFD)
//! could outlive every process of the sandbox in a unix socket's queue, so the seccomp
//! filter refuses them; `flock` locks come one per open file, which the memory cgroup
//! does count. A lock is counted once per descriptor it is reachable through (a `dup`
//! counts it twice), which only ever counts a sandbox high.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::cgroup::Cgroup;
use crate::JailError;

/// How often the holders of sandboxes read the host's count. A sandbox making locks as
/// fast as it can overshoots its budget by at most what its CPUs make in this time.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// When to count a sandbox's locks again, after a count that started at `started` and
/// took `took`. Counting reads every descriptor of every process of the sandbox, so a
/// sandbox that holds many open files (200 processes of 1,000 each: ~0.2 s a count)
/// and stays under its budget would have its holder spend most of a CPU on it, out of
/// the sandbox's own CPU limit: counts of a sandbox take at most a fifth of the time.
/// Such a sandbox is counted less often, and can overshoot its budget by what it makes
/// in that time; its open files, which its memory limit pays for, set how long.
pub fn next_count(started: Instant, took: Duration) -> Instant {
    started + CHECK_INTERVAL.max(took * 5)
}

/// A process of a sandbox that held locks when its sandbox went over its budget, and
/// was killed for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// In the host's pid namespace.
    pub pid: i32,
    pub locks: u64,
}

/// A sandbox over its budget of locks, and what was done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overrun {
    /// Every lock its processes held.
    pub held: u64,
    pub budget: u64,
    /// The processes killed: every one that held a lock.
    pub killed: Vec<Holder>,
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pids: Vec<String> = self.killed.iter().map(|h| h.pid.to_string()).collect();
        write!(
            f,
            "the sandbox held {} file locks, over its budget of {} (one per 4 KiB of its memory limit): killed pid {}",
            self.held,
            self.budget,
            pids.join(", ")
        )
    }
}

/// At least as many as the record locks held on the host, or `None` where that cannot
/// be read (not root, a kernel without SLUB's sysfs): the objects in use in the
/// kernel's cache of locks. That cache may be merged with others of the same object
/// size, which only makes the bound higher. A read is ~20 µs of CPU, whatever is held.
///
/// `/proc/locks` would count exactly but cannot be used: each read of it walks the
/// host's list of locks from the start and returns one page, so reading it costs the
/// square of what is held (minutes for two million locks), and each read holds the
/// lock that every `fcntl(F_SETLK)` on the host takes.
pub fn held_on_host_at_most() -> Option<u64> {
    let text = std::fs::read_to_string("/sys/kernel/slab/file_lock_cache/objects").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Counts the locks of the processes in `cgroup` and, if there are more than
/// `budget`, kills (SIGKILL) each of them that holds any. `None` if within budget.
/// The sandbox's `init` (host pid) is brig's own and left out: it holds a lock on the
/// sandbox's cached `/etc`, and its death would end the whole sandbox.
///
/// Each process is pinned by a pidfd before its descriptors are read, and counted only
/// if it is still alive after: so a pid recycled meanwhile is neither counted nor
/// killed.
///
/// `before_kill` runs once the count is over the budget and before any signal is
/// sent: whoever watches the processes die (a daemon's exec) must be able to tell
/// why they died as soon as they have.
pub fn enforce(
    cgroup: &Cgroup,
    init: i32,
    budget: u64,
    before_kill: impl FnOnce(),
) -> Result<Option<Overrun>, JailError> {
    let mut holders = Vec::new();
    let mut held = 0u64;
    for pid in cgroup.procs()?.into_iter().filter(|&pid| pid != init) {
        let Some(pidfd) = pin(pid) else { continue };
        let Ok(locks) = locks_of(pid) else { continue };
        if locks == 0 || crate::session::exited(&pidfd) {
            continue;
        }
        held += locks;
        holders.push((Holder { pid, locks }, pidfd));
    }
    if held <= budget {
        return Ok(None);
    }
    before_kill();
    let mut killed = Vec::new();
    for (holder, pidfd) in holders {
        match rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL) {
            Ok(()) => killed.push(holder),
            // Gone already: its locks went with it.
            Err(e) if e == rustix::io::Errno::SRCH => {}
            Err(e) => {
                return Err(JailError::sys(
                    "kill a process over the sandbox's lock budget",
                    e.into(),
                ))
            }
        }
    }
    Ok(Some(Overrun {
        held,
        budget,
        killed,
    }))
}

fn pin(pid: i32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// The locks process `pid` holds: the `lock:` lines of its descriptors' fdinfo.
fn locks_of(pid: i32) -> io::Result<u64> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut total = 0;
    for entry in std::fs::read_dir(&dir)? {
        let Ok(entry) = entry else { continue };
        match std::fs::read(entry.path()) {
            Ok(text) => total += count_lock_lines(&text),
            // Closed meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

fn count_lock_lines(fdinfo: &[u8]) -> u64 {
    fdinfo
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"lock:"))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_count_comes_back_later() {
        let now = Instant::now();
        assert_eq!(
            next_count(now, Duration::from_millis(1)),
            now + CHECK_INTERVAL
        );
        assert_eq!(
            next_count(now, Duration::from_millis(200)),
            now + Duration::from_secs(1)
        );
    }

    #[test]
    fn fdinfo_lock_lines_are_counted() {
        let fdinfo = b"pos:\t0\nflags:\t02\nmnt_id:\t21\nino:\t5678\n\
            lock:\t1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 0\n\
            lock:\t2: POSIX  ADVISORY  WRITE 1234 08:01:5678 2 2\n";
        assert_eq!(count_lock_lines(fdinfo), 2);
        assert_eq!(count_lock_lines(b"pos:\t0\nflags:\t02\n"), 0);
    }

    /// Another process's locks, counted as `enforce` counts a sandbox's.
    #[test]
    fn a_process_is_charged_with_the_locks_it_takes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locked");
        // Every other byte: ranges that do not touch stay separate locks.
        let script = "import fcntl, sys\n\
            f = open(sys.argv[1], 'w')\n\
            for i in range(50): fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)\n\
            print('locked', flush=True)\n\
            sys.stdin.read()\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "locked\n");
        let pid = child.id() as i32;
        assert_eq!(locks_of(pid).unwrap(), 50);
        if let Some(bound) = held_on_host_at_most() {
            assert!(bound >= 50, "{bound}");
        }
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}
