//! Sessions' egress (`network` on `POST /v1/sessions`): a session reaches only what
//! its policy and its tenant's bound allow, through the daemon's proxy, and nothing
//! leaves while the daemon is down.
//!
//! All traffic stays on this machine: the upstreams listen on the host's loopback
//! (this test process), names map to them through `--egress-hosts`, and loopback
//! is reachable only because the daemon opens it with `--egress-allow-private`.
//! The clients run inside the session, in Python (sessions run on the host's dirs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::*;

/// A server on the host's loopback: answers `GET`s with what it saw, echoes
/// anything else, and counts the connections it got.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<usize>>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<usize>> = Arc::default();
        let count = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                *count.lock().unwrap() += 1;
                std::thread::spawn(move || serve(stream));
            }
        });
        Upstream { addr, seen }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn connections(&self) -> usize {
        *self.seen.lock().unwrap()
    }
}

fn serve(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut buf = vec![0u8; 65536];
    let Ok(n) = stream.read(&mut buf) else { return };
    if n == 0 {
        return;
    }
    if buf.starts_with(b"GET ") {
        let body = "upstream says hello\n";
        let _ = write!(
            stream,
            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    let _ = stream.write_all(&buf[..n]);
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// Python helpers the clients inside the session share: each prints one word.
const CLIENT: &str = r#"
import os, socket, struct, sys, time
T = 20
def recv_all(s):
    data = b""
    while True:
        try:
            d = s.recv(65536)
        except OSError as e:
            return data + ("<%s>" % e).encode()
        if not d:
            return data
        data += d
def proxy_get(url):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=T)
        s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % url).encode())
        reply = recv_all(s).decode(errors="replace")
        return "OK" if "upstream says hello" in reply else "REFUSED " + reply.split("\r\n")[0]
    except OSError as e:
        return "ERR %s" % e
def tunnel(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=T)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d:
            break
        head += d
    if b" 200 " not in head.split(b"\r\n")[0] + b" ":
        return None, head.split(b"\r\n")[0].decode(errors="replace")
    return s, ""
def echo(s, payload=b"ping\n"):
    try:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            d = s.recv(65536)
            if not d:
                break
            got += d
        return "OK" if got == payload else "GOT %r" % got[:40]
    except OSError as e:
        return "ERR %s" % e
def connect(target):
    try:
        s, why = tunnel(target)
    except OSError as e:
        return "ERR %s" % e
    return echo(s) if s else "REFUSED " + why
def socks(host, port):
    try:
        s = socket.create_connection(("127.0.0.1", 1080), timeout=T)
        s.sendall(b"\x05\x01\x00")
        if s.recv(2) != b"\x05\x00":
            return "ERR no method"
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + struct.pack(">H", port))
        rep = s.recv(10)
        if len(rep) < 2 or rep[1] != 0:
            return "REFUSED socks %d" % (rep[1] if len(rep) > 1 else -1)
        return echo(s)
    except OSError as e:
        return "ERR %s" % e
def raw(host, port):
    try:
        s = socket.create_connection((host, port), timeout=T)
        return echo(s)
    except OSError as e:
        return "ERR %s" % e
for k in list(os.environ):
    if RAW and "proxy" in k.lower():
        del os.environ[k]
"#;

/// Runs `script` (after [`CLIENT`]) in the session; its stdout.
fn python(d: &Daemon, key: &str, id: &str, script: &str, raw: bool) -> String {
    let raw = if raw { "True" } else { "False" };
    let program = format!("RAW = {raw}\n{CLIENT}\n{script}");
    let r = exec(
        d,
        key,
        id,
        json!({"argv": ["/usr/bin/python3", "-c", program], "timeout_ms": 60_000}),
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    r["stdout"].as_str().unwrap().to_string()
}

/// A hosts file naming the host's loopback `good.test` and `bad.test`.
fn hosts(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("hosts");
    std::fs::write(&path, "127.0.0.1 good.test bad.test other.test\n").unwrap();
    path.to_string_lossy().into_owned()
}

/// A daemon whose proxy resolves from `hosts` and may reach the host's loopback.
fn egress_daemon(hosts: &str, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--egress-hosts",
        hosts,
        "--egress-allow-private",
        "127.0.0.0/8",
    ];
    args.extend_from_slice(extra);
    daemon(&args)
}

fn allow(rules: &[String]) -> Value {
    json!({"network": {"mode": "allow", "allow": rules}})
}

