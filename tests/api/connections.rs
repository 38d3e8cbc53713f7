//! Connections and transfers: bounds on requests, stalled and silent clients,
//! and the daemon without authentication.

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    audit_of, create, daemon, delete_session, exchange, exec, files_url, multipart, put_file, q,
    send_raw, set_quotas, sh, sid, tenant_key, wait_for_file,
};
use serde_json::{json, Value};

/// Connections cannot hold the daemon: one that sends nothing, trickles its headers
/// or idles between requests is closed after `--header-timeout`, and no more than
/// `--max-connections` are open at once (the rest wait to be accepted). A request
/// that takes longer than the timeout to answer is not cut.
/// A JSON request on a connection of its own, its answer read for at most `limit`
/// (a hung answer fails the test instead of hanging it): (status, body).
fn bounded_request(
    addr: &str,
    key: &str,
    method: &str,
    path: &str,
    body: &str,
    limit: Duration,
) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(limit)).unwrap();
    std::io::Write::write_all(
        &mut stream,
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .unwrap_or_else(|e| panic!("{method} {path}: no answer within {limit:?}: {e}"));
    let status = reply[9..12].parse().unwrap();
    let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

#[test]
fn root_a_sandbox_stopping_its_inits_commands_cannot_hold_requests_past_their_bounds() {
    require_root!();
    let d = daemon(&[]);
    let (key, _) = tenant_key(&d, "stopper");
    set_quotas(&d, "stopper", json!({"max_concurrent_execs": 2}));
    let id = sid(&create(&d, &key, json!({})));
    let other = sid(&create(&d, &key, json!({})));
    let exec_path = format!("/v1/sessions/{id}/exec");
    // An exec already running when the attack starts.
    let running = {
        let (addr, key, path) = (d.addr().to_string(), key.clone(), exec_path.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let body = r#"{"cmd": "touch started; sleep 1000", "timeout_ms": 4000}"#;
            let answer = bounded_request(&addr, &key, "POST", &path, body, Duration::from_secs(90));
            (answer, started.elapsed())
        })
    };
    wait_for_file(&d, &key, &id, "/workspace/started");
    // The attack: a process that stops every other process in its session, over
    // and over. The command init starts next is stopped before its execve, which
    // init waits for: init answers nothing more.
    let (status, body) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"cmd": "setsid sh -c 'while :; do kill -STOP -1 2>/dev/null; done' &"})),
    );
    assert_eq!(status, 201, "{body}");
    std::thread::sleep(Duration::from_millis(300));
    // More execs than the tenant's cap, one after another, none held past its
    // bound. The attack works when it stops a command before its execve, which init
    // waits for: init then answers nothing more, and each exec ends at its timeout
    // saying why. On a loaded machine the attacker may get the CPU too late for the
    // first commands: they run, or are stopped after their execve and killed at
    // their timeout as any other. So execs go on until init is held (at most 10).
    let init_held = std::cell::Cell::new(false);
    let bounded_exec = || {
        let started = Instant::now();
        let body = r#"{"argv": ["echo", "hi"], "timeout_ms": 1000}"#;
        let limit = Duration::from_secs(10);
        let (status, result) = bounded_request(d.addr(), &key, "POST", &exec_path, body, limit);
        assert_eq!(status, 200, "{result}");
        // Once held, init stays held: the stopped command never reaches its execve.
        let held_before = init_held.get();
        if result["stderr"].as_str().unwrap().contains("SIGSTOP") {
            assert_eq!(result["timed_out"], true, "{result}");
            assert_eq!(result["exit_code"], Value::Null, "{result}");
            init_held.set(true);
        } else if held_before {
            panic!("init answered again after it was held: {result}");
        } else if result["timed_out"] == true {
            assert_eq!(result["signal"], 9, "{result}");
        } else {
            assert_eq!(result["stdout"], "hi\n", "{result}");
        }
        // Its timeout is 1 s; what this guards against is init's answers being
        // waited for (10 s each) or for ever.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(9), "{took:?}: {result}");
    };
    for attempt in 1.. {
        bounded_exec();
        if attempt >= 3 && init_held.get() {
            break;
        }
        assert!(attempt < 10, "init was never held: the attack did not run");
    }
    // The exec that was running is killed at its timeout; init never reports its
    // exit, and it is given up 10 s later.
    let ((status, result), took) = running.join().unwrap();
    assert_eq!(
        (status, &result["timed_out"]),
        (200, &json!(true)),
        "{result}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
    // A snapshot cannot get the session's writes from init: 409 within bounds, and
    // the session's gate is free again for the next exec.
    let started = Instant::now();
    let snapshot = format!("/v1/sessions/{id}/snapshots");
    let (status, body) = bounded_request(
        d.addr(),
        &key,
        "POST",
        &snapshot,
        "{}",
        Duration::from_secs(90),
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    bounded_exec();
    // None holds a slot: the tenant's other session runs its execs.
    assert_eq!(sh(&d, &key, &other, "echo ok"), "ok\n");
    delete_session(&d, &key, &id);
    delete_session(&d, &key, &other);
}

/// POSTs a JSON body on a connection of its own and returns it unread.
fn post_json_unread(d: &Daemon, path: &str, key: &str, body: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(d.addr()).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// A daemon that gives up a transfer after 5 s of nothing, tenant `slow` on it with
/// two concurrent execs (its cap of file transfers too), and a session of the
/// tenant's: (daemon, key, session id).
fn slow_tenant() -> (Daemon, String, String) {
    // Long enough to look at the stalled transfers before they are given up, on a
    // loaded machine too.
    let d = daemon(&["--body-timeout", "5s"]);
    let (key, _) = tenant_key(&d, "slow");
    set_quotas(&d, "slow", json!({"max_concurrent_execs": 2}));
    let id = sid(&create(&d, &key, json!({})));
    (d, key, id)
}

#[test]
fn root_stalled_uploads_hold_the_transfer_cap_until_answered_408_and_leave_no_file() {
    require_root!();
    let (d, key, id) = slow_tenant();

    // Two uploads whose clients send a byte of the megabyte they promise, then
    // nothing, holding their connections open.
    let started = Instant::now();
    let mut stalled: Vec<_> = (0..2)
        .map(|i| {
            let path = files_url(&id, &format!("/workspace/s{i}"));
            send_raw(&d, "PUT", &path, &key, Some(1_000_000), b"x")
        })
        .collect();
    // The premise: both hold their transfers. Each has made its temporary file
    // (after taking its permit) by then; an exec is counted apart.
    assert!(
        common::eventually(60_000, || sh(&d, &key, &id, "ls -A /workspace | wc -l")
            == "2\n"),
        "the stalled uploads never both started: {}",
        sh(&d, &key, &id, "ls -A /workspace")
    );
    // They fill the tenant's cap (that of its concurrent execs): a third transfer
    // is refused at once; an exec, counted apart, is not.
    let third = files_url(&id, "/workspace/third");
    let (status, body) = d.raw("PUT", &third, Some(&key), None, Some(b"x".to_vec()));
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("file transfers"), "{body}");
    assert_eq!(sh(&d, &key, &id, "echo ok"), "ok\n");
    // Each is answered 408 once it has sent nothing for the body timeout, and
    // leaves no file.
    for stream in &mut stalled {
        let mut status_line = String::new();
        BufReader::new(stream).read_line(&mut status_line).unwrap();
        assert!(status_line.starts_with("HTTP/1.1 408"), "{status_line}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(sh(&d, &key, &id, "ls /workspace"), "");
    let (status, _) = d.raw("PUT", &third, Some(&key), None, Some(b"x".to_vec()));
    assert_eq!(status, 201);
    delete_session(&d, &key, &id);
}

#[test]
fn root_an_unread_archive_download_is_given_up_and_audited_unfinished() {
    require_root!();
    let (d, key, id) = slow_tenant();
    // An archive download its client never reads: given up after the timeout (its
    // event says it was not finished), not held for as long as the connection.
    sh(
        &d,
        &key,
        &id,
        "head -c 30000000 /dev/urandom > /workspace/big",
    );
    let archive = format!("/v1/sessions/{id}/archive?path={}", q("/workspace"));
    let unread = send_raw(&d, "GET", &archive, &key, None, b"");
    let unfinished = |events: &[Value]| {
        events
            .iter()
            .any(|e| e["outcome"] == "error" && e["detail"]["finished"] == false)
    };
    assert!(
        common::eventually(60_000, || unfinished(&audit_of(&d, "file.archive.read"))),
        "{:?}",
        audit_of(&d, "file.archive.read")
    );
    drop(unread);
    delete_session(&d, &key, &id);
}

#[test]
fn root_unread_listings_hold_the_transfer_cap_until_given_up() {
    require_root!();
    let (d, key, id) = slow_tenant();
    // A listing of long names is tens of MB: two that their clients never read
    // hold the tenant's transfers while they last (another transfer is refused),
    // and are given up after the timeout rather than held with the connection.
    let pad = "n".repeat(200);
    sh(
        &d,
        &key,
        &id,
        &format!("mkdir /workspace/long && cd /workspace/long && seq 80000 | sed 's/$/{pad}/' | xargs touch"),
    );
    let listing = format!("/v1/sessions/{id}/dir?path={}", q("/workspace/long"));
    let small = format!("/v1/sessions/{id}/dir?path={}", q("/workspace"));
    let unread: Vec<_> = (0..2)
        .map(|_| send_raw(&d, "GET", &listing, &key, None, b""))
        .collect();
    // Each is audited once built, its permit already taken.
    let built = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["outcome"] == "ok" && e["detail"]["path"] == "/workspace/long")
            .count()
            == 2
    };
    assert!(
        common::eventually(60_000, || built(&audit_of(&d, "file.list"))),
        "{:?}",
        audit_of(&d, "file.list")
    );
    let (status, body) = d.raw("GET", &small, Some(&key), None, None);
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(
        status, 429,
        "two listings being read hold no transfers: {body}"
    );
    let given_up = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["outcome"] == "error" && e["detail"]["finished"] == false)
            .count()
            == 2
    };
    assert!(
        common::eventually(60_000, || given_up(&audit_of(&d, "file.list"))),
        "{:?}",
        audit_of(&d, "file.list")
    );
    assert_eq!(d.raw("GET", &small, Some(&key), None, None).0, 200);
    drop(unread);
    // Read, the same listing is whole.
    let (status, whole) = d.request("GET", &listing, Some(&key), None);
    assert_eq!(status, 200);
    assert_eq!(whole["entries"].as_array().unwrap().len(), 80_000);
    sh(&d, &key, &id, "rm -r /workspace/long");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_stdin_write_nobody_reads_is_answered_408_and_what_went_in_stays() {
    require_root!();
    let (d, key, id) = slow_tenant();
    // A process that never reads its stdin: a write to it is answered 408 once
    // nothing was taken for the timeout; its stdin stays open, holding what went in.
    let (status, process) = d.request(
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(&key),
        Some(json!({"cmd": "while [ ! -e /tmp/read ]; do sleep 0.02; done; wc -c"})),
    );
    assert_eq!(status, 201, "{process}");
    let stdin = format!(
        "/v1/sessions/{id}/processes/{}/stdin",
        process["process_id"]
    );
    let started = Instant::now();
    let (status, body) = d.raw("POST", &stdin, Some(&key), None, Some(vec![b'x'; 1 << 20]));
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 408, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    let written: u64 = body
        .split(" bytes were written")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {body}"));
    assert!(written > 0 && written < 1 << 20, "{body}");
    put_file(&d, &key, &id, "/tmp/read");
    let (status, _) = d.raw(
        "POST",
        &format!("{stdin}?close=true"),
        Some(&key),
        None,
        Some(vec![]),
    );
    assert_eq!(status, 204);
    let (status, done) = d.request(
        "POST",
        &format!(
            "/v1/sessions/{id}/processes/{}/wait?timeout_ms=60000",
            process["process_id"]
        ),
        Some(&key),
        None,
    );
    assert_eq!((status, &done["exit_code"]), (200, &json!(0)), "{done}");
    let (_, out) = d.raw(
        "GET",
        &format!(
            "/v1/sessions/{id}/processes/{}/output?stream=stdout",
            process["process_id"]
        ),
        Some(&key),
        None,
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out).trim(), written.to_string());
    delete_session(&d, &key, &id);
}

