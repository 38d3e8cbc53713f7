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
//! | `socket`, `socketpair` with a family other than `AF_UNIX`, `AF_INET`, `AF_INET6`, `AF_NETLINK` | `EAFNOSUPPORT` |
//! | `clone` with a namespace flag (`CLONE_NEWNS`, `NEWUTS`, `NEWIPC`, `NEWUSER`, `NEWPID`, `NEWNET`, `NEWCGROUP`, `NEWTIME`) | `EPERM` |
//! | `ioctl` with `TIOCSTI` or `TIOCLINUX` | `EPERM` |
//! | `personality` with anything but 0, 8 (`PER_LINUX32`), 0x20000, 0x20008 or 0xffffffff (query) | `EPERM` |
//! | namespaces and mounts: `unshare`, `setns`, `mount`, `umount2`, `pivot_root`, `chroot`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `open_tree`, `move_mount`, `mount_setattr`, `open_by_handle_at`, `name_to_handle_at` | `EPERM` |
//! | kernel attack surface: `io_uring_setup`, `io_uring_enter`, `io_uring_register`, `userfaultfd`, `bpf`, `perf_event_open`, `keyctl`, `add_key`, `request_key`, `fanotify_init`, `lookup_dcookie`, `kcmp` | `EPERM` |
//! | the machine: `kexec_load`, `kexec_file_load`, `init_module`, `finit_module`, `delete_module`, `reboot`, `swapon`, `swapoff`, `acct`, `syslog`, `quotactl`, `quotactl_fd`, `vhangup`, `nfsservctl`, `sethostname`, `setdomainname` | `EPERM` |
//! | clocks: `settimeofday`, `clock_settime`, `clock_adjtime`, `adjtimex` | `EPERM` |
//! | NUMA policy: `get_mempolicy`, `set_mempolicy`, `set_mempolicy_home_node`, `mbind`, `move_pages`, `migrate_pages` | `EPERM` |
//! | x86_64 only: `iopl`, `ioperm`, `create_module`, `query_module`, `get_kernel_syms`, `uselib`, `ustat`, `sysfs`, `_sysctl`, and the never-implemented `afs_syscall`, `getpmsg`, `putpmsg`, `security`, `tuxcall`, `vserver` | `EPERM` |
//! | unless `allow_ptrace`: `ptrace`, `process_vm_readv`, `process_vm_writev`, `pidfd_getfd`, `process_madvise` | `EPERM` |
//! | everything else | allow |
//!
//! This covers every syscall Docker's default profile refuses to a container without added
//! capabilities, plus io_uring, `name_to_handle_at` and the socket families. `adjtimex` and
//! `clock_adjtime` are denied outright: only their `modes` field tells a read from a write,
//! and it lives in user memory, which a seccomp filter cannot read.
//!
//! # Shape of the program
//!
//! A hand-written prologue (arch and x32 checks, `clone3`, socket families) runs first, then
//! the program seccompiler compiles from the EPERM rules. seccompiler gives one filter a
//! single match action and knows nothing of x32, so everything needing another action lives
//! in the prologue; its jumps are relative, so the two concatenate without relocation.
//!
//! Only `clone`, `ioctl`, `personality`, `socket` and `socketpair` look at arguments. For
//! every other syscall the result depends on the syscall number alone, so the kernel's
//! seccomp action cache (5.11+) allows it without running the filter at all.

use std::collections::BTreeMap;
use std::io;

use brig_policy::{SeccompMode, SeccompPolicy};
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule,
};
use serde::Serialize;

use crate::JailError;

// The hand-written prologue reads an argument's low half at the start of its slot.
#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_endian = "little"
)))]
compile_error!("brig's seccomp filter is written for little-endian x86_64 and aarch64 only");

/// A compiled filter, built once before the sandbox starts (in the parent), installed in the child.
#[derive(Debug, Clone)]
pub struct SeccompProgram {
    filter: BpfProgram,
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
}