/// The setup most tests share: an upstream, a daemon whose proxy reaches it, and a
/// session allowed to reach `good.test` on its port.
struct Allowed {
    up: Upstream,
    /// Holds the daemon's hosts file.
    dir: tempfile::TempDir,
    d: Daemon,
    key: String,
    port: u16,
    id: String,
}

fn allowed_session(extra: &[&str]) -> Allowed {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), extra);
    let key = d.admin_key().to_string();
    let port = up.port();
    let id = sid(&create(&d, &key, allow(&[format!("good.test:{port}")])));
    Allowed {
        up,
        dir,
        d,
        key,
        port,
        id,
    }
}

fn capture_available() -> bool {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

fn patch(d: &Daemon, key: &str, id: &str, body: Value) -> (u16, Value) {
    d.request(
        "PATCH",
        &format!("/v1/sessions/{id}"),
        Some(key),
        Some(body),
    )
}

#[test]
fn root_an_allowed_host_is_reached_by_http_connect_and_socks_and_another_is_not() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), &[]);
    let key = d.admin_key().to_string();
    let port = up.port();
    let s = create(&d, &key, allow(&[format!("good.test:{port}")]));
    assert_eq!(s["network"]["mode"], "allow", "{s}");
    assert_eq!(s["network"]["allow"], json!([format!("good.test:{port}")]));
    assert_eq!(s["pooled"], false);
    let id = sid(&s);
    let out = python(
        &d,
        &key,
        &id,
        &format!(
            "print(proxy_get('http://good.test:{port}/'))\n\
             print(proxy_get('http://bad.test:{port}/'))\n\
             print(connect('good.test:{port}'))\n\
             print(connect('bad.test:{port}'))\n\
             print(socks('good.test', {port}))\n\
             print(socks('bad.test', {port}))\n\
             print(os.environ.get('HTTP_PROXY'))\n"
        ),
        false,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "OK", "{out}");
    assert!(
        lines[1].starts_with("REFUSED") && lines[1].contains("403"),
        "{out}"
    );
    assert_eq!(lines[2], "OK", "{out}");
    assert!(lines[3].starts_with("REFUSED"), "{out}");
    assert_eq!(lines[4], "OK", "{out}");
    assert!(lines[5].starts_with("REFUSED"), "{out}");
    assert_eq!(lines[6], "http://127.0.0.1:3128", "{out}");
    assert_eq!(up.connections(), 3, "only the allowed connections arrived");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_raw_socket_ignoring_proxy_variables_reaches_only_allowed_names() {
    require_root!();
    if !capture_available() {
        eprintln!("skipped: transparent capture needs nftables (scripts/test.sh installs it)");
        return;
    }
    let Allowed {
        up,
        dir: _dir,
        d,
        key,
        port,
        id,
    } = allowed_session(&[]);
    // A made-up protocol on a non-HTTP port, no proxy variable in sight.
    let out = python(
        &d,
        &key,
        &id,
        &format!(
            "print(raw('good.test', {port}))\n\
             print(raw('bad.test', {port}))\n\
             print(raw('127.0.0.1', {port}))\n"
        ),
        true,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "OK", "{out}");
    assert!(
        lines[1].starts_with("ERR"),
        "bad.test has no address: {out}"
    );
    assert!(
        lines[2].starts_with("ERR"),
        "loopback is the sandbox's own: {out}"
    );
    assert_eq!(up.connections(), 1, "only the allowed connection arrived");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_policy_changed_on_a_live_session_applies_to_new_connections_only() {
    require_root!();
    let Allowed {
        up: _up,
        dir: _dir,
        d,
        key,
        port,
        id,
    } = allowed_session(&[]);
    // A tunnel opened under the old policy, used again after the change.
    let script = format!(
        "s, why = tunnel('good.test:{port}')\n\
         print(echo(s) if s else why, flush=True)\n\
         open('/tmp/ready', 'w').close()\n\
         while not os.path.exists('/tmp/go'):\n\
         \x20   time.sleep(0.05)\n\
         print(echo(s, b'again\\n'))\n\
         print(connect('good.test:{port}'))\n\
         print(connect('other.test:{port}'))\n"
    );
    let out = std::thread::scope(|scope| {
        let run = scope.spawn(|| python(&d, &key, &id, &script, false));
        assert!(
            common::eventually(60_000, || {
                exec(&d, &key, &id, json!({"cmd": "test -f /tmp/ready"}))["exit_code"] == 0
            }),
            "the tunnel never opened"
        );
        let (status, s) = patch(
            &d,
            &key,
            &id,
            json!({"network": {"mode": "allow", "allow": [format!("other.test:{port}")]}}),
        );
        assert_eq!(status, 200, "{s}");
        assert_eq!(s["network"]["allow"], json!([format!("other.test:{port}")]));
        sh(&d, &key, &id, "touch /tmp/go");
        run.join().unwrap()
    });
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "OK", "{out}");
    assert_eq!(lines[1], "OK", "the open tunnel keeps going: {out}");
    assert!(
        lines[2].starts_with("REFUSED"),
        "a new one is decided anew: {out}"
    );
    assert_eq!(lines[3], "OK", "{out}");
    // And GET shows the policy in force.
    let (_, s) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(s["network"]["allow"], json!([format!("other.test:{port}")]));
    delete_session(&d, &key, &id);
}

