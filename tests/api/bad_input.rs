//! Bad input is refused and changes nothing: one test per kind of request, each
//! a table of bad requests, each refused with its documented status and error code,
//! after which nothing was made.

use std::collections::BTreeSet;

use crate::common::daemon::Daemon;
use crate::support::{
    create, daemon, delete_session, error_code, sandboxes, session_count, sh, sid,
};
use serde_json::{json, Value};

/// A bad request: method, path, body, and the status and error code it is refused with.
type Case = (&'static str, String, Vec<u8>, u16, &'static str);

/// A daemon that takes bodies of up to 1 KiB, the admin's one (empty) session in
/// it, and the daemon's sandboxes before any bad request.
struct Fixture {
    d: Daemon,
    key: String,
    id: String,
    sandboxes_before: BTreeSet<u32>,
}

impl Fixture {
    fn start() -> Fixture {
        let d = daemon(&["--max-body", "1K"]);
        let key = d.admin_key().to_string();
        let id = sid(&create(&d, &key, json!({})));
        let sandboxes_before = sandboxes(&d);
        Fixture {
            d,
            key,
            id,
            sandboxes_before,
        }
    }

    /// A JSON body over --max-body.
    fn big() -> String {
        format!("{{\"env\": {{\"K\": \"{}\"}}}}", "v".repeat(2000))
    }

    /// Sends every case; each must be refused with its status and code and a
    /// message. All mismatches are reported together.
    fn refuse_all(&self, cases: Vec<Case>) {
        let d = &self.d;
        let key = &self.key;
        let mut wrong = Vec::new();
        for (method, path, body, want, code) in cases {
            let (status, v) = if method == "GET" || body.is_empty() {
                let (s, bytes) = d.raw(method, &path, Some(key), None, None);
                (s, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
            } else {
                let (status, bytes) = d.raw(
                    method,
                    &path,
                    Some(key),
                    Some("application/json"),
                    Some(body.clone()),
                );
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(v) => (status, v),
                    Err(_) => {
                        wrong.push(format!(
                            "{method} {path}: not a JSON error: {}",
                            String::from_utf8_lossy(&bytes)
                        ));
                        continue;
                    }
                }
            };
            if (status, error_code(&v)) != (want, code) {
                wrong.push(format!(
                    "{method} {path} {}: want {want} {code}, got {status}: {v}",
                    String::from_utf8_lossy(&body[..body.len().min(80)])
                ));
            } else if !v["error"]["message"].is_string() {
                wrong.push(format!("{method} {path}: no error message: {v}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Nothing was made: one session, no file, no key, no snapshot, no cgroup.
    fn assert_nothing_changed(self) {
        let Fixture {
            d,
            key,
            id,
            sandboxes_before,
        } = self;
        assert_eq!(session_count(&d, &key), 1);
        let (_, files) = d.request("GET", "/v1/files", Some(&key), None);
        assert_eq!(files["files"], json!([]));
        let (_, keys) = d.request("GET", "/v1/keys", Some(&key), None);
        assert_eq!(keys["keys"].as_array().unwrap().len(), 1, "{keys}");
        let (_, snaps) = d.request("GET", "/v1/snapshots", Some(&key), None);
        assert_eq!(snaps["snapshots"], json!([]));
        assert_eq!(sandboxes(&d), sandboxes_before);
        assert_eq!(sh(&d, &key, &id, "ls -A /workspace"), "");
        delete_session(&d, &key, &id);
    }
}

/// Malformed, out-of-range or oversized `POST /v1/sessions` bodies, and ones naming
/// what does not exist.
#[test]
fn root_bad_session_creates_are_refused_and_create_nothing() {
    require_root!();
    let f = Fixture::start();
    let big = Fixture::big();
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/sessions".into(),
            b"{".to_vec(),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            b"not json".to_vec(),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"bogus": 1}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"ttl_seconds": "soon"}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"memory": "lots"}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"swap": 1}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"ttl_seconds": 9223372036854775807}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"ttl_seconds": 18446744073709551615}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"ttl_seconds": 0}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"idle_timeout_seconds": 18446744073709551615}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"env": {"A=B": "c"}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"env": {"": "c"}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"nofile": 999999999999}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"memory": 0}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"cpus": "many"}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        // Over the daemon's --max-session-* (16G, 4096, the host's CPUs): the host's
        // memory, processes and CPU are every tenant's.
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"memory": "200G"}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"pids": 1000000}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"limits": {"cpus": 4096}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"image": "no-such-image"}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"files": [{"path": "../x", "file_id": "f"}]}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"files": [{"path": "x", "file_id": "nope"}]}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"{"snapshot": "snap_nope"}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            big.clone().into_bytes(),
            413,
            "payload_too_large",
        ),
        (
            "POST",
            "/v1/sessions".into(),
            br#"[]"#.to_vec(),
            422,
            "invalid_request",
        ),
    ];
    f.refuse_all(cases);
    f.assert_nothing_changed();
}

