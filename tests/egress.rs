//! Egress (`brig run --network allow|open`): a sandbox reaches only what its policy
//! allows, through brig's proxy, and nothing else leaves its namespace.
//!
//! All traffic stays on this machine: the upstream servers listen on the host's
//! loopback (this test process), names map to them through `--egress-hosts`, and
//! loopback is reachable only because each test opts it in with
//! `--egress-allow-private`. The clients run inside the sandbox, in Python.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::brig;

/// A server on the host's loopback: answers `GET`s with what it saw, echoes
/// anything else, and keeps every first chunk it received.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Upstream {
    fn start(ip: &str, port: u16) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind((ip, port))?;
        let addr = listener.local_addr()?;
        let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let record = record.clone();
                std::thread::spawn(move || serve(stream, &record));
            }
        });
        Ok(Upstream { addr, seen })
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn seen(&self) -> Vec<Vec<u8>> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(mut stream: TcpStream, record: &Mutex<Vec<Vec<u8>>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = vec![0u8; 65536];
    let Ok(n) = stream.read(&mut buf) else { return };
    if n == 0 {
        return;
    }
    record.lock().unwrap().push(buf[..n].to_vec());
    if buf.starts_with(b"GET ") {
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        let line = text.lines().next().unwrap_or("").to_string();
        let host = text
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("host:"))
            .unwrap_or("")
            .to_string();
        let body = format!("upstream saw [{line}] [{host}]\n");
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

/// A hosts file for `--egress-hosts`.
fn hosts_file(dir: &tempfile::TempDir, lines: &str) -> String {
    let path = dir.path().join("hosts");
    std::fs::write(&path, lines).unwrap();
    path.to_string_lossy().into_owned()
}

/// Python helpers the clients inside the sandbox share.
const CLIENT: &str = r#"
import socket, struct, sys
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
    s = socket.create_connection(("127.0.0.1", 3128), timeout=T)
    s.sendall(("GET %s HTTP/1.1\r\nHost: wrong.example\r\nProxy-Connection: keep-alive\r\n\r\n" % url).encode())
    return recv_all(s).decode(errors="replace")
def connect(target, payload=b"ping\n"):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=T)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d:
            break
        head += d
    status = head.split(b"\r\n")[0].decode(errors="replace")
    if " 200 " not in status + " ":
        return status + " | " + recv_all(s).decode(errors="replace").strip()
    s.sendall(payload)
    got = b""
    while len(got) < len(payload):
        d = s.recv(65536)
        if not d:
            break
        got += d
    return status + " | " + ("ECHOED" if got == payload else "GOT %r" % got[:40])
def socks(host, port, payload=b"ping\n"):
    s = socket.create_connection(("127.0.0.1", 1080), timeout=T)
    s.sendall(b"\x05\x01\x00")
    if s.recv(2) != b"\x05\x00":
        return "no method"
    try:
        addr = b"\x01" + socket.inet_aton(host)
    except OSError:
        addr = b"\x03" + bytes([len(host)]) + host.encode()
    s.sendall(b"\x05\x01\x00" + addr + struct.pack(">H", port))
    rep = s.recv(10)
    if len(rep) < 2 or rep[1] != 0:
        return "socks reply %d" % (rep[1] if len(rep) > 1 else -1)
    s.sendall(payload)
    got = s.recv(65536)
    return "ECHOED" if got == payload else "GOT %r" % got[:40]
def raw(host, port, payload=b"ping\n"):
    try:
        s = socket.create_connection((host, port), timeout=T)
        s.sendall(payload)
        got = s.recv(65536)
        return "ECHOED" if got == payload else "GOT %r" % got[:40]
    except OSError as e:
        return "ERR %s" % (e.errno if e.errno is not None else e)
