//! The Python SDK (`sdk/python`), end to end: its pytest suite runs against a live
//! daemon started here, with a tenant key of its own, sync and async clients alike.
//! The suite runs with the virtualenv `scripts/test.sh` installs the SDK, pytest
//! and pytest-asyncio into (`target/test-venv`).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use serde_json::json;

/// The whole suite takes seconds; a hang is cut off far beyond that.
const SUITE_LIMIT: Duration = Duration::from_secs(600);

#[test]
fn root_the_python_sdk_suite_passes_against_a_live_daemon() {
    require_root!();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/test-venv/bin/python");
    if !python.exists() {
        eprintln!(
            "skipped: no {} (./scripts/test.sh makes it)",
            python.display()
        );
        return;
    }
    let imports = Command::new(&python)
        .args(["-c", "import brig, pytest, pytest_asyncio"])
        .output()
        .unwrap();
    assert!(
        imports.status.success(),
        "{} lacks the SDK or pytest (./scripts/test.sh installs them): {}",
        python.display(),
        String::from_utf8_lossy(&imports.stderr)
    );

    let d = Daemon::start(&[]);
    let (status, key) = d.request(
        "POST",
        "/v1/keys",
        Some(d.admin_key()),
        Some(json!({"tenant": "sdk", "name": "pytest"})),
    );
    assert_eq!(status, 201, "{key}");
    let key = key["key"].as_str().unwrap().to_string();

    let out_dir = tempfile::tempdir().unwrap();
    let log = out_dir.path().join("pytest.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(&python)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .arg(root.join("sdk/python/tests"))
        .current_dir(root)
        .env("BRIG_URL", d.url(""))
        .env("BRIG_API_KEY", &key)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let end = Instant::now() + SUITE_LIMIT;
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
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("pytest failed ({s}):\n{output}"),
        None => panic!("pytest still ran after {SUITE_LIMIT:?}:\n{output}"),
    }
    assert!(output.contains(" passed"), "{output}");
    assert!(
        !output.contains(" skipped"),
        "the suite skipped tests:\n{output}"
    );

    // Each test cleans up after itself: the tenant has no session left.
    let (status, list) = d.request("GET", "/v1/sessions", Some(&key), None);
    assert_eq!(status, 200);
    assert_eq!(list["sessions"], json!([]), "the SDK tests left sessions");
    let (_, snaps) = d.request("GET", "/v1/snapshots", Some(&key), None);
    assert_eq!(
        snaps["snapshots"],
        json!([]),
        "the SDK tests left snapshots"
    );
}
