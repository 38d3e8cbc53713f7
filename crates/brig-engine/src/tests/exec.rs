//! Exec as the engine runs it: timeouts, output limits, the daemon's caps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{caller, code, engine, eventually};
use crate::sessions::exec::{self, ExecRequest};

#[tokio::test]
async fn an_exec_past_its_timeout_is_killed_and_says_so() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    let request = ExecRequest {
        cmd: Some("echo started; sleep 30".into()),
        timeout_ms: Some(200),
        ..Default::default()
    };
    let began = Instant::now();
    let (result, _) = exec::exec(&e.state, &caller("alice"), &id, &request)
        .await
        .unwrap();
    assert!(result.timed_out, "{result:?}");
    assert_eq!(result.signal, Some(libc::SIGKILL));
    assert_eq!(result.stdout, "started\n");
    assert!(began.elapsed() < Duration::from_secs(5));
    let fake = e.fake.clone();
    assert!(eventually(Duration::from_secs(2), || fake.running() == 0).await);
}

#[tokio::test]
async fn output_past_the_limit_is_cut_and_flagged() {
    let e = engine(|c| c.output_limit_bytes = 8).await;
    let id = e.create("alice").await.unwrap().session_id;
    let result = e
        .sh("alice", &id, "echo 0123456789abcdef; echo tail >&2")
        .await;
    let result = result.unwrap();
    assert_eq!(result.stdout, "01234567");
    assert!(result.stdout_truncated);
    assert_eq!(result.stderr, "tail\n");
    assert!(!result.stderr_truncated);
}

#[tokio::test]
async fn execs_past_the_daemons_concurrent_cap_are_unavailable() {
    let e = Arc::new(engine(|c| c.max_concurrent_execs = 1).await);
    let alice = e.create("alice").await.unwrap().session_id;
    let bob = e.create("bob").await.unwrap().session_id;
    let running = {
        let (e, id) = (e.clone(), alice.clone());
        tokio::spawn(async move { e.sh("alice", &id, "sleep 1").await })
    };
    let fake = e.fake.clone();
    assert!(eventually(Duration::from_secs(5), || fake.running() == 1).await);
    assert_eq!(code(e.sh("bob", &bob, "echo no").await), "unavailable");
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn exit_codes_and_unknown_commands_come_back_as_they_ended() {
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    let exited = e.sh("alice", &id, "echo a; exit 3; echo b").await.unwrap();
    assert_eq!((exited.exit_code, exited.stdout.as_str()), (Some(3), "a\n"));
    let unknown = e.sh("alice", &id, "frobnicate").await.unwrap();
    assert_eq!(unknown.exit_code, Some(127));
}

#[tokio::test]
async fn a_drained_pool_leaves_no_sandbox() {
    let e = engine(|c| c.pool = vec![("host".into(), 2)]).await;
    let pool = &e.state.sessions().pool;
    assert!(
        eventually(Duration::from_secs(5), || pool.sizes()
            == vec![("host".into(), 2)])
        .await
    );
    e.state.begin_shutdown();
    crate::sessions::pool::drain(&e.state).await;
    assert_eq!(e.fake.alive(), 0);
    let rows = e.state.db.stored_sessions().await.unwrap();
    assert!(rows.is_empty(), "pool rows left: {rows:?}");
}

/// A client that hangs up on a streamed exec: the command is killed with the
/// request (it is bound to it) and the exec audited as abandoned.
#[tokio::test]
async fn a_dropped_stream_kills_its_command_and_is_audited_as_abandoned() {
    use futures_util::StreamExt;
    let e = engine(|_| {}).await;
    let id = e.create("alice").await.unwrap().session_id;
    let request = ExecRequest {
        cmd: Some("echo started; sleep 30".into()),
        ..Default::default()
    };
    let mut events = Box::pin(
        exec::stream(&e.state, &caller("alice"), &id, &request)
            .await
            .unwrap(),
    );
    assert!(events.next().await.is_some(), "no output");
    assert_eq!(e.fake.running(), 1);
    drop(events);
    let fake = e.fake.clone();
    assert!(eventually(Duration::from_secs(5), || fake.running() == 0).await);
    let mut abandoned = Vec::new();
    for _ in 0..100 {
        abandoned = e.audited("exec.stream").await;
        if !abandoned.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(abandoned.len(), 1);
    assert_eq!(abandoned[0].outcome, exec::CLIENT_CLOSED);
}
