//! Sessions of a test daemon, driven through the HTTP API: the few calls that
//! tests share outside tests/api/support.rs (create, run a shell line, delete).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use super::daemon::Daemon;

/// A new API key of tenant `tenant` (made with the admin key).
pub fn tenant_key(d: &Daemon, tenant: &str) -> String {
    let (status, k) = d.request(
        "POST",
        "/v1/keys",
        Some(d.admin_key()),
        Some(json!({"tenant": tenant, "name": format!("{tenant}-key")})),
    );
    assert_eq!(status, 201, "{k}");
    k["key"].as_str().unwrap().to_string()
}

/// A new session with the daemon's defaults; its id.
pub fn create(d: &Daemon, key: &str) -> String {
    let (status, s) = d.request("POST", "/v1/sessions", Some(key), Some(json!({})));
    assert_eq!(status, 201, "create session: {s}");
    s["session_id"].as_str().unwrap().to_string()
}

/// stdout of a shell line run in the session, which must succeed.
pub fn sh(d: &Daemon, key: &str, id: &str, cmd: &str) -> String {
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(key),
        Some(json!({ "cmd": cmd })),
    );
    assert_eq!(status, 200, "exec: {r}");
    assert_eq!(r["exit_code"], 0, "{cmd}: {r}");
    r["stdout"].as_str().unwrap().to_string()
}

pub fn delete(d: &Daemon, key: &str, id: &str) {
    let (status, body) = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(key), None);
    assert_eq!(status, 204, "delete session: {body}");
}

/// `value` percent-encoded for a query string.
pub fn q(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A GET on a connection of its own, of which only the first `bytes` of the
/// response (status line and headers included) are read: the rest is left for
/// the daemon to wait on. Reading gives up after `patience`.
pub fn get_and_stall(
    d: &Daemon,
    path: &str,
    key: &str,
    bytes: usize,
    patience: Duration,
) -> (TcpStream, Vec<u8>) {
    let mut stream = TcpStream::connect(d.addr()).unwrap();
    stream.set_read_timeout(Some(patience)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let mut head = vec![0u8; bytes];
    let mut got = 0;
    while got < bytes {
        match stream.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => panic!("GET {path}: read {got} bytes, then: {e}"),
        }
    }
    head.truncate(got);
    (stream, head)
}

/// The error code of an error body.
pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}
