//! onyx's own tests of its code interpreter, run against brig: the test files of
//! onyx-dot-app/python-sandbox (the server onyx's `CodeInterpreterClient` talks to)
//! at 8950eadc06567798ec61354f24260e5dc996684b (code-interpreter 0.4.4), vendored
//! unchanged under `tests/onyx/` (MIT, `tests/onyx/LICENSE`) with a shim
//! (`tests/onyx/conftest.py`, `tests/onyx/shim/`) that points them at a live daemon
//! started here: `--no-auth` on loopback, as onyx runs its code interpreter beside
//! it (its client sends no key).
//!
//! What runs (39 tests):
//! - `test_onyx_client.py` (brig's): onyx's own `CodeInterpreterClient` (vendored
//!   unchanged from onyx-dot-app/onyx in `tests/onyx/client/`), as onyx's tools use
//!   it: at `/onyx` its session and bash tools turn on and work (a coding agent's
//!   session around a staged tarball); at the root they stay off (brig's `/health`
//!   version, brig's `/v1/sessions`) and code still runs.
//! - `e2e/test_basic_flow.py`, `e2e/test_concurrent_execute.py`: onyx's end-to-end
//!   tests (HTTP to the service; `BASE_URL` pointed at the daemon).
//! - From `integration_tests/`, every file that needs no mock of onyx's internals:
//!   `test_hello_world.py`, `test_interactive_mode.py`, `test_file_storage.py`
//!   (upload, download, list, delete, unknown ids, the 101 MB upload refused with
//!   413), `test_file_support.py` (staged files, outputs, illegal paths, the Excel
//!   file read with openpyxl), `test_data_stack.py` (numpy, pandas, matplotlib),
//!   `test_streaming.py`. They build onyx's app in process and call it with
//!   FastAPI's `TestClient`: the shim's `TestClient` sends the same calls over HTTP.
//!
//! What does not run, and why:
//! - `test_health.py`: imports onyx's executors and patches their health checks; its
//!   one unpatched test compares the version with onyx's package's.
//! - `test_sessions_routes.py`, `test_session_bash_routes.py`: the routes with the
//!   executor mocked (`patch("app.api.routes.get_executor")`); brig's
//!   `/v1/sessions/{id}/bash` is tested in tests/api/onyx.rs instead.
//! - `test_session_bash_docker.py`, `test_session_bash_kubernetes.py`,
//!   `test_sessions_docker.py`, `test_sessions_kubernetes.py`,
//!   `test_kubernetes_streaming.py`, `test_binary_file_integrity.py`: onyx's Docker
//!   and Kubernetes executors with `subprocess` or the Kubernetes API mocked.
//! - `test_image_ref.py`, `test_logging_config.py`: onyx's own helpers.
//!
//! The code runs in `--default-image host` (the host's python3 with Debian's numpy,
//! pandas, matplotlib and openpyxl, which scripts/test.sh installs): CI does not
//! build the `python` image. `BRIG_ONYX_STORE=<an image store with python>` runs the
//! same tests in that image instead (all 35 passed against images/python.toml's).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::daemon::Daemon;

/// The suite takes seconds; a hang is cut off far beyond that.
const SUITE_LIMIT: Duration = Duration::from_secs(600);

#[test]
fn root_onyx_code_interpreter_tests_pass_against_brig() {
    require_root!();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/test-venv/bin/python");
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", "import httpx, pydantic, pytest, requests"])
            .output()
            .is_ok_and(|out| out.status.success());
    if !ready {
        eprintln!(
            "skipped: no httpx, pydantic, pytest or requests in {} (./scripts/test.sh installs them)",
            python.display()
        );
        return;
    }

    let data = tempfile::tempdir().unwrap();
    let d = match std::env::var_os("BRIG_ONYX_STORE") {
        Some(store) => {
            Daemon::start_in(&data.path().join("data"), Path::new(&store), &["--no-auth"])
        }
        None => Daemon::start(&["--no-auth", "--default-image", "host"]),
    };
    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .arg(root.join("tests/onyx"))
        .current_dir(root.join("tests/onyx"))
        .env("BRIG_URL", d.url(""));
    let output = common::pytest::run(pytest, SUITE_LIMIT);
    assert!(output.contains("39 passed"), "{output}");
    // Every run was a session of its own, deleted when it ended.
    let (status, list) = d.request("GET", "/v1/sessions", None, None);
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["sessions"], serde_json::json!([]), "{list}");
}
