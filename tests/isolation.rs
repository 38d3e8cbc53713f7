//! Every isolation guarantee of `brig run`, attacked from inside a sandbox.
//! Each test states the attack, runs it, and asserts it fails.

mod common;

use common::*;

// 1. Namespaces -------------------------------------------------------------

#[test]
fn root_pid1_is_brig_init_and_host_processes_are_invisible() {
    require_root!();
    let host_pid = std::process::id();
    let (out, _) = sh(&format!(
        "cat /proc/1/comm; echo $$; ls /proc | grep -c '^[0-9]'; kill -0 {host_pid} 2>/dev/null && echo host-visible; ps -e | wc -l"
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "brig", "PID 1 must be brig's init: {out}");
    assert_eq!(lines[1], "2", "the command is PID 2: {out}");
    assert!(
        lines[2].parse::<u32>().unwrap() <= 5,
        "only the sandbox's processes: {out}"
    );
    assert!(!out.contains("host-visible"));
    // header + init + sh + ps + wc at most
    assert!(lines[3].parse::<u32>().unwrap() <= 6, "{out}");
}

#[test]
fn root_inits_command_line_shows_none_of_the_clis_arguments() {
    require_root!();
    // Init is a clone of the CLI and the sandbox may read /proc/1/cmdline: the CLI's
    // arguments (host paths of binds, environment values) must not be there.
    let host_dir = std::env::temp_dir().join(unique("brig-secret-host-path"));
    std::fs::create_dir_all(&host_dir).unwrap();
    let bind = format!("{}:/mnt/data", host_dir.display());
    let (out, code) = sh_with(
        &["--bind", &bind, "--env", "MARKER=s3cr3t-env-value"],
        "tr '\\0' '\\n' < /proc/1/cmdline | grep -v '^$'; echo \"env:$MARKER\"; test -d /mnt/data && echo bound",
    );
    std::fs::remove_dir(&host_dir).unwrap();
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["brig-init", "env:s3cr3t-env-value", "bound"],
        "init's command line must be its title alone, the CLI's arguments still applied"
    );
}

#[test]
fn root_sandbox_ids_map_to_unprivileged_unique_host_ids() {
    require_root!();
    let (out, _) = sh("cat /proc/self/uid_map /proc/self/gid_map");
    let fields: Vec<u64> = out.split_whitespace().map(|f| f.parse().unwrap()).collect();
    assert_eq!(
        fields.len(),
        6,
        "exactly one uid and one gid mapping: {out}"
    );
    assert_eq!((fields[0], fields[2]), (1000, 1));
    assert_ne!(fields[1], 0, "never host root");
    assert!(fields[1] >= 1_000_000, "not a normal host user: {out}");
    // Root inside is still an unprivileged host id.
    let (out, _) = sh_with(&["--user", "0"], "cat /proc/self/uid_map");
    let host: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_ne!(host, 0);

    // Concurrent sandboxes get distinct host ids: each marks its start in a shared
    // workspace and runs until all four have (or for a minute).
    let shared = tempfile::tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let ws = shared.path().to_str().unwrap().to_string();
            std::thread::spawn(move || {
                let script = format!(
                    "touch /workspace/up{i}; n=0; \
                     while [ $(ls /workspace | wc -l) -lt 4 ] && [ $n -lt 3000 ]; \
                     do sleep 0.02; n=$((n + 1)); done; ls /workspace | wc -l"
                );
                let (v, _) = run_json(&["--workspace", &ws], &["sh", "-c", &script]);
                assert_eq!(v["stdout"].as_str().unwrap().trim(), "4", "{v}");
                v["enforced"]["identity"]["host_uid"].as_u64().unwrap()
            })
        })
        .collect();
    let mut ids: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        4,
        "concurrent sandboxes shared a host uid: {ids:?}"
    );

    // A custom range is honoured.
    let (v, _) = run_json(&["--id-range", "2100000000-2100000009"], &["true"]);
    let id = v["enforced"]["identity"]["host_uid"].as_u64().unwrap();
    assert!((2_100_000_000..=2_100_000_009).contains(&id));
}

