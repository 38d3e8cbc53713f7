//! Helpers the API tests share: a daemon, sessions, execs, files and the request
//! bodies (multipart, tar) they send.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use crate::common;
use crate::common::daemon::Daemon;
pub use crate::common::sessions::{error_code, q};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A daemon whose `/v1/execute` uses the host's python3.
pub fn daemon(extra: &[&str]) -> Daemon {
    let mut args = vec!["--default-image", "host"];
    args.extend_from_slice(extra);
    Daemon::start(&args)
}

/// A key for `tenant` (made with the admin key).
pub fn tenant_key(d: &Daemon, tenant: &str) -> (String, String) {
    let (status, k) = d.request(
        "POST",
        "/v1/keys",
        Some(d.admin_key()),
        Some(json!({"tenant": tenant, "name": format!("{tenant}-key")})),
    );
    assert_eq!(status, 201, "{k}");
    assert_fields(&k, &["key_id", "key", "tenant", "name", "created_at"]);
    assert_eq!(k["tenant"], tenant);
    (
        k["key"].as_str().unwrap().to_string(),
        k["key_id"].as_str().unwrap().to_string(),
    )
}

pub fn create(d: &Daemon, key: &str, body: Value) -> Value {
    let (status, s) = d.request("POST", "/v1/sessions", Some(key), Some(body));
    assert_eq!(status, 201, "create session: {s}");
    s
}

pub fn sid(session: &Value) -> String {
    session["session_id"].as_str().unwrap().to_string()
}

pub fn exec(d: &Daemon, key: &str, id: &str, body: Value) -> Value {
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(key),
        Some(body),
    );
    assert_eq!(status, 200, "exec: {r}");
    assert_fields(
        &r,
        &[
            "exit_code",
            "signal",
            "timed_out",
            "oom_killed",
            "file_locks_exceeded",
            "stdout",
            "stderr",
            "stdout_truncated",
            "stderr_truncated",
            "duration_ms",
        ],
    );
    r
}

/// stdout of a shell line run in the session (which must succeed).
pub fn sh(d: &Daemon, key: &str, id: &str, cmd: &str) -> String {
    let r = exec(d, key, id, json!({ "cmd": cmd }));
    assert_eq!(r["exit_code"], 0, "{cmd}: {r}");
    r["stdout"].as_str().unwrap().to_string()
}

pub fn delete_session(d: &Daemon, key: &str, id: &str) {
    let (status, body) = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(key), None);
    assert_eq!(status, 204, "delete session: {body}");
}

/// The ids `GET /v1/sessions{query}` lists for `key`.
pub fn session_ids(d: &Daemon, key: &str, query: &str) -> BTreeSet<String> {
    let (status, list) = d.request("GET", &format!("/v1/sessions{query}"), Some(key), None);
    assert_eq!(status, 200, "{query}: {list}");
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect()
}

pub fn session_count(d: &Daemon, key: &str) -> usize {
    let (status, list) = d.request("GET", "/v1/sessions", Some(key), None);
    assert_eq!(status, 200, "{list}");
    list["sessions"].as_array().unwrap().len()
}

pub fn leaves_of(session: &Value) -> Vec<String> {
    common::leaves(session)
}

/// The documented fields (docs/API.md) are all there.
#[track_caller]
pub fn assert_fields(value: &Value, fields: &[&str]) {
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"));
    for field in fields {
        assert!(object.contains_key(*field), "no {field} in {value}");
    }
}

pub fn files_url(id: &str, path: &str) -> String {
    format!("/v1/sessions/{id}/files?path={}", q(path))
}

/// Waits (up to a minute) until the session has a file at `path`.
#[track_caller]
pub fn wait_for_file(d: &Daemon, key: &str, id: &str, path: &str) {
    let there = || d.raw("GET", &files_url(id, path), Some(key), None, None).0 == 200;
    assert!(common::eventually(60_000, there), "no {path} in {id}");
}

/// Writes an empty file at `path` in the session.
pub fn put_file(d: &Daemon, key: &str, id: &str, path: &str) {
    let (status, body) = d.raw(
        "PUT",
        &files_url(id, path),
        Some(key),
        None,
        Some(Vec::new()),
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
}

/// Server-Sent Events read from a response body: (event, data as JSON).
pub struct Sse {
    reader: BufReader<Box<dyn Read + Send>>,
}

impl Sse {
    pub fn new(response: ureq::http::Response<ureq::Body>) -> Sse {
        let reader: Box<dyn Read + Send> = Box::new(response.into_body().into_reader());
        Sse {
            reader: BufReader::new(reader),
        }
    }
}

impl Iterator for Sse {
    type Item = (String, Value);

    fn next(&mut self) -> Option<(String, Value)> {
        let (mut event, mut data) = (String::new(), String::new());
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some((event, value));
            }
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
    }
}

