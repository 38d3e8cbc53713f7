//! The MCP server, driven by the official Python MCP client (`mcp`, its `Client`)
//! in `tests/mcp_client.py`, run with the Python that `scripts/test.sh` installs it
//! into: over stdio (`brig mcp`, the engine in-process) and over streamable HTTP
//! (`/mcp` of a daemon each test starts). One test per guarantee.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::daemon::Daemon;

fn python() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/python");
    let has_mcp = python.exists()
        && Command::new(&python)
            .args(["-c", "import mcp"])
            .output()
            .is_ok_and(|out| out.status.success());
    if !has_mcp {
        eprintln!(
            "skipped: no `mcp` in {} (./scripts/test.sh installs it)",
            python.display()
        );
        return None;
    }
    Some(python)
}

/// Runs `tests/mcp_client.py MODE ARGS...` and asserts it says `ok`.
fn client(python: &Path, mode: &str, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(mode)
        .args(args)
        .env_remove("BRIG_URL")
        .env_remove("BRIG_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn audit(data_dir: &Path) -> Vec<(String, String, String)> {
    let db = rusqlite::Connection::open(data_dir.join("brig.db")).unwrap();
    let mut query = db
        .prepare("SELECT action, frontend, outcome FROM audit ORDER BY id")
        .unwrap();
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// `brig mcp` with no daemon configured runs the engine in-process on a data dir of
/// its own: every tool works, invalid arguments are tool errors naming the argument,
/// and when the client closes stdin the sandbox is deleted (audited as `mcp`).
#[test]
fn root_stdio_tools_work_and_the_sandbox_ends_with_the_session() {
    require_root!();
    let Some(python) = python() else { return };
    let tmp = tempfile::Builder::new()
        .prefix("brig-mcp-test-")
        .tempdir()
        .unwrap();
    let (data, store) = (tmp.path().join("data"), tmp.path().join("store"));
    let brig = common::brig_path();
    client(
        &python,
        "stdio",
        &[
            brig.to_str().unwrap(),
            data.to_str().unwrap(),
            store.to_str().unwrap(),
        ],
    );
    // The client waited for `brig mcp` to exit: the sandbox is gone by now.
    let left: Vec<_> = std::fs::read_dir(data.join("sessions")).unwrap().collect();
    assert!(left.is_empty(), "sessions left behind: {left:?}");
    // Nor a snapshot's layer, mounted while the restored sandbox ran from it.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let store_path = store.to_string_lossy().into_owned();
    assert!(
        !mounts.lines().any(|l| l.contains(&store_path)),
        "mounts left in {store_path}"
    );
    let events = audit(&data);
    let sessions: Vec<_> = events
        .iter()
        .filter(|(action, _, _)| action.starts_with("session."))
        .map(|(action, _, outcome)| (action.as_str(), outcome.as_str()))
        .collect();
    // The restores are the snapshot tool's checkpoint and its refusal of an
    // unknown snapshot, which leaves the session in place.
    assert_eq!(
        sessions,
        [
            ("session.create", "ok"),
            ("session.restore", "ok"),
            ("session.restore", "not_found"),
            ("session.delete", "ok")
        ],
        "{events:?}"
    );
    assert!(
        events.iter().all(|(_, frontend, _)| frontend == "mcp"),
        "{events:?}"
    );
}

/// `brig mcp` with `BRIG_URL`/`BRIG_API_KEY` is a client of that daemon: every
/// tool works on a session there, deleted when the client closes stdin, and the
/// daemon audits the work as front end `mcp`.
#[test]
fn root_stdio_through_a_daemon_works_and_the_sandbox_ends_with_the_session() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&[]);
    let brig = common::brig_path();
    client(
        &python,
        "stdio-daemon",
        &[brig.to_str().unwrap(), &d.url(""), d.admin_key()],
    );
    let events = audit(d.data_dir());
    let sessions: Vec<_> = events
        .iter()
        .filter(|(action, _, _)| action.starts_with("session.") || action == "exec")
        .collect();
    assert!(
        sessions
            .iter()
            .any(|(action, _, _)| action == "session.create"),
        "{events:?}"
    );
    assert!(
        sessions.iter().all(|(_, frontend, _)| frontend == "mcp"),
        "{events:?}"
    );
    assert_no_snapshots(&d);
}

/// `/mcp` on the daemon: every tool works; the sandbox is made on the first tool
/// call and deleted when the client ends its MCP session; all of it is audited as
/// front end `mcp`.
#[test]
fn root_http_tools_work_and_the_sandbox_ends_with_the_session() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&[]);
    client(&python, "http", &[&d.url(""), d.admin_key()]);
    assert_no_snapshots(&d);
}

/// The `snapshot` tool's checkpoints end with their MCP session.
fn assert_no_snapshots(d: &Daemon) {
    let (status, list) = d.request("GET", "/v1/snapshots", Some(d.admin_key()), None);
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["snapshots"], serde_json::json!([]), "{list}");
}

/// An MCP session whose client went away without ending it expires after
/// `--mcp-idle-timeout`, and its sandbox is deleted with it.
#[test]
fn root_http_sandbox_ends_when_an_abandoned_session_expires() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&["--mcp-idle-timeout", "1s"]);
    client(&python, "expiry", &[&d.url(""), d.admin_key()]);
}

/// A sandbox that ends under a live MCP session (its TTL, its idle timeout, a
/// `DELETE` through the REST API) is reported once, then replaced by a new one.
#[test]
fn root_http_a_sandbox_gone_under_the_session_is_replaced() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&[]);
    client(&python, "recreate", &[&d.url(""), d.admin_key()]);
}

/// `/mcp` refuses a request without a key, or with an unknown one (401), as the
/// REST API does.
#[test]
fn root_http_refuses_a_request_without_a_key() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&[]);
    client(&python, "nokey", &[&d.url("")]);
    let (status, list) = d.request("GET", "/v1/sessions", Some(d.admin_key()), None);
    assert_eq!(status, 200);
    assert_eq!(list["sessions"], serde_json::json!([]), "{list}");
}

/// `read_file` stays inside the sandbox: `..` and symlinks planted by
/// `run_command` (to a host file, to `/`, up the tree) do not read the file the
/// test wrote on the host.
#[test]
fn root_read_file_does_not_reach_the_host() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&[]);
    let host = tempfile::Builder::new()
        .prefix("brig-mcp-host-")
        .tempdir()
        .unwrap();
    let secret = host.path().join("secret");
    std::fs::write(&secret, "host-secret-7f3a91\n").unwrap();
    client(
        &python,
        "containment",
        &[&d.url(""), d.admin_key(), secret.to_str().unwrap()],
    );
}

/// Two MCP sessions of one key get two sandboxes: neither sees the other's files.
#[test]
fn root_one_mcp_session_cannot_see_anothers_files() {
    require_root!();
    let Some(python) = python() else { return };
    let d = Daemon::start(&[]);
    client(&python, "isolation", &[&d.url(""), d.admin_key()]);
}