#[test]
fn root_network_is_loopback_only() {
    require_root!();
    // A listener on the host's loopback is not reachable from the sandbox's.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (out, _) = py(
        &[],
        &format!(
            "import socket,os\n\
             print(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else 'nosys')\n\
             print(open('/proc/net/dev').read().count(':'))\n\
             s=socket.socket()\n\
             try:\n  s.connect(('127.0.0.1',{port})); print('REACHED')\n\
             except OSError as e: print('refused', e.errno)\n\
             # its own loopback works\n\
             a=socket.socket(); a.bind(('127.0.0.1',0)); a.listen(); b=socket.create_connection(a.getsockname()); print('lo-ok')\n\
             try:\n  socket.create_connection(('10.0.0.1',80),timeout=1); print('OUT')\n\
             except OSError as e: print('no-route')\n"
        ),
    );
    assert!(!out.contains("REACHED") && !out.contains("OUT"), "{out}");
    assert!(
        out.contains("refused") && out.contains("lo-ok") && out.contains("no-route"),
        "{out}"
    );
    let interfaces: u32 = out.lines().nth(1).unwrap().trim().parse().unwrap();
    assert_eq!(interfaces, 1, "only lo: {out}");
    drop(listener);
}

#[test]
fn root_host_abstract_and_path_unix_sockets_are_unreachable() {
    require_root!();
    use std::os::linux::net::SocketAddrExt;
    let name = unique("brig-test-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let path = dir.path().join("host.sock");
    let _path_listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (out, _) = py(
        &[],
        &format!(
            "import socket,os\n\
             s=socket.socket(socket.AF_UNIX)\n\
             try:\n  s.connect('\\0{name}'); print('ABSTRACT-REACHED')\n\
             except OSError as e: print('abstract-refused')\n\
             print(os.path.exists('{}'))\n",
            path.display()
        ),
    );
    assert_eq!(out, "abstract-refused\nFalse\n");
}

#[test]
fn root_ipc_and_uts_are_private() {
    require_root!();
    let host_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let key = format!("0x{:x}", 0x4b1d0000u32 + std::process::id() % 0xffff);
    let created = std::process::Command::new("ipcmk")
        .args(["-M", "4096", "-p", "0600", "-k", &key])
        .output();
    let (out, _) = sh("ipcs -m | grep -c 0x || true; hostname");
    assert!(out.starts_with("0\n"), "host SysV IPC visible: {out}");
    assert!(out.ends_with("sandbox\n"));
    assert_ne!(host_hostname.trim(), "sandbox");
    if let Ok(o) = created {
        let id = String::from_utf8_lossy(&o.stdout);
        if let Some(id) = id.split_whitespace().last() {
            let _ = std::process::Command::new("ipcrm")
                .args(["-m", id])
                .status();
        }
    }
}

#[test]
fn root_init_reaps_orphans_and_everything_dies_with_the_command() {
    require_root!();
    // Orphans that exit must not stay zombies.
    let (out, _) = py(
        &[],
        "import os,time\n\
         for i in range(5):\n  if os.fork()==0:\n    if os.fork()==0: os._exit(0)\n    os._exit(0)\n\
         for _ in range(5):\n  try: os.waitpid(-1,0)\n  except ChildProcessError: break\n\
         def zombies():\n  z=[]\n  for p in os.listdir('/proc'):\n    try:\n      if p.isdigit() and open('/proc/'+p+'/stat').read().split(')')[1].split()[0]=='Z': z.append(p)\n    except OSError: pass\n  return z\n\
         for _ in range(3000):\n  if not zombies(): break\n  time.sleep(0.02)\n\
         left = zombies()\n\
         print('zombies', len(left))\n\
         for p in left:\n  try: print(open('/proc/'+p+'/stat').read().strip())\n  except OSError: pass\n",
    );
    // Any zombie left is shown with its stat line (name, parent), to tell whose it is.
    assert!(out.starts_with("zombies 0\n"), "{out}");
    // A daemonized process (new session, ignores HUP) dies when the command ends.
    let marker = "76543.21";
    let (_, code) = sh(&format!(
        "setsid nohup sleep {marker} >/dev/null 2>&1 & exit 0"
    ));
    assert_eq!(code, 0);
    assert!(
        eventually(60_000, || processes_with(marker).is_empty()),
        "daemonized process outlived the sandbox"
    );
}

/// Takes every inotify instance the kernel gives it, says how many, and holds them
/// until its stdin closes.
const INOTIFY_HOG: &str = "import ctypes, sys\n\
    libc = ctypes.CDLL(None)\n\
    n = 0\n\
    while libc.inotify_init1(0) >= 0: n += 1\n\
    print(n, flush=True)\n\
    sys.stdin.read()\n";

/// Whether one more inotify instance can be had, as host root or in a sandbox.
const ONE_INOTIFY: &str = "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)";

#[test]
fn root_per_user_kernel_counts_are_the_sandboxs_own_not_roots() {
    require_root!();
    // The kernel charges per-user counts (queued signals, inotify instances,
    // processes) up to the owner of the sandbox's user namespace: that must be the
    // sandbox's own unprivileged uid, never root.
    let (out, code) = py(
        &[],
        "import fcntl, os, struct\n\
         fd = os.open('/proc/self/ns/user', os.O_RDONLY)\n\
         owner = struct.unpack('I', fcntl.ioctl(fd, 0xb704, bytes(4)))[0]\n\
         print(owner, os.getuid())\n",
    );
    assert_eq!(code, 0, "{out}");
    let ids: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(ids.len(), 2, "{out}");
    assert_eq!(
        ids[0], ids[1],
        "the namespace's owner (NS_GET_OWNER_UID) is: {out}"
    );

    // The attack: one sandbox takes all the inotify instances it can get and holds
    // them. Root on the host and another sandbox must still get theirs.
    let mut hog = brig()
        .args(["run", "--", "python3", "-c", INOTIFY_HOG])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut taken = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(hog.stdout.as_mut().unwrap()),
        &mut taken,
    )
    .unwrap();
    let taken: u64 = taken.trim().parse().unwrap_or(0);
    let host = std::process::Command::new("python3")
        .args(["-c", ONE_INOTIFY])
        .output()
        .unwrap();
    let (other, _) = py(&[], ONE_INOTIFY);
    drop(hog.stdin.take());
    let status = hog.wait().unwrap();
    assert!(taken > 0, "the hog got none");
    assert_eq!(
        String::from_utf8_lossy(&host.stdout),
        "True\n",
        "host root got no inotify instance while a sandbox held {taken}"
    );
    assert_eq!(
        other, "True\n",
        "another sandbox got none while one held {taken}"
    );
    assert!(status.success(), "{status}");
}

