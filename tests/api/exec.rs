//! Exec: synchronous and streamed commands, their limits, timeouts and output.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    create, daemon, delete_session, exec, peak_rss, put_file, session_count, sh, sid, sse_post,
};
use serde_json::{json, Value};

/// The names of the processes in the session, one per line. A process may end
/// between the glob and its `cat` (the very one a test waits to see killed), so a
/// failed read is skipped rather than failing the line.
fn process_names(d: &Daemon, key: &str, id: &str) -> String {
    sh(
        d,
        key,
        id,
        "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done; true",
    )
}

#[test]
fn root_exec_sync_argv_cmd_stdin_env_cwd_and_exit_codes() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(
        &d,
        &key,
        json!({"env": {"FROM_SESSION": "s", "BOTH": "session"}}),
    ));

    let r = exec(&d, &key, &id, json!({"argv": ["echo", "a b", "c"]}));
    assert_eq!(r["stdout"], "a b c\n");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["oom_killed"], false);
    assert_eq!(r["stdout_truncated"], false);
    assert!(r["duration_ms"].is_u64());

    let r = exec(
        &d,
        &key,
        &id,
        json!({"cmd": "echo out; echo err >&2; exit 3"}),
    );
    assert_eq!(
        (r["stdout"].as_str(), r["stderr"].as_str()),
        (Some("out\n"), Some("err\n"))
    );
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["signal"], Value::Null);

    let r = exec(
        &d,
        &key,
        &id,
        json!({"argv": ["cat"], "stdin": "from stdin\n"}),
    );
    assert_eq!(r["stdout"], "from stdin\n");

    let r = exec(
        &d,
        &key,
        &id,
        json!({"cmd": "echo $FROM_SESSION $BOTH $FROM_REQUEST", "env": {"BOTH": "request", "FROM_REQUEST": "r"}}),
    );
    assert_eq!(r["stdout"], "s request r\n", "request env over session env");

    // The default cwd is /workspace; another may be given.
    assert_eq!(sh(&d, &key, &id, "pwd"), "/workspace\n");
    let r = exec(&d, &key, &id, json!({"argv": ["pwd"], "cwd": "/tmp"}));
    assert_eq!(r["stdout"], "/tmp\n");

    let r = exec(&d, &key, &id, json!({"argv": ["no-such-command-here"]}));
    assert_eq!(r["exit_code"], 127, "{r}");
    let r = exec(&d, &key, &id, json!({"cmd": "kill -9 $$"}));
    assert_eq!(r["exit_code"], Value::Null, "{r}");
    assert_eq!(r["signal"], 9, "{r}");

    // Each exec runs as the session's user, and state persists between execs.
    assert_eq!(sh(&d, &key, &id, "id -u"), "1000\n");
    sh(&d, &key, &id, "echo kept > /workspace/state");
    assert_eq!(sh(&d, &key, &id, "cat /workspace/state"), "kept\n");
    delete_session(&d, &key, &id);
}

#[test]
fn root_exec_timeout_kills_the_process_group() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let started = Instant::now();
    let r = exec(
        &d,
        &key,
        &id,
        json!({"argv": ["sh", "-c", "sleep 600 & sleep 600"], "timeout_ms": 300}),
    );
    let took = started.elapsed();
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["exit_code"], Value::Null, "{r}");
    // Ended at its timeout, not its command's end, however loaded the machine.
    assert!(took < Duration::from_secs(60), "took {took:?}");
    // Neither sleep is left in the sandbox.
    let comms = process_names(&d, &key, &id);
    assert!(!comms.lines().any(|c| c == "sleep"), "left: {comms}");
    delete_session(&d, &key, &id);
}

/// Sends a JSON POST on a connection of its own and returns the connection unread,
/// for the caller to hang up on.
fn post_unanswered(d: &Daemon, key: &str, path: &str, body: &Value) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::to_vec(body).unwrap();
    let mut client = std::net::TcpStream::connect(d.addr()).unwrap();
    write!(
        client,
        "POST {path} HTTP/1.1\r\nHost: brig\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    client.write_all(&body).unwrap();
    client
}

