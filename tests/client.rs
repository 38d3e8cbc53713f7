//! `brig session|exec|cp|key` as clients of the daemon, against a fake HTTP server: a
//! few lines of hand-rolled HTTP/1.1 on 127.0.0.1:0, so these tests need neither root
//! nor a running `brig serve`. (Tests against the real daemon live elsewhere.)

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

/// One request as the fake server saw it.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    /// The path, percent-decoded.
    path: String,
    /// The path as sent.
    raw_path: String,
    /// The query, percent-decoded.
    query: HashMap<String, String>,
    /// The query as sent.
    raw_query: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// Serves each connection with `handler`, which writes the whole response; every
/// request is also sent to the returned receiver. One connection at a time, each
/// closed after its response (`Connection: close`).
fn fake_server(
    handler: impl Fn(&Request, &mut TcpStream) + Send + 'static,
) -> (String, Receiver<Request>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let Some(request) = read_request(&mut stream) else {
                continue;
            };
            if tx.send(request.clone()).is_err() {
                return;
            }
            handler(&request, &mut stream);
        }
    });
    (url, rx)
}

fn read_request(stream: &mut TcpStream) -> Option<Request> {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    if headers.get("expect").map(String::as_str) == Some("100-continue") {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").ok()?;
    }
    let mut body = Vec::new();
    if let Some(length) = headers.get("content-length") {
        body.resize(length.parse().ok()?, 0);
        reader.read_exact(&mut body).ok()?;
    } else if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let (path, raw_query) = target.split_once('?').unwrap_or((&target, ""));
    let query = raw_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect();
    Some(Request {
        method,
        path: decode(path),
        raw_path: path.to_string(),
        raw_query: raw_query.to_string(),
        query,
        headers,
        body,
    })
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

fn respond_json(stream: &mut TcpStream, status: &str, body: Value) {
    respond(
        stream,
        status,
        "application/json",
        body.to_string().as_bytes(),
    );
}

fn api_error(stream: &mut TcpStream, status: &str, code: &str, message: &str) {
    respond_json(
        stream,
        status,
        json!({"error": {"code": code, "message": message}}),
    );
}

fn sse(stream: &mut TcpStream, event: &str, data: Value) {
    let _ = write!(stream, "event: {event}\ndata: {data}\n\n");
    let _ = stream.flush();
}

fn sse_head(stream: &mut TcpStream) {
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    );
}

