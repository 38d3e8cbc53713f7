//! The watchdog: a process that outlives brig only to clean up after it.
//!
//! The sandbox dies with brig (PDEATHSIG, then its pid namespace), but its cgroup
//! lives outside it: if brig is killed, even by SIGKILL, something must kill what is
//! left in the cgroup, remove it, and hold the host id lease until then. The
//! watchdog, started while the sandbox builds its root, waits on a pipe for one
//! byte: `d` ("done, the cgroup is handed on"), `r` ("the sandbox is gone: remove its
//! cgroup", which it does while brig writes its report), or end of file ("brig
//! died").
//!
//! It shares brig's memory (`CLONE_VM`) instead of copying it (fork): starting it
//! copies no page tables, brig's later writes take no copy-on-write faults, and its
//! exit tears no address space down (releasing it took ~90 µs as a fork; BENCHMARKS.md,
//! session 8). That asks for care while brig lives: the watchdog allocates nothing
//! (the heap is brig's) and makes only raw system calls (rustix), or libc calls that
//! cannot fail here (it has no thread-local storage of its own, so libc's errno is
//! brig's). To clean up, it execs brig's binary afresh ([`main_if_requested`]): brig
//! may have died inside malloc holding its lock, so nothing of the dead process's heap
//! is used; the new image runs the ordinary [`Cgroup::kill_all`] and
//! [`Cgroup::remove`].

use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::cgroup::Cgroup;
use crate::{sys, Context, JailError};

/// The first argument that makes brig's binary a watchdog cleaning up.
const CLEANUP_ARG: &str = "__brig-watchdog";

/// Where the watchdog keeps the done pipe and the lease.
const DONE_FD: RawFd = 3;
const LEASE_FD: RawFd = 4;

const STACK_BYTES: usize = 64 << 10;

/// The messages on the done pipe.
const DONE: u8 = b'd';
const REMOVE: u8 = b'r';

/// How long the watchdog retries removing a leaf the kernel still calls busy (a
/// task of the sandbox not quite gone), as `Cgroup::remove` does.
const REMOVE_ATTEMPTS: u32 = 200;
const REMOVE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

pub(crate) struct Watchdog {
    pid: Pid,
    done: OwnedFd,
    /// What the watchdog reads and runs on: freed only once it is reaped (if brig
    /// dies first, the watchdog keeps the whole address space alive).
    shared: Box<Shared>,
    stack: Stack,
}

/// Everything the watchdog needs, prepared by brig before the clone.
struct Shared {
    /// The read end of the done pipe, at this number in the watchdog's descriptors.
    done: RawFd,
    lease: Option<RawFd>,
    /// The cgroup's leaves, in the order to remove them.
    leaves: Vec<CString>,
    exe: CString,
    /// `argv` for the exec; the pointers point into `_args`.
    argv: Vec<*const c_char>,
    envp: [*const c_char; 1],
    _args: Vec<CString>,
}

