//! Errors of the image store: one line for humans, a stable code for machines.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The source to import is malformed (bad archive, bad manifest, missing blob).
    #[error("{0}")]
    BadSource(String),
    /// An archive entry would land outside the image root.
    #[error("archive entry '{entry}' escapes the image root: {reason}")]
    PathEscape { entry: String, reason: String },
    /// A stored layer does not match its recorded digest or cannot be read.
    #[error("layer {digest} is corrupt: {reason}")]
    CorruptLayer { digest: String, reason: String },
    #[error("no image named '{0}'")]
    NoSuchImage(String),
    #[error("image '{0}' already exists (remove it first)")]
    ImageExists(String),
    #[error("invalid image name '{0}': 1-128 characters of letters, digits, '.', '_', '-', ':' and '/', not starting with '.' or '-'")]
    BadName(String),
    #[error("invalid recipe {path}: {reason}")]
    BadRecipe { path: PathBuf, reason: String },
    #[error("{tool} failed: {detail}")]
    Tool { tool: String, detail: String },
    #[error("interrupted")]
    Interrupted,
    #[error("{0}")]
    Unsupported(String),
    /// A tree holds more than it may (a snapshot beyond its bound).
    #[error("{0}")]
    TooLarge(String),
    /// A tree changed while brig copied it (a snapshot of a sandbox that was not
    /// kept still).
    #[error("{0}")]
    Changed(String),
    /// A file could not be read for now (leased by a sandbox's process).
    #[error("{0}")]
    Busy(String),
    /// The memory that pays for the work could not hold it.
    #[error("{0}")]
    OutOfMemory(String),
}

impl ImageError {
    /// A stable, machine-readable code for this kind of error.
    pub fn code(&self) -> &'static str {
        match self {
            ImageError::Io { .. } => "io_error",
            ImageError::BadSource(_) => "bad_source",
            ImageError::PathEscape { .. } => "path_escape",
            ImageError::CorruptLayer { .. } => "corrupt_layer",
            ImageError::NoSuchImage(_) => "no_such_image",
            ImageError::ImageExists(_) => "image_exists",
            ImageError::BadName(_) => "bad_name",
            ImageError::BadRecipe { .. } => "bad_recipe",
            ImageError::Tool { .. } => "tool_failed",
            ImageError::Interrupted => "interrupted",
            ImageError::Unsupported(_) => "unsupported",
            ImageError::TooLarge(_) => "too_large",
            ImageError::Changed(_) => "tree_changed",
            ImageError::Busy(_) => "busy",
            ImageError::OutOfMemory(_) => "memory_full",
        }
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        ImageError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Adds what brig was doing to an I/O error.
pub trait IoContext<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, ImageError>;
}

impl<T> IoContext<T> for Result<T, io::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, ImageError> {
        self.map_err(|source| ImageError::io(context(), source))
    }
}

impl<T> IoContext<T> for Result<T, rustix::io::Errno> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, ImageError> {
        self.map_err(|errno| ImageError::io(context(), errno.into()))
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;
