//! Behaviour of the seccomp filter on the running kernel.
//!
//! Each test spawns a real process, installs the filter between fork and exec, and has
//! Python (through ctypes) or a small C program attack it. The same attacks run without
//! the filter as root to show that the filter, not the host, stops them.
//!
//! Every attack uses arguments that are harmless if the call goes through (bad pointers,
//! invalid flags, a private pty), because without the filter, or with a broken one, it
//! does go through, as root, on the test machine.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

use brig_jail::seccomp::{self, SeccompProgram};
use brig_policy::{SeccompMode, SeccompPolicy};
use serde_json::{json, Value};

const PYTHON: &str = "/usr/bin/python3";

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

fn program(allow_ptrace: bool) -> SeccompProgram {
    seccomp::build(&SeccompPolicy {
        mode: SeccompMode::Default,
        allow_ptrace,
    })
    .expect("the filter builds")
    .expect("mode default gives a filter")
}

/// Runs `cmd`, under `program` when given. The program is built before the fork: the test
/// harness is multi-threaded, so the child may only do async-signal-safe work before exec.
fn run(mut cmd: Command, program: Option<&SeccompProgram>) -> Output {
    if let Some(program) = program {
        let program = program.clone();
        // SAFETY: the hook runs in the child between fork and exec. It calls prctl and
        // install(), which allocate nothing unless they fail.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                program
                    .install()
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
            });
        }
    }
    cmd.output().expect("spawn the test program")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Errno(i32),
    Signal(i32),
    /// The Python attack itself failed (exception): a bug in the test.
    Broken(i32),
}

struct Case {
    name: &'static str,
    nr: i64,
    args: Vec<Value>,
    /// What happens under the default filter.
    confined: Outcome,
    /// What happens without any filter, as root, when that is certain on any Linux host.
    unconfined: Option<Outcome>,
}

fn case(name: &'static str, nr: i64, args: Value, confined: Outcome) -> Case {
    let Value::Array(args) = args else {
        panic!("args of {name} must be an array")
    };
    Case {
        name,
        nr,
        args,
        confined,
        unconfined: None,
    }
}

impl Case {
    fn unconfined(mut self, outcome: Outcome) -> Case {
        self.unconfined = Some(outcome);
        self
    }
}

/// Runs every case in its own forked child (so that unshare, personality or ptrace in one
/// case cannot change the next) and prints "name outcome" lines. Arguments are integers or
/// the placeholders "pid", "pty" (a private pty's slave), "buf" (4 KiB of zeros), "fds"
/// (int[2]) and "char" (one byte). Names "fork", "thread" and "spawn" exercise Python itself.
const ATTACK: &str = r#"
import ctypes, json, os, subprocess, sys, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
master, slave = os.openpty()
buf = ctypes.create_string_buffer(4096)
fds = (ctypes.c_int * 2)()
char = ctypes.create_string_buffer(b"x")
places = {"pty": slave, "buf": ctypes.addressof(buf), "fds": ctypes.addressof(fds),
          "char": ctypes.addressof(char)}

def value(arg):
    if arg == "pid":
        return os.getpid()
    if isinstance(arg, str):
        return places[arg]
    return arg

def attempt(name, nr, args):
    if name == "fork":
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if name == "thread":
        ran = []
        t = threading.Thread(target=lambda: ran.append(1))
        t.start()
        t.join()
        return 0 if ran else 251
    if name == "spawn":
        return subprocess.run(["/bin/true"]).returncode
    ctypes.set_errno(0)
    words = [ctypes.c_ulong(value(a) & 0xFFFFFFFFFFFFFFFF) for a in args]
    r = libc.syscall(ctypes.c_long(nr), *words)
    if r < 0:
        return ctypes.get_errno()
    if name.startswith("clone"):
        if r == 0:
            os._exit(0)
        os.waitpid(r, 0)
    return 0

for name, nr, args in json.loads(sys.argv[1]):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            code = attempt(name, nr, args)
        except OSError as e:
            code = e.errno or 252
        except BaseException:
            code = 253
        os._exit(code)
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        print(name, "sig", os.WTERMSIG(status))
    else:
        print(name, os.WEXITSTATUS(status))
"#;