impl Watchdog {
    /// Starts the watchdog of `cgroup`, holding `lease` too. Every other descriptor
    /// brig has is closed in the watchdog, above all brig's end of the sandbox's sync
    /// channel, whose closing tells the sandbox that brig died.
    pub(crate) fn spawn(cgroup: &Cgroup, lease: Option<RawFd>) -> Result<Watchdog, JailError> {
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .context(|| "pipe for the watchdog".into())?;
        let description = serde_json::to_string(cgroup)
            .map_err(|e| JailError::Setup(format!("describe the cgroup: {e}")))?;
        let args = ["brig-watchdog", CLEANUP_ARG, &description]
            .into_iter()
            .map(CString::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| JailError::Setup(format!("describe the cgroup: {e}")))?;
        let leaves = cgroup
            .leaf_paths()
            .into_iter()
            .rev()
            .map(|leaf| CString::new(leaf.into_os_string().into_encoded_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| JailError::Setup(format!("describe the cgroup: {e}")))?;
        let mut argv: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let shared = Box::new(Shared {
            done: read_end.as_raw_fd(),
            lease,
            leaves,
            exe: CString::from(c"/proc/self/exe"),
            argv,
            envp: [std::ptr::null()],
            _args: args,
        });
        let stack = Stack::new(STACK_BYTES).context(|| "watchdog stack".into())?;
        // SAFETY: `watchdog_main` only reads `shared` and uses the stack it is given;
        // both stay allocated until the watchdog is reaped (`release`), and forever if
        // this process dies first (the watchdog then holds the address space).
        let pid = unsafe {
            sys::clone_vm(
                watchdog_main,
                stack.top(),
                &*shared as *const Shared as *mut c_void,
            )
        }
        .context(|| "start the watchdog".into())?;
        // The watchdog has its own copy of the read end.
        drop(read_end);
        Ok(Watchdog {
            pid: Pid::from_raw(pid),
            done: write_end,
            shared,
            stack,
        })
    }

    /// The cgroup is gone (or handed on): let the watchdog exit, and reap it.
    pub(crate) fn release(self) {
        let _ = sys::write_all_fd(self.done.as_raw_fd(), &[DONE]);
        self.reap();
    }

    /// The sandbox is gone: the watchdog removes the (empty) cgroup and exits, while
    /// this process goes on. [`Removal::wait`] for the result.
    pub(crate) fn remove_cgroup(self) -> Removal {
        let _ = sys::write_all_fd(self.done.as_raw_fd(), &[REMOVE]);
        Removal { watchdog: self }
    }

    /// Waits for the watchdog's exit; true if it exited with 0.
    fn reap(self) -> bool {
        drop(self.done);
        let status = waitpid(self.pid, None);
        drop(self.stack);
        drop(self.shared);
        matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 0)))
    }
}

/// A cgroup removal the watchdog is doing.
pub(crate) struct Removal {
    watchdog: Watchdog,
}

impl Removal {
    /// True once every leaf is gone; false if the watchdog could not remove them
    /// all, even after killing what was left (the caller may try itself, for the
    /// reason).
    pub(crate) fn wait(self) -> bool {
        self.watchdog.reap()
    }
}

/// The watchdog. Runs on its own stack in brig's address space, with a copy of
/// brig's descriptors.
extern "C" fn watchdog_main(arg: *mut c_void) -> c_int {
    // SAFETY: `spawn` passes a `Shared` that outlives this process.
    let shared = unsafe { &*(arg as *const Shared) };
    if !arrange_fds(shared) {
        // Without its descriptors in place it cannot wait for brig: clean up now.
        return exec_cleanup(shared);
    }
    // Out of brig's session so a terminal's ^C or hangup does not reach it.
    let _ = rustix::process::setsid();
    let _ = rustix::thread::set_name(c"brig-watchdog");
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: DONE_FD is ours (arrange_fds put it there) for the process's life.
        let done = unsafe { rustix::fd::BorrowedFd::borrow_raw(DONE_FD) };
        match rustix::io::read(done, &mut byte) {
            Ok(1) if byte[0] == REMOVE => return remove_leaves(shared),
            Ok(1) => return 0,
            Err(rustix::io::Errno::INTR) => continue,
            // End of file: brig died without cleaning up.
            _ => return exec_cleanup(shared),
        }
    }
}

