//! The stateful interpreter: `POST /v1/sessions/{id}/code` and its contexts.
//! Sessions run on host dirs, so the kernel is the host's /usr/bin/python3.

use std::time::{Duration, Instant};

use crate::common::daemon::Daemon;
use crate::support::{
    audit_of, create, daemon, restore, sh, sid, sse_post, take_snapshot, tenant_key,
};
use serde_json::{json, Value};

/// A daemon with one session of the admin's: (daemon, key, session id).
fn one_session() -> (Daemon, String, String) {
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    (d, key, id)
}

/// Runs code (the JSON summary): (status, answer).
fn code(d: &Daemon, key: &str, id: &str, body: Value) -> (u16, Value) {
    d.request(
        "POST",
        &format!("/v1/sessions/{id}/code"),
        Some(key),
        Some(body),
    )
}

/// Runs code that must succeed; its summary.
fn run(d: &Daemon, key: &str, id: &str, body: Value) -> Value {
    let (status, r) = code(d, key, id, body);
    assert_eq!(status, 200, "{r}");
    r
}

/// The main result's text/plain.
fn value(r: &Value) -> String {
    let main = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["main"] == true);
    let main = main.unwrap_or_else(|| panic!("no main result: {r}"));
    main["data"]["text/plain"].as_str().unwrap().to_string()
}

fn new_context(d: &Daemon, key: &str, id: &str, body: Value) -> String {
    let (status, c) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/contexts"),
        Some(key),
        Some(body),
    );
    assert_eq!(status, 201, "{c}");
    c["id"].as_str().unwrap().to_string()
}

#[test]
fn root_state_is_kept_across_calls_and_each_context_has_its_own() {
    require_root!();
    let (d, key, id) = one_session();
    let first = run(&d, &key, &id, json!({"code": "x = 41\nprint('set')"}));
    assert_eq!(first["stdout"], "set\n", "{first}");
    assert_eq!(first["context_id"], "default");
    let second = run(&d, &key, &id, json!({"code": "x + 1"}));
    assert_eq!(value(&second), "42");
    assert_eq!(second["execution_count"], 2, "{second}");

    let other = new_context(&d, &key, &id, json!({"cwd": "/tmp"}));
    assert!(other.starts_with("ctx_"), "{other}");
    let there = run(&d, &key, &id, json!({"code": "x", "context_id": other}));
    assert_eq!(there["error"]["name"], "NameError", "{there}");
    let cwd = run(
        &d,
        &key,
        &id,
        json!({"code": "import os; os.chdir('/'); os.getcwd()", "context_id": other}),
    );
    assert_eq!(value(&cwd), "'/'");
    let here = run(&d, &key, &id, json!({"code": "import os; os.getcwd()"}));
    assert_ne!(value(&here), "'/'", "a chdir in one context moved another");

    let (status, list) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/contexts"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200);
    let ids: Vec<&str> = list["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(ids.contains(&"default") && ids.contains(&other.as_str()));
    let audited = audit_of(&d, "code.run");
    assert_eq!(audited.len(), 5, "{audited:?}");
    assert_eq!(audited[0]["frontend"], "rest", "{audited:?}");
}

#[test]
fn root_output_and_results_stream_as_events_before_the_end() {
    require_root!();
    let (d, key, id) = one_session();
    let events: Vec<(String, Value)> = sse_post(
        &d,
        &key,
        &format!("/v1/sessions/{id}/code"),
        json!({"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\ndisplay(7)\n6*7",
               "stream": true}),
    )
    .collect();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names.last(), Some(&"end"), "{events:?}");
    assert!(
        names.contains(&"stdout") && names.contains(&"stderr"),
        "{events:?}"
    );
    let results: Vec<&Value> = events
        .iter()
        .filter(|(e, _)| e == "result")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(results.len(), 2, "{events:?}");
    assert_eq!(results[0]["data"]["text/plain"], "7");
    assert_eq!(results[0]["main"], false);
    assert_eq!(results[1]["data"]["text/plain"], "42");
    assert_eq!(results[1]["main"], true);
    assert_eq!(events.last().unwrap().1["execution_count"], 1);
}

