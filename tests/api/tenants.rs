//! API keys, tenants and their quotas, and the daemon's global caps.

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    assert_fields, create, daemon, delete_session, error_code, files_url, import_tiny_image,
    multipart, put_file, sandboxes, session_count, set_disk_quota, set_quotas, sh, sid, tar_end,
    tar_entry, tenant_key, tenant_usage, upload_file, wait_for_file,
};
use serde_json::{json, Value};

/// An exec that runs until the test lets it end: it makes /workspace/started, then
/// waits for /workspace/go ([`put_file`], which takes no exec slot) and prints `done`.
const HELD_EXEC: &str =
    "touch /workspace/started; while [ ! -e /workspace/go ]; do sleep 0.02; done; echo done";

#[test]
fn root_the_cli_sends_the_admin_key_only_to_the_daemon_that_wrote_it() {
    require_root!();
    let d = daemon(&[]);
    let cli = |url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_brig"))
            .env_remove("BRIG_API_KEY")
            .env_remove("BRIG_CONFIG")
            .env("HOME", d.data_dir())
            .env("BRIG_DATA_DIR", d.data_dir())
            .env("BRIG_URL", url)
            // A proxy from the environment must not come between the CLI and a
            // daemon on this host (it would get the key): this one is not there.
            .env("HTTP_PROXY", "http://127.0.0.1:1")
            .env("http_proxy", "http://127.0.0.1:1")
            .env("ALL_PROXY", "http://127.0.0.1:1")
            .args(["session", "ls", "--json"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    // As root on the daemon's host, at its address: the admin key is found.
    let out = cli(&d.url(""));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Anywhere else (here a listener standing in for a mistyped or hostile URL):
    // no key is sent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            request.extend_from_slice(&buf[..n]);
        }
        let body = br#"{"error":{"code":"unauthorized","message":"missing API key"}}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(body);
        String::from_utf8_lossy(&request).to_lowercase()
    });
    let out = cli(&url);
    assert!(!out.status.success());
    // And the refusal tells a CLI user where a key goes.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("BRIG_API_KEY"), "{stderr}");
    let request = seen.join().unwrap();
    assert!(request.starts_with("get /v1/sessions"), "{request}");
    assert!(!request.contains("authorization"), "{request}");
    assert!(
        !request.contains(&d.admin_key().to_lowercase()),
        "{request}"
    );
}

/// Tenant a's things, which tenant b (`b`) then goes after: a session `ses` (with a
/// file and a running `cat`, `pid`), an image session `img` with a snapshot
/// `snap_id`, and an uploaded file `file_id`.
struct TwoTenants {
    a: String,
    b: String,
    ses: String,
    pid: u64,
    img: String,
    snap_id: String,
    file_id: String,
}

fn two_tenants(d: &Daemon) -> TwoTenants {
    let (a, _) = tenant_key(d, "a");
    let (b, _) = tenant_key(d, "b");
    import_tiny_image(d, "tiny");

    // Tenant a's things: a session (with a file and a running process), an
    // image session with a snapshot, an uploaded file, audit events.
    let ses = sid(&create(d, &a, json!({})));
    let (status, _) = d.raw(
        "PUT",
        &files_url(&ses, "/workspace/secret.txt"),
        Some(&a),
        None,
        Some(b"a's secret\n".to_vec()),
    );
    assert_eq!(status, 201);
    let (status, proc_) = d.request(
        "POST",
        &format!("/v1/sessions/{ses}/processes"),
        Some(&a),
        Some(json!({"argv": ["cat"]})),
    );
    assert_eq!(status, 201, "{proc_}");
    let pid = proc_["process_id"].as_u64().unwrap();
    let img = sid(&create(d, &a, json!({"image": "tiny"})));
    let (status, _) = d.raw(
        "PUT",
        &files_url(&img, "/workspace/w.txt"),
        Some(&a),
        None,
        Some(b"w".to_vec()),
    );
    assert_eq!(status, 201);
    let (status, snap) = d.request(
        "POST",
        &format!("/v1/sessions/{img}/snapshots"),
        Some(&a),
        Some(json!({"name": "s"})),
    );
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    let file_id = upload_file(d, &a, "a.txt", b"a's upload");
    TwoTenants {
        a,
        b,
        ses,
        pid,
        img,
        snap_id,
        file_id,
    }
}

