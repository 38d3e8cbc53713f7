//! The engine's own tests: the verbs driven directly (no HTTP), over the fake
//! backend (`backend::fake`), so they need no root. Each test holds one guarantee.

mod admission;
mod exec;
mod isolation;
mod lifecycle;
mod restart;

use std::sync::Arc;
use std::time::Duration;

use crate::auth::{Caller, Frontend};
use crate::backend::fake::Fake;
use crate::config::Config;
use crate::db::{AuditFilter, AuditRow};
use crate::fault::Error;
use crate::sessions::exec::{ExecRequest, ExecResult};
use crate::sessions::{CreateSession, SessionInfo, Sessions};
use crate::state::{AppState, Shared};

/// A started engine over a fake backend, in a temporary data dir.
pub struct Engine {
    pub state: AppState,
    pub fake: Arc<Fake>,
    _dir: tempfile::TempDir,
}

/// An engine with `tweak`ed settings, its sessions started and its background
/// work (reaper, pool) running; tenants `alice` and `bob` exist.
pub async fn engine(tweak: impl FnOnce(&mut Config)) -> Engine {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().join("data"),
        store: dir.path().join("store"),
        ..Config::default()
    };
    tweak(&mut config);
    start(config, Fake::new(), dir).await
}

/// Starts an engine on `config` over `fake` (as `server::start` does, minus what
/// needs root); `dir` holds its data dir.
pub async fn start(config: Config, fake: Arc<Fake>, dir: tempfile::TempDir) -> Engine {
    let state = Shared::with_backend(config, fake.clone()).await.unwrap();
    for tenant in ["alice", "bob"] {
        state.db.ensure_tenant(tenant).await.unwrap();
    }
    let sessions = Sessions::start(&state).await.unwrap();
    assert!(state.sessions.set(sessions).is_ok());
    Sessions::spawn_tasks(&state);
    Engine {
        state,
        fake,
        _dir: dir,
    }
}

pub fn caller(tenant: &str) -> Caller {
    caller_via(tenant, Frontend::Rest)
}

pub fn caller_via(tenant: &str, frontend: Frontend) -> Caller {
    Caller {
        tenant: tenant.to_string(),
        key_id: Some(format!("key_{tenant}")),
        admin: false,
        frontend,
    }
}

impl Engine {
    pub async fn create(&self, tenant: &str) -> Result<SessionInfo, Error> {
        self.create_with(tenant, CreateSession::default()).await
    }

    pub async fn create_with(
        &self,
        tenant: &str,
        request: CreateSession,
    ) -> Result<SessionInfo, Error> {
        crate::sessions::create_session(&self.state, &caller(tenant), request).await
    }

    pub async fn sh(&self, tenant: &str, id: &str, cmd: &str) -> Result<ExecResult, Error> {
        let request = ExecRequest {
            cmd: Some(cmd.to_string()),
            ..Default::default()
        };
        crate::sessions::exec::exec(&self.state, &caller(tenant), id, &request)
            .await
            .map(|(result, _permit)| result)
    }

    /// A snapshot row for `session_id` of `tenant` (the fake takes no real snapshots:
    /// a restore or fork of it only launches a sandbox from its name).
    pub async fn stored_snapshot(&self, tenant: &str, session_id: &str) -> String {
        let id = format!("snap_{}", crate::auth::random_hex(12));
        let row = crate::db::SnapshotRow {
            id: id.clone(),
            tenant: tenant.to_string(),
            name: None,
            session_id: session_id.to_string(),
            image: String::new(),
            created_at: crate::db::now_rfc3339(),
            size_bytes: 0,
            mounts: "[]".to_string(),
            network: None,
            layers: Vec::new(),
        };
        self.state
            .db
            .insert_snapshot_within(row, 0, u64::MAX)
            .await
            .unwrap();
        id
    }

    /// Every audit event, oldest first.
    pub async fn audit(&self) -> Vec<AuditRow> {
        let filter = AuditFilter {
            limit: 10_000,
            ..Default::default()
        };
        let mut rows = self.state.db.audit_events(filter).await.unwrap();
        rows.sort_by_key(|r| r.id);
        rows
    }

    /// Events of `action`.
    pub async fn audited(&self, action: &str) -> Vec<AuditRow> {
        let mut rows = self.audit().await;
        rows.retain(|r| r.action == action);
        rows
    }
}

/// Waits up to `limit` for `check` to hold.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

pub fn code(result: Result<impl std::fmt::Debug, Error>) -> &'static str {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(e) => e.code.as_str(),
    }
}