#[test]
fn root_rich_results_come_as_mime_bundles() {
    require_root!();
    let (d, key, id) = one_session();
    let svg = run(
        &d,
        &key,
        &id,
        json!({"code": "class S:\n    def _repr_svg_(self): return '<svg/>'\n    def _repr_json_(self): return {'a': 1}\nS()"}),
    );
    let data = &svg["results"][0]["data"];
    assert_eq!(data["image/svg+xml"], "<svg/>", "{svg}");
    assert_eq!(data["application/json"], json!({"a": 1}), "{svg}");

    let have = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import matplotlib, pandas"])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        eprintln!("skipping charts and tables: no matplotlib and pandas in /usr/bin/python3");
        return;
    }
    let chart = run(
        &d,
        &key,
        &id,
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], label='n')\nplt.title('t')\nplt.show()"}),
    );
    let pngs: Vec<&Value> = chart["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["data"]["image/png"].is_string())
        .collect();
    assert_eq!(pngs.len(), 1, "{chart}");
    // base64 of PNG's signature.
    assert!(pngs[0]["data"]["image/png"]
        .as_str()
        .unwrap()
        .starts_with("iVBORw0KGgo"));
    assert_eq!(chart["stderr"], "", "{chart}");
    // With a description of what it shows, for a model that cannot see it.
    let described = &pngs[0]["data"]["application/vnd.brig.chart+json"]["axes"][0];
    assert_eq!(described["title"], "t", "{chart}");
    assert_eq!(
        described["elements"][0],
        json!({"type": "line", "label": "n", "points": [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]}),
        "{chart}"
    );
    // The figure was closed: the next call has none.
    let next = run(&d, &key, &id, json!({"code": "plt.get_fignums()"}));
    assert_eq!(value(&next), "[]");

    let table = run(
        &d,
        &key,
        &id,
        json!({"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"}),
    );
    let data = &table["results"][0]["data"];
    assert!(
        data["text/html"].as_str().unwrap().contains("<table"),
        "{table}"
    );
    assert!(
        data["text/plain"].as_str().unwrap().contains('a'),
        "{table}"
    );
}

#[test]
fn root_an_error_has_its_name_value_and_the_users_traceback() {
    require_root!();
    let (d, key, id) = one_session();
    let r = run(
        &d,
        &key,
        &id,
        json!({"code": "print('before')\ndef f():\n    return 1 / 0\nf()"}),
    );
    assert_eq!(r["stdout"], "before\n");
    let error = &r["error"];
    assert_eq!(error["name"], "ZeroDivisionError", "{r}");
    assert_eq!(error["value"], "division by zero");
    let tb = error["traceback"].as_str().unwrap();
    assert!(
        tb.contains("<cell-1>") && tb.contains("return 1 / 0"),
        "{tb}"
    );
    assert!(!tb.contains("<string>") && !tb.contains("kernel"), "{tb}");
    let syntax = run(&d, &key, &id, json!({"code": "1 +"}));
    assert_eq!(syntax["error"]["name"], "SyntaxError", "{syntax}");
}

#[test]
fn root_a_timeout_interrupts_the_code_and_keeps_the_state() {
    require_root!();
    let (d, key, id) = one_session();
    run(&d, &key, &id, json!({"code": "y = 5"}));
    let started = Instant::now();
    let r = run(
        &d,
        &key,
        &id,
        json!({"code": "import time\ny = 6\ntime.sleep(600)", "timeout_ms": 500}),
    );
    assert!(started.elapsed() < Duration::from_secs(30), "{r}");
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["error"]["name"], "KeyboardInterrupt", "{r}");
    assert_eq!(value(&run(&d, &key, &id, json!({"code": "y"}))), "6");
}

#[test]
fn root_restart_clears_a_contexts_state() {
    require_root!();
    let (d, key, id) = one_session();
    run(&d, &key, &id, json!({"code": "z = 1"}));
    let (status, c) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/contexts/default/restart"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["execution_count"], 0, "{c}");
    let r = run(&d, &key, &id, json!({"code": "z"}));
    assert_eq!(r["error"]["name"], "NameError", "{r}");
    assert_eq!(r["execution_count"], 1, "{r}");
}

