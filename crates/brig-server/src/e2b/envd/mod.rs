//! envd, the in-sandbox daemon of E2B, answered by brig's daemon: the process and
//! filesystem services over Connect (JSON codec, unary and streams, HTTP/1.1),
//! `/files`, `/health`. Nothing of E2B runs inside the sandbox: every call is a
//! verb of brig's engine on the session named by `E2b-Sandbox-Id`.
//!
//! What it implements is what envd [`super::ENVD_VERSION`] promises the SDK:
//! stdin on request (0.3.0), the default user (0.4.0), CloseStdin (0.5.2) and
//! octet-stream uploads (0.5.7), recursive directory watches (0.1.4, by polling:
//! [`watch`]). Not: file metadata (0.6.2, xattrs), watch events with entries
//! promised (0.6.3; given when asked all the same), PTYs (`unimplemented`), other
//! users than the sandbox's.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use base64::Engine;
use brig_engine::state::AppState;

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod watch;

use connect::{Code, ConnectError};

/// The sandbox's one user, as E2B names it (its home is the call's
/// [`crate::e2b::SandboxCall::home`]).
pub const USER: &str = "user";

/// The routes of port 49983.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/Start", any(process::start))
        .route("/process.Process/Connect", any(process::connect))
        .route("/process.Process/List", any(process::list))
        .route("/process.Process/SendInput", any(process::send_input))
        .route("/process.Process/StreamInput", any(process::stream_input))
        .route("/process.Process/SendSignal", any(process::send_signal))
        .route("/process.Process/CloseStdin", any(process::close_stdin))
        .route("/process.Process/Update", any(process::update))
        .route("/filesystem.Filesystem/Stat", any(filesystem::stat))
        .route("/filesystem.Filesystem/MakeDir", any(filesystem::make_dir))
        .route("/filesystem.Filesystem/Move", any(filesystem::move_entry))
        .route("/filesystem.Filesystem/ListDir", any(filesystem::list_dir))
        .route("/filesystem.Filesystem/Remove", any(filesystem::remove))
        .route("/filesystem.Filesystem/WatchDir", any(watch::watch_dir))
        .route(
            "/filesystem.Filesystem/CreateWatcher",
            any(watch::create_watcher),
        )
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            any(watch::get_watcher_events),
        )
        .route(
            "/filesystem.Filesystem/RemoveWatcher",
            any(watch::remove_watcher),
        )
        .fallback(connect::unknown_procedure)
}

/// envd's health: 204, no body.
async fn health() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(header::CACHE_CONTROL, "no-store")],
    )
        .into_response()
}

/// What a user asked for comes to.
pub enum UserCheck {
    Ok,
    /// root, which brig never grants a sandbox's caller.
    Root(String),
    /// A name the sandbox does not have.
    Unknown(String),
}

/// Checks the user a call asks to act as (`None`: the default, the sandbox's).
pub fn user_of(name: Option<&str>) -> UserCheck {
    match name {
        None | Some("") | Some(USER) => UserCheck::Ok,
        Some("root") => UserCheck::Root(format!(
            "brig runs everything in a sandbox as its user '{USER}': root cannot be granted"
        )),
        Some(other) => UserCheck::Unknown(format!("invalid username: '{other}'")),
    }
}

/// The user of an RPC: HTTP basic auth with the user name (and no password).
pub fn check_user(headers: &HeaderMap) -> Result<(), ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(());
    };
    let name = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .map(|s| s.split(':').next().unwrap_or_default().to_string());
    let Some(name) = name else {
        return Err(ConnectError::new(
            Code::Unauthenticated,
            "Authorization must be Basic with the user's name",
        ));
    };
    match user_of(Some(&name)) {
        UserCheck::Ok => Ok(()),
        UserCheck::Root(message) => Err(ConnectError::new(Code::PermissionDenied, message)),
        UserCheck::Unknown(message) => Err(ConnectError::new(Code::Unauthenticated, message)),
    }
}

/// A path as envd resolves it for the user whose home is `home`: empty is the
/// home, `~` expands to it, relative paths are relative to it; the result is
/// cleaned (`.`, `..`, repeated slashes) like Go's `filepath.Join`. Resolution
/// inside the sandbox's root is the engine's.
pub fn resolve_path(path: &str, home: &str) -> Result<String, ConnectError> {
    let joined = if path.is_empty() || path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('~') {
        return Err(ConnectError::invalid(format!(
            "failed to expand path '{path}' for user '{USER}': cannot expand user-specific home dir"
        )));
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_as_envd_does() {
        let home = "/home/user";
        assert_eq!(resolve_path("", home).unwrap(), "/home/user");
        assert_eq!(resolve_path("~", home).unwrap(), "/home/user");
        assert_eq!(resolve_path("~/a/b", home).unwrap(), "/home/user/a/b");
        assert_eq!(resolve_path("a/./b/", home).unwrap(), "/home/user/a/b");
        assert_eq!(resolve_path("../../../etc", home).unwrap(), "/etc");
        assert_eq!(resolve_path("/tmp//x/..", home).unwrap(), "/tmp");
        assert_eq!(resolve_path("f", "/workspace").unwrap(), "/workspace/f");
        assert!(resolve_path("~root/x", home).is_err());
    }

    #[test]
    fn users_are_the_sandboxs_only() {
        let basic = |s: &str| {
            let mut h = HeaderMap::new();
            let v = base64::engine::general_purpose::STANDARD.encode(s);
            h.insert(header::AUTHORIZATION, format!("Basic {v}").parse().unwrap());
            h
        };
        assert!(check_user(&HeaderMap::new()).is_ok());
        assert!(check_user(&basic("user:")).is_ok());
        assert_eq!(
            check_user(&basic("root:")).unwrap_err().code,
            Code::PermissionDenied
        );
        assert_eq!(
            check_user(&basic("mallory:")).unwrap_err().code,
            Code::Unauthenticated
        );
    }
}
