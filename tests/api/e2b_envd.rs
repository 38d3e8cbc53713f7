//! envd (E2B's in-sandbox daemon, port 49983) as brig's daemon answers it: the
//! Connect protocol with the JSON codec, the process and filesystem services,
//! `/files`, `/health`; and bad input answered with Connect's errors.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{create, daemon, set_quotas, sid, tenant_key};

/// A raw exchange on one connection: status, head (lowercase), body (unchunked).
fn call(addr: &str, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "{head}\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap();
    let split = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&reply[..split]).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let mut body = reply[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = unchunk(&body);
    }
    (status, head, body)
}

fn unchunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..line]).unwrap().trim(), 16).unwrap();
        raw = &raw[line + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unb64(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut n, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = B64.iter().position(|b| *b == c).expect("base64") as u32;
        n = (n << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
        }
    }
    out
}

fn frame(flags: u8, message: &Value) -> Vec<u8> {
    let payload = message.to_string().into_bytes();
    let mut out = vec![flags];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The envelopes of a stream's body: (flags, JSON).
fn frames(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        out.push((body[0], serde_json::from_slice(&body[5..5 + len]).unwrap()));
        body = &body[5 + len..];
    }
    out
}

struct Envd<'a> {
    addr: &'a str,
    sandbox: String,
    key: String,
}

impl Envd<'_> {
    fn head(&self, method: &str, path: &str, content_type: &str) -> String {
        format!(
            "{method} {path} HTTP/1.1\r\nE2b-Sandbox-Id: {}\r\nE2b-Sandbox-Port: 49983\r\nX-API-Key: {}\r\nContent-Type: {content_type}",
            self.sandbox, self.key
        )
    }

    fn unary(&self, procedure: &str, message: Value) -> (u16, Value) {
        let (status, _, body) = call(
            self.addr,
            &self.head("POST", &format!("/{procedure}"), "application/json"),
            message.to_string().as_bytes(),
        );
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// A server-streaming call: its frames, the end-stream one last.
    fn stream(&self, procedure: &str, message: Value) -> Vec<(u8, Value)> {
        self.stream_raw(procedure, &frame(0, &message), "")
    }

    fn stream_raw(&self, procedure: &str, body: &[u8], extra: &str) -> Vec<(u8, Value)> {
        let (status, head, body) = call(
            self.addr,
            &format!(
                "{}{extra}",
                self.head("POST", &format!("/{procedure}"), "application/connect+json")
            ),
            body,
        );
        assert_eq!(status, 200, "{head}");
        assert!(
            head.contains("content-type: application/connect+json"),
            "{head}"
        );
        frames(&body)
    }
}

fn end_error(frames: &[(u8, Value)]) -> Value {
    let (flags, end) = frames.last().expect("an end-stream frame");
    assert_eq!(*flags, 2, "{frames:?}");
    end["error"].clone()
}

fn output(frames: &[(u8, Value)], stream: &str) -> String {
    frames
        .iter()
        .filter_map(|(_, f)| f["event"]["data"][stream].as_str())
        .map(|b| String::from_utf8(unb64(b)).unwrap())
        .collect()
}

fn end_event(frames: &[(u8, Value)]) -> Value {
    frames
        .iter()
        .find(|(_, f)| f["event"].get("end").is_some())
        .map(|(_, f)| f["event"]["end"].clone())
        .unwrap_or_else(|| panic!("no end event in {frames:?}"))
}

