//! Files the API writes into a session are the session's memory, not the daemon's.
//!
//! A session's /tmp and /workspace are tmpfs, whose pages are charged to the memory
//! cgroup of the task that writes them. Written by the daemon, a 64 MiB session held
//! hundreds of MiB of uploads, its `memory_bytes` stayed near zero and the daemon's
//! own cgroup grew instead (on cgroup v1 the parent of every session's: one tenant's
//! uploads pressed on all the others). These tests upload far past a session's
//! memory limit through each way in (`PUT files`, `PUT archive`, a create's `files`)
//! and check that the uploads stop at the limit with a clean error, that the session
//! counts what it holds, and that the daemon's own cgroup took none of it.

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
/// The session's memory limit.
const LIMIT: u64 = 64 * MIB;
/// Each file uploaded.
const FILE: u64 = 16 * MIB;
/// What the tests try to upload in all: three times the limit.
const TOTAL: u64 = 200 * MIB;
/// What the daemon's own cgroup may gain in tmpfs pages while they run (it is shared
/// with nothing else of the session's, but the daemon writes its own small files).
const DAEMON_SLACK: u64 = 16 * MIB;
/// Each upload takes well under a second; a session and its daemon, a few.
const PATIENCE: Duration = Duration::from_secs(120);

fn create(d: &Daemon, body: Value) -> Value {
    let (status, s) = d.request("POST", "/v1/sessions", Some(d.admin_key()), Some(body));
    assert_eq!(status, 201, "create session: {s}");
    s
}

fn sid(session: &Value) -> String {
    session["session_id"].as_str().unwrap().to_string()
}

/// Limited in memory, with a disk larger than everything uploaded: memory is what
/// stops the uploads.
fn limited() -> Value {
    json!({"limits": {"memory": "64M", "disk": "1G"}})
}

fn q(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn memory_bytes(d: &Daemon, id: &str) -> u64 {
    let (status, s) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/stats"),
        Some(d.admin_key()),
        None,
    );
    assert_eq!(status, 200, "{s}");
    s["memory_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("memory_bytes is not reported: {s}"))
}

/// tmpfs pages charged to the daemon's own memory cgroup, not its children's (on
/// cgroup v1 sessions' cgroups are below the daemon's; `shmem` there is local).
fn daemon_shmem(d: &Daemon) -> u64 {
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", d.pid())).unwrap();
    let (v1, v2) = cgroups.lines().fold((None, None), |(v1, v2), line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        match (controllers, path) {
            (Some(c), Some(p)) if c.split(',').any(|c| c == "memory") => (Some(p.to_string()), v2),
            (Some(""), Some(p)) => (v1, Some(p.to_string())),
            _ => (v1, v2),
        }
    });
    let stat = match (v1, v2) {
        (Some(path), _) => PathBuf::from(format!("/sys/fs/cgroup/memory{path}/memory.stat")),
        (None, Some(path)) => PathBuf::from(format!("/sys/fs/cgroup{path}/memory.stat")),
        _ => panic!("no memory cgroup for the daemon in {cgroups}"),
    };
    let text = std::fs::read_to_string(&stat).unwrap_or_else(|e| panic!("{}: {e}", stat.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("shmem "))
        .unwrap_or_else(|| panic!("no shmem in {}", stat.display()))
        .trim()
        .parse()
        .unwrap()
}

/// `len` bytes of a pattern no filesystem could share or compress away.
struct Pattern {
    left: u64,
    state: u64,
}

impl Pattern {
    fn new(len: u64, seed: u64) -> Pattern {
        Pattern {
            left: len,
            state: seed | 1,
        }
    }
}

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize & !7;
        let n = if n == 0 {
            self.left.min(buf.len() as u64) as usize
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
        self.left -= n as u64;
        Ok(n)
    }
}

/// The status and JSON body of a streamed upload. A daemon may answer before it has
/// read the whole body, and close the connection while the client still sends it
/// (which an HTTP client takes for a failed request): so the body goes out from a
/// thread of its own, errors ignored, while the answer is read here.
fn put_streamed(
    d: &Daemon,
    path: &str,
    content_type: &str,
    mut body: impl Read + Send + 'static,
) -> (u16, Value) {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(d.addr()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n",
        d.addr(),
        d.admin_key()
    );
    let mut out = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        out.write_all(head.as_bytes())?;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = body.read(&mut buf)?;
            out.write_all(format!("{n:x}\r\n").as_bytes())?;
            if n == 0 {
                return out.write_all(b"\r\n");
            }
            out.write_all(&buf[..n])?;
            out.write_all(b"\r\n")?;
        }
    });
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("PUT {path}: bad status line {line:?}"));
    let mut length = None;
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let mut bytes = vec![0u8; length.expect("a content-length")];
    reader.read_exact(&mut bytes).unwrap();
    // The answer is in: whatever of the body is still unsent goes nowhere.
    let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
    let _ = sender.join();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// The refusal of an upload that does not fit in the session's memory.
