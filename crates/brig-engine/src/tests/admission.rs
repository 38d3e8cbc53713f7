//! Admission: what a tenant and the daemon may hold at once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{code, engine, eventually};
use crate::sessions::{CreateSession, SessionLimits, Size};

fn disk(text: &str) -> CreateSession {
    CreateSession {
        limits: Some(SessionLimits {
            disk: Some(Size::Text(text.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_tenant_at_its_session_quota_is_refused_and_nothing_is_launched() {
    let e = engine(|c| c.tenant_max_sessions = 2).await;
    e.create("alice").await.unwrap();
    e.create("alice").await.unwrap();
    assert_eq!(code(e.create("alice").await), "quota_exceeded");
    assert_eq!(e.fake.knobs.launched.load(Ordering::SeqCst), 2);
    // Another tenant's quota is its own.
    e.create("bob").await.unwrap();
}

#[tokio::test]
async fn the_daemons_session_cap_is_unavailable_not_a_quota() {
    let e = engine(|c| c.max_sessions = 1).await;
    e.create("alice").await.unwrap();
    assert_eq!(code(e.create("bob").await), "unavailable");
}

/// Concurrent creates are admitted one by one: however many race for the last
/// slots (their launches slow), no more than the quota get one.
#[tokio::test]
async fn concurrent_creates_never_pass_the_session_quota() {
    let e = std::sync::Arc::new(engine(|c| c.tenant_max_sessions = 3).await);
    e.fake.knobs.launch_delay_ms.store(100, Ordering::SeqCst);
    let creates: Vec<_> = (0..10)
        .map(|_| {
            let e = e.clone();
            tokio::spawn(async move { e.create("alice").await.is_ok() })
        })
        .collect();
    let mut made = 0;
    for create in creates {
        made += usize::from(create.await.unwrap());
    }
    assert_eq!(made, 3);
    assert_eq!(e.state.sessions().usage("alice").sessions, 3);
}

#[tokio::test]
async fn a_failed_launch_gives_its_quota_slot_back() {
    let e = engine(|c| c.tenant_max_sessions = 1).await;
    e.fake.knobs.fail_launches.store(1, Ordering::SeqCst);
    assert_eq!(code(e.create("alice").await), "internal");
    assert_eq!(e.state.sessions().usage("alice").sessions, 0);
    e.create("alice").await.unwrap();
}

#[tokio::test]
async fn the_disk_quota_counts_the_disk_of_live_sessions() {
    let e = engine(|c| c.tenant_max_disk_bytes = 3 << 30).await;
    let first = e.create_with("alice", disk("2G")).await.unwrap();
    assert_eq!(
        code(e.create_with("alice", disk("2G")).await),
        "quota_exceeded"
    );
    // Freed with the session that held it.
    crate::sessions::delete_session(&e.state, &super::caller("alice"), &first.session_id)
        .await
        .unwrap();
    e.create_with("alice", disk("2G")).await.unwrap();
}

#[tokio::test]
async fn execs_past_the_tenants_concurrent_cap_are_refused() {
    let e = std::sync::Arc::new(engine(|c| c.tenant_max_concurrent_execs = 1).await);
    let id = e.create("alice").await.unwrap().session_id;
    let running = {
        let (e, id) = (e.clone(), id.clone());
        tokio::spawn(async move { e.sh("alice", &id, "sleep 1; echo done").await })
    };
    let fake = e.fake.clone();
    assert!(
        eventually(Duration::from_secs(5), || fake.running() == 1).await,
        "the first exec never started"
    );
    assert_eq!(
        code(e.sh("alice", &id, "echo second").await),
        "quota_exceeded"
    );
    assert_eq!(running.await.unwrap().unwrap().stdout, "done\n");
    // Its slot is free again, and another tenant never shared it.
    assert_eq!(
        e.sh("alice", &id, "echo again").await.unwrap().stdout,
        "again\n"
    );
}