def client_hello(sni):
    name = sni.encode()
    entry = b"\x00" + struct.pack(">H", len(name)) + name
    sni_ext = struct.pack(">H", len(entry)) + entry
    exts = struct.pack(">HH", 0, len(sni_ext)) + sni_ext
    body = b"\x03\x03" + b"\x07" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00" + struct.pack(">H", len(exts)) + exts
    msg = b"\x01" + struct.pack(">I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack(">H", len(msg)) + msg
"#;

/// Runs `script` (after [`CLIENT`]) in a sandbox with `args`; returns stdout,
/// asserting that brig and the script succeeded.
fn sandbox(args: &[&str], script: &str) -> String {
    let mut cmd = brig();
    cmd.arg("run")
        .args(["--timeout", "120s"])
        .args(args)
        .arg("--")
        .args(["/usr/bin/python3", "-c", &format!("{CLIENT}\n{script}")]);
    let out = cmd.output().expect("run brig");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "brig failed ({:?}): {stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// `--network allow` toward `good.test` (and its friends) on the host's loopback.
fn allow_args(hosts: &str, allow: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--network".to_string(),
        "allow".into(),
        "--egress-hosts".into(),
        hosts.into(),
        "--egress-allow-private".into(),
        "127.0.0.0/8".into(),
    ];
    for pattern in allow {
        args.push("--allow-host".into());
        args.push(pattern.to_string());
    }
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn capture_available() -> bool {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

#[test]
fn root_an_allowed_host_is_reached_through_the_http_proxy_with_its_own_host_header() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let out = sandbox(
        &strs(&args),
        &format!(
            "print(proxy_get('http://good.test:{}/path?q=1'))",
            up.port()
        ),
    );
    assert!(out.contains("200 OK"), "{out}");
    assert!(out.contains("[GET /path?q=1 HTTP/1.1]"), "{out}");
    assert!(
        out.contains(&format!("[Host: good.test:{}]", up.port())),
        "the Host header is the URL's, not the client's: {out}"
    );
}

#[test]
fn root_a_host_not_allowed_is_refused_with_a_line_naming_it_and_the_allow_list() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test bad.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let out = sandbox(
        &strs(&args),
        &format!("print(proxy_get('http://bad.test:{}/'))", up.port()),
    );
    assert!(out.contains("403 Forbidden"), "{out}");
    assert!(
        out.contains(&format!(
            "brig egress refused bad.test:{}: not on the allow list; allowed: good.test",
            up.port()
        )),
        "{out}"
    );
    assert!(up.seen().is_empty(), "nothing reached the upstream");
}

#[test]
fn root_deny_wins_over_allow() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 a.good.test secret.good.test\n");
    let mut args = allow_args(&hosts, &["*.good.test"]);
    args.extend(["--deny-host".into(), "secret.good.test".into()]);
    let port = up.port();
    let out = sandbox(
        &strs(&args),
        &format!("print(connect('a.good.test:{port}'))\nprint(connect('secret.good.test:{port}'))"),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains("200") && lines[0].contains("ECHOED"),
        "{out}"
    );
    assert!(
        lines[1].contains("403") && lines[1].contains("denies it"),
        "{out}"
    );
}

#[test]
fn root_connect_reaches_an_allowed_port_and_refuses_another() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let other = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test\n");
    let allowed = format!("good.test:{}", up.port());
    let args = allow_args(&hosts, &[&allowed]);
    let out = sandbox(
        &strs(&args),
        &format!(
            "print(connect('good.test:{}'))\nprint(connect('good.test:{}'))",
            up.port(),
            other.port()
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains("200") && lines[0].contains("ECHOED"),
        "{out}"
    );
    assert!(lines[1].contains("403"), "{out}");
    assert!(other.seen().is_empty());
}

#[test]
fn root_socks5_reaches_an_allowed_name_and_refuses_other_names_and_addresses() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test bad.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let port = up.port();
    let out = sandbox(
        &strs(&args),
        &format!(
            "print(socks('good.test', {port}))\nprint(socks('bad.test', {port}))\nprint(socks('127.0.0.1', {port}))"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["ECHOED", "socks reply 2", "socks reply 2"], "{out}");
}

#[test]
fn root_dns_answers_allowed_names_with_synthetic_addresses_and_nothing_else() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test bad.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let out = sandbox(
        &strs(&args),
        "for n in ['good.test', 'GOOD.test.', 'bad.test', 'missing.test']:\n\
         \x20   try: print(n, socket.gethostbyname(n))\n\
         \x20   except OSError as e: print(n, 'ERR')\n",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("good.test 198.18."), "{out}");
    assert_eq!(
        lines[1].split(' ').nth(1),
        lines[0].split(' ').nth(1),
        "{out}"
    );
    assert_eq!(lines[2], "bad.test ERR", "{out}");
    assert_eq!(lines[3], "missing.test ERR", "{out}");
}