fn bash(cmd: &str) -> Value {
    json!({"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "cwd": "/tmp"})
}

#[test]
fn envd_runs_processes_streams_their_output_and_ends_them_as_envd_does() {
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "e2b-envd-proc");
    let envd = Envd {
        addr: d.addr(),
        sandbox: sid(&create(&d, &key, json!({}))),
        key,
    };

    // A command's output as it comes, then its end (Go's ProcessState), then the
    // stream's end.
    let mut config = bash("echo out; echo err >&2; echo $FOO $HOME; pwd; exit 3");
    config["envs"] = json!({"FOO": "bar"});
    let started = Instant::now();
    let frames = envd.stream(
        "process.Process/Start",
        json!({"process": config, "stdin": false}),
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let pid = frames[0].1["event"]["start"]["pid"]
        .as_u64()
        .expect("start first");
    assert_eq!(output(&frames, "stdout"), "out\nbar /workspace\n/tmp\n");
    assert_eq!(output(&frames, "stderr"), "err\n");
    let end = end_event(&frames);
    assert_eq!(
        (&end["exitCode"], &end["status"], &end["error"]),
        (&json!(3), &json!("exit status 3"), &json!("exit status 3"))
    );
    assert_eq!(frames.last().unwrap(), &(2, json!({})));

    // The pid is the process's own in the sandbox (what `kill` there takes).
    let frames = envd.stream("process.Process/Start", json!({"process": bash("echo $$")}));
    let own = frames[0].1["event"]["start"]["pid"].as_u64().unwrap();
    assert_eq!(output(&frames, "stdout"), format!("{own}\n"));

    // Output is text: bytes that are not UTF-8 read as replacement characters,
    // also a character the end cut short.
    let frames = envd.stream(
        "process.Process/Start",
        json!({"process": bash(r"printf 'a\xffb\xe2'")}),
    );
    assert_eq!(output(&frames, "stdout"), "a\u{fffd}b\u{fffd}");

    // stdin false: a reader sees its end at once.
    let frames = envd.stream(
        "process.Process/Start",
        json!({"process": bash("cat; echo done"), "stdin": false}),
    );
    assert_eq!(output(&frames, "stdout"), "done\n");

    // A background reader with stdin and a tag: listed, fed, closed, re-attached.
    let (sender, streamed) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let frames = envd.stream(
                "process.Process/Start",
                json!({"process": bash("cat; echo closed"), "tag": "reader", "stdin": true}),
            );
            sender.send(frames).unwrap();
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let listed = loop {
            let (status, list) = envd.unary("process.Process/List", json!({}));
            assert_eq!(status, 200, "{list}");
            let found = list["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["tag"] == "reader")
                .cloned();
            if let Some(found) = found {
                break found;
            }
            assert!(Instant::now() < deadline, "never listed: {list}");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(listed["config"]["cmd"], "/bin/bash");
        assert_eq!(listed["config"]["args"][2], "cat; echo closed");
        assert_eq!(listed["config"]["cwd"], "/tmp");
        let selector = json!({"tag": "reader"});
        let stdin = b64(b"fed\n");
        let (status, body) = envd.unary(
            "process.Process/SendInput",
            json!({"process": selector, "input": {"stdin": stdin}}),
        );
        assert_eq!((status, &body), (200, &json!({})));
        // Client streaming: a start naming the process, data, keepalives.
        let mut input = frame(0, &json!({"start": {"process": selector}}));
        input.extend(frame(0, &json!({"keepalive": {}})));
        input.extend(frame(
            0,
            &json!({"data": {"input": {"stdin": b64(b"more\n")}}}),
        ));
        let replies = envd.stream_raw("process.Process/StreamInput", &input, "");
        assert_eq!(replies, [(0, json!({})), (2, json!({}))]);
        let (status, body) = envd.unary("process.Process/CloseStdin", json!({"process": selector}));
        assert_eq!((status, &body), (200, &json!({})));
        let frames = streamed.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(output(&frames, "stdout"), "fed\nmore\nclosed\n");
        assert_eq!(end_event(&frames)["exitCode"], 0);
        // Ended: no longer envd's to list, signal or feed.
        let pid = frames[0].1["event"]["start"]["pid"].clone();
        let (status, body) = envd.unary(
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        );
        assert_eq!(
            (status, &body["code"]),
            (404, &json!("not_found")),
            "{body}"
        );
    });

    // A signal ends a sleeper; its stream says how.
    let (sender, streamed) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let frames = envd.stream(
                "process.Process/Start",
                json!({"process": bash("sleep 600"), "tag": "sleeper"}),
            );
            sender.send(frames).unwrap();
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = envd.unary(
                "process.Process/SendSignal",
                json!({"process": {"tag": "sleeper"}, "signal": "SIGNAL_SIGTERM"}),
            );
            if status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "{body}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let frames = streamed.recv_timeout(Duration::from_secs(60)).unwrap();
        let end = end_event(&frames);
        assert_eq!(
            (&end["exitCode"], &end["status"]),
            (&json!(-1), &json!("signal: terminated"))
        );
    });

    // Connect to a process that ended: its start, its end.
    let frames = envd.stream("process.Process/Connect", json!({"process": {"pid": pid}}));
    assert_eq!(frames[0].1["event"]["start"]["pid"], pid);
    assert_eq!(end_event(&frames)["exitCode"], 3);

    // What envd refuses.
    let missing = envd.stream(
        "process.Process/Connect",
        json!({"process": {"pid": 999999}}),
    );
    assert_eq!(end_error(&missing)["code"], "not_found");
    let early = frame(0, &json!({"data": {"input": {"stdin": b64(b"x")}}}));
    let refused = envd.stream_raw("process.Process/StreamInput", &early, "");
    assert_eq!(end_error(&refused)["code"], "invalid_argument");
    let nobody = frame(0, &json!({"start": {"process": {"pid": 999999}}}));
    let refused = envd.stream_raw("process.Process/StreamInput", &nobody, "");
    assert_eq!(end_error(&refused)["code"], "not_found");
    let pty = envd.stream(
        "process.Process/Start",
        json!({"process": bash("true"), "pty": {"size": {"cols": 80, "rows": 24}}}),
    );
    assert_eq!(end_error(&pty)["code"], "unimplemented");
    let (status, body) = envd.unary(
        "process.Process/Update",
        json!({"process": {"pid": 999999}, "pty": {"size": {"cols": 1, "rows": 1}}}),
    );
    assert_eq!((status, &body["code"]), (404, &json!("not_found")));
    let (status, body) = envd.unary(
        "process.Process/SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"}),
    );
    assert_eq!(status, 404, "an ended process is not found first: {body}");
    let root = b64(b"root:");
    let refused = envd.stream_raw(
        "process.Process/Start",
        &frame(0, &json!({"process": bash("id")})),
        &format!("\r\nAuthorization: Basic {root}"),
    );
    assert_eq!(end_error(&refused)["code"], "permission_denied");
    let nowhere = envd.stream(
        "process.Process/Start",
        json!({"process": {"cmd": "/bin/true", "cwd": "/nonexistent"}}),
    );
    assert_eq!(end_error(&nowhere)["code"], "invalid_argument");
}

