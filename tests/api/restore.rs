//! Restores racing deletes, snapshots, uploads and the restored sandbox's
//! processes.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::daemon::Daemon;
use crate::support::{
    create, daemon, delete_session, delete_snapshot, error_code, files_url, restore, sandboxes,
    session_ids, sh, sid, take_snapshot, tar_end, tar_entry, tenant_key, tenant_usage,
};
use serde_json::{json, Value};

/// Fills the audit log with `rows` events of `tenant`, written straight into the
/// daemon's database, so that a search of them that matches none (see
/// [`slow_audit_searches`]) scans them all.
fn fill_audit(data_dir: &Path, tenant: &str, rows: i64) {
    let conn = rusqlite::Connection::open(data_dir.join("brig.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2)
         INSERT INTO audit (time, tenant, action, detail, outcome)
         SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ?1, 'test.filler', '{}', 'ok' FROM n",
        rusqlite::params![tenant, rows],
    )
    .unwrap();
}

/// `n` audit searches that match nothing, started at once: they hold every
/// connection of the daemon's database pool while they scan, so a request that
/// needs the pool waits behind them (one that writes through the daemon's own quick
/// connection, as DELETE of a session does, does not).
fn slow_audit_searches<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    d: &'s Daemon,
    key: &'s str,
    n: usize,
) -> Vec<std::thread::ScopedJoinHandle<'s, u16>> {
    (0..n)
        .map(|_| {
            scope.spawn(move || {
                d.request(
                    "GET",
                    "/v1/audit?outcome=no_such_outcome&limit=10",
                    Some(key),
                    None,
                )
                .0
            })
        })
        .collect()
}

