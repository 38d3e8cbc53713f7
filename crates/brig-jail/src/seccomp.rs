//! The seccomp-bpf filter every sandboxed process runs under.
//!
//! The filter is a denylist on top of default-allow: the sandbox already runs in its own
//! user, mount, pid, network, ipc and uts namespaces without capabilities, so most dangerous
//! calls fail anyway. The filter removes the kernel attack surface that namespaces do not
//! cover (io_uring, bpf, userfaultfd, keyrings, ...) and the calls that would let a process
//! stack new namespaces or remount its view of the system.
//!
//! # What it does
//!
//! | syscalls | action |
//! |---|---|
//! | any syscall from a foreign ABI (i386 `int 0x80` on x86_64, arm32 on aarch64) | kill the process |
//! | x32 syscalls (x86_64: `nr & 0x4000_0000`) | kill the process |
//! | `clone3` | `ENOSYS`, so libc falls back to `clone`, whose flags the filter can read |
//! | `mincore`, `cachestat` | `ENOSYS`: they tell which pages of a file are cached, and other sandboxes share the cache (see `RESIDENCY_PROBES`) |
//! | `io_setup` | `ENOSYS`, as on a kernel without native AIO: its contexts count against one host-wide limit (`fs.aio-max-nr`, 65536 events), which one sandbox could take whole; programs fall back to threads |
//! | `socket`, `socketpair` with a family other than `AF_UNIX`, `AF_INET`, `AF_INET6` (netlink included: see `ALLOWED_FAMILIES`) | `EAFNOSUPPORT` |
//! | `clone` with a namespace flag (`CLONE_NEWNS`, `NEWUTS`, `NEWIPC`, `NEWUSER`, `NEWPID`, `NEWNET`, `NEWCGROUP`, `NEWTIME`) | `EPERM` |
//! | `ioctl` with `TIOCSTI` or `TIOCLINUX` | `EPERM` |
//! | `fcntl` with `F_OFD_GETLK`, `F_OFD_SETLK` or `F_OFD_SETLKW` | `EINVAL`, as on a kernel without open file description locks (see `DENIED_FCNTLS`) |
//! | `fadvise64` with `POSIX_FADV_DONTNEED` | success without effect (see `FADVISE_DONTNEED`) |
//! | `madvise` with `MADV_COLD` or `MADV_PAGEOUT` | success without effect (see `MADVISE_RECLAIM`) |
//! | `preadv2`, `pwritev2` with `RWF_NOWAIT` in the flags | `EOPNOTSUPP`, as for a file that does not support it (see `RWF_NOWAIT`) |
//! | `personality` with anything but 0, 8 (`PER_LINUX32`), 0x20000, 0x20008 or 0xffffffff (query) | `EPERM` |
//! | namespaces and mounts: `unshare`, `setns`, `mount`, `umount2`, `pivot_root`, `chroot`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `open_tree`, `move_mount`, `mount_setattr`, `open_by_handle_at`, `name_to_handle_at` | `EPERM` |
//! | kernel attack surface: `io_uring_setup`, `io_uring_enter`, `io_uring_register`, `userfaultfd`, `bpf`, `perf_event_open`, `keyctl`, `add_key`, `request_key`, `fanotify_init`, `lookup_dcookie`, `kcmp` | `EPERM` |
//! | the machine: `kexec_load`, `kexec_file_load`, `init_module`, `finit_module`, `delete_module`, `reboot`, `swapon`, `swapoff`, `acct`, `syslog`, `quotactl`, `quotactl_fd`, `vhangup`, `nfsservctl`, `sethostname`, `setdomainname` | `EPERM` |
//! | clocks: `settimeofday`, `clock_settime`, `clock_adjtime`, `adjtimex` | `EPERM` |
//! | NUMA policy: `get_mempolicy`, `set_mempolicy`, `set_mempolicy_home_node`, `mbind`, `move_pages`, `migrate_pages` | `EPERM` |
//! | `process_madvise`, even with `allow_ptrace` (it pages out like `madvise`) | `EPERM` |
//! | x86_64 only: `iopl`, `ioperm`, `create_module`, `query_module`, `get_kernel_syms`, `uselib`, `ustat`, `sysfs`, `_sysctl`, and the never-implemented `afs_syscall`, `getpmsg`, `putpmsg`, `security`, `tuxcall`, `vserver` | `EPERM` |
//! | unless `allow_ptrace`: `ptrace`, `process_vm_readv`, `process_vm_writev`, `pidfd_getfd` | `EPERM` |
//! | everything else | allow |
//!
//! This covers the syscalls Docker's default profile refuses to a container without added
//! capabilities, plus io_uring, `name_to_handle_at`, native AIO and the socket families.
//! Docker's profile is an allowlist, so it also refuses calls newer than it (`statmount`,
//! `listmount`, `lsm_*`, `mseal`, ...), which this denylist lets through: they read what
//! the sandbox can already see or act on its own memory. (`cachestat` is refused here too,
//! for what it tells of the shared page cache.) `adjtimex` and
//! `clock_adjtime` are denied outright: only their `modes` field tells a read from a write,
//! and it lives in user memory, which a seccomp filter cannot read.
//!
//! # Shape of the program
//!
//! ```text
//! ld arch; jeq AUDIT_ARCH, else -> kill           a foreign ABI is killed
//! ld nr; jset 0x40000000 -> (jeq -1, else -> kill)  so is x32 (x86_64), but for nr -1
//! jge 246                                         the search: a balanced tree of jge on
//!   jge 139                                       nr, each node's lower half right after
//!     jge 57                                      it, the upper half further on
//!       ...
//!         jeq 41 -> socket, else -> allow         leaves of at most two comparisons
//!         jeq 16 -> ioctl, else -> allow
//!     ...
//! ioctl: ld args[1]; jeq TIOCSTI -> eperm;        an argument check, written once
//!        jeq TIOCLINUX -> eperm, else -> allow
//! ...
//! eperm: ret ERRNO(EPERM)                         every action written once
//! allow: ret ALLOW
//! kill:  ret KILL_PROCESS
//! ```
//!
//! The syscall numbers are cut into ranges whose numbers all get the same verdict (allow,
//! an errno, or one of the argument checks), and a balanced binary search of `jge` on the
//! number finds the range: a dozen instructions at most from the start of the program to
//! any syscall's verdict on x86_64, where a linear chain took up to 171. The search halves
//! the ranges until a leaf can sort out the rest with at most two comparisons (a `jeq` for
//! a single number, two `jge` for a run), which is never longer than the tree it replaces.
//! Every `ret` and argument check is written once and jumped to, and the program comes to
//! 111 instructions, where seccompiler's took 464 (for fewer checks).
//!
//! Both numbers matter at start-up: when the filter is attached the kernel compiles it
//! (the cost grows with its length) and runs it once per syscall number to fill its action
//! cache (`seccomp_cache_prepare`, the cost grows with the path), and every call that the
//! cache cannot answer runs it again.
//!
//! The program is generated here rather than by seccompiler, which compiles a linear chain
//! of one comparison per syscall, gives a filter a single match action (this one needs
//! EPERM, ENOSYS, EINVAL, EAFNOSUPPORT, EOPNOTSUPP, success and kill) and knows nothing of
//! x32.
//!
//! Conditional jumps have 8-bit offsets. A jump to code more than 255 instructions on goes
//! to a copy of it written nearer (a `ret`) or to a `ja`, whose offset is 32-bit. Today's
//! program is shorter than that, but the generator does not rely on it.
//!
//! Only `clone`, `ioctl`, `fcntl`, `fadvise64`, `madvise`, `personality`, `socket`,
//! `socketpair`, `preadv2` and `pwritev2` look at arguments. For every other syscall the
//! result depends on the syscall number alone, and the search uses only instructions the
//! kernel's cache emulation understands (`ld` of nr and arch, `jeq`, `jge`, `jset`, `ja`,
//! `ret`), so the kernel's seccomp action cache (5.11+) allows it without running the
//! filter at all.

use std::collections::BTreeMap;
use std::io;

use brig_policy::{SeccompMode, SeccompPolicy};
use serde::Serialize;

use crate::JailError;

#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_endian = "little"
)))]
compile_error!("brig's seccomp filter is written for little-endian x86_64 and aarch64 only");

/// A compiled filter, built once before the sandbox starts (in the parent), installed in the child.
#[derive(Debug, Clone)]
pub struct SeccompProgram {
    filter: Vec<Insn>,
    pub summary: SeccompSummary,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeccompSummary {
    /// "x86_64" or "aarch64".
    pub arch: &'static str,
    /// Syscalls denied always or for some arguments.
    pub denied_syscalls: usize,
    pub allow_ptrace: bool,
    pub kills_foreign_arch: bool,
    pub kills_x32: bool,
    /// Length of the BPF program.
    pub instructions: usize,
    /// Calls answered with success without being run, because they would act on pages
    /// other sandboxes share.
    pub ignored_advice: &'static [&'static str],
}

#[cfg(target_arch = "x86_64")]
mod arch {
    pub const NAME: &str = "x86_64";
    /// AUDIT_ARCH_X86_64: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
    pub const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    /// x32 syscalls share AUDIT_ARCH_X86_64 and differ only by this bit in the number.
    pub const X32_SYSCALL_BIT: Option<u32> = Some(0x4000_0000);

    /// Syscalls that exist only in this ABI.
    pub const DENIED: &[i64] = &[
        libc::SYS_iopl,
        libc::SYS_ioperm,
        // create_module, get_kernel_syms, query_module: gone from the kernel since 2.6 and
        // from libc, but their numbers stay reserved.
        174,
        177,
        178,
        libc::SYS_uselib,
        libc::SYS_ustat,
        libc::SYS_sysfs,
        libc::SYS__sysctl,
        // Never implemented (ENOSYS); Docker denies them, so do we.
        libc::SYS_afs_syscall,
        libc::SYS_getpmsg,
        libc::SYS_putpmsg,
        libc::SYS_security,
        libc::SYS_tuxcall,
        libc::SYS_vserver,
    ];
}