/// A tree of 100,001 empty files at /workspace/tree in the session.
fn make_big_tree(d: &Daemon, key: &str, id: &str) {
    sh(
        d,
        key,
        id,
        "mkdir /workspace/tree && cd /workspace/tree && seq 100001 | xargs touch",
    );
}

#[test]
fn root_an_archive_has_every_entry_of_a_tree_larger_than_a_listing_returns() {
    require_root!();
    let (d, key, id) = slow_tenant();
    make_big_tree(&d, &key, &id);
    // More entries than a listing returns: the archive has them all.
    let archive = format!("/v1/sessions/{id}/archive?path={}", q("/workspace/tree"));
    let (status, tar) = d.raw("GET", &archive, Some(&key), None, None);
    assert_eq!(
        status,
        200,
        "{}",
        String::from_utf8_lossy(&tar[..tar.len().min(300)])
    );
    assert!(tar.len() >= 100_001 * 512, "{}", tar.len());
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_delete_whose_client_leaves_before_the_answer_still_ends_and_is_audited() {
    require_root!();
    let (d, key, id) = slow_tenant();
    // A file operation whose client leaves before the answer still ends, and is
    // audited.
    make_big_tree(&d, &key, &id);
    let tree = files_url(&id, "/workspace/tree") + "&recursive=true";
    let client = send_raw(&d, "DELETE", &tree, &key, None, b"");
    // Gone once the removal is under way (100,000 entries took the daemon 0.75 s).
    std::thread::sleep(Duration::from_millis(100));
    drop(client);
    let deleted = |events: &[Value]| {
        events
            .iter()
            .any(|e| e["outcome"] == "ok" && e["detail"]["path"] == "/workspace/tree")
    };
    assert!(
        common::eventually(15_000, || deleted(&audit_of(&d, "file.delete"))),
        "{:?}",
        audit_of(&d, "file.delete")
    );
    assert_eq!(sh(&d, &key, &id, "ls /workspace"), "");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_client_that_reads_nothing_of_an_answer_loses_its_connection() {
    require_root!();
    let d = daemon(&["--body-timeout", "1s"]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    // 1 MiB of a control byte on each stream escapes to ~12 MB of JSON, which the
    // daemon would hold for as long as the client kept its socket open.
    let body =
        json!({"cmd": "head -c 1048576 /dev/zero | tr '\\0' '\\1' | tee /dev/stderr"}).to_string();
    let mut stream = post_json_unread(&d, &format!("/v1/sessions/{id}/exec"), &key, &body);
    std::thread::sleep(Duration::from_secs(4));
    // What was in flight still arrives; then the connection is closed, the answer
    // not whole.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = Vec::new();
    let ended = stream.read_to_end(&mut received);
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    let length: usize = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_string)
        })
        .and_then(|n| n.trim().parse().ok())
        .expect("a content length");
    assert!(
        received.len() < length,
        "{} of {length} bytes: the answer was held until read ({ended:?})",
        received.len()
    );
    // A client that reads gets the answer whole.
    let reply = exec(&d, &key, &id, serde_json::from_str(&body).unwrap());
    assert_eq!(reply["stdout"].as_str().unwrap().len(), 1 << 20);

    // Until it is read (or given up), an answer holds its exec's slot: unread
    // answers are never more than the tenant's concurrent execs.
    let (slow, _) = tenant_key(&d, "slow-reader");
    set_quotas(&d, "slow-reader", json!({"max_concurrent_execs": 2}));
    let other = sid(&create(&d, &slow, json!({})));
    let unread: Vec<_> = (0..2)
        .map(|_| post_json_unread(&d, &format!("/v1/sessions/{other}/exec"), &slow, &body))
        .collect();
    // Once both have run (and are audited), their unread answers hold the slots.
    let audited = |action: &str| {
        audit_of(&d, action)
            .iter()
            .filter(|e| e["tenant"] == "slow-reader")
            .count()
    };
    assert!(common::eventually(10_000, || audited("exec") == 2));
    let (status, refused) = d.request(
        "POST",
        &format!("/v1/sessions/{other}/exec"),
        Some(&slow),
        Some(json!({"cmd": "true"})),
    );
    assert_eq!(status, 429, "{refused}");
    let freed = || {
        d.request(
            "POST",
            &format!("/v1/sessions/{other}/exec"),
            Some(&slow),
            Some(json!({"cmd": "true"})),
        )
        .0 == 200
    };
    assert!(
        common::eventually(8000, freed),
        "given-up answers freed no slot"
    );
    drop(unread);
    // That was the first answer given up; the second, sent after it, may hold its
    // slot up to a body timeout longer. A streamed exec takes its slot after its
    // head is sent, and one refused then says so in an event, so a stream started
    // too early was refused inside and held nothing (seen in the suite).
    std::thread::sleep(Duration::from_millis(1500));
    // The same for a streamed exec, whose events wait for the client after the run.
    let unread: Vec<_> = (0..2)
        .map(|_| {
            post_json_unread(
                &d,
                &format!("/v1/sessions/{other}/exec/stream"),
                &slow,
                &body,
            )
        })
        .collect();
    let streams_ran = || {
        audit_of(&d, "exec.stream")
            .iter()
            .filter(|e| e["tenant"] == "slow-reader" && e["outcome"] == "ok")
            .count()
            == 2
    };
    assert!(
        common::eventually(10_000, streams_ran),
        "{:?}",
        audit_of(&d, "exec.stream")
    );
    let (status, refused) = d.request(
        "POST",
        &format!("/v1/sessions/{other}/exec"),
        Some(&slow),
        Some(json!({"cmd": "true"})),
    );
    assert_eq!(
        status,
        429,
        "unread streamed execs hold no slot: {refused}; their events: {:?}",
        audit_of(&d, "exec.stream")
    );
    assert!(
        common::eventually(8000, freed),
        "given-up streams freed no slot"
    );
    drop(unread);
    // The same for one-shot code execution.
    let code = json!({"code": "import sys\nsys.stdout.write('\\x01' * 1048576)\nsys.stderr.write('\\x01' * 1048576)"})
        .to_string();
    let unread: Vec<_> = (0..2)
        .map(|_| post_json_unread(&d, "/v1/execute", &slow, &code))
        .collect();
    let refused = || {
        d.request(
            "POST",
            &format!("/v1/sessions/{other}/exec"),
            Some(&slow),
            Some(json!({"cmd": "true"})),
        )
        .0 == 429
    };
    // Once both have run (and are audited), their unread answers hold the slots.
    assert!(common::eventually(10_000, || audit_of(&d, "execute").len() == 2));
    assert!(refused(), "unread /v1/execute answers hold no slot");
    assert!(
        common::eventually(8000, freed),
        "given-up answers freed no slot"
    );
    drop(unread);
    delete_session(&d, &slow, &other);
    delete_session(&d, &key, &id);
}

