//! Background processes: start, stream, stdin, output, caps.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    assert_fields, create, daemon, delete_session, send_raw, set_quotas, sh, sid, tenant_key, Sse,
};
use serde_json::{json, Value};

/// A daemon with one session of the admin's: (daemon, key, session id, the
/// session's `/processes` path).
fn one_session() -> (Daemon, String, String, String) {
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let base = format!("/v1/sessions/{id}/processes");
    (d, key, id, base)
}

/// Starts a background process (201); its id.
fn start_process(d: &Daemon, key: &str, base: &str, body: Value) -> u64 {
    let (status, p) = d.request("POST", base, Some(key), Some(body));
    assert_eq!(status, 201, "{p}");
    p["process_id"].as_u64().unwrap()
}

/// `POST .../wait?timeout_ms=5000` on a process: its state then.
fn wait_process(d: &Daemon, key: &str, base: &str, process: u64) -> Value {
    let (_, done) = d.request(
        "POST",
        &format!("{base}/{process}/wait?timeout_ms=5000"),
        Some(key),
        None,
    );
    done
}

#[test]
fn root_a_process_reads_stdin_and_its_output_is_read_from_an_offset_and_streamed() {
    require_root!();
    let (d, key, id, base) = one_session();

    // `cat`: stdin in, output out.
    let (status, cat) = d.request("POST", &base, Some(&key), Some(json!({"argv": ["cat"]})));
    assert_eq!(status, 201, "{cat}");
    assert_fields(
        &cat,
        &[
            "process_id",
            "argv",
            "state",
            "exit_code",
            "signal",
            "started_at",
            "ended_at",
            "stdout_bytes",
            "stderr_bytes",
        ],
    );
    assert_eq!(cat["state"], "running");
    let cat_id = cat["process_id"].as_u64().unwrap();
    let (status, _) = d.raw(
        "POST",
        &format!("{base}/{cat_id}/stdin"),
        Some(&key),
        Some("application/octet-stream"),
        Some(b"hello\n".to_vec()),
    );
    assert_eq!(status, 204);
    assert!(common::eventually(5000, || {
        d.raw(
            "GET",
            &format!("{base}/{cat_id}/output?stream=stdout"),
            Some(&key),
            None,
            None,
        )
        .1 == b"hello\n"
    }));
    let (status, tail) = d.raw(
        "GET",
        &format!("{base}/{cat_id}/output?stream=stdout&offset=2"),
        Some(&key),
        None,
        None,
    );
    assert_eq!((status, tail.as_slice()), (200, &b"llo\n"[..]));
    let (status, _) = d.raw(
        "POST",
        &format!("{base}/{cat_id}/stdin?close=true"),
        Some(&key),
        Some("application/octet-stream"),
        Some(b"bye\n".to_vec()),
    );
    assert_eq!(status, 204);
    let (status, done) = d.request(
        "POST",
        &format!("{base}/{cat_id}/wait?timeout_ms=5000"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(done["state"], "exited", "{done}");
    assert_eq!(done["exit_code"], 0);
    assert_eq!(done["stdout_bytes"], 10);
    assert!(done["ended_at"].is_string());
    let events: Vec<_> = Sse::new(d.send(
        "GET",
        &format!("{base}/{cat_id}/stream"),
        Some(&key),
        None,
        (),
    ))
    .collect();
    let out: String = events
        .iter()
        .filter(|(e, _)| e == "stdout")
        .map(|(_, d)| d["data"].as_str().unwrap())
        .collect();
    assert_eq!(out, "hello\nbye\n");
    assert_eq!(events.last().unwrap().0, "exit", "{events:?}");
    assert_eq!(events.last().unwrap().1["exit_code"], 0);
    delete_session(&d, &key, &id);
}

#[test]
fn root_stdin_once_closed_is_refused_with_409() {
    require_root!();
    let (d, key, id, base) = one_session();
    let cat_id = start_process(&d, &key, &base, json!({"argv": ["cat"]}));
    let (status, _) = d.raw(
        "POST",
        &format!("{base}/{cat_id}/stdin?close=true"),
        Some(&key),
        Some("application/octet-stream"),
        Some(b"bye\n".to_vec()),
    );
    assert_eq!(status, 204);
    let done = wait_process(&d, &key, &base, cat_id);
    assert_eq!(done["state"], "exited", "{done}");
    let (status, body) = d.raw(
        "POST",
        &format!("{base}/{cat_id}/stdin"),
        Some(&key),
        None,
        Some(b"late".to_vec()),
    );
    assert_eq!(
        status,
        409,
        "stdin after close: {}",
        String::from_utf8_lossy(&body)
    );
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_wait_times_out_on_a_running_process_and_term_ends_it() {
    require_root!();
    let (d, key, id, base) = one_session();
    // A long one: wait times out, TERM ends it.
    let (status, long) = d.request(
        "POST",
        &base,
        Some(&key),
        Some(json!({"cmd": "echo started; exec sleep 600"})),
    );
    assert_eq!(status, 201);
    let long_id = long["process_id"].as_u64().unwrap();
    let started = Instant::now();
    let (status, still) = d.request(
        "POST",
        &format!("{base}/{long_id}/wait?timeout_ms=300"),
        Some(&key),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(still["state"], "running");
    assert!(started.elapsed() < Duration::from_secs(60));
    let (status, body) = d.request(
        "POST",
        &format!("{base}/{long_id}/signal"),
        Some(&key),
        Some(json!({"signal": "TERM"})),
    );
    assert_eq!(status, 204, "{body}");
    let (_, ended) = d.request(
        "POST",
        &format!("{base}/{long_id}/wait?timeout_ms=5000"),
        Some(&key),
        None,
    );
    assert_eq!(ended["state"], "exited", "{ended}");
    assert_eq!(ended["signal"], 15);
    assert_eq!(ended["exit_code"], Value::Null);
    let (_, out) = d.raw(
        "GET",
        &format!("{base}/{long_id}/output"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(out, b"started\n");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_process_runs_in_the_cwd_and_env_it_is_given() {
    require_root!();
    let (d, key, id, base) = one_session();
    let p_id = start_process(
        &d,
        &key,
        &base,
        json!({"cmd": "pwd; echo $V", "cwd": "/tmp", "env": {"V": "v"}}),
    );
    let done = wait_process(&d, &key, &base, p_id);
    assert_eq!(done["exit_code"], 0, "{done}");
    let (_, out) = d.raw(
        "GET",
        &format!("{base}/{p_id}/output"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(out, b"/tmp\nv\n");
    delete_session(&d, &key, &id);
}

#[test]
fn root_bad_signals_are_refused_with_422() {
    require_root!();
    let (d, key, id, base) = one_session();
    let p_id = start_process(
        &d,
        &key,
        &base,
        json!({"cmd": "pwd; echo $V", "cwd": "/tmp", "env": {"V": "v"}}),
    );
    let done = wait_process(&d, &key, &base, p_id);
    assert_eq!(done["exit_code"], 0, "{done}");
    for signal in [json!("NOPE"), json!(0), json!(65), json!(null)] {
        let (status, body) = d.request(
            "POST",
            &format!("{base}/{p_id}/signal"),
            Some(&key),
            Some(json!({ "signal": signal })),
        );
        assert_eq!(status, 422, "signal {signal}: {body}");
    }
    delete_session(&d, &key, &id);
}

#[test]
fn root_an_exit_code_is_recorded_even_when_nobody_waits() {
    require_root!();
    let (d, key, id, base) = one_session();
    let (_, three) = d.request(
        "POST",
        &base,
        Some(&key),
        Some(json!({"cmd": "echo e >&2; exit 3"})),
    );
    let three_id = three["process_id"].as_u64().unwrap();
    assert!(common::eventually(5000, || {
        let (_, p) = d.request("GET", &format!("{base}/{three_id}"), Some(&key), None);
        p["state"] == "exited"
    }));
    let (_, p) = d.request("GET", &format!("{base}/{three_id}"), Some(&key), None);
    assert_eq!(p["exit_code"], 3, "{p}");
    assert_eq!(p["stderr_bytes"], 2);
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_session_lists_its_processes_running_or_not_and_no_other() {
    require_root!();
    let (d, key, id, base) = one_session();
    // Running, ended by a signal, exited, exited with an error.
    let cat_id = start_process(&d, &key, &base, json!({"argv": ["cat"]}));
    let long_id = start_process(
        &d,
        &key,
        &base,
        json!({"cmd": "echo started; exec sleep 600"}),
    );
    let (status, body) = d.request(
        "POST",
        &format!("{base}/{long_id}/signal"),
        Some(&key),
        Some(json!({"signal": "TERM"})),
    );
    assert_eq!(status, 204, "{body}");
    let p_id = start_process(
        &d,
        &key,
        &base,
        json!({"cmd": "pwd; echo $V", "cwd": "/tmp", "env": {"V": "v"}}),
    );
    let three_id = start_process(&d, &key, &base, json!({"cmd": "echo e >&2; exit 3"}));
    for process in [long_id, p_id, three_id] {
        let done = wait_process(&d, &key, &base, process);
        assert_eq!(done["state"], "exited", "{done}");
    }

    let (status, list) = d.request("GET", &base, Some(&key), None);
    assert_eq!(status, 200);
    let listed: BTreeSet<u64> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["process_id"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, BTreeSet::from([cat_id, long_id, p_id, three_id]));
    let (status, _) = d.request("GET", &format!("{base}/999999"), Some(&key), None);
    assert_eq!(status, 404);
    delete_session(&d, &key, &id);
}

#[test]
fn root_background_processes_are_capped_per_tenant_and_in_all() {
    require_root!();
    // Each running background process holds two of the daemon's descriptors: one
    // tenant starting thousands took all the daemon had, failing everyone's requests.
    let d = daemon(&["--tenant-max-processes", "3", "--max-processes", "5"]);
    let (a, _) = tenant_key(&d, "procs-a");
    let (b, _) = tenant_key(&d, "procs-b");
    let (sa, sb) = (
        sid(&create(&d, &a, json!({}))),
        sid(&create(&d, &b, json!({}))),
    );
    let start = |key: &str, id: &str| {
        d.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(key),
            Some(json!({"argv": ["sleep", "60"]})),
        )
    };
    let mut mine = Vec::new();
    for _ in 0..3 {
        let (status, p) = start(&a, &sa);
        assert_eq!(status, 201, "{p}");
        mine.push(p["process_id"].clone());
    }
    let (status, body) = start(&a, &sa);
    assert_eq!(status, 429, "{body}");
    assert!(body.to_string().contains("background processes"), "{body}");
    // The other tenant has its own share, up to the daemon's.
    for _ in 0..2 {
        assert_eq!(start(&b, &sb).0, 201);
    }
    let (status, body) = start(&b, &sb);
    assert_eq!(status, 503, "{body}");
    // Execs are counted apart.
    assert_eq!(sh(&d, &a, &sa, "echo ok"), "ok\n");
    // Streams of their output are counted as execs are (each holds what it built
    // for its client), apart from them.
    set_quotas(&d, "procs-a", json!({"max_concurrent_execs": 2}));
    let stream_path = format!("/v1/sessions/{sa}/processes/{}/stream", mine[1]);
    let open: Vec<_> = (0..2)
        .map(|_| d.send("GET", &stream_path, Some(&a), None, ()))
        .collect();
    let (status, body) = d.request("GET", &stream_path, Some(&a), None);
    assert_eq!(status, 429, "{body}");
    assert!(body.to_string().contains("streams"), "{body}");
    drop(open);
    assert!(common::eventually(5000, || {
        d.try_send("GET", &stream_path, Some(&a), None, ())
            .is_ok_and(|r| r.status() == 200)
    }));
    // A process that ended frees its place.
    let (status, _) = d.request(
        "POST",
        &format!("/v1/sessions/{sa}/processes/{}/signal", mine[0]),
        Some(&a),
        Some(json!({"signal": "KILL"})),
    );
    assert_eq!(status, 204);
    assert!(common::eventually(5000, || start(&b, &sb).0 == 201));
    assert_eq!(start(&b, &sb).0, 429, "the other tenant is at its own cap");
    // And a deleted session's processes free theirs (the daemon is full meanwhile).
    let again = sid(&create(&d, &a, json!({})));
    assert_eq!(start(&a, &again).0, 503);
    delete_session(&d, &a, &sa);
    assert!(common::eventually(5000, || start(&a, &again).0 == 201));
    delete_session(&d, &a, &again);
    delete_session(&d, &b, &sb);
}

#[test]
fn root_stdin_goes_to_a_slow_reader_as_it_reads_not_held_whole() {
    use std::io::Write;
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    // Processes that take their stdin slowly but steadily: a body held whole until
    // they had it all would keep up to --max-body (10 MiB) per request for hours.
    let before = rss_kib(&d);
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (status, process) = d.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(&key),
            Some(json!({"cmd": "while head -c 16384 >/dev/null; do sleep 0.5; done"})),
        );
        assert_eq!(status, 201, "{process}");
        let path = format!(
            "/v1/sessions/{id}/processes/{}/stdin",
            process["process_id"]
        );
        let mut stream = std::net::TcpStream::connect(d.addr()).unwrap();
        let size = 8 << 20;
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Length: {size}\r\n\r\n"
        )
        .unwrap();
        clients.push(std::thread::spawn(move || {
            // Blocks once the daemon stops reading: the rest waits in the client.
            let _ = stream.write_all(&vec![b'x'; size]);
            stream
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_kib(&d).saturating_sub(before);
    assert!(
        grown < 12 << 10,
        "the daemon grew by {grown} KiB for 4 bodies of 8 MiB"
    );
    delete_session(&d, &key, &id);
    for client in clients {
        drop(client.join());
    }
}

#[test]
fn root_an_output_offset_past_any_file_reads_nothing() {
    require_root!();
    // 2^63 and more is no file offset to the kernel: the seek failed with EINVAL and
    // the client got a 500 (and the log an error) for its own request.
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let base = format!("/v1/sessions/{id}/processes");
    let (status, p) = d.request(
        "POST",
        &base,
        Some(&key),
        Some(json!({"cmd": "echo hello"})),
    );
    assert_eq!(status, 201, "{p}");
    let output = format!("{base}/{}/output", p["process_id"]);
    assert!(common::eventually(5000, || {
        d.raw("GET", &output, Some(&key), None, None).1 == b"hello\n"
    }));
    for offset in [
        "6",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
    ] {
        for stream in ["stdout", "stderr"] {
            let (status, body) = d.raw(
                "GET",
                &format!("{output}?stream={stream}&offset={offset}"),
                Some(&key),
                None,
                None,
            );
            let text = String::from_utf8_lossy(&body);
            assert_eq!((status, text.as_ref()), (200, ""), "offset {offset}");
        }
    }
    // Past 2^64-1 it is no offset at all: a bad query, not the daemon's failure.
    let (status, body) = d.request(
        "GET",
        &format!("{output}?offset=18446744073709551616"),
        Some(&key),
        None,
    );
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("bad_request")),
        "{body}"
    );
    assert!(!d.log_text().contains("os error 22"), "{}", d.log_text());
    delete_session(&d, &key, &id);
}

/// The daemon's resident memory, in KiB.
fn rss_kib(d: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn root_a_stalled_process_stream_holds_little_and_is_let_go() {
    require_root!();
    let d = daemon(&["--body-timeout", "1s"]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    // 20 MB of a byte JSON escapes to six: the stream must neither read it in big
    // pieces nor queue it for a client that reads nothing.
    let (status, process) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"cmd": "head -c 20000000 /dev/zero | tr '\\0' '\\1'"})),
    );
    assert_eq!(status, 201, "{process}");
    let pid = &process["process_id"];
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_kib(&d);
    let stream = d.send(
        "GET",
        &format!("/v1/sessions/{id}/processes/{pid}/stream"),
        Some(&key),
        None,
        (),
    );
    std::thread::sleep(Duration::from_secs(3));
    let grown = rss_kib(&d).saturating_sub(before);
    assert!(
        grown < 32 << 10,
        "the daemon grew by {grown} KiB for one stalled stream"
    );
    // Let go after the body timeout: what was built is still delivered, in small
    // events, and the stream ends without the exit.
    let events: Vec<_> = Sse::new(stream).collect();
    let sizes: Vec<usize> = events
        .iter()
        .map(|(_, v)| v["data"].as_str().unwrap().len())
        .collect();
    assert!(!sizes.is_empty());
    assert!(
        events.iter().all(|(name, _)| name == "stdout"),
        "{:?}",
        events.last().map(|e| &e.0)
    );
    assert!(sizes.iter().all(|&n| n <= 64 << 10), "{sizes:?}");
    assert!(sizes.iter().sum::<usize>() < 20_000_000);
    // A client that reads gets it all, then the exit.
    let events: Vec<_> = Sse::new(d.send(
        "GET",
        &format!("/v1/sessions/{id}/processes/{pid}/stream"),
        Some(&key),
        None,
        (),
    ))
    .collect();
    assert_eq!(events.last().unwrap().0, "exit");
    let whole: usize = events
        .iter()
        .filter(|(name, _)| name == "stdout")
        .map(|(_, v)| v["data"].as_str().unwrap().len())
        .sum();
    assert_eq!(whole, 20_000_000);

    // Its raw output (up to 16 MiB an answer), asked for by clients that read none
    // of it, is not read into memory for them.
    let before = rss_kib(&d);
    let output = format!("/v1/sessions/{id}/processes/{pid}/output?stream=stdout");
    let unread: Vec<_> = (0..20)
        .map(|_| send_raw(&d, "GET", &output, &key, None, b""))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_kib(&d).saturating_sub(before);
    assert!(
        grown < 32 << 10,
        "20 unread outputs grew the daemon by {grown} KiB"
    );
    drop(unread);
    let (status, bytes) = d.raw("GET", &output, Some(&key), None, None);
    assert_eq!((status, bytes.len()), (200, 16 << 20));
    delete_session(&d, &key, &id);
}