#[cfg(target_arch = "aarch64")]
mod arch {
    pub const NAME: &str = "aarch64";
    /// AUDIT_ARCH_AARCH64: EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
    pub const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
    pub const X32_SYSCALL_BIT: Option<u32> = None;
    pub const DENIED: &[i64] = &[];
}

/// Denied with EPERM whatever the arguments.
const DENIED: &[i64] = &[
    // New namespaces or a changed view of the filesystem.
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    // File handles bypass path lookup, hence the mount namespace (the "shocker" escape).
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    // Large kernel attack surface, rarely needed by ordinary programs.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_userfaultfd,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    // Keyrings are not namespaced.
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_fanotify_init,
    libc::SYS_lookup_dcookie,
    libc::SYS_kcmp,
    // The machine itself.
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_vhangup,
    libc::SYS_nfsservctl,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    // Clocks are global; adjtimex's read-only form cannot be told apart (see module doc).
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    // NUMA placement is a host resource.
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_mbind,
    libc::SYS_move_pages,
    libc::SYS_migrate_pages,
    // It takes MADV_COLD and MADV_PAGEOUT for the caller's own memory, as madvise does (see
    // MADVISE_RECLAIM), or for another process's. No debugger needs it and programs advise
    // their own memory with madvise, so it is refused whatever the advice, with
    // allow_ptrace too.
    libc::SYS_process_madvise,
];

/// Reading or writing another process's memory; denied unless the policy allows ptrace.
const PTRACE: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
];

/// Namespace flags refused in clone(). CLONE_NEWTIME shares its bit with the exit signal
/// byte of clone() and only works through clone3, but a set 0x80 bit is never a valid
/// signal either, so refusing it costs nothing.
const CLONE_NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWTIME,
];

/// personality() values Docker allows: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32
/// and 0xffffffff, which only queries.
const ALLOWED_PERSONALITIES: &[u32] = &[0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Socket families a sandboxed program may create. AF_VSOCK above all stays out: a network
/// namespace does not isolate it, so it reaches the host and its other guests.
/// AF_NETLINK stays out too: the messages queued on a netlink socket are charged to no
/// memory cgroup, v1 or v2. Unread replies took 170 KB per socket at the default buffer
/// size (3.1 GB from a 64 MiB sandbox with raised buffers), against 2.7 KB charged, so a
/// sandbox could take the host's memory 60 times over its limit. Without it, listing
/// network interfaces (`getifaddrs`, `ip addr`) fails, of which a sandbox has only `lo`;
/// name resolution does not need it (glibc's `AI_ADDRCONFIG` then assumes IPv4 and IPv6).
const ALLOWED_FAMILIES: &[libc::c_int] = &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6];

/// TIOCSTI pushes input into a terminal the sandbox shares with someone else; TIOCLINUX
/// can do the same on a virtual console.
const DENIED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// Locks on an open file description. Record locks are kernel memory charged to no cgroup
/// (Linux 6.8 took their accounting out again), so brig bounds how many a sandbox holds by
/// counting them per process (`crate::locks`). A POSIX lock belongs to a process's table of
/// descriptors, where that count finds it; an OFD lock belongs to the open file, which can
/// outlive every descriptor of the sandbox while it travels in a unix socket's queue, held
/// by no process. Refused with EINVAL, as on kernels before 3.15: the programs that use them
/// (QEMU, Samba) probe with `F_OFD_GETLK` and fall back to POSIX locks; SQLite and the
/// usual `lockf`/`fcntl` callers never asked for them.
const DENIED_FCNTLS: &[u32] = &[
    libc::F_OFD_GETLK as u32,
    libc::F_OFD_SETLK as u32,
    libc::F_OFD_SETLKW as u32,
];

/// `posix_fadvise(POSIX_FADV_DONTNEED)` drops clean pages of a file from the page cache,
/// whoever else uses them and whatever cgroup pays for them: from a sandbox it evicted the
/// host's Python, shared by every other sandbox, and made their starts 2.8x slower. It is
/// answered with success and not done: the advice is a hint a kernel may ignore, and the
/// sandbox's own cached pages are reclaimed under its memory limit anyway. (`madvise`'s
/// `MADV_PAGEOUT` and `MADV_COLD` do the same to files a sandbox owns: see
/// `MADVISE_RECLAIM`.)
const FADVISE_DONTNEED: u32 = libc::POSIX_FADV_DONTNEED as u32;

/// `madvise` advice that reclaims (`MADV_PAGEOUT`) or deactivates (`MADV_COLD`) the pages
/// of a mapping, file pages included when the caller owns the file or could open it for
/// writing. An image's layers are mounted once and idmapped to each sandbox's uid, so every
/// sandbox owns every image file: one sandbox evicted 5,852 of 6,204 cached pages of a
/// numpy library every other sandbox maps, the slowdown `FADVISE_DONTNEED` is refused for.
/// Answered with success and not done, like that advice: a hint the kernel may ignore.
const MADVISE_RECLAIM: &[u32] = &[libc::MADV_COLD as u32, libc::MADV_PAGEOUT as u32];

/// What the filter answers with success without running the call (the summary lists them).
const IGNORED_ADVICE: &[&str] = &[
    "fadvise64(POSIX_FADV_DONTNEED)",
    "madvise(MADV_COLD)",
    "madvise(MADV_PAGEOUT)",
];

/// `preadv2`'s and `pwritev2`'s flag that fails with EAGAIN instead of waiting for a page
/// that is not cached: one call tells whether someone read that page of a shared file
/// lately. Refused with EOPNOTSUPP, what the kernel answers for a file that cannot do it,
/// so callers take their blocking path (glibc's emulation on old kernels says the same);
/// other flags pass. Every 64-bit ABI passes the flags sixth, after the offset's two halves.
const RWF_NOWAIT: u32 = libc::RWF_NOWAIT as u32;

/// cachestat's number, the same on x86_64 and aarch64 (libc does not have it for glibc yet).
const SYS_CACHESTAT: i64 = 451;

/// Calls whose whole purpose is to tell which pages of a file are in the page cache:
/// `mincore` (of a mapping) and `cachestat` (of a file). The kernel answers for files the
/// caller owns or could write, which in an image sandbox is every shared layer file: one
/// sandbox could watch what the others read. Refused with ENOSYS, what a kernel without
/// them answers: libunwind, the common user of `mincore` (to check addresses while
/// unwinding), falls back to `msync` on any error, and `cachestat` is new (6.5), so its
/// callers expect ENOSYS.
const RESIDENCY_PROBES: &[i64] = &[libc::SYS_mincore, SYS_CACHESTAT];

/// Builds the filter for `policy`; `None` when seccomp is off.
pub fn build(policy: &SeccompPolicy) -> Result<Option<SeccompProgram>, JailError> {
    if policy.mode == SeccompMode::Off {
        return Ok(None);
    }
    let verdicts = verdicts(policy.allow_ptrace)?;
    let filter = program(&ranges(&verdicts));
    if filter.len() > BPF_MAXINSNS {
        return Err(JailError::Seccomp(format!(
            "the filter has {} instructions, more than the kernel's limit of {BPF_MAXINSNS}",
            filter.len()
        )));
    }

    let summary = SeccompSummary {
        arch: arch::NAME,
        // Every syscall with a verdict of its own is denied always or for some arguments.
        denied_syscalls: verdicts.len(),
        allow_ptrace: policy.allow_ptrace,
        kills_foreign_arch: true,
        kills_x32: arch::X32_SYSCALL_BIT.is_some(),
        instructions: filter.len(),
        ignored_advice: IGNORED_ADVICE,
    };
    tracing::debug!(?summary, "seccomp filter built");
    Ok(Some(SeccompProgram { filter, summary }))
}

impl SeccompProgram {
    /// Installs the filter on the calling thread. The caller has already set no_new_privs.
    ///
    /// Safe to call in a freshly forked child of a multi-threaded process: it allocates
    /// nothing unless the kernel refuses the filter.
    pub fn install(&self) -> Result<(), JailError> {
        self.apply().map_err(|err| {
            let hint = match err.raw_os_error() {
                Some(libc::EACCES) => " (set no_new_privs first)",
                Some(libc::EINVAL) => " (does this kernel support seccomp filters?)",
                _ => "",
            };
            JailError::Seccomp(format!("the kernel refused the filter: {err}{hint}"))
        })
    }