/// Malformed, out-of-range or oversized exec bodies on a live session.
#[test]
fn root_bad_exec_requests_are_refused_and_run_nothing() {
    require_root!();
    let f = Fixture::start();
    let big = Fixture::big();
    let exec_path = format!("/v1/sessions/{}/exec", f.id);
    let cases: Vec<Case> = vec![
        (
            "POST",
            exec_path.clone(),
            br#"{"argv": []}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"argv": ["a"], "cmd": "b"}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": "true", "timeout_ms": 0}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": "true", "timeout_ms": 99999999}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": "true", "cwd": "relative"}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": "true", "env": {"A=B": "c"}}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": 1}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": "true", "extra": 1}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            exec_path.clone(),
            br#"{"cmd": "tr"#.to_vec(),
            400,
            "bad_request",
        ),
        (
            "POST",
            exec_path.clone(),
            big.clone().into_bytes(),
            413,
            "payload_too_large",
        ),
    ];
    f.refuse_all(cases);
    f.assert_nothing_changed();
}

/// The admin's key and quota requests with bad bodies or an unknown tenant.
#[test]
fn root_bad_key_and_quota_requests_are_refused_and_change_nothing() {
    require_root!();
    let f = Fixture::start();
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/keys".into(),
            br#"{"tenant": 5}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/keys".into(),
            br#"{}"#.to_vec(),
            422,
            "invalid_request",
        ),
        (
            "PUT",
            "/v1/tenants/nobody-here/quotas".into(),
            br#"{"max_sessions": 1}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "PUT",
            "/v1/tenants/admin/quotas".into(),
            br#"{"max_sessions": -1}"#.to_vec(),
            422,
            "invalid_request",
        ),
    ];
    f.refuse_all(cases);
    f.assert_nothing_changed();
}

/// Unknown sessions, processes, snapshots, files and keys; bad paths and queries.
#[test]
fn root_unknown_ids_and_bad_paths_or_queries_are_refused_and_change_nothing() {
    require_root!();
    let f = Fixture::start();
    let id = &f.id;
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/sessions/ses_nope/exec".into(),
            br#"{"cmd": "true"}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            "/v1/sessions/ses_nope/pause".into(),
            b"".to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            format!("/v1/sessions/{id}/processes/12345/signal"),
            br#"{"signal": "TERM"}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            format!("/v1/sessions/{id}/processes/notanumber/wait"),
            b"".to_vec(),
            400,
            "bad_request",
        ),
        (
            "GET",
            format!("/v1/sessions/{id}/files?path=relative/path"),
            b"".to_vec(),
            422,
            "invalid_path",
        ),
        (
            "GET",
            format!("/v1/sessions/{id}/files"),
            b"".to_vec(),
            400,
            "bad_request",
        ),
        (
            "GET",
            format!("/v1/sessions/{id}/files?path=/workspace/none"),
            b"".to_vec(),
            404,
            "no_such_file",
        ),
        (
            "GET",
            format!("/v1/sessions/{id}/files?path=/workspace&bogus=1"),
            b"".to_vec(),
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/audit?limit=many".into(),
            b"".to_vec(),
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/snapshots/snap_nope".into(),
            b"".to_vec(),
            404,
            "not_found",
        ),
        // `/v1/files/nope` is onyx's route, with onyx's 404 (tests/api/onyx.rs).
        (
            "DELETE",
            "/v1/keys/key_nope".into(),
            b"".to_vec(),
            404,
            "not_found",
        ),
    ];
    f.refuse_all(cases);
    f.assert_nothing_changed();
}
