//! Sessions: create, get, list, update, stats, pause and resume, delete.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::support::{
    assert_fields, create, daemon, delete_session, error_code, exec, files_url, leaves_of,
    session_count, session_ids, sh, sid, tenant_key, wait_for_file,
};
use serde_json::{json, Value};

/// The CPU time a session's cgroup has used, in nanoseconds (cgroup v1 `cpuacct`
/// or v2 `cpu.stat`).
fn cgroup_cpu_ns(session: &Value) -> u64 {
    for leaf in leaves_of(session) {
        let leaf = Path::new(&leaf);
        if let Ok(text) = std::fs::read_to_string(leaf.join("cpuacct.usage")) {
            return text.trim().parse().unwrap();
        }
        if let Ok(text) = std::fs::read_to_string(leaf.join("cpu.stat")) {
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("usage_usec ") {
                    return v.trim().parse::<u64>().unwrap() * 1000;
                }
            }
        }
    }
    panic!("no CPU accounting among the session's cgroup leaves: {session}");
}

#[test]
fn root_session_lifecycle_create_get_list_delete() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let s = create(&d, &key, json!({"env": {"GREETING": "hi"}}));
    let id = sid(&s);
    assert!(id.starts_with("ses_"), "{s}");
    assert_eq!(s["state"], "running");
    assert_fields(
        &s,
        &[
            "session_id",
            "state",
            "image",
            "snapshot",
            "created_at",
            "expires_at",
            "idle_timeout_seconds",
            "last_active_at",
            "limits",
            "pooled",
            "enforced",
        ],
    );
    let leaves = leaves_of(&s);
    assert!(!leaves.is_empty(), "no cgroup leaves reported: {s}");
    for leaf in &leaves {
        assert!(Path::new(leaf).exists(), "{leaf} does not exist");
    }

    let (status, got) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(status, 200);
    assert_eq!(got["session_id"], id);
    let (status, list) = d.request("GET", "/v1/sessions", Some(&key), None);
    assert_eq!(status, 200);
    let ids: Vec<_> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);

    // The sandbox's processes: a marker process started in it must be gone after.
    let r = exec(
        &d,
        &key,
        &id,
        json!({"cmd": "echo $GREETING; sleep 300 >/dev/null 2>&1 & echo ok"}),
    );
    assert_eq!(r["stdout"], "hi\nok\n");
    let sandbox_pids = d.descendants();
    assert!(!sandbox_pids.is_empty(), "the daemon has no sandbox child");

    delete_session(&d, &key, &id);
    for (method, path) in [
        ("GET", format!("/v1/sessions/{id}")),
        ("DELETE", format!("/v1/sessions/{id}")),
    ] {
        let (status, body) = d.request(method, &path, Some(&key), None);
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(error_code(&body), "not_found");
    }
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&key),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(status, 404);
    assert_eq!(session_count(&d, &key), 0);
    assert!(
        common::eventually(5000, || sandbox_pids.iter().all(|p| !Path::new(&format!(
            "/proc/{p}"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{p}/stat"))
                .map(|s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
                .unwrap_or(true))),
        "sandbox processes {sandbox_pids:?} outlived the session"
    );
    for leaf in &leaves {
        assert!(
            common::eventually(5000, || !Path::new(leaf).exists()),
            "cgroup {leaf} outlived the session"
        );
    }
}

/// Sessions carry their creator's labels (metadata), returned with them and matched
/// by the list's filter, within the tenant only; bad labels and filters change
/// nothing.
#[test]
fn root_sessions_carry_metadata_and_are_found_by_it() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let (other, _) = tenant_key(&d, "other");
    let labels = json!({"user": "u1", "chat": "c/1 é"});
    let first = create(&d, &key, json!({ "metadata": labels }));
    assert_eq!(first["metadata"], labels);
    let a = sid(&first);
    let b = sid(&create(
        &d,
        &key,
        json!({"metadata": {"user": "u1", "chat": "c2"}}),
    ));
    let c = sid(&create(&d, &key, json!({})));
    let theirs = sid(&create(&d, &other, json!({"metadata": {"user": "u1"}})));
    let (_, got) = d.request("GET", &format!("/v1/sessions/{c}"), Some(&key), None);
    assert_eq!(got["metadata"], json!({}), "no metadata is an empty object");
    let (_, audit) = d.request(
        "GET",
        &format!("/v1/audit?session_id={a}"),
        Some(&key),
        None,
    );
    let created = audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "session.create")
        .unwrap_or_else(|| panic!("no session.create in {audit}"));
    assert_eq!(created["detail"]["metadata"], labels, "{created}");

    let ids_of = |who: &str, query: &str| session_ids(&d, who, query);
    let set = |ids: &[&String]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(ids_of(&key, ""), set(&[&a, &b, &c]));
    assert_eq!(ids_of(&key, "?metadata=user%3Du1"), set(&[&a, &b]));
    assert_eq!(
        ids_of(&key, "?metadata=user%3Du1&metadata=chat%3Dc%2F1%20%C3%A9"),
        set(&[&a]),
        "every filter must match; values are compared decoded"
    );
    assert_eq!(
        ids_of(&key, "?metadata=user=u1&metadata=chat=c2"),
        set(&[&b])
    );
    assert_eq!(ids_of(&key, "?metadata=user%3Du2"), set(&[]));
    assert_eq!(
        ids_of(&key, "?metadata=chat%3D"),
        set(&[]),
        "an empty value is a value"
    );
    assert_eq!(ids_of(&other, "?metadata=user%3Du1"), set(&[&theirs]));

    // Bad labels: 422, and no session is made.
    let too_many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for bad in [
        json!({"metadata": {"": "v"}}),
        json!({"metadata": {"a b": "v"}}),
        json!({"metadata": {"k".repeat(65): "v"}}),
        json!({"metadata": {"k": "v".repeat(257)}}),
        json!({"metadata": {"k": 1}}),
        json!({"metadata": ["k", "v"]}),
        json!({ "metadata": too_many }),
    ] {
        let (status, body) = d.request("POST", "/v1/sessions", Some(&key), Some(bad.clone()));
        assert_eq!(status, 422, "{bad}: {body}");
        assert_eq!(error_code(&body), "invalid_request", "{bad}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(
        ids_of(&key, ""),
        set(&[&a, &b, &c]),
        "a refused create made a session"
    );
    // At the bounds: accepted.
    let edge: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("{i:02}{}", "k".repeat(62)), json!("v".repeat(256))))
        .collect();
    let edge_id = sid(&create(&d, &key, json!({ "metadata": edge })));
    // Bad filters: 422 with a message, not an empty list.
    for query in ["?metadata=user", "?user=u1", "?metadata=a%20b%3Dv"] {
        let (status, body) = d.request("GET", &format!("/v1/sessions{query}"), Some(&key), None);
        assert_eq!(status, 422, "{query}: {body}");
        assert_eq!(error_code(&body), "invalid_request");
    }
    for (who, id) in [
        (&key, &a),
        (&key, &b),
        (&key, &c),
        (&key, &edge_id),
        (&other, &theirs),
    ] {
        delete_session(&d, who, id);
    }
}