/// A restore racing a DELETE of its session: the restore found the session, then
/// waited (for the snapshot's row, behind a busy database pool; for the session's
/// gate) while the delete ran. Whatever the order, a deleted session stays deleted:
/// no sandbox is left for it, it counts for nothing in its tenant's usage, and a
/// restarted daemon brings nothing back. Before the fix the restore started a
/// sandbox after the delete had finished and wrote the deleted row back: the sandbox
/// ran on, unlisted and unreaped, and the next start re-attached the session.
#[test]
fn root_a_restore_racing_a_delete_never_brings_the_session_back() {
    require_root!();
    let dir = tempfile::Builder::new()
        .prefix("restore-delete-")
        .tempdir()
        .unwrap();
    let (data, store) = (dir.path().join("data"), dir.path().join("store"));
    let args = ["--default-image", "host"];
    let mut d = Daemon::start_in(&data, &store, &args);
    let (key, _) = tenant_key(&d, "racer");
    let origin = sid(&create(&d, &key, json!({})));
    sh(&d, &key, &origin, "echo restored > /workspace/f");
    let (status, snap) = take_snapshot(&d, &key, &origin);
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    delete_session(&d, &key, &origin);
    fill_audit(&data, "racer", 400_000);
    // How long the restore waits for the pool, roughly: the delays below spread
    // the delete over that wait, the launch after it, and beyond.
    let started = Instant::now();
    std::thread::scope(|scope| {
        for search in slow_audit_searches(scope, &d, &key, 4) {
            assert_eq!(search.join().unwrap(), 200);
        }
    });
    let scan = started.elapsed();
    let mut outcomes = BTreeSet::new();
    let mut deleted = Vec::new();
    for round in 0..16u32 {
        let id = sid(&create(&d, &key, json!({})));
        let (restored, removed) = std::thread::scope(|scope| {
            let searches = slow_audit_searches(scope, &d, &key, 12);
            std::thread::sleep(Duration::from_millis(30));
            let restore = scope.spawn(|| restore(&d, &key, &id, &json!(snap_id)));
            std::thread::sleep(Duration::from_millis(20) + scan * round / 4);
            let removed = d.request("DELETE", &format!("/v1/sessions/{id}"), Some(&key), None);
            for search in searches {
                search.join().unwrap();
            }
            (restore.join().unwrap(), removed)
        });
        assert_eq!(removed.0, 204, "round {round}: {}", removed.1);
        assert!(
            restored.0 == 200 || restored.0 == 404,
            "round {round}: restore answered {} {}",
            restored.0,
            restored.1
        );
        outcomes.insert(restored.0);
        assert!(!session_ids(&d, &key, "").contains(&id), "round {round}");
        deleted.push(id);
    }
    eprintln!("restores answered {outcomes:?} (audit scan {scan:?})");
    // No sandbox of a deleted session is left (the daemon has no other session).
    common::eventually(60_000, || sandboxes(&d).is_empty());
    assert_eq!(
        sandboxes(&d),
        BTreeSet::new(),
        "sandboxes of deleted sessions"
    );
    assert_eq!(tenant_usage(&d, "racer")["sessions"], 0);
    let rows: i64 = rusqlite::Connection::open(data.join("brig.db"))
        .unwrap()
        .query_row("SELECT COUNT(*) FROM sessions", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 0, "rows of deleted sessions");
    // A restarted daemon re-attaches nothing.
    d.stop();
    drop(d);
    let d = Daemon::start_in(&data, &store, &args);
    d.remember_key(&key);
    assert_eq!(session_ids(&d, &key, ""), BTreeSet::new());
    assert_eq!(sandboxes(&d), BTreeSet::new());
    assert_eq!(tenant_usage(&d, "racer")["sessions"], 0);
    let (status, body) = d.request(
        "DELETE",
        &format!("/v1/snapshots/{snap_id}"),
        Some(&key),
        None,
    );
    assert_eq!(status, 204, "{body}");
    drop(d);
    for id in &deleted {
        assert!(!data.join("sessions").join(id).exists(), "{id}'s directory");
    }
    // The snapshot's layer was mounted in the store for the restores.
    let gc = common::brig()
        .args(["image", "gc", "--unmount", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(gc.status.success(), "{gc:?}");
}

/// A background process started before a restore ended with the sandbox the restore
/// replaced, and says so (killed, signal 9): `wait` answers at once, a signal is a
/// no-op (204) as for any ended process, and the restored sandbox's processes get
/// ids of their own, so an old id never reports a new command. Before the fix the
/// old process stayed `running` forever, a signal to it was 404, and the restored
/// sandbox's first process took id 1 again, overwriting the old one's row.
#[test]
fn root_processes_end_with_the_sandbox_a_restore_replaces_and_ids_are_not_reused() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    let base = format!("/v1/sessions/{id}/processes");
    let start = |cmd: &str| -> u64 {
        let (status, p) = d.request("POST", &base, Some(&key), Some(json!({ "cmd": cmd })));
        assert_eq!(status, 201, "{p}");
        p["process_id"].as_u64().unwrap()
    };
    // Waits of up to 10 minutes: the check below that a wait for an ended process
    // does not wait stays far below it.
    let wait = |pid: u64| -> Value {
        let (status, p) = d.request(
            "POST",
            &format!("{base}/{pid}/wait?timeout_ms=600000"),
            Some(&key),
            None,
        );
        assert_eq!(status, 200, "{p}");
        p
    };
    let restore = || {
        let (status, body) = restore(&d, &key, &id, &json!(snap["snapshot_id"]));
        assert_eq!(status, 200, "{body}");
    };
    let done = start("echo done");
    assert_eq!(wait(done)["exit_code"], 0);
    let sleeper = start("sleep 1000");
    restore();

    let (status, old) = d.request("GET", &format!("{base}/{sleeper}"), Some(&key), None);
    assert_eq!(status, 200, "{old}");
    assert_eq!(
        (&old["state"], &old["signal"], &old["exit_code"]),
        (&json!("exited"), &json!(9), &Value::Null),
        "{old}"
    );
    assert!(old["ended_at"].is_string(), "{old}");
    let waited = Instant::now();
    assert_eq!(wait(sleeper)["state"], "exited");
    assert!(waited.elapsed() < Duration::from_secs(60));
    let (status, body) = d.request(
        "POST",
        &format!("{base}/{sleeper}/signal"),
        Some(&key),
        Some(json!({"signal": "TERM"})),
    );
    assert_eq!(status, 204, "{body}");

    let fresh = start("echo new; exit 3");
    assert!(
        fresh > sleeper && fresh > done,
        "{fresh} after {done} and {sleeper}"
    );
    assert_eq!(wait(fresh)["exit_code"], 3);
    let (_, old) = d.request("GET", &format!("{base}/{sleeper}"), Some(&key), None);
    assert_eq!(
        (&old["argv"][2], &old["signal"]),
        (&json!("sleep 1000"), &json!(9)),
        "{old}"
    );
    let (_, first) = d.request("GET", &format!("{base}/{done}"), Some(&key), None);
    assert_eq!(
        (&first["argv"][2], &first["exit_code"]),
        (&json!("echo done"), &json!(0))
    );
    let (status, out) = d.raw(
        "GET",
        &format!("{base}/{fresh}/output"),
        Some(&key),
        None,
        None,
    );
    assert_eq!((status, &out[..]), (200, &b"new\n"[..]));

    // The next restore numbers on after every id used so far, and a process of the
    // restored sandbox is signalled, not mistaken for an old one.
    let running = start("sleep 1000");
    restore();
    let later = start("sleep 1000");
    assert!(later > running, "{later} after {running}");
    let (status, _) = d.request(
        "POST",
        &format!("{base}/{later}/signal"),
        Some(&key),
        Some(json!({"signal": "KILL"})),
    );
    assert_eq!(status, 204);
    assert_eq!(wait(later)["signal"], 9);
    let (_, list) = d.request("GET", &base, Some(&key), None);
    let states: Vec<(u64, String)> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["process_id"].as_u64().unwrap(),
                p["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(states.len(), 5, "{list}");
    assert!(states.iter().all(|(_, state)| state == "exited"), "{list}");
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &snap);
}

/// A snapshot asked for while a restore of the session runs waits for it and is a
/// snapshot of the restored session. Before the fix it took the sandbox the restore
/// was replacing and answered 409 "the session's sandbox is not reachable".
#[test]
fn root_a_snapshot_during_a_restore_is_of_the_restored_session() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let limits = json!({"memory": "1G", "disk": "1G"});
    let id = sid(&create(&d, &key, json!({ "limits": limits })));
    // Large enough that a restore copying it in takes a while.
    sh(
        &d,
        &key,
        &id,
        "yes brig | head -c 300M > /workspace/big && echo restored > /workspace/mark",
    );
    let (status, big) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{big}");
    for round in 0..3u64 {
        sh(
            &d,
            &key,
            &id,
            &format!("echo round{round} > /workspace/mark"),
        );
        let (restored, snapshot) = std::thread::scope(|scope| {
            let restore = scope.spawn(|| restore(&d, &key, &id, &json!(big["snapshot_id"])));
            std::thread::sleep(Duration::from_millis(100 + 50 * round));
            let snapshot = take_snapshot(&d, &key, &id);
            (restore.join().unwrap(), snapshot)
        });
        assert_eq!(restored.0, 200, "round {round}: {}", restored.1);
        assert_eq!(snapshot.0, 201, "round {round}: {}", snapshot.1);
        let fork = sid(&create(
            &d,
            &key,
            json!({"snapshot": snapshot.1["snapshot_id"], "limits": limits}),
        ));
        assert_eq!(sh(&d, &key, &fork, "cat /workspace/mark"), "restored\n");
        delete_session(&d, &key, &fork);
        delete_snapshot(&d, &key, &snapshot.1);
    }
    assert_eq!(sh(&d, &key, &id, "cat /workspace/mark"), "restored\n");
    delete_session(&d, &key, &id);
    delete_snapshot(&d, &key, &big);
}

