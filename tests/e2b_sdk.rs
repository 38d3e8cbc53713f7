//! E2B's SDKs, unmodified (`e2b`, `e2b-code-interpreter` from PyPI), end to end
//! against a live daemon, with the SDK pointed at it by its own variables
//! (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`). The packages are in the
//! virtualenv `scripts/test.sh` makes (`target/test-venv`).
//!
//! Two suites, each one pytest run (in parallel with pytest-xdist):
//! - ours, `tests/e2b/test_*.py`: every test must run and pass;
//! - E2B's own, `tests/e2b_upstream/` (the SDKs' sync tests, vendored from their
//!   repositories; see its README): every test that applies must pass, and the
//!   ones that do not apply are listed, each with its reason, in
//!   `tests/e2b_upstream/deselected.txt`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::daemon::Daemon;
use serde_json::json;

/// A suite takes a minute or two on a loaded 2-core VM; a hang is cut off far
/// beyond that.
const SUITE_LIMIT: Duration = Duration::from_secs(1200);

fn key_of(d: &Daemon, tenant: &str) -> String {
    let (status, key) = d.request(
        "POST",
        "/v1/keys",
        Some(d.admin_key()),
        Some(json!({"tenant": tenant, "name": "pytest"})),
    );
    assert_eq!(status, 201, "{key}");
    key["key"].as_str().unwrap().to_string()
}

/// The test venv's python, if it has the SDKs (None: the test is skipped, said).
fn venv_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/test-venv/bin/python");
    if !python.exists() {
        eprintln!(
            "skipped: no {} (./scripts/test.sh makes it)",
            python.display()
        );
        return None;
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
    Some(python)
}

/// A daemon whose E2B templates are sandboxes on the host's dirs.
fn daemon() -> Daemon {
    Daemon::start(&[
        "--default-image",
        "host",
        "--e2b-template",
        "base=host",
        "--e2b-template",
        "code-interpreter-v1=host",
    ])
}

/// Runs pytest on `args` against `d` with `key` as E2B_API_KEY; its output, after
/// failing the test if pytest failed, hung or skipped anything.
fn pytest(python: &Path, d: &Daemon, key: &str, other: &str, args: &[String]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let parallel = Command::new(python)
        .args(["-c", "import xdist"])
        .output()
        .unwrap()
        .status
        .success();
    let mut pytest = Command::new(python);
    pytest.args(["-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider"]);
    if parallel {
        pytest.args(["-n", "2"]);
    }
    pytest
        .args(args)
        .current_dir(root)
        .env("E2B_API_URL", d.url(""))
        .env("E2B_SANDBOX_URL", d.url(""))
        .env("E2B_API_KEY", key)
        .env("E2B_DOMAIN", d.addr())
        .env("BRIG_E2B_OTHER_KEY", other);
    common::pytest::run(pytest, SUITE_LIMIT)
}

/// Each test cleans up after itself: no tenant has a sandbox or snapshot left.
fn assert_nothing_left(d: &Daemon, keys: &[&str]) {
    for key in keys {
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

#[test]
fn root_the_e2b_sdk_suites_pass_against_a_live_daemon() {
    require_root!();
    let Some(python) = venv_python() else { return };
    let d = daemon();
    let key = key_of(&d, "e2b");
    let other = key_of(&d, "e2b-other");
    pytest(&python, &d, &key, &other, &["tests/e2b".to_string()]);
    assert_nothing_left(&d, &[&key, &other]);
}

/// The tests of E2B's own repositories that apply to brig, less those listed in
/// `deselected.txt` (`<node id>  # <why>` a line).
#[test]
fn root_e2bs_own_sdk_tests_pass_where_they_apply() {
    require_root!();
    let Some(python) = venv_python() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let listed = std::fs::read_to_string(root.join("tests/e2b_upstream/deselected.txt")).unwrap();
    let mut args = vec![
        "-c".to_string(),
        "tests/e2b_upstream/pytest.ini".to_string(),
        "--rootdir".to_string(),
        "tests/e2b_upstream".to_string(),
    ];
    for line in listed.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, why) = line.split_once("  # ").expect("`<node id>  # <why>`");
        assert!(!why.trim().is_empty(), "{line}: no reason given");
        args.push("--deselect".to_string());
        args.push(id.trim().to_string());
    }
    args.push("tests/e2b_upstream/python_sdk".to_string());
    args.push("tests/e2b_upstream/code_interpreter".to_string());
    let d = daemon();
    let key = key_of(&d, "e2b-upstream");
    let other = key_of(&d, "e2b-upstream-other");
    pytest(&python, &d, &key, &other, &args);
    // Every deselected test exists: a list that names nothing hides nothing.
    let collected = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ])
        .args(&args[..4])
        .args([
            "tests/e2b_upstream/python_sdk",
            "tests/e2b_upstream/code_interpreter",
        ])
        .current_dir(root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let collected = String::from_utf8_lossy(&collected.stdout);
    let ids: std::collections::BTreeSet<&str> = collected.lines().map(str::trim).collect();
    let missing: Vec<&String> = args
        .windows(2)
        .filter(|w| w[0] == "--deselect")
        .map(|w| &w[1])
        .filter(|id| !ids.contains(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "deselected.txt names tests that are not collected: {missing:?}\n{collected}"
    );
    assert_nothing_left(&d, &[&key]);
}