#[test]
fn root_a_raw_socket_ignoring_proxy_variables_reaches_only_allowed_names() {
    require_root!();
    if !capture_available() {
        eprintln!("skipped: transparent capture needs nftables (scripts/test.sh installs it)");
        return;
    }
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test bad.test\n");
    let allowed = format!("good.test:{}", up.port());
    let args = allow_args(&hosts, &[&allowed]);
    let port = up.port();
    // A made-up protocol on a non-HTTP port, no proxy variable in sight.
    let out = sandbox(
        &strs(&args),
        &format!(
            "import os\n\
             for k in list(os.environ):\n\
             \x20   if 'proxy' in k.lower(): del os.environ[k]\n\
             print(raw('good.test', {port}, b'HELO raw\\n'))\n\
             print(raw('bad.test', {port}))\n\
             print(raw(socket.gethostbyname('good.test'), {port} + 1))\n\
             print(raw('198.18.255.254', {port}))\n"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "ECHOED", "{out}");
    assert!(
        lines[1].starts_with("ERR"),
        "bad.test has no address: {out}"
    );
    assert!(
        !lines[2].contains("ECHOED") && !lines[3].contains("ECHOED"),
        "a port not allowed and an address never given out reach nothing: {out}"
    );
    assert_eq!(up.seen().len(), 1, "only the allowed connection arrived");
}

#[test]
fn root_an_ip_literal_in_a_forbidden_range_is_refused() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let port = up.port();
    let out = sandbox(
        &["--network", "open"],
        &format!(
            "for t in ['127.0.0.1:{port}', '169.254.169.254:80', '10.0.0.1:80', '[::1]:{port}', '[::ffff:127.0.0.1]:{port}', '100.64.0.1:80', '192.168.0.1:80']:\n\
             \x20   print(connect(t))\n\
             print(socks('127.0.0.1', {port}))\n"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    for line in &lines[..7] {
        assert!(
            line.contains("403") && line.contains("sandboxes never reach"),
            "{out}"
        );
    }
    assert!(out.contains("cloud metadata"), "{out}");
    assert_eq!(lines[7], "socks reply 2", "{out}");
    assert!(up.seen().is_empty());
}

#[test]
fn root_a_name_resolving_to_a_forbidden_address_is_refused() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // mixed.test has an address opted in (the upstream's) and a private one: a
    // name is refused as a whole if any of its addresses is.
    let hosts = hosts_file(
        &dir,
        "127.0.0.1 sneaky.test\n169.254.169.254 metadata.test\n127.0.0.1 mixed.test\n10.1.2.3 mixed.test\n",
    );
    let port = up.port();
    let args = [
        "--network",
        "allow",
        "--allow-host",
        "sneaky.test",
        "--allow-host",
        "metadata.test",
        "--allow-host",
        "mixed.test",
        "--egress-hosts",
        &hosts,
    ];
    let out = sandbox(
        &args,
        &format!(
            "print(connect('sneaky.test:{port}'))\nprint(connect('metadata.test:80'))\nprint(socks('sneaky.test', {port}))"
        ),
    );
    let mut opted = args.to_vec();
    opted.extend(["--egress-allow-private", "127.0.0.0/8"]);
    let mixed = sandbox(&opted, &format!("print(connect('mixed.test:{port}'))"));
    let lines: Vec<&str> = out.lines().collect();
    for line in &lines[..2] {
        assert!(
            line.contains("403") && line.contains("never reach"),
            "{out}"
        );
    }
    assert!(lines[0].contains("loopback"), "{out}");
    assert!(lines[1].contains("cloud metadata"), "{out}");
    assert_eq!(lines[2], "socks reply 2", "{out}");
    assert!(
        mixed.contains("403") && mixed.contains("private (10.0.0.0/8)"),
        "{mixed}"
    );
    assert!(up.seen().is_empty());
}

/// DNS rebinding: a name allowed while it resolves to an address opted in, then
/// pointed at a forbidden one. Every connection is checked against what the name
/// resolves to then, whichever way it comes (a name to the proxy, or the synthetic
/// address the sandbox's resolver gave out before the change).
#[test]
fn root_a_name_rebound_to_a_forbidden_address_is_refused_from_then_on() {
    require_root!();
    if !capture_available() {
        eprintln!("skipped: transparent capture needs nftables (scripts/test.sh installs it)");
        return;
    }
    let first = Upstream::start("127.0.0.1", 0).unwrap();
    let port = first.port();
    let forbidden = Upstream::start("127.0.0.2", port).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 rebind.test\n");
    let allowed = format!("rebind.test:{port}");
    let args = [
        "--network",
        "allow",
        "--allow-host",
        &allowed,
        "--egress-hosts",
        &hosts,
        "--egress-allow-private",
        "127.0.0.1/32",
    ];
    // Once the first connection arrives, the name moves (replaced as an operator
    // would, by a rename) to an address the operator did not opt in.
    let rebind = {
        let (hosts, seen) = (hosts.clone(), first.seen.clone());
        std::thread::spawn(move || {
            let end = std::time::Instant::now() + Duration::from_secs(120);
            while seen.lock().unwrap().is_empty() && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            let next = format!("{hosts}.next");
            std::fs::write(&next, "127.0.0.2 rebind.test\n").unwrap();
            std::fs::rename(&next, &hosts).unwrap();
        })
    };
    let out = sandbox(
        &args,
        &format!(
            "import time\n\
             synthetic = socket.gethostbyname('rebind.test')\n\
             print(raw(synthetic, {port}))\n\
             end = time.time() + 60\n\
             r = connect('rebind.test:{port}')\n\
             while ' 200 ' in r and time.time() < end:\n\
             \x20   time.sleep(0.05)\n\
             \x20   r = connect('rebind.test:{port}')\n\
             print(r)\n\
             print(socks('rebind.test', {port}))\n\
             print(raw(synthetic, {port}))\n"
        ),
    );
    rebind.join().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[0], "ECHOED", "before the change: {out}");
    assert!(
        lines[1].contains("403") && lines[1].contains("loopback"),
        "after the change, by name: {out}"
    );
    assert_eq!(lines[2], "socks reply 2", "{out}");
    assert_ne!(
        lines[3], "ECHOED",
        "after the change, by the old address: {out}"
    );
    assert!(
        forbidden.seen().is_empty(),
        "the rebound address was reached: {out}"
    );
}

