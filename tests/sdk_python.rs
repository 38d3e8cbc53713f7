//! The Python SDK (`sdk/python`), end to end: its pytest suite runs against a live
//! daemon started here, with a tenant key of its own, sync and async clients alike.
//! The suite runs with the virtualenv `scripts/test.sh` installs the SDK, pytest
//! and pytest-asyncio into (`target/test-venv`).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

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

    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .arg(root.join("sdk/python/tests"))
        .current_dir(root)
        .env("BRIG_URL", d.url(""))
        .env("BRIG_API_KEY", &key);
    common::pytest::run(pytest, SUITE_LIMIT);

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