#[test]
fn root_open_mode_refuses_private_ranges_unless_the_operator_opens_them() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let port = up.port();
    let hosts = hosts(&dir);
    // No --egress-allow-private: the host's loopback is forbidden in every mode.
    let d = daemon(&["--egress-hosts", &hosts]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({"network": {"mode": "open"}})));
    let out = python(
        &d,
        &key,
        &id,
        &format!(
            "print(connect('good.test:{port}'))\n\
             print(connect('127.0.0.1:{port}'))\n\
             print(proxy_get('http://good.test:{port}/'))\n"
        ),
        false,
    );
    for line in out.lines() {
        assert!(line.starts_with("REFUSED"), "{out}");
    }
    assert_eq!(up.connections(), 0);
    delete_session(&d, &key, &id);
    drop(d);
    // The same with the range opened: it goes out.
    let d = egress_daemon(&hosts, &[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({"network": {"mode": "open"}})));
    let out = python(
        &d,
        &key,
        &id,
        &format!("print(connect('good.test:{port}'))"),
        false,
    );
    assert_eq!(out.trim(), "OK");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_tenant_bound_narrows_what_its_sessions_ask_for_and_reach() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), &[]);
    let port = up.port();
    let (key, _) = tenant_key(&d, "bounded");
    // Only an administrator sets a bound.
    let (status, _) = d.request(
        "PUT",
        "/v1/tenants/bounded/quotas",
        Some(&key),
        Some(json!({"network_bound": {"mode": "open"}})),
    );
    assert_eq!(status, 403);
    let t = set_quotas(
        &d,
        "bounded",
        json!({"network_bound": {"mode": "allow", "allow": [format!("good.test:{port}")]}}),
    );
    assert_eq!(t["network_bound"]["mode"], "allow", "{t}");
    // A wider mode is refused, saying why.
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"network": {"mode": "open"}})),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(error_code(&body), "forbidden", "{body}");
    assert!(body.to_string().contains("bound"), "{body}");
    // Within the mode, a connection needs both.
    let rules = [format!("good.test:{port}"), format!("other.test:{port}")];
    let id = sid(&create(&d, &key, allow(&rules)));
    let script =
        format!("print(connect('good.test:{port}'))\nprint(connect('other.test:{port}'))\n");
    let out = python(&d, &key, &id, &script, false);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "OK", "{out}");
    assert!(lines[1].starts_with("REFUSED"), "the bound holds: {out}");
    // A tighter bound applies to the live session's new connections at once.
    set_quotas(&d, "bounded", json!({"network_bound": {"mode": "none"}}));
    let out = python(
        &d,
        &key,
        &id,
        &format!("print(connect('good.test:{port}'))"),
        false,
    );
    assert!(out.starts_with("REFUSED"), "{out}");
    assert_eq!(up.connections(), 1);
    delete_session(&d, &key, &id);
}

