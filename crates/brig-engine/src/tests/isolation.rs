//! Tenant isolation of every verb on a session, and the audit each verb writes.

use super::{caller, caller_via, code, engine, Engine};
use crate::auth::{Caller, Frontend};
use crate::fault::Error;
use crate::sessions::{self, exec, files, processes, snapshots, stats, UpdateSession};

/// A tar archive with no entries.
static EMPTY_TAR: [u8; 1024] = [0; 1024];

fn outcome<T>(result: Result<T, Error>) -> String {
    match result {
        Ok(_) => "ok".to_string(),
        Err(e) => e.code.as_str().to_string(),
    }
}

/// A streamed exec, read to its end.
async fn streamed(e: &Engine, c: &Caller, id: &str, run: &exec::ExecRequest) -> Result<(), Error> {
    use futures_util::StreamExt;
    let events = exec::stream(&e.state, c, id, run).await?;
    events.collect::<Vec<_>>().await;
    Ok(())
}

/// A download read to its end, as a client that wants it does (one dropped
/// unread is audited a second time, as abandoned).
async fn downloaded(download: Result<files::Download, Error>) -> Result<(), Error> {
    let mut download = download?;
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut download, &mut bytes)
        .await
        .map_err(Error::internal)?;
    Ok(())
}

/// Every verb on a session, called as `c`, each with its outcome ("ok" or the
/// error's code).
async fn every_verb(e: &Engine, c: &Caller, id: &str) -> Vec<(&'static str, String)> {
    let state = &e.state;
    let run = exec::ExecRequest {
        cmd: Some("echo hi".into()),
        ..Default::default()
    };
    let start = processes::StartProcess {
        cmd: Some("sleep 60".into()),
        argv: None,
        cwd: None,
        env: None,
    };
    let update = UpdateSession {
        ttl_seconds: Some(600),
        ..Default::default()
    };
    let (file, dir) = ("/workspace/f.txt", "/workspace/d");
    let text = std::io::Cursor::new(&b"x"[..]);
    let tar = std::io::Cursor::new(&EMPTY_TAR[..]);
    let no_listing = |_: files::DirListing, _: &mut dyn std::io::Write| Ok(());
    let mut all = vec![
        ("get", outcome(sessions::get_session(state, c, id))),
        (
            "update",
            outcome(sessions::update_session(state, c, id, update).await),
        ),
        ("exec", outcome(exec::exec(state, c, id, &run).await)),
        ("exec.stream", outcome(streamed(e, c, id, &run).await)),
        (
            "write",
            outcome(files::write(state, c, id, file, text).await),
        ),
        ("read", outcome(files::read(state, c, id, file).await)),
        (
            "list",
            outcome(downloaded(files::list(state, c, id, "/workspace", no_listing).await).await),
        ),
        ("mkdir", outcome(files::mkdir(state, c, id, dir).await)),
        (
            "write archive",
            outcome(files::write_archive(state, c, id, dir, tar).await),
        ),
        (
            "read archive",
            outcome(downloaded(files::read_archive(state, c, id, dir).await).await),
        ),
        (
            "remove",
            outcome(files::remove(state, c, id, dir, false).await),
        ),
    ];
    // Of the process just started, when it could be.
    let started = processes::start(state, c, id, &start).await;
    let pid = started.as_ref().map_or(1, |p| p.process_id);
    let term = serde_json::json!("TERM");
    all.extend([
        ("start", outcome(started)),
        ("processes", outcome(processes::list(state, c, id).await)),
        ("process", outcome(processes::get(state, c, id, pid).await)),
        (
            "output",
            outcome(processes::output(state, c, id, pid, None, 0).await),
        ),
        (
            "signal",
            outcome(processes::signal(state, c, id, pid, &term).await),
        ),
        (
            "wait",
            outcome(processes::wait(state, c, id, pid, Some(10)).await),
        ),
        ("stats", outcome(stats::session_stats(state, c, id).await)),
        (
            "snapshot",
            outcome(snapshots::create(state, c, id, None).await),
        ),
        (
            "restore",
            outcome(snapshots::restore(state, c, id, "snap_none").await),
        ),
        (
            "pause",
            outcome(sessions::set_paused(state, c, id, true).await),
        ),
        (
            "resume",
            outcome(sessions::set_paused(state, c, id, false).await),
        ),
        (
            "delete",
            outcome(sessions::delete_session(state, c, id).await),
        ),
    ]);
    all
}