// 2. Filesystem ---------------------------------------------------------------

#[test]
fn root_pivot_root_hides_the_host_tree() {
    require_root!();
    let marker = tempfile::Builder::new()
        .prefix("brig-host-marker")
        .tempfile_in("/tmp")
        .unwrap();
    let name = marker
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let (out, _) = sh(&format!(
        "ls /tmp | grep -c {name}; for p in /root /home /var/lib /run /boot /mnt /srv /etc/shadow /etc/ssh /etc/sudoers /etc/gshadow; do [ -e $p ] && echo visible:$p; done; \
         grep -c ' / / ' /proc/self/mountinfo; awk '$5==\"/\"{{for(i=7;i<=NF;i++) if($i==\"-\"){{print $(i+1); break}}}}' /proc/self/mountinfo; \
         cat /proc/self/mountinfo | grep -c '/oldroot\\|/tmp/.brig' ; ls /sys | wc -l; echo end"
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0", "host /tmp visible: {out}");
    assert!(!out.contains("visible:"), "{out}");
    assert_eq!(lines[1], "1", "exactly one root mount: {out}");
    assert_eq!(
        lines[2], "tmpfs",
        "root is brig's tmpfs, not the host's: {out}"
    );
    assert_eq!(lines[3], "0", "no trace of the old root: {out}");
    assert_eq!(lines[4], "0", "/sys is empty: {out}");
    // pivot_root, not chroot: there is no way back to the host root through "..".
    let (out, _) = py(&[], "import os\nos.chdir('/')\nfor _ in range(10): os.chdir('..')\nprint(sorted(os.listdir('.'))==sorted(os.listdir('/')))");
    assert_eq!(out, "True\n");
}

/// Root's runs bind one cached /etc tree into every sandbox that needs the same one
/// (brig-jail's `etccache`): root inside one sandbox must not be able to change
/// what the next one sees, and sandboxes that differ get their own tree.
#[test]
fn shared_etc_cannot_be_changed_from_inside_and_is_per_sandbox_identity() {
    require_root!();
    let (before, _) = sh("cat /etc/passwd /etc/hosts; ls -a /etc | tr '\\n' ' '");
    let (out, _) = sh_with(
        &["--user", "0"],
        "cd /etc; for step in 'echo x >> passwd' 'echo x > new' 'chmod 666 hosts' 'rm -f hosts' \
         'mv hostname h2' 'ln -s /x link' 'mkdir d' 'touch -d 2001-01-01 passwd' 'chown 0 passwd'; do \
         sh -c \"$step\" 2>/dev/null && echo CHANGED:$step; done; true",
    );
    assert!(!out.contains("CHANGED"), "{out}");
    let (after, _) = sh("cat /etc/passwd /etc/hosts; ls -a /etc | tr '\\n' ' '");
    assert_eq!(before, after);
    assert!(before.contains("sandbox:x:1000:1000:"), "{before}");

    let (one, _) = sh_with(&["--hostname", "first-box"], "cat /etc/hostname /etc/hosts");
    let (two, _) = sh_with(
        &["--hostname", "second-box", "--user", "1234"],
        "cat /etc/hostname /etc/hosts; grep -c :1234: /etc/passwd",
    );
    assert!(
        one.starts_with("first-box\n") && !one.contains("second-box"),
        "{one}"
    );
    assert!(
        two.starts_with("second-box\n") && !two.contains("first-box"),
        "{two}"
    );
    assert!(two.trim_end().ends_with('1'), "{two}");
}

#[test]
fn root_system_dirs_are_read_only_nosuid_nodev() {
    require_root!();
    let (out, _) = sh_with(
        &["--user", "0"],
        "for p in /usr/x /bin/x /etc/x /x /proc/sys/kernel/hostname /dev/x; do (echo x > $p) 2>/dev/null && echo WROTE:$p; done; \
         grep -E ' /usr ' /proc/self/mountinfo | grep -o 'ro,nosuid,nodev' | head -1",
    );
    assert!(!out.contains("WROTE"), "{out}");
    assert_eq!(out.trim(), "ro,nosuid,nodev");
}

#[test]
fn root_etc_is_synthesized_without_host_secrets() {
    require_root!();
    let (out, _) = sh("cat /etc/passwd; ls /etc | tr '\\n' ' '; getent hosts localhost | head -1");
    assert!(out.contains("sandbox:x:1000:1000:"), "{out}");
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    for user in host_passwd.lines().filter_map(|l| l.split(':').next()) {
        if !["root", "nobody"].contains(&user) {
            assert!(
                !out.contains(&format!("\n{user}:")),
                "host user {user} leaked"
            );
        }
    }
    for secret in [
        "shadow",
        "gshadow",
        "sudoers",
        "ssh ",
        "subuid",
        "machine-id",
    ] {
        assert!(
            !out.contains(&format!(" {secret}")),
            "{secret} present: {out}"
        );
    }
    assert!(out.contains("ld.so.cache") && out.contains("resolv.conf"));
    assert!(out.contains("127.0.0.1") || out.contains("::1"), "{out}");
    // TLS roots are there for libraries that need them.
    let (out, _) = py(
        &[],
        "import ssl; print(len(ssl.create_default_context().get_ca_certs()) >= 0)",
    );
    assert_eq!(out, "True\n");
}

#[test]
fn root_proc_is_fresh_and_masked() {
    require_root!();
    let (out, _) = sh(
        "cat /proc/kcore 2>/dev/null | wc -c; cat /proc/keys 2>/dev/null | wc -c; cat /proc/timer_list 2>/dev/null | wc -c; \
         ls /proc/acpi 2>/dev/null | wc -l; echo 1 > /proc/sysrq-trigger 2>/dev/null && echo SYSRQ; \
         echo 0 > /proc/sys/kernel/randomize_va_space 2>/dev/null && echo SYSCTL; echo end",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..4], &["0", "0", "0", "0"], "{out}");
    assert!(!out.contains("SYSRQ") && !out.contains("SYSCTL"), "{out}");
}

#[test]
fn root_dev_is_minimal() {
    require_root!();
    let (out, _) = sh("ls /dev | tr '\\n' ' '; echo; head -c 4 /dev/urandom | wc -c; echo x > /dev/null && echo null-ok; python3 -c 'import os; m,s=os.openpty(); print(\"pty-ok\")'");
    let listing: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    let mut sorted = listing.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![
            "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
            "tty", "urandom", "zero"
        ],
        "{out}"
    );
    assert!(out.contains("\n4\nnull-ok\npty-ok\n"), "{out}");
    // No block devices, no mknod.
    let (out, _) = sh_with(
        &["--user", "0"],
        "mknod /tmp/sda b 8 0 2>/dev/null && echo MKNOD; ls /dev/vda 2>/dev/null; echo end",
    );
    assert_eq!(out, "end\n");
    // Terminals come from a pool every private devpts on the host shares: one
    // sandbox gets at most 64 of them.
    let (out, _) = py(
        &[],
        "import os\nn = 0\ntry:\n    while True: os.openpty(); n += 1\nexcept OSError as e: print(n, e.errno)\n",
    );
    assert_eq!(out, "64 28\n", "{out}"); // ENOSPC
}

