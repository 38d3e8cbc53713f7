//! Paths as the API and archives give them.
//!
//! API paths are never normalised here: `..`, `.`, repeated slashes and
//! symlinks are left to openat2 with `RESOLVE_IN_ROOT`, which cannot leave
//! the sandbox's root. The only string work is splitting off the last
//! component of paths whose last component is acted on itself (create,
//! remove, replace), so that it can be handled with `*at()` calls on its
//! parent's fd without following it.

use super::error::show;
use super::RootfsError;

/// Longer paths fail in the kernel anyway (PATH_MAX, with its NUL).
pub(super) const MAX_PATH: usize = 4095;

/// Checks an API path: absolute, not empty, no NUL, not over PATH_MAX.
pub(super) fn check(path: &str) -> Result<(), RootfsError> {
    if path.is_empty() {
        return Err(RootfsError::InvalidPath("empty path".into()));
    }
    if path.contains('\0') {
        return Err(RootfsError::InvalidPath(format!(
            "{}: path contains a NUL byte",
            show(path.as_bytes())
        )));
    }
    if !path.starts_with('/') {
        return Err(RootfsError::InvalidPath(format!(
            "{}: not an absolute path",
            show(path.as_bytes())
        )));
    }
    if path.len() > MAX_PATH {
        return Err(RootfsError::InvalidPath(format!(
            "path longer than {MAX_PATH} bytes"
        )));
    }
    Ok(())
}

/// An API path split before its last component.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Final<'a> {
    /// `/`, or only slashes.
    Root,
    /// `parent` is resolved (following symlinks, confined); `name` is one
    /// component, never `.` or `..`, acted on without being followed.
    Entry { parent: &'a str, name: &'a str },
}

/// Splits a checked path. Trailing slashes are ignored: `/a/b/` names `b`.
pub(super) fn split_final(path: &str) -> Result<Final<'_>, RootfsError> {
    check(path)?;
    let trimmed = path.trim_end_matches('/');
    let Some(slash) = trimmed.rfind('/') else {
        return Ok(Final::Root);
    };
    let (parent, name) = (&trimmed[..slash], &trimmed[slash + 1..]);
    if name == "." || name == ".." {
        return Err(RootfsError::InvalidPath(format!(
            "{}: the last component must name an entry, not '.' or '..'",
            show(path.as_bytes())
        )));
    }
    let parent = if parent.is_empty() { "/" } else { parent };
    Ok(Final::Entry { parent, name })
}

/// The components of a checked API path, for walking it one prefix at a time
/// (`mkdir -p`). `.` and `..` stay: each prefix is resolved by the kernel.
pub(super) fn components(path: &str) -> Vec<&str> {
    path.split('/').filter(|c| !c.is_empty()).collect()
}

/// Why an archive entry's name is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ArchivePathError {
    Absolute,
    DotDot,
    Nul,
    TooLong,
}

/// The components of an archive path, without empty and `.` ones (so
/// `./a//b` is `a/b`); empty for the extraction directory itself.
pub(super) fn archive_components(raw: &[u8]) -> Result<Vec<&[u8]>, ArchivePathError> {
    if raw.len() > MAX_PATH {
        return Err(ArchivePathError::TooLong);
    }
    if raw.contains(&0) {
        return Err(ArchivePathError::Nul);
    }
    if raw.starts_with(b"/") {
        return Err(ArchivePathError::Absolute);
    }
    let mut out = Vec::new();
    for component in raw.split(|&b| b == b'/') {
        match component {
            b"" | b"." => {}
            b".." => return Err(ArchivePathError::DotDot),
            _ => out.push(component),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_are_checked() {
        for bad in ["", "relative", "a/b", "/a\0b"] {
            assert!(
                matches!(check(bad), Err(RootfsError::InvalidPath(_))),
                "{bad:?}"
            );
        }
        assert!(check(&format!("/{}", "a".repeat(MAX_PATH))).is_err());
        assert!(check("/a/../b/./c//d").is_ok());
    }

    #[test]
    fn final_component_is_split_off() {
        assert_eq!(split_final("/").unwrap(), Final::Root);
        assert_eq!(split_final("///").unwrap(), Final::Root);
        assert_eq!(
            split_final("/a").unwrap(),
            Final::Entry {
                parent: "/",
                name: "a"
            }
        );
        assert_eq!(
            split_final("/x/../y//z/").unwrap(),
            Final::Entry {
                parent: "/x/../y/",
                name: "z"
            }
        );
        for bad in ["/a/..", "/a/.", "/..", "/.", "/a/../"] {
            assert!(
                matches!(split_final(bad), Err(RootfsError::InvalidPath(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn archive_paths() {
        assert_eq!(
            archive_components(b"./a//b/./c/").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(archive_components(b"./").unwrap().is_empty());
        assert_eq!(archive_components(b"/etc"), Err(ArchivePathError::Absolute));
        assert_eq!(archive_components(b"a/../b"), Err(ArchivePathError::DotDot));
        assert_eq!(archive_components(b".."), Err(ArchivePathError::DotDot));
        assert_eq!(archive_components(b"a\0"), Err(ArchivePathError::Nul));
        assert_eq!(
            archive_components(&[b'a'; MAX_PATH + 1]),
            Err(ArchivePathError::TooLong)
        );
        assert_eq!(archive_components(b"a/..b/c..").unwrap().len(), 3);
    }
}