/// Unix seconds of the daemon's `YYYY-MM-DDTHH:MM:SSZ` times.
fn unix_seconds(rfc3339: &str) -> i64 {
    let field = |range: std::ops::Range<usize>| -> i64 {
        rfc3339
            .get(range)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a UTC RFC 3339 time: {rfc3339:?}"))
    };
    assert!(rfc3339.ends_with('Z') && rfc3339.len() == 20, "{rfc3339:?}");
    let (year, month, day) = (field(0..4), field(5..7), field(8..10));
    // Days from the civil date (H. Hinnant's algorithm), March-based years.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + field(11..13) * 3600 + field(14..16) * 60 + field(17..19)
}

/// `PATCH /v1/sessions/{id}` changes a live session's TTL (counted from now),
/// idle timeout and labels, one field or several; anything refused changes nothing.
#[test]
fn root_a_session_is_updated_in_place_and_a_refused_update_changes_nothing() {
    require_root!();
    assert_eq!(unix_seconds("1970-01-02T00:00:01Z"), 86_401);
    assert_eq!(unix_seconds("2024-03-01T00:00:00Z"), 1_709_251_200);
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let (other, _) = tenant_key(&d, "other");
    let created = create(
        &d,
        &key,
        json!({"ttl_seconds": 600, "idle_timeout_seconds": 60, "metadata": {"user": "u1"}}),
    );
    let id = sid(&created);
    let path = format!("/v1/sessions/{id}");
    let patch = |who: &str, body: Value| d.request("PATCH", &path, Some(who), Some(body));
    let get = || {
        let (status, s) = d.request("GET", &path, Some(&key), None);
        assert_eq!(status, 200, "{s}");
        s
    };
    let listed = |query: &str| session_ids(&d, &key, query);

    // The TTL counts from the update: longer than the one given at create.
    let (status, s) = patch(&key, json!({"ttl_seconds": 7200}));
    assert_eq!(status, 200, "{s}");
    let now = unix_seconds(s["last_active_at"].as_str().unwrap());
    let expires = unix_seconds(s["expires_at"].as_str().unwrap());
    assert!(
        (now + 7199..=now + 7201).contains(&expires),
        "expires_at {} is not 7200 s after the update at {}",
        s["expires_at"],
        s["last_active_at"]
    );
    assert_eq!(s["idle_timeout_seconds"], 60, "a field left out changed");
    assert_eq!(
        s["metadata"],
        json!({"user": "u1"}),
        "a field left out changed"
    );
    assert_eq!(get(), s, "GET does not show the update");
    let first_expiry = s["expires_at"].clone();

    // Labels are replaced as a whole; the list filter follows.
    let (status, s) = patch(&key, json!({"metadata": {"chat": "c2"}}));
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["metadata"], json!({"chat": "c2"}));
    assert_eq!(s["expires_at"], first_expiry, "a field left out changed");
    assert_eq!(listed("?metadata=user%3Du1"), BTreeSet::new());
    assert_eq!(listed("?metadata=chat%3Dc2"), BTreeSet::from([id.clone()]));
    // An idle timeout of 0 is none; several fields at once.
    let (status, s) = patch(
        &key,
        json!({"idle_timeout_seconds": 0, "metadata": {}, "ttl_seconds": 300}),
    );
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["idle_timeout_seconds"], Value::Null);
    assert_eq!(s["metadata"], json!({}));
    let expires = unix_seconds(s["expires_at"].as_str().unwrap());
    let now = unix_seconds(s["last_active_at"].as_str().unwrap());
    assert!((now + 299..=now + 301).contains(&expires), "{s}");
    let (status, s) = patch(&key, json!({"idle_timeout_seconds": 90}));
    assert_eq!(
        (status, &s["idle_timeout_seconds"]),
        (200, &json!(90)),
        "{s}"
    );

    // Refused: 422 (400 for what is not JSON), and the session is as it was.
    let before = get();
    let too_many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for bad in [
        json!({}),
        json!({"ttl_seconds": 0}),
        json!({"ttl_seconds": -1}),
        json!({"ttl_seconds": "soon"}),
        json!({"ttl_seconds": 9_223_372_036_854_775_807u64}),
        json!({"idle_timeout_seconds": 18_446_744_073_709_551_615u64}),
        json!({"metadata": {"a b": "v"}}),
        json!({"metadata": {"k": "v".repeat(257)}}),
        json!({ "metadata": too_many }),
        json!({"metadata": null, "image": "python"}),
        json!({"ttl_seconds": 60, "metadata": {"": "v"}}),
        json!([]),
    ] {
        let (status, body) = patch(&key, bad.clone());
        assert_eq!(status, 422, "{bad}: {body}");
        assert_eq!(error_code(&body), "invalid_request", "{bad}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }
    let (status, body) = d.raw(
        "PATCH",
        &path,
        Some(&key),
        Some("application/json"),
        Some(b"{".to_vec()),
    );
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    // Someone else's session, an unknown one, no key.
    let (status, body) = patch(&other, json!({"ttl_seconds": 1}));
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
    let (status, body) = d.request(
        "PATCH",
        "/v1/sessions/ses_000000000000000000000000",
        Some(&key),
        Some(json!({"ttl_seconds": 60})),
    );
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
    let (status, _) = d.request("PATCH", &path, None, Some(json!({"ttl_seconds": 1})));
    assert_eq!(status, 401);
    let after = get();
    for field in ["expires_at", "idle_timeout_seconds", "metadata"] {
        assert_eq!(
            after[field], before[field],
            "a refused update changed {field}"
        );
    }

    // The audit has each update with what it asked, refused ones too.
    let (_, audit) = d.request(
        "GET",
        &format!("/v1/audit?session_id={id}&action=session.update"),
        Some(&key),
        None,
    );
    let events = audit["events"].as_array().unwrap();
    let ok: Vec<&Value> = events.iter().filter(|e| e["outcome"] == "ok").collect();
    assert_eq!(ok.len(), 4, "{audit}");
    assert!(
        ok.iter()
            .any(|e| e["detail"]["metadata"] == json!({"chat": "c2"})),
        "{audit}"
    );
    assert!(
        events.iter().any(|e| e["outcome"] == "invalid_request"),
        "{audit}"
    );
    delete_session(&d, &key, &id);
    let (status, body) = patch(&key, json!({"ttl_seconds": 60}));
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
}

/// `GET /v1/sessions/{id}/stats` reports what the session uses now against its
/// limits: its writes, memory, CPU time, tasks and OOM kills; reading it is not
/// activity, and works while the session is paused.
#[test]
fn root_session_stats_show_what_it_uses_against_its_limits() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let created = create(
        &d,
        &key,
        json!({"limits": {"disk": "64M", "memory": "256M", "pids": 64, "cpus": 1}}),
    );
    let id = sid(&created);
    let stats = || {
        let (status, s) = d.request("GET", &format!("/v1/sessions/{id}/stats"), Some(&key), None);
        assert_eq!(status, 200, "{s}");
        assert_fields(
            &s,
            &[
                "session_id",
                "memory_bytes",
                "memory_peak_bytes",
                "memory_limit_bytes",
                "cpu_seconds",
                "cpus_limit",
                "tasks",
                "tasks_limit",
                "disk_used_bytes",
                "disk_limit_bytes",
                "volume_used_bytes",
                "volume_size_bytes",
                "oom_kills",
            ],
        );
        s
    };
    let number = |s: &Value, field: &str| {
        s[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} is not reported: {s}"))
    };

    // Reading stats is not activity (a monitor polling must not keep a session from
    // its idle timeout).
    std::thread::sleep(Duration::from_millis(1100));
    let fresh = stats();
    let (_, listed) = d.request("GET", "/v1/sessions", Some(&key), None);
    assert_eq!(
        listed["sessions"][0]["last_active_at"], created["last_active_at"],
        "GET stats counted as activity"
    );
    assert_eq!(fresh["session_id"], id.as_str());
    assert_eq!(fresh["memory_limit_bytes"], 256 << 20);
    assert_eq!(fresh["disk_limit_bytes"], 64 << 20);
    assert_eq!(fresh["tasks_limit"], 64);
    assert_eq!(fresh["cpus_limit"], 1.0);
    assert_eq!(fresh["oom_kills"], 0);
    assert!(number(&fresh, "tasks") >= 1.0, "{fresh}");
    assert!(
        number(&fresh, "disk_used_bytes") < f64::from(1 << 20),
        "{fresh}"
    );
    assert!(fresh["volume_used_bytes"].is_null(), "no volume: {fresh}");
    assert!(fresh["volume_size_bytes"].is_null(), "no volume: {fresh}");

    // 20 MB in /workspace and 5 MB in /tmp (one writable storage), one second of
    // CPU (counted by the loop's own CPU limit, not the clock: on a loaded machine
    // half a second of wall time gave it a tenth of that), three processes left
    // running.
    sh(
        &d,
        &key,
        &id,
        "head -c 20000000 /dev/zero > /workspace/f; head -c 5000000 /dev/zero > /tmp/g; \
         sh -c 'ulimit -t 1; while :; do :; done'; true",
    );
    for _ in 0..3 {
        let (status, p) = d.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(&key),
            Some(json!({"argv": ["sleep", "60"]})),
        );
        assert_eq!(status, 201, "{p}");
    }
    let busy = stats();
    let disk = number(&busy, "disk_used_bytes");
    assert!(
        (25e6..64.0 * 1024.0 * 1024.0).contains(&disk),
        "disk_used_bytes {disk} for 25 MB written: {busy}"
    );
    // tmpfs files are memory, charged to the session.
    assert!(number(&busy, "memory_bytes") >= 25e6, "{busy}");
    assert!(number(&busy, "memory_peak_bytes") >= number(&busy, "memory_bytes") - 1e6);
    let cpu = number(&busy, "cpu_seconds") - number(&fresh, "cpu_seconds");
    assert!(
        (0.5..30.0).contains(&cpu),
        "{cpu} s of CPU for a loop of 1 s of CPU: {busy}"
    );
    assert!(
        number(&busy, "tasks") >= 4.0,
        "init and three sleeps: {busy}"
    );
    // Files removed: their room is back.
    sh(&d, &key, &id, "rm /workspace/f /tmp/g");
    assert!(number(&stats(), "disk_used_bytes") < 1e6);

    // An allocation past the memory limit is killed, and counted.
    let r = exec(
        &d,
        &key,
        &id,
        json!({"argv": ["python3", "-c", "b = b'x' * (400 << 20)"]}),
    );
    assert_eq!(r["oom_killed"], true, "{r}");
    let after = stats();
    assert!(number(&after, "oom_kills") >= 1.0, "{after}");
    assert!(
        number(&after, "memory_peak_bytes") > 200e6,
        "the peak does not show the allocation: {after}"
    );

    // Paused: still readable (the cgroup is frozen, not gone).
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/pause"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200);
    assert!(number(&stats(), "tasks") >= 4.0);
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/resume"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200);
    delete_session(&d, &key, &id);
    let (status, body) = d.request("GET", &format!("/v1/sessions/{id}/stats"), Some(&key), None);
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
}