#[cfg(target_arch = "x86_64")]
mod arch {
    pub const NAME: &str = "x86_64";
    pub const TARGET: seccompiler::TargetArch = seccompiler::TargetArch::x86_64;
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
    pub const TARGET: seccompiler::TargetArch = seccompiler::TargetArch::aarch64;
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
];

/// Reading or writing another process's memory; denied unless the policy allows ptrace.
const PTRACE: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
];

/// Syscalls the prologue handles: clone3, socket, socketpair.
const PROLOGUE_DENIED: usize = 3;

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
const ALLOWED_FAMILIES: &[libc::c_int] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// TIOCSTI pushes input into a terminal the sandbox shares with someone else; TIOCLINUX
/// can do the same on a virtual console.
const DENIED_IOCTLS: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// Builds the filter for `policy`; `None` when seccomp is off.
pub fn build(policy: &SeccompPolicy) -> Result<Option<SeccompProgram>, JailError> {
    if policy.mode == SeccompMode::Off {
        return Ok(None);
    }
    let rules = eperm_rules(policy.allow_ptrace)?;
    let denied_syscalls = rules.len() + PROLOGUE_DENIED;
    let main = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch::TARGET,
    )
    .map_err(compile_error)?;
    let main: BpfProgram = main.try_into().map_err(compile_error)?;

    let mut filter = prologue();
    filter.extend(main);
    if filter.len() > BPF_MAXINSNS {
        return Err(JailError::Seccomp(format!(
            "the filter has {} instructions, more than the kernel's limit of {BPF_MAXINSNS}",
            filter.len()
        )));
    }

    let summary = SeccompSummary {
        arch: arch::NAME,
        denied_syscalls,
        allow_ptrace: policy.allow_ptrace,
        kills_foreign_arch: true,
        kills_x32: arch::X32_SYSCALL_BIT.is_some(),
        instructions: filter.len(),
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

// seccompiler's sock_filter is handed to the kernel as libc's.
const _: () = {
    assert!(std::mem::size_of::<sock_filter>() == std::mem::size_of::<libc::sock_filter>());
    assert!(std::mem::align_of::<sock_filter>() == std::mem::align_of::<libc::sock_filter>());
};

/// The kernel's limit on the length of a classic BPF program.
const BPF_MAXINSNS: usize = 4096;

fn compile_error(err: seccompiler::BackendError) -> JailError {
    JailError::Seccomp(format!("cannot compile the filter (a bug in brig): {err}"))
}

/// The rules seccompiler compiles: a syscall with no rule is denied outright, one with
/// rules is denied when any rule matches.
fn eperm_rules(allow_ptrace: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, JailError> {
    // The kernel reads clone's flags, ioctl's request and personality's argument as 32-bit
    // ints, so only the low half is compared: a value with junk in the high half must not
    // slip past a 64-bit comparison.
    let dword = |arg, op, value| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(compile_error)
    };
    let rule = |conditions| SeccompRule::new(conditions).map_err(compile_error);

    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let unconditional =
        DENIED
            .iter()
            .chain(arch::DENIED)
            .chain(if allow_ptrace { &[][..] } else { PTRACE });
    for &nr in unconditional {
        rules.insert(nr, Vec::new());
    }

    // clone(flags, ...) takes the flags first on both architectures (s390 is the odd one).
    let clone = CLONE_NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u32 as u64;
            rule(vec![dword(0, SeccompCmpOp::MaskedEq(flag), flag)?])
        })
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_clone, clone);

    let ioctl = DENIED_IOCTLS
        .iter()
        .map(|&request| rule(vec![dword(1, SeccompCmpOp::Eq, u64::from(request))?]))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_ioctl, ioctl);

    let not_allowed = ALLOWED_PERSONALITIES
        .iter()
        .map(|&value| dword(0, SeccompCmpOp::Ne, u64::from(value)))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_personality, vec![rule(not_allowed)?]);

    Ok(rules)
}

// Classic BPF opcodes (linux/filter.h): BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ | BPF_K, ...
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
const BPF_RET_K: u16 = 0x06;

