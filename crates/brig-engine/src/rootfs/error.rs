//! The typed error of every rootfs operation, and how errnos map onto it.
//!
//! Messages are one line and name the path as the sandbox sees it: the host
//! path of a sandbox's root is never part of what a caller can read.

use std::io;

use rustix::io::Errno;

use crate::fault::ErrorCode;

/// Why a file operation inside a sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    NotADirectory(String),
    #[error("{0}")]
    NotAFile(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    NotEmpty(String),
    /// A path the API refuses before touching anything: empty, relative, NUL,
    /// too long, ending in `.` or `..`, removing `/`.
    #[error("{0}")]
    InvalidPath(String),
    /// Resolution refused: a magic link (`/proc/*/root`, `/proc/*/fd/*`), too
    /// many symlinks, an archive entry that climbs out or goes through a
    /// symlink, or a kernel filesystem (procfs, sysfs...) the daemon does not
    /// act on with its host privileges.
    #[error("{0}")]
    Escapes(String),
    /// A mount point, which the daemon never removes, replaces or descends
    /// into when removing; or a file a sandbox process holds a lease on
    /// (`fcntl(F_SETLEASE)`), which the daemon does not wait for.
    #[error("{0}")]
    Busy(String),
    /// The sandbox's user could not read this (mode bits of the file and its
    /// directories checked against the sandbox's ids), or the kernel said
    /// EPERM/EACCES.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    ReadOnly(String),
    #[error("{0}")]
    NoSpace(String),
    /// The session's memory is full: the files it holds are charged to it (tmpfs),
    /// and a write past its limit is refused (ENOMEM) or killed.
    #[error("{0}")]
    NoMemory(String),
    /// The sandbox cannot do what is asked (its init, started by an older brig,
    /// lacks it).
    #[error("{0}")]
    Unsupported(String),
    /// A tar stream that is not a well-formed archive.
    #[error("{0}")]
    InvalidArchive(String),
    /// Anything else: a host failure or a bug, worth a log line.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl RootfsError {
    /// The stable code the daemon answers with. `Io` is a host failure, whose
    /// details the caller never sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            RootfsError::NotFound(_) => ErrorCode::NoSuchFile,
            RootfsError::NotADirectory(_) => ErrorCode::NotADirectory,
            RootfsError::NotAFile(_) => ErrorCode::NotAFile,
            RootfsError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            RootfsError::NotEmpty(_) => ErrorCode::NotEmpty,
            RootfsError::InvalidPath(_) => ErrorCode::InvalidPath,
            RootfsError::Escapes(_) => ErrorCode::PathEscapes,
            RootfsError::Busy(_) => ErrorCode::Busy,
            RootfsError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            RootfsError::TooLarge(_) => ErrorCode::PayloadTooLarge,
            RootfsError::ReadOnly(_) => ErrorCode::ReadOnly,
            RootfsError::NoSpace(_) => ErrorCode::NoSpace,
            RootfsError::NoMemory(_) => ErrorCode::MemoryFull,
            // A sandbox too old for what is asked is the same refusal as any other
            // state that rules a request out.
            RootfsError::Unsupported(_) => ErrorCode::Conflict,
            RootfsError::InvalidArchive(_) => ErrorCode::InvalidArchive,
            RootfsError::Io { .. } => ErrorCode::Internal,
        }
    }

    pub(super) fn io(context: impl Into<String>, source: io::Error) -> Self {
        RootfsError::Io {
            context: context.into(),
            source,
        }
    }
}

/// A path made printable on one line (a sandbox may name files with newlines),
/// and short: an archive entry's name can be a megabyte, and every message that
/// names it goes into a response, a log line and the audit log.
pub(super) fn show(path: &[u8]) -> String {
    const SHOWN: usize = 1024;
    let text = String::from_utf8_lossy(&path[..path.len().min(SHOWN)]);
    let mut shown = if text.chars().any(char::is_control) {
        text.escape_debug().to_string()
    } else {
        text.into_owned()
    };
    if path.len() > SHOWN {
        shown.push_str(&format!("… ({} bytes)", path.len()));
    }
    shown
}

/// Maps the errno of operation `what` (e.g. "opening") on sandbox path
/// `shown`. ELOOP and EXDEV are only resolution refusals when they come from
/// openat2; callers of other syscalls handle them before calling this.
pub(super) fn errno(e: Errno, what: &str, shown: &str) -> RootfsError {
    match e {
        Errno::NOENT => RootfsError::NotFound(format!("{shown}: no such file or directory")),
        Errno::NOTDIR => RootfsError::NotADirectory(format!("{shown}: not a directory")),
        Errno::EXIST => RootfsError::AlreadyExists(format!("{shown}: already exists")),
        Errno::NOTEMPTY => RootfsError::NotEmpty(format!("{shown}: directory not empty")),
        Errno::ISDIR => RootfsError::NotAFile(format!("{shown}: is a directory")),
        Errno::LOOP | Errno::XDEV => RootfsError::Escapes(format!(
            "{shown}: resolution refused (a magic link such as /proc/*/fd/* or /proc/*/root, or too many symlinks)"
        )),
        Errno::NAMETOOLONG => RootfsError::InvalidPath(format!("{shown}: name too long")),
        Errno::BUSY => RootfsError::Busy(format!("{shown}: busy (a mount point?)")),
        Errno::ACCESS | Errno::PERM => {
            RootfsError::PermissionDenied(format!("{shown}: {what}: permission denied"))
        }
        Errno::FBIG => RootfsError::TooLarge(format!("{shown}: file too large")),
        Errno::ROFS => RootfsError::ReadOnly(format!("{shown}: read-only file system")),
        Errno::NOSPC | Errno::DQUOT => {
            RootfsError::NoSpace(format!("{shown}: no space left (disk limit reached)"))
        }
        other => RootfsError::io(format!("{what} {shown}"), other.into()),
    }
}

/// [`errno`] for a `std::io::Error` (writes through `File`, reads of an upload).
pub(super) fn io_error(e: io::Error, what: &str, shown: &str) -> RootfsError {
    match e.raw_os_error() {
        Some(raw) => errno(Errno::from_raw_os_error(raw), what, shown),
        None => RootfsError::io(format!("{what} {shown}"), e),
    }
}

/// A file that does not fit in the session's memory, which its files are charged to.
pub(super) fn no_memory(shown: &str) -> RootfsError {
    RootfsError::NoMemory(format!(
        "{shown}: the session's memory is full (its memory limit counts the files in its \
         /tmp, /workspace and root)"
    ))
}
