//! Thin wrappers over system calls that neither `nix` nor `rustix` expose in the form
//! brig needs (the new mount API, a fork-like clone with namespace flags, pivot_root).
//! Each returns `io::Result` and holds the only `unsafe` for its call.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

pub const OPEN_TREE_CLONE: u32 = 1;
pub const AT_RECURSIVE: u32 = 0x8000;
pub const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
pub const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

const FSCONFIG_SET_FLAG: u32 = 0;
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
const FSOPEN_CLOEXEC: u32 = 1;
const FSMOUNT_CLOEXEC: u32 = 1;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cstr(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A detached copy of the mount tree at `path` (recursive), to be attached elsewhere
/// with [`move_mount_fd`]. Cloning first and attaching later means host paths are
/// resolved before anything in the new mount namespace can shadow them.
pub fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    let path = cstr(path)?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call; the
    // kernel returns a new file descriptor that we take ownership of below.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            (OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as u32) as libc::c_uint,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// As [`open_tree_clone`], for the tree at the file `at` was opened on (an `O_PATH`
/// descriptor will do): what was resolved once is cloned, with no path to resolve
/// again.
pub fn open_tree_clone_fd(at: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: the empty path is a valid NUL-terminated string with static lifetime
    // and `at` is a descriptor borrowed for the call; the kernel returns a new
    // file descriptor that we take ownership of below.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            at.as_raw_fd(),
            c"".as_ptr(),
            (OPEN_TREE_CLONE | AT_RECURSIVE | libc::AT_EMPTY_PATH as u32 | libc::O_CLOEXEC as u32)
                as libc::c_uint,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sets mount attributes on every mount of the (possibly detached) tree `tree`.
/// Only sets flags, never clears them, so flags the host locked stay as they are.
pub fn mount_setattr_fd(tree: BorrowedFd<'_>, attr_set: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c"";
    // SAFETY: `attr` is a properly laid out `struct mount_attr` whose size we pass;
    // `empty` is a static C string; `tree` is a valid open descriptor.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            (libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Makes the detached mount `tree` idmapped through the user namespace `userns`
/// (file owner k shows as the host id that k maps to in `userns`), with `attr_set`
/// flags. Only the host's root can do this for a filesystem it mounted.
pub fn mount_setattr_idmap(
    tree: BorrowedFd<'_>,
    userns: BorrowedFd<'_>,
    attr_set: u64,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: attr_set | MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: as in `mount_setattr_fd`; `userns` is a valid open descriptor.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// A filesystem context from fsopen(2), configured key by key and then mounted
/// detached. Used for overlayfs, whose `lowerdir+` key takes one layer per call, so
/// the number of layers is not bounded by the one-page limit of mount options.
pub struct FsContext(OwnedFd);

impl FsContext {
    pub fn open(fstype: &str) -> io::Result<Self> {
        let name =
            CString::new(fstype).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `name` is a valid C string that outlives the call.
        let fd = check(unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) })?;
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        Ok(FsContext(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    fn config(&self, cmd: u32, key: Option<&str>, value: Option<&[u8]>) -> io::Result<()> {
        let key = key
            .map(CString::new)
            .transpose()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let value = value
            .map(CString::new)
            .transpose()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the context descriptor is valid; `key` and `value` are NULL or valid
        // C strings that outlive the call, as fsconfig(2) expects for these commands.
        check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                cmd,
                key.as_ref().map_or(std::ptr::null(), |k| k.as_ptr()),
                value.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                0 as libc::c_int,
            )
        })?;
        Ok(())
    }

    pub fn set_string(&self, key: &str, value: &[u8]) -> io::Result<()> {
        self.config(FSCONFIG_SET_STRING, Some(key), Some(value))
    }

    pub fn set_flag(&self, key: &str) -> io::Result<()> {
        self.config(FSCONFIG_SET_FLAG, Some(key), None)
    }

    /// Creates the superblock and returns it as a detached mount with `attr` flags.
    pub fn mount(self, attr: u64) -> io::Result<OwnedFd> {
        self.config(FSCONFIG_CMD_CREATE, None, None)?;
        // SAFETY: the context descriptor is valid; fsmount returns a new descriptor.
        let fd = check(unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.0.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attr as libc::c_uint,
            )
        })?;
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

/// Same as [`mount_setattr_fd`] for the mount at `path` only (not its children).
pub fn mount_setattr_path(path: &Path, attr_set: u64) -> io::Result<()> {
    let path = cstr(path)?;
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: as above; `path` outlives the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            0 as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Attaches the detached tree `tree` on top of the object `target` refers to
/// (an `O_PATH` descriptor), so no path string is resolved at attach time.
pub fn move_mount_fd(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    let empty = c"";
    // SAFETY: both descriptors are valid; the empty strings are static.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            (MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) as libc::c_uint,
        )
    })?;
    Ok(())
}