#[test]
fn root_every_connection_is_audited_and_counted() {
    require_root!();
    let Allowed {
        up: _up,
        dir: _dir,
        d,
        key,
        port,
        id,
    } = allowed_session(&[]);
    let out = python(
        &d,
        &key,
        &id,
        &format!("print(connect('good.test:{port}'))\nprint(connect('bad.test:{port}'))\n"),
        false,
    );
    assert!(out.starts_with("OK"), "{out}");
    let mut events = Vec::new();
    assert!(
        common::eventually(30_000, || {
            events = audit_of(&d, "egress.connect");
            events.len() >= 2
        }),
        "{events:?}"
    );
    let allowed = events
        .iter()
        .find(|e| e["detail"]["decision"] == "allowed")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(allowed["session_id"], json!(id));
    assert_eq!(allowed["frontend"], "daemon");
    let detail = &allowed["detail"];
    assert_eq!(detail["host"], "good.test");
    assert_eq!(detail["port"], port);
    assert_eq!(detail["address"], "127.0.0.1");
    assert_eq!(detail["bytes_up"], 5, "{detail}");
    assert_eq!(detail["bytes_down"], 5, "{detail}");
    assert!(detail["duration_ms"].is_u64(), "{detail}");
    let refused = events
        .iter()
        .find(|e| e["detail"]["decision"] == "refused")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(refused["detail"]["host"], "bad.test");
    assert_eq!(refused["detail"]["reason"], "not_allowed");
    assert!(refused["time"].is_string() && refused["tenant"].is_string());
    let metrics =
        String::from_utf8_lossy(&d.raw("GET", "/metrics", None, None, None).1).into_owned();
    for line in [
        "brig_egress_connections_total{decision=\"allowed\"}",
        "brig_egress_connections_total{decision=\"refused\"}",
        "brig_egress_bytes_total{direction=\"up\"}",
        "brig_egress_bytes_total{direction=\"down\"}",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    delete_session(&d, &key, &id);
}

#[test]
fn root_bad_network_input_is_refused_naming_it_and_leaves_the_old_policy() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), &[]);
    let key = d.admin_key().to_string();
    let port = up.port();
    for (network, named) in [
        (json!({"mode": "allow", "allow": ["bad host"]}), "bad host"),
        (
            json!({"mode": "allow", "allow": ["good.test:70000"]}),
            "good.test:70000",
        ),
        (
            json!({"mode": "allow", "deny": ["10.0.0.0/40"]}),
            "10.0.0.0/40",
        ),
        (json!({"mode": "sideways"}), "sideways"),
    ] {
        let (status, body) = d.request(
            "POST",
            "/v1/sessions",
            Some(&key),
            Some(json!({ "network": network })),
        );
        assert_eq!(status, 422, "{network}: {body}");
        assert_eq!(error_code(&body), "invalid_request", "{body}");
        assert!(body.to_string().contains(named), "{body}");
    }
    let id = sid(&create(&d, &key, allow(&[format!("good.test:{port}")])));
    let (status, body) = patch(
        &d,
        &key,
        &id,
        json!({"network": {"mode": "allow", "allow": ["ok.test", "256.0.0.0/8"]}, "ttl_seconds": 5}),
    );
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("256.0.0.0/8"), "{body}");
    let (_, s) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(s["network"]["allow"], json!([format!("good.test:{port}")]));
    let out = python(
        &d,
        &key,
        &id,
        &format!("print(connect('good.test:{port}'))"),
        false,
    );
    assert_eq!(out.trim(), "OK", "the old policy is in force");
    // A session started without a way out cannot be given one.
    let offline = sid(&create(&d, &key, json!({})));
    let (status, body) = patch(&d, &key, &offline, json!({"network": {"mode": "open"}}));
    assert_eq!(status, 409, "{body}");
    delete_session(&d, &key, &id);
    delete_session(&d, &key, &offline);
}