#[test]
fn root_no_auth_answers_no_rebound_name_and_no_web_page() {
    require_root!();
    // DNS rebinding: a page on http://evil.example:PORT whose name is re-pointed to
    // 127.0.0.1 is the daemon's own origin, and under --no-auth it needs no key: it
    // listed sessions, ran commands and read files.
    let d = daemon(&["--no-auth"]);
    let (addr, port) = (d.addr(), d.addr().rsplit_once(':').unwrap().1);
    let (status, session) = d.request("POST", "/v1/sessions", None, Some(json!({})));
    assert_eq!(status, 201, "{session}");
    let id = sid(&session);
    let forbidden_with = |head: String, body: &[u8]| {
        let (status, body) = exchange(addr, &head, body);
        assert_eq!(status, 403, "{head}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{head}: {body}");
        assert!(!body.to_string().contains(&id), "{body}");
    };
    let forbidden = |head: String| forbidden_with(head, b"");
    let rebound = format!("Host: evil.example:{port}");
    for path in [
        "/v1/sessions".to_string(),
        format!("/v1/sessions/{id}/files?path=/etc/hostname"),
        "/health".to_string(),
        "/metrics".to_string(),
        "/no/such/route".to_string(),
    ] {
        forbidden(format!("GET {path} HTTP/1.1\r\n{rebound}"));
        forbidden(format!(
            "GET {path} HTTP/1.1\r\n{rebound}\r\nOrigin: http://evil.example:{port}"
        ));
    }
    let exec = format!("/v1/sessions/{id}/exec");
    let cmd = r#"{"cmd": "touch /tmp/pwned"}"#;
    forbidden_with(
        format!(
            "POST {exec} HTTP/1.1\r\n{rebound}\r\nContent-Type: application/json\r\n\
             Content-Length: {}",
            cmd.len()
        ),
        cmd.as_bytes(),
    );
    // The target's own authority counts as much as Host.
    forbidden(format!(
        "GET http://evil.example:{port}/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}"
    ));
    // A page on any origin (a rebound name, another site, a file: page) is refused
    // even when it names the daemon's address.
    for origin in [
        "http://evil.example",
        "null",
        &format!("http://127.0.0.1:{port}"),
    ] {
        forbidden(format!(
            "GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}"
        ));
    }
    let (status, ls) = d.request(
        "POST",
        &exec,
        None,
        Some(json!({"cmd": "ls /tmp; echo done"})),
    );
    assert_eq!(status, 200, "{ls}");
    let files = ls["stdout"].as_str().unwrap();
    assert!(files.contains("done") && !files.contains("pwned"), "{ls}");

    // Loopback names, with or without a port, and HTTP/1.0 without a Host.
    for host in [
        format!("Host: 127.0.0.1:{port}"),
        format!("Host: localhost:{port}"),
        "Host: localhost".to_string(),
        format!("Host: [::1]:{port}"),
    ] {
        let (status, list) = exchange(addr, &format!("GET /v1/sessions HTTP/1.1\r\n{host}"), b"");
        assert_eq!(status, 200, "{host}: {list}");
        assert!(list.to_string().contains(&id), "{list}");
    }
    let (status, list) = exchange(addr, "GET /v1/sessions HTTP/1.0", b"");
    assert_eq!(status, 200, "{list}");
    // The refusals are audited.
    let refused = audit_of(&d, "refused");
    assert!(
        refused.iter().any(|e| e["detail"]["code"] == "forbidden"),
        "{refused:?}"
    );
    let (status, _) = d.request("DELETE", &format!("/v1/sessions/{id}"), None, None);
    assert_eq!(status, 204);
}