#[test]
fn a_start_refused_its_stream_leaves_no_process_running() {
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "e2b-envd-cap");
    set_quotas(&d, "e2b-envd-cap", json!({"max_concurrent_execs": 1}));
    let envd = Envd {
        addr: d.addr(),
        sandbox: sid(&create(&d, &key, json!({}))),
        key,
    };
    let running = || {
        let (status, list) = envd.unary("process.Process/List", json!({}));
        assert_eq!(status, 200, "{list}");
        list["processes"].as_array().unwrap().len()
    };
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            envd.stream(
                "process.Process/Start",
                json!({"process": bash("sleep 600"), "tag": "holder"}),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while running() == 0 {
            assert!(Instant::now() < deadline, "the first never ran");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The tenant's one stream is taken: the second start is refused, and its
        // process does not stay.
        let second = envd.stream(
            "process.Process/Start",
            json!({"process": bash("sleep 600")}),
        );
        assert_eq!(
            end_error(&second)["code"],
            "resource_exhausted",
            "{second:?}"
        );
        while running() > 1 {
            assert!(
                Instant::now() < deadline,
                "the refused start's process stayed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (status, body) = envd.unary(
            "process.Process/SendSignal",
            json!({"process": {"tag": "holder"}, "signal": "SIGNAL_SIGKILL"}),
        );
        assert_eq!(status, 200, "{body}");
        let frames = first.join().unwrap();
        assert_eq!(end_event(&frames)["status"], "signal: killed");
    });
}

