//! Record locks held by sessions, bounded by counting (`brig_jail::locks`): no cgroup
//! is charged for them, so without this one session could take the host's memory
//! with locks. Every `CHECK_INTERVAL` a bound of the host's count is read; only when
//! it is above the smallest budget of a running session (or cannot be read) are the
//! sessions' own locks counted, and the processes of a session over its budget that
//! hold any are killed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use brig_jail::locks::{self, Overrun};

use super::Session;
use crate::audit;
use crate::state::AppState;

pub fn spawn_watch(state: &AppState) {
    crate::state::spawn_periodic(state, locks::CHECK_INTERVAL, |state| async move {
        let sessions = state.sessions().all();
        let overruns = tokio::task::spawn_blocking(move || over_budget(sessions))
            .await
            .unwrap_or_default();
        for (session, overrun) in overruns {
            record(&state, &session, &overrun).await;
        }
    });
}

/// The running sessions over their budget, with what was killed in each.
fn over_budget(sessions: Vec<Arc<Session>>) -> Vec<(Arc<Session>, Overrun)> {
    // A paused session's processes make no locks, and a SIGKILL reaches them only
    // when they are thawed.
    let running: Vec<(Arc<Session>, u64)> = sessions
        .into_iter()
        .filter(|s| !s.paused.load(Ordering::Relaxed) && !s.deleted.load(Ordering::Relaxed))
        .filter_map(|s| s.limits.file_lock_budget().map(|budget| (s, budget)))
        .collect();
    let Some(least) = running.iter().map(|(_, budget)| *budget).min() else {
        return Vec::new();
    };
    if locks::held_on_host_at_most().is_some_and(|held| held <= least) {
        return Vec::new();
    }
    let mut overruns = Vec::new();
    for (session, budget) in running {
        let sandbox = session.sandbox();
        let Some((cgroup, init)) = sandbox.lock_scope() else {
            continue;
        };
        let started = Instant::now();
        let counted = {
            let mut next = session
                .next_lock_count
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if next.is_some_and(|at| started < at) {
                continue;
            }
            // Counted before the kill: an exec that sees its command die must
            // find the count already raised to report why (it compares it).
            let counted = locks::enforce(cgroup, init, budget, || {
                session.lock_kills.fetch_add(1, Ordering::SeqCst);
            });
            *next = Some(locks::next_count(started, started.elapsed()));
            counted
        };
        match counted {
            Ok(Some(overrun)) => overruns.push((session, overrun)),
            Ok(None) => {}
            Err(e) => tracing::warn!(session = %session.id, "counting its file locks: {e}"),
        }
    }
    overruns
}

async fn record(state: &AppState, session: &Session, overrun: &Overrun) {
    tracing::warn!(session = %session.id, "{overrun}");
    crate::metrics::file_lock_kills(overrun.killed.len() as u64);
    let killed: Vec<serde_json::Value> = overrun
        .killed
        .iter()
        .map(|h| serde_json::json!({"pid": h.pid, "locks": h.locks}))
        .collect();
    audit::record_system(
        state,
        &session.tenant,
        Some(&session.id),
        "session.file_locks_exceeded",
        serde_json::json!({"held": overrun.held, "budget": overrun.budget, "killed": killed}),
        "ok",
    )
    .await;
}