impl TwoTenants {
    /// Tenant b tries every endpoint on a's ids: (method, path, status, body) of each.
    fn b_attempts(&self, d: &Daemon) -> Vec<(&'static str, String, u16, String)> {
        let TwoTenants {
            ses,
            pid,
            img,
            snap_id,
            file_id,
            ..
        } = self;
        let tar = {
            let mut t = Vec::new();
            tar_entry(&mut t, "x", tar::EntryType::Regular, "", b"b was here");
            tar_end(&mut t);
            t
        };
        let with_json = |m: &'static str, p: String, body: Value| {
            (
                m,
                p,
                Some(serde_json::to_vec(&body).unwrap()),
                "application/json",
            )
        };
        let with_bytes = |m: &'static str, p: String, body: Vec<u8>| {
            (m, p, Some(body), "application/octet-stream")
        };
        let bare = |m: &'static str, p: String| (m, p, None, "application/json");
        let s = format!("/v1/sessions/{ses}");
        let attempts = vec![
            bare("GET", s.clone()),
            bare("GET", format!("{s}/stats")),
            with_json(
                "PATCH",
                s.clone(),
                json!({"ttl_seconds": 1, "metadata": {"owner": "b"}}),
            ),
            bare("POST", format!("{s}/pause")),
            bare("POST", format!("{s}/resume")),
            with_json(
                "POST",
                format!("{s}/exec"),
                json!({"cmd": "echo b > /workspace/b"}),
            ),
            with_json(
                "POST",
                format!("{s}/exec/stream"),
                json!({"cmd": "echo b > /workspace/b"}),
            ),
            with_json(
                "POST",
                format!("{s}/bash"),
                json!({"cmd": "echo b > /workspace/b"}),
            ),
            with_json(
                "POST",
                format!("{s}/processes"),
                json!({"cmd": "echo b > /workspace/b"}),
            ),
            bare("GET", format!("{s}/processes")),
            bare("GET", format!("{s}/processes/{pid}")),
            bare("GET", format!("{s}/processes/{pid}/output?stream=stdout")),
            bare("GET", format!("{s}/processes/{pid}/stream")),
            with_bytes(
                "POST",
                format!("{s}/processes/{pid}/stdin?close=true"),
                b"from b\n".to_vec(),
            ),
            with_json(
                "POST",
                format!("{s}/processes/{pid}/signal"),
                json!({"signal": "KILL"}),
            ),
            bare("POST", format!("{s}/processes/{pid}/wait?timeout_ms=10")),
            bare("GET", files_url(ses, "/workspace/secret.txt")),
            with_bytes(
                "PUT",
                files_url(ses, "/workspace/secret.txt"),
                b"b".to_vec(),
            ),
            bare("DELETE", files_url(ses, "/workspace/secret.txt")),
            bare("GET", format!("{s}/dir?path=/workspace")),
            bare("POST", format!("{s}/dir?path=/workspace/bdir")),
            bare("GET", format!("{s}/archive?path=/workspace")),
            (
                "PUT",
                format!("{s}/archive?path=/workspace"),
                Some(tar.clone()),
                "application/x-tar",
            ),
            with_json("POST", format!("/v1/sessions/{img}/snapshots"), json!({})),
            with_json(
                "POST",
                format!("/v1/sessions/{img}/restore"),
                json!({"snapshot_id": snap_id}),
            ),
            with_json(
                "POST",
                format!("{s}/restore"),
                json!({"snapshot_id": snap_id}),
            ),
            with_json(
                "POST",
                "/v1/sessions".to_string(),
                json!({"snapshot": snap_id}),
            ),
            with_json(
                "POST",
                "/v1/sessions".to_string(),
                json!({"files": [{"path": "x", "file_id": file_id}]}),
            ),
            with_json(
                "POST",
                "/v1/execute".to_string(),
                json!({"code": "print(1)", "files": [{"path": "x", "file_id": file_id}]}),
            ),
            bare("GET", "/v1/tenants/a".to_string()),
            bare("GET", format!("/v1/snapshots/{snap_id}")),
            bare("DELETE", format!("/v1/snapshots/{snap_id}")),
            bare("GET", format!("/v1/files/{file_id}")),
            bare("DELETE", format!("/v1/files/{file_id}")),
            bare("DELETE", s.clone()),
            bare("DELETE", format!("/v1/sessions/{img}")),
        ];
        attempts
            .into_iter()
            .map(|(method, path, body, ct)| {
                let (status, bytes) = match body {
                    Some(body) => d.raw(method, &path, Some(&self.b), Some(ct), Some(body)),
                    None => d.raw(method, &path, Some(&self.b), None, None),
                };
                let text = String::from_utf8_lossy(&bytes).into_owned();
                (method, path, status, text)
            })
            .collect()
    }

    /// Tenant a deletes its sessions and its snapshot.
    fn clean(self, d: &Daemon) {
        delete_session(d, &self.a, &self.ses);
        delete_session(d, &self.a, &self.img);
        let (status, _) = d.request(
            "DELETE",
            &format!("/v1/snapshots/{}", self.snap_id),
            Some(&self.a),
            None,
        );
        assert_eq!(status, 204);
    }
}