/// POST with a JSON body, read as SSE.
pub fn sse_post(d: &Daemon, key: &str, path: &str, body: Value) -> Sse {
    let response = d.send(
        "POST",
        path,
        Some(key),
        Some("application/json"),
        serde_json::to_vec(&body).unwrap(),
    );
    assert_eq!(response.status(), 200, "POST {path}");
    Sse::new(response)
}

/// The daemon's peak resident memory (VmHWM), in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// A multipart/form-data body with one `file` field.
pub fn multipart(filename: &str, data: &[u8]) -> (String, Vec<u8>) {
    let boundary = "brig-test-boundary-7d1f3a";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

pub fn upload_file(d: &Daemon, key: &str, filename: &str, data: &[u8]) -> String {
    let (ct, body) = multipart(filename, data);
    let (status, bytes) = d.raw("POST", "/v1/files", Some(key), Some(&ct), Some(body));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 201, "{v}");
    assert_fields(&v, &["file_id", "filename", "size_bytes"]);
    assert_eq!(v["size_bytes"], data.len());
    v["file_id"].as_str().unwrap().to_string()
}

/// A tar entry with any name (also `..` or absolute ones, which `tar::Builder`
/// refuses to write).
pub fn tar_entry(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut header = tar::Header::new_old();
    {
        let bytes = header.as_mut_bytes();
        bytes[..name.len()].copy_from_slice(name.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_mode(if kind == tar::EntryType::Directory {
        0o755
    } else {
        0o644
    });
    header.set_size(data.len() as u64);
    header.set_mtime(1_700_000_000);
    if !link.is_empty() {
        let bytes = header.as_mut_bytes();
        bytes[157..157 + link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
}

pub fn tar_end(out: &mut Vec<u8>) {
    out.extend(std::iter::repeat_n(0u8, 1024));
}

/// Deterministic pseudo-random bytes (xorshift), streamed.
pub struct Noise {
    pub state: u64,
    pub left: u64,
    pub hash: Sha256,
}

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.left as usize) & !7;
        let n = if n == 0 {
            buf.len().min(self.left as usize)
        } else {
            n
        };
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            let bytes = self.state.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        self.hash.update(&buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

/// Imports a one-file image into the daemon's store (for snapshots).
pub fn import_tiny_image(d: &Daemon, name: &str) {
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("etc")).unwrap();
    std::fs::write(src.path().join("etc/tiny"), "tiny\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brig"))
        .env_remove("BRIG_STORE")
        .args(["image", "import", name])
        .arg(src.path())
        .arg("--store")
        .arg(d.store())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The daemon's sandbox processes, as a set (other tests run their own daemons, so
/// host-wide cgroup listings would race with them).
pub fn sandboxes(d: &Daemon) -> BTreeSet<u32> {
    d.descendants().into_iter().collect()
}

/// A raw request with `key` on a connection of its own: the headers, then `body`
/// (which may be less than `content_length` promises).
pub fn send_raw(
    d: &Daemon,
    method: &str,
    path: &str,
    key: &str,
    content_length: Option<usize>,
    body: &[u8],
) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(d.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let length = content_length.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n{length}\r\n"
    )
    .unwrap();
    stream.write_all(body).unwrap();
    stream
}

/// The audit events of one action, for the admin.
pub fn audit_of(d: &Daemon, action: &str) -> Vec<Value> {
    let (_, audit) = d.request(
        "GET",
        &format!("/v1/audit?action={action}"),
        Some(d.admin_key()),
        None,
    );
    audit["events"].as_array().cloned().unwrap_or_default()
}

/// One request written as is (`head` ends before the blank line) on a connection of
/// its own, with `body` after it: (status, body).
pub fn exchange(addr: &str, head: &str, body: &[u8]) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!("{head}\r\nConnection: close\r\n\r\n").into_bytes();
    request.extend_from_slice(body);
    std::io::Write::write_all(&mut stream, &request).unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply);
    let status = reply[9..12].parse().unwrap();
    let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// A tar bundle with `lib/tool.py`.
pub fn tool_bundle() -> Vec<u8> {
    let mut bundle = Vec::new();
    tar_entry(&mut bundle, "lib/", tar::EntryType::Directory, "", b"");
    tar_entry(
        &mut bundle,
        "lib/tool.py",
        tar::EntryType::Regular,
        "",
        b"print('from the bundle')\n",
    );
    tar_end(&mut bundle);
    bundle
}

/// The line of `/proc/self/mountinfo` inside the session for the mount at `path`.
pub fn mountinfo_line(d: &Daemon, key: &str, id: &str, path: &str) -> String {
    let info = sh(d, key, id, "cat /proc/self/mountinfo");
    info.lines()
        .find(|l| l.split(' ').nth(4) == Some(path))
        .unwrap_or_else(|| panic!("no mount at {path}:\n{info}"))
        .to_string()
}

/// What `GET /v1/tenants` says `tenant` uses.
pub fn tenant_usage(d: &Daemon, tenant: &str) -> Value {
    let (status, tenants) = d.request("GET", "/v1/tenants", Some(d.admin_key()), None);
    assert_eq!(status, 200, "{tenants}");
    tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == tenant)
        .unwrap_or_else(|| panic!("no tenant {tenant} in {tenants}"))["usage"]
        .clone()
}