/// A client that hangs up during an exec (its HTTP timeout, a crash) does not leave
/// the command running: sync, streamed and bash execs are killed when their client
/// goes, long before their `timeout_ms`, and audited as `client_closed`.
#[test]
fn root_an_exec_whose_client_hangs_up_is_killed_and_audited() {
    use std::io::Read;
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let sleeps = || {
        process_names(&d, &key, &id)
            .lines()
            .filter(|c| *c == "sleep")
            .count()
    };
    let cases = [
        (
            "exec",
            "exec",
            json!({"argv": ["sleep", "60"], "timeout_ms": 50_000}),
        ),
        (
            "exec/stream",
            "exec.stream",
            json!({"cmd": "echo started; sleep 60", "timeout_ms": 50_000}),
        ),
        (
            "bash",
            "bash",
            json!({"cmd": "sleep 60", "timeout_ms": 50_000}),
        ),
    ];
    for (route, action, body) in cases {
        let mut client = post_unanswered(&d, &key, &format!("/v1/sessions/{id}/{route}"), &body);
        if route == "exec/stream" {
            // Up to the first output: the command runs.
            client
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains("started") {
                let n = client.read(&mut buf).unwrap();
                assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
                seen.extend_from_slice(&buf[..n]);
            }
        } else {
            assert!(
                common::eventually(10_000, || sleeps() == 1),
                "{route}: the command did not start"
            );
        }
        drop(client);
        assert!(
            common::eventually(5_000, || sleeps() == 0),
            "{route}: the command outlived its client"
        );
        let audited = || {
            let path = format!("/v1/audit?session_id={id}&outcome=client_closed&action={action}");
            let (status, found) = d.request("GET", &path, Some(&key), None);
            assert_eq!(status, 200, "{found}");
            found["events"].as_array().unwrap().len()
        };
        assert!(
            common::eventually(5_000, || audited() == 1),
            "{route}: {} client_closed audit events, not 1",
            audited()
        );
    }
    // A one-shot run is its own short session: it goes on to its end, is cleaned
    // up, and is audited all the same.
    let code = json!({"code": "import time\ntime.sleep(1)\nprint('done')"});
    let client = post_unanswered(&d, &key, "/v1/execute", &code);
    std::thread::sleep(Duration::from_millis(300));
    drop(client);
    let executed = || {
        let (_, found) = d.request("GET", "/v1/audit?action=execute", Some(&key), None);
        found["events"].as_array().unwrap().clone()
    };
    assert!(
        common::eventually(10_000, || executed().len() == 1),
        "no audit event for a one-shot run whose client hung up"
    );
    assert_eq!(executed()[0]["outcome"], "ok", "{:?}", executed());
    assert!(
        common::eventually(5_000, || session_count(&d, &key) == 1),
        "the one-shot run's session was not deleted"
    );
    delete_session(&d, &key, &id);
}

/// An agent that starts a server in the background and prints where it listens: the
/// server keeps the command's stdout open, so the daemon stops waiting for the streams
/// to end after a short grace, and keeps what they carried by then.
#[test]
fn root_exec_keeps_output_when_a_background_process_holds_the_pipes() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let started = Instant::now();
    let r = exec(
        &d,
        &key,
        &id,
        json!({"argv": ["sh", "-c", "echo listening; echo warming >&2; sleep 600 & echo late"]}),
    );
    let took = started.elapsed();
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "listening\nlate\n", "{r}");
    assert_eq!(r["stderr"], "warming\n", "{r}");
    assert!(
        took < Duration::from_secs(60),
        "waited for the background process: {took:?}"
    );
    // The background process is not the exec's to end: it runs on.
    let comms = process_names(&d, &key, &id);
    assert!(comms.lines().any(|c| c == "sleep"), "{comms}");
    delete_session(&d, &key, &id);
}

