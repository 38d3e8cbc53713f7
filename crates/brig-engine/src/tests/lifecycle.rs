//! A session's life: the pool, the reaper, pause and resume, a sandbox that ends by
//! itself, restore and fork against deletes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{caller, code, engine, eventually, Engine};
use crate::backend::fake::number_of;
use crate::sessions::{self, CreateSession, SessionLimits};

fn gone(e: &Engine, id: &str) -> bool {
    e.state.sessions().get(id).is_none()
}

#[tokio::test]
async fn a_plain_create_takes_a_pooled_sandbox_and_one_with_limits_does_not() {
    let e = engine(|c| c.pool = vec![("host".into(), 1)]).await;
    let pool = &e.state.sessions().pool;
    assert!(
        eventually(Duration::from_secs(5), || pool.sizes()
            == vec![("host".into(), 1)])
        .await,
        "the pool never filled"
    );
    let limited = CreateSession {
        limits: Some(SessionLimits {
            pids: Some(10),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(!e.create_with("alice", limited).await.unwrap().pooled);
    let plain = e.create("alice").await.unwrap();
    assert!(plain.pooled);
    // The pooled sandbox works as the session's.
    let out = e.sh("alice", &plain.session_id, "echo hi").await.unwrap();
    assert_eq!(out.stdout, "hi\n");
}

#[tokio::test]
async fn the_reaper_ends_a_session_at_its_ttl_and_audits_it_as_the_daemon() {
    let e = engine(|_| {}).await;
    let request = CreateSession {
        ttl_seconds: Some(1),
        ..Default::default()
    };
    let id = e.create_with("alice", request).await.unwrap().session_id;
    assert!(eventually(Duration::from_secs(5), || gone(&e, &id)).await);
    assert_eq!(e.fake.alive(), 0, "its sandbox was not destroyed");
    let expired = e.audited("session.expire").await;
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].detail["reason"], "ttl");
    assert_eq!(expired[0].frontend, "daemon");
    assert_eq!(expired[0].tenant, "alice");
}

#[tokio::test]
async fn the_reaper_ends_an_idle_session_but_not_a_paused_one() {
    let e = engine(|_| {}).await;
    let idle = CreateSession {
        ttl_seconds: Some(60),
        idle_timeout_seconds: Some(1),
        ..Default::default()
    };
    let id = e
        .create_with("alice", idle.clone())
        .await
        .unwrap()
        .session_id;
    let paused = e.create_with("alice", idle).await.unwrap().session_id;
    sessions::set_paused(&e.state, &caller("alice"), &paused, true)
        .await
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || gone(&e, &id)).await);
    let expired = e.audited("session.expire").await;
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].detail["reason"], "idle");
    assert!(!gone(&e, &paused), "a paused session was reaped as idle");
}

#[tokio::test]
async fn a_paused_session_refuses_execs_is_stored_paused_and_resumes() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    let paused = sessions::set_paused(&e.state, &caller("alice"), &id, true)
        .await
        .unwrap();
    assert_eq!(paused.state, "paused");
    assert_eq!(code(e.sh("alice", &id, "echo no").await), "conflict");
    let rows = e.state.db.stored_sessions().await.unwrap();
    let row = rows.iter().find(|r| r.id == id).unwrap();
    assert_eq!(row.state, "paused");
    assert_eq!(row.backend, "fake");
    let resumed = sessions::set_paused(&e.state, &caller("alice"), &id, false)
        .await
        .unwrap();
    assert_eq!(resumed.state, "running");
    assert_eq!(
        e.sh("alice", &id, "echo yes").await.unwrap().stdout,
        "yes\n"
    );
}

#[tokio::test]
async fn a_pause_that_cannot_freeze_leaves_the_session_running() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    e.fake.knobs.fail_freeze.store(true, Ordering::SeqCst);
    let _ = sessions::set_paused(&e.state, &caller("alice"), &id, true).await;
    e.fake.knobs.fail_freeze.store(false, Ordering::SeqCst);
    let info = sessions::get_session(&e.state, &caller("alice"), &id).unwrap();
    assert_eq!(info.state, "running");
}

#[tokio::test]
async fn a_sandbox_that_ends_by_itself_ends_its_session() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    let session = e.state.sessions().get(&id).unwrap();
    e.fake.kill(number_of(&*session.sandbox()).unwrap());
    assert!(eventually(Duration::from_secs(5), || gone(&e, &id)).await);
    let exited = e.audited("session.exited").await;
    assert_eq!(exited.len(), 1);
    assert_eq!(exited[0].frontend, "daemon");
}