#[test]
fn root_a_killed_daemon_leaves_no_way_out_and_a_restarted_one_serves_the_policy_again() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts(&dir);
    let (data, store) = (dir.path().join("data"), dir.path().join("store"));
    let args = [
        "--default-image",
        "host",
        "--egress-hosts",
        &hosts,
        "--egress-allow-private",
        "127.0.0.0/8",
    ];
    let mut d = Daemon::start_in(&data, &store, &args);
    let key = d.admin_key().to_string();
    let port = up.port();
    let id = sid(&create(&d, &key, allow(&[format!("good.test:{port}")])));
    // Tries every way out, over and over, for as long as the session lives.
    let ways = if capture_available() {
        format!(
            "addr = socket.gethostbyname('good.test')\n\
             ways = [lambda: connect('good.test:{port}'), lambda: socks('good.test', {port}), lambda: raw(addr, {port}), lambda: raw('127.0.0.1', {port})]\n"
        )
    } else {
        format!(
            "ways = [lambda: connect('good.test:{port}'), lambda: socks('good.test', {port}), lambda: raw('127.0.0.1', {port})]\n"
        )
    };
    let program = format!(
        "RAW = False\n{CLIENT}\n{ways}\
         while True:\n\
         \x20   for way in ways:\n\
         \x20       print(way(), flush=True)\n\
         \x20   time.sleep(0.1)\n"
    );
    let (status, p) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"argv": ["/usr/bin/python3", "-c", program]})),
    );
    assert_eq!(status, 201, "{p}");
    assert!(
        common::eventually(60_000, || up.connections() > 0),
        "never got out"
    );
    // A policy changed before the daemon dies is the one a restarted daemon serves.
    let both = json!([format!("good.test:{port}"), format!("other.test:{port}")]);
    let (status, body) = patch(
        &d,
        &key,
        &id,
        json!({"network": {"mode": "allow", "allow": both}}),
    );
    assert_eq!(status, 200, "{body}");

    d.kill9();
    // Connections relayed when it died end with it; then nothing gets through.
    std::thread::sleep(Duration::from_secs(2));
    let before = up.connections();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        up.connections(),
        before,
        "a connection got out with no daemon"
    );

    let d = Daemon::start_in(&data, &store, &args);
    d.remember_key(&key);
    let (_, s) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(s["network"]["allow"], both, "{s}");
    assert!(
        common::eventually(60_000, || up.connections() > before + 2),
        "the re-attached session does not get out"
    );
    // The re-bound proxy holds the stored policy: the added name goes out, a name
    // not allowed stays refused.
    let script =
        format!("print(connect('other.test:{port}'))\nprint(connect('bad.test:{port}'))\n");
    let out = python(&d, &key, &id, &script, false);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "OK", "{out}");
    assert!(lines[1].starts_with("REFUSED"), "{out}");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_fork_and_a_restore_keep_the_sessions_policy() {
    require_root!();
    let Allowed {
        up: _up,
        dir: _dir,
        d,
        key,
        port,
        id,
    } = allowed_session(&[]);
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    let script = format!("print(connect('good.test:{port}'))\nprint(connect('bad.test:{port}'))\n");
    let check = |session: &str| {
        let out = python(&d, &key, session, &script, false);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "OK", "{session}: {out}");
        assert!(lines[1].starts_with("REFUSED"), "{session}: {out}");
    };
    let fork = create(&d, &key, json!({"snapshot": snap["snapshot_id"]}));
    assert_eq!(
        fork["network"]["allow"],
        json!([format!("good.test:{port}")]),
        "{fork}"
    );
    check(&sid(&fork));
    let (status, restored) = restore(&d, &key, &id, &snap["snapshot_id"]);
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["network"]["mode"], "allow", "{restored}");
    check(&id);
    delete_session(&d, &key, &sid(&fork));
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &snap);
}

#[test]
fn root_a_session_that_asks_for_no_network_is_started_as_before() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), &[]);
    let key = d.admin_key().to_string();
    let s = create(&d, &key, json!({}));
    assert_eq!(
        s["network"],
        json!({"mode": "none", "allow": [], "deny": []})
    );
    let id = sid(&s);
    let out = sh(&d, &key, &id, "env | grep -ci proxy; cat /etc/resolv.conf");
    assert!(out.starts_with("0\n"), "no proxy variable: {out}");
    assert!(out.contains("loopback only"), "{out}");
    assert!(!out.contains("nameserver"), "{out}");
    delete_session(&d, &key, &id);
}

#[test]
fn root_the_operators_default_network_applies_to_sessions_that_ask_for_none() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let port = up.port();
    let default = json!({"mode": "allow", "allow": [format!("good.test:{port}")]}).to_string();
    let d = egress_daemon(&hosts(&dir), &["--session-network", &default]);
    let key = d.admin_key().to_string();
    let s = create(&d, &key, json!({}));
    assert_eq!(s["network"]["mode"], "allow", "{s}");
    let id = sid(&s);
    let script = format!("print(connect('good.test:{port}'))\nprint(connect('bad.test:{port}'))\n");
    let out = python(&d, &key, &id, &script, false);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "OK", "{out}");
    assert!(lines[1].starts_with("REFUSED"), "{out}");
    // A session may still ask for less.
    let offline = create(&d, &key, json!({"network": {"mode": "none"}}));
    assert_eq!(offline["network"]["mode"], "none");
    delete_session(&d, &key, &id);
    delete_session(&d, &key, &sid(&offline));
}