#[test]
fn root_writable_storage_is_capped_together() {
    require_root!();
    // 8 MiB for /tmp, /workspace and /dev/shm together.
    let (out, _) = sh_with(
        &["--disk", "8M"],
        "dd if=/dev/zero of=/tmp/a bs=1M count=5 2>/dev/null; dd if=/dev/zero of=/workspace/b bs=1M count=5 2>/dev/null || echo ws-full; \
         dd if=/dev/zero of=/dev/shm/c bs=1M count=1 2>/dev/null || echo shm-full; du -sm /tmp/a | cut -f1",
    );
    assert!(out.contains("ws-full") && out.contains("shm-full"), "{out}");
}

// 3. Privileges ---------------------------------------------------------------

#[test]
fn root_no_capabilities_no_new_privs_setuid_gives_nothing() {
    require_root!();
    for user in ["1000", "0"] {
        let (out, _) = sh_with(
            &["--user", user],
            "grep -E '^(Cap|NoNewPrivs)' /proc/self/status",
        );
        for line in out.lines() {
            let value = line.split_whitespace().nth(1).unwrap();
            if line.starts_with("NoNewPrivs") {
                assert_eq!(value, "1");
            } else {
                assert!(value.chars().all(|c| c == '0'), "user {user}: {line}");
            }
        }
        assert_eq!(out.lines().count(), 6);
    }
    // setuid-root binaries from the host run without privilege.
    let (out, _) = sh("ls -l /usr/bin/su | cut -c1-10; su -c id root </dev/null 2>&1 | head -1; mount -t tmpfs x /tmp 2>&1 | head -1; id -u");
    assert!(out.ends_with("1000\n"), "{out}");
    assert!(!out.contains("uid=0"), "{out}");
    let (out, _) = sh_with(&["--user", "0"], "unshare -U -r true 2>/dev/null && echo UNSHARED; chroot / true 2>/dev/null && echo CHROOT; echo end");
    assert_eq!(out, "end\n");
}