#[tokio::test]
async fn a_restore_racing_a_delete_never_brings_the_session_back() {
    let e = Arc::new(engine(|_| {}).await);
    let id = e.create("alice").await.unwrap().session_id;
    let snapshot = e.stored_snapshot("alice", &id).await;
    e.fake.knobs.launch_delay_ms.store(300, Ordering::SeqCst);
    let restore = {
        let (e, id) = (e.clone(), id.clone());
        tokio::spawn(async move {
            sessions::snapshots::restore(&e.state, &caller("alice"), &id, &snapshot).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    sessions::delete_session(&e.state, &caller("alice"), &id)
        .await
        .unwrap();
    let _ = restore.await.unwrap();
    assert!(gone(&e, &id));
    assert_eq!(
        code(sessions::get_session(&e.state, &caller("alice"), &id)),
        "not_found"
    );
    assert!(
        eventually(Duration::from_secs(2), || e.fake.alive() == 0).await,
        "{} sandboxes left running",
        e.fake.alive()
    );
    let rows = e.state.db.stored_sessions().await.unwrap();
    assert!(rows.is_empty(), "rows left: {rows:?}");
}

/// The other order: a restore that found the session waits for its gate (an exec
/// holds it) while a delete ends the session; once it has the gate it must answer
/// 404 and start nothing.
#[tokio::test]
async fn a_restore_that_waited_out_a_delete_answers_not_found() {
    let e = Arc::new(engine(|_| {}).await);
    let id = e.create("alice").await.unwrap().session_id;
    let snapshot = e.stored_snapshot("alice", &id).await;
    let session = e.state.sessions().get(&id).unwrap();
    let exec = session.gate.read().await;
    let restore = {
        let (e, id) = (e.clone(), id.clone());
        tokio::spawn(async move {
            sessions::snapshots::restore(&e.state, &caller("alice"), &id, &snapshot).await
        })
    };
    // Queued on the gate before the delete is.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let delete = {
        let (e, id) = (e.clone(), id.clone());
        tokio::spawn(async move { sessions::delete_session(&e.state, &caller("alice"), &id).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || session
            .deleted
            .load(Ordering::SeqCst))
        .await
    );
    drop(exec);
    assert_eq!(code(restore.await.unwrap()), "not_found");
    delete.await.unwrap().unwrap();
    assert_eq!(
        e.fake.knobs.launched.load(Ordering::SeqCst),
        1,
        "the restore launched"
    );
    assert_eq!(e.fake.alive(), 0);
}

#[tokio::test]
async fn a_restore_numbers_processes_after_the_replaced_sandboxs() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    let start = crate::sessions::processes::StartProcess {
        cmd: Some("sleep 60".into()),
        argv: None,
        cwd: None,
        env: None,
    };
    let first = sessions::processes::start(&e.state, &caller("alice"), &id, &start)
        .await
        .unwrap();
    let snapshot = e.stored_snapshot("alice", &id).await;
    sessions::snapshots::restore(&e.state, &caller("alice"), &id, &snapshot)
        .await
        .unwrap();
    let second = sessions::processes::start(&e.state, &caller("alice"), &id, &start)
        .await
        .unwrap();
    assert!(second.process_id > first.process_id);
    let old = sessions::processes::get(&e.state, &caller("alice"), &id, first.process_id)
        .await
        .unwrap();
    assert_eq!(old.state, "exited", "{old:?}");
}

#[tokio::test]
async fn a_fork_of_a_snapshot_being_deleted_fails_whole() {
    let e = Arc::new(engine(|_| {}).await);
    let id = e.create("alice").await.unwrap().session_id;
    let snapshot = e.stored_snapshot("alice", &id).await;
    let held = sessions::Held::Snapshot {
        tenant: "alice".into(),
        id: snapshot.clone(),
    };
    let _closing = e.state.holds.close(held).await;
    let fork = CreateSession {
        snapshot: Some(snapshot),
        ..Default::default()
    };
    let launched = e.fake.knobs.launched.load(Ordering::SeqCst);
    assert_eq!(code(e.create_with("alice", fork).await), "not_found");
    assert_eq!(e.fake.knobs.launched.load(Ordering::SeqCst), launched);
    assert_eq!(e.state.sessions().usage("alice").sessions, 1);
}

/// A snapshot deleted while a fork of it starts: the delete waits for the fork's
/// sandbox (which needs the snapshot's image until it runs), and the fork lives.
#[tokio::test]
async fn a_snapshot_delete_waits_for_the_fork_under_way() {
    let e = Arc::new(engine(|_| {}).await);
    let id = e.create("alice").await.unwrap().session_id;
    let snapshot = e.stored_snapshot("alice", &id).await;
    e.fake.knobs.launch_delay_ms.store(300, Ordering::SeqCst);
    let fork = {
        let (e, snapshot) = (e.clone(), snapshot.clone());
        tokio::spawn(async move {
            let request = CreateSession {
                snapshot: Some(snapshot),
                ..Default::default()
            };
            let made = e.create_with("alice", request).await;
            (made, tokio::time::Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deleted = sessions::snapshots::delete(&e.state, &caller("alice"), &snapshot).await;
    let deleted_at = tokio::time::Instant::now();
    let (made, made_at) = fork.await.unwrap();
    let forked = made.expect("the fork under way failed");
    deleted.unwrap();
    assert!(
        made_at <= deleted_at,
        "the delete did not wait for the fork"
    );
    assert!(!gone(&e, &forked.session_id));
    let again = CreateSession {
        snapshot: Some(snapshot),
        ..Default::default()
    };
    assert_eq!(code(e.create_with("alice", again).await), "not_found");
}

/// An exec running longer than the idle timeout keeps its session: a session in
/// use is not idle.
#[tokio::test]
async fn the_reaper_does_not_end_a_session_while_an_exec_runs() {
    let e = Arc::new(engine(|_| {}).await);
    let request = CreateSession {
        ttl_seconds: Some(60),
        idle_timeout_seconds: Some(1),
        ..Default::default()
    };
    let id = e.create_with("alice", request).await.unwrap().session_id;
    let out = e.sh("alice", &id, "sleep 3; echo still").await.unwrap();
    assert_eq!(out.stdout, "still\n");
    assert!(e.audited("session.expire").await.is_empty());
}

#[tokio::test]
async fn a_home_and_a_user_name_are_made_for_their_session_and_never_taken_from_the_pool() {
    let e = engine(|c| c.pool = vec![("host".into(), 1)]).await;
    let pool = &e.state.sessions().pool;
    assert!(
        eventually(Duration::from_secs(5), || pool.sizes()
            == vec![("host".into(), 1)])
        .await,
        "the pool never filled"
    );
    let request = CreateSession {
        home: Some("/home/user".into()),
        user: Some("user".into()),
        ..Default::default()
    };
    // The sandbox's spec: the link (made on the host's system dirs) and the name.
    let limits = sessions::limits_of(&request).unwrap();
    let spec = sessions::spec_for(&e.state, "alice", &request, &limits).unwrap();
    assert_eq!(spec.filesystem.workspace_links, ["/home/user"]);
    assert_eq!(spec.identity.user_name(), "user");
    let info = e.create_with("alice", request).await.unwrap();
    assert!(!info.pooled, "a pooled sandbox has no home link");
    let session = e.state.sessions().get(&info.session_id).unwrap();
    let entries = sessions::files::with_root(&session, |root| {
        root.list_dir("/home")
            .map_err(sessions::files::rootfs_error)
    })
    .await
    .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "user");
    assert_eq!(entries[0].kind.as_str(), "directory");

    // A home where the root's own directories are is refused, and nothing starts.
    let before = e.state.sessions().count();
    for bad in [
        CreateSession {
            home: Some("/usr/user".into()),
            ..Default::default()
        },
        CreateSession {
            user: Some("Not:A:Name".into()),
            ..Default::default()
        },
    ] {
        assert_eq!(code(e.create_with("alice", bad).await), "invalid_request");
    }
    assert_eq!(e.state.sessions().count(), before);
}

#[tokio::test]
async fn sessions_made_within_a_second_list_in_the_order_they_were_made() {
    let e = engine(|_| {}).await;
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(e.create("alice").await.unwrap().session_id);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let listed: Vec<String> = sessions::list_sessions(&e.state, &caller("alice"), &[])
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, made);
}

#[tokio::test]
async fn a_session_asked_to_pause_at_its_ttl_is_paused_and_kept() {
    let e = engine(|_| {}).await;
    let request = CreateSession {
        ttl_seconds: Some(1),
        pause_at_expiry: Some(3600),
        ..Default::default()
    };
    let id = e.create_with("alice", request).await.unwrap().session_id;
    let session = e.state.sessions().get(&id).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || session
            .paused
            .load(Ordering::SeqCst))
        .await,
        "never paused"
    );
    assert!(!gone(&e, &id));
    let info = sessions::get_session(&e.state, &caller("alice"), &id).unwrap();
    let ends = sessions::parse_rfc3339(info.expires_at.as_deref().unwrap()).unwrap();
    assert!(ends - sessions::unix_now() > 3000, "{info:?}");
    let paused = e.audited("session.pause").await;
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].frontend, "daemon");
    assert!(e.audited("session.expire").await.is_empty());
    // Resumed, it runs again; a bad keep is refused.
    sessions::set_paused(&e.state, &caller("alice"), &id, false)
        .await
        .unwrap();
    assert_eq!(e.sh("alice", &id, "echo hi").await.unwrap().stdout, "hi\n");
    let bad = CreateSession {
        pause_at_expiry: Some(0),
        ..Default::default()
    };
    assert_eq!(code(e.create_with("alice", bad).await), "invalid_request");
}