/// A request body sent in two parts: the first at once, the rest once `release`
/// gets a message (or after a minute). `sent` is told when the first part is out.
struct HeldBody {
    first: std::io::Cursor<Vec<u8>>,
    rest: std::io::Cursor<Vec<u8>>,
    sent: Option<std::sync::mpsc::Sender<()>>,
    release: std::sync::mpsc::Receiver<()>,
}

impl Read for HeldBody {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.first.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        if let Some(sent) = self.sent.take() {
            let _ = sent.send(());
            let _ = self.release.recv_timeout(Duration::from_secs(60));
        }
        self.rest.read(buf)
    }
}

/// Uploads `first` + `rest` to `path` (a PUT), holding the rest back until `between`
/// has run; the upload's answer.
fn upload_around(
    d: &Daemon,
    key: &str,
    (id, path): (&str, &str),
    content_type: Option<&str>,
    (first, rest): (Vec<u8>, Vec<u8>),
    between: impl FnOnce(),
) -> (u16, Value) {
    let (sent_tx, sent_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let body = HeldBody {
        first: std::io::Cursor::new(first),
        rest: std::io::Cursor::new(rest),
        sent: Some(sent_tx),
        release: release_rx,
    };
    std::thread::scope(|scope| {
        let upload = scope.spawn(move || {
            let response = d.send(
                "PUT",
                path,
                Some(key),
                content_type,
                ureq::SendBody::from_owned_reader(body),
            );
            let (status, bytes) = common::daemon::read_whole(response).unwrap();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        });
        sent_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        // The premise: the daemon has begun writing the file (its temporary file is
        // there) before `between` runs.
        assert!(
            common::eventually(60_000, || !sh(
                d,
                key,
                id,
                "find /workspace -name '.brig-tmp-*'"
            )
            .is_empty()),
            "the upload never began"
        );
        between();
        release_tx.send(()).unwrap();
        upload.join().unwrap()
    })
}

/// An upload that spans a restore of its session, or its delete, is not answered
/// 201 for a file the session does not have: 409 (restored meanwhile: the file went
/// to the replaced sandbox) or 404 (deleted). Uploads hold no lock the restore or
/// delete waits for: both finish while the upload is still being sent. Before the
/// fix each answered 201 with the file nowhere.
#[test]
fn root_an_upload_spanning_a_restore_or_delete_is_not_answered_as_written() {
    require_root!();
    let d = daemon(&[]);
    let key = d.admin_key().to_string();
    let id = sid(&create(&d, &key, json!({})));
    let (status, snap) = take_snapshot(&d, &key, &id);
    assert_eq!(status, 201, "{snap}");
    let restore = || {
        let (status, body) = restore(&d, &key, &id, &json!(snap["snapshot_id"]));
        assert_eq!(status, 200, "{body}");
    };
    let parts = (vec![b'a'; 64 << 10], vec![b'b'; 64 << 10]);

    let (status, body) = upload_around(
        &d,
        &key,
        (&id, &files_url(&id, "/workspace/up")),
        None,
        parts.clone(),
        restore,
    );
    assert_eq!((status, error_code(&body)), (409, "conflict"), "{body}");
    let (status, _) = d.raw(
        "GET",
        &files_url(&id, "/workspace/up"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 404);

    let mut tar = Vec::new();
    tar_entry(
        &mut tar,
        "x/inner",
        tar::EntryType::Regular,
        "",
        &[b'c'; 300 << 10],
    );
    tar_end(&mut tar);
    let rest = tar.split_off(2048);
    let (status, body) = upload_around(
        &d,
        &key,
        (
            &id,
            &format!("/v1/sessions/{id}/archive?path=/workspace/arch"),
        ),
        Some("application/x-tar"),
        (tar, rest),
        restore,
    );
    assert_eq!((status, error_code(&body)), (409, "conflict"), "{body}");
    let (status, _) = d.raw(
        "GET",
        &files_url(&id, "/workspace/arch/x/inner"),
        Some(&key),
        None,
        None,
    );
    assert_eq!(status, 404);

    // Not spanning anything, an upload is written as ever.
    let (status, body) = upload_around(
        &d,
        &key,
        (&id, &files_url(&id, "/workspace/up")),
        None,
        parts.clone(),
        || {},
    );
    assert_eq!(status, 201, "{body}");
    let (status, got) = d.raw(
        "GET",
        &files_url(&id, "/workspace/up"),
        Some(&key),
        None,
        None,
    );
    assert_eq!((status, got.len()), (200, 128 << 10));

    let (status, body) = upload_around(
        &d,
        &key,
        (&id, &files_url(&id, "/workspace/late")),
        None,
        parts,
        || delete_session(&d, &key, &id),
    );
    assert_eq!((status, error_code(&body)), (404, "not_found"), "{body}");
    delete_snapshot(&d, &key, &snap);
}
