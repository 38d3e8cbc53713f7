//! The audit log: what it records, how long it keeps it, and how refusals are
//! summed up.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    assert_fields, audit_of, create, daemon, delete_session, exchange, exec, files_url, sid,
    tenant_key,
};
use serde_json::{json, Value};

/// A tenant's session on which the tenant did a few things, and another tenant.
struct Audited {
    d: Daemon,
    key: String,
    key_id: String,
    other: String,
    /// The session (deleted by now).
    id: String,
}

/// Tenant `aud` creates a session, runs two commands in it (one of 5000 bytes),
/// writes a file, makes two requests that are refused (404, 422) and deletes the
/// session; tenant `other` exists.
fn audited() -> Audited {
    let d = daemon(&[]);
    let (key, key_id) = tenant_key(&d, "aud");
    let (other, _) = tenant_key(&d, "other");
    let id = sid(&create(&d, &key, json!({})));
    exec(&d, &key, &id, json!({"cmd": "echo audited"}));
    let long = format!("echo {}", "x".repeat(5000));
    exec(&d, &key, &id, json!({ "cmd": long }));
    let (status, _) = d.raw(
        "PUT",
        &files_url(&id, "/workspace/f"),
        Some(&key),
        None,
        Some(b"x".to_vec()),
    );
    assert_eq!(status, 201);
    let (status, _) = d.request("GET", "/v1/sessions/ses_doesnotexist", Some(&key), None);
    assert_eq!(status, 404);
    let (status, _) = d.request(
        "POST",
        "/v1/sessions",
        Some(&key),
        Some(json!({"bogus": 1})),
    );
    assert_eq!(status, 422);
    delete_session(&d, &key, &id);
    Audited {
        d,
        key,
        key_id,
        other,
        id,
    }
}

impl Audited {
    /// The session's events, as its tenant lists them.
    fn events(&self) -> Vec<Value> {
        let (status, list) = self.d.request(
            "GET",
            &format!("/v1/audit?session_id={}", self.id),
            Some(&self.key),
            None,
        );
        assert_eq!(status, 200, "{list}");
        list["events"].as_array().unwrap().clone()
    }
}

#[test]
fn root_audit_records_a_sessions_operations_with_who_did_them() {
    require_root!();
    let a = audited();
    let events = a.events();
    let (key_id, id) = (&a.key_id, &a.id);
    let actions: Vec<&str> = events
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for wanted in ["session.create", "exec", "file.write", "session.delete"] {
        assert!(actions.contains(&wanted), "no {wanted} in {actions:?}");
    }
    for e in &events {
        assert_fields(
            e,
            &[
                "id",
                "time",
                "tenant",
                "key_id",
                "session_id",
                "action",
                "detail",
                "outcome",
            ],
        );
        assert_eq!(e["tenant"], "aud", "{e}");
        assert_eq!(e["key_id"], key_id.as_str(), "{e}");
        assert_eq!(e["session_id"], id.as_str(), "{e}");
        assert!(
            e["time"].is_string() && e["id"].is_i64() && e["outcome"].is_string(),
            "{e}"
        );
    }
    let exec_event = events.iter().find(|e| e["action"] == "exec").unwrap();
    assert!(
        exec_event["detail"].to_string().contains("echo audited"),
        "{exec_event}"
    );
}

#[test]
fn root_audit_keeps_commands_to_1_kib() {
    require_root!();
    let events = audited().events();
    let long_event = events
        .iter()
        .find(|e| {
            e["detail"]["cmd"]
                .as_str()
                .unwrap_or("")
                .starts_with("echo xxx")
        })
        .unwrap();
    let kept = long_event["detail"]["cmd"].as_str().unwrap();
    assert!(kept.len() <= 1024 + 4, "{} bytes kept", kept.len());
}

