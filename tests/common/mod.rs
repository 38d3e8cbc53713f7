//! Helpers for black-box tests: they start the real `brig` binary.
#![allow(dead_code)]

pub mod daemon;
pub mod pytest;
pub mod sessions;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub fn brig_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_brig"))
}

pub fn brig() -> Command {
    let mut cmd = Command::new(brig_path());
    cmd.env_remove("BRIG_ID_RANGE")
        .env_remove("BRIG_CGROUP_PARENT");
    cmd
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the effective uid.
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Mount points in the test's (the host's) mount namespace, in mount order.
pub fn host_mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(String::from)
        .collect()
}

/// Sends `signal` (e.g. "TERM") to `pid` with kill(1).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Tests that need root say so by calling this first; CI runs as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::common::is_root() {
            eprintln!("skipped: this test needs root");
            return;
        }
    };
}

/// `brig run [args] -- cmd...` with the caller's stdio captured.
pub fn run(args: &[&str], cmd: &[&str]) -> Output {
    run_stdin(args, cmd, "")
}

pub fn run_stdin(args: &[&str], cmd: &[&str], stdin: &str) -> Output {
    let mut command = brig();
    command.arg("run").args(args).arg("--").args(cmd);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("start brig");
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(stdin.as_bytes());
    }
    child.wait_with_output().expect("wait for brig")
}

/// `brig run --json [args] -- cmd...`: the parsed result and brig's exit code.
pub fn run_json(args: &[&str], cmd: &[&str]) -> (Value, i32) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = run(&all, cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    let value: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "brig printed no JSON ({e}): stdout={text:?} stderr={:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (value, out.status.code().unwrap_or(-1))
}

/// Runs a shell script in a default sandbox and returns (stdout, exit code).
pub fn sh(script: &str) -> (String, i32) {
    sh_with(&[], script)
}

pub fn sh_with(args: &[&str], script: &str) -> (String, i32) {
    let (v, _) = run_json(args, &["/bin/sh", "-c", script]);
    (
        v["stdout"].as_str().unwrap_or_default().to_string()
            + v["stderr"].as_str().unwrap_or_default(),
        v["exit_code"].as_i64().map(|c| c as i32).unwrap_or(-1),
    )
}

/// Runs a Python program in a default sandbox; returns (stdout+stderr, exit code).
pub fn py(args: &[&str], code: &str) -> (String, i32) {
    let (v, _) = run_json(args, &["python3", "-c", code]);
    (
        v["stdout"].as_str().unwrap_or_default().to_string()
            + v["stderr"].as_str().unwrap_or_default(),
        v["exit_code"].as_i64().map(|c| c as i32).unwrap_or(-1),
    )
}

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Processes on the host whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) && pid != std::process::id() {
                found.push(pid);
            }
        }
    }
    found
}

/// Waits up to `ms` for `check` to hold.
pub fn eventually(ms: u64, mut check: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The cgroup leaf directories a run reported.
pub fn leaves(result: &Value) -> Vec<String> {
    result["enforced"]["cgroup"]["details"]["leaves"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}
