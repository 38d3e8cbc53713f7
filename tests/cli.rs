//! The `brig run` contract: flags, exit statuses, the JSON result.

mod common;

use common::*;

#[test]
fn root_python_from_stdin_just_works() {
    require_root!();
    let out = run_stdin(&[], &["python3", "-"], "print(2+2)\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "4\n");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn root_exit_statuses_follow_the_command() {
    require_root!();
    assert_eq!(run(&[], &["sh", "-c", "exit 3"]).status.code(), Some(3));
    // Killed by a signal: 128 + N.
    assert_eq!(
        run(&[], &["sh", "-c", "kill -TERM $$"]).status.code(),
        Some(143)
    );
    let out = run(&[], &["no-such-command-xyz"]);
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("command not found: no-such-command-xyz"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert_eq!(run(&[], &["/etc/hosts"]).status.code(), Some(126));
}

#[test]
fn root_timeout_exits_124_and_kills_the_tree() {
    require_root!();
    let marker = "98765.4321";
    let started = std::time::Instant::now();
    let out = run(
        &["--timeout", "500ms"],
        &["sh", "-c", &format!("sleep {marker} & sleep {marker}")],
    );
    assert_eq!(out.status.code(), Some(124));
    // Killed at its timeout, not when the sleeps (a day) end.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    assert!(
        processes_with(marker).is_empty(),
        "sleepers survived the timeout"
    );
    let (v, code) = run_json(&["--timeout", "300ms"], &["sleep", "600"]);
    assert_eq!(code, 124);
    assert_eq!(v["timed_out"], true);
    assert_eq!(v["exit_code"], serde_json::Value::Null);
    assert_eq!(v["signal"], 9);
}

#[test]
fn bad_flags_exit_125_with_one_line() {
    for args in [
        vec!["run", "--memory", "lots", "--", "true"],
        vec!["run", "--bind", "relative:/x", "--", "true"],
        vec!["run", "--bind", "/etc:/proc/x", "--", "true"],
        vec!["run", "--network", "host", "--", "true"],
        vec!["run", "--landlock", "maybe", "--", "true"],
        vec!["run", "--user", "abc", "--", "true"],
        vec!["run", "--bogus-flag", "--", "true"],
        vec!["run", "--workspace", "/definitely/not/here", "--", "true"],
        vec!["run"],
    ] {
        let out = brig().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("brig: "), "{args:?}: {stderr}");
        // Asked for JSON, the caller gets it on stdout, whatever was wrong.
        let mut json_args = args.clone();
        json_args.insert(1, "--json");
        let out = brig().args(&json_args).output().unwrap();
        assert_eq!(out.status.code(), Some(125), "{json_args:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{json_args:?}: {e}: {:?}", out.stdout));
        assert!(v["error"]["code"].is_string(), "{json_args:?}: {v}");
        assert!(v["error"]["message"].is_string(), "{json_args:?}: {v}");
    }
}

#[test]
fn a_reader_that_goes_away_ends_brig_quietly() {
    // `brig image ls | head -0`: the pipe is closed before brig writes. println!
    // panicked there; a shell tool ends with SIGPIPE's status and says nothing.
    let store = tempfile::tempdir().unwrap();
    for args in [
        vec!["image", "ls"],
        vec!["image", "ls", "--json"],
        vec!["--version"],
    ] {
        // The read end is closed before brig starts: its first write fails.
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let out = brig()
            .args(&args)
            .env("BRIG_STORE", store.path())
            .stdout(std::process::Stdio::from(write))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        if args[0] == "image" {
            assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
            assert_eq!(stderr, "", "{args:?}");
        }
    }
}