#[test]
fn root_paused_session_runs_nothing_and_uses_no_cpu() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let s = create(&d, &key, json!({}));
    let id = sid(&s);
    let (status, p) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"argv": ["sh", "-c", "while :; do :; done"]})),
    );
    assert_eq!(status, 201, "{p}");
    assert!(common::eventually(60_000, || cgroup_cpu_ns(&s) > 0));

    let (status, paused) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/pause"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["state"], "paused");
    let (_, got) = d.request("GET", &format!("/v1/sessions/{id}"), Some(&key), None);
    assert_eq!(got["state"], "paused");
    let (status, body) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&key),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(status, 409, "exec while paused: {body}");
    assert_eq!(error_code(&body), "conflict");
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(status, 409, "process start while paused");
    std::thread::sleep(Duration::from_millis(200));
    let frozen_at = cgroup_cpu_ns(&s);
    std::thread::sleep(Duration::from_secs(1));
    let frozen_later = cgroup_cpu_ns(&s);
    assert_eq!(frozen_at, frozen_later, "the sandbox used CPU while paused");

    let (status, resumed) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/resume"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["state"], "running");
    // However loaded the machine, the loop gets its 0.1 s of CPU in time.
    assert!(
        common::eventually(60_000, || cgroup_cpu_ns(&s) > frozen_later + 100_000_000),
        "no CPU after resume: {frozen_later} -> {}",
        cgroup_cpu_ns(&s)
    );
    assert_eq!(sh(&d, &key, &id, "echo back"), "back\n");
    delete_session(&d, &key, &id);
}