// 4. seccomp (the filter itself is attacked syscall by syscall in brig-jail's tests) --

#[test]
fn root_seccomp_blocks_escapes_from_inside() {
    require_root!();
    let (out, _) = py(
        &[],
        "import ctypes,errno,os\n\
         libc=ctypes.CDLL(None,use_errno=True)\n\
         def t(name,nr,*a):\n  r=libc.syscall(nr,*a); print(name, r, ctypes.get_errno())\n\
         t('unshare',272,0x10000000)\n\
         t('io_uring_setup',425,8,0)\n\
         t('bpf',321,0,0,0)\n\
         t('userfaultfd',323,0)\n\
         t('keyctl',250,0,0,0)\n\
         t('clone3',435,0,0)\n\
         t('ptrace',101,0,0,0,0)\n\
         ctx=ctypes.c_ulong(0)\n\
         t('io_setup',206,1,ctypes.byref(ctx))\n",
    );
    let expect = "unshare -1 1\nio_uring_setup -1 1\nbpf -1 1\nuserfaultfd -1 1\nkeyctl -1 1\nclone3 -1 38\nptrace -1 1\nio_setup -1 38\n";
    assert_eq!(out, expect);
    // x32 syscalls kill the process.
    let (v, code) = run_json(
        &[],
        &[
            "python3",
            "-c",
            "import ctypes; ctypes.CDLL(None).syscall(0x40000000|39)",
        ],
    );
    assert_eq!(v["signal"], 31, "{v}");
    assert_eq!(code, 128 + 31);
    // ptrace can be allowed for debuggers.
    let (out, _) = py(
        &["--allow-ptrace"],
        "import ctypes; print(ctypes.CDLL(None).syscall(101,0,0,0,0))",
    );
    assert_eq!(out, "0\n");
}

