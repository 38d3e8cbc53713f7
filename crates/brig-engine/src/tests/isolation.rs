//! Tenant isolation of every verb on a session, and the audit each verb writes.

use super::{caller, caller_via, code, engine, Engine};
use crate::auth::Frontend;
use crate::sessions::{self, exec, files, processes, snapshots, stats, UpdateSession};

fn body(text: &'static str) -> std::io::Cursor<&'static [u8]> {
    std::io::Cursor::new(text.as_bytes())
}

/// Every verb on a session, called as `tenant`, with the outcome's code ("ok").
async fn every_verb(e: &Engine, tenant: &Caller, id: &str) -> Vec<(&'static str, String)> {
    let (state, c) = (&e.state, tenant);
    let name = |r: Result<(), crate::fault::Error>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => e.code.as_str().to_string(),
    };
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
    let no_listing = |_: files::DirListing, _: &mut dyn std::io::Write| Ok(());
    let mut outcomes = vec![
        ("get", name(sessions::get_session(state, c, id).map(drop))),
        (
            "update",
            name(
                sessions::update_session(state, c, id, update)
                    .await
                    .map(drop),
            ),
        ),
        ("exec", name(exec::exec(state, c, id, &run).await.map(drop))),
        (
            "write",
            name(
                files::write(state, c, id, "/workspace/f.txt", body("x"))
                    .await
                    .map(drop),
            ),
        ),
        (
            "read",
            name(
                files::read(state, c, id, "/workspace/f.txt")
                    .await
                    .map(drop),
            ),
        ),
        (
            "list",
            name(
                files::list(state, c, id, "/workspace", no_listing)
                    .await
                    .map(drop),
            ),
        ),
        (
            "mkdir",
            name(files::mkdir(state, c, id, "/workspace/d").await),
        ),
        (
            "remove",
            name(files::remove(state, c, id, "/workspace/d", false).await),
        ),
    ];
    // Of the process just started, when it could be.
    let started = processes::start(state, c, id, &start).await;
    let pid = started.as_ref().map_or(1, |p| p.process_id);
    outcomes.extend([
        ("start", name(started.map(drop))),
        (
            "processes",
            name(processes::list(state, c, id).await.map(drop)),
        ),
        (
            "signal",
            name(processes::signal(state, c, id, pid, &serde_json::json!("TERM")).await),
        ),
        (
            "wait",
            name(processes::wait(state, c, id, pid, Some(10)).await.map(drop)),
        ),
        (
            "stats",
            name(stats::session_stats(state, c, id).await.map(drop)),
        ),
        (
            "restore",
            name(
                snapshots::restore(state, c, id, "snap_none")
                    .await
                    .map(drop),
            ),
        ),
        (
            "pause",
            name(sessions::set_paused(state, c, id, true).await.map(drop)),
        ),
        (
            "resume",
            name(sessions::set_paused(state, c, id, false).await.map(drop)),
        ),
        ("delete", name(sessions::delete_session(state, c, id).await)),
    ]);
    outcomes
}

use crate::auth::Caller;

#[tokio::test]
async fn another_tenants_session_is_not_found_by_any_verb() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    for (verb, outcome) in every_verb(&e, &caller("bob"), &id).await {
        assert_eq!(outcome, "not_found", "bob's {verb} of alice's session");
    }
    // Untouched: still there, running, its files as they were.
    let info = sessions::get_session(&e.state, &caller("alice"), &id).unwrap();
    assert_eq!(info.state, "running");
    assert_eq!(
        code(files::read(&e.state, &caller("alice"), &id, "/workspace/f.txt").await),
        "no_such_file"
    );
    assert!(sessions::list_sessions(&e.state, &caller("bob"), &[])
        .unwrap()
        .is_empty());
}

/// Each verb, called through one front end, writes one audit event naming it.
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
        ("file.write", "ok"),
        ("file.read", "ok"),
        ("file.list", "ok"),
        ("file.mkdir", "ok"),
        ("file.delete", "ok"),
        ("process.start", "ok"),
        ("process.signal", "ok"),
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