/// pivot_root(2), which libc does not wrap.
pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstr(new_root)?;
    let put_old = cstr(put_old)?;
    // SAFETY: both strings are valid and outlive the call.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })?;
    Ok(())
}

/// What [`clone_process`] returned in the calling process.
pub enum CloneResult {
    Parent { child: libc::pid_t },
    Child,
}

/// Creates a child process with the given namespace flags, like fork(2): the child
/// continues from this call on a copy-on-write copy of the address space and stack.
///
/// # Safety
/// The calling process must be single-threaded: like fork, the child gets a copy of
/// memory in which another thread may have held a lock (malloc's, say) forever.
pub unsafe fn clone_process(namespace_flags: libc::c_int) -> io::Result<CloneResult> {
    // SAFETY: the caller guarantees a single thread. A NULL stack makes the kernel
    // reuse the (copied) current stack, which is exactly fork's behaviour; the
    // remaining pointer arguments are unused without CLONE_*TID/SETTLS flags.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (namespace_flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    match check(ret)? {
        0 => Ok(CloneResult::Child),
        pid => Ok(CloneResult::Parent {
            child: pid as libc::pid_t,
        }),
    }
}

/// [`clone_process`] with `CLONE_NEWUSER` among `namespace_flags`, the new user
/// namespace owned by host uid `owner` instead of by the caller (root).
///
/// The kernel charges per-user counts (queued signals, inotify instances,
/// processes, message queue bytes) at every level up the chain of user namespaces,
/// at the parent's level to the namespace's owner: a sandbox in a namespace root
/// owns could use up root's share, which every other sandbox and root's own host
/// processes draw on. Owned by the sandbox's leased uid, it uses only that uid's.
///
/// The owner is the creator's effective uid, so it is switched for the clone. The
/// real and saved uids stay 0, which lets this process switch back, and
/// `SECBIT_NO_SETUID_FIXUP` keeps its capabilities meanwhile: a host that lets only
/// privileged processes create user namespaces (Debian's
/// `kernel.unprivileged_userns_clone=0`, Ubuntu's AppArmor restriction) still lets
/// this one. The child starts with those credentials and sets its own ids and
/// securebits before anything else (see `init`).
///
/// # Safety
/// As for [`clone_process`]; and the caller must be root (uid 0 in all three).
pub unsafe fn clone_process_owned_by(
    owner: u32,
    namespace_flags: libc::c_int,
) -> io::Result<CloneResult> {
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const UNCHANGED: libc::uid_t = libc::uid_t::MAX;
    let bits = prctl(libc::PR_GET_SECUREBITS, 0)? as libc::c_ulong;
    let dumpable = prctl(libc::PR_GET_DUMPABLE, 0)? as libc::c_ulong;
    prctl(libc::PR_SET_SECUREBITS, bits | SECBIT_NO_SETUID_FIXUP)?;
    let restore = || -> io::Result<()> {
        // SAFETY: setresuid takes plain integers; the process is single-threaded
        // (the caller's promise), so no other thread sees credentials change.
        if unsafe { libc::setresuid(UNCHANGED, 0, UNCHANGED) } != 0 {
            return Err(io::Error::last_os_error());
        }
        prctl(libc::PR_SET_SECUREBITS, bits)?;
        // A change of effective uid resets the dumpable flag (which decides who
        // owns the process's /proc files); nothing else about it changed.
        prctl(libc::PR_SET_DUMPABLE, dumpable).map(|_| ())
    };
    // SAFETY: as above.
    if unsafe { libc::setresuid(UNCHANGED, owner, UNCHANGED) } != 0 {
        let e = io::Error::last_os_error();
        restore()?;
        return Err(e);
    }
    // The child starts with the flag this process had, as with a plain clone.
    let cloned = prctl(libc::PR_SET_DUMPABLE, dumpable).and_then(|_| {
        // SAFETY: forwarded to the caller.
        unsafe { clone_process(namespace_flags) }
    });
    if let Ok(CloneResult::Child) = cloned {
        return cloned;
    }
    if let Err(e) = restore() {
        // Going on as another user would be wrong in ways no caller can check.
        eprintln!("brig: cannot switch back to root after creating a sandbox: {e}");
        std::process::abort();
    }
    cloned
}

