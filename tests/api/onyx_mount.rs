//! `/onyx`: onyx python-sandbox's whole API to the letter, for onyx's client
//! (`CODE_INTERPRETER_BASE_URL=http://<brig>/onyx`), while the root's `/health` and
//! `/v1/sessions` stay brig's (docs/API.md, "onyx python-sandbox").

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::daemon::Daemon;
use crate::support::{daemon, session_count, tenant_key, upload_file};
use serde_json::{json, Value};

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// onyx's `POST /v1/sessions`: 201 `{session_id, expires_at}` and nothing else.
fn create(d: &Daemon, key: &str, body: Value) -> (String, f64) {
    let (status, s) = d.request("POST", "/onyx/v1/sessions", Some(key), Some(body));
    assert_eq!(status, 201, "{s}");
    assert_eq!(
        keys(&s),
        BTreeSet::from(["session_id", "expires_at"]),
        "{s}"
    );
    let id = s["session_id"].as_str().unwrap().to_string();
    // brig's view of it (which also records its cgroup leaves for the harness).
    let (status, info) = d.request("GET", &format!("/v1/sessions/{id}"), Some(key), None);
    assert_eq!(status, 200, "{info}");
    (id, s["expires_at"].as_f64().unwrap())
}

#[test]
fn root_onyx_mount_serves_onyxs_health_and_sessions_and_the_root_stays_brigs() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();

    let (status, brig) = d.request("GET", "/health", None, None);
    assert_eq!(status, 200);
    assert_eq!(keys(&brig), BTreeSet::from(["status", "version", "images"]));
    let (status, h) = d.request("GET", "/onyx/health", None, None);
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["status"], "ok");
    assert_eq!(h["message"], Value::Null);
    assert_eq!(h["version"], "0.4.4");
    assert_eq!(h["brig_version"], brig["version"]);
    assert_eq!(h["images"], brig["images"]);

    // The request onyx's client sends, at both addresses.
    let onyx_request = json!({"ttl_seconds": 60});
    let before = now();
    let (id, expires_at) = create(&d, &key, onyx_request.clone());
    assert!(
        before + 59.0 <= expires_at && expires_at <= now() + 61.0,
        "{expires_at}"
    );
    let (id_default, expires_default) = create(&d, &key, json!({}));
    assert!(
        expires_default >= before + 899.0,
        "onyx's default TTL is 15 min"
    );
    let (status, mine) = d.request("POST", "/v1/sessions", Some(&key), Some(onyx_request));
    assert_eq!(status, 201, "{mine}");
    assert!(mine["expires_at"].is_string(), "brig's own: {mine}");
    assert!(
        mine["state"].is_string() && mine["enforced"].is_object(),
        "{mine}"
    );
    let brigs = mine["session_id"].as_str().unwrap().to_string();

    let (status, r) = d.request(
        "POST",
        &format!("/onyx/v1/sessions/{id}/bash"),
        Some(&key),
        Some(json!({"cmd": "echo hi; pwd"})),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "hi\n/workspace\n");

    for id in [&id, &id_default, &brigs] {
        let (status, body) = d.raw(
            "DELETE",
            &format!("/onyx/v1/sessions/{id}"),
            Some(&key),
            None,
            None,
        );
        assert_eq!(
            (status, body.len()),
            (204, 0),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    // Audited as onyx's, each step.
    let (status, list) = d.request(
        "GET",
        &format!("/v1/audit?session_id={id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{list}");
    let events = list["events"].as_array().unwrap();
    assert!(events.len() >= 3, "{list}");
    assert!(events.iter().all(|e| e["frontend"] == "onyx"), "{list}");
    let (status, body) = d.request(
        "DELETE",
        &format!("/onyx/v1/sessions/{id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 404);
    assert_eq!(body, json!({"detail": format!("Session '{id}' not found")}));
    assert_eq!(session_count(&d, &key), 0);
}

#[test]
fn root_onyx_mount_refuses_as_fastapi_does_and_makes_nothing() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let file = upload_file(&d, &key, "a.txt", b"a");
    let refused: &[(Value, u16, &str)] = &[
        (json!({"ttl_seconds": 0}), 422, "greater_than_equal"),
        (json!({"ttl_seconds": 86401}), 422, "less_than_equal"),
        (json!({"ttl_seconds": "60"}), 422, "int_type"),
        (json!({"files": [{"path": "a.txt"}]}), 422, "missing"),
        (json!([]), 422, "model_attributes_type"),
    ];
    for (body, want, kind) in refused {
        let (status, r) = d.request("POST", "/onyx/v1/sessions", Some(&key), Some(body.clone()));
        assert_eq!(status, *want, "{body}: {r}");
        assert_eq!(r["detail"][0]["type"], *kind, "{body}: {r}");
    }
    let worded: &[(Value, u16, &str)] = &[
        (
            json!({"files": [{"path": "a.txt", "file_id": "nope"}]}),
            404,
            "File with ID 'nope' not found for path 'a.txt'.",
        ),
        (
            json!({"files": [{"path": "../a.txt", "file_id": file}]}),
            422,
            "File paths must not contain '..'.",
        ),
        (
            json!({"files": [{"path": "/a.txt", "file_id": file}]}),
            422,
            "File paths must be relative.",
        ),
    ];
    for (body, want, detail) in worded {
        let (status, r) = d.request("POST", "/onyx/v1/sessions", Some(&key), Some(body.clone()));
        assert_eq!((status, r), (*want, json!({"detail": detail})), "{body}");
    }
    let (status, r) = d.raw(
        "POST",
        "/onyx/v1/sessions",
        Some(&key),
        Some("application/json"),
        Some(b"{".to_vec()),
    );
    let r: Value = serde_json::from_slice(&r).unwrap();
    assert_eq!(
        (status, &r["detail"][0]["type"]),
        (422, &json!("json_invalid")),
        "{r}"
    );
    assert_eq!(session_count(&d, &key), 0);

    // Without a key, with another tenant's session, on a method or path onyx lacks.
    let (status, r) = d.request("POST", "/onyx/v1/sessions", None, Some(json!({})));
    assert_eq!(status, 401, "{r}");
    assert!(r["detail"].is_string(), "{r}");
    let (other, _) = tenant_key(&d, "other");
    let (theirs, _) = create(&d, &other, json!({}));
    for (method, path) in [
        ("DELETE", format!("/onyx/v1/sessions/{theirs}")),
        ("POST", format!("/onyx/v1/sessions/{theirs}/bash")),
    ] {
        let (status, r) = d.request(method, &path, Some(&key), Some(json!({"cmd": "true"})));
        assert_eq!(status, 404, "{method} {path}: {r}");
        assert_eq!(
            r,
            json!({"detail": format!("Session '{theirs}' not found")})
        );
    }
    for (method, path, status_wanted, detail) in [
        (
            "GET",
            format!("/onyx/v1/sessions/{theirs}"),
            405,
            "Method Not Allowed",
        ),
        (
            "GET",
            "/onyx/v1/sessions".to_string(),
            405,
            "Method Not Allowed",
        ),
        (
            "POST",
            "/onyx/health".to_string(),
            405,
            "Method Not Allowed",
        ),
        ("GET", "/onyx/v1/keys".to_string(), 404, "Not Found"),
        ("GET", "/onyx".to_string(), 404, "Not Found"),
    ] {
        let (status, r) = d.request(method, &path, Some(&key), None);
        assert_eq!(
            (status, r),
            (status_wanted, json!({"detail": detail})),
            "{method} {path}"
        );
    }
    let (status, _) = d.request(
        "DELETE",
        &format!("/onyx/v1/sessions/{theirs}"),
        Some(&other),
        None,
    );
    assert_eq!(status, 204);
}

#[test]
fn root_onyx_mount_without_its_default_image_is_unhealthy_and_makes_no_session() {
    require_root!();
    let d = Daemon::start(&["--default-image", "python"]);
    let key = d.admin_key().to_string();
    let (status, h) = d.request("GET", "/onyx/health", None, None);
    assert_eq!((status, &h["status"]), (200, &json!("error")), "{h}");
    let message = h["message"].as_str().unwrap();
    assert!(
        message.contains("python") && !message.contains('\n'),
        "{message}"
    );
    let (_, brig) = d.request("GET", "/health", None, None);
    assert_eq!(brig["status"], "ok", "the root stays brig's: {brig}");
    let (status, r) = d.request("POST", "/onyx/v1/sessions", Some(&key), Some(json!({})));
    assert_eq!(status, 503, "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("brig image build python"),
        "{r}"
    );
    assert_eq!(session_count(&d, &key), 0);
}
