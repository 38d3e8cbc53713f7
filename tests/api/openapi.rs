//! The OpenAPI document: the routes it lists are the routes served, and live
//! exchanges match it.

use std::collections::BTreeSet;
use std::path::Path;

use crate::support::{daemon, error_code};
use serde_json::json;

/// Every endpoint of docs/API.md (method, path with `{}` for parameters).
const DOCUMENTED: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/openapi.json"),
    ("POST", "/v1/keys"),
    ("GET", "/v1/keys"),
    ("DELETE", "/v1/keys/{}"),
    ("GET", "/v1/tenants"),
    ("GET", "/v1/tenants/{}"),
    ("PUT", "/v1/tenants/{}/quotas"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/{}"),
    ("PATCH", "/v1/sessions/{}"),
    ("DELETE", "/v1/sessions/{}"),
    ("POST", "/v1/sessions/{}/pause"),
    ("POST", "/v1/sessions/{}/resume"),
    ("GET", "/v1/sessions/{}/stats"),
    ("POST", "/v1/sessions/{}/exec"),
    ("POST", "/v1/sessions/{}/exec/stream"),
    ("POST", "/v1/sessions/{}/bash"),
    ("POST", "/v1/sessions/{}/processes"),
    ("GET", "/v1/sessions/{}/processes"),
    ("GET", "/v1/sessions/{}/processes/{}"),
    ("GET", "/v1/sessions/{}/processes/{}/output"),
    ("GET", "/v1/sessions/{}/processes/{}/stream"),
    ("POST", "/v1/sessions/{}/processes/{}/stdin"),
    ("POST", "/v1/sessions/{}/processes/{}/signal"),
    ("POST", "/v1/sessions/{}/processes/{}/wait"),
    ("POST", "/v1/sessions/{}/code"),
    ("POST", "/v1/sessions/{}/contexts"),
    ("GET", "/v1/sessions/{}/contexts"),
    ("POST", "/v1/sessions/{}/contexts/{}/restart"),
    ("DELETE", "/v1/sessions/{}/contexts/{}"),
    ("PUT", "/v1/sessions/{}/files"),
    ("GET", "/v1/sessions/{}/files"),
    ("DELETE", "/v1/sessions/{}/files"),
    ("GET", "/v1/sessions/{}/dir"),
    ("POST", "/v1/sessions/{}/dir"),
    ("GET", "/v1/sessions/{}/archive"),
    ("PUT", "/v1/sessions/{}/archive"),
    ("POST", "/v1/sessions/{}/snapshots"),
    ("GET", "/v1/snapshots"),
    ("GET", "/v1/snapshots/{}"),
    ("DELETE", "/v1/snapshots/{}"),
    ("POST", "/v1/sessions/{}/restore"),
    ("POST", "/v1/execute"),
    ("POST", "/v1/execute/stream"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{}"),
    ("DELETE", "/v1/files/{}"),
    ("GET", "/v1/volumes"),
    ("PATCH", "/v1/volumes/{}"),
    ("DELETE", "/v1/volumes/{}"),
    ("GET", "/v1/audit"),
];

#[test]
fn root_openapi_documents_exactly_the_routes_served() {
    require_root!();
    let d = daemon(&[]);
    let (status, doc) = d.request("GET", "/v1/openapi.json", None, None);
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let mut served = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            let method = method.to_ascii_uppercase();
            if !["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"].contains(&method.as_str()) {
                continue;
            }
            // Parameters by position: `{id}` -> `{}`.
            let mut normalized = String::new();
            let mut concrete = String::new();
            let mut in_param = false;
            let mut name = String::new();
            for c in path.chars() {
                match (c, in_param) {
                    ('{', _) => {
                        in_param = true;
                        name.clear();
                    }
                    ('}', _) => {
                        in_param = false;
                        normalized.push_str("{}");
                        // Numeric parameters (process ids) get a number.
                        concrete.push_str(if name == "pid" { "1" } else { "x_dummy" });
                    }
                    (c, true) => name.push(c),
                    (c, false) => {
                        normalized.push(c);
                        concrete.push(c);
                    }
                }
            }
            // Without a key, each route answers: 200 (no auth) or 401, never 404/405.
            let (status, body) = d.raw(&method, &concrete, None, None, None);
            let open = ["/health", "/metrics", "/v1/openapi.json"].contains(&path.as_str());
            let want = if open { 200 } else { 401 };
            assert_eq!(
                status,
                want,
                "{method} {concrete} without a key: {}",
                String::from_utf8_lossy(&body)
            );
            served.insert((method, normalized));
        }
    }
    let documented: BTreeSet<(String, String)> = DOCUMENTED
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let missing: Vec<_> = documented.difference(&served).collect();
    let extra: Vec<_> = served.difference(&documented).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/API.md but not in the OpenAPI document: {missing:?}; the other way: {extra:?}"
    );
    // And what is not routed answers 404 / 405 as JSON errors.
    let (status, body) = d.request("GET", "/v1/nothing-here", Some(d.admin_key()), None);
    assert_eq!(status, 404, "{body}");
    assert_eq!(error_code(&body), "not_found");
    let (status, body) = d.request("PATCH", "/v1/sessions", Some(d.admin_key()), None);
    assert_eq!(status, 405, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");
}

/// Requests of every kind, successes and refusals, match the document the daemon
/// serves (statuses, content types, request and response schemas): clients generated
/// from it can talk to it. The checks are in `tests/openapi_conformance.py`, run with
/// the Python that `scripts/test.sh` installs `jsonschema` into.
#[test]
fn root_every_exchange_matches_the_openapi_document() {
    require_root!();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/python");
    if !python.exists() {
        eprintln!(
            "skipped: no {} (./scripts/test.sh makes it)",
            python.display()
        );
        return;
    }
    let d = daemon(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openapi_conformance.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(d.url(""))
        .arg(d.admin_key())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, list) = d.request("GET", "/v1/sessions", Some(d.admin_key()), None);
    assert_eq!(status, 200);
    assert_eq!(
        list["sessions"],
        json!([]),
        "the script left sessions behind"
    );
}