#[test]
fn root_exec_output_is_cut_at_the_output_limit_without_buffering() {
    require_root!();
    let d = daemon(&["--output-limit", "1K"]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let r = exec(
        &d,
        &key,
        &id,
        json!({"cmd": "head -c 5000 /dev/zero | tr '\\0' a; head -c 3000 /dev/zero | tr '\\0' b >&2"}),
    );
    assert_eq!(r["stdout"].as_str().unwrap(), "a".repeat(1024));
    assert_eq!(r["stderr"].as_str().unwrap(), "b".repeat(1024));
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stderr_truncated"], true);
    assert_eq!(r["exit_code"], 0);

    let before = peak_rss(d.pid());
    let started = Instant::now();
    let r = exec(&d, &key, &id, json!({"cmd": "yes | head -c 50M"}));
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1024);
    assert_eq!(r["stdout_truncated"], true);
    assert!(started.elapsed() < Duration::from_secs(20));
    let grew = peak_rss(d.pid()).saturating_sub(before);
    assert!(
        grew < 20 << 20,
        "the daemon's peak memory grew by {grew} bytes"
    );
    delete_session(&d, &key, &id);
}

/// The daemon's CPU time so far (user + system, all its threads), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which may hold spaces: utime and stime are
    // the 14th and 15th fields of the line, the 12th and 13th after it.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ, which Linux fixes at 100 for what it reports to user space.
    ticks as f64 / 100.0
}

/// Output past the limit is dropped at a bounded cost to the daemon, whose CPU no
/// session is charged for: reading floods only to drop them, the daemon spent
/// about as much CPU as the flooding commands could write (4 floods in 2 sessions,
/// 4 s: ~3 CPU-s; 15 floods slowed another tenant's `exec true` tenfold). A command
/// that prints past the limit and exits still ends at once (nothing blocks it on a
/// full pipe), and what is kept is the first `--output-limit` bytes, flagged
/// truncated.
#[test]
fn root_exec_output_past_the_limit_costs_the_daemon_little_cpu() {
    require_root!();
    // A small limit: what each answer keeps is escaped into its JSON byte by byte,
    // which in a debug build cost the daemon more CPU for 1 MiB of NULs than all the
    // dropping this measures.
    let d = daemon(&["--output-limit", "64K"]);
    let key = d.admin_key().to_string();
    let ids = [
        sid(&create(&d, &key, json!({}))),
        sid(&create(&d, &key, json!({}))),
    ];
    let started = Instant::now();
    let r = exec(
        &d,
        &key,
        &ids[0],
        json!({"cmd": "head -c 48M /dev/zero; echo done >&2"}),
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"].as_str().unwrap(), "\0".repeat(64 << 10));
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stderr"], "done\n");
    assert_eq!(r["stderr_truncated"], false);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let before = cpu_seconds(d.pid());
    std::thread::scope(|scope| {
        let floods: Vec<_> = [&ids[0], &ids[0], &ids[1], &ids[1]]
            .into_iter()
            .map(|id| {
                let (d, key) = (&d, &key);
                scope.spawn(move || {
                    exec(
                        d,
                        key,
                        id,
                        json!({"cmd": "cat /dev/zero", "timeout_ms": 4000}),
                    )
                })
            })
            .collect();
        for flood in floods {
            let r = flood.join().unwrap();
            assert_eq!(r["timed_out"], true, "{r}");
            assert_eq!(r["stdout"].as_str().unwrap().len(), 64 << 10);
            assert_eq!(r["stdout_truncated"], true);
        }
    });
    let cpu = cpu_seconds(d.pid()) - before;
    eprintln!("daemon CPU for 4 floods of 4 s: {cpu:.2} s");
    assert!(
        cpu < 1.5,
        "the daemon spent {cpu:.2} CPU-s dropping 4 floods of 4 s"
    );
    for id in &ids {
        delete_session(&d, &key, id);
    }
}

#[test]
fn root_exec_reports_oom_killed() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({"limits": {"memory": "64M"}})));
    let r = exec(
        &d,
        &key,
        &id,
        json!({"argv": ["python3", "-c", "b = b'x' * (200 * 1024 * 1024); print(len(b))"]}),
    );
    assert_eq!(r["oom_killed"], true, "{r}");
    assert_eq!(r["exit_code"], Value::Null, "{r}");
    assert_eq!(r["signal"], 9, "{r}");
    // The session lives on.
    assert_eq!(sh(&d, &key, &id, "echo alive"), "alive\n");
    delete_session(&d, &key, &id);
}