#[test]
fn root_another_tenants_ids_answer_404_and_leak_nothing() {
    require_root!();
    let d = daemon(&[]);
    let t = two_tenants(&d);
    for (method, path, status, text) in t.b_attempts(&d) {
        assert_eq!(status, 404, "tenant b: {method} {path}: {text}");
        assert!(
            !text.contains("secret") && !text.contains("a's upload"),
            "{method} {path} leaked: {text}"
        );
    }
    t.clean(&d);
}

#[test]
fn root_a_tenants_requests_on_another_tenants_ids_change_nothing() {
    require_root!();
    let d = daemon(&[]);
    let t = two_tenants(&d);
    // What b's requests answer is the test above's; here, what they leave.
    t.b_attempts(&d);
    let TwoTenants {
        a,
        ses,
        pid,
        snap_id,
        file_id,
        ..
    } = &t;
    let s = format!("/v1/sessions/{ses}");

    // Nothing of a's changed.
    assert_eq!(
        sh(&d, a, ses, "cat /workspace/secret.txt; ls /workspace"),
        "a's secret\nsecret.txt\n"
    );
    let (_, info) = d.request("GET", &s, Some(a), None);
    assert_eq!(
        info["metadata"],
        json!({}),
        "b's PATCH reached a's session: {info}"
    );
    let (_, p) = d.request(
        "GET",
        &format!("/v1/sessions/{ses}/processes/{pid}"),
        Some(a),
        None,
    );
    assert_eq!(p["state"], "running", "b's signal reached a's process: {p}");
    let (status, _) = d.raw(
        "POST",
        &format!("/v1/sessions/{ses}/processes/{pid}/stdin?close=true"),
        Some(a),
        None,
        Some(b"a\n".to_vec()),
    );
    assert_eq!(status, 204, "b's stdin close reached a's process");
    let (_, p) = d.request(
        "POST",
        &format!("/v1/sessions/{ses}/processes/{pid}/wait?timeout_ms=5000"),
        Some(a),
        None,
    );
    assert_eq!(p["exit_code"], 0);
    let (_, out) = d.raw(
        "GET",
        &format!("/v1/sessions/{ses}/processes/{pid}/output"),
        Some(a),
        None,
        None,
    );
    assert_eq!(out, b"a\n");
    let (status, snap) = d.request("GET", &format!("/v1/snapshots/{snap_id}"), Some(a), None);
    assert_eq!(status, 200, "{snap}");
    let (status, bytes) = d.raw("GET", &format!("/v1/files/{file_id}"), Some(a), None, None);
    assert_eq!((status, bytes.as_slice()), (200, &b"a's upload"[..]));
    assert_eq!(session_count(&d, a), 2);
    t.clean(&d);
}

