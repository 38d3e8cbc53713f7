//! envd's directory watching (WatchDir, CreateWatcher, GetWatcherEvents,
//! RemoveWatcher) by polling: brig cannot read inotify inside a sandbox, so a
//! watch compares snapshots of the directory (`entries::snapshot`). A watcher's
//! events are what changed between two looks: GetWatcherEvents looks when it is
//! called, a WatchDir stream every [`POLL`]. Changes undone between two looks are
//! not seen, and a rename reads as a removal and a creation.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use brig_engine::fault::ErrorCode;
use brig_engine::rootfs::EntryKind;
use brig_engine::sessions::entries::{self, ChangeKind, Snapshot};
use brig_engine::state::AppState;

use super::connect::{self, Code, ConnectError, Streamed, Unary};
use super::filesystem::entry_info;
use super::{check_user, resolve_path};
use crate::e2b::SandboxCall;

/// How often a WatchDir stream looks.
const POLL: Duration = Duration::from_millis(200);
/// Watchers a daemon keeps at most (each holds a snapshot).
const MAX_WATCHERS: usize = 1024;

#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchRequest {
    path: String,
    recursive: bool,
    #[serde(alias = "include_entry")]
    include_entry: bool,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherRequest {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

struct Watcher {
    session: String,
    path: String,
    recursive: bool,
    include_entry: bool,
    last: Snapshot,
}

fn watchers() -> &'static Mutex<HashMap<String, Watcher>> {
    static WATCHERS: OnceLock<Mutex<HashMap<String, Watcher>>> = OnceLock::new();
    WATCHERS.get_or_init(Default::default)
}

fn event_type(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Create => "EVENT_TYPE_CREATE",
        ChangeKind::Write => "EVENT_TYPE_WRITE",
        ChangeKind::Remove => "EVENT_TYPE_REMOVE",
        ChangeKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// The first look: the directory must be one (envd's errors otherwise).
async fn first_look(
    state: &AppState,
    call: &SandboxCall,
    path: &str,
    recursive: bool,
) -> Result<Snapshot, ConnectError> {
    let stat = entries::stat(state, &call.caller, &call.session_id, path)
        .await
        .map_err(|e| match e.code {
            ErrorCode::NoSuchFile => ConnectError::not_found(format!("path {path} not found")),
            _ => e.into(),
        })?;
    let is_dir = stat.kind == EntryKind::Directory
        || (stat.kind == EntryKind::Symlink && stat.target_kind == Some(EntryKind::Directory));
    if !is_dir {
        return Err(ConnectError::invalid(format!(
            "path {path} not a directory"
        )));
    }
    look(state, call, path, recursive).await
}

async fn look(
    state: &AppState,
    call: &SandboxCall,
    path: &str,
    recursive: bool,
) -> Result<Snapshot, ConnectError> {
    entries::snapshot(state, &call.caller, &call.session_id, path, recursive)
        .await
        .map_err(ConnectError::from)
}

/// The events between two looks, as envd's FilesystemEvents.
async fn events(
    state: &AppState,
    call: &SandboxCall,
    path: &str,
    include_entry: bool,
    old: &Snapshot,
    new: &Snapshot,
) -> Vec<Value> {
    let mut out = Vec::new();
    for change in entries::changes(old, new) {
        let mut event = json!({"name": change.name, "type": event_type(change.kind)});
        // As envd: only for entries that are still there, best effort.
        if include_entry && change.kind != ChangeKind::Remove {
            let full = format!("{}/{}", path.trim_end_matches('/'), change.name);
            if let Ok(stat) = entries::stat(state, &call.caller, &call.session_id, &full).await {
                event["entry"] = entry_info(&full, &stat);
            }
        }
        out.push(event);
    }
    out
}

pub async fn create_watcher(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<WatchRequest>,
) -> Response {
    let result = async {
        check_user(&request.headers)?;
        let message = &request.message;
        let path = resolve_path(&message.path, &call.home)?;
        let last = first_look(&state, &call, &path, message.recursive).await?;
        let id = format!("w{}", brig_engine::auth::random_hex(8));
        let mut watchers = watchers().lock().unwrap_or_else(|e| e.into_inner());
        watchers.retain(|_, w| state.sessions().get(&w.session).is_some());
        if watchers.len() >= MAX_WATCHERS {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("this daemon keeps at most {MAX_WATCHERS} watchers: remove some"),
            ));
        }
        watchers.insert(
            id.clone(),
            Watcher {
                session: call.session_id.clone(),
                path,
                recursive: message.recursive,
                include_entry: message.include_entry,
                last,
            },
        );
        Ok(json!({"watcherId": id}))
    }
    .await;
    match result {
        Ok(body) => connect::unary(&body),
        Err(e) => e.into_response(),
    }
}