#[test]
fn root_deleting_a_paused_session_ends_its_processes() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let s = create(&d, &key, json!({}));
    let id = sid(&s);
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"argv": ["sh", "-c", "while :; do :; done"]})),
    );
    assert_eq!(status, 201);
    let pids = d.descendants();
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/pause"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200);
    let started = Instant::now();
    delete_session(&d, &key, &id);
    assert!(started.elapsed() < Duration::from_secs(10));
    let gone = |p: &u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .map(|s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
            .unwrap_or(true)
    };
    assert!(
        common::eventually(5000, || pids.iter().all(gone)),
        "processes of the paused session outlived it: {:?}",
        pids.iter().filter(|p| !gone(p)).collect::<Vec<_>>()
    );
    for leaf in leaves_of(&s) {
        assert!(
            common::eventually(5000, || !Path::new(&leaf).exists()),
            "{leaf} is left"
        );
    }
}

/// A session given a TTL but no idle timeout lives for its TTL, as an onyx
/// python-sandbox session does; one given neither gets the daemon's idle timeout.
#[test]
fn root_a_session_given_a_ttl_alone_has_no_idle_timeout() {
    require_root!();
    let d = daemon(&["--session-idle-timeout", "1s"]);
    let key = d.admin_key().to_string();
    let with_ttl = create(&d, &key, json!({"ttl_seconds": 3600}));
    assert_eq!(with_ttl["idle_timeout_seconds"], Value::Null, "{with_ttl}");
    let default = create(&d, &key, json!({}));
    assert_eq!(default["idle_timeout_seconds"], 1, "{default}");
    let both = create(
        &d,
        &key,
        json!({"ttl_seconds": 3600, "idle_timeout_seconds": 1}),
    );
    assert_eq!(both["idle_timeout_seconds"], 1, "{both}");
    // Untouched meanwhile (a request to a session is activity; listing them is
    // not): the two with an idle timeout go, and the older one without stays.
    let only_ttl = BTreeSet::from([sid(&with_ttl)]);
    let mut ids = session_ids(&d, &key, "");
    let reaped = common::eventually(60_000, || {
        ids = session_ids(&d, &key, "");
        assert!(ids.contains(&sid(&with_ttl)), "{ids:?}: {with_ttl}");
        ids == only_ttl
    });
    assert!(reaped, "{ids:?}: {with_ttl}");
    assert_eq!(sh(&d, &key, &sid(&with_ttl), "echo alive"), "alive\n");
    delete_session(&d, &key, &sid(&with_ttl));
}