#[test]
fn root_admin_only_endpoints_refuse_a_tenant_with_403() {
    require_root!();
    let d = daemon(&[]);
    tenant_key(&d, "a");
    let (b, _) = tenant_key(&d, "b");
    for (method, path, body) in [
        (
            "POST",
            "/v1/keys".to_string(),
            Some(json!({"tenant": "b2"})),
        ),
        ("GET", "/v1/tenants".to_string(), None),
        (
            "PUT",
            "/v1/tenants/a/quotas".to_string(),
            Some(json!({"max_sessions": 0})),
        ),
        ("DELETE", "/v1/keys/key_0000".to_string(), None),
    ] {
        let (status, body) = d.request(method, &path, Some(&b), body);
        assert_eq!(status, 403, "tenant b: {method} {path}: {body}");
        assert_eq!(error_code(&body), "forbidden");
    }
}

#[test]
fn root_a_tenants_lists_show_nothing_of_another_tenant() {
    require_root!();
    let d = daemon(&[]);
    let t = two_tenants(&d);
    // b's audit then holds its own attempts on a's ids, each an event of tenant b.
    t.b_attempts(&d);
    let TwoTenants {
        b,
        ses,
        img,
        snap_id,
        file_id,
        ..
    } = &t;
    // Lists show nothing of a.
    for path in [
        format!("/v1/audit?session_id={ses}"),
        "/v1/audit?tenant=a".to_string(),
        "/v1/audit".to_string(),
    ] {
        let (status, list) = d.request("GET", &path, Some(b), None);
        if path.contains("tenant=") && status == 403 {
            continue; // the tenant filter is the admin's
        }
        assert_eq!(status, 200, "{path}: {list}");
        for e in list["events"].as_array().unwrap() {
            assert_eq!(e["tenant"], "b", "GET {path} as b shows {e}");
        }
    }
    for path in ["/v1/sessions", "/v1/snapshots", "/v1/files", "/v1/keys"] {
        let (status, list) = d.request("GET", path, Some(b), None);
        assert_eq!(status, 200, "{path}: {list}");
        let text = list.to_string();
        for secret in [
            ses.as_str(),
            img.as_str(),
            snap_id.as_str(),
            file_id.as_str(),
            "\"a\"",
        ] {
            assert!(
                !text.contains(secret),
                "GET {path} as b shows {secret}: {text}"
            );
        }
    }
    let (_, keys) = d.request("GET", "/v1/keys", Some(b), None);
    assert!(
        keys["keys"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["tenant"] == "b"),
        "{keys}"
    );
    // b's own events are there, a's are not; the admin sees a's.
    let (_, events) = d.request(
        "GET",
        &format!("/v1/audit?tenant=a&session_id={ses}"),
        Some(d.admin_key()),
        None,
    );
    assert!(!events["events"].as_array().unwrap().is_empty(), "{events}");
    t.clean(&d);
}