/// Sets a tenant's quotas as the administrator; returns the tenant as answered.
pub fn set_quotas(d: &Daemon, tenant: &str, quotas: Value) -> Value {
    let (status, body) = d.request(
        "PUT",
        &format!("/v1/tenants/{tenant}/quotas"),
        Some(d.admin_key()),
        Some(quotas),
    );
    assert_eq!(status, 200, "{body}");
    body
}

pub fn set_disk_quota(d: &Daemon, tenant: &str, bytes: u64) {
    set_quotas(d, tenant, json!({ "max_disk_bytes": bytes }));
}

pub fn take_snapshot(d: &Daemon, key: &str, id: &str) -> (u16, Value) {
    d.request(
        "POST",
        &format!("/v1/sessions/{id}/snapshots"),
        Some(key),
        Some(json!({})),
    )
}

/// `POST /v1/sessions/{id}/restore` to the snapshot `snapshot_id`.
pub fn restore(d: &Daemon, key: &str, id: &str, snapshot_id: &Value) -> (u16, Value) {
    d.request(
        "POST",
        &format!("/v1/sessions/{id}/restore"),
        Some(key),
        Some(json!({ "snapshot_id": snapshot_id })),
    )
}

pub fn delete_snapshot(d: &Daemon, key: &str, snapshot: &Value) {
    let id = snapshot["snapshot_id"].as_str().unwrap();
    let (status, body) = d.request("DELETE", &format!("/v1/snapshots/{id}"), Some(key), None);
    assert_eq!(status, 204, "{body}");
}

pub fn snapshot_ids(d: &Daemon, key: &str) -> Vec<String> {
    let (status, list) = d.request("GET", "/v1/snapshots", Some(key), None);
    assert_eq!(status, 200, "{list}");
    list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot_id"].as_str().unwrap().to_string())
        .collect()
}

/// The image records and layer files in the daemon's store, by file name.
pub fn store_contents(d: &Daemon) -> (BTreeSet<String>, BTreeSet<String>) {
    let names = |dir: &str, ext: &str| -> BTreeSet<String> {
        std::fs::read_dir(d.store().join(dir))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.ends_with(ext))
                    .collect()
            })
            .unwrap_or_default()
    };
    (names("images", ".json"), names("layers", ".erofs"))
}

/// `len` incompressible bytes (a layer of them is about as large).
pub fn noise(seed: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Noise {
        state: seed,
        left: len,
        hash: Sha256::new(),
    }
    .read_to_end(&mut out)
    .unwrap();
    out
}

pub fn volumes(d: &Daemon, key: &str) -> Vec<Value> {
    let (status, list) = d.request("GET", "/v1/volumes", Some(key), None);
    assert_eq!(status, 200, "{list}");
    let list = list["volumes"].as_array().unwrap().clone();
    for v in &list {
        assert_fields(
            v,
            &[
                "name",
                "size_bytes",
                "capacity_bytes",
                "created_at",
                "sessions",
            ],
        );
    }
    list
}