#[test]
fn envd_files_and_filesystem_resolve_inside_the_sandbox() {
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "e2b-envd-files");
    let envd = Envd {
        addr: d.addr(),
        sandbox: sid(&create(&d, &key, json!({}))),
        key,
    };

    // Health needs no credentials: 204, no body.
    let (status, _, body) = call(
        d.addr(),
        &format!(
            "GET /health HTTP/1.1\r\nE2b-Sandbox-Id: {}\r\nE2b-Sandbox-Port: 49983",
            envd.sandbox
        ),
        b"",
    );
    assert_eq!((status, body.len()), (204, 0));

    // Uploads: an octet-stream body, multipart parts named by their file names.
    let (status, _, body) = call(
        d.addr(),
        &envd.head(
            "POST",
            "/files?path=/tmp/w/a.txt",
            "application/octet-stream",
        ),
        b"alpha",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let written: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        written,
        json!([{"name": "a.txt", "type": "file", "path": "/tmp/w/a.txt"}])
    );
    let mut form = Vec::new();
    for (name, data) in [
        ("/tmp/w/sub/b.bin", &b"\x00\x01"[..]),
        ("/tmp/w/c", b"gamma"),
    ] {
        form.extend_from_slice(
            format!(
                "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        form.extend_from_slice(data);
        form.extend_from_slice(b"\r\n");
    }
    form.extend_from_slice(b"--XX--\r\n");
    let (status, _, body) = call(
        d.addr(),
        &envd.head("POST", "/files", "multipart/form-data; boundary=XX"),
        &form,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let written: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(written[0]["path"], "/tmp/w/sub/b.bin");
    assert_eq!(written[1]["path"], "/tmp/w/c");

    // Relative paths are the user's home's: the workspace in a sandbox on the
    // host's system dirs (an image made for E2B has /home/user).
    let (status, _, body) = call(
        d.addr(),
        &envd.head("POST", "/files?path=rel.txt", "application/octet-stream"),
        b"home",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let written: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(written[0]["path"], "/workspace/rel.txt");
    let (status, body) = envd.unary("filesystem.Filesystem/Stat", json!({"path": ""}));
    assert_eq!(
        (status, &body["entry"]["path"]),
        (200, &json!("/workspace"))
    );

    // Downloads, and a missing file as envd answers it.
    let (status, head, body) = call(
        d.addr(),
        &envd.head("GET", "/files?path=/tmp/w/sub/b.bin", "text/plain"),
        b"",
    );
    assert_eq!((status, body.as_slice()), (200, &b"\x00\x01"[..]));
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );
    let (status, _, body) = call(
        d.addr(),
        &envd.head("GET", "/files?path=/tmp/w/missing", "text/plain"),
        b"",
    );
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, &body["code"]), (404, &json!(404)), "{body}");
    let (status, _, _) = call(
        d.addr(),
        &envd.head("GET", "/files?path=/tmp/w", "text/plain"),
        b"",
    );
    assert_eq!(status, 400, "a directory is no file to download");

    // Stat, and a symlink typed by its target, with the target resolved in the
    // sandbox (never the host).
    let frames = envd.stream(
        "process.Process/Start",
        json!({"process": bash("ln -s /tmp/w/a.txt /tmp/w/link")}),
    );
    assert_eq!(end_event(&frames)["exitCode"], 0);
    let (status, body) = envd.unary("filesystem.Filesystem/Stat", json!({"path": "/tmp/w/link"}));
    assert_eq!(status, 200, "{body}");
    let entry = &body["entry"];
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["symlinkTarget"], "/tmp/w/a.txt");
    assert_eq!(entry["permissions"], "Lrwxrwxrwx");
    let (status, body) = envd.unary(
        "filesystem.Filesystem/Stat",
        json!({"path": "/tmp/w/a.txt"}),
    );
    assert_eq!(status, 200);
    let entry = &body["entry"];
    assert_eq!(
        (&entry["name"], &entry["size"], &entry["mode"]),
        (&json!("a.txt"), &json!("5"), &json!(0o644))
    );
    assert_eq!(
        (&entry["owner"], &entry["permissions"]),
        (&json!("user"), &json!("-rw-r--r--"))
    );
    assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));
    let (status, body) = envd.unary("filesystem.Filesystem/Stat", json!({"path": "/tmp/w/nope"}));
    assert_eq!((status, &body["code"]), (404, &json!("not_found")));

    // MakeDir says when the directory was there already; ListDir walks to a depth.
    let (status, body) = envd.unary(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "/tmp/w/d/e"}),
    );
    assert_eq!(
        (status, &body["entry"]["type"]),
        (200, &json!("FILE_TYPE_DIRECTORY"))
    );
    let (status, body) = envd.unary(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "/tmp/w/d/e"}),
    );
    assert_eq!((status, &body["code"]), (409, &json!("already_exists")));
    let list = |depth: u32| {
        let (status, body) = envd.unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/tmp/w", "depth": depth}),
        );
        assert_eq!(status, 200, "{body}");
        body["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        list(1),
        [
            "/tmp/w/a.txt",
            "/tmp/w/c",
            "/tmp/w/d",
            "/tmp/w/link",
            "/tmp/w/sub"
        ]
    );
    assert_eq!(list(2).len(), 7);
    let (status, body) = envd.unary("filesystem.Filesystem/ListDir", json!({"path": "/tmp/w/c"}));
    assert_eq!((status, &body["code"]), (400, &json!("invalid_argument")));

    // Move makes the destination's parents; Remove takes trees, and what is gone.
    let (status, body) = envd.unary(
        "filesystem.Filesystem/Move",
        json!({"source": "/tmp/w/c", "destination": "/tmp/w/new/dir/c2"}),
    );
    assert_eq!(
        (status, &body["entry"]["path"]),
        (200, &json!("/tmp/w/new/dir/c2"))
    );
    let (status, body) = envd.unary(
        "filesystem.Filesystem/Move",
        json!({"source": "/tmp/w/c", "destination": "/tmp/w/c3"}),
    );
    assert_eq!((status, &body["code"]), (404, &json!("not_found")));
    for _ in 0..2 {
        let (status, body) = envd.unary(
            "filesystem.Filesystem/Remove",
            json!({"path": "/tmp/w/new"}),
        );
        assert_eq!((status, &body), (200, &json!({})));
    }
    let (status, _) = envd.unary("filesystem.Filesystem/Stat", json!({"path": "/tmp/w/new"}));
    assert_eq!(status, 404);

    // Watching, by polling: a watcher's events are what changed since it last
    // looked; a stream looks on its own until its deadline.
    let (status, body) = envd.unary(
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "/tmp/w", "recursive": true, "includeEntry": true}),
    );
    assert_eq!(status, 200, "{body}");
    let watcher = body["watcherId"].clone();
    let (status, _, _) = call(
        d.addr(),
        &envd.head(
            "POST",
            "/files?path=/tmp/w/d/watched",
            "application/octet-stream",
        ),
        b"seen",
    );
    assert_eq!(status, 200);
    let (status, body) = envd.unary(
        "filesystem.Filesystem/GetWatcherEvents",
        json!({"watcherId": watcher}),
    );
    assert_eq!(status, 200, "{body}");
    let events = body["events"].as_array().unwrap();
    assert_eq!(events[0]["name"], "d/watched", "{body}");
    assert_eq!(events[0]["type"], "EVENT_TYPE_CREATE");
    assert_eq!(events[0]["entry"]["path"], "/tmp/w/d/watched");
    let (status, body) = envd.unary(
        "filesystem.Filesystem/GetWatcherEvents",
        json!({"watcherId": watcher}),
    );
    assert_eq!((status, &body["events"]), (200, &json!([])), "nothing new");
    let (status, _) = envd.unary(
        "filesystem.Filesystem/RemoveWatcher",
        json!({"watcherId": watcher}),
    );
    assert_eq!(status, 200);
    let (status, body) = envd.unary(
        "filesystem.Filesystem/GetWatcherEvents",
        json!({"watcherId": watcher}),
    );
    assert_eq!((status, &body["code"]), (404, &json!("not_found")));
    for (path, code) in [
        ("/tmp/w/none", "not_found"),
        ("/tmp/w/a.txt", "invalid_argument"),
    ] {
        let (_, body) = envd.unary("filesystem.Filesystem/CreateWatcher", json!({"path": path}));
        assert_eq!(body["code"], code, "{path}");
    }
    // Files keep coming while the stream lasts (its first look may take a while
    // on a loaded machine): it reports those made after that look.
    let frames = std::thread::scope(|scope| {
        let watching = scope.spawn(|| {
            envd.stream_raw(
                "filesystem.Filesystem/WatchDir",
                &frame(0, &json!({"path": "/tmp/w"})),
                "\r\nConnect-Timeout-Ms: 10000",
            )
        });
        let mut made = 0;
        while !watching.is_finished() {
            std::thread::sleep(Duration::from_millis(300));
            let (status, _, _) = call(
                d.addr(),
                &envd.head(
                    "POST",
                    &format!("/files?path=/tmp/w/new{made}"),
                    "application/octet-stream",
                ),
                b"x",
            );
            assert_eq!(status, 200);
            made += 1;
        }
        watching.join().unwrap()
    });
    assert_eq!(frames[0].1, json!({"start": {}}));
    assert!(
        frames
            .iter()
            .any(|(_, f)| f["filesystem"]["type"] == "EVENT_TYPE_CREATE"
                && f["filesystem"]["name"].as_str().unwrap().starts_with("new")),
        "{frames:?}"
    );
    assert_eq!(end_error(&frames)["code"], "deadline_exceeded");
}

