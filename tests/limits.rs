//! Resource limits (cgroups and rlimits), attacked from inside.

mod common;

use common::*;

#[test]
fn root_memory_limit_oom_kills_and_reports() {
    require_root!();
    let (v, code) = run_json(
        &["--memory", "64M"],
        &[
            "python3",
            "-c",
            "b = bytearray(300 << 20); print('survived')",
        ],
    );
    assert_eq!(v["oom_killed"], true, "{v}");
    assert_eq!(v["signal"], 9);
    assert_eq!(v["exit_code"], serde_json::Value::Null);
    assert_eq!(code, 137);
    assert!(!v["stdout"].as_str().unwrap().contains("survived"));
    let out = run(
        &["--memory", "64M"],
        &["python3", "-c", "b = bytearray(300 << 20)"],
    );
    assert_eq!(out.status.code(), Some(137));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("out of memory"), "{stderr}");
    // tmpfs pages count too: filling /dev/shm past the memory limit is an OOM, not a host problem.
    let (v, _) = run_json(
        &["--memory", "32M", "--disk", "256M"],
        &[
            "sh",
            "-c",
            "head -c 100000000 /dev/zero > /dev/shm/fill; echo wrote",
        ],
    );
    assert!(v["oom_killed"] == true || v["exit_code"] != 0, "{v}");
}

#[test]
fn root_socket_buffers_count_against_the_sandbox_not_the_host() {
    require_root!();
    // Datagrams on loopback sockets nobody reads, with raised buffers: cgroup v1
    // charges them to no one unless brig turns its socket accounting on, and they
    // took 2.2 GB of host memory (and the host-wide UDP and TCP pools) from a 64 MiB
    // sandbox. /proc/net/udp is the sandbox's own network namespace.
    let script = r#"
import socket
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data, sent, kept = b"x" * 60000, 0, []
for _ in range(100):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
    s.bind(("127.0.0.1", 0))
    kept.append(s)
    for _ in range(200):
        try:
            sent += tx.sendto(data, s.getsockname())
        except OSError:
            break
queued = sum(int(line.split()[4].split(":")[1], 16) for line in open("/proc/net/udp").readlines()[1:])
print(sent >> 20, queued >> 20)
"#;
    let (v, _) = run_json(&["--memory", "64M"], &["python3", "-c", script]);
    if v["oom_killed"] == true {
        return; // charged to the sandbox's memory itself (cgroup v2)
    }
    let stdout = v["stdout"].as_str().unwrap();
    let mut numbers = stdout.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    let (sent_mib, queued_mib) = (numbers.next().unwrap(), numbers.next().unwrap());
    assert!(sent_mib >= 500, "{v}");
    // Twice the memory limit at most (the socket buffers' own limit), and slack.
    assert!(queued_mib <= 160, "{queued_mib} MiB queued: {v}");
}

#[test]
fn root_memory_peak_is_measured() {
    require_root!();
    let (v, _) = run_json(
        &[],
        &[
            "python3",
            "-c",
            "b = bytearray(100 << 20); b[::4096] = b'x' * len(b[::4096])",
        ],
    );
    let peak = v["memory_peak_bytes"].as_u64().unwrap();
    assert!(peak >= 100 << 20, "peak {peak}");
    assert!(peak < 400 << 20, "peak {peak}");
}

#[test]
fn root_fork_bomb_is_stopped_by_pids_limit() {
    require_root!();
    let (v, _) = run_json(
        &["--pids", "20", "--timeout", "20s"],
        &[
            "python3",
            "-c",
            "import os,time\nn=0\nfor i in range(200):\n  try:\n    if os.fork()==0:\n      time.sleep(3); os._exit(0)\n    n+=1\n  except OSError:\n    pass\nprint(n)",
        ],
    );
    let forked: u32 = v["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{v}"));
    // init + python are 2 of the 20.
    assert!(forked <= 18, "forked {forked} with --pids 20");
    assert!(forked >= 5, "forking was not possible at all: {forked}");
    // A classic shell fork bomb ends at the timeout without hurting the host. The
    // top shell forks only before the bomb starts (its `sleep`, then a subshell that
    // runs the bomb) and then only waits: a shell that fails to fork exits (dash:
    // "Cannot fork", status 2), and were it the top one the run would end early.
    let (v, code) = run_json(
        &["--pids", "32", "--timeout", "2s"],
        &["sh", "-c", "sleep 10 & (b(){ b|b& }; b); wait"],
    );
    assert_eq!(code, 124, "{v}");
}

#[test]
fn root_cpu_bandwidth_is_limited() {
    require_root!();
    // Two busy threads for ~1.5 s wall under --cpus 0.5 get about 0.75 s of CPU.
    let spin = "import threading,time\nend=time.time()+1.5\ndef f():\n  while time.time()<end: pass\nts=[threading.Thread(target=f) for _ in range(2)]\n[t.start() for t in ts]\n[t.join() for t in ts]";
    let (v, _) = run_json(&["--cpus", "0.5"], &["python3", "-c", spin]);
    let cpu = v["cpu_time_ms"].as_u64().unwrap();
    assert!(
        cpu < 1200,
        "--cpus 0.5 let through {cpu} ms of CPU in 1.5 s"
    );
    // Only a sanity floor: other tests may load both CPUs at the same time.
    assert!(cpu > 50, "implausibly little CPU: {cpu} ms");
}

