//! Reading a tree without ever following a symlink.
//!
//! Everything here goes by path (`lstat`, `l*xattr`, `readlink`, `O_NOFOLLOW`), so
//! a symlink anywhere in a tree is read as a symlink. The trees are expected to be
//! quiescent while they are read: nothing runs in a staged layer or in the upper
//! directory of a stopped sandbox.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::{ImageError, IoContext, Result};

/// Visits `root` and everything below it, each directory before its children
/// and the children of a directory in ascending order of their raw name bytes.
///
/// `visit` gets the path relative to `root` (empty for the root), the path on
/// the host and the entry's `lstat`; it returns whether to descend into a
/// directory.
pub(super) fn walk(
    root: &Path,
    mut visit: impl FnMut(&Path, &Path, &fs::Metadata) -> Result<bool>,
) -> Result<()> {
    let st = lstat(root)?;
    if !st.is_dir() {
        return Err(ImageError::BadSource(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    // An explicit stack rather than recursion, so that however deep a sandbox
    // nested its directories the walk cannot overflow the thread's stack (paths
    // beyond PATH_MAX fail with ENAMETOOLONG, as an error).
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let full = host_path(root, &rel);
        let st = lstat(&full)?;
        if !visit(&rel, &full, &st)? || !st.is_dir() {
            continue;
        }
        let mut names = fs::read_dir(&full)
            .and_then(|dir| {
                dir.map(|entry| entry.map(|entry| entry.file_name()))
                    .collect::<io::Result<Vec<_>>>()
            })
            .context(|| format!("reading directory {}", full.display()))?;
        // Descending, so that popping yields ascending order.
        names.sort_unstable_by(|a, b| b.as_bytes().cmp(a.as_bytes()));
        stack.extend(names.into_iter().map(|name| rel.join(name)));
    }
    Ok(())
}

/// `root` joined with `rel`, without the trailing `/` that joining "" leaves.
pub(super) fn host_path(root: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

pub(super) fn lstat(path: &Path) -> Result<fs::Metadata> {
    fs::symlink_metadata(path).context(|| format!("reading metadata of {}", path.display()))
}

pub(super) fn read_link(path: &Path) -> Result<PathBuf> {
    fs::read_link(path).context(|| format!("reading symlink {}", path.display()))
}

/// Opens the regular file `path` for reading, failing rather than following a
/// symlink or blocking on a FIFO that replaced the file since `st` was taken.
pub(super) fn open_file(path: &Path, st: &fs::Metadata) -> Result<File> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let file = File::from(
        rustix::fs::open(path, flags, Mode::empty())
            .context(|| format!("opening {}", path.display()))?,
    );
    let now = file
        .metadata()
        .context(|| format!("reading metadata of {}", path.display()))?;
    if (now.dev(), now.ino()) != (st.dev(), st.ino()) {
        return Err(ImageError::io(
            format!("opening {}", path.display()),
            io::Error::other("the file was replaced while the tree was read"),
        ));
    }
    Ok(file)
}

/// The names of all xattrs of `path` (not following a symlink).
pub(super) fn xattr_names(path: &Path) -> Result<Vec<OsString>> {
    list_xattrs(
        || rustix::fs::llistxattr_query(path),
        |list| rustix::fs::llistxattr(path, list),
    )
    .context(|| format!("listing xattrs of {}", path.display()))
}

/// The value of xattr `name` of `path`, `None` if it is gone.
pub(super) fn xattr_value(path: &Path, name: &OsStr) -> Result<Option<Vec<u8>>> {
    read_xattr(
        || rustix::fs::lgetxattr_query(path, name),
        |value| rustix::fs::lgetxattr(path, name, value),
    )
    .context(|| {
        format!(
            "reading xattr {} of {}",
            name.to_string_lossy(),
            path.display()
        )
    })
}

/// The names an xattr list call gives, sized by its query (by path or by
/// descriptor): asked again if the list grew in between.
pub(super) fn list_xattrs(
    query: impl Fn() -> Result<usize, Errno>,
    list: impl Fn(&mut [u8]) -> Result<usize, Errno>,
) -> Result<Vec<OsString>, Errno> {
    loop {
        let size = match query() {
            Ok(size) => size,
            // A filesystem without xattrs has none to report.
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut names = vec![0; size];
        match list(&mut names[..]) {
            Ok(len) => {
                return Ok(names[..len]
                    .split(|&b| b == 0)
                    .filter(|name| !name.is_empty())
                    .map(|name| OsStr::from_bytes(name).to_owned())
                    .collect())
            }
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The value an xattr get call gives, sized by its query; `None` if it is gone;
/// asked again if the value grew in between.
pub(super) fn read_xattr(
    query: impl Fn() -> Result<usize, Errno>,
    get: impl Fn(&mut [u8]) -> Result<usize, Errno>,
) -> Result<Option<Vec<u8>>, Errno> {
    loop {
        let size = match query() {
            Ok(size) => size,
            Err(Errno::NODATA) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut value = vec![0; size];
        if size == 0 {
            return Ok(Some(value));
        }
        match get(&mut value[..]) {
            Ok(len) => {
                value.truncate(len);
                return Ok(Some(value));
            }
            Err(Errno::NODATA) => return Ok(None),
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The xattrs of `path` whose names pass `keep`, by name.
pub(super) fn xattrs(
    path: &Path,
    keep: impl Fn(&OsStr) -> bool,
) -> Result<BTreeMap<OsString, Vec<u8>>> {
    let mut xattrs = BTreeMap::new();
    for name in xattr_names(path)? {
        if !keep(&name) {
            continue;
        }
        if let Some(value) = xattr_value(path, &name)? {
            xattrs.insert(name, value);
        }
    }
    Ok(xattrs)
}

/// Removes xattr `name` of `path` (not following a symlink).
pub(super) fn remove_xattr(path: &Path, name: &OsStr) -> Result<()> {
    match rustix::fs::lremovexattr(path, name) {
        Ok(()) | Err(Errno::NODATA) => Ok(()),
        Err(e) => Err(e).context(|| {
            format!(
                "removing xattr {} of {}",
                name.to_string_lossy(),
                path.display()
            )
        }),
    }
}
