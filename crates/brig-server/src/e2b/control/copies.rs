//! Snapshots and forks: brig's snapshots of a sandbox's files, which E2B's API
//! treats as templates (a sandbox is created from one by its id).

use axum::extract::{Extension, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use brig_engine::fault::{Error, ErrorCode};
use brig_engine::sessions::{self, snapshots, CreateSession};
use brig_engine::state::AppState;

use super::extract::{self, E2bCaller, E2bError, E2bJson, E2bPath, E2bResult};
use super::{about, sandbox_json, seconds, wire, HOME, MAX_FORKS, RESUME_TIMEOUT, USER};
use crate::e2b::tokens::TokenKey;

/// `POST /sandboxes/{id}/snapshots`: brig's snapshot of the sandbox's files
/// (`memory` is not kept: sandboxes started from it start fresh). 201 with its id,
/// which `POST /sandboxes` takes as a template.
pub(super) async fn snapshot(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<wire::SnapshotRequest>,
) -> E2bResult<Response> {
    let _ = body.memory;
    let taken = snapshots::create(&state, &caller, &id, body.name)
        .await
        .map_err(about(&id))?;
    let names: Vec<String> = taken.name.iter().cloned().collect();
    let body = serde_json::json!({"snapshotID": taken.snapshot_id, "names": names});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /snapshots`: the caller's snapshots, of one sandbox if `sandboxID`.
pub(super) async fn list_snapshots(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    RawQuery(raw): RawQuery,
) -> E2bResult<Json<Vec<serde_json::Value>>> {
    let param = |wanted: &str| {
        form_urlencoded::parse(raw.as_deref().unwrap_or_default().as_bytes())
            .find(|(name, _)| name == wanted)
            .map(|(_, value)| value.into_owned())
    };
    let (sandbox, name) = (param("sandboxID"), param("name"));
    let all = snapshots::list(&state, &caller).await?;
    Ok(Json(
        all.into_iter()
            .filter(|s| sandbox.as_ref().is_none_or(|id| *id == s.session_id))
            .filter(|s| {
                name.as_ref()
                    .is_none_or(|n| *n == s.snapshot_id || s.name.as_ref() == Some(n))
            })
            .map(|s| {
                let names: Vec<String> = s.name.iter().cloned().collect();
                serde_json::json!({"snapshotID": s.snapshot_id, "names": names})
            })
            .collect(),
    ))
}

/// `DELETE /templates/{id}`: deletes a snapshot (the only templates a caller
/// makes here). 204; 404 for anything else.
pub(super) async fn delete_template(
    State(state): State<AppState>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
) -> E2bResult<StatusCode> {
    snapshots::delete(&state, &caller, &id).await.map_err(|e| {
        if e.code == ErrorCode::NotFound {
            E2bError(Error::not_found(format!("template '{id}' not found")))
        } else {
            E2bError(e)
        }
    })?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/fork`: a snapshot of the sandbox and `count` sandboxes
/// started from it (each with the source's labels and environment), then the
/// snapshot goes. 201 with one result per fork, each a sandbox or an error.
pub(super) async fn fork(
    State(state): State<AppState>,
    Extension(key): Extension<TokenKey>,
    E2bCaller(caller): E2bCaller,
    E2bPath(id): E2bPath,
    E2bJson(body): E2bJson<wire::ForkRequest>,
) -> E2bResult<Response> {
    let seconds = seconds(body.timeout.unwrap_or(RESUME_TIMEOUT), "timeout")?;
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(Error::invalid(format!("count must be between 1 and {MAX_FORKS}")).into());
    }
    let source = sessions::lookup(&state, &caller, &id).map_err(about(&id))?;
    let info = source.info();
    let taken = snapshots::create(&state, &caller, &id, None)
        .await
        .map_err(about(&id))?;
    let mut results = Vec::new();
    for _ in 0..count {
        let request = CreateSession {
            snapshot: Some(taken.snapshot_id.clone()),
            env: source.request.env.clone(),
            ttl_seconds: Some(seconds),
            idle_timeout_seconds: Some(0),
            metadata: Some(info.metadata.clone()),
            home: Some(HOME.into()),
            user: Some(USER.into()),
            ..CreateSession::default()
        };
        results.push(
            match sessions::create_session(&state, &caller, request).await {
                Ok(forked) => serde_json::json!({"sandbox": sandbox_json(&key, &forked)}),
                Err(e) => serde_json::json!({"error": {
                    "code": extract::status_of(e.code).as_u16(),
                    "message": e.message,
                }}),
            },
        );
    }
    // Each fork holds the snapshot's layers now; the snapshot itself was a means.
    if let Err(e) = snapshots::delete(&state, &caller, &taken.snapshot_id).await {
        tracing::warn!(snapshot = %taken.snapshot_id, "cannot delete a fork's snapshot: {}", e.message);
    }
    Ok((StatusCode::CREATED, Json(results)).into_response())
}