#[test]
fn root_missing_unknown_and_revoked_keys_are_refused() {
    require_root!();
    let d = daemon(&[]);
    let (key, key_id) = tenant_key(&d, "t");
    let id = sid(&create(&d, &key, json!({})));
    for (name, auth) in [
        ("no key", None),
        (
            "unknown key",
            Some("brig_0000000000000000000000000000000000000000"),
        ),
        ("empty key", Some("")),
    ] {
        let (status, body) = d.request("GET", "/v1/sessions", auth, None);
        assert_eq!(status, 401, "{name}: {body}");
        assert_eq!(error_code(&body), "unauthorized");
        let (status, _) = d.request("GET", &format!("/v1/sessions/{id}"), auth, None);
        assert_eq!(status, 401, "{name}");
    }
    // X-API-Key works as well as Bearer.
    let response = ureq::get(d.url("/v1/sessions"))
        .header("X-API-Key", &key)
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap();
    assert_eq!(response.status(), 200);

    let (status, _) = d.request(
        "DELETE",
        &format!("/v1/keys/{key_id}"),
        Some(d.admin_key()),
        None,
    );
    assert_eq!(status, 204);
    let (status, body) = d.request("GET", "/v1/sessions", Some(&key), None);
    assert_eq!(status, 401, "revoked key: {body}");
    let (status, _) = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(status, 401, "revoked key deleted a session");
    let (_, keys) = d.request("GET", "/v1/keys", Some(d.admin_key()), None);
    let row = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key_id"] == key_id.as_str())
        .unwrap()
        .clone();
    assert_fields(
        &row,
        &["key_id", "tenant", "name", "created_at", "revoked_at"],
    );
    assert!(row["revoked_at"].is_string(), "{row}");
    assert!(!keys.to_string().contains(&key), "GET /v1/keys shows a key");
    // The session lives on (a new key of the tenant can delete it).
    let (key2, _) = tenant_key(&d, "t");
    delete_session(&d, &key2, &id);
}

#[test]
fn root_quotas_refuse_with_429_and_create_nothing() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "q");
    let t = set_quotas(
        &d,
        "q",
        json!({"max_sessions": 1, "max_concurrent_execs": 1}),
    );
    assert_eq!(t["quotas"]["max_sessions"], 1);
    let id = sid(&create(&d, &key, json!({})));
    let sandboxes_before = sandboxes(&d);
    let (status, body) = d.request("POST", "/v1/sessions", Some(&key), Some(json!({})));
    assert_eq!(status, 429, "{body}");
    assert_eq!(error_code(&body), "quota_exceeded");
    assert_eq!(session_count(&d, &key), 1);
    assert_eq!(
        sandboxes(&d),
        sandboxes_before,
        "a refused create left a sandbox"
    );
    // Another tenant is not limited by q's quota.
    let other = sid(&create(&d, d.admin_key(), json!({})));

    // Concurrent execs: a second one while the first runs.
    let slow = {
        let url = d.url(&format!("/v1/sessions/{id}/exec"));
        let key = key.clone();
        std::thread::spawn(move || {
            let agent = common::daemon::agent();
            let r = agent
                .post(&url)
                .header("Authorization", format!("Bearer {key}"))
                .header("Content-Type", "application/json")
                .send(json!({"cmd": HELD_EXEC}).to_string())
                .unwrap();
            let status = r.status().as_u16();
            let text = r.into_body().read_to_string().unwrap();
            (status, serde_json::from_str::<Value>(&text).unwrap())
        })
    };
    wait_for_file(&d, &key, &id, "/workspace/started");
    let (status, body) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&key),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(error_code(&body), "quota_exceeded");
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"argv": ["true"]})),
    );
    assert!(status == 201 || status == 429, "{status}");
    put_file(&d, &key, &id, "/workspace/go");
    let (status, first) = slow.join().unwrap();
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["stdout"], "done\n");
    // Once it ended the slot is free again.
    assert_eq!(sh(&d, &key, &id, "echo again"), "again\n");
    let (_, tenants) = d.request("GET", "/v1/tenants", Some(d.admin_key()), None);
    let q = tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "q")
        .unwrap()
        .clone();
    assert_fields(&q, &["tenant", "quotas", "usage"]);
    assert_eq!(q["usage"]["sessions"], 1, "{q}");
    delete_session(&d, &key, &id);
    delete_session(&d, d.admin_key(), &other);
    // Deleting frees the session slot.
    let id = sid(&create(&d, &key, json!({})));
    delete_session(&d, &key, &id);

    // Disk: the `disk` limit of each live session plus stored files.
    set_quotas(
        &d,
        "q",
        json!({"max_sessions": 5, "max_disk_bytes": 3 << 20}),
    );
    let id = sid(&create(&d, &key, json!({"limits": {"disk": "2M"}})));
    let (ct, form) = multipart("big.bin", &vec![0u8; 1536 << 10]);
    let (status, body) = d.raw("POST", "/v1/files", Some(&key), Some(&ct), Some(form));
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    let (_, files) = d.request("GET", "/v1/files", Some(&key), None);
    assert_eq!(files["files"], json!([]), "a refused upload was kept");
    let small = upload_file(&d, &key, "small.bin", &vec![0u8; 512 << 10]);
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"limits": {"disk": "1M"}})),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(session_count(&d, &key), 1);
    delete_session(&d, &key, &id);
    let (ct, form) = multipart("big.bin", &vec![0u8; 1536 << 10]);
    let (status, _) = d.raw("POST", "/v1/files", Some(&key), Some(&ct), Some(form));
    assert_eq!(status, 201, "the session's disk is free again");
    let (status, _) = d.raw(
        "DELETE",
        &format!("/v1/files/{small}"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 204);
}