#[test]
fn root_a_session_over_its_lock_budget_loses_the_processes_holding_them() {
    require_root!();
    // Record locks are kernel memory no cgroup is charged for (a 64 MiB sandbox took
    // 1.5 GB of the host's with them): a session may hold one per 4 KiB of its memory
    // limit, 16,384 here, and the daemon kills its processes that hold locks when it
    // holds more.
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({"limits": {"memory": "64M"}})));
    let take = |locks: u32, hold: u32| {
        json!({"argv": ["python3", "-c", format!(
            "import fcntl, time\n\
             files = []\n\
             for i in range({locks}):\n\
             \x20   if i % 2000 == 0: files.append(open(f'/tmp/l{{i}}', 'w'))\n\
             \x20   fcntl.lockf(files[-1], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * (i % 2000))\n\
             print('locked', flush=True)\n\
             time.sleep({hold})\n\
             print('held')"
        )], "timeout_ms": 60_000})
    };
    // Within the budget, held past several counts: nothing happens.
    let r = exec(&d, &key, &id, take(10_000, 2));
    assert_eq!(r["stdout"], "locked\nheld\n", "{r}");
    assert_eq!(r["file_locks_exceeded"], false, "{r}");
    // Over it: killed within a count or two, and told why.
    let started = std::time::Instant::now();
    let r = exec(&d, &key, &id, take(40_000, 55));
    // Killed while it takes them or once it holds them.
    assert!(!r["stdout"].as_str().unwrap().contains("held"), "{r}");
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["file_locks_exceeded"], true, "{r}");
    assert_eq!(r["oom_killed"], false, "{r}");
    // Taking the locks needs a second or two; held to the end, it takes 55 s.
    assert!(started.elapsed() < Duration::from_secs(45), "{r}");
    // The session lives on, and the kill is in the audit and the metrics (written
    // just after the kill, which the exec may have answered first).
    assert_eq!(sh(&d, &key, &id, "echo alive"), "alive\n");
    let audit = format!("/v1/audit?session_id={id}&action=session.file_locks_exceeded");
    let mut found = Value::Null;
    assert!(
        common::eventually(60_000, || {
            found = d.request("GET", &audit, Some(&key), None).1;
            found["events"][0].is_object()
        }),
        "{found}"
    );
    let event = &found["events"][0];
    assert_eq!(event["detail"]["budget"], 16_384, "{found}");
    assert!(
        event["detail"]["held"].as_u64().unwrap() > 16_384,
        "{found}"
    );
    assert_eq!(
        event["detail"]["killed"].as_array().unwrap().len(),
        1,
        "{found}"
    );
    let metrics =
        || String::from_utf8_lossy(&d.raw("GET", "/metrics", None, None, None).1).into_owned();
    assert!(
        common::eventually(60_000, || metrics()
            .lines()
            .any(|l| l == "brig_file_lock_kills_total 1")),
        "{}",
        metrics()
    );
    delete_session(&d, &key, &id);
}

#[test]
fn root_exec_stream_sends_output_as_it_comes_then_exit() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    // The command cannot end before the test, having read its first chunk, lets it.
    let mut events = sse_post(
        &d,
        &key,
        &format!("/v1/sessions/{id}/exec/stream"),
        json!({"cmd": "echo first; while [ ! -e /workspace/go ]; do sleep 0.02; done; \
                       echo second >&2; echo third; exit 4"}),
    );
    let (event, data) = events.next().expect("a first event");
    assert_eq!(
        (event.as_str(), &data),
        ("stdout", &json!({"data": "first\n"}))
    );
    put_file(&d, &key, &id, "/workspace/go");
    let rest: Vec<_> = events.collect();
    let names: Vec<_> = rest.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names.last(), Some(&"exit"), "{rest:?}");
    let out: String = rest
        .iter()
        .filter(|(e, _)| e == "stdout")
        .map(|(_, d)| d["data"].as_str().unwrap())
        .collect();
    let err: String = rest
        .iter()
        .filter(|(e, _)| e == "stderr")
        .map(|(_, d)| d["data"].as_str().unwrap())
        .collect();
    assert_eq!((out.as_str(), err.as_str()), ("third\n", "second\n"));
    let exit = &rest.last().unwrap().1;
    assert_eq!(exit["exit_code"], 4, "{exit}");
    assert_eq!(exit["timed_out"], false);
    assert!(exit.get("stdout").is_none());
    delete_session(&d, &key, &id);
}