#[test]
fn root_delete_ends_running_execs_at_once() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let running = {
        let url = d.url(&format!("/v1/sessions/{id}/exec"));
        let key = key.clone();
        std::thread::spawn(move || {
            let r = common::daemon::agent()
                .post(&url)
                .header("Authorization", format!("Bearer {key}"))
                .header("Content-Type", "application/json")
                .send(json!({"cmd": "touch /workspace/started; sleep 600"}).to_string())
                .unwrap();
            (r.status().as_u16(), Instant::now())
        })
    };
    wait_for_file(&d, &key, &id, "/workspace/started");
    // The bounds only guard against waiting for the exec's end (600 s).
    let started = Instant::now();
    delete_session(&d, &key, &id);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "delete waited {:?}",
        started.elapsed()
    );
    let (status, ended) = running.join().unwrap();
    let took = ended.duration_since(started);
    assert!(
        took < Duration::from_secs(60),
        "the exec ran on for {took:?} after the delete"
    );
    assert!(status == 409 || status == 404, "{status}");
}

#[test]
fn root_filling_tmp_past_the_memory_limit_kills_the_command_not_the_session() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    // Default limits: memory and disk both 512M, and /tmp a tmpfs charged to the
    // memory. The writer holds next to nothing itself, so the OOM killer took init
    // (the largest process), and the session ended with it.
    let id = sid(&create(&d, &key, json!({})));
    // No shell: the kernel kills the one process there is (a shell's child killed
    // would leave the shell to exit 137 instead).
    let r = exec(
        &d,
        &key,
        &id,
        json!({"argv": ["dd", "if=/dev/zero", "of=/tmp/z", "bs=1M", "count=600"]}),
    );
    assert_eq!(r["oom_killed"], true, "{r}");
    assert_eq!(r["signal"], 9, "{r}");
    // The session lives on; with its memory full of /tmp, what frees it works.
    let (status, body) = d.raw("DELETE", &files_url(&id, "/tmp/z"), Some(&key), None, None);
    assert_eq!(status, 204, "{}", String::from_utf8_lossy(&body));
    assert_eq!(sh(&d, &key, &id, "echo alive"), "alive\n");
    // Commands are the first the kernel kills, here or on the host; init is not.
    // (Init holds a command's score while it starts one, until the command has
    // exec'd: read it once the shell has its own, or after a minute.)
    assert_eq!(
        sh(
            &d,
            &key,
            &id,
            "i=0; while [ \"$(cat /proc/$$/oom_score_adj)\" != 1000 ] && [ $i -lt 3000 ]; \
             do sleep 0.02; i=$((i + 1)); done; cat /proc/self/oom_score_adj /proc/1/oom_score_adj"
        ),
        "1000\n0\n"
    );
    delete_session(&d, &key, &id);
}