#[test]
fn root_a_sandbox_cannot_evict_the_page_cache_it_shares() {
    require_root!();
    // posix_fadvise(DONTNEED) drops a file's clean pages from the page cache, whoever
    // else reads them: a sandbox evicted the host's Python, which every sandbox shares,
    // and made their starts 2.8x slower. Here the shared file is a host file bound
    // read-only; the host's system dirs and image layers are shared the same way.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared");
    std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
    // Written back, so that its pages are clean: the advice drops only those.
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    // Bytes of the file in the page cache (mincore over a mapping of it), after an
    // optional posix_fadvise(DONTNEED) from the host.
    let cached = |path: &std::path::Path, drop_first: bool| {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import ctypes, mmap, os, sys\n\
                 fd = os.open(sys.argv[1], os.O_RDONLY)\n\
                 if sys.argv[2] == 'drop': os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n\
                 size = os.fstat(fd).st_size; pages = (size + 4095) // 4096\n\
                 libc = ctypes.CDLL(None, use_errno=True)\n\
                 libc.mmap.restype = ctypes.c_void_p\n\
                 libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
                 libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]\n\
                 addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)\n\
                 vec = (ctypes.c_ubyte * pages)()\n\
                 assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()\n\
                 print(sum(b & 1 for b in vec) * 4096)\n",
            ])
            .arg(path)
            .arg(if drop_first { "drop" } else { "keep" })
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{text} {}", String::from_utf8_lossy(&out.stderr)))
    };
    std::fs::read(&path).unwrap();
    assert_eq!(cached(&path, false), 4 << 20);
    let bind = format!("{}:/shared:ro", dir.path().display());
    let (out, code) = py(
        &["--bind", &bind],
        "import mmap, os\n\
         fd = os.open('/shared/shared', os.O_RDONLY)\n\
         m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)\n\
         total = sum(m[i] for i in range(0, len(m), 4096))\n\
         for advice in (21, 20):  # MADV_PAGEOUT, MADV_COLD\n    m.madvise(advice)\n\
         m.close()\n\
         print('madvised')\n\
         print('fadvise', os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))\n",
    );
    assert_eq!((out.as_str(), code), ("madvised\nfadvise None\n", 0));
    assert_eq!(
        cached(&path, false),
        4 << 20,
        "the sandbox evicted a shared file"
    );
    // The same advice from the host does evict: the file could have been dropped.
    assert_eq!(cached(&path, true), 0);
}