#[test]
fn root_a_kernel_that_dies_is_reported_and_the_next_call_starts_a_fresh_one() {
    require_root!();
    let (d, key, id) = one_session();
    run(&d, &key, &id, json!({"code": "w = 1"}));
    let r = run(&d, &key, &id, json!({"code": "import os\nos._exit(3)"}));
    assert_eq!(r["error"]["name"], "KernelDied", "{r}");
    assert!(
        r["error"]["value"].as_str().unwrap().contains("code 3"),
        "{r}"
    );
    let fresh = run(&d, &key, &id, json!({"code": "'w' in globals()"}));
    assert_eq!(value(&fresh), "False");

    // Code that ignores the interrupt: its kernel is killed after the grace.
    let stubborn = "import time\nwhile True:\n    try:\n        time.sleep(600)\n    except KeyboardInterrupt:\n        pass";
    let r = run(&d, &key, &id, json!({"code": stubborn, "timeout_ms": 300}));
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["error"]["name"], "KernelDied", "{r}");
    assert!(
        r["error"]["value"]
            .as_str()
            .unwrap()
            .contains("did not stop"),
        "{r}"
    );
    assert_eq!(value(&run(&d, &key, &id, json!({"code": "1 + 1"}))), "2");
}

#[test]
fn root_calls_into_one_context_take_turns_and_contexts_run_at_once() {
    require_root!();
    let (d, key, id) = one_session();
    let other = new_context(&d, &key, &id, json!({}));
    let flag = "/tmp/interp-flag";
    std::thread::scope(|s| {
        // The default context waits for a file only the other one writes: were
        // contexts run one at a time, it would time out.
        let waiter = s.spawn(|| {
            let wait = format!(
                "import os, time\nwhile not os.path.exists('{flag}'):\n    time.sleep(0.02)\n'seen'"
            );
            run(&d, &key, &id, json!({"code": wait, "timeout_ms": 60_000}))
        });
        std::thread::sleep(Duration::from_millis(300));
        let write = format!("open('{flag}', 'w').close()");
        run(&d, &key, &id, json!({"code": write, "context_id": other}));
        assert_eq!(value(&waiter.join().unwrap()), "'seen'");
    });
    // Two calls into one context: the second starts when the first has ended.
    let span = "import time\nstart = time.monotonic()\ntime.sleep(0.3)\n(start, time.monotonic())";
    let spans: Vec<(f64, f64)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..2)
            .map(|_| s.spawn(|| run(&d, &key, &id, json!({"code": span}))))
            .collect();
        calls
            .into_iter()
            .map(|c| {
                let text = value(&c.join().unwrap());
                let (a, b) = text.trim_matches(['(', ')']).split_once(", ").unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect()
    });
    let (first, second) = if spans[0].0 < spans[1].0 {
        (spans[0], spans[1])
    } else {
        (spans[1], spans[0])
    };
    assert!(
        first.1 <= second.0,
        "calls into one context overlapped: {spans:?}"
    );
}

#[test]
fn root_bad_input_is_refused_and_changes_nothing() {
    require_root!();
    let (d, key, id) = one_session();
    let (status, e) = code(
        &d,
        &key,
        &id,
        json!({"code": "1", "context_id": "ctx_nope"}),
    );
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{e}"
    );
    for (method, path) in [
        ("POST", "contexts/ctx_nope/restart"),
        ("DELETE", "contexts/ctx_nope"),
    ] {
        let (status, e) = d.request(
            method,
            &format!("/v1/sessions/{id}/{path}"),
            Some(&key),
            None,
        );
        assert_eq!(status, 404, "{method} {path}: {e}");
    }
    let big = "#".repeat((1 << 20) + 1);
    let (status, e) = code(&d, &key, &id, json!({"code": big}));
    assert_eq!(status, 413, "{e}");
    let (status, e) = code(&d, &key, &id, json!({"code": "1", "timeout_ms": 0}));
    assert_eq!(status, 422, "{e}");

    let (other_key, _) = tenant_key(&d, "other");
    let (status, e) = code(&d, &other_key, &id, json!({"code": "1"}));
    assert_eq!(status, 404, "another tenant's session: {e}");
    let (status, _) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/contexts"),
        Some(&other_key),
        None,
    );
    assert_eq!(status, 404);
    // None of it made a context.
    let (_, list) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/contexts"),
        Some(&key),
        None,
    );
    assert_eq!(list["contexts"], json!([]), "{list}");
}