#[tokio::test]
async fn another_tenants_session_is_not_found_by_any_verb() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    for (verb, outcome) in every_verb(&e, &caller("bob"), &id).await {
        assert_eq!(outcome, "not_found", "bob's {verb} of alice's session");
    }
    // Untouched: still there, running, its files as they were.
    let alice = caller("alice");
    let info = sessions::get_session(&e.state, &alice, &id).unwrap();
    assert_eq!(info.state, "running");
    let read = files::read(&e.state, &alice, &id, "/workspace/f.txt").await;
    assert_eq!(code(read), "no_such_file");
    let bobs = sessions::list_sessions(&e.state, &caller("bob"), &[]).unwrap();
    assert!(bobs.is_empty());
}

/// Each verb, called through one front end, writes one audit event naming it (reads
/// of state, such as `get` or `stats`, write none).
#[tokio::test]
async fn every_verb_is_audited_once_with_its_front_end() {
    let e = engine(|_| {}).await;
    let mcp = caller_via("alice", Frontend::Mcp);
    let created = sessions::create_session(&e.state, &mcp, Default::default())
        .await
        .unwrap();
    let id = created.session_id;
    let outcomes = every_verb(&e, &mcp, &id).await;
    let events = e.audit().await;
    let expected = [
        ("session.create", "ok"),
        ("session.update", "ok"),
        ("exec", "ok"),
        ("exec.stream", "ok"),
        ("file.write", "ok"),
        ("file.read", "ok"),
        ("file.list", "ok"),
        ("file.mkdir", "ok"),
        ("file.archive.write", "ok"),
        ("file.archive.read", "ok"),
        ("file.delete", "ok"),
        ("process.start", "ok"),
        ("process.signal", "ok"),
        // The fake takes no snapshots: refused, and audited as such.
        ("snapshot.create", "conflict"),
        ("session.restore", "not_found"),
        ("session.pause", "ok"),
        ("session.resume", "ok"),
        ("session.delete", "ok"),
    ];
    let seen: Vec<(&str, &str)> = events
        .iter()
        .map(|r| (r.action.as_str(), r.outcome.as_str()))
        .collect();
    assert_eq!(seen, expected, "verbs: {outcomes:?}");
    for event in &events {
        assert_eq!(event.frontend, "mcp", "{event:?}");
        assert_eq!(event.tenant, "alice");
        assert_eq!(event.session_id.as_deref(), Some(id.as_str()));
    }
}

#[tokio::test]
async fn another_tenants_snapshot_is_not_found_by_any_verb() {
    let e = engine(|_| {}).await;
    let alices = e.create("alice").await.unwrap().session_id;
    let bobs = e.create("bob").await.unwrap().session_id;
    let snapshot = e.stored_snapshot("alice", &alices).await;
    let bob = caller("bob");
    assert_eq!(
        code(snapshots::get(&e.state, &bob, &snapshot).await),
        "not_found"
    );
    assert!(snapshots::list(&e.state, &bob).await.unwrap().is_empty());
    let restore = snapshots::restore(&e.state, &bob, &bobs, &snapshot).await;
    assert_eq!(code(restore), "not_found");
    let fork = sessions::CreateSession {
        snapshot: Some(snapshot.clone()),
        ..Default::default()
    };
    assert_eq!(code(e.create_with("bob", fork).await), "not_found");
    let delete = snapshots::delete(&e.state, &bob, &snapshot).await;
    assert_eq!(code(delete), "not_found");
    snapshots::get(&e.state, &caller("alice"), &snapshot)
        .await
        .expect("still alice's");
}