#[test]
fn root_no_auth_takes_no_cross_site_upload() {
    require_root!();
    // multipart/form-data needs no CORS preflight: any web page could fill the
    // developer's disk quota (and the host's disk) with `fetch(.., {mode: "no-cors"})`.
    let d = daemon(&["--no-auth"]);
    let port = d.addr().rsplit_once(':').unwrap().1;
    let (content_type, body) = multipart("evil.bin", &[7u8; 100_000]);
    let head = |origin: &str| {
        format!(
            "POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{origin}\
             Content-Type: {content_type}\r\nContent-Length: {}",
            body.len()
        )
    };
    for origin in ["http://evil.example", "null"] {
        let (status, reply) = exchange(d.addr(), &head(&format!("Origin: {origin}\r\n")), &body);
        assert_eq!(status, 403, "{reply}");
        assert_eq!(reply["error"]["code"], "forbidden", "{reply}");
    }
    let (status, list) = d.request("GET", "/v1/files", None, None);
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["files"].as_array().map(Vec::len), Some(0), "{list}");
    let (status, tenant) = d.request("GET", "/v1/tenants/default", None, None);
    assert_eq!(status, 200, "{tenant}");
    assert_eq!(tenant["usage"]["file_bytes"], 0, "{tenant}");
    // The same upload from a local client is stored.
    let (status, reply) = exchange(d.addr(), &head(""), &body);
    assert_eq!(status, 201, "{reply}");
}

