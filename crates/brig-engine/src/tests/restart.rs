//! A restarted daemon: what it re-attaches to, and what it cleans up. The first
//! engine keeps running (its tasks hold its state), so the second starts on a copy
//! of its database, over the same fake sandboxes.

use std::sync::Arc;

use super::{caller, engine, start, Engine};
use crate::backend::fake::number_of;
use crate::config::Config;
use crate::sessions;

#[tokio::test]
async fn a_restarted_engine_reattaches_its_live_sandboxes_and_cleans_up_the_rest() {
    let first = engine(|_| {}).await;
    let live = first.create("alice").await.unwrap().session_id;
    let paused = first.create("alice").await.unwrap().session_id;
    sessions::set_paused(&first.state, &caller("alice"), &paused, true)
        .await
        .unwrap();
    let dead = first.create("alice").await.unwrap().session_id;
    let foreign = first.create("bob").await.unwrap().session_id;
    // Saved before the sandbox ends: the first engine would delete its row.
    let dead_sandbox = number_of(&*first.state.sessions().get(&dead).unwrap().sandbox()).unwrap();
    let second = {
        let copy = restarted_copy(&first).await;
        first.fake.kill(dead_sandbox);
        set_backend_in(&copy, &foreign, "gvisor");
        copy.start().await
    };

    let sessions = second.state.sessions();
    assert_eq!(sessions.get(&live).unwrap().info().state, "running");
    assert_eq!(sessions.get(&paused).unwrap().info().state, "paused");
    assert!(
        sessions.get(&dead).is_none(),
        "a dead sandbox was re-attached"
    );
    assert!(
        sessions.get(&foreign).is_none(),
        "another backend's row was re-attached"
    );
    let rows = second.state.db.stored_sessions().await.unwrap();
    let ids: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.id.as_str(), r.backend.as_str()))
        .collect();
    assert!(!ids.iter().any(|(id, _)| *id == dead), "{ids:?}");
    assert!(ids.contains(&(foreign.as_str(), "gvisor")), "{ids:?}");
    // The re-attached session runs commands in the sandbox it had.
    let out = second.sh("alice", &live, "echo again").await.unwrap();
    assert_eq!(out.stdout, "again\n");
}

/// A copy of `first`'s data dir, not yet started.
struct Copy {
    dir: tempfile::TempDir,
    fake: Arc<crate::backend::fake::Fake>,
}

async fn restarted_copy(first: &Engine) -> Copy {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for name in ["brig.db", "brig.db-wal", "brig.db-shm"] {
        let from = first.state.data_dir.join(name);
        if from.exists() {
            std::fs::copy(from, data.join(name)).unwrap();
        }
    }
    Copy {
        dir,
        fake: first.fake.clone(),
    }
}

fn set_backend_in(copy: &Copy, id: &str, kind: &str) {
    let db = rusqlite::Connection::open(copy.dir.path().join("data/brig.db")).unwrap();
    let n = db
        .execute(
            "UPDATE sessions SET backend = ?2 WHERE id = ?1",
            rusqlite::params![id, kind],
        )
        .unwrap();
    assert_eq!(n, 1);
}

impl Copy {
    async fn start(self) -> Engine {
        let config = Config {
            data_dir: self.dir.path().join("data"),
            store: self.dir.path().join("store"),
            ..Config::default()
        };
        start(config, self.fake, self.dir).await
    }
}