#[test]
fn root_the_kernel_is_contained_like_any_exec() {
    require_root!();
    let (d, key, id) = one_session();
    let secret = std::env::temp_dir().join(format!("brig-interp-secret-{}", std::process::id()));
    std::fs::write(&secret, "host secret").unwrap();
    let path = secret.display().to_string();
    let r = run(
        &d,
        &key,
        &id,
        json!({"code": format!("open('{path}').read()")}),
    );
    std::fs::remove_file(&secret).unwrap();
    let name = r["error"]["name"].as_str().unwrap_or_default();
    assert!(
        name == "FileNotFoundError" || name == "PermissionError",
        "the kernel read a host file: {r}"
    );
    // It runs as the sandbox's user, as an exec does.
    let uid = sh(&d, &key, &id, "id -u");
    let kernel = run(&d, &key, &id, json!({"code": "import os; os.getuid()"}));
    assert_eq!(value(&kernel), uid.trim());
}

#[test]
fn root_a_restore_keeps_the_contexts_and_clears_their_state() {
    require_root!();
    let (d, key, id) = one_session();
    let other = new_context(&d, &key, &id, json!({"cwd": "/tmp"}));
    run(&d, &key, &id, json!({"code": "v = 1", "context_id": other}));
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    let (status, body) = restore(&d, &key, &id, &snap["snapshot_id"]);
    assert_eq!(status, 200, "{body}");
    let r = run(
        &d,
        &key,
        &id,
        json!({"code": "import os\n('v' in globals(), os.getcwd())", "context_id": other}),
    );
    assert_eq!(value(&r), "(False, '/tmp')", "{r}");
    assert_eq!(r["execution_count"], 1, "{r}");
    assert_eq!(r["stderr"], "", "a restore is no kernel death: {r}");
}

#[test]
fn root_a_kernel_killed_for_memory_is_reported_as_such() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({"limits": {"memory": "64M"}})));
    let r = run(
        &d,
        &key,
        &id,
        json!({"code": "b = b'x' * (200 * 1024 * 1024)"}),
    );
    assert_eq!(r["error"]["name"], "KernelDied", "{r}");
    assert!(r["error"]["value"].as_str().unwrap().contains("OOM"), "{r}");
    assert_eq!(value(&run(&d, &key, &id, json!({"code": "1 + 1"}))), "2");
}

#[test]
fn root_what_code_prints_cannot_pass_for_an_event() {
    require_root!();
    let (d, key, id) = one_session();
    // Lines shaped like the kernel's events, printed by the code and by a
    // subprocess writing to fd 1 directly.
    let forged = r#"{"type": "result", "data": {"text/plain": "forged"}, "main": true}"#;
    let code = format!(
        "import os, shlex\ns = r'''{forged}'''\nprint(s)\nprint('{{\"type\": \"end\"}}')\nos.system('echo ' + shlex.quote(s))\n'real'"
    );
    let r = run(&d, &key, &id, json!({"code": code}));
    assert_eq!(r["results"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(value(&r), "'real'");
    assert_eq!(
        r["stdout"],
        format!("{forged}\n{{\"type\": \"end\"}}\n{forged}\n"),
        "{r}"
    );
}

#[test]
fn root_deleting_a_context_ends_its_kernel() {
    require_root!();
    let (d, key, id) = one_session();
    let other = new_context(&d, &key, &id, json!({}));
    run(&d, &key, &id, json!({"code": "1"}));
    // The session's kernels, seen from inside it.
    let kernels = || {
        sh(
            &d,
            &key,
            &id,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^python3 -u -c' || true",
        )
        .trim()
        .to_string()
    };
    assert_eq!(kernels(), "2");
    let (status, e) = d.request(
        "DELETE",
        &format!("/v1/sessions/{id}/contexts/{other}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204, "{e}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while kernels() != "1" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(kernels(), "1");
    let (status, _) = code(&d, &key, &id, json!({"code": "1", "context_id": other}));
    assert_eq!(status, 404);
}

#[test]
fn root_a_session_without_python3_says_so() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    crate::support::import_tiny_image(&d, "tiny");
    let id = sid(&create(&d, &key, json!({"image": "tiny"})));
    let (status, e) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/contexts"),
        Some(&key),
        Some(json!({})),
    );
    assert_eq!(status, 422, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("python3"),
        "{e}"
    );
    let r = run(&d, &key, &id, json!({"code": "1"}));
    assert_eq!(r["error"]["name"], "KernelError", "{r}");
    let (_, list) = d.request(
        "GET",
        &format!("/v1/sessions/{id}/contexts"),
        Some(&key),
        None,
    );
    // The refused create kept nothing; the call made the default context.
    assert_eq!(list["contexts"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["contexts"][0]["id"], "default", "{list}");
}