// Offsets in struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }. Both supported
// architectures are little-endian, so an argument's low half comes first.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0_LOW: u32 = 16;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The checks that need an action other than EPERM. Hand-written because seccompiler
/// compiles one match action per filter and has no notion of x32. It ends by falling
/// through into the main program.
fn prologue() -> Vec<sock_filter> {
    let errno = |e: libc::c_int| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
    let mut p = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, arch::AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ];
    if let Some(x32_bit) = arch::X32_SYSCALL_BIT {
        p.extend([
            jump(BPF_JMP_JSET_K, x32_bit, 0, 2),
            // nr -1 means "no syscall": a tracer skipping a call sets it, and seccomp sees it
            // after the tracer. The kernel answers ENOSYS; there is nothing to kill for.
            jump(BPF_JMP_JEQ_K, u32::MAX, 1, 0),
            stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        ]);
    }
    p.extend([
        jump(BPF_JMP_JEQ_K, libc::SYS_clone3 as u32, 0, 1),
        stmt(BPF_RET_K, errno(libc::ENOSYS)),
    ]);

    // socket(domain, ...) and socketpair(domain, ...): domain is an int, arg 0.
    let families = ALLOWED_FAMILIES.len() as u8;
    p.extend([
        jump(BPF_JMP_JEQ_K, libc::SYS_socket as u32, 1, 0),
        // Not a socket call: skip the load, the family checks and the return.
        jump(BPF_JMP_JEQ_K, libc::SYS_socketpair as u32, 0, families + 2),
        stmt(BPF_LD_W_ABS, DATA_ARG0_LOW),
    ]);
    for (i, &family) in ALLOWED_FAMILIES.iter().enumerate() {
        // An allowed family jumps over the remaining checks and the return.
        p.push(jump(BPF_JMP_JEQ_K, family as u32, families - i as u8, 0));
    }
    p.push(stmt(BPF_RET_K, errno(libc::EAFNOSUPPORT)));
    p
}

#[cfg(test)]
mod tests {
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
    fn run(filter: &[sock_filter], arch: u32, nr: i64, args: Option<[u64; 6]>) -> Option<u32> {
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let insn = &filter[pc];
            pc += 1;
            match insn.code {
                BPF_LD_W_ABS => {
                    acc = match insn.k {
                        DATA_NR => nr as u32,
                        DATA_ARCH => arch,
                        k if (16..64).contains(&k) && k % 4 == 0 => {
                            let arg = args?[(k as usize - 16) / 8];
                            if k % 8 == 0 {
                                arg as u32
                            } else {
                                (arg >> 32) as u32
                            }
                        }
                        k => panic!("load from unexpected offset {k}"),
                    }
                }
                0x54 => acc &= insn.k,         // BPF_ALU | BPF_AND | BPF_K
                0x05 => pc += insn.k as usize, // BPF_JMP | BPF_JA
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
                BPF_RET_K => return Some(insn.k),
                code => panic!("unexpected BPF instruction {code:#x}"),
            }
        }
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
        // Unconditional, ptrace group, clone/ioctl/personality, clone3/socket/socketpair.
        let expected = DENIED.len() + arch::DENIED.len() + PTRACE.len() + 3 + 3;
        assert_eq!(s.denied_syscalls, expected);
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
        // kcmp stays denied: it is not needed to trace.
        assert_eq!(call0(&lenient, libc::SYS_kcmp), errno(libc::EPERM));
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
            libc::SYS_socket,
            libc::SYS_socketpair,
        ]);
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
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
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
            for family in [
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
            ] {
                assert_eq!(arg0(&p, nr, family as u64), ALLOW, "{family}");
            }
            for family in [
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

    /// Everything but the five argument-filtered syscalls must have a result that depends on
    /// the syscall number alone, so that the kernel's action cache can allow it for free.
    #[test]
    fn only_five_syscalls_look_at_arguments() {
        let p = program(false);
        let filtered = [
            libc::SYS_clone,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
            libc::SYS_socketpair,
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
}
