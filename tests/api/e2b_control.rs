//! E2B's control plane (`/sandboxes`, `/v2/sandboxes`): sandboxes created, read,
//! listed, timed out, paused, resumed and killed with a brig key, every error in
//! E2B's `{code, message}`, another tenant's sandboxes out of sight.

use crate::support::{audit_of, daemon, exchange, set_quotas, sh, tenant_key};
use serde_json::{json, Value};

/// A request with E2B's SDK's header (`X-API-KEY`) and a JSON body: (status, body).
fn e2b(
    d: &crate::common::daemon::Daemon,
    method: &str,
    path: &str,
    key: &str,
    body: &str,
) -> (u16, Value) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nX-API-KEY: {key}\r\nContent-Type: application/json\r\nContent-Length: {}",
        body.len()
    );
    exchange(d.addr(), &head, body.as_bytes())
}

fn new_sandbox(d: &crate::common::daemon::Daemon, key: &str, body: Value) -> Value {
    let (status, sandbox) = e2b(d, "POST", "/v2/sandboxes", key, &body.to_string());
    assert_eq!(status, 201, "{sandbox}");
    sandbox
}

fn id_of(sandbox: &Value) -> String {
    sandbox["sandboxID"].as_str().unwrap().to_string()
}

/// Every error of the control plane is E2B's `{code, message}`, code the status.
fn assert_e2b_error(status: u16, body: &Value, want: u16) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["code"], want, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(body.get("error").is_none(), "brig's shape leaked: {body}");
}

/// Unix seconds of the daemon's RFC 3339 times (`YYYY-MM-DDTHH:MM:SSZ`).
fn seconds(at: &Value) -> i64 {
    let text = at.as_str().unwrap();
    let n = |range: std::ops::Range<usize>| text[range].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)
}

