//! envd's `filesystem.Filesystem` service over brig's file verbs
//! (`brig_engine::sessions::{entries, files}`): every path is the sandbox's,
//! resolved inside its root by the engine.
//! Watching is [`super::watch`]'s.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use brig_engine::fault::ErrorCode;
use brig_engine::rootfs::{EntryKind, EntryStat};
use brig_engine::sessions::{entries, files};
use brig_engine::state::AppState;

use super::connect::{self, Code, ConnectError, Unary};
use super::{check_user, resolve_path, USER};
use crate::e2b::SandboxCall;

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct PathRequest {
    path: String,
    depth: Option<u32>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct MoveRequest {
    source: String,
    destination: String,
}

fn kind_name(kind: Option<EntryKind>) -> &'static str {
    match kind {
        Some(EntryKind::File) => "FILE_TYPE_FILE",
        Some(EntryKind::Directory) => "FILE_TYPE_DIRECTORY",
        Some(EntryKind::Symlink) => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    }
}

/// Go's `FileMode.String()` of an entry (`-rw-r--r--`, `drwxr-xr-x`,
/// `Lrwxrwxrwx`, `dtrwxrwxrwx` for a sticky directory).
pub fn permissions(kind: EntryKind, mode: u32) -> String {
    let mut out = String::new();
    match kind {
        EntryKind::Directory => out.push('d'),
        EntryKind::Symlink => out.push('L'),
        EntryKind::Other => out.push('?'),
        EntryKind::File => {}
    }
    if mode & 0o4000 != 0 {
        out.push('u');
    }
    if mode & 0o2000 != 0 {
        out.push('g');
    }
    if mode & 0o1000 != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    out
}

/// An owner as envd names it: the sandbox's user, root, or the number.
fn owner(is_user: bool, id: u32) -> String {
    if is_user {
        USER.to_string()
    } else if id == 0 {
        "root".to_string()
    } else {
        id.to_string()
    }
}

fn timestamp(seconds: i64, nanos: u32) -> String {
    let Ok(time) = time::OffsetDateTime::from_unix_timestamp(seconds) else {
        return String::new();
    };
    let time = time.replace_nanosecond(nanos).unwrap_or(time);
    time.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// envd's `EntryInfo` of `path` (as the caller should see it).
pub fn entry_info(path: &str, stat: &EntryStat) -> Value {
    let name = match path.trim_end_matches('/').rsplit('/').next() {
        Some("") | None => "/",
        Some(name) => name,
    };
    // envd types a symlink by what it leads to, with that one's mode.
    let (kind, mode) = match stat.kind {
        EntryKind::Symlink => (stat.target_kind, stat.target_mode.unwrap_or(0)),
        kind => (Some(kind), stat.mode),
    };
    let mut info = json!({
        "name": name,
        "type": kind_name(kind),
        "path": path,
        "size": stat.size_bytes.to_string(),
        "mode": mode & 0o777,
        "permissions": permissions(stat.kind, stat.mode),
        "owner": owner(stat.owned_by_user, stat.uid),
        "group": owner(stat.group_of_user, stat.gid),
        "modifiedTime": timestamp(stat.modified, stat.modified_nsec),
    });
    if stat.kind == EntryKind::Symlink {
        // envd gives the link's own path when its target does not resolve.
        info["symlinkTarget"] = json!(stat.target.clone().unwrap_or_else(|| path.to_string()));
    }
    info
}

fn not_found_as(e: brig_engine::fault::Error, what: &str) -> ConnectError {
    if e.code == ErrorCode::NoSuchFile {
        return ConnectError::not_found(format!("{what}: {}", e.message));
    }
    e.into()
}

async fn entry_of(state: &AppState, call: &SandboxCall, path: &str) -> Result<Value, ConnectError> {
    let stat = entries::stat(state, &call.caller, &call.session_id, path)
        .await
        .map_err(|e| not_found_as(e, "file not found"))?;
    Ok(entry_info(path, &stat))
}

fn answer(result: Result<Value, ConnectError>) -> Response {
    match result {
        Ok(value) => connect::unary(&value),
        Err(e) => e.into_response(),
    }
}

pub async fn stat(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<PathRequest>,
) -> Response {
    answer(
        async {
            check_user(&request.headers)?;
            let path = resolve_path(&request.message.path, &call.home)?;
            Ok(json!({"entry": entry_of(&state, &call, &path).await?}))
        }
        .await,
    )
}

pub async fn make_dir(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<PathRequest>,
) -> Response {
    answer(
        async {
            check_user(&request.headers)?;
            let path = resolve_path(&request.message.path, &call.home)?;
            match entries::make_dir(&state, &call.caller, &call.session_id, &path).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!("directory already exists: {path}"),
                    ))
                }
                Err(e) if e.code == ErrorCode::AlreadyExists => {
                    return Err(ConnectError::invalid(format!(
                        "path already exists but it is not a directory: {path}"
                    )))
                }
                Err(e) => return Err(e.into()),
            }
            Ok(json!({"entry": entry_of(&state, &call, &path).await?}))
        }
        .await,
    )
}