/// `--egress-rate` caps the sandbox, not each connection: two connections share it.
#[test]
fn root_the_bandwidth_cap_holds_across_all_of_a_sandboxs_connections() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let port = up.port();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test\n");
    let mut args = allow_args(&hosts, &["good.test"]);
    args.extend(["--egress-rate".to_string(), "1M".to_string()]);
    // 3 MiB up and back, over two connections at once: past the one-second burst,
    // 2 MiB at 1 MiB/s take two seconds each way.
    let out = sandbox(
        &strs(&args),
        &format!(
            "import threading, time\n\
             def echo(n):\n\
             \x20   s = socket.create_connection(('127.0.0.1', 3128), timeout=T)\n\
             \x20   s.sendall(b'CONNECT good.test:{port} HTTP/1.1\\r\\nHost: good.test\\r\\n\\r\\n')\n\
             \x20   head = b''\n\
             \x20   while not head.endswith(b'\\r\\n\\r\\n'):\n\
             \x20       head += s.recv(1)\n\
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
             ts = [threading.Thread(target=echo, args=(n,)) for _ in range(2)]\n\
             [t.start() for t in ts]\n\
             [t.join() for t in ts]\n\
             print(results == [n, n], round(time.time() - start, 2))\n"
        ),
    );
    let (intact, took) = out.trim().split_once(' ').expect(&out);
    assert_eq!(intact, "True", "{out}");
    let took: f64 = took.parse().unwrap();
    assert!(took >= 1.5, "3 MiB through a 1 MiB/s cap took {took} s");
}