fn watcher_not_found(id: &str) -> ConnectError {
    ConnectError::not_found(format!("watcher with id {id} not found"))
}

pub async fn get_watcher_events(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<WatcherRequest>,
) -> Response {
    let id = request.message.watcher_id.clone();
    let result = async {
        let (path, recursive, include_entry, last) = {
            let watchers = watchers().lock().unwrap_or_else(|e| e.into_inner());
            let w = watchers
                .get(&id)
                .filter(|w| w.session == call.session_id)
                .ok_or_else(|| watcher_not_found(&id))?;
            (w.path.clone(), w.recursive, w.include_entry, w.last.clone())
        };
        let now = look(&state, &call, &path, recursive).await?;
        let list = events(&state, &call, &path, include_entry, &last, &now).await;
        let mut watchers = watchers().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = watchers.get_mut(&id) {
            w.last = now;
        }
        Ok::<_, ConnectError>(json!({"events": list}))
    }
    .await;
    match result {
        Ok(body) => connect::unary(&body),
        Err(e) => e.into_response(),
    }
}

pub async fn remove_watcher(
    Extension(call): Extension<SandboxCall>,
    request: Unary<WatcherRequest>,
) -> Response {
    let id = &request.message.watcher_id;
    let mut watchers = watchers().lock().unwrap_or_else(|e| e.into_inner());
    match watchers.get(id) {
        Some(w) if w.session == call.session_id => {
            watchers.remove(id);
            connect::unary(&json!({}))
        }
        _ => watcher_not_found(id).into_response(),
    }
}

pub async fn watch_dir(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Streamed<WatchRequest>,
) -> Response {
    let started = async {
        check_user(&request.headers)?;
        let path = resolve_path(&request.message.path, &call.home)?;
        let first = first_look(&state, &call, &path, request.message.recursive).await?;
        Ok::<_, ConnectError>((path, first))
    }
    .await;
    let (path, mut last) = match started {
        Ok(found) => found,
        Err(e) => return connect::stream_error(e),
    };
    let (sender, response) = connect::stream();
    let keepalive = request
        .headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let (recursive, include_entry, deadline) = (
        request.message.recursive,
        request.message.include_entry,
        request.deadline,
    );
    tokio::spawn(async move {
        if !sender.send(&json!({"start": {}})).await {
            return;
        }
        let until = deadline.map(|d| tokio::time::Instant::now() + d);
        let mut quiet = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(POLL).await;
            if sender.is_closed() {
                return;
            }
            if until.is_some_and(|u| tokio::time::Instant::now() >= u) {
                let e = ConnectError::new(
                    Code::DeadlineExceeded,
                    "the stream's deadline (Connect-Timeout-Ms) passed",
                );
                return sender.end(Some(e)).await;
            }
            let now = match look(&state, &call, &path, recursive).await {
                Ok(now) => now,
                Err(e) => return sender.end(Some(e)).await,
            };
            for event in events(&state, &call, &path, include_entry, &last, &now).await {
                if !sender.send(&json!({"filesystem": event})).await {
                    return;
                }
                quiet = tokio::time::Instant::now();
            }
            last = now;
            if keepalive.is_some_and(|k| quiet.elapsed() >= k) {
                if !sender.send(&json!({"keepalive": {}})).await {
                    return;
                }
                quiet = tokio::time::Instant::now();
            }
        }
    });
    response
}