#[test]
fn e2b_sandboxes_live_and_end_as_e2b_says_and_bad_input_is_refused_in_its_shape() {
    let d = daemon(&["--e2b-template", "base=host", "--e2b-template", "tiny=host"]);
    let (alice, _) = tenant_key(&d, "alice");
    let (bob, _) = tenant_key(&d, "bob");

    // Bad input, wrong keys, unknown templates: refused, nothing made.
    for (body, want) in [
        ("{\"templateID\":", 400),
        ("[]", 400),
        ("{}", 400),
        ("{\"templateID\":\"base\",\"timeout\":0}", 400),
        ("{\"templateID\":\"base\",\"mcp\":{\"x\":{}}}", 400),
        (
            "{\"templateID\":\"base\",\"autoPause\":true,\"autoPauseMemory\":false}",
            400,
        ),
        (
            "{\"templateID\":\"base\",\"metadata\":{\"e2b.template\":\"x\"}}",
            400,
        ),
        ("{\"templateID\":\"nodejs\"}", 404),
    ] {
        let (status, error) = e2b(&d, "POST", "/v2/sandboxes", &alice, body);
        assert_e2b_error(status, &error, want);
    }
    let (_, error) = e2b(
        &d,
        "POST",
        "/v2/sandboxes",
        &alice,
        "{\"templateID\":\"nodejs\"}",
    );
    assert_eq!(error["message"], "template 'nodejs' not found");
    let body = "{\"templateID\":\"base\"}";
    let head = format!(
        "POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-KEY: {alice}\r\nContent-Type: text/plain\r\nContent-Length: {}",
        body.len()
    );
    let (status, error) = exchange(d.addr(), &head, body.as_bytes());
    assert_e2b_error(status, &error, 400);
    for key in ["wrong", ""] {
        let (status, error) = e2b(
            &d,
            "POST",
            "/v2/sandboxes",
            key,
            "{\"templateID\":\"base\"}",
        );
        assert_e2b_error(status, &error, 401);
    }
    let (status, error) = e2b(&d, "GET", "/v2/sandboxes", "wrong", "");
    assert_e2b_error(status, &error, 401);
    let (status, list) = e2b(&d, "GET", "/v2/sandboxes", &alice, "");
    assert_eq!((status, list), (200, json!([])));

    // Created (v2 and v1), with E2B's fields and both tokens.
    let sandbox = new_sandbox(
        &d,
        &alice,
        json!({"templateID": "tiny", "timeout": 60, "metadata": {"user": "u1"},
               "envVars": {"A": "1"}, "allow_internet_access": false}),
    );
    for field in [
        "envdAccessToken",
        "trafficAccessToken",
        "envdVersion",
        "clientID",
    ] {
        assert!(
            sandbox[field].as_str().is_some_and(|v| !v.is_empty()),
            "{field}: {sandbox}"
        );
    }
    assert_eq!(
        (&sandbox["templateID"], &sandbox["alias"]),
        (&json!("tiny"), &json!("tiny"))
    );
    assert!(sandbox["domain"].is_null());
    let id = id_of(&sandbox);
    let (status, old) = e2b(
        &d,
        "POST",
        "/sandboxes",
        &alice,
        "{\"templateID\":\"base\"}",
    );
    assert_eq!(status, 201, "{old}");

    // Its user is E2B's `user`, at home in /home/user (the workspace, on the host's
    // read-only system dirs), with the environment it was given.
    let seen = sh(
        &d,
        &alice,
        &id,
        "id -un; echo $HOME $USER $A; echo hi > /home/user/f; cat /workspace/f",
    );
    assert_eq!(seen, "user\n/home/user user 1\nhi\n");

    // Read back: the caller's labels only, running, ending at its timeout.
    let (status, info) = e2b(&d, "GET", &format!("/sandboxes/{id}"), &alice, "");
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["metadata"], json!({"user": "u1"}));
    assert_eq!(info["state"], "running");
    assert_eq!(info["templateID"], "tiny");
    assert_eq!(info["envdAccessToken"], sandbox["envdAccessToken"]);
    assert_eq!(info["network"]["denyOut"], json!(["0.0.0.0/0"]));
    let lifetime = seconds(&info["endAt"]) - seconds(&info["startedAt"]);
    assert!((59..=62).contains(&lifetime), "{info}");

    // Timeout: from now, sooner or later; 0 is refused.
    let (status, _) = e2b(
        &d,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &alice,
        "{\"timeout\":3600}",
    );
    assert_eq!(status, 204);
    let (_, info) = e2b(&d, "GET", &format!("/sandboxes/{id}"), &alice, "");
    assert!(
        seconds(&info["endAt"]) - seconds(&info["startedAt"]) >= 3590,
        "{info}"
    );
    let (status, error) = e2b(
        &d,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &alice,
        "{\"timeout\":-1}",
    );
    assert_e2b_error(status, &error, 400);
    // A refresh never shortens it.
    let (status, _) = e2b(
        &d,
        "POST",
        &format!("/sandboxes/{id}/refreshes"),
        &alice,
        "",
    );
    assert_eq!(status, 204);
    let (_, again) = e2b(&d, "GET", &format!("/sandboxes/{id}"), &alice, "");
    assert_eq!(again["endAt"], info["endAt"]);

    // Pause, connect (resumes: 201), connect again (running: 200), resume (409).
    let pause = format!("/sandboxes/{id}/pause");
    assert_eq!(e2b(&d, "POST", &pause, &alice, "{}").0, 204);
    let (_, info) = e2b(&d, "GET", &format!("/sandboxes/{id}"), &alice, "");
    assert_eq!(info["state"], "paused");
    // Paused, its timeout stops: it is kept until resumed or killed (30 days).
    assert!(
        seconds(&info["endAt"]) - seconds(&info["startedAt"]) > 29 * 86_400,
        "{info}"
    );
    let (status, error) = e2b(&d, "POST", &pause, &alice, "{}");
    assert_e2b_error(status, &error, 409);
    // The sandbox plane routes to running sandboxes only, as E2B's edge.
    let token = sandbox["envdAccessToken"].as_str().unwrap();
    let health = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}"
    );
    let (status, error) = exchange(d.addr(), &health, b"");
    assert_e2b_error(status, &error, 502);
    assert_eq!(error["sandboxId"], id);
    let connect = format!("/v2/sandboxes/{id}/connect");
    let (status, connected) = e2b(&d, "POST", &connect, &alice, "{\"timeout\":60}");
    assert_eq!(status, 201, "{connected}");
    assert_eq!(connected["envdAccessToken"], sandbox["envdAccessToken"]);
    // Resumed, it runs its timeout again from now.
    let (_, info) = e2b(&d, "GET", &format!("/sandboxes/{id}"), &alice, "");
    assert!(
        seconds(&info["endAt"]) - seconds(&info["startedAt"]) < 600,
        "{info}"
    );
    assert_eq!(e2b(&d, "POST", &connect, &alice, "{}").0, 200);
    assert_ne!(exchange(d.addr(), &health, b"").0, 502);
    let (status, error) = e2b(&d, "POST", &format!("/sandboxes/{id}/resume"), &alice, "{}");
    assert_e2b_error(status, &error, 409);

    // Another tenant's sandbox is one that does not exist.
    for (method, path, body) in [
        ("GET", format!("/sandboxes/{id}"), ""),
        ("DELETE", format!("/sandboxes/{id}"), ""),
        (
            "POST",
            format!("/sandboxes/{id}/timeout"),
            "{\"timeout\":5}",
        ),
        ("POST", format!("/sandboxes/{id}/pause"), "{}"),
        ("POST", format!("/v2/sandboxes/{id}/connect"), "{}"),
    ] {
        let (status, error) = e2b(&d, method, &path, &bob, body);
        assert_e2b_error(status, &error, 404);
    }
    let (_, list) = e2b(&d, "GET", "/v2/sandboxes", &bob, "");
    assert_eq!(list, json!([]));

    // Unknown ids, routes and methods, and what brig does not record.
    for (method, path, want) in [
        ("GET", "/sandboxes/nosuch", 404),
        ("DELETE", "/sandboxes/nosuch", 404),
        ("GET", "/sandboxes/a/b/c", 404),
        ("GET", "/v2/sandboxes/nosuch/nothing", 404),
        ("PATCH", "/v2/sandboxes", 405),
        ("GET", &format!("/sandboxes/{id}/metrics"), 501),
        ("GET", &format!("/sandboxes/{id}/logs"), 501),
    ] {
        let (status, error) = e2b(&d, method, path, &alice, "");
        assert_e2b_error(status, &error, want);
    }

    // A timeout of 0 ends a sandbox now.
    let (status, _) = e2b(
        &d,
        "POST",
        &format!("/sandboxes/{}/timeout", id_of(&old)),
        &alice,
        "{\"timeout\":0}",
    );
    assert_eq!(status, 204);
    let (status, error) = e2b(
        &d,
        "GET",
        &format!("/sandboxes/{}", id_of(&old)),
        &alice,
        "",
    );
    assert_e2b_error(status, &error, 404);

    // autoPause: at its timeout it is paused, not killed, and kept.
    let pausing = new_sandbox(
        &d,
        &alice,
        json!({"templateID": "base", "timeout": 1, "autoPause": true}),
    );
    let path = format!("/sandboxes/{}", id_of(&pausing));
    let (_, info) = e2b(&d, "GET", &path, &alice, "");
    assert_eq!(info["lifecycle"]["onTimeout"], "pause", "{info}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, info) = e2b(&d, "GET", &path, &alice, "");
        assert_eq!(
            status, 200,
            "an autoPause sandbox ended at its timeout: {info}"
        );
        if info["state"] == "paused" {
            assert!(
                seconds(&info["endAt"]) - seconds(&info["startedAt"]) > 29 * 86_400,
                "{info}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never paused: {info}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(e2b(&d, "DELETE", &path, &alice, "").0, 204);

    // Killed: 204, then gone.
    assert_eq!(
        e2b(&d, "DELETE", &format!("/sandboxes/{id}"), &alice, "").0,
        204
    );
    let (status, error) = e2b(&d, "GET", &format!("/sandboxes/{id}"), &alice, "");
    assert_e2b_error(status, &error, 404);
    let (status, error) = e2b(&d, "DELETE", &format!("/sandboxes/{id}"), &alice, "");
    assert_e2b_error(status, &error, 404);

    // Everything was done as the e2b front end.
    let created = audit_of(&d, "session.create");
    assert!(created.len() >= 2);
    assert!(
        created.iter().all(|e| e["frontend"] == "e2b"),
        "{created:?}"
    );
}

#[test]
fn e2b_lists_page_and_filter_and_a_create_over_quota_is_429() {
    let d = daemon(&["--e2b-template", "base=host"]);
    let (alice, _) = tenant_key(&d, "alice");
    let mut made = Vec::new();
    for i in 0..5 {
        let group = if i % 2 == 0 { "even" } else { "odd one" };
        let sandbox = new_sandbox(
            &d,
            &alice,
            json!({"templateID": "base", "metadata": {"n": i.to_string(), "group": group}}),
        );
        made.push(id_of(&sandbox));
    }
    let paused = made[1].clone();
    assert_eq!(
        e2b(
            &d,
            "POST",
            &format!("/sandboxes/{paused}/pause"),
            &alice,
            ""
        )
        .0,
        204
    );

    // Pages of two, following x-next-token: each sandbox once, newest first.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let path = match &token {
            None => "/v2/sandboxes?limit=2".to_string(),
            Some(t) => format!("/v2/sandboxes?limit=2&nextToken={t}"),
        };
        let response = d.send("GET", &path, Some(&alice), None, ());
        let next = response
            .headers()
            .get("x-next-token")
            .map(|v| v.to_str().unwrap().to_string());
        let (status, body) = crate::common::daemon::read_whole(response).unwrap();
        assert_eq!(status, 200);
        let page: Vec<Value> = serde_json::from_slice(&body).unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(id_of));
        token = next;
        if token.is_none() {
            break;
        }
    }
    let mut sorted_seen = seen.clone();
    sorted_seen.sort();
    let mut sorted_made = made.clone();
    sorted_made.sort();
    assert_eq!(
        sorted_seen, sorted_made,
        "pages missed or repeated sandboxes"
    );
    // Newest first, to the millisecond.
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let (_, oldest_first) = e2b(&d, "GET", "/v2/sandboxes?order=asc", &alice, "");
    let oldest_first: Vec<String> = oldest_first.as_array().unwrap().iter().map(id_of).collect();
    assert_eq!(oldest_first, made);

    // Metadata (as the SDK encodes it: each part URL-encoded, then the whole).
    let (status, odd) = e2b(
        &d,
        "GET",
        "/v2/sandboxes?metadata=group%3Dodd%2520one",
        &alice,
        "",
    );
    assert_eq!(status, 200, "{odd}");
    let mut odd: Vec<String> = odd.as_array().unwrap().iter().map(id_of).collect();
    odd.sort();
    let mut want = vec![made[1].clone(), made[3].clone()];
    want.sort();
    assert_eq!(odd, want);
    let (_, one) = e2b(&d, "GET", "/sandboxes?metadata=n%3D4", &alice, "");
    assert_eq!(
        one.as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect::<Vec<_>>(),
        vec![made[4].clone()]
    );
    assert_eq!(one[0]["metadata"], json!({"n": "4", "group": "even"}));

    // v1 lists the running ones only.
    let (_, running) = e2b(&d, "GET", "/sandboxes", &alice, "");
    let running: Vec<String> = running.as_array().unwrap().iter().map(id_of).collect();
    assert_eq!(running.len(), 4);
    assert!(!running.contains(&paused));

    // State.
    let (_, list) = e2b(&d, "GET", "/v2/sandboxes?state=paused", &alice, "");
    assert_eq!(
        list.as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect::<Vec<_>>(),
        vec![paused.clone()]
    );
    let (_, list) = e2b(&d, "GET", "/v2/sandboxes?state=running,paused", &alice, "");
    assert_eq!(list.as_array().unwrap().len(), 5);

    // Bad filters.
    for query in [
        "limit=0",
        "limit=101",
        "limit=x",
        "state=dead",
        "order=up",
        "nextToken=zz",
    ] {
        let (status, error) = e2b(&d, "GET", &format!("/v2/sandboxes?{query}"), &alice, "");
        assert_e2b_error(status, &error, 400);
    }

    // The tenant's quota, in E2B's 429.
    set_quotas(&d, "alice", json!({"max_sessions": 5}));
    let (status, error) = e2b(
        &d,
        "POST",
        "/v2/sandboxes",
        &alice,
        "{\"templateID\":\"base\"}",
    );
    assert_e2b_error(status, &error, 429);
    for id in &made {
        assert_eq!(
            e2b(&d, "DELETE", &format!("/sandboxes/{id}"), &alice, "").0,
            204
        );
    }
}