/// Starts a process that shares this one's memory (`CLONE_VM`, not a thread: its
/// own descriptor table, signal handlers and thread group) and runs `entry(arg)` on
/// the stack ending at `stack_top`; it exits with what `entry` returns.
///
/// # Safety
/// `stack_top` must be the top of memory that stays mapped, and `arg` valid, for
/// the new process's whole life. `entry` runs without thread-local storage of its
/// own (it shares the caller's): it must not allocate, unwind, or use anything that
/// keeps state there (libc's errno included) while the caller may run.
pub unsafe fn clone_vm(
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    stack_top: *mut libc::c_void,
    arg: *mut libc::c_void,
) -> io::Result<libc::pid_t> {
    // SAFETY: forwarded to the caller; glibc's clone aligns the stack and ends the
    // new process with the exit system call when `entry` returns.
    let pid = unsafe { libc::clone(entry, stack_top, libc::CLONE_VM | libc::SIGCHLD, arg) };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// Sets the scheduling policy of thread `tid` (0: the caller) to `SCHED_IDLE` (runs
/// only when a CPU has nothing else to do) or back to `SCHED_OTHER`.
pub fn set_sched_idle(tid: libc::pid_t, idle: bool) -> io::Result<()> {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param for the duration of the call.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor from `first` up, except none: used right after clone so
/// the sandbox inherits nothing brig did not mean to give it.
pub fn close_fds_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller has already moved the
    // ones it needs below `first`, so no live Rust object refers to a closed one
    // (OwnedFds above `first` are leaked by the caller, never dropped).
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        )
    })?;
    Ok(())
}

/// Number of threads of the calling process, from /proc/self/stat.
pub fn thread_count() -> io::Result<usize> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Field 20 (num_threads), counted after the parenthesised command name.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::other("malformed /proc/self/stat"))?;
    after
        .split_whitespace()
        .nth(17)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::other("malformed /proc/self/stat"))
}

pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the prctl options brig uses take integer arguments only.
    let ret = unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Writes `data` to `fd` in full, retrying on EINTR. Usable after clone without allocation.
pub fn write_all_fd(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a valid slice for the given length.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// This process's argument vector, as the C runtime hands it to `.init_array`
/// functions at start (glibc does so in static and dynamic binaries alike; Rust's std
/// learns its arguments the same way). Kept for [`blank_command_line`].
static ARGC: AtomicUsize = AtomicUsize::new(0);
static ARGV: AtomicPtr<*const libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

#[used]
#[link_section = ".init_array"]
static CAPTURE_ARGS: extern "C" fn(
    libc::c_int,
    *const *const libc::c_char,
    *const *const libc::c_char,
) = capture_args;

extern "C" fn capture_args(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    ARGC.store(usize::try_from(argc).unwrap_or(0), Ordering::Relaxed);
    ARGV.store(argv.cast_mut(), Ordering::Relaxed);
}

/// Overwrites this process's command line, as every process that can see it reads it
/// in `/proc/PID/cmdline`, with `title` and zeros. A sandbox's init is a clone of the
/// CLI, and the sandbox can read its init's command line: the CLI's arguments (host
/// paths of binds, environment values, the daemon's options) are none of its business.
/// `prctl(PR_SET_MM)` would point the kernel elsewhere but needs CAP_SYS_RESOURCE in
/// the host's namespace, which root may lack (it does on brig's CI machines).
/// Call only in a process that no longer reads its arguments (std's `env::args` reads
/// these same bytes).
pub fn blank_command_line(title: &[u8]) {
    let (argc, argv) = (ARGC.load(Ordering::Relaxed), ARGV.load(Ordering::Relaxed));
    if argc == 0 || argv.is_null() {
        return;
    }
    // SAFETY: the C runtime passed `argv` with `argc` pointers to NUL-terminated
    // strings, which the kernel laid out back to back on the initial stack (the region
    // /proc/PID/cmdline reads). That memory stays mapped and writable for the life of
    // the process. The final NUL is kept, so the kernel reads the region as plain
    // arguments rather than a setproctitle()-style title spilling into the environment.
    unsafe {
        let first = (*argv).cast::<u8>().cast_mut();
        let last = *argv.add(argc - 1);
        let end = last.add(libc::strlen(last)).cast::<u8>().cast_mut();
        let Ok(len) = usize::try_from(end.offset_from(first)) else {
            return;
        };
        std::ptr::write_bytes(first, 0, len);
        let shown = title.len().min(len);
        std::ptr::copy_nonoverlapping(title.as_ptr(), first, shown);
    }
}

pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and runs no atexit handlers or destructors, which is
    // what a cloned child that must not touch the parent's state wants.
    unsafe { libc::_exit(code) }
}

/// User plus system CPU time of `who`, in microseconds (0 if unknown).
pub fn cpu_time_us(who: nix::sys::resource::UsageWho) -> u64 {
    match nix::sys::resource::getrusage(who) {
        Ok(usage) => {
            let us =
                |tv: nix::sys::time::TimeVal| tv.tv_sec() as u64 * 1_000_000 + tv.tv_usec() as u64;
            us(usage.user_time()) + us(usage.system_time())
        }
        Err(_) => 0,
    }
}