#[test]
fn root_audit_records_refusals_with_the_caller_when_known() {
    require_root!();
    let Audited { d, key, .. } = &audited();
    let (_, refused) = d.request("GET", "/v1/audit?outcome=refused", Some(key), None);
    let refused = refused["events"].as_array().unwrap().clone();
    let paths: Vec<String> = refused
        .iter()
        .map(|e| e["detail"]["path"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        paths.iter().any(|p| p == "/v1/sessions/ses_doesnotexist"),
        "{refused:?}"
    );
    assert!(
        refused.iter().any(|e| e["detail"]["status"] == 422),
        "{refused:?}"
    );
    let (status, _) = d.request("GET", "/v1/sessions", None, None);
    assert_eq!(status, 401);
    let (_, all) = d.request(
        "GET",
        "/v1/audit?outcome=refused",
        Some(d.admin_key()),
        None,
    );
    assert!(
        all["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["detail"]["status"] == 401),
        "{all}"
    );
}

#[test]
fn root_audit_lists_as_json_lines() {
    require_root!();
    let a = audited();
    let events = a.events();
    let Audited { d, key, id, .. } = &a;
    let response = d.send(
        "GET",
        &format!("/v1/audit?session_id={id}&format=jsonl"),
        Some(key),
        None,
        (),
    );
    assert_eq!(response.status(), 200);
    let ct = response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(ct.starts_with("application/x-ndjson"), "{ct}");
    let mut text = String::new();
    response
        .into_body()
        .into_reader()
        .read_to_string(&mut text)
        .unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON per line"))
        .collect();
    assert_eq!(lines.len(), events.len());
}

#[test]
fn root_audit_filters_by_action_and_pages_after_an_id() {
    require_root!();
    let a = audited();
    let events = a.events();
    let Audited { d, key, id, .. } = &a;
    let (_, one) = d.request(
        "GET",
        &format!("/v1/audit?session_id={id}&action=exec"),
        Some(key),
        None,
    );
    assert!(one["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["action"] == "exec"));
    let (_, first) = d.request(
        "GET",
        &format!("/v1/audit?session_id={id}&limit=1"),
        Some(key),
        None,
    );
    assert_eq!(first["events"].as_array().unwrap().len(), 1);
    let after = first["events"][0]["id"].as_i64().unwrap();
    let (_, rest) = d.request(
        "GET",
        &format!("/v1/audit?session_id={id}&after_id={after}"),
        Some(key),
        None,
    );
    assert_eq!(rest["events"].as_array().unwrap().len(), events.len() - 1);
}

#[test]
fn root_another_tenant_sees_none_of_the_audit_even_when_asking_for_it() {
    require_root!();
    let Audited { d, other, id, .. } = &audited();
    for path in [
        format!("/v1/audit?session_id={id}"),
        "/v1/audit?tenant=aud".to_string(),
        "/v1/audit".to_string(),
    ] {
        let (status, list) = d.request("GET", &path, Some(other), None);
        assert!(status == 200 || status == 403, "{path}: {status}");
        if status == 200 {
            assert!(
                list["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|e| e["tenant"] == "other"),
                "{path}: {list}"
            );
        }
    }
}

/// The daemon removes audit events past `--audit-retention` on its own, oldest
/// first, and keeps the younger ones.
#[test]
fn audit_events_past_their_retention_are_removed() {
    let d = daemon(&["--audit-retention", "2s"]);
    let (key, _) = tenant_key(&d, "ret");
    let refuse = |id: &str| {
        let (status, _) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
        assert_eq!(status, 404);
    };
    let refused = || -> Vec<String> {
        let (status, list) = d.request("GET", "/v1/audit?action=refused", Some(&key), None);
        assert_eq!(status, 200, "{list}");
        list["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["detail"]["path"].as_str().unwrap().to_string())
            .collect()
    };
    refuse("ses_older");
    std::thread::sleep(Duration::from_millis(1500));
    refuse("ses_younger");
    assert_eq!(
        refused(),
        ["/v1/sessions/ses_older", "/v1/sessions/ses_younger"]
    );
    // The older goes 2 s after it was written (at the next pass, at most 1 s later),
    // while the younger, 1.5 s younger, is kept; then it goes too.
    assert!(
        common::eventually(6000, || refused() == ["/v1/sessions/ses_younger"]),
        "{:?}",
        refused()
    );
    assert!(
        common::eventually(6000, || refused().is_empty()),
        "{:?}",
        refused()
    );
    assert!(
        d.log_text()
            .contains("removed audit events past their retention"),
        "{}",
        d.log_text()
    );
}

#[test]
fn root_a_long_method_and_path_leave_a_short_audit_event_and_log_line() {
    require_root!();
    // Any token is a method to HTTP, and one of 1,100 characters is answered 405
    // before the key is looked at: method and path were kept 1 KiB each in the
    // refusal's event (2 KiB a row, kept 30 days) and logged whole, twice (6 KiB a
    // line); one connection grew the log by 550 MB in 50 s.
    let d = daemon(&[]);
    let method = "M".repeat(1100);
    let path = format!("/v1/sessions/{}", "A".repeat(8 * 1024));
    for _ in 0..3 {
        let (status, body) = exchange(
            d.addr(),
            &format!("{method} {path} HTTP/1.1\r\nHost: x"),
            b"",
        );
        assert_eq!(status, 405, "{body}");
    }
    let events: Vec<Value> = audit_of(&d, "refused")
        .into_iter()
        .filter(|e| {
            e["detail"]["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("MMMM"))
        })
        .collect();
    assert_eq!(events.len(), 3, "{events:?}");
    for event in &events {
        let stored = event.to_string().len();
        assert!(stored < 1024, "an event of {stored} bytes: {event}");
        let detail = &event["detail"];
        assert!(
            detail["method"].as_str().unwrap().ends_with("(1100 bytes)"),
            "{detail}"
        );
        let said = format!("({} bytes)", path.len());
        assert!(
            detail["path"].as_str().unwrap().ends_with(&said),
            "{detail}"
        );
    }
    assert!(common::eventually(5000, || d
        .log_text()
        .lines()
        .filter(|line| line.contains("MMMM"))
        .count()
        >= 3));
    let log = d.log_text();
    for line in log
        .lines()
        .filter(|l| l.contains("MMMM") || l.contains("AAAA"))
    {
        assert!(
            line.len() < 1024,
            "a log line of {} bytes: {line}",
            line.len()
        );
        assert!(line.contains("(1100 bytes)"), "{line}");
    }
}

#[test]
fn root_refused_requests_add_little_to_the_audit_log() {
    require_root!();
    // A refused exec is audited with its command: a hundred arguments of 1 KiB of
    // control bytes, six bytes each as JSON, added ~600 KiB a request, kept 30 days.
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let argv: Vec<String> = (0..100).map(|_| "\u{1}".repeat(1024)).collect();
    for _ in 0..3 {
        let (status, _) = d.request(
            "POST",
            "/v1/sessions/ses_nope/exec",
            Some(&key),
            Some(json!({ "argv": argv })),
        );
        assert_eq!(status, 404);
    }
    let events = audit_of(&d, "exec");
    assert_eq!(events.len(), 3, "{events:?}");
    for event in events {
        let stored = serde_json::to_vec(&event["detail"]).unwrap().len();
        assert!(stored <= 4096, "a detail of {stored} bytes");
        assert_eq!(event["outcome"], "not_found");
    }
}

#[test]
fn root_a_flood_of_refusals_is_summed_up_in_the_audit_log() {
    require_root!();
    // A refusal costs its client nothing and was a database write kept 30 days:
    // 4,200 a second with no key grew the database by 6 MB/s.
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "noisy");
    // The budgets (crates/brig-server/src/audit.rs): a burst, then a rate a second.
    const KEYLESS: (f64, f64) = (20.0, 2.0);
    const TENANT: (f64, f64) = (100.0, 20.0);
    let long = "x".repeat(900);
    // However slow the machine, the flood goes on until it has sent at least twice
    // what the budgets can have recorded one by one meanwhile.
    let started = Instant::now();
    let mut flood = 0u64;
    let budget = |(burst, rate): (f64, f64)| burst + rate * started.elapsed().as_secs_f64();
    while flood < 300 || (2 * flood) as f64 <= 2.0 * budget(TENANT) {
        assert!(flood < 100_000, "the flood never outran the budgets");
        let i = flood;
        let path = format!("/v1/sessions/ses_{long}{i}");
        let (status, _) = d.request("GET", &path, Some("brig_not_a_key"), None);
        assert_eq!(status, 401);
        // Refused with a key: the exec's own event and the refusal's both count.
        let (status, _) = d.request(
            "POST",
            &format!("/v1/sessions/ses_nope{i}/exec"),
            Some(&key),
            Some(json!({"argv": ["echo", long]})),
        );
        assert_eq!(status, 404);
        flood += 1;
    }
    // The most each budget can have let through one by one, from the daemon's first
    // refusal (after `started`) to its last (before now).
    let (keyless_budget, tenant_budget) = (budget(KEYLESS), budget(TENANT));
    let expected = [
        ("", flood, keyless_budget),
        ("noisy", 2 * flood, tenant_budget),
    ];
    // Summaries are written every second: wait until every refusal is accounted for.
    let tally = |events: &[Value], tenant: &str| -> (u64, u64) {
        let of_tenant = events.iter().filter(|e| e["tenant"] == tenant);
        let summed = of_tenant
            .clone()
            .filter_map(|e| e["detail"]["left_out"].as_u64())
            .sum();
        let one_by_one = of_tenant
            .filter(|e| e["detail"]["left_out"].is_null())
            .count() as u64;
        (one_by_one, summed)
    };
    let audit = || {
        let (status, audit) = d.request("GET", "/v1/audit?limit=1000", Some(d.admin_key()), None);
        assert_eq!(status, 200, "{audit}");
        audit["events"].as_array().unwrap().clone()
    };
    let all_there = |events: &[Value]| {
        expected.iter().all(|(tenant, attempts, _)| {
            let (one_by_one, summed) = tally(events, tenant);
            one_by_one + summed >= *attempts
        })
    };
    assert!(
        common::eventually(60_000, || all_there(&audit())),
        "refusals unaccounted for after a minute"
    );
    let events = audit();
    for (tenant, attempts, budget) in expected {
        let (one_by_one, summed) = tally(&events, tenant);
        // Every refusal is accounted for, most of them in a summary.
        assert_eq!(
            one_by_one + summed,
            attempts,
            "{tenant:?}: {one_by_one} + {summed}"
        );
        // No more one by one than the budget allows (without a key, anyone can make
        // them: a tenth of a tenant's budget), which is under half of them.
        assert!(
            one_by_one as f64 <= budget + 1.0,
            "{tenant:?}: {one_by_one} one by one, more than {budget:.0}"
        );
        assert!(
            one_by_one < attempts / 2,
            "{tenant:?}: {one_by_one} one by one"
        );
        let summary = events
            .iter()
            .find(|e| e["tenant"] == tenant && e["detail"]["left_out"].is_u64())
            .unwrap();
        assert_eq!(summary["action"], "refused", "{summary}");
        assert_eq!(summary["outcome"], "refused", "{summary}");
    }
}