/// Puts the done pipe at 3 and the lease at 4, stdio on /dev/null (away from brig's
/// stdio, so no pipe of brig's caller is held open), and closes everything else.
fn arrange_fds(shared: &Shared) -> bool {
    let borrow = |fd: RawFd| {
        // SAFETY: the numbers come from brig's descriptor table, copied at clone
        // and untouched since; borrowed only for the calls below.
        unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) }
    };
    // Above every target slot first, so no placement overwrites one still to move.
    let Ok(done) = rustix::io::fcntl_dupfd_cloexec(borrow(shared.done), 10) else {
        return false;
    };
    let lease = match shared.lease {
        Some(fd) => match rustix::io::fcntl_dupfd_cloexec(borrow(fd), 10) {
            Ok(moved) => Some(moved),
            Err(_) => return false,
        },
        None => None,
    };
    let place = |from: &OwnedFd, to: RawFd| {
        // SAFETY: `to` is a slot this process owns from now on; the OwnedFd is
        // forgotten right after, so nothing closes it behind our back.
        let mut slot = unsafe { OwnedFd::from_raw_fd(to) };
        let placed = rustix::io::dup2(from, &mut slot).is_ok();
        std::mem::forget(slot);
        placed
    };
    if !place(&done, DONE_FD) || !lease.as_ref().is_none_or(|l| place(l, LEASE_FD)) {
        return false;
    }
    if let Ok(null) = rustix::fs::open(
        c"/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        for fd in 0..3 {
            place(&null, fd);
        }
        std::mem::forget(null);
    }
    std::mem::forget(done);
    std::mem::forget(lease);
    let keep_below = if shared.lease.is_some() {
        LEASE_FD + 1
    } else {
        DONE_FD + 1
    };
    // close_range cannot fail for a valid range, so libc's errno (brig's) is never
    // written; the descriptors above were forgotten, not dropped.
    sys::close_fds_from(keep_below).is_ok()
}

/// Removes the cgroup's leaves with raw system calls; if one stays busy, execs the
/// full cleanup (which kills what is left first).
fn remove_leaves(shared: &Shared) -> c_int {
    for leaf in &shared.leaves {
        let mut attempts = 0;
        loop {
            match rustix::fs::rmdir(leaf.as_c_str()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => break,
                Err(rustix::io::Errno::BUSY) if attempts < REMOVE_ATTEMPTS => {
                    attempts += 1;
                    let _ = rustix::thread::nanosleep(&rustix::thread::Timespec {
                        tv_sec: 0,
                        tv_nsec: REMOVE_POLL.as_nanos() as _,
                    });
                }
                Err(_) => return exec_cleanup(shared),
            }
        }
    }
    0
}

/// Replaces the watchdog with a fresh brig that cleans up ([`main_if_requested`]).
fn exec_cleanup(shared: &Shared) -> c_int {
    // SAFETY: every pointer is into `shared`, alive and unchanged; argv and envp are
    // null-terminated. execve returns only on failure (/proc/self/exe unusable), and
    // then writes errno, which is brig's main thread's: a call of brig's failing at
    // that very moment could report the wrong reason. Nothing is allocated or locked.
    unsafe {
        libc::execve(
            shared.exe.as_ptr(),
            shared.argv.as_ptr(),
            shared.envp.as_ptr(),
        );
    }
    127
}

/// The watchdog's cleanup, when brig's binary was started as one: kills what is left
/// in the cgroup, removes it, and exits (which releases the lease it inherited).
/// A binary that runs sandboxes with this crate calls this first thing in `main`.
pub fn main_if_requested() {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_none_or(|a| a != CLEANUP_ARG) {
        return;
    }
    let _ = rustix::thread::set_name(c"brig-watchdog");
    let cgroup = args
        .next()
        .and_then(|json| serde_json::from_slice::<Cgroup>(json.as_encoded_bytes()).ok());
    let code = match cgroup {
        Some(cgroup) => {
            let killed = cgroup.kill_all();
            let removed = cgroup.remove();
            i32::from(killed.is_err() || removed.is_err())
        }
        None => 2,
    };
    std::process::exit(code)
}

/// The watchdog's stack: anonymous memory with a guard page below it.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    fn new(usable: usize) -> std::io::Result<Stack> {
        let guard = 4096;
        let len = usable + guard;
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping made above.
        if unsafe { libc::mprotect(base, guard, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping, the initial stack pointer.
        unsafe { self.base.byte_add(self.len) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; only dropped once no process runs on it.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}