fn attack(cases: &[Case], program: Option<&SeccompProgram>) -> BTreeMap<String, Outcome> {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is needed for the seccomp tests"
    );
    let list: Vec<Value> = cases
        .iter()
        .map(|c| json!([c.name, c.nr, c.args]))
        .collect();
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c")
        .arg(ATTACK)
        .arg(Value::Array(list).to_string());
    let out = run(cmd, program);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "attack script failed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut results = BTreeMap::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let outcome = match fields[1..] {
            ["sig", n] => Outcome::Signal(n.parse().unwrap()),
            ["0"] => Outcome::Ok,
            [n] => match n.parse().unwrap() {
                n @ 251..=253 => Outcome::Broken(n),
                n => Outcome::Errno(n),
            },
            _ => panic!("unexpected line from the attack script: {line}"),
        };
        results.insert(fields[0].to_string(), outcome);
    }
    assert_eq!(results.len(), cases.len(), "every case reports: {stdout}");
    results
}

fn table(cases: &[Case], results: &BTreeMap<String, Outcome>) -> String {
    cases
        .iter()
        .map(|c| format!("  {:<28} {:?}\n", c.name, results[c.name]))
        .collect()
}

/// Attacks on the filter. Pointers are the invalid address 1, so that a call the filter
/// lets through fails harmlessly with EFAULT instead of doing something.
fn cases() -> Vec<Case> {
    use libc::*;
    use Outcome::*;
    let eperm = Errno(EPERM);
    let bad = 1; // an address nothing is mapped at
    let sigchld = SIGCHLD as i64;
    let tiocsti = TIOCSTI as i64;
    let clone_ns = |name, flag: c_int| {
        case(
            name,
            SYS_clone,
            json!([flag as i64 | sigchld, 0, 0, 0, 0]),
            eperm,
        )
    };

    let mut cases = vec![
        // Plain process and thread creation keep working (clone3 falls back to clone).
        case("fork", 0, json!([]), Ok).unconfined(Ok),
        case("thread", 0, json!([]), Ok).unconfined(Ok),
        case("spawn", 0, json!([]), Ok).unconfined(Ok),
        case("clone_plain", SYS_clone, json!([sigchld, 0, 0, 0, 0]), Ok).unconfined(Ok),
        case("clone3", SYS_clone3, json!([0, 0]), Errno(ENOSYS)).unconfined(Errno(EINVAL)),
        // Native AIO is as if absent (one host-wide pool of contexts).
        case("io_setup", SYS_io_setup, json!([1, 0]), Errno(ENOSYS)).unconfined(Errno(EFAULT)),
        // Numbers past the table are let through for the kernel to refuse, -1 ("no syscall")
        // too although it has the x32 bit set.
        case("nr_unassigned", 1000, json!([]), Errno(ENOSYS)),
        case("nr_minus_one", -1, json!([]), Errno(ENOSYS)),
        // Namespaces.
        clone_ns("clone_newuser", CLONE_NEWUSER).unconfined(Ok),
        clone_ns("clone_newns", CLONE_NEWNS),
        clone_ns("clone_newpid", CLONE_NEWPID),
        clone_ns("clone_newnet", CLONE_NEWNET),
        clone_ns("clone_newipc", CLONE_NEWIPC),
        clone_ns("clone_newuts", CLONE_NEWUTS),
        clone_ns("clone_newcgroup", CLONE_NEWCGROUP),
        case(
            "unshare_newuser",
            SYS_unshare,
            json!([CLONE_NEWUSER]),
            eperm,
        )
        .unconfined(Ok),
        case("unshare_newns", SYS_unshare, json!([CLONE_NEWNS]), eperm).unconfined(Ok),
        case("setns", SYS_setns, json!([-1, 0]), eperm).unconfined(Errno(EBADF)),
        // Mounts.
        case("mount", SYS_mount, json!([0, 0, 0, 0, 0]), eperm).unconfined(Errno(EFAULT)),
        case("umount2", SYS_umount2, json!([bad, 0]), eperm).unconfined(Errno(EFAULT)),
        case("pivot_root", SYS_pivot_root, json!([bad, bad]), eperm),
        case("chroot", SYS_chroot, json!([bad]), eperm).unconfined(Errno(EFAULT)),
        case("fsopen", SYS_fsopen, json!([bad, 0]), eperm),
        case("fsconfig", SYS_fsconfig, json!([-1, 0, 0, 0, 0]), eperm),
        case("fsmount", SYS_fsmount, json!([-1, 0, 0]), eperm),
        case("fspick", SYS_fspick, json!([-1, bad, 0]), eperm),
        case("open_tree", SYS_open_tree, json!([-1, bad, 0]), eperm),
        case(
            "move_mount",
            SYS_move_mount,
            json!([-1, bad, -1, bad, 0]),
            eperm,
        ),
        case(
            "mount_setattr",
            SYS_mount_setattr,
            json!([-1, bad, 0, 0, 0]),
            eperm,
        ),
        case(
            "open_by_handle_at",
            SYS_open_by_handle_at,
            json!([-1, bad, 0]),
            eperm,
        ),
        case(
            "name_to_handle_at",
            SYS_name_to_handle_at,
            json!([-1, bad, bad, bad, 0]),
            eperm,
        ),
        // Kernel attack surface.
        case(
            "io_uring_setup",
            SYS_io_uring_setup,
            json!([1, "buf"]),
            eperm,
        ),
        case(
            "io_uring_enter",
            SYS_io_uring_enter,
            json!([-1, 0, 0, 0, 0, 0]),
            eperm,
        ),
        case(
            "io_uring_register",
            SYS_io_uring_register,
            json!([-1, 0, 0, 0]),
            eperm,
        ),
        case("userfaultfd", SYS_userfaultfd, json!([0]), eperm),
        case("bpf", SYS_bpf, json!([0, bad, 0]), eperm),
        case(
            "perf_event_open",
            SYS_perf_event_open,
            json!([bad, 0, -1, -1, 0]),
            eperm,
        ),
        // KEYCTL_GET_KEYRING_ID of the session keyring, without creating it.
        case("keyctl", SYS_keyctl, json!([0, -3, 0]), eperm),
        case("add_key", SYS_add_key, json!([bad, bad, 0, 0, 0]), eperm),
        case(
            "request_key",
            SYS_request_key,
            json!([bad, bad, 0, 0]),
            eperm,
        ),
        case("fanotify_init", SYS_fanotify_init, json!([0, 0]), eperm),
        case(
            "lookup_dcookie",
            SYS_lookup_dcookie,
            json!([0, 0, 0]),
            eperm,
        ),
        case("kcmp", SYS_kcmp, json!(["pid", "pid", 0, 0, 0]), eperm),
        // The machine. kexec with an unknown flag bit and reboot without the magic fail
        // EINVAL before doing anything.
        case("kexec_load", SYS_kexec_load, json!([0, 0, 0, 0x100]), eperm),
        case(
            "kexec_file_load",
            SYS_kexec_file_load,
            json!([-1, -1, 0, 0, 0x100]),
            eperm,
        ),
        case("init_module", SYS_init_module, json!([bad, 0, bad]), eperm),
        case("finit_module", SYS_finit_module, json!([-1, bad, 0]), eperm),
        case("delete_module", SYS_delete_module, json!([bad, 0]), eperm),
        case("reboot", SYS_reboot, json!([0, 0, 0, 0]), eperm).unconfined(Errno(EINVAL)),
        case("swapon", SYS_swapon, json!([bad, 0]), eperm),
        case("swapoff", SYS_swapoff, json!([bad]), eperm),
        case("acct", SYS_acct, json!([bad]), eperm),
        // SYSLOG_ACTION_SIZE_BUFFER only reads.
        case("syslog", SYS_syslog, json!([10, 0, 0]), eperm),
        case("quotactl", SYS_quotactl, json!([0, bad, 0, 0]), eperm),
        case("quotactl_fd", SYS_quotactl_fd, json!([-1, 0, 0, 0]), eperm),
        // The child has no controlling terminal (setsid), so vhangup would hang up nothing.
        case("vhangup", SYS_vhangup, json!([]), eperm),
        case("nfsservctl", SYS_nfsservctl, json!([0, 0, 0]), eperm),
        case("sethostname", SYS_sethostname, json!([bad, 5]), eperm).unconfined(Errno(EFAULT)),
        case("setdomainname", SYS_setdomainname, json!([bad, 5]), eperm),
        // Clocks. settimeofday(NULL, NULL) changes nothing.
        case("settimeofday", SYS_settimeofday, json!([0, 0]), eperm),
        case("clock_settime", SYS_clock_settime, json!([0, bad]), eperm),
        case("clock_adjtime", SYS_clock_adjtime, json!([0, bad]), eperm),
        case("adjtimex", SYS_adjtimex, json!([bad]), eperm),
        // NUMA.
        case(
            "get_mempolicy",
            SYS_get_mempolicy,
            json!([0, 0, 0, 0, 0]),
            eperm,
        ),
        case("set_mempolicy", SYS_set_mempolicy, json!([0, 0, 0]), eperm),
        case("mbind", SYS_mbind, json!([0, 0, 0, 0, 0, 0]), eperm),
        case(
            "move_pages",
            SYS_move_pages,
            json!([0, 0, 0, 0, 0, 0]),
            eperm,
        ),
        case(
            "migrate_pages",
            SYS_migrate_pages,
            json!([0, 0, 0, 0]),
            eperm,
        ),
        // Debugging other processes.
        case(
            "ptrace_traceme",
            SYS_ptrace,
            json!([PTRACE_TRACEME, 0, 0, 0]),
            eperm,
        )
        .unconfined(Ok),
        case(
            "process_vm_readv",
            SYS_process_vm_readv,
            json!(["pid", 0, 0, 0, 0, 0]),
            eperm,
        )
        .unconfined(Ok),
        case(
            "process_vm_writev",
            SYS_process_vm_writev,
            json!(["pid", 0, 0, 0, 0, 0]),
            eperm,
        )
        .unconfined(Ok),
        case("pidfd_getfd", SYS_pidfd_getfd, json!([-1, 0, 0]), eperm),
        case(
            "process_madvise",
            SYS_process_madvise,
            json!([-1, 0, 0, 0, 0]),
            eperm,
        ),
        // The shared page cache: no eviction, no residency probes. madvise at the unaligned
        // address 1 fails EINVAL wherever the kernel sees it.
        case(
            "madvise_pageout",
            SYS_madvise,
            json!([bad, 4096, MADV_PAGEOUT]),
            Ok,
        )
        .unconfined(Errno(EINVAL)),
        case(
            "madvise_cold",
            SYS_madvise,
            json!([bad, 4096, MADV_COLD]),
            Ok,
        )
        .unconfined(Errno(EINVAL)),
        case(
            "madvise_dontneed",
            SYS_madvise,
            json!([bad, 4096, MADV_DONTNEED]),
            Errno(EINVAL),
        ),
        case(
            "mincore",
            SYS_mincore,
            json!([bad, 4096, "buf"]),
            Errno(ENOSYS),
        )
        .unconfined(Errno(EINVAL)),
        // cachestat, not in libc's tables yet: 451 on x86_64 and aarch64.
        case(
            "cachestat",
            451,
            json!([-1, "buf", "buf", 0]),
            Errno(ENOSYS),
        ),
        case(
            "preadv2_nowait",
            SYS_preadv2,
            json!([-1, "buf", 1, 0, 0, RWF_NOWAIT]),
            Errno(EOPNOTSUPP),
        )
        .unconfined(Errno(EBADF)),
        case(
            "pwritev2_nowait",
            SYS_pwritev2,
            json!([-1, "buf", 1, 0, 0, RWF_NOWAIT | RWF_DSYNC]),
            Errno(EOPNOTSUPP),
        )
        .unconfined(Errno(EBADF)),
        // Other flags reach the kernel.
        case(
            "preadv2_hipri",
            SYS_preadv2,
            json!([-1, "buf", 1, 0, 0, RWF_HIPRI]),
            Errno(EBADF),
        ),
        case(
            "pwritev2_plain",
            SYS_pwritev2,
            json!([-1, "buf", 1, 0, 0, 0]),
            Errno(EBADF),
        ),
        // Sockets.
        case(
            "socket_inet",
            SYS_socket,
            json!([AF_INET, SOCK_STREAM, 0]),
            Ok,
        )
        .unconfined(Ok),
        case(
            "socket_unix",
            SYS_socket,
            json!([AF_UNIX, SOCK_STREAM, 0]),
            Ok,
        )
        .unconfined(Ok),
        // Its queued messages are charged to no memory cgroup.
        case(
            "socket_netlink",
            SYS_socket,
            json!([AF_NETLINK, SOCK_RAW, 0]),
            Errno(EAFNOSUPPORT),
        )
        .unconfined(Ok),
        case(
            "socket_vsock",
            SYS_socket,
            json!([AF_VSOCK, SOCK_STREAM, 0]),
            Errno(EAFNOSUPPORT),
        ),
        case(
            "socket_packet",
            SYS_socket,
            json!([AF_PACKET, SOCK_RAW, 0]),
            Errno(EAFNOSUPPORT),
        )
        .unconfined(Ok),
        case(
            "socket_alg",
            SYS_socket,
            json!([AF_ALG, SOCK_SEQPACKET, 0]),
            Errno(EAFNOSUPPORT),
        ),
        case(
            "socketpair_unix",
            SYS_socketpair,
            json!([AF_UNIX, SOCK_STREAM, 0, "fds"]),
            Ok,
        )
        .unconfined(Ok),
        case(
            "socketpair_packet",
            SYS_socketpair,
            json!([AF_PACKET, SOCK_RAW, 0, "fds"]),
            Errno(EAFNOSUPPORT),
        )
        .unconfined(Errno(EOPNOTSUPP)),
        // Terminal injection, on a pty of our own so that it would work as root.
        case("tiocsti", SYS_ioctl, json!(["pty", tiocsti, "char"]), eperm).unconfined(Ok),
        // The kernel reads the request as an int, so junk in the high half is still TIOCSTI.
        case(
            "tiocsti_high_bits",
            SYS_ioctl,
            json!(["pty", tiocsti | 0x7eed_0000_0000_0000, "char"]),
            eperm,
        )
        .unconfined(Ok),
        case(
            "tioclinux",
            SYS_ioctl,
            json!(["pty", TIOCLINUX, "char"]),
            eperm,
        ),
        case(
            "tiocgwinsz",
            SYS_ioctl,
            json!(["pty", TIOCGWINSZ, "buf"]),
            Ok,
        )
        .unconfined(Ok),
        // personality: Docker's values pass, ADDR_NO_RANDOMIZE does not.
        case(
            "personality_query",
            SYS_personality,
            json!([0xffff_ffffu32]),
            Ok,
        ),
        case("personality_linux", SYS_personality, json!([0]), Ok),
        case("personality_linux32", SYS_personality, json!([8]), Ok),
        case(
            "personality_no_aslr",
            SYS_personality,
            json!([ADDR_NO_RANDOMIZE]),
            eperm,
        )
        .unconfined(Ok),
    ];

    cases.extend(arch_cases());
    cases
}