#[test]
fn root_silent_slow_and_idle_connections_are_closed_and_capped() {
    use std::io::Write;
    use std::net::TcpStream;
    require_root!();
    let d = daemon(&["--header-timeout", "1s", "--max-connections", "4"]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let connect = || {
        let stream = TcpStream::connect(d.addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
    };
    let closed_within = |stream: &mut TcpStream| {
        let started = Instant::now();
        let mut buf = [0u8; 256];
        match stream.read(&mut buf) {
            Ok(0) => started.elapsed(),
            other => panic!("the connection was not closed: {other:?}"),
        }
    };

    // Four silent connections fill every slot: a fifth client waits until the
    // daemon closes them, a second after they were accepted (which is after the
    // clock starts here; the fifth comes after them in the listen queue).
    let opened = Instant::now();
    let mut silent: Vec<TcpStream> = (0..4).map(|_| connect()).collect();
    let mut fifth = connect();
    fifth
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    fifth.read_to_string(&mut reply).unwrap();
    let waited = opened.elapsed();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // Served once the silent ones were closed, not before their timeout, nor only
    // by some other, much later, end of theirs (there is none: the read times out).
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(60),
        "the fifth connection was served after {waited:?}"
    );
    // The fifth was served: the silent ones, accepted together, are closed by now.
    for stream in &mut silent {
        assert!(closed_within(stream) < Duration::from_secs(30));
    }

    // Headers trickled a byte at a time are cut off at the timeout (1 s), not when
    // the trickle stops: it would go on for 25 s or more, and never end the headers.
    let mut trickle = connect();
    let started = Instant::now();
    let request = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: {}",
        "a".repeat(500)
    );
    let cut = request.bytes().any(|byte| {
        std::thread::sleep(Duration::from_millis(50));
        trickle.write_all(&[byte]).is_err()
    });
    assert!(
        cut,
        "a trickled request was never cut off ({:?})",
        started.elapsed()
    );

    // A kept-alive connection: an exec longer than the timeout is answered, the next
    // request on it too, and once idle for the timeout it is closed.
    let mut kept = connect();
    let mut ask = |body: &str| {
        let request = format!(
            "POST /v1/sessions/{id}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        kept.write_all(request.as_bytes()).unwrap();
        let mut reader = BufReader::new(kept.try_clone().unwrap());
        let mut head = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = n.trim().parse().unwrap();
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        serde_json::from_slice::<Value>(&body).unwrap()
    };
    let slow = ask(r#"{"cmd": "sleep 1.5; echo slow"}"#);
    assert_eq!(slow["stdout"], "slow\n", "{slow}");
    // Idle from the answer to the quick request (sent after `asked`) on: closed at
    // the timeout, not at once, and not never (the read times out).
    let asked = Instant::now();
    let quick = ask(r#"{"argv": ["echo", "quick"]}"#);
    assert_eq!(quick["stdout"], "quick\n", "{quick}");
    closed_within(&mut kept);
    let idle = asked.elapsed();
    assert!(
        idle >= Duration::from_secs(1) && idle < Duration::from_secs(60),
        "{idle:?}"
    );
    delete_session(&d, &key, &id);
}