pub async fn move_entry(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<MoveRequest>,
) -> Response {
    answer(
        async {
            check_user(&request.headers)?;
            let source = resolve_path(&request.message.source, &call.home)?;
            let destination = resolve_path(&request.message.destination, &call.home)?;
            entries::rename(
                &state,
                &call.caller,
                &call.session_id,
                &source,
                &destination,
            )
            .await
            .map_err(|e| not_found_as(e, "source file not found"))?;
            Ok(json!({"entry": entry_of(&state, &call, &destination).await?}))
        }
        .await,
    )
}

pub async fn list_dir(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<PathRequest>,
) -> Response {
    answer(
        async {
            check_user(&request.headers)?;
            let path = resolve_path(&request.message.path, &call.home)?;
            let depth = request.message.depth.unwrap_or(0).max(1);
            let found = entries::walk(&state, &call.caller, &call.session_id, &path, depth)
                .await
                .map_err(|e| match e.code {
                    ErrorCode::NoSuchFile => {
                        ConnectError::not_found(format!("directory not found: {}", e.message))
                    }
                    ErrorCode::NotADirectory => {
                        ConnectError::invalid(format!("path is not a directory: {path}"))
                    }
                    _ => e.into(),
                })?;
            let list: Vec<Value> = found.iter().map(|e| entry_info(&e.path, &e.stat)).collect();
            Ok(json!({"entries": list}))
        }
        .await,
    )
}

pub async fn remove(
    State(state): State<AppState>,
    Extension(call): Extension<SandboxCall>,
    request: Unary<PathRequest>,
) -> Response {
    answer(
        async {
            check_user(&request.headers)?;
            let path = resolve_path(&request.message.path, &call.home)?;
            // envd removes like os.RemoveAll: what is not there is removed.
            match files::remove(&state, &call.caller, &call.session_id, &path, true).await {
                Ok(()) => Ok(json!({})),
                Err(e) if e.code == ErrorCode::NoSuchFile => Ok(json!({})),
                Err(e) => Err(e.into()),
            }
        }
        .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_as_gos_file_mode() {
        assert_eq!(permissions(EntryKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(EntryKind::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(EntryKind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(EntryKind::Directory, 0o1777), "dtrwxrwxrwx");
        assert_eq!(permissions(EntryKind::File, 0o4755), "urwxr-xr-x");
    }

    #[test]
    fn entries_carry_envds_fields() {
        let stat = EntryStat {
            kind: EntryKind::Symlink,
            mode: 0o777,
            size_bytes: 5,
            uid: 4242,
            gid: 0,
            owned_by_user: true,
            group_of_user: false,
            modified: 1_700_000_000,
            modified_nsec: 5,
            target: Some("/home/user/f".into()),
            target_kind: Some(EntryKind::File),
            target_mode: Some(0o644),
        };
        let info = entry_info("/home/user/link", &stat);
        assert_eq!(info["name"], "link");
        assert_eq!(info["type"], "FILE_TYPE_FILE");
        assert_eq!(info["size"], "5");
        assert_eq!(info["mode"], 0o644);
        assert_eq!(info["permissions"], "Lrwxrwxrwx");
        assert_eq!(
            (&info["owner"], &info["group"]),
            (&json!("user"), &json!("root"))
        );
        assert_eq!(info["symlinkTarget"], "/home/user/f");
        assert_eq!(info["modifiedTime"], "2023-11-14T22:13:20.000000005Z");
        assert_eq!(entry_info("/", &stat)["name"], "/");
    }
}