/// `brig ARGS` pointed at `url` with key `test-key`, and nothing from the caller's
/// environment or config that could change where it connects.
fn brig(url: &str, home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_brig"));
    for var in [
        "BRIG_CONFIG",
        "XDG_CONFIG_HOME",
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home)
        .env("BRIG_DATA_DIR", home)
        .env("BRIG_URL", url)
        .env("BRIG_API_KEY", "test-key")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn run(url: &str, home: &Path, args: &[&str]) -> Output {
    brig(url, home, args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn exec_streams_output_in_order_and_exits_with_the_command_status() {
    let home = tempfile::tempdir().unwrap();
    let (go_tx, go_rx) = channel::<()>();
    let (released_tx, released_rx) = channel::<bool>();
    let (url, requests) = fake_server(move |request, stream| {
        assert_eq!(request.path, "/v1/sessions/s1/exec/stream");
        sse_head(stream);
        let _ = stream.write_all(b": keep-alive\n\n");
        sse(stream, "stdout", json!({"data": "first\n"}));
        // The rest only once the test has seen "first" on brig's stdout: output must
        // be passed on as it arrives, not when the command ends.
        let released = go_rx.recv_timeout(Duration::from_secs(20)).is_ok();
        released_tx.send(released).unwrap();
        sse(stream, "stderr", json!({"data": "oops\n"}));
        sse(stream, "stdout", json!({"data": "second\n"}));
        sse(
            stream,
            "exit",
            json!({"exit_code": 7, "signal": null, "timed_out": false, "oom_killed": false, "duration_ms": 5}),
        );
    });
    let mut child = brig(
        &url,
        home.path(),
        &[
            "exec",
            "s1",
            "--cwd",
            "/tmp",
            "--env",
            "A=1",
            "--timeout",
            "5s",
            "--",
            "sh",
            "-c",
            "cat; exit 7",
        ],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"input line\n")
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"first\n");
    go_tx.send(()).unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(released_rx.recv().unwrap(), "output was not streamed");
    assert_eq!(rest, "second\n");
    assert_eq!(text(&out.stderr), "oops\n");
    assert_eq!(out.status.code(), Some(7));

    let request = requests.recv().unwrap();
    assert_eq!(request.method, "POST");
    assert_eq!(request.headers["authorization"], "Bearer test-key");
    assert_eq!(
        request.json(),
        json!({"argv": ["sh", "-c", "cat; exit 7"], "cwd": "/tmp", "env": {"A": "1"},
               "timeout_ms": 5000, "stdin": "input line\n"})
    );
}

#[test]
fn exec_maps_abnormal_ends_to_statuses() {
    let home = tempfile::tempdir().unwrap();
    for (exit, status, message) in [
        (json!({"exit_code": null, "signal": 15}), 143, ""),
        (
            json!({"exit_code": null, "signal": 9, "timed_out": true}),
            124,
            "brig: timed out; the command was killed\n",
        ),
        (
            json!({"exit_code": null, "signal": 9, "oom_killed": true}),
            137,
            "brig: killed: out of memory\n",
        ),
    ] {
        let (url, _requests) = fake_server(move |_, stream| {
            sse_head(stream);
            sse(stream, "exit", exit.clone());
        });
        let out = run(&url, home.path(), &["exec", "s1", "true"]);
        assert_eq!(out.status.code(), Some(status));
        assert_eq!(text(&out.stderr), message);
    }
    // An error event in the stream: one line, 125.
    let (url, _requests) = fake_server(|_, stream| {
        sse_head(stream);
        sse(stream, "stdout", json!({"data": "partial"}));
        sse(
            stream,
            "error",
            json!({"code": "internal", "message": "the sandbox died"}),
        );
    });
    let out = run(&url, home.path(), &["exec", "s1", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(text(&out.stdout), "partial");
    assert_eq!(text(&out.stderr), "brig: the sandbox died (internal)\n");
    // A stream cut before the exit event is brig's error, not success.
    let (url, _requests) = fake_server(|_, stream| {
        sse_head(stream);
        sse(stream, "stdout", json!({"data": "x"}));
    });
    let out = run(&url, home.path(), &["exec", "s1", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

#[test]
fn exec_json_uses_the_synchronous_endpoint() {
    let home = tempfile::tempdir().unwrap();
    let result = json!({"exit_code": 3, "signal": null, "timed_out": false, "oom_killed": false,
                        "stdout": "out", "stderr": "", "stdout_truncated": false,
                        "stderr_truncated": false, "duration_ms": 1});
    let answer = result.clone();
    let (url, requests) = fake_server(move |request, stream| {
        assert_eq!(request.path, "/v1/sessions/s1/exec");
        respond_json(stream, "200 OK", answer.clone());
    });
    let out = run(&url, home.path(), &["exec", "s1", "--json", "ls", "-la"]);
    assert_eq!(out.status.code(), Some(3));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, result);
    assert_eq!(
        requests.recv().unwrap().json(),
        json!({"argv": ["ls", "-la"]})
    );
}

#[test]
fn api_errors_print_one_line_and_exit_125() {
    let home = tempfile::tempdir().unwrap();
    let (url, _requests) = fake_server(|_, stream| {
        api_error(stream, "404 Not Found", "not_found", "no session 'nope'");
    });
    for args in [
        &["exec", "nope", "--", "true"][..],
        &["session", "rm", "nope"],
        &["session", "pause", "nope"],
        &["cp", "nope:/workspace/x", "-"],
    ] {
        let out = run(&url, home.path(), args);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.ends_with("no session 'nope' (not_found)\n") && stderr.lines().count() == 1,
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // With --json the error object is printed too.
    let out = run(&url, home.path(), &["session", "ls", "--json"]);
    assert_eq!(out.status.code(), Some(125));
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["error"]["code"], "not_found");
    // Not brig's API at all, and nobody listening: still one line.
    let (url, _requests) = fake_server(|_, stream| {
        respond(
            stream,
            "502 Bad Gateway",
            "text/html",
            b"<html>\n<b>bad</b>\n</html>",
        );
    });
    let out = run(&url, home.path(), &["session", "ls"]);
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run(
        &format!("http://127.0.0.1:{port}"),
        home.path(),
        &["session", "ls"],
    );
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1);
}

#[test]
fn cp_uploads_a_large_file_streamed_to_the_right_path() {
    let home = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..5u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
    let file = home.path().join("big.bin");
    std::fs::write(&file, &data).unwrap();
    let (url, requests) = fake_server(|request, stream| match request.method.as_str() {
        // The destination is not a directory.
        "GET" => api_error(stream, "404 Not Found", "no_such_file", "no such file"),
        _ => respond_json(
            stream,
            "201 Created",
            json!({"path": request.query["path"], "size_bytes": request.body.len()}),
        ),
    });
    let src = file.to_str().unwrap();
    let out = run(&url, home.path(), &["cp", src, "s1:/workspace/data.bin"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let probe = requests.recv().unwrap();
    assert_eq!(
        (probe.method.as_str(), probe.path.as_str()),
        ("GET", "/v1/sessions/s1/dir")
    );
    let put = requests.recv().unwrap();
    assert_eq!(put.method, "PUT");
    assert_eq!(put.path, "/v1/sessions/s1/files");
    assert_eq!(put.query["path"], "/workspace/data.bin");
    assert_eq!(put.headers["content-length"], data.len().to_string());
    assert_eq!(put.headers["authorization"], "Bearer test-key");
    assert!(put.body == data, "the uploaded bytes differ");

    // Into a directory (trailing slash): the file keeps its name, no probe needed.
    let out = run(&url, home.path(), &["cp", src, "s1:/workspace/"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let put = requests.recv().unwrap();
    assert_eq!(put.query["path"], "/workspace/big.bin");

    // From stdin (`-`): streamed as it is read, so chunked.
    let mut child = brig(&url, home.path(), &["cp", "-", "s1:/workspace/in.txt"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let put = requests.recv().unwrap();
    assert_eq!(put.query["path"], "/workspace/in.txt");
    assert_eq!(put.body, b"from stdin\n");
}

#[test]
fn cp_uploads_a_directory_as_a_tar() {
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("proj");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), "A").unwrap();
    std::fs::write(src.join("sub/b.txt"), "B").unwrap();
    let (url, requests) = fake_server(|request, stream| match request.method.as_str() {
        // The destination is an existing directory: the source keeps its name.
        "GET" => respond_json(
            stream,
            "200 OK",
            json!({"path": "/workspace", "entries": []}),
        ),
        _ => respond_json(
            stream,
            "201 Created",
            json!({"path": "/workspace/proj", "entries": 3}),
        ),
    });
    let out = run(
        &url,
        home.path(),
        &["cp", src.to_str().unwrap(), "s1:/workspace"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    requests.recv().unwrap();
    let put = requests.recv().unwrap();
    assert_eq!(put.path, "/v1/sessions/s1/archive");
    assert_eq!(put.query["path"], "/workspace/proj");
    let mut archive = tar::Archive::new(put.body.as_slice());
    let mut names: Vec<String> = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "sub", "sub/b.txt"]);
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut header = tar::Header::new_gnu();
        // Written raw: the tar crate refuses to build the hostile names tested here.
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn cp_downloads_files_and_directories() {
    let home = tempfile::tempdir().unwrap();
    let good = tar_of(&[("a.txt", b"A"), ("sub/b.txt", b"B")]);
    let evil = tar_of(&[("ok.txt", b"ok"), ("../escaped.txt", b"x")]);
    let (url, requests) = fake_server(move |request, stream| {
        let path = request.query.get("path").cloned().unwrap_or_default();
        match (request.path.as_str(), path.as_str()) {
            ("/v1/sessions/s1/files", "/workspace/out.txt") => {
                respond(stream, "200 OK", "application/octet-stream", b"hello\n")
            }
            ("/v1/sessions/s1/files", _) => {
                api_error(stream, "409 Conflict", "not_a_file", "not a regular file")
            }
            ("/v1/sessions/s1/dir", _) => {
                respond_json(stream, "200 OK", json!({"path": path, "entries": []}))
            }
            ("/v1/sessions/s1/archive", "/workspace/evil") => {
                respond(stream, "200 OK", "application/x-tar", &evil)
            }
            ("/v1/sessions/s1/archive", _) => respond(stream, "200 OK", "application/x-tar", &good),
            _ => api_error(stream, "404 Not Found", "not_found", "no route"),
        }
    });
    let dst = home.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let dst_s = dst.to_str().unwrap();

    // A file into a local directory keeps its name.
    let out = run(&url, home.path(), &["cp", "s1:/workspace/out.txt", dst_s]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dst.join("out.txt")).unwrap(), b"hello\n");
    // To stdout.
    let out = run(&url, home.path(), &["cp", "s1:/workspace/out.txt", "-"]);
    assert_eq!(text(&out.stdout), "hello\n");

    // A directory, found out from the 409: fetched as a tar and extracted.
    let out = run(&url, home.path(), &["cp", "s1:/workspace/res", dst_s]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dst.join("res/sub/b.txt")).unwrap(), b"B");
    let seen: Vec<String> = requests.try_iter().map(|r| r.path).collect();
    assert!(seen.ends_with(&[
        "/v1/sessions/s1/files".to_string(),
        "/v1/sessions/s1/dir".to_string(),
        "/v1/sessions/s1/archive".to_string(),
    ]));
    // -r goes straight to the archive, into a new local directory.
    let out = run(
        &url,
        home.path(),
        &["cp", "-r", "s1:/workspace/res", &format!("{dst_s}/new")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dst.join("new/a.txt")).unwrap(), b"A");
    assert_eq!(requests.try_iter().count(), 1);

    // An entry escaping the destination is refused.
    let out = run(
        &url,
        home.path(),
        &["cp", "-r", "s1:/workspace/evil", dst_s],
    );
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("refusing archive entry '../escaped.txt'"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1);
    assert!(!dst.join("escaped.txt").exists() && !home.path().join("escaped.txt").exists());
}

#[test]
fn tenant_commands() {
    let home = tempfile::tempdir().unwrap();
    let acme = json!({"tenant": "acme", "created_at": "2026-01-01T00:00:00.000Z",
        "quotas": {"max_sessions": 20, "max_concurrent_execs": 4, "max_disk_bytes": 10u64 << 30},
        "usage": {"sessions": 3, "concurrent_execs": 1, "file_bytes": 0, "volume_bytes": 0,
                  "snapshot_bytes": 0, "session_disk_bytes": 3u64 << 29, "disk_bytes": 3u64 << 29}});
    let served = acme.clone();
    let (url, requests) = fake_server(move |request, stream| {
        match (request.method.as_str(), request.path.as_str()) {
            ("GET", "/v1/tenants") => {
                respond_json(stream, "200 OK", json!({"tenants": [served.clone()]}))
            }
            ("GET", "/v1/tenants/acme") | ("PUT", "/v1/tenants/acme/quotas") => {
                respond_json(stream, "200 OK", served.clone())
            }
            _ => api_error(stream, "404 Not Found", "not_found", "no tenant nobody"),
        }
    });
    let table = "TENANT  SESSIONS  EXECS  DISK\n\
                 acme    3/20      1/4    1.5 GiB of 10.0 GiB\n";
    let out = run(&url, home.path(), &["tenant", "ls"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), table);
    requests.recv().unwrap();

    let out = run(&url, home.path(), &["tenant", "show", "acme", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&text(&out.stdout)).unwrap(),
        acme
    );
    assert_eq!(requests.recv().unwrap().path, "/v1/tenants/acme");

    let out = run(
        &url,
        home.path(),
        &[
            "tenant",
            "quota",
            "acme",
            "--max-sessions",
            "20",
            "--max-disk",
            "10G",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), table);
    let put = requests.recv().unwrap();
    assert_eq!(put.method, "PUT");
    assert_eq!(
        put.json(),
        json!({"max_sessions": 20, "max_disk_bytes": 10u64 << 30}),
        "options left out are not sent, so they stay as they are"
    );

    let out = run(
        &url,
        home.path(),
        &[
            "tenant",
            "quota",
            "acme",
            "--max-concurrent-execs",
            "default",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        requests.recv().unwrap().json(),
        json!({"max_concurrent_execs": null}),
        "\"default\" is the API's null"
    );

    // Nothing to set, a bad size or count: refused before any request.
    for args in [
        &["tenant", "quota", "acme"][..],
        &["tenant", "quota", "acme", "--max-disk", "lots"][..],
        &["tenant", "quota", "acme", "--max-sessions", "-1"][..],
    ] {
        let out = run(&url, home.path(), args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(
            text(&out.stderr).lines().count(),
            1,
            "{}",
            text(&out.stderr)
        );
    }
    let out = run(&url, home.path(), &["tenant", "show", "nobody"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("no tenant nobody"),
        "{}",
        text(&out.stderr)
    );
    requests.recv().unwrap();
    assert!(
        requests.try_recv().is_err(),
        "a refused command sent a request"
    );
}

#[test]
fn session_and_key_commands() {
    let home = tempfile::tempdir().unwrap();
    let (url, requests) = fake_server(|request, stream| {
        match (request.method.as_str(), request.path.as_str()) {
            ("POST", "/v1/sessions") => respond_json(
                stream,
                "201 Created",
                json!({"session_id": "ses_123", "state": "running"}),
            ),
            ("GET", "/v1/sessions") => respond_json(
                stream,
                "200 OK",
                json!({"sessions": [{"session_id": "ses_123", "state": "running", "image": "python",
                       "created_at": "2026-01-01T00:00:00Z", "expires_at": null}]}),
            ),
            ("GET", "/v1/sessions/ses_123/stats") => respond_json(
                stream,
                "200 OK",
                json!({"session_id": "ses_123", "memory_bytes": 26_214_400, "memory_peak_bytes": 31_457_280,
                       "memory_limit_bytes": 536_870_912, "cpu_seconds": 0.529, "cpus_limit": 1.0,
                       "tasks": 4, "tasks_limit": 256, "disk_used_bytes": null,
                       "disk_limit_bytes": 536_870_912, "oom_kills": 0}),
            ),
            ("GET", "/v1/sessions/ses_vol/stats") => respond_json(
                stream,
                "200 OK",
                json!({"session_id": "ses_vol", "memory_bytes": 26_214_400, "memory_peak_bytes": null,
                       "memory_limit_bytes": 536_870_912, "cpu_seconds": 0.5, "cpus_limit": null,
                       "tasks": 1, "tasks_limit": 256, "disk_used_bytes": 4096,
                       "disk_limit_bytes": 536_870_912, "volume_used_bytes": 52_428_800,
                       "volume_size_bytes": 1_040_187_392, "oom_kills": 0}),
            ),
            ("PATCH", "/v1/sessions/ses_123") => respond_json(
                stream,
                "200 OK",
                json!({"session_id": "ses_123", "state": "running", "metadata": {"chat": "c2"}}),
            ),
            ("POST", "/v1/sessions/ses_123/snapshots") => respond_json(
                stream,
                "201 Created",
                json!({"snapshot_id": "snap_9", "name": "base"}),
            ),
            ("POST", "/v1/keys") => respond_json(
                stream,
                "201 Created",
                json!({"key_id": "key_1", "key": "brig_secret", "tenant": "acme"}),
            ),
            ("DELETE", _) => respond(stream, "204 No Content", "text/plain", b""),
            _ => api_error(stream, "404 Not Found", "not_found", "no route"),
        }
    });
    let out = run(
        &url,
        home.path(),
        &[
            "session",
            "create",
            "--image",
            "python",
            "--env",
            "A=b=c",
            "--memory",
            "1G",
            "--cpus",
            "0.5",
            "--pids",
            "64",
            "--ttl",
            "2m",
            "--idle-timeout",
            "1500ms",
            "--meta",
            "user=u1",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ses_123\n");
    assert_eq!(
        requests.recv().unwrap().json(),
        json!({"image": "python", "env": {"A": "b=c"},
               "limits": {"memory": 1u64 << 30, "cpus": 0.5, "pids": 64},
               "ttl_seconds": 120, "idle_timeout_seconds": 2, "metadata": {"user": "u1"}})
    );

    let out = run(&url, home.path(), &["session", "ls"]);
    assert_eq!(
        text(&out.stdout),
        "ID       STATE    IMAGE   CREATED               EXPIRES\n\
         ses_123  running  python  2026-01-01T00:00:00Z  -\n"
    );
    requests.recv().unwrap();
    let out = run(
        &url,
        home.path(),
        &[
            "session",
            "ls",
            "--meta",
            "user=u1",
            "--meta",
            "chat=c/2 &x",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed = requests.recv().unwrap();
    assert_eq!(listed.path, "/v1/sessions");
    assert_eq!(
        listed.raw_query,
        "metadata=user%3Du1&metadata=chat%3Dc%2F2%20%26x"
    );
    let out = run(&url, home.path(), &["session", "ls", "--meta", "user"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("bad --meta 'user'"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&url, home.path(), &["session", "stats", "ses_123"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "           USED      LIMIT\n\
         memory     25.0 MiB  512.0 MiB  peak 30.0 MiB\n\
         cpu        0.53 s    1 CPUs\n\
         tasks      4         256\n\
         disk       -         512.0 MiB\n\
         oom kills  0\n"
    );
    assert_eq!(requests.recv().unwrap().path, "/v1/sessions/ses_123/stats");
    // A session with a volume: its own line, after the disk.
    let out = run(&url, home.path(), &["session", "stats", "ses_vol"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "           USED      LIMIT\n\
         memory     25.0 MiB  512.0 MiB  peak -\n\
         cpu        0.50 s    - CPUs\n\
         tasks      1         256\n\
         disk       4.0 KiB   512.0 MiB\n\
         volume     50.0 MiB  992.0 MiB  shared\n\
         oom kills  0\n"
    );
    requests.recv().unwrap();
    let out = run(
        &url,
        home.path(),
        &["session", "stats", "ses_123", "--json"],
    );
    let printed: Value = serde_json::from_slice(&out.stdout).expect("the stats as JSON");
    assert_eq!(printed["tasks"], 4);
    requests.recv().unwrap();

    // update: only what is given is sent; the labels are replaced as a whole.
    let out = run(
        &url,
        home.path(),
        &[
            "session",
            "update",
            "ses_123",
            "--ttl",
            "90m",
            "--idle-timeout",
            "0",
            "--meta",
            "chat=c2",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let updated = requests.recv().unwrap();
    assert_eq!(
        (updated.method.as_str(), updated.path.as_str()),
        ("PATCH", "/v1/sessions/ses_123")
    );
    assert_eq!(
        updated.json(),
        json!({"ttl_seconds": 5400, "idle_timeout_seconds": 0, "metadata": {"chat": "c2"}})
    );
    let printed: Value = serde_json::from_slice(&out.stdout).expect("the session as JSON");
    assert_eq!(printed["session_id"], "ses_123");
    let out = run(
        &url,
        home.path(),
        &["session", "update", "ses_123", "--clear-meta"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(requests.recv().unwrap().json(), json!({"metadata": {}}));
    for refused in [
        &["session", "update", "ses_123"][..],
        &["session", "update", "ses_123", "--meta", "chat"],
        &["session", "update", "ses_123", "--ttl", "soon"],
        &[
            "session",
            "update",
            "ses_123",
            "--meta",
            "a=b",
            "--clear-meta",
        ],
    ] {
        let out = run(&url, home.path(), refused);
        assert_ne!(out.status.code(), Some(0), "{refused:?}");
        assert_eq!(
            text(&out.stderr).trim().lines().count(),
            1,
            "{refused:?}: {}",
            text(&out.stderr)
        );
    }
    assert!(
        requests.try_recv().is_err(),
        "a refused update sent a request"
    );

    let out = run(
        &url,
        home.path(),
        &["session", "snapshot", "ses_123", "--name", "base"],
    );
    assert_eq!(text(&out.stdout), "snap_9\n");
    assert_eq!(requests.recv().unwrap().json(), json!({"name": "base"}));

    let out = run(&url, home.path(), &["session", "rm", "ses_123", "ses/odd"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let paths: Vec<String> = requests.try_iter().map(|r| r.raw_path).collect();
    // Ids are one path segment each, whatever they contain.
    assert_eq!(paths, ["/v1/sessions/ses_123", "/v1/sessions/ses%2Fodd"]);

    let out = run(
        &url,
        home.path(),
        &["key", "create", "acme", "--name", "ci"],
    );
    assert_eq!(text(&out.stdout), "brig_secret\n");
    assert_eq!(
        requests.recv().unwrap().json(),
        json!({"tenant": "acme", "name": "ci"})
    );
}

#[test]
fn code_sends_stdin_and_prints_output_results_and_the_traceback() {
    let home = tempfile::tempdir().unwrap();
    let (url, requests) = fake_server(|request, stream| {
        assert_eq!(request.path, "/v1/sessions/s1/code");
        assert_eq!(request.headers["accept"], "text/event-stream");
        sse_head(stream);
        sse(stream, "stdout", json!({"data": "hi\n"}));
        sse(
            stream,
            "result",
            json!({"data": {"text/plain": "42", "text/html": "<b>42</b>"}, "main": true}),
        );
        sse(
            stream,
            "error",
            json!({"name": "ValueError", "value": "v", "traceback": "Traceback: ValueError: v\n"}),
        );
        sse(
            stream,
            "end",
            json!({"context_id": "ctx_1", "execution_count": 3, "timed_out": false, "duration_ms": 5}),
        );
    });
    let mut child = brig(
        &url,
        home.path(),
        &["code", "s1", "--context", "ctx_1", "--timeout", "2s"],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"x = 1\nx\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "hi\n42\n");
    assert_eq!(text(&out.stderr), "Traceback: ValueError: v\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        requests.recv().unwrap().json(),
        json!({"code": "x = 1\nx\n", "context_id": "ctx_1", "timeout_ms": 2000})
    );
}