    fn apply(&self) -> io::Result<()> {
        let prog = libc::sock_fprog {
            // build() keeps the length within BPF_MAXINSNS, far below u16::MAX.
            len: self.filter.len() as libc::c_ushort,
            // The kernel only reads through this pointer; the layouts match (checked below).
            filter: self.filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points to `self.filter`, which outlives the call; the kernel copies
        // the program before returning and never writes to it.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0 as libc::c_ulong,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// One classic BPF instruction, laid out as the kernel's `struct sock_filter` (libc's lacks
/// `PartialEq`, which the tests want).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

// Handed to the kernel as libc's sock_filter.
const _: () = {
    assert!(std::mem::size_of::<Insn>() == std::mem::size_of::<libc::sock_filter>());
    assert!(std::mem::align_of::<Insn>() == std::mem::align_of::<libc::sock_filter>());
    assert!(std::mem::offset_of!(Insn, jt) == std::mem::offset_of!(libc::sock_filter, jt));
    assert!(std::mem::offset_of!(Insn, jf) == std::mem::offset_of!(libc::sock_filter, jf));
    assert!(std::mem::offset_of!(Insn, k) == std::mem::offset_of!(libc::sock_filter, k));
};

/// The kernel's limit on the length of a classic BPF program.
const BPF_MAXINSNS: usize = 4096;

/// What the filter does with one syscall number (of the native ABI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    /// Fail with this errno whatever the arguments.
    Errno(libc::c_int),
    /// Decide on the arguments.
    Check(Check),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// EPERM if the flags (arg 0) ask for a new namespace.
    CloneFlags,
    /// EPERM for the terminal-injection requests (arg 1).
    IoctlRequest,
    /// EINVAL for the open file description locks (the command, arg 1).
    FcntlCmd,
    /// Success without the call for `POSIX_FADV_DONTNEED` (the advice, arg 3).
    FadviseAdvice,
    /// Success without the call for `MADV_COLD` and `MADV_PAGEOUT` (the advice, arg 2).
    MadviseAdvice,
    /// EOPNOTSUPP if the flags (arg 5) have `RWF_NOWAIT`.
    RwFlags,
    /// EPERM unless arg 0 is one of Docker's personalities.
    Personality,
    /// EAFNOSUPPORT unless the domain (arg 0) is an allowed family.
    SocketFamily,
}

/// The verdict of every syscall that is not simply allowed.
fn verdicts(allow_ptrace: bool) -> Result<BTreeMap<u32, Verdict>, JailError> {
    let unconditional =
        DENIED
            .iter()
            .chain(arch::DENIED)
            .chain(if allow_ptrace { &[][..] } else { PTRACE });
    let special = [
        // ENOSYS, so that libc falls back to clone, whose flags the filter can read.
        (libc::SYS_clone3, Verdict::Errno(libc::ENOSYS)),
        // ENOSYS, as without native AIO: see the table above.
        (libc::SYS_io_setup, Verdict::Errno(libc::ENOSYS)),
        // clone(flags, ...) takes the flags first on both architectures (s390 is the odd one).
        (libc::SYS_clone, Verdict::Check(Check::CloneFlags)),
        (libc::SYS_ioctl, Verdict::Check(Check::IoctlRequest)),
        (libc::SYS_fcntl, Verdict::Check(Check::FcntlCmd)),
        (libc::SYS_fadvise64, Verdict::Check(Check::FadviseAdvice)),
        (libc::SYS_madvise, Verdict::Check(Check::MadviseAdvice)),
        (libc::SYS_preadv2, Verdict::Check(Check::RwFlags)),
        (libc::SYS_pwritev2, Verdict::Check(Check::RwFlags)),
        (libc::SYS_personality, Verdict::Check(Check::Personality)),
        (libc::SYS_socket, Verdict::Check(Check::SocketFamily)),
        (libc::SYS_socketpair, Verdict::Check(Check::SocketFamily)),
    ];
    let mut verdicts = BTreeMap::new();
    for (nr, verdict) in unconditional
        .map(|&nr| (nr, Verdict::Errno(libc::EPERM)))
        .chain(special)
        .chain(
            RESIDENCY_PROBES
                .iter()
                .map(|&nr| (nr, Verdict::Errno(libc::ENOSYS))),
        )
    {
        let key = u32::try_from(nr)
            .ok()
            .filter(|&key| key < SYSCALL_NUMBERS_END)
            .ok_or_else(|| bug(format!("syscall number {nr} out of range")))?;
        if verdicts.insert(key, verdict).is_some() {
            return Err(bug(format!("syscall {nr} is listed twice")));
        }
    }
    Ok(verdicts)
}

/// Native syscall numbers stay below this (x86_64 and aarch64 are in the 400s); anything
/// higher is allowed, which the kernel answers with ENOSYS (x32 is killed before the search).
const SYSCALL_NUMBERS_END: u32 = 0x1000;

fn bug(what: String) -> JailError {
    JailError::Seccomp(format!("cannot compile the filter (a bug in brig): {what}"))
}

/// A range of syscall numbers with one verdict: from `start` up to the next range's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    start: u32,
    verdict: Verdict,
}

/// Cuts the whole u32 space of syscall numbers into ranges, merging neighbours with the
/// same verdict. The first range starts at 0; the last runs to u32::MAX and allows.
fn ranges(verdicts: &BTreeMap<u32, Verdict>) -> Vec<Range> {
    let mut ranges: Vec<Range> = Vec::new();
    let mut push = |start: u32, verdict: Verdict| {
        if ranges.last().map(|r| r.verdict) != Some(verdict) {
            ranges.push(Range { start, verdict });
        }
    };
    let mut next = 0;
    for (&nr, &verdict) in verdicts {
        if nr > next {
            push(next, Verdict::Allow);
        }
        push(nr, verdict);
        next = nr + 1;
    }
    push(next, Verdict::Allow);
    ranges
}

// Classic BPF opcodes (linux/filter.h): BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ | BPF_K, ...
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JA: u16 = 0x05;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
const BPF_RET_K: u16 = 0x06;

// Offsets in struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }. Both supported
// architectures are little-endian, so an argument's low half comes first.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// The offset of argument `n`'s low half. The kernel reads clone's flags, ioctl's request,
/// fcntl's command, fadvise's and madvise's advice, personality's argument, socket's domain
/// and preadv2's flags as 32-bit ints, so only the low half is compared: a value with junk
/// in the high half must not slip past a 64-bit comparison.
const fn data_arg_low(n: u32) -> u32 {
    16 + 8 * n
}

fn stmt(code: u16, k: u32) -> Insn {
    Insn {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code, jt, jf, k }
}

fn ret(action: u32) -> Insn {
    stmt(BPF_RET_K, action)
}

fn errno(e: libc::c_int) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// The whole program for `ranges`: the arch and x32 checks, then the search.
fn program(ranges: &[Range]) -> Vec<Insn> {
    let mut asm = Assembler::default();
    // Written first, so that it ends the program, out of the way of the search.
    asm.ret(libc::SECCOMP_RET_KILL_PROCESS);
    let search = asm.search(ranges, None);
    let entry = asm.prologue(search);
    asm.finish(entry)
}

/// Most comparisons a leaf of the search makes in a row before it gives up and splits its
/// ranges in two: a short chain costs fewer instructions than the nodes that would split it,
/// and no longer a path.
const CHAIN_MAX: usize = 2;

/// Writes a program from its end backwards, so that whatever a jump may land on is already
/// in place when the jump is written: code the program needs in many places (a `ret`, an
/// argument check) is written once and jumped to from everywhere.
///
/// `code` holds the instructions in reverse order, and a position is an index into it. An
/// instruction written now, at position `code.len()`, reaches position `t` with the offset
/// `code.len() - 1 - t`. Every method returns the position where the code it wrote starts.
#[derive(Default)]
struct Assembler {
    code: Vec<Insn>,
    /// Where a `ret` of each action already stands.
    rets: Vec<(u32, usize)>,
    /// Where the code of each argument check already starts.
    checks: Vec<(Check, usize)>,
}

impl Assembler {
    /// The arch and x32 checks, going on to `search` with the syscall number loaded.
    fn prologue(&mut self, search: usize) -> usize {
        let kill = self.ret(libc::SECCOMP_RET_KILL_PROCESS);
        let mut next = search;
        if let Some(x32_bit) = arch::X32_SYSCALL_BIT {
            // nr -1 means "no syscall": a tracer skipping a call sets it, and seccomp sees it
            // after the tracer. The kernel answers ENOSYS; there is nothing to kill for.
            let minus_one = self.jump(BPF_JMP_JEQ_K, u32::MAX, search, kill);
            next = self.jump(BPF_JMP_JSET_K, x32_bit, minus_one, search);
        }
        let load_nr = self.load_then(DATA_NR, next);
        self.jump(BPF_JMP_JEQ_K, arch::AUDIT_ARCH, load_nr, kill);
        self.load(DATA_ARCH)
    }

    /// Finds the range of the number in the accumulator, `ranges` (sorted) covering the
    /// numbers from `ranges[0].start` up to `end` (exclusive; `None`: all the rest).
    ///
    /// A balanced binary search: each node sends the numbers below its pivot to the lower
    /// half of the ranges, the others to the upper half, until a leaf can sort its ranges
    /// out in at most CHAIN_MAX comparisons.
    fn search(&mut self, ranges: &[Range], end: Option<u32>) -> usize {
        if let Some(background) = chain_background(ranges, end) {
            return self.chain(ranges, end, background);
        }
        let (low, high) = ranges.split_at(ranges.len() / 2);
        let pivot = high[0].start;
        let high = self.search(high, end);
        // Written last, so that a node's lower half usually starts right after it.
        let low = self.search(low, Some(pivot));
        self.jump(BPF_JMP_JGE_K, pivot, high, low)
    }

    /// A leaf of the search: tests the ranges that are not `background`, highest first.
    fn chain(&mut self, ranges: &[Range], end: Option<u32>, background: Verdict) -> usize {
        let fallback = self.verdict(background);
        let mut next = fallback;
        for link in chain(ranges, end, background) {
            next = match link {
                Link::Is(nr, verdict) => {
                    let verdict = self.verdict(verdict);
                    self.jump(BPF_JMP_JEQ_K, nr, verdict, next)
                }
                Link::From(nr, verdict) => {
                    let verdict = self.verdict(verdict);
                    self.jump(BPF_JMP_JGE_K, nr, verdict, next)
                }
                Link::Rest(verdict) => self.verdict(verdict),
                Link::Above(nr) => self.jump(BPF_JMP_JGE_K, nr, fallback, next),
            };
        }
        next
    }

    /// The code for one verdict, to run with the syscall number in the accumulator.
    fn verdict(&mut self, verdict: Verdict) -> usize {
        match verdict {
            Verdict::Allow => self.ret(libc::SECCOMP_RET_ALLOW),
            Verdict::Errno(e) => self.ret(errno(e)),
            Verdict::Check(check) => match self.checks.iter().find(|(c, _)| *c == check) {
                Some(&(_, at)) => at,
                None => {
                    let at = self.check(check);
                    self.checks.push((check, at));
                    at
                }
            },
        }
    }