#[test]
fn root_cpu_time_and_file_size_rlimits() {
    require_root!();
    let (v, code) = run_json(
        &["--cpu-time", "1", "--cpus", "none"],
        &["python3", "-c", "while True: pass"],
    );
    // SIGXCPU at the soft limit.
    assert_eq!(v["signal"], 24, "{v}");
    assert_eq!(code, 128 + 24);
    let (out, _) = sh_with(
        &["--file-size", "1M"],
        "dd if=/dev/zero of=/tmp/big bs=1M count=4 2>/dev/null; stat -c %s /tmp/big",
    );
    assert_eq!(out.trim(), "1048576");
    let (out, _) = sh_with(&["--nofile", "64"], "ulimit -n; ulimit -c");
    assert_eq!(out, "64\n0\n");
}

#[test]
fn root_nofile_above_host_hard_limit_is_refused() {
    require_root!();
    let out = run(&["--nofile", "100000000"], &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hard limit"));
}

/// Takes `locks` POSIX locks in each of `processes` processes (ranges that do not
/// touch, 2,000 per file, so each is a lock object of its own), says so, then holds
/// them for `hold` seconds and reports how each process ended.
fn lock_taker(processes: u32, locks: u32, hold: f64) -> String {
    format!(
        r#"
import fcntl, os, sys, time
def take(tag):
    files = []
    for i in range({locks}):
        if i % 2000 == 0:
            files.append(open(f"/tmp/locks-{{tag}}-{{i}}", "w"))
        fcntl.lockf(files[-1], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * (i % 2000))
    print("locked", tag, flush=True)
    time.sleep({hold})
    return files
children = []
for tag in range({processes}):
    pid = os.fork()
    if pid == 0:
        take(tag)
        os._exit(0)
    children.append(pid)
for pid in children:
    _, status = os.waitpid(pid, 0)
    print("ended", os.WTERMSIG(status) if os.WIFSIGNALED(status) else "normally", flush=True)
"#
    )
}

#[test]
fn root_a_sandbox_over_its_lock_budget_loses_the_processes_holding_them() {
    require_root!();
    // Each lock is ~200 bytes of kernel memory no cgroup is charged for: a 64 MiB
    // sandbox took 1.5 GB of the host's with them. Its budget is one lock per 4 KiB
    // of its memory limit, 16,384 here.
    let started = std::time::Instant::now();
    let (v, code) = run_json(
        &["--memory", "64M", "--timeout", "90s"],
        &["python3", "-c", &lock_taker(1, 40_000, 55.0)],
    );
    // Killed while it takes them or once it holds them.
    let stdout = v["stdout"].as_str().unwrap();
    assert!(stdout.ends_with("ended 9\n"), "{v}");
    assert_eq!(v["file_locks_exceeded"], true, "{v}");
    // Taking the locks needs a second or two; held to the end, it takes 55 s.
    assert!(started.elapsed().as_secs() < 45, "{:?}", started.elapsed());
    assert_eq!(code, 0, "{v}");

    // Spread over four processes, each under the budget, the sandbox is over it.
    let (v, _) = run_json(
        &["--memory", "64M", "--timeout", "60s"],
        &["python3", "-c", &lock_taker(4, 6_000, 50.0)],
    );
    let stdout = v["stdout"].as_str().unwrap();
    assert_eq!(stdout.matches("ended 9").count(), 4, "{v}");
    assert_eq!(v["file_locks_exceeded"], true, "{v}");

    // The command itself: killed, and told why.
    let out = run(
        &["--memory", "64M", "--timeout", "60s"],
        &[
            "python3",
            "-c",
            "import fcntl, time\n\
             f = open('/tmp/l', 'w')\n\
             for i in range(30000): fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)\n\
             time.sleep(50)",
        ],
    );
    assert_eq!(out.status.code(), Some(137));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("file locks"), "{stderr}");

    // Within the budget nothing happens, however long the locks are held.
    let (v, code) = run_json(
        &["--memory", "64M"],
        &["python3", "-c", &lock_taker(2, 6_000, 1.5)],
    );
    let stdout = v["stdout"].as_str().unwrap();
    assert_eq!(stdout.matches("ended normally").count(), 2, "{v}");
    assert_eq!(v["file_locks_exceeded"], false, "{v}");
    assert_eq!(code, 0);
}

#[test]
fn root_counting_a_sandboxs_locks_takes_at_most_a_fifth_of_a_cpu() {
    require_root!();
    // A sandbox just under its budget (65,536 at 256 MiB) keeps the host's count above
    // it, so brig counts its locks at every check, and makes each count dear: 200
    // processes with 1,000 descriptors each, every one read. Counted every 250 ms,
    // that took brig 89% of a CPU, outside the sandbox's CPU limit; counts now come
    // back after five times what the last one took.
    let script = "import fcntl, os, sys, time\n\
        open('/tmp/f', 'w').close()\n\
        for p in range(200):\n\
        \x20   if os.fork() == 0:\n\
        \x20       kept = [os.open('/tmp/f', os.O_RDONLY) for _ in range(1000)]\n\
        \x20       time.sleep(60); os._exit(0)\n\
        files = []\n\
        for i in range(65531):\n\
        \x20   if i % 2000 == 0: files.append(open(f'/tmp/l{i}', 'w'))\n\
        \x20   fcntl.lockf(files[-1], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * (i % 2000))\n\
        time.sleep(2)\n\
        print('ready', flush=True)\n\
        time.sleep(12)\n\
        os._exit(0)\n";
    let mut child = brig()
        .args(["run", "--memory", "256M", "--timeout", "60s", "--"])
        .args(["python3", "-c", script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "ready\n");
    let cpu_ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        // utime and stime: fields 14 and 15, the 12th and 13th after the name.
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let before = cpu_ticks();
    std::thread::sleep(std::time::Duration::from_secs(10));
    let used = cpu_ticks() - before;
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    // 10 s is 1,000 ticks of 10 ms; a fifth is 200, with room for the machine's noise.
    assert!(used < 300, "brig used {used} ticks of CPU in 10 s");
}
