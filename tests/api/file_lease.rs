//! A file lease (`fcntl(F_SETLEASE)`) taken by a sandbox process on one of its
//! files: the files API answers that the file is busy, at once, rather than a
//! server error or a wait for the kernel's lease-break-time; so does a snapshot,
//! which copies every file. Black-box, against
//! a real `brig serve` (tests/common/daemon.rs).

use std::io::Read;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::common::sessions::{create, delete, error_code, q, sh};
use serde_json::json;

/// Takes a write lease (the kind any other open breaks) on the file, ignoring
/// the SIGIO that would end it when someone opens it; lets go of it on a line of
/// stdin and closes it on the next.
const HOLDER: &str = r#"
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open('/workspace/leased', os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print('leased', flush=True)
sys.stdin.readline()
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
print('released', flush=True)
sys.stdin.readline()
"#;

#[test]
fn a_leased_file_is_busy_not_a_server_error() {
    require_root!();
    let d = Daemon::start(&["--default-image", "host"]);
    let key = d.admin_key().to_string();
    let id = create(&d, &key);
    sh(
        &d,
        &key,
        &id,
        "echo data > /workspace/leased && echo free > /workspace/free",
    );
    let processes = format!("/v1/sessions/{id}/processes");
    let (status, holder) = d.request(
        "POST",
        &processes,
        Some(&key),
        Some(json!({"argv": ["python3", "-c", HOLDER]})),
    );
    assert_eq!(status, 201, "{holder}");
    let holder = format!("{processes}/{}", holder["process_id"].as_u64().unwrap());
    let said = |what: &str| {
        let (_, out) = d.raw(
            "GET",
            &format!("{holder}/output?stream=stdout"),
            Some(&key),
            None,
            None,
        );
        String::from_utf8_lossy(&out).contains(what)
    };
    let stderr = || {
        let url = format!("{holder}/output?stream=stderr");
        String::from_utf8_lossy(&d.raw("GET", &url, Some(&key), None, None).1).into_owned()
    };
    assert!(
        common::eventually(20_000, || said("leased")),
        "{}",
        stderr()
    );

    let leased = format!("/v1/sessions/{id}/files?path={}", q("/workspace/leased"));
    let started = Instant::now();
    let (status, body) = d.request("GET", &leased, Some(&key), None);
    // The kernel's lease-break-time is 45 s by default: the answer did not wait
    // for the lease to be broken.
    assert!(started.elapsed() < Duration::from_secs(15), "{started:?}");
    assert_eq!(status, 409, "{body}");
    assert_eq!(error_code(&body), "busy", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/workspace/leased") && message.contains("lease"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");

    // The daemon is not held up: another file reads at once, and the holder is
    // still there, its lease too.
    let free = format!("/v1/sessions/{id}/files?path={}", q("/workspace/free"));
    assert_eq!(
        d.raw("GET", &free, Some(&key), None, None),
        (200, b"free\n".to_vec())
    );
    let (status, again) = d.request("GET", &leased, Some(&key), None);
    assert_eq!((status, error_code(&again)), (409, "busy"), "{again}");
    let (_, state) = d.request("GET", &holder, Some(&key), None);
    assert_eq!(state["state"], "running", "{state}");
    // An archive holding it is cut off rather than whole without it: before its
    // headers went out (the file comes first) or after. On an agent of its own,
    // whose cut connection no other request uses.
    let archive = format!("/v1/sessions/{id}/archive?path={}", q("/workspace"));
    let downloaded = common::daemon::agent()
        .get(d.url(&archive))
        .header("Authorization", format!("Bearer {key}"))
        .call()
        .map_err(|e| e.to_string())
        .and_then(|response| {
            assert_eq!(response.status(), 200);
            let mut tar = Vec::new();
            let read = response.into_body().into_reader().read_to_end(&mut tar);
            read.map(|_| tar.len()).map_err(|e| e.to_string())
        });
    assert!(downloaded.is_err(), "{downloaded:?} bytes looked whole");
    // A snapshot, which copies every file, says the same; the session runs on.
    let started = Instant::now();
    let (status, body) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/snapshots"),
        Some(&key),
        Some(json!({})),
    );
    assert!(started.elapsed() < Duration::from_secs(15), "{started:?}");
    assert_eq!((status, error_code(&body)), (409, "busy"), "{body}");
    let (_, state) = d.request("GET", &holder, Some(&key), None);
    assert_eq!(state["state"], "running", "{state}");
    assert_eq!(
        d.raw("GET", &free, Some(&key), None, None),
        (200, b"free\n".to_vec())
    );

    // Once it lets go, the file reads.
    let (status, _) = d.raw(
        "POST",
        &format!("{holder}/stdin"),
        Some(&key),
        Some("application/octet-stream"),
        Some(b"\n".to_vec()),
    );
    assert_eq!(status, 204);
    assert!(
        common::eventually(20_000, || said("released")),
        "{}",
        stderr()
    );
    assert_eq!(
        d.raw("GET", &leased, Some(&key), None, None),
        (200, b"data\n".to_vec())
    );
    delete(&d, &key, &id);
}