    fn check(&mut self, check: Check) -> usize {
        let allow = libc::SECCOMP_RET_ALLOW;
        let eperm = errno(libc::EPERM);
        match check {
            Check::CloneFlags => {
                // Each flag is a single bit (checked in the tests), so "any flag set" is one
                // jset.
                let flags = CLONE_NAMESPACE_FLAGS
                    .iter()
                    .fold(0, |all, &flag| all | flag as u32);
                let (deny, pass) = (self.ret(eperm), self.ret(allow));
                self.jump(BPF_JMP_JSET_K, flags, deny, pass);
                self.load(data_arg_low(0))
            }
            Check::IoctlRequest => self.one_of(1, DENIED_IOCTLS.iter().copied(), eperm, allow),
            Check::FcntlCmd => {
                self.one_of(1, DENIED_FCNTLS.iter().copied(), errno(libc::EINVAL), allow)
            }
            // An errno of 0 returns 0 without running the call.
            Check::FadviseAdvice => self.one_of(3, [FADVISE_DONTNEED].into_iter(), errno(0), allow),
            Check::MadviseAdvice => {
                self.one_of(2, MADVISE_RECLAIM.iter().copied(), errno(0), allow)
            }
            Check::RwFlags => {
                let (refuse, pass) = (self.ret(errno(libc::EOPNOTSUPP)), self.ret(allow));
                self.jump(BPF_JMP_JSET_K, RWF_NOWAIT, refuse, pass);
                self.load(data_arg_low(5))
            }
            Check::Personality => {
                self.one_of(0, ALLOWED_PERSONALITIES.iter().copied(), allow, eperm)
            }
            Check::SocketFamily => self.one_of(
                0,
                ALLOWED_FAMILIES.iter().map(|&family| family as u32),
                allow,
                errno(libc::EAFNOSUPPORT),
            ),
        }
    }

    /// Loads the low half of argument `arg` and returns `matched` if it equals one of
    /// `values`, `otherwise` if not.
    fn one_of(
        &mut self,
        arg: u32,
        values: impl DoubleEndedIterator<Item = u32>,
        matched: u32,
        otherwise: u32,
    ) -> usize {
        let matched = self.ret(matched);
        let mut next = self.ret(otherwise);
        for value in values.rev() {
            next = self.jump(BPF_JMP_JEQ_K, value, matched, next);
        }
        self.load(data_arg_low(arg))
    }

    fn load(&mut self, offset: u32) -> usize {
        self.push(stmt(BPF_LD_W_ABS, offset))
    }

    /// A load that goes on to `next`, which need not be the code written last.
    fn load_then(&mut self, offset: u32, next: usize) -> usize {
        if next != self.code.len() - 1 {
            let distance = self.code.len() - 1 - next;
            self.push(stmt(BPF_JMP_JA, distance as u32));
        }
        self.load(offset)
    }

    fn ret(&mut self, action: u32) -> usize {
        match self.rets.iter().find(|(a, _)| *a == action) {
            Some(&(_, at)) => at,
            None => {
                let at = self.push(ret(action));
                self.rets.push((action, at));
                at
            }
        }
    }

    /// A conditional jump to `jt` or `jf`.
    fn jump(&mut self, code: u16, k: u32, jt: usize, jf: usize) -> usize {
        let jt = self.reach(jt);
        let jf = self.reach(jf);
        let at = self.code.len();
        let offset = |target: usize| u8::try_from(at - 1 - target).expect("reach() keeps it short");
        self.push(jump(code, k, offset(jt), offset(jf)))
    }

    /// A position holding the same code as `target`, close enough for a conditional jump
    /// written after one more instruction. Jump offsets have 8 bits: a `ret` too far away is
    /// written again, other code is reached through a `ja`, whose offset is 32-bit.
    fn reach(&mut self, target: usize) -> usize {
        let distance = self.code.len() - 1 - target;
        if distance < usize::from(u8::MAX) {
            return target;
        }
        let insn = self.code[target];
        let near = if insn.code == BPF_RET_K {
            self.push(insn)
        } else {
            self.push(stmt(BPF_JMP_JA, distance as u32))
        };
        // Later jumps to the same code go to the nearer copy.
        let moved = self.rets.iter_mut().map(|(_, at)| at);
        for at in moved.chain(self.checks.iter_mut().map(|(_, at)| at)) {
            if *at == target {
                *at = near;
            }
        }
        near
    }

    fn push(&mut self, insn: Insn) -> usize {
        self.code.push(insn);
        self.code.len() - 1
    }

    /// The program in running order; it starts with the code written last.
    fn finish(mut self, entry: usize) -> Vec<Insn> {
        debug_assert_eq!(
            entry,
            self.code.len() - 1,
            "the program starts at its entry"
        );
        self.code.reverse();
        self.code
    }
}

/// One step of a leaf of the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// nr == this number (a range of one): that verdict.
    Is(u32, Verdict),
    /// nr >= this number: that verdict.
    From(u32, Verdict),
    /// No test: the lowest range of the leaf, nr cannot be below it.
    Rest(Verdict),
    /// nr >= this number: the leaf's background (the ranges above are tested already).
    Above(u32),
}

/// The steps of a leaf over `ranges` (up to `end`, exclusive; `None`: all the rest) that
/// falls back on `background`, lowest first. They run in the opposite order, so that when
/// a range is tested, nr is in none of the ranges above it. A comparison the bounds of the
/// leaf make certain is left out.
fn chain(ranges: &[Range], end: Option<u32>, background: Verdict) -> Vec<Link> {
    let start = ranges[0].start;
    let mut links = Vec::new();
    for (i, range) in ranges.iter().enumerate() {
        if range.verdict == background {
            continue;
        }
        let after = ranges.get(i + 1).map(|r| r.start).or(end);
        if range.start == start {
            links.push(Link::Rest(range.verdict));
        } else if after == Some(range.start + 1) {
            links.push(Link::Is(range.start, range.verdict));
            continue;
        } else {
            links.push(Link::From(range.start, range.verdict));
        }
        if let Some(after) = after.filter(|&after| Some(after) != end) {
            links.push(Link::Above(after));
        }
    }
    links
}

/// The background for a leaf over `ranges` (up to `end`) that makes at most CHAIN_MAX
/// comparisons, if there is one: the one that makes the fewest.
fn chain_background(ranges: &[Range], end: Option<u32>) -> Option<Verdict> {
    // Neighbouring ranges differ, so at most every other range is background, and every
    // other range but the lowest costs a comparison.
    if ranges.len() > 2 * CHAIN_MAX + 3 {
        return None;
    }
    let comparisons = |background| {
        chain(ranges, end, background)
            .iter()
            .filter(|link| !matches!(link, Link::Rest(_)))
            .count()
    };
    ranges
        .iter()
        .map(|range| (comparisons(range.verdict), range.verdict))
        .min_by_key(|&(comparisons, _)| comparisons)
        .filter(|&(comparisons, _)| comparisons <= CHAIN_MAX)
        .map(|(_, background)| background)
}

