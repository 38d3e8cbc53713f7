//! HTTP-level tests of the foundation's endpoints, through the complete router
//! (middleware included), without sessions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::state::Shared;

struct Harness {
    dir: tempfile::TempDir,
    state: AppState,
    app: Router,
    admin: String,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// The request's path: onyx's routes answer errors in onyx's shape.
    path: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body[..self.body.len().min(500)])
            )
        })
    }

    /// Asserts an error response of the documented shape: brig's `{"error": {code,
    /// message}}`, or on onyx's routes (`/v1/files`, `/v1/execute`) FastAPI's
    /// `{"detail": ...}` (a line, or for 422 a line or pydantic's list).
    fn error(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "{:?}", self.json());
        let v = self.json();
        if self.path.starts_with("/v1/files") || self.path.starts_with("/v1/execute") {
            assert!(v.get("error").is_none(), "{v}");
            let detail = &v["detail"];
            let line = detail.as_str().map(|d| !d.is_empty() && !d.contains('\n'));
            let list = status == 422 && detail.as_array().is_some_and(|l| !l.is_empty());
            assert!(line == Some(true) || list, "{code}: {v}");
            return;
        }
        assert_eq!(v["error"]["code"], code, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty() && !message.contains('\n'), "{message}");
    }
}

/// A daemon state as `start` builds it, minus sessions.
async fn harness(extra: &[&str]) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = dir.path().join("store");
    let mut argv = vec![
        "brig-serve".to_string(),
        "--data-dir".to_string(),
        data.display().to_string(),
        "--store".to_string(),
        store.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let args = Config::from(ServeArgs::try_parse_from(argv).unwrap());
    args.validate().unwrap();
    let state = Shared::new(args).await.unwrap();
    if state.args.no_auth {
        state
            .db
            .ensure_tenant(crate::auth::DEFAULT_TENANT)
            .await
            .unwrap();
    }
    let path = state.auth.bootstrap_admin(&state.data_dir).await.unwrap();
    let admin = std::fs::read_to_string(path.unwrap())
        .unwrap()
        .trim()
        .to_string();
    let app = router(state.clone());
    Harness {
        dir,
        state,
        app,
        admin,
    }
}