/// Syscalls only the x86_64 ABI has.
#[cfg(target_arch = "x86_64")]
fn arch_cases() -> Vec<Case> {
    use libc::*;
    let eperm = Outcome::Errno(EPERM);
    let bad = 1;
    vec![
        // iopl(0) and ioperm(0, 0, 0) ask for nothing.
        case("iopl", SYS_iopl, json!([0]), eperm),
        case("ioperm", SYS_ioperm, json!([0, 0, 0]), eperm),
        case("uselib", SYS_uselib, json!([bad]), eperm),
        case("ustat", SYS_ustat, json!([0, bad]), eperm),
        // Option 3: how many filesystem types the kernel knows.
        case("sysfs", SYS_sysfs, json!([3]), eperm),
        case("_sysctl", SYS__sysctl, json!([bad]), eperm),
        // create_module, long gone from the kernel: its number must still be refused.
        case("create_module", 174, json!([bad, 0]), eperm).unconfined(Outcome::Errno(ENOSYS)),
    ]
}

#[cfg(not(target_arch = "x86_64"))]
fn arch_cases() -> Vec<Case> {
    Vec::new()
}

#[test]
fn confined_attacks_fail_and_ordinary_work_goes_on() {
    let cases = cases();
    let results = attack(&cases, Some(&program(false)));
    let wrong: Vec<String> = cases
        .iter()
        .filter(|c| results[c.name] != c.confined)
        .map(|c| {
            format!(
                "{}: expected {:?}, got {:?}",
                c.name, c.confined, results[c.name]
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "under the filter:\n{}\nall results:\n{}",
        wrong.join("\n"),
        table(&cases, &results)
    );
}

/// Without this, a filter that did nothing could still pass the test above wherever the
/// host itself refuses the calls.
#[test]
fn unconfined_attacks_succeed_as_root() {
    if !is_root() {
        eprintln!("skipped unconfined_attacks_succeed_as_root: needs root");
        return;
    }
    let cases = cases();
    let results = attack(&cases, None);
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|c| Some((c, c.unconfined?)))
        .filter(|(c, expected)| results[c.name] != *expected)
        .map(|(c, expected)| {
            format!(
                "{}: expected {expected:?}, got {:?}",
                c.name, results[c.name]
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "without the filter, as root (is this host confining the tests itself?):\n{}\n\
         all results:\n{}",
        wrong.join("\n"),
        table(&cases, &results)
    );
    for c in cases.iter().filter(|c| c.unconfined.is_some()) {
        if c.confined != Outcome::Ok {
            assert_ne!(
                results[c.name], c.confined,
                "{} is not the filter's doing",
                c.name
            );
        }
    }
}

#[test]
fn allow_ptrace_lets_debuggers_work() {
    use libc::*;
    let eperm = Outcome::Errno(EPERM);
    let cases = vec![
        case(
            "ptrace_traceme",
            SYS_ptrace,
            json!([PTRACE_TRACEME, 0, 0, 0]),
            Outcome::Ok,
        ),
        case(
            "process_vm_readv",
            SYS_process_vm_readv,
            json!(["pid", 0, 0, 0, 0, 0]),
            Outcome::Ok,
        ),
        case(
            "process_vm_writev",
            SYS_process_vm_writev,
            json!(["pid", 0, 0, 0, 0, 0]),
            Outcome::Ok,
        ),
        // Let through, the kernel answers for itself.
        case(
            "pidfd_getfd",
            SYS_pidfd_getfd,
            json!([-1, 0, 0]),
            Outcome::Errno(EBADF),
        ),
        case("mount", SYS_mount, json!([0, 0, 0, 0, 0]), eperm),
        case("kcmp", SYS_kcmp, json!(["pid", "pid", 0, 0, 0]), eperm),
        // It pages out as madvise does, debugger or not.
        case(
            "process_madvise",
            SYS_process_madvise,
            json!([-1, 0, 0, 0, 0]),
            eperm,
        ),
        case(
            "unshare_newuser",
            SYS_unshare,
            json!([CLONE_NEWUSER]),
            eperm,
        ),
    ];
    let results = attack(&cases, Some(&program(true)));
    for c in &cases {
        assert_eq!(
            results[c.name],
            c.confined,
            "{} with allow_ptrace:\n{}",
            c.name,
            table(&cases, &results)
        );
    }
}

/// Syscalls through a foreign ABI: the process dies with SIGSYS, it does not get an errno.
#[cfg(target_arch = "x86_64")]
mod foreign_abi {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn python(code: &str) -> Command {
        let mut cmd = Command::new(PYTHON);
        cmd.arg("-c").arg(code);
        cmd
    }

    #[test]
    fn x32_syscall_kills_the_process() {
        // getpid through the x32 ABI: the syscall number with bit 30 set.
        let code = "import ctypes\n\
                    libc = ctypes.CDLL(None, use_errno=True)\n\
                    libc.syscall(ctypes.c_long(0x40000000 | 39))\n\
                    print('alive')";
        let free = run(python(code), None);
        assert!(
            free.status.success() && free.stdout.starts_with(b"alive"),
            "without the filter the x32 call returns: {free:?}"
        );
        let confined = run(python(code), Some(&program(false)));
        assert_eq!(
            confined.status.signal(),
            Some(libc::SIGSYS),
            "under the filter: {confined:?}"
        );
        assert!(confined.stdout.is_empty());
    }

    #[test]
    fn i386_syscall_kills_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("int80.c");
        let binary = dir.path().join("int80");
        // getpid is 20 in the i386 table; int $0x80 enters the kernel with AUDIT_ARCH_I386 even
        // from a 64-bit process.
        std::fs::write(
            &source,
            "#include <stdio.h>\n\
             int main(void) {\n\
                 long ret;\n\
                 __asm__ volatile (\"int $0x80\" : \"=a\"(ret) : \"a\"(20L) : \"memory\");\n\
                 printf(\"%ld\\n\", ret);\n\
                 return 0;\n\
             }\n",
        )
        .unwrap();
        let gcc = Command::new("gcc")
            .arg("-O0")
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .output();
        match gcc {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!("gcc failed: {}", String::from_utf8_lossy(&out.stderr)),
            Err(err) => {
                eprintln!("skipped i386_syscall_kills_the_process: no gcc ({err})");
                return;
            }
        }

        let free = run(Command::new(&binary), None);
        let pid: Option<i64> = String::from_utf8_lossy(&free.stdout).trim().parse().ok();
        if !free.status.success() || !matches!(pid, Some(pid) if pid > 0) {
            eprintln!(
                "skipped i386_syscall_kills_the_process: this kernel has no i386 emulation \
                 ({free:?})"
            );
            return;
        }
        let confined = run(Command::new(&binary), Some(&program(false)));
        assert_eq!(
            confined.status.signal(),
            Some(libc::SIGSYS),
            "under the filter: {confined:?}"
        );
        assert!(confined.stdout.is_empty());
    }
}
