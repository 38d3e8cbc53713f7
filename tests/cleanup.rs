//! After every kind of end, nothing of the sandbox is left: no process, mount,
//! cgroup or temporary directory.

mod common;

use std::process::Stdio;

use common::*;

fn host_mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count()
}

fn tmp_entries() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("brig"))
        .collect()
}

#[test]
fn root_nothing_left_after_normal_timeout_oom_and_failure() {
    require_root!();
    let mounts_before = host_mounts();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec![], vec!["true"]),
        (vec!["--timeout", "300ms"], vec!["sleep", "30"]),
        (
            vec!["--memory", "32M"],
            vec!["python3", "-c", "b=bytearray(200<<20)"],
        ),
        (vec![], vec!["no-such-binary"]),
        (
            vec!["--pids", "8"],
            vec![
                "sh",
                "-c",
                "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 5 & done; wait",
            ],
        ),
    ];
    for (args, cmd) in cases {
        let (v, _) = run_json(&args, &cmd);
        let leaves = leaves(&v);
        assert!(!leaves.is_empty(), "{args:?}: no cgroup reported");
        for leaf in leaves {
            assert!(
                !std::path::Path::new(&leaf).exists(),
                "{args:?}: cgroup {leaf} left behind"
            );
        }
    }
    assert_eq!(host_mounts(), mounts_before, "host mount table changed");
}

/// The pid of brig's sandbox init (brig's child that is not the watchdog).
fn sandbox_init(brig_pid: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{brig_pid}/task/{brig_pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() != "brig-watchdog")
                .unwrap_or(false)
        })
}

fn cgroup_dirs_of(pid: u32) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut dirs = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        if !path.contains("brig-") {
            continue;
        }
        let dir = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}")
        } else {
            let mount = controllers.split(',').next().unwrap_or("");
            format!("/sys/fs/cgroup/{mount}{path}")
        };
        if std::path::Path::new(&dir).exists() {
            dirs.push(dir);
        }
    }
    dirs
}

/// Starts `brig run` with a long-sleeping command and waits until it runs.
fn start_sleeper(marker: &str, extra: &str) -> (std::process::Child, u32, Vec<String>) {
    let child = brig()
        .args(["run", "--timeout", "60s", "--", "sh", "-c"])
        .arg(format!(
            "{extra} sleep {marker} & sleep {marker}; echo after"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let brig_pid = child.id();
    // brig, its watchdog and the sandbox's init carry the marker in their command
    // lines from the start: wait for the two sleeps themselves, which only run once
    // the sandbox (its cgroup included) is complete.
    let sleeping = || {
        processes_with(marker)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "sleep")
            })
            .count()
    };
    assert!(
        eventually(5000, || sleeping() >= 2),
        "sandbox did not start"
    );
    let init = sandbox_init(brig_pid).expect("sandbox init");
    let dirs = cgroup_dirs_of(init);
    assert!(!dirs.is_empty(), "sandbox has no cgroup");
    (child, init, dirs)
}

#[test]
fn root_sigkill_of_brig_leaves_nothing() {
    require_root!();
    let marker = "8765.4321";
    let mounts_before = host_mounts();
    let tmp_before = tmp_entries();
    let (mut child, init, dirs) = start_sleeper(marker, "");
    send_signal(child.id(), "KILL");
    let _ = child.wait();
    assert!(
        eventually(5000, || processes_with(marker).is_empty()),
        "sandbox processes survived SIGKILL of brig"
    );
    assert!(
        eventually(5000, || !std::path::Path::new(&format!("/proc/{init}"))
            .exists()),
        "init survived"
    );
    assert!(
        eventually(5000, || dirs
            .iter()
            .all(|d| !std::path::Path::new(d).exists())),
        "cgroups left behind: {dirs:?}"
    );
    assert!(
        eventually(5000, || processes_with("brig-watchdog").is_empty()
            || !watchdog_running()),
        "watchdog still running"
    );
    assert_eq!(host_mounts(), mounts_before);
    assert_eq!(tmp_entries(), tmp_before);
}

fn watchdog_running() -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("comm"))
            .map(|c| c.trim() == "brig-watchdog")
            .unwrap_or(false)
            && std::fs::read_to_string(e.path().join("stat"))
                .map(|s| !s.contains(") Z"))
                .unwrap_or(false)
    })
}

#[test]
fn root_sigterm_and_sigint_to_brig_reach_the_command_and_clean_up() {
    require_root!();
    for (number, name) in [(15, "TERM"), (2, "INT")] {
        let marker = format!("7654.{number}");
        let (child, init, dirs) =
            start_sleeper(&marker, &format!("trap 'echo got-{name}; exit 7' {name};"));
        send_signal(child.id(), name);
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        // sh runs the trap once its foreground sleep ends (killed with the sandbox at
        // the grace deadline at the latest); either way brig ends promptly.
        assert!(
            out.status.code().is_some(),
            "brig died from the signal instead of handling it"
        );
        let _ = stdout;
        assert!(eventually(5000, || processes_with(&marker).is_empty()));
        assert!(eventually(5000, || !std::path::Path::new(&format!(
            "/proc/{init}"
        ))
        .exists()));
        assert!(
            eventually(5000, || dirs
                .iter()
                .all(|d| !std::path::Path::new(d).exists())),
            "{dirs:?}"
        );
    }
}

#[test]
fn root_signal_is_forwarded_to_a_command_that_handles_it() {
    require_root!();
    let child = brig()
        .args(["run", "--json", "--", "python3", "-c"])
        .arg("import signal,sys,time\nprint('ready', flush=True)\nsignal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(3)))\ntime.sleep(30)")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Sent before python has its handler, the signal kills it before it prints (a
    // fixed pause was not always enough on a loaded machine): wait until its
    // SigCgt has SIGTERM, which it sets after printing "ready".
    let python_handles_term = |pid: &u32| {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|line| line.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        comm.trim() == "python3" && caught & (1 << (15 - 1)) != 0
    };
    assert!(eventually(20_000, || processes_with("time.sleep(30)")
        .iter()
        .any(python_handles_term)));
    send_signal(pid, "TERM");
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "ready\ngot TERM\n");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(out.status.code(), Some(3));
}

/// The sandbox's cgroup is removed even when a process from outside was moved into
/// it (by root, on the host) and outlives the sandbox: it counts as the sandbox's and
/// is killed, as a straggler would be, instead of leaving the cgroup behind.
#[test]
fn root_a_process_moved_into_the_cgroup_from_outside_does_not_keep_it() {
    require_root!();
    let marker = "8765.1357";
    let mut brig = brig()
        .args(["run", "--", "sh", "-c"])
        .arg(format!("sleep {marker} & sleep 1.5; kill $!"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(5000, || processes_with(marker)
            .iter()
            .any(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep"))),
        "sandbox did not start"
    );
    let init = sandbox_init(brig.id()).expect("sandbox init");
    let dirs = cgroup_dirs_of(init);
    assert!(!dirs.is_empty(), "sandbox has no cgroup");
    let mut stranger = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    for dir in &dirs {
        std::fs::write(format!("{dir}/cgroup.procs"), stranger.id().to_string()).unwrap();
    }
    let status = brig.wait().unwrap();
    assert!(status.code().is_some(), "brig did not end by itself");
    // brig returns only once its cgroup is gone.
    for dir in &dirs {
        assert!(
            !std::path::Path::new(dir).exists(),
            "cgroup {dir} left behind"
        );
    }
    let ended = stranger.wait().unwrap();
    assert!(
        ended.code().is_none(),
        "the stranger was not killed: {ended:?}"
    );
}