impl Harness {
    async fn send(&self, request: Request<Body>) -> Reply {
        let path = request.uri().path().to_string();
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        Reply {
            status,
            headers,
            body,
            path,
        }
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Reply {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(key) = key {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let body = match body {
            Some(v) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        self.send(builder.body(body).unwrap()).await
    }

    async fn raw(
        &self,
        method: Method,
        uri: &str,
        key: &str,
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> Reply {
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {key}"));
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        self.send(builder.body(body.into()).unwrap()).await
    }

    /// A key for a new tenant.
    async fn tenant_key(&self, tenant: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/v1/keys",
                Some(&self.admin),
                Some(json!({"tenant": tenant})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
        r.json()["key"].as_str().unwrap().to_string()
    }

    async fn upload(&self, key: &str, filename: &str, data: &[u8]) -> Reply {
        let (content_type, body) = multipart(filename, data);
        self.raw(Method::POST, "/v1/files", key, Some(&content_type), body)
            .await
    }

    fn tenant_files(&self, tenant: &str) -> Vec<String> {
        let dir = self.state.files_dir().join(tenant);
        let mut names: Vec<String> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    async fn audit(&self, key: &str, query: &str) -> Vec<Value> {
        let r = self
            .call(Method::GET, &format!("/v1/audit?{query}"), Some(key), None)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
        r.json()["events"].as_array().unwrap().clone()
    }
}

fn multipart(filename: &str, data: &[u8]) -> (String, Vec<u8>) {
    let boundary = "brig-test-boundary-7f3a";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nassistants\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

// ---------------------------------------------------------------------------------

#[tokio::test]
async fn health_and_openapi_need_no_key() {
    let h = harness(&[]).await;
    let r = h.call(Method::GET, "/health", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    let health = r.json();
    assert_eq!(
        (&health["status"], &health["version"]),
        (&json!("ok"), &json!(env!("CARGO_PKG_VERSION")))
    );
    // The default image, missing from the harness's empty store and not being built.
    assert_eq!(health["images"]["python"]["state"], "missing", "{health}");

    let r = h.call(Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    let doc = r.json();
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/health", &["get"][..]),
        ("/metrics", &["get"]),
        ("/v1/openapi.json", &["get"]),
        ("/v1/keys", &["get", "post"]),
        ("/v1/keys/{key_id}", &["delete"]),
        ("/v1/tenants", &["get"]),
        ("/v1/tenants/{tenant}/quotas", &["put"]),
        ("/v1/files", &["get", "post"]),
        ("/v1/files/{file_id}", &["get", "delete"]),
        ("/v1/audit", &["get"]),
    ] {
        for method in methods {
            assert!(
                paths.get(path).and_then(|p| p.get(*method)).is_some(),
                "{method} {path} missing from the OpenAPI document"
            );
        }
    }
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(schemes["api_key"]["name"], "X-API-Key");
    assert_eq!(
        doc["paths"]["/v1/files"]["post"]["security"][0]["bearer"],
        json!([])
    );
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    // The document served is the one the code builds.
    assert_eq!(
        serde_json::to_value(openapi(&h.state.args)).unwrap()["paths"]
            .as_object()
            .unwrap()
            .len(),
        paths.len()
    );
}

/// Values the daemon refuses with 422 are outside what the schema allows: a
/// timeout or a TTL of 0 is refused, so the minimum is 1.
#[tokio::test]
async fn openapi_minimums_are_those_the_daemon_accepts() {
    let h = harness(&[]).await;
    let doc = h
        .call(Method::GET, "/v1/openapi.json", None, None)
        .await
        .json();
    let schemas = &doc["components"]["schemas"];
    for (schema, field) in [
        ("ExecuteRequest", "timeout_ms"),
        ("ExecRequest", "timeout_ms"),
        ("BashRequest", "timeout_ms"),
        ("CreateSession", "ttl_seconds"),
        ("UpdateSession", "ttl_seconds"),
    ] {
        let property = &schemas[schema]["properties"][field];
        assert_eq!(property["minimum"], 1, "{schema}.{field}: {property}");
    }
    // 0 means none here, and is accepted.
    let idle = &schemas["UpdateSession"]["properties"]["idle_timeout_seconds"];
    assert_eq!(idle["minimum"], 0, "{idle}");
}

/// What OpenAPI requires and client generators rely on: every `$ref` names a schema
/// the document has, every response has a description, operation ids are unique.
#[tokio::test]
async fn openapi_document_is_self_contained_and_unambiguous() {
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    out.push(target);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let h = harness(&[]).await;
    let doc = h
        .call(Method::GET, "/v1/openapi.json", None, None)
        .await
        .json();
    let mut targets = Vec::new();
    refs(&doc, &mut targets);
    assert!(!targets.is_empty());
    for target in targets {
        let name = target
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("$ref outside the schemas: {target}"));
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "$ref to a schema the document lacks: {target}"
        );
    }
    let mut ids = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"].as_str().unwrap().to_string();
            if let Some(other) = ids.insert(id.clone(), format!("{method} {path}")) {
                panic!("operation id {id} of both {other} and {method} {path}");
            }
            for (status, response) in operation["responses"].as_object().unwrap() {
                assert!(
                    response["description"]
                        .as_str()
                        .is_some_and(|d| !d.is_empty()),
                    "{method} {path} {status}: no description"
                );
            }
        }
    }
}

/// The served document passes a third-party OpenAPI validator (openapi-spec-validator,
/// which `scripts/test.sh` installs in `target/test-venv`; `BRIG_OPENAPI_VALIDATOR`
/// names another). Without it the test says so and passes.
#[tokio::test]
async fn openapi_document_passes_an_openapi_validator() {
    let validator = std::env::var_os("BRIG_OPENAPI_VALIDATOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/test-venv/bin/openapi-spec-validator")
        });
    if !validator.exists() {
        eprintln!(
            "skipped: no OpenAPI validator at {} (./scripts/test.sh installs it)",
            validator.display()
        );
        return;
    }
    let h = harness(&[]).await;
    let r = h.call(Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    let file = h.dir.path().join("openapi.json");
    std::fs::write(&file, &r.body).unwrap();
    let out = std::process::Command::new(&validator)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every parameter sits where the handler reads it, so clients generated from the
/// document send it there: `in: path` exactly for the template's `{names}`, the
/// rest in the query string and required only when the handler cannot do without.
#[tokio::test]
async fn openapi_parameters_sit_where_the_routes_read_them() {
    let h = harness(&[]).await;
    let doc = serde_json::to_value(openapi(&h.state.args)).unwrap();
    let mut query = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let template: BTreeSet<&str> = path
            .split('/')
            .filter_map(|part| part.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        for (method, operation) in item.as_object().unwrap() {
            let empty = Vec::new();
            let params = operation["parameters"].as_array().unwrap_or(&empty);
            let mut in_path = BTreeSet::new();
            for param in params {
                let name = param["name"].as_str().unwrap();
                match param["in"].as_str().unwrap() {
                    "path" => {
                        assert!(
                            template.contains(name),
                            "{method} {path}: `{name}` is not in the path"
                        );
                        in_path.insert(name);
                    }
                    "query" => {
                        query.insert(
                            format!("{method} {path} {name}"),
                            param["required"].as_bool().unwrap_or(false),
                        );
                    }
                    other => panic!("{method} {path}: `{name}` in {other}"),
                }
            }
            assert_eq!(in_path, template, "{method} {path}: path parameters");
        }
    }
    for (parameter, required) in [
        ("get /v1/sessions/{id}/files path", true),
        ("delete /v1/sessions/{id}/files recursive", false),
        ("get /v1/sessions/{id}/archive path", true),
        ("get /v1/sessions/{id}/processes/{pid}/output stream", false),
        ("get /v1/sessions/{id}/processes/{pid}/output offset", false),
        ("post /v1/sessions/{id}/processes/{pid}/stdin close", false),
        (
            "post /v1/sessions/{id}/processes/{pid}/wait timeout_ms",
            false,
        ),
        ("get /v1/audit limit", false),
    ] {
        assert_eq!(
            query.get(parameter),
            Some(&required),
            "query parameter {parameter}: {query:?}"
        );
    }
}

#[tokio::test]
async fn missing_invalid_and_revoked_keys_are_401() {
    let h = harness(&[]).await;
    h.call(Method::GET, "/v1/files", None, None)
        .await
        .error(401, "unauthorized");
    h.call(
        Method::GET,
        "/v1/files",
        Some("brig_AAAAAAAAAAAAAAAAAAAAAAAA"),
        None,
    )
    .await
    .error(401, "unauthorized");
    h.call(Method::GET, "/v1/files", Some("not-even-a-key"), None)
        .await
        .error(401, "unauthorized");
    let r = h
        .send(
            Request::get("/v1/files")
                .header(header::AUTHORIZATION, "Basic dXNlcjpwYXNz")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    r.error(401, "unauthorized");

    let key = h.tenant_key("acme").await;
    assert_eq!(
        h.call(Method::GET, "/v1/files", Some(&key), None)
            .await
            .status,
        StatusCode::OK
    );
    let r = h
        .send(
            Request::get("/v1/files")
                .header("x-api-key", &key)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);

    // Revocation takes effect at once, although the key is cached.
    let keys = h
        .call(Method::GET, "/v1/keys", Some(&key), None)
        .await
        .json();
    let key_id = keys["keys"][0]["key_id"].as_str().unwrap().to_string();
    let r = h
        .call(
            Method::DELETE,
            &format!("/v1/keys/{key_id}"),
            Some(&h.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    h.call(Method::GET, "/v1/files", Some(&key), None)
        .await
        .error(401, "unauthorized");
    let keys = h
        .call(Method::GET, "/v1/keys", Some(&h.admin), None)
        .await
        .json();
    let revoked = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key_id"] == key_id.as_str())
        .unwrap();
    assert!(revoked["revoked_at"].is_string());
}

#[tokio::test]
async fn keys_and_tenants_are_admin_business() {
    let h = harness(&[]).await;
    let r = h
        .call(
            Method::POST,
            "/v1/keys",
            Some(&h.admin),
            Some(json!({"tenant": "acme", "name": "ci"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let created = r.json();
    assert_eq!(created["tenant"], "acme");
    assert_eq!(created["name"], "ci");
    let acme = created["key"].as_str().unwrap().to_string();
    assert!(acme.starts_with("brig_") && acme.len() == 29, "{acme}");
    assert!(created["key_id"].as_str().unwrap().starts_with("key_"));
    let other = h.tenant_key("other").await;

    // Tenants cannot manage keys or tenants.
    h.call(
        Method::POST,
        "/v1/keys",
        Some(&acme),
        Some(json!({"tenant": "acme"})),
    )
    .await
    .error(403, "forbidden");
    // ... checked before the body is even parsed.
    h.raw(
        Method::POST,
        "/v1/keys",
        &acme,
        Some("application/json"),
        "{not json",
    )
    .await
    .error(403, "forbidden");
    h.call(Method::GET, "/v1/tenants", Some(&acme), None)
        .await
        .error(403, "forbidden");
    h.call(Method::DELETE, "/v1/keys/key_00000000", Some(&acme), None)
        .await
        .error(403, "forbidden");
    h.call(
        Method::PUT,
        "/v1/tenants/acme/quotas",
        Some(&acme),
        Some(json!({})),
    )
    .await
    .error(403, "forbidden");

    // A tenant lists its own keys only, and never sees key material.
    let mine = h
        .call(Method::GET, "/v1/keys", Some(&acme), None)
        .await
        .json();
    let mine = mine["keys"].as_array().unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["tenant"], "acme");
    assert!(mine[0].get("key").is_none() && mine[0].get("hash").is_none());
    let all = h
        .call(Method::GET, "/v1/keys", Some(&h.admin), None)
        .await
        .json();
    let tenants: Vec<&str> = all["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["admin", "acme", "other"]);
    let _ = other;

    // Bad requests.
    h.call(
        Method::POST,
        "/v1/keys",
        Some(&h.admin),
        Some(json!({"tenant": "a/b"})),
    )
    .await
    .error(422, "invalid_request");
    h.call(
        Method::POST,
        "/v1/keys",
        Some(&h.admin),
        Some(json!({"tenant": "x", "name": "a\u{7}"})),
    )
    .await
    .error(422, "invalid_request");
    h.call(Method::DELETE, "/v1/keys/key_nope", Some(&h.admin), None)
        .await
        .error(404, "not_found");

    // Tenants and quotas.
    let r = h
        .call(
            Method::PUT,
            "/v1/tenants/acme/quotas",
            Some(&h.admin),
            Some(json!({"max_sessions": 5, "max_disk_bytes": "1G"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let t = r.json();
    assert_eq!(t["tenant"], "acme");
    assert_eq!(t["quotas"]["max_sessions"], 5);
    assert_eq!(t["quotas"]["max_disk_bytes"], 1u64 << 30);
    assert_eq!(t["quotas"]["max_concurrent_execs"], 16, "default kept");
    let r = h
        .call(
            Method::PUT,
            "/v1/tenants/acme/quotas",
            Some(&h.admin),
            Some(json!({"max_sessions": null})),
        )
        .await;
    assert_eq!(
        r.json()["quotas"]["max_sessions"],
        100,
        "null resets to the default"
    );
    assert_eq!(
        r.json()["quotas"]["max_disk_bytes"],
        1u64 << 30,
        "absent is kept"
    );
    h.call(
        Method::PUT,
        "/v1/tenants/nobody/quotas",
        Some(&h.admin),
        Some(json!({"max_sessions": 1})),
    )
    .await
    .error(404, "not_found");
    h.call(
        Method::PUT,
        "/v1/tenants/acme/quotas",
        Some(&h.admin),
        Some(json!({"max_sesions": 1})),
    )
    .await
    .error(422, "invalid_request");
    h.call(
        Method::PUT,
        "/v1/tenants/acme/quotas",
        Some(&h.admin),
        Some(json!({"max_sessions": -1})),
    )
    .await
    .error(422, "invalid_request");
    h.call(
        Method::PUT,
        "/v1/tenants/acme/quotas",
        Some(&h.admin),
        Some(json!({"max_disk_bytes": "lots"})),
    )
    .await
    .error(422, "invalid_request");

    let list = h
        .call(Method::GET, "/v1/tenants", Some(&h.admin), None)
        .await
        .json();
    let names: Vec<&str> = list["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme", "admin", "other"]);
    let acme_row = &list["tenants"][0];
    assert_eq!(
        acme_row["usage"],
        json!({
            "sessions": 0,
            "concurrent_execs": 0,
            "file_bytes": 0,
            "volume_bytes": 0,
            "snapshot_bytes": 0,
            "session_disk_bytes": 0,
            "disk_bytes": 0
        })
    );
}

#[tokio::test]
async fn error_mapping() {
    let h = harness(&["--max-body", "1K"]).await;
    let admin = h.admin.clone();
    // Malformed JSON: 400.
    h.raw(
        Method::POST,
        "/v1/keys",
        &admin,
        Some("application/json"),
        "{\"tenant\": ",
    )
    .await
    .error(400, "bad_request");
    // Wrong content type: 400.
    h.raw(
        Method::POST,
        "/v1/keys",
        &admin,
        Some("text/plain"),
        "{\"tenant\": \"a\"}",
    )
    .await
    .error(400, "bad_request");
    h.raw(
        Method::POST,
        "/v1/keys",
        &admin,
        None,
        "{\"tenant\": \"a\"}",
    )
    .await
    .error(400, "bad_request");
    // Unknown field, wrong type, missing field: 422.
    h.call(
        Method::POST,
        "/v1/keys",
        Some(&admin),
        Some(json!({"tenant": "a", "colour": "red"})),
    )
    .await
    .error(422, "invalid_request");
    h.call(
        Method::POST,
        "/v1/keys",
        Some(&admin),
        Some(json!({"tenant": 7})),
    )
    .await
    .error(422, "invalid_request");
    h.call(Method::POST, "/v1/keys", Some(&admin), Some(json!({})))
        .await
        .error(422, "invalid_request");
    // Over --max-body: 413.
    let big = json!({"tenant": "a", "name": "x".repeat(2048)});
    h.call(Method::POST, "/v1/keys", Some(&admin), Some(big))
        .await
        .error(413, "payload_too_large");
    // Bad query string: 400; bad value: 422.
    h.call(Method::GET, "/v1/audit?limit=many", Some(&admin), None)
        .await
        .error(400, "bad_request");
    h.call(Method::GET, "/v1/audit?bogus=1", Some(&admin), None)
        .await
        .error(400, "bad_request");
    h.call(Method::GET, "/v1/audit?since=yesterday", Some(&admin), None)
        .await
        .error(422, "invalid_request");
    // Unknown route: 404; known route, wrong method: 405 — both JSON, with or without a key.
    h.call(Method::GET, "/v1/nope", None, None)
        .await
        .error(404, "not_found");
    h.call(Method::GET, "/nope/deeper?x=1", Some(&admin), None)
        .await
        .error(404, "not_found");
    h.call(Method::PATCH, "/v1/keys", Some(&admin), None)
        .await
        .error(405, "method_not_allowed");
    // Nothing was created by any of it.
    let keys = h
        .call(Method::GET, "/v1/keys", Some(&admin), None)
        .await
        .json();
    assert_eq!(keys["keys"].as_array().unwrap().len(), 1);
    // Every refusal above is in the audit log, in order, whatever its status.
    let refused: Vec<(u64, String)> = h
        .audit(&admin, "action=refused")
        .await
        .iter()
        .map(|e| {
            let status = e["detail"]["status"].as_u64().unwrap();
            (status, e["detail"]["code"].as_str().unwrap().to_string())
        })
        .collect();
    let expected = [
        (400, "bad_request"),
        (400, "bad_request"),
        (400, "bad_request"),
        (422, "invalid_request"),
        (422, "invalid_request"),
        (422, "invalid_request"),
        (413, "payload_too_large"),
        (400, "bad_request"),
        (400, "bad_request"),
        (422, "invalid_request"),
        (404, "not_found"),
        (404, "not_found"),
        (405, "method_not_allowed"),
    ]
    .map(|(status, code)| (status, code.to_string()));
    assert_eq!(refused, expected);
}

#[tokio::test]
async fn files_round_trip_and_isolation() {
    // A JSON limit far below the upload size: uploads have their own limit.
    let h = harness(&["--max-body", "1K"]).await;
    let acme = h.tenant_key("acme").await;
    let other = h.tenant_key("other").await;
    let data = pattern(5 << 20);
    let r = h.upload(&acme, "../report é.bin", &data).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let up = r.json();
    let id = up["file_id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert_eq!(up["filename"], "report é.bin");
    assert_eq!(up["size_bytes"], data.len());

    let list = h
        .call(Method::GET, "/v1/files", Some(&acme), None)
        .await
        .json();
    assert_eq!(list["files"].as_array().unwrap().len(), 1);
    assert_eq!(list["files"][0]["file_id"], id.as_str());
    assert_eq!(list["files"][0]["size_bytes"], data.len());
    assert!(list["files"][0]["upload_time"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    let r = h
        .call(Method::GET, &format!("/v1/files/{id}"), Some(&acme), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers[header::CONTENT_TYPE], "application/octet-stream");
    assert_eq!(
        r.headers[header::CONTENT_LENGTH],
        data.len().to_string().as_str()
    );
    let disposition = r.headers[header::CONTENT_DISPOSITION].to_str().unwrap();
    assert!(
        disposition.contains("filename*=UTF-8''report%20%C3%A9.bin"),
        "{disposition}"
    );
    assert!(r.body == data, "downloaded bytes differ");

    use sha2::Digest;
    let (meta, path) = crate::filestore::open(&h.state, "acme", &id).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(meta.sha256, hex::encode(sha2::Sha256::digest(&data)));

    // Another tenant's id answers 404, everywhere.
    h.call(Method::GET, &format!("/v1/files/{id}"), Some(&other), None)
        .await
        .error(404, "not_found");
    h.call(
        Method::DELETE,
        &format!("/v1/files/{id}"),
        Some(&other),
        None,
    )
    .await
    .error(404, "not_found");
    let theirs = h
        .call(Method::GET, "/v1/files", Some(&other), None)
        .await
        .json();
    assert_eq!(theirs["files"], json!([]));
    h.call(Method::GET, "/v1/files/not-an-id", Some(&acme), None)
        .await
        .error(404, "not_found");

    // Multipart without a file field, or not multipart at all: FastAPI's 422 (the
    // form has no `file`).
    let r = h
        .raw(
            Method::POST,
            "/v1/files",
            &acme,
            Some("multipart/form-data; boundary=b"),
            "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--\r\n",
        )
        .await;
    r.error(422, "invalid_request");
    h.raw(
        Method::POST,
        "/v1/files",
        &acme,
        Some("application/json"),
        "{}",
    )
    .await
    .error(422, "invalid_request");

    let r = h
        .call(
            Method::DELETE,
            &format!("/v1/files/{id}"),
            Some(&acme),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    h.call(Method::GET, &format!("/v1/files/{id}"), Some(&acme), None)
        .await
        .error(404, "not_found");
    h.call(
        Method::DELETE,
        &format!("/v1/files/{id}"),
        Some(&acme),
        None,
    )
    .await
    .error(404, "not_found");
    assert!(h.tenant_files("acme").is_empty());
}

#[tokio::test]
async fn oversize_upload_is_413_and_leaves_nothing() {
    let h = harness(&["--max-file-size", "1M"]).await;
    let acme = h.tenant_key("acme").await;
    // Just over the file limit (inside the multipart allowance) and far over it
    // (stopped by the body limit): both 413, neither leaves a file or a row.
    for size in [(1 << 20) + 1, 3 << 20] {
        h.upload(&acme, "big.bin", &pattern(size))
            .await
            .error(413, "payload_too_large");
        assert!(
            h.tenant_files("acme").is_empty(),
            "{:?}",
            h.tenant_files("acme")
        );
    }
    let list = h
        .call(Method::GET, "/v1/files", Some(&acme), None)
        .await
        .json();
    assert_eq!(list["files"], json!([]));
    // Exactly at the limit is fine.
    let r = h.upload(&acme, "ok.bin", &pattern(1 << 20)).await;
    assert_eq!(r.status, StatusCode::CREATED);
}

#[tokio::test]
async fn disk_quota_applies_to_uploads() {
    let h = harness(&[]).await;
    let acme = h.tenant_key("acme").await;
    let r = h
        .call(
            Method::PUT,
            "/v1/tenants/acme/quotas",
            Some(&h.admin),
            Some(json!({"max_disk_bytes": "100K"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        h.upload(&acme, "a", &pattern(60 << 10)).await.status,
        StatusCode::CREATED
    );
    h.upload(&acme, "b", &pattern(60 << 10))
        .await
        .error(429, "quota_exceeded");
    assert_eq!(h.tenant_files("acme").len(), 1);
    let list = h
        .call(Method::GET, "/v1/tenants", Some(&h.admin), None)
        .await
        .json();
    let acme_row = list["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "acme")
        .unwrap()
        .clone();
    assert_eq!(acme_row["usage"]["file_bytes"], 60 << 10);
}

#[tokio::test]
async fn files_expire() {
    let h = harness(&["--file-ttl", "1s"]).await;
    let acme = h.tenant_key("acme").await;
    let r = h.upload(&acme, "short-lived.txt", b"bye").await;
    let id = r.json()["file_id"].as_str().unwrap().to_string();
    assert_eq!(h.tenant_files("acme"), std::slice::from_ref(&id));
    let task = crate::filestore::spawn_expiry(&h.state, Duration::from_millis(200));
    // Up to a minute: what this guards against is never. The blob goes before its
    // event is written: the task is stopped only once both are done.
    let mut events = Vec::new();
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if h.tenant_files("acme").is_empty() {
            events = h.audit(&acme, "action=file.expire").await;
            if !events.is_empty() {
                break;
            }
        }
    }
    task.abort();
    assert!(
        h.tenant_files("acme").is_empty(),
        "the expiry task did not delete the blob"
    );
    h.call(Method::GET, &format!("/v1/files/{id}"), Some(&acme), None)
        .await
        .error(404, "not_found");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["detail"]["file_id"], id.as_str());
    assert_eq!(events[0]["tenant"], "acme");
    assert_eq!(events[0]["key_id"], Value::Null);
}

#[tokio::test]
async fn audit_is_scoped_filtered_and_streams() {
    let h = harness(&[]).await;
    let acme = h.tenant_key("acme").await;
    let other = h.tenant_key("other").await;
    h.upload(&acme, "a.txt", b"a").await;
    h.upload(&acme, "b.txt", b"b").await;
    h.upload(&other, "c.txt", b"c").await;
    // Refusals: 404 under acme, 401 without a tenant.
    h.call(
        Method::GET,
        "/v1/files/0123456789abcdef0123456789abcdef",
        Some(&acme),
        None,
    )
    .await
    .error(404, "not_found");
    h.call(
        Method::GET,
        "/v1/files",
        Some("brig_BBBBBBBBBBBBBBBBBBBBBBBB"),
        None,
    )
    .await
    .error(401, "unauthorized");

    let mine = h.audit(&acme, "").await;
    assert!(mine.iter().all(|e| e["tenant"] == "acme"), "{mine:?}");
    let uploads: Vec<_> = mine
        .iter()
        .filter(|e| e["action"] == "file.upload")
        .collect();
    assert_eq!(uploads.len(), 2);
    assert_eq!(uploads[0]["outcome"], "ok");
    assert!(uploads[0]["key_id"].as_str().unwrap().starts_with("key_"));
    assert!(uploads[0]["time"].as_str().unwrap().ends_with('Z'));
    let refused = h.audit(&acme, "action=refused").await;
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["outcome"], "refused");
    assert_eq!(
        refused[0]["detail"],
        json!({"method": "GET", "path": "/v1/files/0123456789abcdef0123456789abcdef", "status": 404, "code": "not_found"})
    );

    // Tenants cannot look at other tenants; the admin can, and sees the 401.
    h.call(Method::GET, "/v1/audit?tenant=other", Some(&acme), None)
        .await
        .error(403, "forbidden");
    // (That 403 is itself a refusal, audited under acme.)
    let mine = h.audit(&acme, "").await;
    assert_eq!(mine.last().unwrap()["detail"]["status"], 403);
    assert_eq!(h.audit(&acme, "tenant=acme").await.len(), mine.len());
    let theirs = h.audit(&h.admin, "tenant=other&action=file.upload").await;
    assert_eq!(theirs.len(), 1);
    let anonymous = h.audit(&h.admin, "tenant=&outcome=refused").await;
    assert_eq!(anonymous.len(), 1);
    assert_eq!(anonymous[0]["detail"]["status"], 401);
    let everything = h.audit(&h.admin, "limit=1000").await;
    assert!(everything.iter().any(|e| e["tenant"] == "other"));
    assert!(everything.iter().any(|e| e["action"] == "key.create"));

    // Paging and time filters.
    let first = h.audit(&acme, "limit=1").await;
    assert_eq!(first.len(), 1);
    let rest = h
        .audit(&acme, &format!("after_id={}", first[0]["id"]))
        .await;
    assert_eq!(rest.len(), mine.len() - 1);
    assert!(h
        .audit(&acme, "since=2999-01-01T00:00:00Z")
        .await
        .is_empty());
    assert_eq!(
        h.audit(&acme, "since=2000-01-01T00:00:00%2B02:00")
            .await
            .len(),
        mine.len()
    );
    assert!(h
        .audit(&acme, "until=2000-01-01T00:00:00Z")
        .await
        .is_empty());
    h.call(Method::GET, "/v1/audit?limit=0", Some(&acme), None)
        .await
        .error(422, "invalid_request");
    h.call(Method::GET, "/v1/audit?limit=5000", Some(&acme), None)
        .await
        .error(422, "invalid_request");

    // JSON lines: the same events, one per line.
    let r = h
        .call(Method::GET, "/v1/audit?format=jsonl", Some(&h.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers[header::CONTENT_TYPE], "application/x-ndjson");
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The listing above was recorded after `everything` was read, nothing since.
    assert!(lines.len() >= everything.len());
    let ids: Vec<i64> = lines.iter().map(|l| l["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let r = h
        .call(
            Method::GET,
            "/v1/audit?format=jsonl&limit=2&action=file.upload",
            Some(&acme),
            None,
        )
        .await;
    assert_eq!(String::from_utf8_lossy(&r.body).lines().count(), 2);
}

#[tokio::test]
async fn audit_events_name_the_front_end_they_came_through() {
    let h = harness(&[]).await;
    let acme = h.tenant_key("acme").await;
    // `/v1/files` is onyx's file API; `/v1/keys` is brig's own REST.
    h.upload(&acme, "a.txt", b"a").await;
    let events = h.audit(&h.admin, "").await;
    let frontend_of = |action: &str| {
        let event = events.iter().find(|e| e["action"] == action);
        event.map(|e| e["frontend"].clone())
    };
    assert_eq!(
        frontend_of("file.upload"),
        Some(json!("onyx")),
        "{events:?}"
    );
    assert_eq!(frontend_of("key.create"), Some(json!("rest")), "{events:?}");
}

#[tokio::test]
async fn audit_jsonl_streams_many_pages() {
    let h = harness(&[]).await;
    let caller = crate::auth::Caller {
        tenant: "bulk".into(),
        key_id: None,
        admin: false,
        frontend: crate::auth::Frontend::Rest,
    };
    for i in 0..1203 {
        crate::audit::record(
            &h.state,
            &caller,
            Some("ses_1"),
            "test.event",
            json!({"i": i}),
            "ok",
        )
        .await;
    }
    let r = h
        .call(
            Method::GET,
            "/v1/audit?format=jsonl&tenant=bulk",
            Some(&h.admin),
            None,
        )
        .await;
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1203);
    assert_eq!(lines[1202]["detail"]["i"], 1202);
    assert_eq!(lines[0]["session_id"], "ses_1");
    let by_session = h.audit(&h.admin, "session_id=ses_1&limit=5").await;
    assert_eq!(by_session.len(), 5);
}

#[tokio::test]
async fn metrics_are_rendered_without_a_key() {
    let h = harness(&[]).await;
    h.call(Method::GET, "/health", None, None).await;
    h.call(Method::GET, "/v1/files", None, None).await;
    // Methods nobody defined are one label, not one each.
    for n in 0..5 {
        let method = Method::from_bytes(format!("BOGUS{n}").as_bytes()).unwrap();
        h.call(method, "/health", None, None)
            .await
            .error(405, "method_not_allowed");
    }
    let r = h.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    for needle in [
        "brig_http_requests_total{",
        "route=\"/health\"",
        "status=\"401\"",
        "brig_http_request_duration_seconds_bucket{",
        "brig_failures_total{code=\"unauthorized\"}",
        "brig_http_requests_total{route=\"/health\",method=\"other\",status=\"405\"} 5",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    assert!(!text.contains("BOGUS"), "{text}");
}

#[test]
fn loopback_hosts_are_only_names_no_dns_answer_can_move() {
    for host in [
        "localhost",
        "LOCALHOST:7700",
        "127.0.0.1",
        "127.0.0.1:7700",
        "127.8.9.10:1",
        "[::1]",
        "[::1]:7700",
    ] {
        assert!(is_loopback_host(host), "{host}");
    }
    for host in [
        "evil.example",
        "evil.example:7700",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "localhost:",
        "localhost:7700x",
        "localhost:7700:1",
        "10.0.0.1:7700",
        "0.0.0.0",
        "::1",
        "[::1",
        "[::]:7700",
        "[::ffff:127.0.0.1]",
        "[::1]x",
        "",
    ] {
        assert!(!is_loopback_host(host), "{host}");
    }
}

#[tokio::test]
async fn no_auth_serves_tenant_default() {
    let h = harness(&["--no-auth"]).await;
    let r = h.call(Method::GET, "/v1/files", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    let (content_type, body) = multipart("x.txt", b"hello");
    let r = h
        .send(
            Request::post("/v1/files")
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::from(body))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(h.tenant_files("default").len(), 1);
    h.call(Method::GET, "/v1/tenants", None, None)
        .await
        .error(403, "forbidden");
    // A wrong key is still refused, and the admin key still works.
    h.call(
        Method::GET,
        "/v1/files",
        Some("brig_CCCCCCCCCCCCCCCCCCCCCCCC"),
        None,
    )
    .await
    .error(401, "unauthorized");
    let list = h
        .call(Method::GET, "/v1/tenants", Some(&h.admin), None)
        .await;
    assert_eq!(list.status, StatusCode::OK);
}

/// Output files are taken in as blobs and kept only once recorded, as many as the
/// disk quota has room for: nothing is left of one over the size limit, nor of
/// one the quota refused.
#[tokio::test]
async fn output_blobs_are_kept_only_when_recorded_within_the_quota() {
    let h = harness(&["--max-file-size", "1M"]).await;
    h.tenant_key("acme").await;
    let set = h
        .call(
            Method::PUT,
            "/v1/tenants/acme/quotas",
            Some(&h.admin),
            Some(json!({"max_disk_bytes": 8192})),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK);
    let take = |data: Vec<u8>| {
        crate::filestore::take_blob(&h.state, "acme", "dir/out.txt", &mut data.as_slice())
    };
    let err = take(pattern((1 << 20) + 1)).err().unwrap();
    assert_eq!(err.code.as_str(), "payload_too_large");
    assert_eq!(h.tenant_files("acme"), Vec::<String>::new());
    drop(take(b"dropped".to_vec()).unwrap());
    assert_eq!(h.tenant_files("acme"), Vec::<String>::new());

    // Two 4 KiB blocks of room: the third is not recorded.
    let blobs: Vec<_> = (0..3).map(|_| take(b"abc".to_vec()).unwrap()).collect();
    assert_eq!(h.tenant_files("acme").len(), 3);
    let recorded = crate::filestore::record_blobs(&h.state, "acme", blobs)
        .await
        .unwrap();
    let ids: Vec<String> = recorded
        .iter()
        .flatten()
        .map(|f| f.file_id.clone())
        .collect();
    assert_eq!(recorded.len(), 3);
    assert!(recorded[2].is_none());
    assert_eq!(recorded[0].as_ref().unwrap().filename, "out.txt");
    let (_, path) = crate::filestore::open(&h.state, "acme", &ids[0])
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), b"abc");
    let mut ids = ids;
    ids.sort();
    // The refused blob is removed in the background (within a minute).
    for _ in 0..3000 {
        if h.tenant_files("acme") == ids {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(h.tenant_files("acme"), ids);
}

#[tokio::test]
async fn stored_files_and_bundles() {
    let h = harness(&["--max-file-size", "1M"]).await;
    let work = h.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();

    // A file the daemon produced is taken in (as /v1/execute's outputs are).
    let blob =
        crate::filestore::take_blob(&h.state, "acme", "out.csv", &mut &b"a,b\n1,2\n"[..]).unwrap();
    let meta = crate::filestore::record_blobs(&h.state, "acme", vec![blob])
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(meta.size_bytes, 8);
    assert_eq!(meta.filename, "out.csv");
    let (_, path) = crate::filestore::open(&h.state, "acme", &meta.file_id)
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), b"a,b\n1,2\n");
    crate::filestore::open(&h.state, "other", &meta.file_id)
        .await
        .unwrap_err()
        .code
        .eq(&crate::error::ErrorCode::NotFound)
        .then_some(())
        .unwrap();
    assert_eq!(h.tenant_files("acme"), std::slice::from_ref(&meta.file_id));
    // An 8-byte file takes a 4 KiB block.
    assert_eq!(h.state.db.stored_bytes("acme").await.unwrap(), 4096);
    // What a create counts against the disk quota besides its sessions: files and
    // volumes, of this tenant only.
    for (tenant, name, capacity) in [("acme", "v", 100), ("other", "w", 1000)] {
        h.state
            .db
            .ensure_volume(tenant, name, String::new(), capacity)
            .await
            .unwrap();
    }
    assert_eq!(h.state.db.stored_bytes("acme").await.unwrap(), 4196);
    assert_eq!(h.state.db.stored_bytes("nobody").await.unwrap(), 0);

    // An uploaded tar becomes a readable directory, extracted once.
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o600);
    builder
        .append_data(&mut header, "pkg/data.txt", &b"hello"[..])
        .unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    builder
        .append_link(&mut header, "pkg/escape", "/etc/passwd")
        .unwrap();
    let tarball = builder.into_inner().unwrap();
    let acme = h.tenant_key("acme").await;
    let id = h.upload(&acme, "bundle.tar", &tarball).await.json()["file_id"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = crate::filestore::bundle_dir(&h.state, "acme", &id, 0, false)
        .await
        .unwrap();
    assert_eq!(std::fs::read(dir.join("pkg/data.txt")).unwrap(), b"hello");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("pkg/data.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    assert!(std::fs::symlink_metadata(dir.join("pkg/escape"))
        .unwrap()
        .file_type()
        .is_symlink());
    let state = h.state.clone();
    let again = crate::filestore::bundle_dir(&state, "acme", &id, 0, false)
        .await
        .unwrap();
    assert_eq!(again, dir);
    assert_eq!(
        crate::filestore::bundle_dir(&state, "other", &id, 0, false)
            .await
            .unwrap_err()
            .code
            .as_str(),
        "not_found"
    );
    assert_eq!(
        crate::filestore::bundle_dir(&state, "acme", &meta.file_id, 0, false)
            .await
            .unwrap_err()
            .code
            .as_str(),
        "invalid_request",
        "a CSV is not a tar"
    );
    // Deleting the file removes its extracted bundle too.
    let r = h
        .call(
            Method::DELETE,
            &format!("/v1/files/{id}"),
            Some(&acme),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(!dir.exists());
}

#[tokio::test]
async fn startup_sweep_removes_orphans() {
    let h = harness(&[]).await;
    let acme = h.tenant_key("acme").await;
    let id = h.upload(&acme, "keep", b"keep").await.json()["file_id"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = h.state.files_dir().join("acme");
    std::fs::write(dir.join(".tmp-0123"), b"partial").unwrap();
    std::fs::write(dir.join("fedcba9876543210fedcba9876543210"), b"orphan").unwrap();
    std::fs::create_dir(dir.join(".tmp-abc.bundle")).unwrap();
    crate::filestore::sweep_orphans(&h.state).await.unwrap();
    assert_eq!(h.tenant_files("acme"), [id]);
}

#[tokio::test]
async fn start_refuses_no_auth_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let args = ServeArgs::try_parse_from([
        "brig-serve",
        "--no-auth",
        "--listen",
        "0.0.0.0:0",
        "--data-dir",
        &dir.path().join("d").display().to_string(),
    ])
    .unwrap();
    let err = start(args.into()).await.err().unwrap().to_string();
    assert!(err.contains("--no-auth"), "{err}");
    assert!(
        !dir.path().join("d").exists(),
        "nothing created before validation"
    );
}

#[tokio::test]
async fn data_dir_is_private_and_in_wal_mode() {
    use std::os::unix::fs::PermissionsExt;
    let h = harness(&[]).await;
    let mode = std::fs::metadata(&h.state.data_dir)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    // A database in WAL mode keeps its log beside it while it is open.
    assert!(h.state.data_dir.join("brig.db-wal").exists());
    let key_file: PathBuf = h.state.data_dir.join("admin.key");
    let mode = std::fs::metadata(key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[tokio::test]
async fn real_listener_and_graceful_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = harness(&[]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(run(listener, h.state.clone()));
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"status\":\"ok\""), "{reply}");

    h.state.begin_shutdown();
    let finished = tokio::time::timeout(Duration::from_secs(5), server).await;
    finished.expect("run did not return").unwrap().unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still accepting"
    );
}