/// The connection cap is each session's own: a session that floods its proxy is
/// held at the cap, and another session's connections go through meanwhile.
#[test]
fn root_a_flooding_session_is_held_at_its_cap_and_another_keeps_connecting() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), &[]);
    let key = d.admin_key().to_string();
    let port = up.port();
    let rules = allow(&[format!("good.test:{port}")]);
    let flooder = sid(&create(&d, &key, rules.clone()));
    let bystander = sid(&create(&d, &key, rules));
    std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            python(
                &d,
                &key,
                &flooder,
                &format!(
                    "held, refused, errors = [], 0, 0\n\
                     for i in range(300):\n\
                     \x20   try:\n\
                     \x20       s, why = tunnel('good.test:{port}')\n\
                     \x20   except OSError:\n\
                     \x20       errors += 1\n\
                     \x20       continue\n\
                     \x20   if s: held.append(s)\n\
                     \x20   else: refused += 1\n\
                     end = time.time() + 90\n\
                     while not os.path.exists('/tmp/release') and time.time() < end:\n\
                     \x20   time.sleep(0.05)\n\
                     print(len(held), refused, errors)\n"
                ),
                false,
            )
        });
        bystander_keeps_connecting(&d, &key, &bystander, &up);
        let r = exec(
            &d,
            &key,
            &flooder,
            json!({"argv": ["touch", "/tmp/release"]}),
        );
        assert_eq!(r["exit_code"], 0, "{r}");
        let counts = flood.join().unwrap();
        assert_eq!(counts.trim(), "256 44 0", "held, refused, errors");
    });
    delete_session(&d, &key, &flooder);
    delete_session(&d, &key, &bystander);
}

/// Once `up` holds a flood at the cap: 20 connections of `id` all go through.
fn bystander_keeps_connecting(d: &Daemon, key: &str, id: &str, up: &Upstream) {
    let port = up.port();
    assert!(
        common::eventually(60_000, || up.connections() >= 256),
        "the flood did not reach the cap: {} connections",
        up.connections()
    );
    let out = python(
        d,
        key,
        id,
        &format!(
            "ok, worst = 0, 0.0\n\
             for i in range(20):\n\
             \x20   t = time.time()\n\
             \x20   ok += connect('good.test:{port}') == 'OK'\n\
             \x20   worst = max(worst, time.time() - t)\n\
             print(ok, round(worst, 3))\n"
        ),
        false,
    );
    let (ok, worst) = out.trim().split_once(' ').expect(&out);
    assert_eq!(ok, "20", "the bystander's connections: {out}");
    let worst: f64 = worst.parse().unwrap();
    assert!(worst < 10.0, "a bystander's connection took {worst} s");
}

/// `brig serve --egress-rate` caps each session, across all its connections.
#[test]
fn root_the_operators_bandwidth_cap_holds_across_a_sessions_connections() {
    require_root!();
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let d = egress_daemon(&hosts(&dir), &["--egress-rate", "1M"]);
    let key = d.admin_key().to_string();
    let port = up.port();
    let id = sid(&create(&d, &key, allow(&[format!("good.test:{port}")])));
    // 3 MiB up and back over two connections at once: past the one-second burst,
    // 2 MiB at 1 MiB/s take two seconds each way.
    let out = python(
        &d,
        &key,
        &id,
        &format!(
            "import threading\n\
             def pump(n):\n\
             \x20   s, why = tunnel('good.test:{port}')\n\
             \x20   threading.Thread(target=s.sendall, args=(b'x' * n,)).start()\n\
             \x20   got = 0\n\
             \x20   while got < n:\n\
             \x20       d = s.recv(65536)\n\
             \x20       if not d: break\n\
             \x20       got += len(d)\n\
             \x20   results.append(got)\n\
             results = []\n\
             n = 3 * 1024 * 1024 // 2\n\
             start = time.time()\n\
             ts = [threading.Thread(target=pump, args=(n,)) for _ in range(2)]\n\
             [t.start() for t in ts]\n\
             [t.join() for t in ts]\n\
             print(results == [n, n], round(time.time() - start, 2))\n"
        ),
        false,
    );
    let (intact, took) = out.trim().split_once(' ').expect(&out);
    assert_eq!(intact, "True", "{out}");
    let took: f64 = took.parse().unwrap();
    assert!(took >= 1.5, "3 MiB through a 1 MiB/s cap took {took} s");
    delete_session(&d, &key, &id);
}