/// The daemon's own caps (all tenants together) answer 503, not a tenant's 429: the
/// tenant did nothing wrong and may retry. They create nothing, free up when
/// sessions and execs end, and are audited as refusals of the tenant that asked.
#[test]
fn root_global_caps_refuse_with_503_and_create_nothing() {
    require_root!();
    let d = daemon(&["--max-sessions", "2", "--max-concurrent-execs", "1"]);
    let (a, _) = tenant_key(&d, "ga");
    let (b, _) = tenant_key(&d, "gb");
    let first = sid(&create(&d, &a, json!({})));
    let second = sid(&create(&d, &b, json!({})));
    let sandboxes_before = sandboxes(&d);
    let (status, body) = d.request("POST", "/v1/sessions", Some(&a), Some(json!({})));
    assert_eq!(status, 503, "{body}");
    assert_eq!(error_code(&body), "unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 2 sessions"),
        "{body}"
    );
    assert_eq!(
        sandboxes(&d),
        sandboxes_before,
        "a refused create left a sandbox"
    );
    assert_eq!(session_count(&d, &a), 1);

    // One exec at a time across tenants: b's exec waits for nothing, it is refused.
    let slow = {
        let url = d.url(&format!("/v1/sessions/{first}/exec"));
        let a = a.clone();
        std::thread::spawn(move || {
            let r = common::daemon::agent()
                .post(&url)
                .header("Authorization", format!("Bearer {a}"))
                .header("Content-Type", "application/json")
                .send(json!({"cmd": HELD_EXEC}).to_string())
                .unwrap();
            r.into_body().read_to_string().unwrap()
        })
    };
    // Once a's exec holds the only slot (reading a file takes no exec slot), until
    // the test lets it end.
    wait_for_file(&d, &a, &first, "/workspace/started");
    let (status, refused) = d.request(
        "POST",
        &format!("/v1/sessions/{second}/exec"),
        Some(&b),
        Some(json!({"argv": ["echo", "b"]})),
    );
    assert_eq!(status, 503, "{refused}");
    assert_eq!(error_code(&refused), "unavailable");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 1 concurrent execs"),
        "{refused}"
    );
    put_file(&d, &a, &first, "/workspace/go");
    let done: Value = serde_json::from_str(&slow.join().unwrap()).unwrap();
    assert_eq!(done["stdout"], "done\n", "{done}");
    assert_eq!(
        sh(&d, &b, &second, "echo b"),
        "b\n",
        "the slot is free again"
    );

    // Both refusals are in the audit log of the tenant that was refused (beside a's
    // 404s from polling for the file).
    let unavailable = |key: &str| -> Vec<u64> {
        let (_, list) = d.request("GET", "/v1/audit?action=refused", Some(key), None);
        list["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["detail"]["status"].as_u64().unwrap())
            .filter(|status| *status != 404)
            .collect()
    };
    assert_eq!(unavailable(&a), [503]);
    assert_eq!(unavailable(&b), [503]);

    delete_session(&d, &a, &first);
    let again = sid(&create(&d, &a, json!({})));
    delete_session(&d, &a, &again);
    delete_session(&d, &b, &second);
}