#[test]
fn root_json_result_has_the_contract_fields() {
    require_root!();
    let (v, code) = run_json(&[], &["sh", "-c", "echo out; echo err >&2; exit 5"]);
    assert_eq!(code, 5);
    assert_eq!(v["exit_code"], 5);
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    for key in [
        "exit_code",
        "signal",
        "timed_out",
        "oom_killed",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "duration_ms",
        "cpu_time_ms",
        "memory_peak_bytes",
        "enforced",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let e = &v["enforced"];
    let namespaces: Vec<&str> = e["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for ns in ["user", "pid", "mnt", "net", "ipc", "uts", "cgroup"] {
        assert!(namespaces.contains(&ns), "{ns} not in {namespaces:?}");
    }
    assert_eq!(e["capabilities"]["all_dropped"], true);
    assert_eq!(e["no_new_privs"], true);
    assert_eq!(e["seccomp"]["enabled"], true);
    assert_eq!(e["landlock"]["status"], "fully_enforced");
    assert_eq!(e["cgroup"]["applied"], true);
    assert!(e["cgroup"]["details"]["version"].is_string());
    assert_eq!(e["identity"]["rootless"], false);
    let host_uid = e["identity"]["host_uid"].as_u64().unwrap();
    assert_ne!(host_uid, 0);
    assert_eq!(e["identity"]["uid_map"], format!("1000 {host_uid} 1"));
    assert!(v["duration_ms"].as_u64().unwrap() < 10_000);
    assert!(v["memory_peak_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn root_json_never_claims_what_was_not_applied() {
    require_root!();
    let (v, _) = run_json(&["--seccomp", "off", "--landlock", "off"], &["true"]);
    assert_eq!(v["enforced"]["seccomp"]["enabled"], false);
    assert_eq!(v["enforced"]["seccomp"]["filter"], serde_json::Value::Null);
    assert_eq!(v["enforced"]["landlock"]["status"], "off");
    // And the claim is true: with seccomp off, unshare works inside.
    let (out, code) = sh_with(&["--seccomp", "off"], "unshare -U true && echo unshared");
    assert_eq!((out.trim(), code), ("unshared", 0));
}

#[test]
fn root_output_is_cut_at_the_limit_and_marked() {
    require_root!();
    let (v, code) = run_json(
        &["--output-limit", "1K"],
        &[
            "sh",
            "-c",
            "head -c 100000 /dev/zero | tr '\\0' a; echo done >&2",
        ],
    );
    assert_eq!(code, 0, "the command must not block on a full pipe");
    assert_eq!(v["stdout"].as_str().unwrap().len(), 1024);
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["stderr"], "done\n");
    assert_eq!(v["stderr_truncated"], false);
    // Default limit is 1 MiB.
    let (v, _) = run_json(&[], &["sh", "-c", "head -c 2000000 /dev/zero"]);
    assert_eq!(v["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(v["stdout_truncated"], true);
}

#[test]
fn root_environment_is_cleared_except_defaults() {
    require_root!();
    let mut cmd = brig();
    cmd.env("SECRET_TOKEN", "hunter2")
        .args(["run", "--json", "--env", "FOO=bar", "--", "env"]);
    let out = cmd.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let env = v["stdout"].as_str().unwrap();
    assert!(!env.contains("hunter2"), "{env}");
    assert!(env.contains("FOO=bar"));
    assert!(env.contains("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
    assert!(env.contains("HOME=/workspace"));
    assert!(env.contains("LANG=C.UTF-8"));
}

#[test]
fn root_identity_hostname_and_cwd() {
    require_root!();
    let (out, _) = sh_with(
        &["--hostname", "box1", "--cwd", "/tmp/deep/dir"],
        "id -u; id -g; hostname; pwd; cat /etc/hostname",
    );
    assert_eq!(out, "1000\n1000\nbox1\n/tmp/deep/dir\nbox1\n");
    let (out, _) = sh_with(
        &["--user", "0"],
        "id -u; id -un; grep CapEff /proc/self/status",
    );
    assert_eq!(out, "0\nroot\nCapEff:\t0000000000000000\n");
    let (out, _) = sh_with(&["--user", "1234:4321"], "id -u; id -g; whoami");
    assert_eq!(out, "1234\n4321\nsandbox\n");
    let (out, _) = sh("pwd; touch /workspace/f && echo writable");
    assert_eq!(out, "/workspace\nwritable\n");
}

#[test]
fn root_binds_and_workspace() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input.txt"), "data").unwrap();
    // The sandbox's host uid is not the owner: make the directory usable by others.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    // The workspace is written by the sandbox's host uid.
    std::fs::set_permissions(
        ws.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let ro = format!("{}:/data", dir.path().display());
    let rw = format!("{}:/out:rw", dir.path().display());
    let ws_arg = ws.path().display().to_string();
    let (out, code) = sh_with(
        &["--bind", &ro, "--bind", &rw, "--workspace", &ws_arg],
        "cat /data/input.txt; echo; touch /data/x 2>/dev/null || echo ro-refused; echo hi > /out/new && echo rw-ok; echo w > /workspace/result && echo ws-ok",
    );
    assert_eq!(out, "data\nro-refused\nrw-ok\nws-ok\n", "code {code}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("new")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("result")).unwrap(),
        "w\n"
    );
}

#[test]
fn root_binds_reach_sources_only_root_can_enter() {
    require_root!();
    // brig clones bind sources as the caller (root here), not as the sandbox's host
    // uid: a source under a 0700 directory must still be bound, and stay read-only.
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        private.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let inner = private.path().join("bundle");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(inner.join("tool.txt"), "tool").unwrap();
    let bind = format!("{}:/opt/bundle", inner.display());
    let (out, code) = sh_with(
        &["--bind", &bind],
        "cat /opt/bundle/tool.txt; echo; touch /opt/bundle/x 2>/dev/null || echo ro-refused",
    );
    assert_eq!(out, "tool\nro-refused\n", "code {code}");
    assert!(!inner.join("x").exists());
}

#[test]
fn root_rootfs_directory_becomes_root() {
    require_root!();
    // A tiny rootfs: the host's /usr bound in, its own /etc/os-release and a marker.
    let rootfs = tempfile::tempdir().unwrap();
    let r = rootfs.path();
    std::fs::set_permissions(r, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for d in ["etc", "usr", "srv"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    for l in ["bin", "lib", "lib64", "sbin"] {
        std::os::unix::fs::symlink(format!("usr/{l}"), r.join(l)).unwrap();
    }
    std::fs::write(r.join("etc/os-release"), "ID=brigtest\n").unwrap();
    std::fs::write(r.join("srv/marker"), "from-rootfs\n").unwrap();
    let usr = "/usr:/usr".to_string();
    let (out, code) = sh_with(
        &["--rootfs", &r.display().to_string(), "--bind", &usr],
        "cat /etc/os-release /srv/marker; ls / | tr '\\n' ' '; touch /srv/x 2>/dev/null || echo ro",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ID=brigtest\nfrom-rootfs\n"), "{out}");
    assert!(out.contains("srv") && out.ends_with("ro\n"), "{out}");
}