fn assert_memory_full(status: u16, body: &Value, what: &str) {
    assert_eq!(status, 507, "{what}: {body}");
    assert_eq!(body["error"]["code"], "memory_full", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(!message.contains('\n'), "{what}: {message:?}");
    assert!(message.contains("memory"), "{what}: {message:?}");
}

/// The session still runs commands, and the daemon still answers.
fn assert_alive(d: &mut Daemon, id: &str) {
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(d.admin_key()),
        Some(json!({"cmd": "echo alive", "timeout_ms": 30000})),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "alive\n", "{r}");
    assert!(d.running(), "the daemon died");
}

fn delete(d: &Daemon, id: &str) {
    let (status, body) = d.request(
        "DELETE",
        &format!("/v1/sessions/{id}"),
        Some(d.admin_key()),
        None,
    );
    assert_eq!(status, 204, "{body}");
}

#[test]
fn root_uploaded_files_are_charged_to_the_session_and_stop_at_its_memory_limit() {
    require_root!();
    let started = Instant::now();
    let mut d = Daemon::start(&[]);
    let id = sid(&create(&d, limited()));
    let daemon_before = daemon_shmem(&d);
    let mut accepted = 0u64;
    let mut refused = None;
    for i in 0..TOTAL / FILE {
        let path = format!(
            "/v1/sessions/{id}/files?path={}",
            q(&format!("/workspace/f{i}"))
        );
        let (status, body) =
            put_streamed(&d, &path, "application/octet-stream", Pattern::new(FILE, i));
        if status == 201 {
            assert_eq!(body["size_bytes"], FILE, "{body}");
            accepted += FILE;
            continue;
        }
        assert_memory_full(status, &body, &format!("upload {i}"));
        refused = Some(i);
        break;
    }
    assert!(
        started.elapsed() < PATIENCE,
        "uploads took {:?}",
        started.elapsed()
    );
    let daemon_grew = daemon_shmem(&d).saturating_sub(daemon_before);
    assert!(
        refused.is_some(),
        "all {} MiB were accepted into a session of {} MiB; the daemon's cgroup grew by {} MiB",
        accepted / MIB,
        LIMIT / MIB,
        daemon_grew / MIB
    );
    assert!(accepted <= LIMIT, "{} MiB accepted", accepted / MIB);
    // What it holds is the session's, as its limit counts it.
    let charged = memory_bytes(&d, &id);
    assert!(
        charged >= accepted,
        "the session holds {} MiB of uploads but memory_bytes is {charged}",
        accepted / MIB
    );
    assert!(
        daemon_grew < DAEMON_SLACK,
        "the daemon's own cgroup grew by {} MiB",
        daemon_grew / MIB
    );
    // Nothing of the refused file is left, and the files that fit are whole.
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(d.admin_key()),
        Some(json!({"cmd": "ls -A /workspace; wc -c < /workspace/f0", "timeout_ms": 30000})),
    );
    assert_eq!(status, 200, "{r}");
    let listed = r["stdout"].as_str().unwrap();
    let names: Vec<&str> = listed
        .lines()
        .filter(|l| l.starts_with('f') || l.starts_with('.'))
        .collect();
    assert_eq!(names.len() as u64, accepted / FILE, "{listed}");
    assert!(listed.ends_with(&format!("{FILE}\n")), "{listed}");
    // Freed, it takes uploads again.
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(d.admin_key()),
        Some(json!({"cmd": "rm -f /workspace/f*", "timeout_ms": 30000})),
    );
    assert_eq!(status, 200, "{r}");
    let path = format!("/v1/sessions/{id}/files?path={}", q("/workspace/again"));
    let (status, body) = put_streamed(
        &d,
        &path,
        "application/octet-stream",
        Pattern::new(FILE, 99),
    );
    assert_eq!(status, 201, "{body}");
    assert_alive(&mut d, &id);
    delete(&d, &id);
    d.stop();
}