#[cfg(test)]
mod tests {
    /// The flags glibc's pthread_create passes to clone: must stay allowed.
    const THREAD_CLONE_FLAGS: u64 = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_CLEARTID) as u64;

    use super::*;

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    fn errno(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | e as u32
    }

    fn program(allow_ptrace: bool) -> SeccompProgram {
        build(&SeccompPolicy {
            mode: SeccompMode::Default,
            allow_ptrace,
        })
        .unwrap()
        .unwrap()
    }

    /// A classic BPF interpreter for the instructions seccomp filters use. With `args` set to
    /// `None` it stops at the first argument load, as the kernel does when it decides whether
    /// a syscall's result can be cached: `Some(action)` then means "constant for this nr".
    /// Also returns how many instructions ran.
    fn exec(filter: &[Insn], arch: u32, nr: u32, args: Option<[u64; 6]>) -> (Option<u32>, usize) {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        let mut steps = 0;
        loop {
            let insn = filter.get(pc).expect("the program jumps out of itself");
            pc += 1;
            steps += 1;
            match insn.code {
                BPF_LD_W_ABS => {
                    acc = match insn.k {
                        DATA_NR => nr,
                        DATA_ARCH => arch,
                        k if (16..64).contains(&k) && k % 4 == 0 => {
                            let Some(args) = args else {
                                return (None, steps);
                            };
                            let arg = args[(k as usize - 16) / 8];
                            if k % 8 == 0 {
                                arg as u32
                            } else {
                                (arg >> 32) as u32
                            }
                        }
                        k => panic!("load from unexpected offset {k}"),
                    }
                }
                0x54 => acc &= insn.k, // BPF_ALU | BPF_AND | BPF_K
                BPF_JMP_JA => pc += insn.k as usize, // BPF_JMP | BPF_JA
                code if code & 0x07 == 0x05 => {
                    let taken = match code & 0xf0 {
                        0x10 => acc == insn.k,
                        0x20 => acc > insn.k,
                        0x30 => acc >= insn.k,
                        0x40 => acc & insn.k != 0,
                        op => panic!("unexpected jump op {op:#x}"),
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                BPF_RET_K => return (Some(insn.k), steps),
                code => panic!("unexpected BPF instruction {code:#x}"),
            }
        }
    }

    fn run(filter: &[Insn], arch: u32, nr: i64, args: Option<[u64; 6]>) -> Option<u32> {
        exec(filter, arch, nr as u32, args).0
    }

    fn call(p: &SeccompProgram, nr: i64, args: [u64; 6]) -> u32 {
        run(&p.filter, arch::AUDIT_ARCH, nr, Some(args)).unwrap()
    }

    fn call0(p: &SeccompProgram, nr: i64) -> u32 {
        call(p, nr, [0; 6])
    }

    fn arg0(p: &SeccompProgram, nr: i64, arg: u64) -> u32 {
        call(p, nr, [arg, 0, 0, 0, 0, 0])
    }

    #[test]
    fn off_mode_builds_nothing() {
        let policy = SeccompPolicy {
            mode: SeccompMode::Off,
            allow_ptrace: false,
        };
        assert!(build(&policy).unwrap().is_none());
    }

    #[test]
    fn default_policy_builds_and_summary_is_right() {
        let p = build(&SeccompPolicy::default()).unwrap().unwrap();
        let s = &p.summary;
        assert_eq!(s.arch, std::env::consts::ARCH);
        assert!(!s.allow_ptrace);
        assert!(s.kills_foreign_arch);
        assert_eq!(s.kills_x32, cfg!(target_arch = "x86_64"));
        assert_eq!(s.instructions, p.filter.len());
        assert!(s.instructions < BPF_MAXINSNS);
        // Unconditional, ptrace group, clone/ioctl/personality,
        // clone3/io_setup/socket/socketpair, fcntl/fadvise64, madvise/preadv2/pwritev2, and
        // the residency probes.
        let expected = DENIED.len()
            + arch::DENIED.len()
            + PTRACE.len()
            + 3
            + 4
            + 2
            + 3
            + RESIDENCY_PROBES.len();
        assert_eq!(s.denied_syscalls, expected);
        assert_eq!(
            s.ignored_advice,
            [
                "fadvise64(POSIX_FADV_DONTNEED)",
                "madvise(MADV_COLD)",
                "madvise(MADV_PAGEOUT)"
            ]
        );
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["arch"], std::env::consts::ARCH);
    }

    #[test]
    fn allow_ptrace_changes_the_program() {
        let strict = program(false);
        let lenient = program(true);
        assert_ne!(strict.filter, lenient.filter);
        assert!(lenient.summary.allow_ptrace);
        assert_eq!(
            strict.summary.denied_syscalls - lenient.summary.denied_syscalls,
            PTRACE.len()
        );
        for &nr in PTRACE {
            assert_eq!(call0(&strict, nr), errno(libc::EPERM), "nr {nr}");
            assert_eq!(call0(&lenient, nr), ALLOW, "nr {nr}");
        }
        // kcmp stays denied: it is not needed to trace. process_madvise too: it pages out.
        assert_eq!(call0(&lenient, libc::SYS_kcmp), errno(libc::EPERM));
        assert_eq!(
            call0(&lenient, libc::SYS_process_madvise),
            errno(libc::EPERM)
        );
        assert_eq!(call0(&lenient, libc::SYS_mount), errno(libc::EPERM));
    }

    #[test]
    fn no_duplicates_in_the_lists() {
        let mut all: Vec<i64> = DENIED
            .iter()
            .chain(arch::DENIED)
            .chain(PTRACE)
            .copied()
            .collect();
        all.extend([
            libc::SYS_clone,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_clone3,
            libc::SYS_io_setup,
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_fcntl,
            libc::SYS_fadvise64,
            libc::SYS_madvise,
            libc::SYS_preadv2,
            libc::SYS_pwritev2,
        ]);
        all.extend(RESIDENCY_PROBES);
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
    }

    #[test]
    fn foreign_arch_and_x32_are_killed() {
        let p = program(false);
        // AUDIT_ARCH_I386 and AUDIT_ARCH_ARM.
        for foreign in [0x4000_0003, 0x4000_0028] {
            assert_eq!(run(&p.filter, foreign, 20, Some([0; 6])), Some(KILL));
        }
        if let Some(bit) = arch::X32_SYSCALL_BIT {
            let x32_getpid = i64::from(bit) | 39;
            assert_eq!(call0(&p, x32_getpid), KILL);
            // x32's own numbers above 512 too.
            assert_eq!(call0(&p, i64::from(bit) | 520), KILL);
            // -1 ("no syscall") is not x32.
            assert_eq!(call0(&p, -1), ALLOW);
        }
    }

    #[test]
    fn clone3_is_enosys_and_denied_syscalls_are_eperm() {
        let p = program(false);
        assert_eq!(call0(&p, libc::SYS_clone3), errno(libc::ENOSYS));
        assert_eq!(call0(&p, libc::SYS_io_setup), errno(libc::ENOSYS));
        for &nr in RESIDENCY_PROBES {
            assert_eq!(call0(&p, nr), errno(libc::ENOSYS), "nr {nr}");
        }
        for &nr in DENIED.iter().chain(arch::DENIED) {
            assert_eq!(call0(&p, nr), errno(libc::EPERM), "nr {nr}");
            assert_eq!(call(&p, nr, [u64::MAX; 6]), errno(libc::EPERM), "nr {nr}");
        }
    }

    #[test]
    fn common_syscalls_are_allowed() {
        let p = program(false);
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_close,
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_execve,
            libc::SYS_wait4,
            libc::SYS_futex,
            libc::SYS_getpid,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_prctl,
            libc::SYS_seccomp,
            libc::SYS_landlock_create_ruleset,
            libc::SYS_memfd_create,
            libc::SYS_exit_group,
        ] {
            assert_eq!(call0(&p, nr), ALLOW, "nr {nr}");
        }
    }

    #[test]
    fn clone_with_namespace_flags_is_denied() {
        let p = program(false);
        let sigchld = libc::SIGCHLD as u64;
        for &flag in CLONE_NAMESPACE_FLAGS {
            let flags = flag as u64 | sigchld;
            assert_eq!(
                arg0(&p, libc::SYS_clone, flags),
                errno(libc::EPERM),
                "{flag:#x}"
            );
        }
        let thread = THREAD_CLONE_FLAGS;
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID) as u64 | sigchld;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | sigchld;
        for flags in [sigchld, thread, fork, vfork] {
            assert_eq!(arg0(&p, libc::SYS_clone, flags), ALLOW, "{flags:#x}");
        }
        // The kernel ignores the high half of clone()'s flags, and so does the filter.
        let high = (libc::CLONE_NEWUSER as u64) << 32 | sigchld;
        assert_eq!(arg0(&p, libc::SYS_clone, high), ALLOW);
    }

    #[test]
    fn terminal_injection_ioctls_are_denied() {
        let p = program(false);
        let ioctl = |request: u64| call(&p, libc::SYS_ioctl, [0, request, 0, 0, 0, 0]);
        let allowed = [libc::TCGETS, libc::FIONREAD, libc::TIOCGWINSZ];
        assert_eq!(ioctl(0x5412), errno(libc::EPERM));
        assert_eq!(ioctl(0x541C), errno(libc::EPERM));
        // The kernel truncates the request to an int: junk in the high half is still TIOCSTI.
        assert_eq!(ioctl(0xdead_beef_0000_5412), errno(libc::EPERM));
        for request in allowed {
            assert_eq!(ioctl(u64::from(request as u32)), ALLOW, "{request:#x}");
        }
    }

    #[test]
    fn open_file_description_locks_are_einval_and_posix_locks_pass() {
        let p = program(false);
        let fcntl = |cmd: u64| call(&p, libc::SYS_fcntl, [3, cmd, 0, 0, 0, 0]);
        for cmd in [libc::F_OFD_GETLK, libc::F_OFD_SETLK, libc::F_OFD_SETLKW] {
            assert_eq!(fcntl(cmd as u64), errno(libc::EINVAL), "{cmd}");
            // The command is an unsigned int: junk in the high half changes nothing.
            assert_eq!(fcntl(1 << 32 | cmd as u64), errno(libc::EINVAL), "{cmd}");
        }
        for cmd in [
            libc::F_GETFD,
            libc::F_SETFD,
            libc::F_GETFL,
            libc::F_SETFL,
            libc::F_GETLK,
            libc::F_SETLK,
            libc::F_SETLKW,
            libc::F_DUPFD_CLOEXEC,
        ] {
            assert_eq!(fcntl(cmd as u64), ALLOW, "{cmd}");
        }
    }

    #[test]
    fn fadvise_dontneed_succeeds_without_running() {
        let p = program(false);
        let fadvise = |advice: u64| call(&p, libc::SYS_fadvise64, [3, 0, 0, advice, 0, 0]);
        // SECCOMP_RET_ERRNO with 0: the call returns 0 and the kernel never sees it.
        assert_eq!(
            fadvise(libc::POSIX_FADV_DONTNEED as u64),
            libc::SECCOMP_RET_ERRNO
        );
        assert_eq!(
            fadvise(1 << 32 | libc::POSIX_FADV_DONTNEED as u64),
            libc::SECCOMP_RET_ERRNO
        );
        for advice in [
            libc::POSIX_FADV_NORMAL,
            libc::POSIX_FADV_RANDOM,
            libc::POSIX_FADV_SEQUENTIAL,
            libc::POSIX_FADV_WILLNEED,
            libc::POSIX_FADV_NOREUSE,
        ] {
            assert_eq!(fadvise(advice as u64), ALLOW, "{advice}");
        }
    }

    #[test]
    fn madvise_cold_and_pageout_succeed_without_running() {
        let p = program(false);
        let madvise = |advice: u64| call(&p, libc::SYS_madvise, [0x1000, 0x1000, advice, 0, 0, 0]);
        for advice in [libc::MADV_COLD, libc::MADV_PAGEOUT] {
            let advice = advice as u64;
            assert_eq!(madvise(advice), libc::SECCOMP_RET_ERRNO, "{advice}");
            // The advice is an int: junk in the high half changes nothing.
            assert_eq!(
                madvise(7 << 32 | advice),
                libc::SECCOMP_RET_ERRNO,
                "{advice}"
            );
        }
        for advice in [
            libc::MADV_NORMAL,
            libc::MADV_RANDOM,
            libc::MADV_SEQUENTIAL,
            libc::MADV_WILLNEED,
            libc::MADV_DONTNEED,
            libc::MADV_FREE,
            libc::MADV_HUGEPAGE,
            libc::MADV_DONTDUMP,
        ] {
            assert_eq!(madvise(advice as u64), ALLOW, "{advice}");
        }
    }

    #[test]
    fn nowait_reads_and_writes_are_eopnotsupp_and_other_flags_pass() {
        let p = program(false);
        let nowait = libc::RWF_NOWAIT as u64;
        for nr in [libc::SYS_preadv2, libc::SYS_pwritev2] {
            let rw = |flags: u64| call(&p, nr, [3, 0x1000, 1, 0, 0, flags]);
            for flags in [
                nowait,
                nowait | libc::RWF_HIPRI as u64,
                nowait | libc::RWF_DSYNC as u64,
                // The flags are an int: the high half does not hide the bit.
                0xff << 32 | nowait,
            ] {
                assert_eq!(rw(flags), errno(libc::EOPNOTSUPP), "nr {nr} {flags:#x}");
            }
            for flags in [0, libc::RWF_HIPRI, libc::RWF_DSYNC, libc::RWF_SYNC] {
                assert_eq!(rw(flags as u64), ALLOW, "nr {nr} {flags:#x}");
            }
            // Only argument 5 holds the flags: the bit elsewhere is an offset or a length.
            assert_eq!(call(&p, nr, [3, 0x1000, nowait, nowait, nowait, 0]), ALLOW);
        }
    }

    #[test]
    fn only_dockers_personalities_are_allowed() {
        let p = program(false);
        for value in [0, 8, 0x20000, 0x20008, 0xffff_ffff] {
            assert_eq!(arg0(&p, libc::SYS_personality, value), ALLOW, "{value:#x}");
        }
        // ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, PER_BSD.
        for value in [0x0040_0000, 0x0400_0000, 0x6] {
            assert_eq!(
                arg0(&p, libc::SYS_personality, value),
                errno(libc::EPERM),
                "{value:#x}"
            );
        }
    }

    #[test]
    fn only_four_socket_families_are_allowed() {
        let p = program(false);
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
                assert_eq!(arg0(&p, nr, family as u64), ALLOW, "{family}");
            }
            for family in [
                libc::AF_NETLINK,
                libc::AF_VSOCK,
                libc::AF_PACKET,
                libc::AF_ALG,
                libc::AF_KEY,
                libc::AF_BLUETOOTH,
                libc::AF_XDP,
                libc::AF_CAN,
                libc::AF_TIPC,
                libc::AF_RDS,
                0,
                255,
            ] {
                assert_eq!(
                    arg0(&p, nr, family as u64),
                    errno(libc::EAFNOSUPPORT),
                    "{family}"
                );
            }
            // The domain is an int: the kernel reads the low half only, so does the filter.
            assert_eq!(arg0(&p, nr, 1 << 32 | libc::AF_INET as u64), ALLOW);
            assert_eq!(
                arg0(&p, nr, 1 << 32 | libc::AF_VSOCK as u64),
                errno(libc::EAFNOSUPPORT)
            );
        }
    }

    /// Everything but the argument-filtered syscalls must have a result that depends on the
    /// syscall number alone, so that the kernel's action cache can allow it for free.
    #[test]
    fn only_ten_syscalls_look_at_arguments() {
        let p = program(false);
        let filtered = [
            libc::SYS_clone,
            libc::SYS_ioctl,
            libc::SYS_fcntl,
            libc::SYS_fadvise64,
            libc::SYS_madvise,
            libc::SYS_personality,
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_preadv2,
            libc::SYS_pwritev2,
        ];
        for nr in 0..512 {
            let constant = run(&p.filter, arch::AUDIT_ARCH, nr, None);
            if filtered.contains(&nr) {
                assert_eq!(constant, None, "nr {nr} should depend on its arguments");
            } else {
                assert!(constant.is_some(), "nr {nr} looks at its arguments");
            }
        }
    }

    /// The generator this module had before the binary search, kept as the reference the
    /// new program must match: a hand-written prologue, then seccompiler's linear chain.
    mod linear {
        use super::super::*;
        use seccompiler::{
            BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
            SeccompFilter, SeccompRule,
        };

        pub fn program(allow_ptrace: bool) -> Vec<Insn> {
            let main = SeccompFilter::new(
                eperm_rules(allow_ptrace),
                SeccompAction::Allow,
                SeccompAction::Errno(libc::EPERM as u32),
                target(),
            )
            .unwrap();
            let main: BpfProgram = main.try_into().unwrap();
            let mut filter = prologue();
            filter.extend(main.into_iter().map(|i| Insn {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            }));
            filter
        }

        fn target() -> seccompiler::TargetArch {
            if cfg!(target_arch = "x86_64") {
                seccompiler::TargetArch::x86_64
            } else {
                seccompiler::TargetArch::aarch64
            }
        }

        fn eperm_rules(allow_ptrace: bool) -> BTreeMap<i64, Vec<SeccompRule>> {
            let dword = |arg, op, value| {
                SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).unwrap()
            };
            let rule = |conditions| SeccompRule::new(conditions).unwrap();

            let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
            let unconditional = DENIED.iter().chain(arch::DENIED).chain(if allow_ptrace {
                &[][..]
            } else {
                PTRACE
            });
            for &nr in unconditional {
                rules.insert(nr, Vec::new());
            }
            let clone = CLONE_NAMESPACE_FLAGS
                .iter()
                .map(|&flag| {
                    let flag = flag as u32 as u64;
                    rule(vec![dword(0, SeccompCmpOp::MaskedEq(flag), flag)])
                })
                .collect();
            rules.insert(libc::SYS_clone, clone);
            let ioctl = DENIED_IOCTLS
                .iter()
                .map(|&request| rule(vec![dword(1, SeccompCmpOp::Eq, u64::from(request))]))
                .collect();
            rules.insert(libc::SYS_ioctl, ioctl);
            let not_allowed = ALLOWED_PERSONALITIES
                .iter()
                .map(|&value| dword(0, SeccompCmpOp::Ne, u64::from(value)))
                .collect();
            rules.insert(libc::SYS_personality, vec![rule(not_allowed)]);
            rules
        }

        fn prologue() -> Vec<Insn> {
            let mut p = vec![
                stmt(BPF_LD_W_ABS, DATA_ARCH),
                jump(BPF_JMP_JEQ_K, arch::AUDIT_ARCH, 1, 0),
                stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
                stmt(BPF_LD_W_ABS, DATA_NR),
            ];
            if let Some(x32_bit) = arch::X32_SYSCALL_BIT {
                p.extend([
                    jump(BPF_JMP_JSET_K, x32_bit, 0, 2),
                    jump(BPF_JMP_JEQ_K, u32::MAX, 1, 0),
                    stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
                ]);
            }
            p.extend([
                jump(BPF_JMP_JEQ_K, libc::SYS_clone3 as u32, 3, 0),
                jump(BPF_JMP_JEQ_K, libc::SYS_io_setup as u32, 2, 0),
                jump(BPF_JMP_JEQ_K, libc::SYS_mincore as u32, 1, 0),
                jump(BPF_JMP_JEQ_K, SYS_CACHESTAT as u32, 0, 1),
                stmt(BPF_RET_K, errno(libc::ENOSYS)),
            ]);
            // fcntl: the three OFD commands -> EINVAL.
            p.extend([
                jump(BPF_JMP_JEQ_K, libc::SYS_fcntl as u32, 0, 6),
                stmt(BPF_LD_W_ABS, data_arg_low(1)),
                jump(BPF_JMP_JEQ_K, libc::F_OFD_GETLK as u32, 2, 0),
                jump(BPF_JMP_JEQ_K, libc::F_OFD_SETLK as u32, 1, 0),
                jump(BPF_JMP_JEQ_K, libc::F_OFD_SETLKW as u32, 0, 1),
                stmt(BPF_RET_K, errno(libc::EINVAL)),
                stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
            ]);
            // fadvise64: DONTNEED -> 0.
            p.extend([
                jump(BPF_JMP_JEQ_K, libc::SYS_fadvise64 as u32, 0, 4),
                stmt(BPF_LD_W_ABS, data_arg_low(3)),
                jump(BPF_JMP_JEQ_K, libc::POSIX_FADV_DONTNEED as u32, 0, 1),
                stmt(BPF_RET_K, errno(0)),
                stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
            ]);
            // madvise: MADV_COLD, MADV_PAGEOUT -> 0.
            p.extend([
                jump(BPF_JMP_JEQ_K, libc::SYS_madvise as u32, 0, 5),
                stmt(BPF_LD_W_ABS, data_arg_low(2)),
                jump(BPF_JMP_JEQ_K, libc::MADV_COLD as u32, 1, 0),
                jump(BPF_JMP_JEQ_K, libc::MADV_PAGEOUT as u32, 0, 1),
                stmt(BPF_RET_K, errno(0)),
                stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
            ]);
            // preadv2, pwritev2: RWF_NOWAIT -> EOPNOTSUPP.
            p.extend([
                jump(BPF_JMP_JEQ_K, libc::SYS_preadv2 as u32, 1, 0),
                jump(BPF_JMP_JEQ_K, libc::SYS_pwritev2 as u32, 0, 4),
                stmt(BPF_LD_W_ABS, data_arg_low(5)),
                jump(BPF_JMP_JSET_K, libc::RWF_NOWAIT as u32, 0, 1),
                stmt(BPF_RET_K, errno(libc::EOPNOTSUPP)),
                stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
            ]);
            let families = ALLOWED_FAMILIES.len() as u8;
            p.extend([
                jump(BPF_JMP_JEQ_K, libc::SYS_socket as u32, 1, 0),
                jump(BPF_JMP_JEQ_K, libc::SYS_socketpair as u32, 0, families + 2),
                stmt(BPF_LD_W_ABS, data_arg_low(0)),
            ]);
            for (i, &family) in ALLOWED_FAMILIES.iter().enumerate() {
                p.push(jump(BPF_JMP_JEQ_K, family as u32, families - i as u8, 0));
            }
            p.push(stmt(BPF_RET_K, errno(libc::EAFNOSUPPORT)));
            p
        }
    }

    /// The policy written out as plain Rust: what any filter brig builds must answer. With
    /// `args` `None`, `None` means "depends on the arguments".
    fn reference(allow_ptrace: bool, arch: u32, nr: u32, args: Option<[u64; 6]>) -> Option<u32> {
        if arch != arch::AUDIT_ARCH {
            return Some(KILL);
        }
        if let Some(bit) = arch::X32_SYSCALL_BIT {
            if nr & bit != 0 && nr != u32::MAX {
                return Some(KILL);
            }
        }
        let nr = i64::from(nr);
        let unconditional = DENIED.contains(&nr)
            || arch::DENIED.contains(&nr)
            || (!allow_ptrace && PTRACE.contains(&nr));
        let verdict = match nr {
            _ if unconditional => Verdict::Errno(libc::EPERM),
            libc::SYS_clone3 | libc::SYS_io_setup | libc::SYS_mincore | 451 => {
                Verdict::Errno(libc::ENOSYS)
            }
            libc::SYS_clone => Verdict::Check(Check::CloneFlags),
            libc::SYS_ioctl => Verdict::Check(Check::IoctlRequest),
            libc::SYS_fcntl => Verdict::Check(Check::FcntlCmd),
            libc::SYS_fadvise64 => Verdict::Check(Check::FadviseAdvice),
            libc::SYS_madvise => Verdict::Check(Check::MadviseAdvice),
            libc::SYS_preadv2 | libc::SYS_pwritev2 => Verdict::Check(Check::RwFlags),
            libc::SYS_personality => Verdict::Check(Check::Personality),
            libc::SYS_socket | libc::SYS_socketpair => Verdict::Check(Check::SocketFamily),
            _ => Verdict::Allow,
        };
        judge(verdict, args)
    }

    /// What a verdict means for a call with `args`; `None` if it depends on them and they
    /// are not given.
    fn judge(verdict: Verdict, args: Option<[u64; 6]>) -> Option<u32> {
        let eperm_if = |denied: bool| if denied { errno(libc::EPERM) } else { ALLOW };
        // The low half of each argument: what the kernel reads of an int.
        let low = || args.map(|args| args.map(|arg| arg as u32));
        Some(match verdict {
            Verdict::Allow => ALLOW,
            Verdict::Errno(e) => errno(e),
            Verdict::Check(Check::CloneFlags) => {
                let flags = low()?[0];
                eperm_if(
                    CLONE_NAMESPACE_FLAGS
                        .iter()
                        .any(|&flag| flags & flag as u32 == flag as u32),
                )
            }
            Verdict::Check(Check::IoctlRequest) => eperm_if(DENIED_IOCTLS.contains(&low()?[1])),
            Verdict::Check(Check::FcntlCmd) => {
                let cmd = low()?[1];
                let ofd = [libc::F_OFD_GETLK, libc::F_OFD_SETLK, libc::F_OFD_SETLKW];
                if ofd.iter().any(|&c| c as u32 == cmd) {
                    errno(libc::EINVAL)
                } else {
                    ALLOW
                }
            }
            Verdict::Check(Check::FadviseAdvice) => {
                if low()?[3] == libc::POSIX_FADV_DONTNEED as u32 {
                    errno(0)
                } else {
                    ALLOW
                }
            }
            Verdict::Check(Check::MadviseAdvice) => {
                let advice = low()?[2] as libc::c_int;
                if advice == libc::MADV_COLD || advice == libc::MADV_PAGEOUT {
                    errno(0)
                } else {
                    ALLOW
                }
            }
            Verdict::Check(Check::RwFlags) => {
                if low()?[5] & libc::RWF_NOWAIT as u32 != 0 {
                    errno(libc::EOPNOTSUPP)
                } else {
                    ALLOW
                }
            }
            Verdict::Check(Check::Personality) => {
                eperm_if(!ALLOWED_PERSONALITIES.contains(&low()?[0]))
            }
            Verdict::Check(Check::SocketFamily) => {
                if ALLOWED_FAMILIES.contains(&(low()?[0] as libc::c_int)) {
                    ALLOW
                } else {
                    errno(libc::EAFNOSUPPORT)
                }
            }
        })
    }

    /// The generator on made-up tables (any architecture's numbers, neighbours of every
    /// kind, long and short runs): the program answers what the table says for every
    /// number, arguments included.
    #[test]
    fn the_search_follows_random_tables() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |below: u32| {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(below)) as u32
        };
        let kinds = [
            Verdict::Allow,
            Verdict::Errno(libc::EPERM),
            Verdict::Errno(libc::ENOSYS),
            Verdict::Errno(libc::EIO),
            Verdict::Check(Check::CloneFlags),
            Verdict::Check(Check::IoctlRequest),
            Verdict::Check(Check::Personality),
            Verdict::Check(Check::SocketFamily),
            Verdict::Check(Check::FcntlCmd),
            Verdict::Check(Check::FadviseAdvice),
            Verdict::Check(Check::MadviseAdvice),
            Verdict::Check(Check::RwFlags),
        ];
        let patterns = arg_patterns();
        for round in 0..200 {
            // Every fourth table is large enough to need far jumps.
            let (spread, entries) = match round % 4 {
                0 => (1 + random(3000), random(800)),
                _ => (1 + random(700), random(150)),
            };
            let mut table = BTreeMap::new();
            for _ in 0..entries {
                // Runs of one to four numbers with the same verdict.
                let (start, verdict) = (random(spread), kinds[random(kinds.len() as u32) as usize]);
                for nr in start..start + 1 + random(4) {
                    table.insert(nr, verdict);
                }
            }
            let filter = super::program(&ranges(&table));
            for nr in 0..spread + 8 {
                let verdict = table.get(&nr).copied().unwrap_or(Verdict::Allow);
                let (got, _) = exec(&filter, arch::AUDIT_ARCH, nr, None);
                assert_eq!(got, judge(verdict, None), "nr {nr} in {table:?}");
                if got.is_none() {
                    for &args in patterns.iter().step_by(7) {
                        let (got, _) = exec(&filter, arch::AUDIT_ARCH, nr, Some(args));
                        assert_eq!(got, judge(verdict, Some(args)), "nr {nr} in {table:?}");
                    }
                }
            }
        }
    }

    /// (arch, nr) pairs every filter is checked on: every number up to 600, the edges of the
    /// number space and the x32 numbers, for the native and foreign architectures.
    fn inputs() -> Vec<(u32, u32)> {
        let native = arch::AUDIT_ARCH;
        let mut nrs: Vec<u32> = (0..=600).collect();
        nrs.extend([
            SYSCALL_NUMBERS_END - 1,
            SYSCALL_NUMBERS_END,
            0x3fff_ffff,
            0x4000_0000,
            0x7fff_ffff,
            0x8000_0000,
            0x8000_0000 | 39,
            0xbfff_ffff,
            0xc000_0000,
            0xc000_0000 | 39,
            0xffff_fffe,
            u32::MAX,
        ]);
        // The x32 numbers, on x86_64: every one up to 600 with the x32 bit set.
        nrs.extend((0..=600).map(|nr| 0x4000_0000 | nr));
        let mut inputs: Vec<(u32, u32)> = nrs.iter().map(|&nr| (native, nr)).collect();
        // i386, arm, x86_64, aarch64 (one of them native), riscv64 and 0.
        for foreign in [
            0x4000_0003,
            0x4000_0028,
            0xc000_003e,
            0xc000_00b7,
            0xc000_00f3,
            0,
        ] {
            if foreign != native {
                inputs.extend(nrs.iter().map(|&nr| (foreign, nr)));
            }
        }
        inputs
    }

    /// Arguments to try where the result depends on them: interesting values for each of the
    /// checks (with and without junk in the high half), each in argument 0, in argument 1,
    /// and in all six.
    fn arg_patterns() -> Vec<[u64; 6]> {
        let sigchld = libc::SIGCHLD as u64;
        let mut values: Vec<u64> = vec![0, 1, u32::MAX.into(), u64::MAX, 0x1234_5678, sigchld];
        for &flag in CLONE_NAMESPACE_FLAGS {
            let flag = flag as u32 as u64;
            values.extend([flag, flag | sigchld, flag - 1, flag << 32 | sigchld]);
        }
        let thread = THREAD_CLONE_FLAGS;
        values.extend([thread, thread | libc::CLONE_NEWUSER as u64]);
        let requests = [
            libc::TIOCSTI,
            libc::TIOCLINUX,
            libc::TCGETS,
            libc::TIOCGWINSZ,
            libc::FIONREAD,
        ];
        for request in requests {
            let request = u64::from(request as u32);
            values.extend([
                request,
                request + 1,
                request - 1,
                0xdead_beef << 32 | request,
            ]);
        }
        for &value in ALLOWED_PERSONALITIES {
            let value = u64::from(value);
            values.extend([value, value + 1, value.wrapping_sub(1), 1 << 32 | value]);
        }
        values.extend([0x0040_0000, 0x0400_0000, 0x6]);
        // 0..=48 covers the socket families, fcntl's commands (the OFD ones are 36 to 38),
        // fadvise's advice (0 to 5), madvise's (0 to 25) and preadv2's flags (RWF_NOWAIT is 8,
        // alone and with its neighbours).
        for family in 0..=48 {
            values.extend([family, 1 << 32 | family]);
        }
        let mut patterns = vec![[0; 6]];
        for value in values {
            let mut arg0 = [0; 6];
            arg0[0] = value;
            let mut arg1 = [0; 6];
            arg1[1] = value;
            // madvise's advice is argument 2, fadvise's 3, preadv2's flags 5.
            let mut arg2 = [0; 6];
            arg2[2] = value;
            let mut arg3 = [0; 6];
            arg3[3] = value;
            let mut arg5 = [0; 6];
            arg5[5] = value;
            patterns.extend([arg0, arg1, arg2, arg3, arg5, [value; 6]]);
        }
        patterns
    }

    type Eval<'a> = &'a dyn Fn(u32, u32, Option<[u64; 6]>) -> Option<u32>;

    /// Where `a` and `b` answer differently on `inputs()`. A number whose result is constant
    /// in both (no argument load on its path) is proved for every argument at once; the
    /// others are compared on `arg_patterns()`.
    fn differences(a: Eval, b: Eval) -> Vec<String> {
        let patterns = arg_patterns();
        let mut diffs = Vec::new();
        for (arch, nr) in inputs() {
            let (constant_a, constant_b) = (a(arch, nr, None), b(arch, nr, None));
            if constant_a != constant_b {
                diffs.push(format!(
                    "arch {arch:#x} nr {nr:#x}: {constant_a:?} vs {constant_b:?}"
                ));
            } else if constant_a.is_none() {
                for &args in &patterns {
                    let (got_a, got_b) = (a(arch, nr, Some(args)), b(arch, nr, Some(args)));
                    assert!(got_a.is_some() && got_b.is_some());
                    if got_a != got_b {
                        diffs.push(format!(
                            "arch {arch:#x} nr {nr:#x} args {args:x?}: {got_a:x?} vs {got_b:x?}"
                        ));
                    }
                }
            }
        }
        diffs
    }

    fn program_eval(filter: &[Insn]) -> impl Fn(u32, u32, Option<[u64; 6]>) -> Option<u32> + '_ {
        move |arch, nr, args| exec(filter, arch, nr, args).0
    }

    fn reference_eval(allow_ptrace: bool) -> impl Fn(u32, u32, Option<[u64; 6]>) -> Option<u32> {
        move |arch, nr, args| reference(allow_ptrace, arch, nr, args)
    }

    /// The equivalence proof: the binary search answers exactly as the old linear program
    /// and as the policy written out in Rust, for every number up to 600, x32 and foreign
    /// architectures, and many arguments for the five argument-checked syscalls.
    #[test]
    fn the_search_answers_as_the_linear_program_and_the_reference() {
        for allow_ptrace in [false, true] {
            let new = program(allow_ptrace).filter;
            let old = linear::program(allow_ptrace);
            let diffs = differences(&program_eval(&new), &program_eval(&old));
            assert!(diffs.is_empty(), "allow_ptrace {allow_ptrace}: {diffs:#?}");
            let diffs = differences(&program_eval(&new), &reference_eval(allow_ptrace));
            assert!(diffs.is_empty(), "allow_ptrace {allow_ptrace}: {diffs:#?}");
            let diffs = differences(&program_eval(&old), &reference_eval(allow_ptrace));
            assert!(diffs.is_empty(), "allow_ptrace {allow_ptrace}: {diffs:#?}");
        }
    }

    /// The comparison can fail: it sees the ptrace group, and any single changed
    /// instruction of the program.
    #[test]
    fn the_comparison_catches_every_changed_instruction() {
        let strict = program(false).filter;
        let lenient = program(true).filter;
        let diffs = differences(&program_eval(&strict), &program_eval(&lenient));
        assert_eq!(diffs.len(), PTRACE.len(), "{diffs:#?}");

        let reference = reference_eval(false);
        for (pc, insn) in strict.iter().enumerate() {
            let mut mutant = strict.clone();
            let k = insn.k;
            match insn.code {
                BPF_RET_K if k == errno(libc::EIO) => mutant[pc].k = ALLOW,
                BPF_RET_K => mutant[pc].k = errno(libc::EIO),
                BPF_LD_W_ABS if k == DATA_NR => mutant[pc].k = DATA_ARCH,
                BPF_LD_W_ABS if k == DATA_ARCH => mutant[pc].k = DATA_NR,
                // Argument 0 <-> argument 1.
                BPF_LD_W_ABS => mutant[pc].k = k ^ 8,
                BPF_JMP_JEQ_K => mutant[pc].k = k.wrapping_add(1),
                // A pivot may move inside a run of allowed numbers and change nothing:
                // send each side of it to the other's code instead.
                BPF_JMP_JGE_K => (mutant[pc].jt, mutant[pc].jf) = (insn.jf, insn.jt),
                // Drop one bit of the mask.
                BPF_JMP_JSET_K => mutant[pc].k = k & (k - 1),
                code => panic!("no mutation for {code:#x} at {pc}"),
            }
            let diffs = differences(&program_eval(&mutant), &reference);
            assert!(
                !diffs.is_empty(),
                "changing {insn:?} at {pc} goes unnoticed"
            );
        }
    }

    #[test]
    fn clone_namespace_flags_are_single_bits() {
        // The clone check tests them all with one jset.
        for &flag in CLONE_NAMESPACE_FLAGS {
            assert_eq!(flag.count_ones(), 1, "{flag:#x}");
        }
    }

    /// What the kernel checks before taking a classic program (bpf_check_classic): every
    /// jump lands inside the program, and it cannot run off its end.
    #[test]
    fn every_jump_lands_inside_the_program() {
        for allow_ptrace in [false, true] {
            let filter = program(allow_ptrace).filter;
            for (pc, insn) in filter.iter().enumerate() {
                let next = pc + 1;
                let targets = match insn.code {
                    BPF_JMP_JA => vec![next + insn.k as usize],
                    BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JSET_K => {
                        vec![next + usize::from(insn.jt), next + usize::from(insn.jf)]
                    }
                    BPF_RET_K => vec![],
                    _ => vec![next],
                };
                for target in targets {
                    assert!(target < filter.len(), "{insn:?} at {pc} jumps out");
                }
            }
            assert_eq!(filter.last().unwrap().code, BPF_RET_K);
        }
    }

    /// Subtrees longer than a conditional jump reaches go through a ja. Today's lists never
    /// need one, so this builds a search over enough ranges to.
    #[test]
    fn far_subtrees_are_reached_through_ja() {
        let verdicts: BTreeMap<u32, Verdict> = (0..400)
            .map(|i| {
                let verdict = match i % 3 {
                    0 => Verdict::Errno(libc::EPERM),
                    1 => Verdict::Errno(libc::ENOSYS),
                    _ => Verdict::Check(Check::CloneFlags),
                };
                (i * 2, verdict)
            })
            .collect();
        let ranges = ranges(&verdicts);
        assert_eq!(ranges.len(), 800);
        let mut asm = Assembler::default();
        let search = asm.search(&ranges, None);
        let entry = asm.load_then(DATA_NR, search);
        let filter = asm.finish(entry);
        assert!(filter.iter().any(|insn| insn.code == BPF_JMP_JA));
        for nr in 0..=900 {
            let expected = match verdicts.get(&nr) {
                None => Some(ALLOW),
                Some(Verdict::Check(Check::CloneFlags)) => None,
                Some(&Verdict::Errno(e)) => Some(errno(e)),
                Some(verdict) => panic!("{verdict:?}"),
            };
            let (got, steps) = exec(&filter, arch::AUDIT_ARCH, nr, None);
            assert_eq!(got, expected, "nr {nr}");
            // The load, log2(800) comparisons, a ja at most at each level, then the leaf.
            assert!(steps <= 1 + 2 * 10 + 1, "nr {nr}: {steps} steps");
        }
    }

    #[test]
    fn neighbouring_ranges_differ() {
        let ranges = ranges(&verdicts(false).unwrap());
        assert_eq!(ranges[0].start, 0);
        assert_eq!(ranges.last().unwrap().verdict, Verdict::Allow);
        for pair in ranges.windows(2) {
            assert!(pair[0].start < pair[1].start);
            assert_ne!(pair[0].verdict, pair[1].verdict);
        }
    }

    /// How far `filter` runs for the native syscall numbers 0..=600.
    #[derive(Debug)]
    struct Paths {
        /// The most instructions before the verdict or the first argument load: the search.
        search: usize,
        /// The most instructions for any number, arguments included (a few tried).
        longest: usize,
        /// All the instructions the kernel's action cache preparation runs (it stops at
        /// argument loads), over numbers 0..=600.
        cache: usize,
    }

    fn paths(filter: &[Insn]) -> Paths {
        let mut paths = Paths {
            search: 0,
            longest: 0,
            cache: 0,
        };
        for nr in 0..=600 {
            let steps = exec(filter, arch::AUDIT_ARCH, nr, None).1;
            paths.search = paths.search.max(steps);
            paths.cache += steps;
            for args in [[0; 6], [u64::MAX; 6], [0x1234_5678; 6]] {
                let steps = exec(filter, arch::AUDIT_ARCH, nr, Some(args)).1;
                paths.longest = paths.longest.max(steps);
            }
        }
        paths
    }

    #[test]
    fn paths_are_short() {
        let filter = program(false).filter;
        let linear = linear::program(false);
        let (new, old) = (paths(&filter), paths(&linear));
        println!(
            "instructions {} (linear {}), {new:?} (linear {old:?})",
            filter.len(),
            linear.len()
        );
        // The prologue (4), a balanced search over the ranges, the verdict.
        let ranges = ranges(&verdicts(false).unwrap()).len();
        let depth = ranges.next_power_of_two().trailing_zeros() as usize;
        assert!(new.search <= 4 + depth + 1, "{new:?}, {ranges} ranges");
        assert!(filter.len() < linear.len() / 4);
    }

    /// Median time to install the filter in a fresh child, the linear program against the
    /// binary search, interleaved. `cargo test -p brig-jail --lib install_time -- --ignored
    /// --nocapture`
    #[test]
    #[ignore = "a measurement, not a test"]
    fn install_time() {
        const ROUNDS: usize = 400;
        let new = program(false);
        let old = SeccompProgram {
            filter: linear::program(false),
            summary: new.summary.clone(),
        };
        // The floor: the arch and x32 checks, then allow everything.
        let floor = SeccompProgram {
            filter: super::program(&[Range {
                start: 0,
                verdict: Verdict::Allow,
            }]),
            summary: new.summary.clone(),
        };
        let programs = [("linear", &old), ("search", &new), ("floor", &floor)];
        let start = std::time::Instant::now();
        for _ in 0..ROUNDS {
            std::hint::black_box(linear::program(false));
        }
        let linear_build = start.elapsed() / ROUNDS as u32;
        let start = std::time::Instant::now();
        for _ in 0..ROUNDS {
            std::hint::black_box(program(false));
        }
        let search_build = start.elapsed() / ROUNDS as u32;
        println!("build: linear {linear_build:?}, search {search_build:?}");
        let mut times = vec![Vec::new(); programs.len()];
        for _ in 0..ROUNDS {
            for (i, (_, p)) in programs.iter().enumerate() {
                times[i].push(time_install(p));
            }
        }
        for ((name, p), mut t) in programs.into_iter().zip(times) {
            t.sort_unstable();
            println!(
                "{name}: {} instructions, install median {} ns, p10 {} ns, p90 {} ns",
                p.filter.len(),
                t[ROUNDS / 2],
                t[ROUNDS / 10],
                t[ROUNDS * 9 / 10]
            );
        }
    }

    /// Forks, installs `p` in the child and returns how long the seccomp() call took.
    fn time_install(p: &SeccompProgram) -> u64 {
        fn now() -> u64 {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid timespec to write to.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        }
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only calls prctl, clock_gettime, seccomp (install allocates
        // nothing when it succeeds), write and _exit, all async-signal-safe.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut ns = u64::MAX;
            // SAFETY: plain syscalls on values this process owns.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 {
                    let start = now();
                    if p.apply().is_ok() {
                        ns = now() - start;
                    }
                }
                libc::write(fds[1], (&ns as *const u64).cast(), 8);
                libc::_exit(0);
            }
        }
        let mut ns = 0u64;
        // SAFETY: reading 8 bytes into a u64, then closing our descriptors and reaping the
        // child.
        unsafe {
            libc::close(fds[1]);
            assert_eq!(libc::read(fds[0], (&mut ns as *mut u64).cast(), 8), 8);
            libc::close(fds[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_ne!(ns, u64::MAX, "the child could not install the filter");
        ns
    }
}