#[test]
fn root_open_mode_reaches_any_name_but_still_refuses_private_ranges() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 anything.test\n10.9.8.7 lan.test\n");
    let port = up.port();
    let opened = sandbox(
        &[
            "--network",
            "open",
            "--egress-hosts",
            &hosts,
            "--egress-allow-private",
            "127.0.0.0/8",
        ],
        &format!("print(connect('anything.test:{port}'))\nprint(connect('lan.test:80'))"),
    );
    let lines: Vec<&str> = opened.lines().collect();
    assert!(lines[0].contains("ECHOED"), "{opened}");
    assert!(
        lines[1].contains("403") && lines[1].contains("private"),
        "{opened}"
    );
    let closed = sandbox(
        &["--network", "open", "--egress-hosts", &hosts],
        &format!("print(connect('anything.test:{port}'))"),
    );
    assert!(
        closed.contains("403") && closed.contains("loopback"),
        "without the opt-in, loopback stays shut: {closed}"
    );
    assert_eq!(up.seen().len(), 1);
}

#[test]
fn root_no_direct_connection_leaves_the_sandbox() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let port = up.port();
    // Public, private, and the host's own loopback port: the sandbox's lo is its own.
    let out = sandbox(
        &strs(&args),
        &format!(
            "import errno\n\
             for h in ['1.1.1.1', '10.0.0.1', '169.254.169.254', '192.168.1.1', '2606:4700::1111']:\n\
             \x20   print(h, raw(h, 80))\n\
             print('lo', raw('127.0.0.1', {port}))\n\
             print(open('/proc/net/route').read().count('\\n'))\n"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    for line in &lines[..5] {
        assert!(
            line.ends_with(&format!("ERR {}", libc::ENETUNREACH)),
            "no route: {out}"
        );
    }
    assert_eq!(lines[5], format!("lo ERR {}", libc::ECONNREFUSED), "{out}");
    assert_eq!(lines[6], "1", "no IPv4 route at all: {out}");
    assert!(up.seen().is_empty());
}

#[test]
fn root_connect_to_443_with_a_tls_name_other_than_the_host_is_refused() {
    require_root!();
    // Port 443 on a loopback address of its own, so it is nobody else's.
    let ip = format!(
        "127.{}.{}.{}",
        100 + std::process::id() % 100,
        std::process::id() % 250 + 1,
        7
    );
    let up = match Upstream::start(&ip, 443) {
        Ok(up) => up,
        Err(e) => panic!("cannot listen on {ip}:443: {e}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, &format!("{ip} good.test other.test\n"));
    let args = allow_args(&hosts, &["good.test:443"]);
    let out = sandbox(
        &strs(&args),
        "print(connect('good.test:443', client_hello('good.test')))\n\
         print(connect('good.test:443', client_hello('other.test')))\n\
         print(connect('good.test:443', b'GET / HTTP/1.0\\r\\n\\r\\n'))\n",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("ECHOED"), "the right name passes: {out}");
    assert!(
        lines[1].contains("200") && !lines[1].contains("ECHOED"),
        "{out}"
    );
    assert!(!lines[2].contains("ECHOED"), "not TLS on 443: {out}");
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "only the right hello went upstream");
    assert!(seen[0].windows(9).any(|w| w == b"good.test"));
}

#[test]
fn root_garbage_to_each_listener_gets_a_protocol_error() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let mut script = String::from(
        "def garbage(port, data):\n\
         \x20   s = socket.create_connection(('127.0.0.1', port), timeout=T)\n\
         \x20   s.sendall(data)\n\
         \x20   return recv_all(s)\n\
         print(garbage(3128, b'\\x00\\x01\\x02 hello\\r\\n\\r\\n').split(b'\\r\\n')[0].decode())\n\
         print(garbage(3128, b'GET /relative HTTP/1.1\\r\\n\\r\\n').split(b'\\r\\n')[0].decode())\n\
         print(garbage(1080, b'\\x04\\x01\\x00\\x50\\x7f\\x00\\x00\\x01\\x00'))\n\
         d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); d.settimeout(T)\n\
         d.sendto(b'\\xab\\xcdnot dns', ('127.0.0.53', 53)); r = d.recv(512)\n\
         print(r[:2] == b'\\xab\\xcd', r[2] & 0x80, r[3] & 0x0f)\n\
         d.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\xc0\\x0c\\x00\\x01\\x00\\x01', ('127.0.0.53', 53)); r = d.recv(512)\n\
         print(r[3] & 0x0f)\n\
         print(proxy_get('http://good.test:1/')[:12])\n",
    );
    if capture_available() {
        // Straight at the capture port: nothing was redirected, nothing to reach.
        script.push_str("print(garbage(15001, b'hello'))\n");
    }
    let out = sandbox(&strs(&args), &script);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "HTTP/1.1 400 Bad Request", "{out}");
    assert_eq!(lines[1], "HTTP/1.1 400 Bad Request", "{out}");
    assert_eq!(lines[2], r"b'\x05\xff'", "{out}");
    assert_eq!(lines[3], "True 128 1", "FORMERR: {out}");
    assert_eq!(lines[4], "1", "a compressed question is FORMERR: {out}");
    assert_eq!(lines[5], "HTTP/1.1 502", "the proxy still serves: {out}");
    if capture_available() {
        assert_eq!(lines[6], "b''", "{out}");
    }
}

