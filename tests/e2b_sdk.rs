//! E2B's SDKs, unmodified (`e2b`, `e2b-code-interpreter` from PyPI), end to end
//! against a live daemon: every `tests/e2b/test_*.py`, in one pytest run (in
//! parallel with pytest-xdist when installed), with the SDK pointed at the daemon
//! by its own variables (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`). The
//! packages are in the virtualenv `scripts/test.sh` makes (`target/test-venv`).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use serde_json::json;

/// The suite takes a minute or two on a loaded 2-core VM; a hang is cut off far
/// beyond that.
const SUITE_LIMIT: Duration = Duration::from_secs(1200);

fn key(d: &Daemon, tenant: &str) -> String {
    let (status, key) = d.request(
        "POST",
        "/v1/keys",
        Some(d.admin_key()),
        Some(json!({"tenant": tenant, "name": "pytest"})),
    );
    assert_eq!(status, 201, "{key}");
    key["key"].as_str().unwrap().to_string()
}

#[test]
fn root_the_e2b_sdk_suites_pass_against_a_live_daemon() {
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
        .args(["-c", "import e2b, e2b_code_interpreter, pytest, httpx"])
        .output()
        .unwrap();
    assert!(
        imports.status.success(),
        "{} lacks the E2B SDKs or pytest (./scripts/test.sh installs them): {}",
        python.display(),
        String::from_utf8_lossy(&imports.stderr)
    );
    let parallel = Command::new(&python)
        .args(["-c", "import xdist"])
        .output()
        .unwrap()
        .status
        .success();

    let d = Daemon::start(&[
        "--default-image",
        "host",
        "--e2b-template",
        "base=host",
        "--e2b-template",
        "code-interpreter-v1=host",
    ]);
    let key = key(&d, "e2b");
    let other = key_of_other(&d);

    let out_dir = tempfile::tempdir().unwrap();
    let log = out_dir.path().join("pytest.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut pytest = Command::new(&python);
    pytest.args(["-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider"]);
    if parallel {
        pytest.args(["-n", "2"]);
    }
    let mut child = pytest
        .arg(root.join("tests/e2b"))
        .current_dir(root)
        .env("E2B_API_URL", d.url(""))
        .env("E2B_SANDBOX_URL", d.url(""))
        .env("E2B_API_KEY", &key)
        .env("E2B_DOMAIN", d.addr())
        .env("BRIG_E2B_OTHER_KEY", &other)
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
    // The summary, so a run shows what ran even when it passes.
    eprintln!("{}", output.lines().last().unwrap_or_default());
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("pytest failed ({s}):\n{output}"),
        None => panic!("pytest still ran after {SUITE_LIMIT:?}:\n{output}"),
    }
    assert!(output.contains(" passed"), "{output}");
    let skips: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("SKIPPED"))
        .collect();
    assert!(
        skips.is_empty(),
        "the suite skipped tests:\n{}",
        skips.join("\n")
    );

    // Each test cleans up after itself: neither tenant has a sandbox or snapshot left.
    for key in [&key, &other] {
        let (status, list) = d.request("GET", "/v1/sessions", Some(key), None);
        assert_eq!(status, 200);
        assert_eq!(list["sessions"], json!([]), "the SDK tests left sandboxes");
        let (_, snaps) = d.request("GET", "/v1/snapshots", Some(key), None);
        assert_eq!(
            snaps["snapshots"],
            json!([]),
            "the SDK tests left snapshots"
        );
    }
}

/// A key of a second tenant, for the tests that check one tenant cannot reach
/// another's sandboxes.
fn key_of_other(d: &Daemon) -> String {
    key(d, "e2b-other")
}