#[test]
fn root_a_sandbox_cannot_probe_which_pages_of_shared_files_are_cached() {
    require_root!();
    // mincore (of a mapping), cachestat (of a file) and preadv2/pwritev2 with RWF_NOWAIT
    // (EAGAIN for a page not cached) tell which pages of a file are in the page cache:
    // of a file other sandboxes read, what they read lately. The kernel answers the first
    // two for files the caller owns or could write, which in an image sandbox is every
    // layer file (idmapped to the sandbox); here the shared file is a host file bound
    // writable. They are refused as by a kernel without them; plain preadv2 still reads.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("shared");
    std::fs::write(&path, "shared!").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let bind = format!("{}:/shared:rw", dir.path().display());
    let (out, code) = py(
        &["--bind", &bind],
        "import ctypes, errno, mmap, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.syscall.restype = ctypes.c_long\n\
         libc.mmap.restype = ctypes.c_void_p\n\
         libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
         libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]\n\
         def name(e): return 'EOPNOTSUPP' if e == errno.EOPNOTSUPP else errno.errorcode[e]\n\
         def result(r): return 'answered' if r == 0 else name(ctypes.get_errno())\n\
         fd = os.open('/shared/shared', os.O_RDWR)\n\
         addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)\n\
         print('mincore', result(libc.mincore(addr, 4096, ctypes.create_string_buffer(1))))\n\
         span, stat = (ctypes.c_uint64 * 2)(0, 0), (ctypes.c_uint64 * 5)()\n\
         print('cachestat', result(libc.syscall(ctypes.c_long(451), fd, span, stat, 0)))\n\
         for call_name, call in (('preadv2', lambda flags: os.preadv(fd, [bytearray(7)], 0, flags)),\n\
         \x20                       ('pwritev2', lambda flags: os.pwritev(fd, [b'shared!'], 0, flags))):\n\
         \x20   try: print(call_name, 'nowait', call(os.RWF_NOWAIT))\n\
         \x20   except OSError as e: print(call_name, 'nowait', name(e.errno))\n\
         buf = bytearray(7)\n\
         print('preadv2', os.preadv(fd, [buf], 0, 0), bytes(buf))\n\
         print('preadv2 hipri', os.preadv(fd, [buf], 0, os.RWF_HIPRI))\n",
    );
    assert_eq!(
        (out.as_str(), code),
        (
            "mincore ENOSYS\ncachestat ENOSYS\npreadv2 nowait EOPNOTSUPP\n\
             pwritev2 nowait EOPNOTSUPP\npreadv2 7 b'shared!'\npreadv2 hipri 7\n",
            0
        )
    );
}

#[test]
fn root_open_file_description_locks_are_refused_and_posix_locks_work() {
    require_root!();
    // An OFD lock belongs to an open file, which can sit in a unix socket's queue held
    // by no process, where brig's count of a sandbox's locks cannot see it (see
    // `brig_jail::locks`). They are refused as on kernels before 3.15; POSIX locks,
    // flock and SQLite work.
    let (out, code) = py(
        &[],
        "import fcntl, sqlite3, struct\n\
         f = open('/tmp/f', 'w')\n\
         lock = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 1, 0)\n\
         for cmd in ('F_OFD_GETLK', 'F_OFD_SETLK', 'F_OFD_SETLKW'):\n\
         \x20   try: fcntl.fcntl(f, getattr(fcntl, cmd), lock); print(cmd, 'worked')\n\
         \x20   except OSError as e: print(cmd, e.errno)\n\
         fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); fcntl.flock(open('/tmp/g', 'w'), fcntl.LOCK_EX)\n\
         db = sqlite3.connect('/tmp/db'); db.execute('create table t(x)'); db.execute('insert into t values (1)'); db.commit()\n\
         print('sqlite', db.execute('select x from t').fetchall())\n",
    );
    assert_eq!(
        (out.as_str(), code),
        (
            "F_OFD_GETLK 22\nF_OFD_SETLK 22\nF_OFD_SETLKW 22\nsqlite [(1,)]\n",
            0
        )
    );
}

// 5. Landlock -----------------------------------------------------------------

#[test]
fn root_landlock_denies_writes_outside_writable_mounts() {
    require_root!();
    // /proc/self/comm is writable by its owner as far as mounts and permissions go;
    // only Landlock stands in the way.
    let attack = "(echo pwned > /proc/self/comm) 2>/dev/null && echo WROTE || echo denied";
    let (out, _) = sh(attack);
    assert_eq!(out, "denied\n");
    let (out, _) = sh_with(&["--landlock", "off"], attack);
    assert_eq!(
        out, "WROTE\n",
        "the attack must work without Landlock, or this test proves nothing"
    );
    let (v, code) = run_json(&["--landlock", "required"], &["true"]);
    assert_eq!(code, 0);
    assert_eq!(v["enforced"]["landlock"]["status"], "fully_enforced");
    assert_eq!(
        v["enforced"]["landlock"]["kernel_abi"]
            .as_u64()
            .map(|a| a >= 1),
        Some(true)
    );
}