#[test]
fn envd_answers_bad_connect_input_with_connect_errors() {
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "e2b-envd-bad");
    let envd = Envd {
        addr: d.addr(),
        sandbox: sid(&create(&d, &key, json!({}))),
        key,
    };
    let json_of = |body: &[u8]| serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);

    // A wrong content type: 415, as connect-go answers; the stream type on a unary
    // procedure is one too.
    for (procedure, content_type) in [
        ("/filesystem.Filesystem/Stat", "text/plain"),
        ("/filesystem.Filesystem/Stat", "application/connect+json"),
        ("/filesystem.Filesystem/Stat", "application/proto"),
        ("/process.Process/Start", "application/json"),
    ] {
        let (status, _, body) = call(d.addr(), &envd.head("POST", procedure, content_type), b"{}");
        assert_eq!(status, 415, "{procedure} {content_type}");
        assert_eq!(json_of(&body)["code"], "invalid_argument");
    }
    // Not a POST, and an unknown procedure.
    let (status, head, _) = call(
        d.addr(),
        &envd.head("GET", "/process.Process/List", "application/json"),
        b"",
    );
    assert_eq!(status, 405);
    assert!(head.contains("allow: post"), "{head}");
    let (status, _, body) = call(
        d.addr(),
        &envd.head("POST", "/process.Process/Fork", "application/json"),
        b"{}",
    );
    assert_eq!(
        (status, json_of(&body)["code"].clone()),
        (404, json!("unimplemented"))
    );

    // Malformed unary messages.
    for body in [&b"{"[..], b"[1,2]", b"{\"path\": 7}", b"\xff\xfe"] {
        let (status, _, reply) = call(
            d.addr(),
            &envd.head("POST", "/filesystem.Filesystem/Stat", "application/json"),
            body,
        );
        assert_eq!(
            (status, json_of(&reply)["code"].clone()),
            (400, json!("invalid_argument")),
            "{body:?}"
        );
    }

    // Streams: a cut envelope, one with bad flags, a compressed one, one that
    // claims more than the limit, two messages, garbage JSON. Each ends the stream
    // with an error at once.
    let good = frame(0, &json!({"process": bash("echo never")}));
    let mut two = good.clone();
    two.extend_from_slice(&good);
    let mut huge = vec![0u8];
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    huge.extend_from_slice(b"{}");
    let mut garbage = vec![0u8, 0, 0, 0, 3];
    garbage.extend_from_slice(b"{x}");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("cut", good[..good.len() - 3].to_vec(), "invalid_argument"),
        ("header only", good[..3].to_vec(), "invalid_argument"),
        (
            "end-stream flag",
            {
                let mut f = good.clone();
                f[0] = 2;
                f
            },
            "invalid_argument",
        ),
        (
            "compressed",
            {
                let mut f = good.clone();
                f[0] = 1;
                f
            },
            "invalid_argument",
        ),
        ("oversize", huge, "resource_exhausted"),
        ("two messages", two, "invalid_argument"),
        ("garbage", garbage, "invalid_argument"),
    ];
    for (what, body, code) in cases {
        let started = Instant::now();
        let frames = envd.stream_raw("process.Process/Start", &body, "");
        assert_eq!(end_error(&frames)["code"], code, "{what}");
        assert_eq!(frames.len(), 1, "{what}: nothing but the end");
        assert!(started.elapsed() < Duration::from_secs(30), "{what}");
    }
    // A timeout header that is no number.
    let frames = envd.stream_raw(
        "process.Process/Start",
        &good,
        "\r\nConnect-Timeout-Ms: soon",
    );
    assert_eq!(end_error(&frames)["code"], "invalid_argument");

    // None of it started anything.
    let (status, list) = envd.unary("process.Process/List", json!({}));
    assert_eq!((status, list), (200, json!({"processes": []})));

    // The daemon still answers.
    let (status, body) = envd.unary("filesystem.Filesystem/Stat", json!({"path": "/tmp"}));
    assert_eq!(
        (status, &body["entry"]["type"]),
        (200, &json!("FILE_TYPE_DIRECTORY"))
    );
}

