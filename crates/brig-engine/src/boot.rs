//! Starting the engine: everything before a front end may call a verb, in order,
//! and the background work of a started engine. Front ends call these rather than
//! repeat the order, which matters (the admin key before sessions, orphans swept
//! before sessions re-attach).

use std::time::Duration;

use anyhow::Context;

use crate::auth::DEFAULT_TENANT;
use crate::config::Config;
use crate::state::{AppState, Shared};

/// Everything before serving, in order: validate the settings, create the data dir
/// (0700), open the database, create the admin key on first start, clean up after
/// interrupted uploads, start the live sessions. The state is then complete.
pub async fn start(args: Config) -> anyhow::Result<AppState> {
    args.validate()?;
    // Takes the data dir's lock: a daemon refused it says that one line and nothing else.
    let state = Shared::new(args).await?;
    let sysctl = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
    };
    let host_tables = state.args.host_table_warnings(
        sysctl("/proc/sys/kernel/pid_max"),
        sysctl("/proc/sys/fs/file-max"),
    );
    for warning in host_tables {
        tracing::warn!("{warning}");
    }
    if state.args.no_auth {
        tracing::warn!(
            listen = %state.args.listen,
            "--no-auth: requests without an API key are served as tenant \"{DEFAULT_TENANT}\""
        );
        state
            .db
            .ensure_tenant(DEFAULT_TENANT)
            .await
            .map_err(|e| anyhow::anyhow!("cannot create tenant {DEFAULT_TENANT}: {}", e.message))?;
    }
    state.auth.bootstrap_admin(&state.data_dir).await?;
    crate::filestore::sweep_orphans(&state).await?;
    crate::volumes::sweep(&state).await;
    crate::sessions::snapshots::remove_orphans(&state).await?;
    let sessions = crate::sessions::Sessions::start(&state)
        .await
        .context("cannot start sessions")?;
    if state.sessions.set(sessions).is_err() {
        anyhow::bail!("sessions were started twice");
    }
    // Said now rather than only to the first client of /v1/execute, which gets 503.
    let (store, image) = (state.args.store.clone(), state.args.default_image.clone());
    let problem =
        tokio::task::spawn_blocking(move || crate::execute::default_image_problem(&store, &image))
            .await?;
    let builds = state.args.build_default_image
        && (state.args.default_image_recipe.is_some() || state.args.default_image == "python");
    match problem {
        // Said by the build as it starts (`spawn_default_image_build`).
        Some(_) if builds => {}
        Some(problem) => {
            tracing::warn!("/v1/execute will answer 503 until this is fixed: {problem}")
        }
        None => {}
    }
    Ok(state)
}

/// Builds the default image in the background if it is missing (see
/// [`crate::default_image`]): `brig serve`'s, not every front end's (an in-process
/// MCP server runs no `/v1/execute`).
pub async fn spawn_default_image_build(state: &AppState) {
    crate::default_image::spawn_build(state).await;
}

/// Starts the background work of a started state: session tasks, file expiry
/// (every `expiry_interval`), metrics upkeep, the catalog's upkeep, audit retention.
pub fn spawn_background(state: &AppState, expiry_interval: Duration) {
    crate::egress::spawn_writer(state);
    crate::sessions::Sessions::spawn_tasks(state);
    crate::filestore::spawn_expiry(state, expiry_interval);
    state.metrics.spawn_upkeep();
    state.db.spawn_upkeep();
    crate::audit::spawn_retention(state);
    crate::audit::spawn_refusal_summaries(state);
    crate::volumes::spawn_idle_unmount(state);
}

/// What a stopping daemon does once it serves no more requests. Live sessions
/// outlive it, by design; pooled sandboxes belong to no session, and none does.
pub async fn stop(state: &AppState) {
    crate::sessions::pool::drain(state).await;
    crate::volumes::unmount_unused(state).await;
    crate::audit::write_refusal_summaries(state).await;
    let backend = state.backend.clone();
    let _ = tokio::task::spawn_blocking(move || backend.shutdown()).await;
}
