//! The daemon's domain error: a stable code and a one-line message, and nothing
//! about HTTP.
//!
//! Sessions, the database, quotas and file operations say *what* went wrong with an
//! [`ErrorCode`]; only a front end (brig-server's `error`) decides which status that
//! is, in one place. This is the first step of moving the domain into an engine that
//! other front ends (E2B, MCP) share, so nothing here may import axum or `http`.

use std::fmt;

/// Every code the daemon answers with. Clients match on these strings
/// (docs/API.md), so a variant's [`ErrorCode::as_str`] never changes once shipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Malformed JSON, a bad query string, an unreadable body.
    BadRequest,
    /// A missing or unknown API key.
    Unauthorized,
    /// An admin-only operation asked for with a tenant key.
    Forbidden,
    /// An unknown id, or one owned by another tenant (ids do not leak).
    NotFound,
    /// A path that does not exist inside a session.
    NoSuchFile,
    /// A known route called with the wrong method.
    MethodNotAllowed,
    /// A request body that stalled past `--body-timeout`.
    RequestTimeout,
    /// A request target longer than the daemon reads (refused by hyper itself).
    UriTooLong,
    /// A request head over the daemon's limits (refused by hyper itself).
    HeadersTooLarge,
    /// A name taken, a session paused, a sandbox too old for what is asked...
    Conflict,
    /// Something in use right now: a mount point, a file a sandbox leased.
    Busy,
    /// A path that names a file where a directory is needed.
    NotADirectory,
    /// A path that names a directory (or other non-file) where a file is needed.
    NotAFile,
    /// Creating what already exists.
    AlreadyExists,
    /// Removing a directory that is not empty.
    NotEmpty,
    /// Writing where the sandbox's filesystem is read-only.
    ReadOnly,
    /// Only ever answered for error responses the daemon did not make itself (an
    /// upstream 410); kept so that every code the API can send has a variant.
    Gone,
    /// A body, an upload or an archive entry over the daemon's limit.
    PayloadTooLarge,
    /// Well-formed input with unknown fields, wrong types or bad values.
    Invalid,
    /// A path the API refuses before touching anything.
    InvalidPath,
    /// A path whose resolution would leave the sandbox's root.
    PathEscapes,
    /// A tar stream that is not a well-formed archive.
    InvalidArchive,
    /// The sandbox's user may not do this to that file.
    PermissionDenied,
    /// A per-tenant quota (sessions, concurrent execs, disk).
    Quota,
    /// The session's disk is full.
    NoSpace,
    /// The session's memory, which its files are charged to, is full.
    MemoryFull,
    /// A global cap, or the daemon is shutting down: try again later.
    Unavailable,
    /// A host failure or a bug; the details are in the daemon's log only.
    Internal,
}

impl ErrorCode {
    /// Every code, for tests that must cover them all.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::BadRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::NoSuchFile,
        ErrorCode::MethodNotAllowed,
        ErrorCode::RequestTimeout,
        ErrorCode::UriTooLong,
        ErrorCode::HeadersTooLarge,
        ErrorCode::Conflict,
        ErrorCode::Busy,
        ErrorCode::NotADirectory,
        ErrorCode::NotAFile,
        ErrorCode::AlreadyExists,
        ErrorCode::NotEmpty,
        ErrorCode::ReadOnly,
        ErrorCode::Gone,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Invalid,
        ErrorCode::InvalidPath,
        ErrorCode::PathEscapes,
        ErrorCode::InvalidArchive,
        ErrorCode::PermissionDenied,
        ErrorCode::Quota,
        ErrorCode::NoSpace,
        ErrorCode::MemoryFull,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The code as the API writes it in `{"error": {"code": ...}}`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NoSuchFile => "no_such_file",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Busy => "busy",
            ErrorCode::NotADirectory => "not_a_directory",
            ErrorCode::NotAFile => "not_a_file",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::NotEmpty => "not_empty",
            ErrorCode::ReadOnly => "read_only",
            ErrorCode::Gone => "gone",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Invalid => "invalid_request",
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::PathEscapes => "path_escapes",
            ErrorCode::InvalidArchive => "invalid_archive",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Quota => "quota_exceeded",
            ErrorCode::NoSpace => "no_space",
            ErrorCode::MemoryFull => "memory_full",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether the daemon, rather than what was asked, is why the operation failed:
    /// a host failure, a global cap or a shutdown, the session's disk or memory
    /// full. Such failures are audited as errors, not as refusals of the request.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            ErrorCode::Internal
                | ErrorCode::Unavailable
                | ErrorCode::NoSpace
                | ErrorCode::MemoryFull
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal or failure of a domain operation. `code` is stable (clients match on
/// it); `message` is one line for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        let mut message = message.into();
        // The contract promises one line; serde and io messages occasionally carry more.
        if message.contains('\n') {
            message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        Error { code, message }
    }

    /// Malformed JSON, bad query string, unreadable body.
    pub fn bad_request(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::BadRequest, message)
    }

    /// Missing or unknown API key.
    pub fn unauthorized(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Unauthorized, message)
    }

    /// An admin-only operation asked for with a tenant key.
    pub fn forbidden(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Forbidden, message)
    }

    /// Unknown id, or an id owned by another tenant (never `forbidden`: ids do not
    /// leak).
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::NotFound, message)
    }

    /// A path that does not exist inside a session.
    pub fn no_such_file(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::NoSuchFile, message)
    }

    /// Name taken, session paused, directory not empty...
    pub fn conflict(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Conflict, message)
    }

    /// Body or upload over its limit.
    pub fn too_large(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::PayloadTooLarge, message)
    }

    /// The client stopped sending a request's body for `--body-timeout`.
    pub fn request_timeout(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::RequestTimeout, message)
    }

    /// Well-formed input with unknown fields, wrong types, bad values, bad paths.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Invalid, message)
    }

    /// A per-tenant quota (sessions, concurrent execs, disk).
    pub fn quota(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Quota, message)
    }

    /// A global cap, or the daemon is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Unavailable, message)
    }

    /// Logs `detail` (which may name host paths or internals) and carries a generic
    /// message, so nothing about the host leaks to the client.
    pub fn internal(detail: impl fmt::Display) -> Error {
        tracing::error!(error = %detail, "internal error");
        Error::new(ErrorCode::Internal, "internal error; see the daemon's log")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// Unexpected I/O failures are host failures: logged, answered as `internal`.
/// Callers that expect a particular io error (not found, too large) map it before `?`.
impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Error {
        Error::internal(format_args!("i/o: {err}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line() {
        let e = Error::invalid("a\nb\r\n  c");
        assert_eq!(e.message, "a b c");
        assert_eq!(e.code, ErrorCode::Invalid);
        assert_eq!(e.code.as_str(), "invalid_request");
    }

    #[test]
    fn internal_hides_the_detail() {
        let e = Error::internal("open /secret/path: permission denied");
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(!e.message.contains("/secret"));
    }
}