/// A sandbox plants symlinks to host paths and asks envd to follow them: reads,
/// writes, listings, moves and removals all resolve inside the sandbox's root, so
/// nothing of the host is read, made, moved or removed.
#[test]
fn root_envd_never_follows_a_planted_link_out_of_the_sandbox() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "e2b-envd-links");
    let envd = Envd {
        addr: d.addr(),
        sandbox: sid(&create(&d, &key, json!({}))),
        key,
    };
    // Host paths the sandbox cannot see: a secret to read, a directory to write
    // into and list, a file to move and remove.
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret.txt");
    std::fs::write(&secret, "host secret").unwrap();
    let victim = host.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    let host_dir = host.path().display().to_string();
    let plant = format!(
        "ln -s {secret} /tmp/read && ln -s {host_dir} /tmp/dir && ln -s {victim} /tmp/victim \
         && ln -s / /tmp/root",
        secret = secret.display(),
        victim = victim.display()
    );
    let frames = envd.stream("process.Process/Start", json!({"process": bash(&plant)}));
    assert_eq!(end_event(&frames)["exitCode"], 0, "{frames:?}");

    // Reads: the link leads nowhere inside the sandbox.
    for path in [
        "/tmp/read",
        "/tmp/dir/secret.txt",
        "/tmp/root/../../../../tmp/read",
    ] {
        let (status, _, body) = call(
            d.addr(),
            &envd.head("GET", &format!("/files?path={path}"), "application/json"),
            b"",
        );
        assert!(
            !String::from_utf8_lossy(&body).contains("host secret"),
            "{path}: {status}"
        );
        assert_ne!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    }
    let (_, listed) = envd.unary("filesystem.Filesystem/ListDir", json!({"path": "/tmp/dir"}));
    assert!(!listed.to_string().contains("secret.txt"), "{listed}");

    // Writes through a link to a host directory make nothing on the host.
    let (_, _, _) = call(
        d.addr(),
        &envd.head(
            "POST",
            "/files?path=/tmp/dir/planted.txt",
            "application/octet-stream",
        ),
        b"from the sandbox",
    );
    let (_, _) = envd.unary(
        "filesystem.Filesystem/MakeDir",
        json!({"path": "/tmp/dir/planted-dir"}),
    );
    // Moves and removals of a link act on the link, never on its host target.
    let (_, _) = envd.unary(
        "filesystem.Filesystem/Move",
        json!({"source": "/tmp/victim", "destination": "/tmp/moved"}),
    );
    let (_, _) = envd.unary(
        "filesystem.Filesystem/Remove",
        json!({"path": "/tmp/moved"}),
    );
    let (_, _) = envd.unary(
        "filesystem.Filesystem/Remove",
        json!({"path": "/tmp/dir/secret.txt"}),
    );

    let mut names: Vec<String> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["secret.txt", "victim.txt"], "the host dir changed");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}