/// A tenant reads its own quotas and usage, which adds up to what the disk quota
/// counts, so that a 429 can be understood without an administrator.
#[test]
fn root_a_tenant_reads_its_own_quotas_and_what_its_disk_quota_counts() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "q");
    set_quotas(
        &d,
        "q",
        json!({"max_sessions": 7, "max_disk_bytes": 4 << 20}),
    );
    let id = sid(&create(&d, &key, json!({"limits": {"disk": "2M"}})));
    upload_file(&d, &key, "f.bin", &vec![7u8; 300 << 10]);

    let (status, mine) = d.request("GET", "/v1/tenants/q", Some(&key), None);
    assert_eq!(status, 200, "{mine}");
    assert_fields(&mine, &["tenant", "created_at", "quotas", "usage"]);
    assert_eq!(mine["tenant"], "q");
    assert_eq!(mine["quotas"]["max_sessions"], 7);
    assert_eq!(mine["quotas"]["max_disk_bytes"], 4 << 20);
    let usage = &mine["usage"];
    assert_eq!(usage["sessions"], 1, "{usage}");
    assert_eq!(usage["session_disk_bytes"], 2 << 20, "{usage}");
    assert_eq!(usage["file_bytes"], 300 << 10, "{usage}");
    assert_eq!(usage["disk_bytes"], (2 << 20) + (300 << 10), "{usage}");
    // The administrator sees the same; the list agrees.
    let (status, theirs) = d.request("GET", "/v1/tenants/q", Some(d.admin_key()), None);
    assert_eq!(status, 200, "{theirs}");
    assert_eq!(theirs["usage"], *usage);
    assert_eq!(tenant_usage(&d, "q"), *usage);

    // What the quota refuses adds up with what the tenant was shown, and says where
    // to look.
    let (status, body) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"limits": {"disk": "2M"}})),
    );
    assert_eq!(status, 429, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    let wanted = (2 << 20) + (300 << 10) + (2 << 20);
    assert!(
        message.contains(&format!("would use {wanted} of its {} bytes", 4 << 20))
            && message.contains("GET /v1/tenants/q"),
        "{message}"
    );

    // Another tenant, even the administrator's, and an unknown one: 404 alike.
    for (who, name) in [(key.as_str(), "admin"), (key.as_str(), "nobody")] {
        let (status, body) = d.request("GET", &format!("/v1/tenants/{name}"), Some(who), None);
        assert_eq!(status, 404, "{name}: {body}");
        assert_eq!(error_code(&body), "not_found");
    }
    let (status, body) = d.request("GET", "/v1/tenants/nobody", Some(d.admin_key()), None);
    assert_eq!(status, 404, "{body}");
    let (status, _) = d.request("GET", "/v1/tenants/q", None, None);
    assert_eq!(status, 401);

    delete_session(&d, &key, &id);
    let (_, mine) = d.request("GET", "/v1/tenants/q", Some(&key), None);
    assert_eq!(mine["usage"]["session_disk_bytes"], 0, "{mine}");
    assert_eq!(mine["usage"]["disk_bytes"], 300 << 10, "{mine}");
}

/// The session cap is exact under concurrent creates, pooled and cold alike: of twelve
/// creates at once, exactly the cap succeed, and deletes free exactly their slots.
#[test]
fn root_session_quota_is_exact_under_concurrent_creates() {
    require_root!();
    let d = daemon(&["--pool", "host=3"]);
    let (key, _) = tenant_key(&d, "burst");
    set_quotas(&d, "burst", json!({"max_sessions": 4}));
    let attempt = || {
        std::thread::scope(|scope| {
            let creates: Vec<_> = (0..12)
                .map(|_| {
                    scope.spawn(|| d.request("POST", "/v1/sessions", Some(&key), Some(json!({}))))
                })
                .collect();
            creates
                .into_iter()
                .map(|c| c.join().unwrap())
                .collect::<Vec<_>>()
        })
    };
    for round in 0..2 {
        let results = attempt();
        let created: Vec<String> = results
            .iter()
            .filter(|(status, _)| *status == 201)
            .map(|(_, s)| sid(s))
            .collect();
        assert_eq!(created.len(), 4, "round {round}: {results:?}");
        for (status, body) in results.iter().filter(|(status, _)| *status != 201) {
            assert_eq!(*status, 429, "{body}");
            assert_eq!(error_code(body), "quota_exceeded");
        }
        assert_eq!(session_count(&d, &key), 4);
        for id in &created {
            delete_session(&d, &key, id);
        }
        assert_eq!(session_count(&d, &key), 0);
    }
}

