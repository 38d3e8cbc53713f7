//! Running a pytest suite (a Python client's tests against a live daemon) from a
//! Rust test: bounded in time, its output kept for the failure message.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `pytest` (a `python -m pytest ...` command, its environment set) to its end
/// or for `limit` at most; its output. Fails the test if the suite failed, hung,
/// passed nothing or skipped anything.
pub fn run(mut pytest: Command, limit: Duration) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let log = out_dir.path().join("pytest.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut child = pytest
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    // The summary, so a run shows what ran even when it passes.
    eprintln!("{}", output.lines().last().unwrap_or_default());
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("pytest failed ({s}):\n{output}"),
        None => panic!("pytest still ran after {limit:?}:\n{output}"),
    }
    assert!(output.contains(" passed"), "{output}");
    let skips: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("SKIPPED") || l.contains(" skipped"))
        .collect();
    assert!(
        skips.is_empty(),
        "the suite skipped tests:\n{}",
        skips.join("\n")
    );
    output
}