#[test]
fn root_an_uploaded_archive_is_charged_to_the_session_and_stops_at_its_memory_limit() {
    require_root!();
    let started = Instant::now();
    // An archive may hold this much (the default is 100 MiB).
    let mut d = Daemon::start(&["--max-file-size", "1G"]);
    let id = sid(&create(&d, limited()));
    let daemon_before = daemon_shmem(&d);
    // One archive of TOTAL bytes of files, streamed.
    let entries: Vec<Box<dyn Read + Send>> = (0..TOTAL / FILE)
        .flat_map(|i| {
            let mut header = tar::Header::new_gnu();
            header.set_path(format!("a{i}")).unwrap();
            header.set_size(FILE);
            header.set_mode(0o644);
            header.set_mtime(1_700_000_000);
            header.set_cksum();
            [
                Box::new(std::io::Cursor::new(header.as_bytes().to_vec())) as Box<dyn Read + Send>,
                Box::new(Pattern::new(FILE, i)),
            ]
        })
        .chain(std::iter::once(
            Box::new(std::io::Cursor::new(vec![0u8; 1024])) as Box<dyn Read + Send>,
        ))
        .collect();
    let body = entries.into_iter().fold(
        Box::new(std::io::empty()) as Box<dyn Read + Send>,
        |a, b| Box::new(a.chain(b)),
    );
    let path = format!("/v1/sessions/{id}/archive?path={}", q("/workspace/tree"));
    let (status, body) = put_streamed(&d, &path, "application/x-tar", body);
    assert!(
        started.elapsed() < PATIENCE,
        "the upload took {:?}",
        started.elapsed()
    );
    let daemon_grew = daemon_shmem(&d).saturating_sub(daemon_before);
    assert!(
        status != 201,
        "an archive of {} MiB was extracted into a session of {} MiB; the daemon's cgroup grew \
         by {} MiB",
        TOTAL / MIB,
        LIMIT / MIB,
        daemon_grew / MIB
    );
    assert_memory_full(status, &body, "archive");
    assert!(
        daemon_grew < DAEMON_SLACK,
        "the daemon's own cgroup grew by {} MiB",
        daemon_grew / MIB
    );
    // A refused archive leaves nothing of itself, down to the directory it made.
    let (status, r) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(d.admin_key()),
        Some(json!({"cmd": "ls -A /workspace", "timeout_ms": 30000})),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "", "{r}");
    assert_alive(&mut d, &id);
    delete(&d, &id);
    d.stop();
}

#[test]
fn root_a_creates_files_are_charged_to_the_session_and_refused_past_its_memory_limit() {
    require_root!();
    let started = Instant::now();
    let mut d = Daemon::start(&[]);
    // Stored files, uploaded to the daemon's file store (its disk, not a session).
    let mut ids = Vec::new();
    for i in 0..5u64 {
        let mut data = Vec::with_capacity(FILE as usize);
        Pattern::new(FILE, i).read_to_end(&mut data).unwrap();
        let boundary = "brig-upload-memory-boundary";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f{i}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(&data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let (status, bytes) = d.raw(
            "POST",
            "/v1/files",
            Some(d.admin_key()),
            Some(&format!("multipart/form-data; boundary={boundary}")),
            Some(body),
        );
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(status, 201, "{v}");
        ids.push(v["file_id"].as_str().unwrap().to_string());
    }
    let files = |n: usize| -> Vec<Value> {
        ids[..n]
            .iter()
            .enumerate()
            .map(|(i, file_id)| json!({"file_id": file_id, "path": format!("in/f{i}")}))
            .collect()
    };
    let daemon_before = daemon_shmem(&d);

    // 80 MiB of files into 64 MiB: refused, and no session is left.
    let mut body = limited();
    body["files"] = json!(files(5));
    let (status, refused) = d.request("POST", "/v1/sessions", Some(d.admin_key()), Some(body));
    let (_, listed) = d.request("GET", "/v1/sessions", Some(d.admin_key()), None);
    let daemon_grew = daemon_shmem(&d).saturating_sub(daemon_before);
    assert!(
        status != 201,
        "a session of {} MiB was created with 80 MiB of files; the daemon's cgroup grew by {} MiB",
        LIMIT / MIB,
        daemon_grew / MIB
    );
    assert_memory_full(status, &refused, "create");
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 0, "{listed}");
    assert!(
        daemon_grew < DAEMON_SLACK,
        "the daemon's own cgroup grew by {} MiB",
        daemon_grew / MIB
    );

    // 32 MiB fit, and are the session's.
    let mut body = limited();
    body["files"] = json!(files(2));
    let id = sid(&create(&d, body));
    let charged = memory_bytes(&d, &id);
    assert!(
        charged >= 2 * FILE,
        "the session holds 32 MiB of files but memory_bytes is {charged}"
    );
    assert!(started.elapsed() < PATIENCE, "took {:?}", started.elapsed());
    assert_alive(&mut d, &id);
    delete(&d, &id);
    d.stop();
}