#[test]
fn root_network_none_has_no_proxy_and_no_resolver() {
    require_root!();
    let out = sandbox(
        &[],
        "import os\n\
         print(sorted(k for k in os.environ if 'proxy' in k.lower()))\n\
         print(raw('127.0.0.1', 3128))\n\
         print('nameserver' in open('/etc/resolv.conf').read())\n",
    );
    assert_eq!(
        out,
        format!("[]\nERR {}\nFalse\n", libc::ECONNREFUSED),
        "{out}"
    );
}

#[test]
fn a_bad_pattern_is_refused_in_one_line_naming_it() {
    for (flags, named) in [
        (
            vec!["--network", "allow", "--allow-host", "a..test"],
            "'a..test'",
        ),
        (
            vec!["--network", "allow", "--allow-host", "a.test:99999"],
            "'a.test:99999'",
        ),
        (
            vec!["--network", "open", "--egress-allow-private", "10.0.0.0/40"],
            "'10.0.0.0/40'",
        ),
        (vec!["--network", "sideways"], "'sideways'"),
        (
            vec!["--network", "allow", "--allow-host", "bücher.de"],
            "'bücher.de'",
        ),
        (vec!["--allow-host", "a.test"], "--network allow"),
        (vec!["--deny-host", "a.test"], "--network allow or open"),
        (
            vec!["--network", "open", "--egress-rate", "fast"],
            "--egress-rate",
        ),
        (vec!["--egress-rate", "1M"], "--network allow or open"),
    ] {
        let out = brig()
            .arg("run")
            .args(&flags)
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{flags:?}: {stderr}");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
}

#[test]
fn root_connections_past_the_cap_are_refused_and_the_proxy_recovers() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 good.test\n");
    let args = allow_args(&hosts, &["good.test"]);
    let port = up.port();
    // 256 clients that never send a request hold every slot (the cap); one more
    // is told why; once they go, the proxy serves again.
    let out = sandbox(
        &strs(&args),
        &format!(
            "idle = [socket.create_connection(('127.0.0.1', 3128), timeout=T) for _ in range(256)]\n\
             import time\n\
             print(proxy_get('http://good.test:{port}/').split('\\r\\n')[0])\n\
             print('cap' in proxy_get('http://good.test:{port}/'))\n\
             for s in idle: s.close()\n\
             deadline = time.time() + 30\n\
             while True:\n\
             \x20   line = proxy_get('http://good.test:{port}/').split('\\r\\n')[0]\n\
             \x20   if ' 503 ' not in line or time.time() > deadline: break\n\
             \x20   time.sleep(0.1)\n\
             print(line)\n"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "HTTP/1.1 503 Service Unavailable", "{out}");
    assert_eq!(lines[1], "True", "{out}");
    assert_eq!(lines[2], "HTTP/1.0 200 OK", "{out}");
}

/// A python with pip for the sandbox, and the `--bind` it needs: the host's, or the
/// test virtualenv `scripts/test.sh` makes (bound at the same path).
fn python_with_pip() -> Option<(String, Vec<String>)> {
    let host = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if host {
        return Some(("/usr/bin/python3".into(), Vec::new()));
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv");
    let python = venv.join("bin/python3");
    python.exists().then(|| {
        let venv = venv.to_string_lossy().into_owned();
        (
            python.to_string_lossy().into_owned(),
            vec!["--bind".into(), format!("{venv}:{venv}")],
        )
    })
}

/// `pip install` from a package index reached by name through the proxy (a local
/// simple index: a wheel made here, served on the host's loopback), and refused
/// from an index not on the allow list.
#[test]
fn root_pip_installs_from_an_allowed_index_and_not_from_another() {
    require_root!();
    let Some((python, bind)) = python_with_pip() else {
        eprintln!("skipped: no pip (scripts/test.sh makes target/test-venv)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("index");
    std::fs::create_dir_all(root.join("simple/brigdemo")).unwrap();
    let wheel = "brigdemo-1.0-py3-none-any.whl";
    let made = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!(
            "import zipfile\n\
             z = zipfile.ZipFile('{}', 'w')\n\
             z.writestr('brigdemo/__init__.py', 'MESSAGE = \"installed through brig\"\\n')\n\
             z.writestr('brigdemo-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: brigdemo\\nVersion: 1.0\\n')\n\
             z.writestr('brigdemo-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: brig-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
             z.writestr('brigdemo-1.0.dist-info/RECORD', 'brigdemo/__init__.py,,\\nbrigdemo-1.0.dist-info/METADATA,,\\nbrigdemo-1.0.dist-info/WHEEL,,\\nbrigdemo-1.0.dist-info/RECORD,,\\n')\n\
             z.close()\n",
            root.join(wheel).display()
        ))
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::write(
        root.join("simple/brigdemo/index.html"),
        format!("<html><body><a href=\"../../{wheel}\">{wheel}</a></body></html>\n"),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let mut server = std::process::Command::new("/usr/bin/python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .arg("--directory")
        .arg(&root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let hosts = hosts_file(&dir, "127.0.0.1 index.test other-index.test\n");
    let mut args = allow_args(&hosts, &["index.test"]);
    args.extend(bind);
    let pip = |index: &str| {
        format!(
            "{python} -m pip install --no-cache-dir --disable-pip-version-check --retries 0 \
             --timeout 20 --target /tmp/site --index-url http://{index}:{port}/simple/ \
             --trusted-host {index} brigdemo"
        )
    };
    // The proxy's log line says why the other index gave pip nothing.
    let out = brig()
        .env("BRIG_LOG", "brig_net=info")
        .arg("run")
        .args(["--timeout", "120s"])
        .args(strs(&args))
        .arg("--")
        .args([
            "/bin/sh",
            "-c",
            &format!(
                "{} >/tmp/other.log 2>&1; echo other=$?; \
                 {} >/tmp/pip.log 2>&1 || cat /tmp/pip.log; \
                 PYTHONPATH=/tmp/site {python} -c 'import brigdemo; print(brigdemo.MESSAGE)'",
                pip("other-index.test"),
                pip("index.test")
            ),
        ])
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(up, "the index did not start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.starts_with("other=1\n") && stdout.contains("installed through brig"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("other-index.test") && l.contains("Refused")),
        "{stderr}"
    );
}

/// With only an address rule, no name gets through, not even one that points into
/// the allowed range: the proxy would have to look it up, and a lookup of a made-up
/// name is a way out by itself.
#[test]
fn root_an_address_rule_lets_no_name_be_looked_up() {
    require_root!();
    let up = Upstream::start("127.0.0.1", 0).unwrap();
    let port = up.port();
    let dir = tempfile::tempdir().unwrap();
    let hosts = hosts_file(&dir, "127.0.0.1 named.test\n");
    let rule = format!("127.0.0.1/32:{port}");
    let args = allow_args(&hosts, &[&rule]);
    let out = sandbox(
        &strs(&args),
        &format!(
            "print(connect('127.0.0.1:{port}'))\n\
             print(connect('named.test:{port}'))\n\
             try:\n\
             \x20   print(socket.gethostbyname('named.test'))\n\
             except OSError as e:\n\
             \x20   print('no address')\n"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].ends_with("ECHOED"), "{out}");
    assert!(
        lines[1].contains("403") && lines[1].contains("not on the allow list"),
        "{out}"
    );
    assert_eq!(lines[2], "no address", "{out}");
}