#[test]
fn root_small_and_empty_files_count_as_the_disk_they_take() {
    require_root!();
    // Thousands of empty uploads counted 0 bytes while each took an inode, a
    // block and a row on the host.
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "tiny");
    set_quotas(&d, "tiny", json!({"max_disk_bytes": 10 * 4096}));
    for i in 0..9 {
        upload_file(&d, &key, &format!("empty{i}"), b"");
    }
    upload_file(&d, &key, "one-byte", b"x");
    let (_, tenant) = d.request("GET", "/v1/tenants/tiny", Some(&key), None);
    assert_eq!(tenant["usage"]["file_bytes"], 10 * 4096, "{tenant}");
    let (ct, body) = multipart("one-more", b"");
    let (status, body) = d.raw("POST", "/v1/files", Some(&key), Some(&ct), Some(body));
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
}

/// Uploads and session creates at the same moment cannot together slip over the
/// disk quota: both count under the same lock, each seeing what the other took.
#[test]
fn root_concurrent_uploads_and_creates_stay_within_the_disk_quota() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "race");
    const MIB: u64 = 1 << 20;
    let disk = 16 * MIB;
    // Room for any two of: a session (16 MiB of disk), a 10 MiB file. Never three.
    let quota = 2 * disk;
    set_disk_quota(&d, "race", quota);
    let data = vec![7u8; (10 * MIB) as usize];
    for round in 0..6 {
        let (sessions, files): (Vec<Option<String>>, Vec<Option<String>>) =
            std::thread::scope(|scope| {
                let creates: Vec<_> = (0..2)
                    .map(|_| {
                        scope.spawn(|| {
                            let body = json!({"limits": {"disk": disk}});
                            let (status, s) =
                                d.request("POST", "/v1/sessions", Some(&key), Some(body));
                            match status {
                                201 => Some(sid(&s)),
                                429 => None,
                                _ => panic!("create: {status} {s}"),
                            }
                        })
                    })
                    .collect();
                let uploads: Vec<_> = (0..2)
                    .map(|_| {
                        scope.spawn(|| {
                            let (ctype, body) = multipart("f.bin", &data);
                            let (status, bytes) =
                                d.raw("POST", "/v1/files", Some(&key), Some(&ctype), Some(body));
                            let v: Value = serde_json::from_slice(&bytes).unwrap();
                            match status {
                                201 => Some(v["file_id"].as_str().unwrap().to_string()),
                                429 => None,
                                _ => panic!("upload: {status} {v}"),
                            }
                        })
                    })
                    .collect();
                (
                    creates.into_iter().map(|t| t.join().unwrap()).collect(),
                    uploads.into_iter().map(|t| t.join().unwrap()).collect(),
                )
            });
        let sessions: Vec<String> = sessions.into_iter().flatten().collect();
        let files: Vec<String> = files.into_iter().flatten().collect();
        let used = sessions.len() as u64 * disk + files.len() as u64 * 10 * MIB;
        assert!(
            used <= quota,
            "round {round}: {} sessions and {} files take {used} of {quota} bytes",
            sessions.len(),
            files.len()
        );
        assert_eq!(
            sessions.len() + files.len(),
            2,
            "round {round}: room for two"
        );
        for id in &sessions {
            delete_session(&d, &key, id);
        }
        for file in &files {
            let (status, _) = d.raw(
                "DELETE",
                &format!("/v1/files/{file}"),
                Some(&key),
                None,
                None,
            );
            assert_eq!(status, 204);
        }
    }
}
