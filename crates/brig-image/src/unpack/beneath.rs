//! File system operations confined to a layer root.
//!
//! Archives are hostile and brig extracts them as host root, so a path from an
//! archive is never handed to the kernel as a string to walk from `/` or from
//! the cwd. Directories are resolved from the root's fd with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, and the last
//! component is created, replaced or changed with `*at()` calls on its parent's
//! fd. A symlink planted by an earlier entry therefore cannot redirect a later
//! write, whatever it points to.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, XattrFlags};
use rustix::io::Errno;

/// How every path below a layer root is resolved.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Mode of directories an archive needs but does not list (like `tar` and `mkdir -p`).
pub(crate) const IMPLICIT_DIR_MODE: u32 = 0o755;

/// Opens the directory `path` (relative, `/`-separated) below `dir`.
pub(crate) fn open_dir(dir: BorrowedFd<'_>, path: &[u8]) -> io::Result<OwnedFd> {
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    Ok(brig_sys::resolve::openat2(
        dir,
        path,
        DIR_FLAGS,
        Mode::empty(),
        RESOLVE,
    )?)
}

/// Opens the directory `path` itself, as the root of a tree to resolve beneath
/// (the last component not followed if it is a symlink).
pub(crate) fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, DIR_FLAGS, Mode::empty())?)
}

/// Whether `name` in `dir` is a directory (not a symlink to one) with no entries.
pub(crate) fn is_empty_dir(dir: BorrowedFd<'_>, name: &[u8]) -> bool {
    let Ok(fd) = open_dir(dir, name) else {
        return false;
    };
    let Ok(mut stream) = Dir::read_from(&fd) else {
        return false;
    };
    while let Some(entry) = stream.read() {
        match entry {
            Ok(entry) if matches!(entry.file_name().to_bytes(), b"." | b"..") => {}
            _ => return false,
        }
    }
    true
}

/// Why [`walk`] stopped; the index says which component.
#[derive(Debug)]
pub(crate) enum WalkError {
    Symlink(usize),
    NotDir(usize),
    Missing(usize),
    Io(usize, io::Error),
}

/// Opens the directory made of `components` below `root`. Missing ones are
/// created if `created` is given, which is told the index of each.
pub(crate) fn walk(
    root: BorrowedFd<'_>,
    components: &[&[u8]],
    mut created: Option<&mut dyn FnMut(usize)>,
) -> Result<OwnedFd, WalkError> {
    // The common case, a parent that exists, costs one syscall.
    if let Ok(fd) = open_dir(root, &components.join(&b'/')) {
        return Ok(fd);
    }
    let mut current = open_dir(root, b"").map_err(|e| WalkError::Io(0, e))?;
    for (i, name) in components.iter().enumerate() {
        let next = match open_dir(current.as_fd(), name) {
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                match created.as_mut() {
                    Some(created) => {
                        let mode = Mode::from_bits_truncate(IMPLICIT_DIR_MODE);
                        rustix::fs::mkdirat(&current, *name, mode)
                            .map_err(io::Error::from)
                            .and_then(|()| open_dir(current.as_fd(), name))
                            .and_then(|fd| {
                                // mkdir applied the umask.
                                rustix::fs::fchmod(&fd, mode)?;
                                created(i);
                                Ok(fd)
                            })
                    }
                    None => Err(e),
                }
            }
            other => other,
        };
        current = next.map_err(|e| classify(current.as_fd(), name, i, e))?;
    }
    Ok(current)
}

fn classify(dir: BorrowedFd<'_>, name: &[u8], i: usize, err: io::Error) -> WalkError {
    let errno = err.raw_os_error().map(Errno::from_raw_os_error);
    match errno {
        Some(Errno::NOENT) => WalkError::Missing(i),
        Some(Errno::LOOP | Errno::NOTDIR | Errno::XDEV) => match file_type(dir, name) {
            Ok(Some(FileType::Symlink)) => WalkError::Symlink(i),
            Ok(Some(_)) => WalkError::NotDir(i),
            Ok(None) => WalkError::Missing(i),
            Err(e) => WalkError::Io(i, e),
        },
        _ => WalkError::Io(i, err),
    }
}

/// The type of `name` in `dir` without following it; `None` if it does not exist.
pub(crate) fn file_type(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<FileType>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Removes `name` from `parent`, with everything below it if it is a directory.
/// Symlinks are removed, never followed.
pub(crate) fn remove_tree(parent: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Err(Errno::ISDIR) => {}
        other => return Ok(other?),
    }
    let dir = open_dir(parent, name)?;
    // Names are collected first so the directory stream is closed before
    // recursing: a deep tree then holds one fd per level, not two.
    let mut children = Vec::new();
    let mut stream = Dir::read_from(&dir)?;
    while let Some(entry) = stream.read() {
        let entry = entry?;
        let child = entry.file_name().to_bytes();
        if child != b"." && child != b".." {
            children.push(child.to_vec());
        }
    }
    drop(stream);
    for child in children {
        remove_tree(dir.as_fd(), &child)?;
    }
    Ok(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?)
}

/// Sets an xattr on `name` in `parent` without following it, for files that
/// cannot be opened to use `fsetxattr` (symlinks; devices and fifos, which
/// must not be opened). There is no `lsetxattrat` before Linux 6.13, so the
/// parent is named through its fd in /proc: the walk is anchored on the fd and
/// only the last component is looked up, with `lsetxattr` not following it.
pub(crate) fn set_xattr_nofollow(
    parent: BorrowedFd<'_>,
    name: &[u8],
    xattr: &[u8],
    value: &[u8],
) -> io::Result<()> {
    let mut path = format!("/proc/self/fd/{}/", parent.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    let path = OsString::from_vec(path);
    Ok(rustix::fs::lsetxattr(
        path.as_os_str(),
        std::ffi::OsStr::from_bytes(xattr),
        value,
        XattrFlags::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::open(dir, DIR_FLAGS, Mode::empty()).unwrap()
    }

    #[test]
    fn walk_creates_missing_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let fd = root(tmp.path());
        std::fs::create_dir(tmp.path().join("a")).unwrap();
        let mut created = Vec::new();
        walk(
            fd.as_fd(),
            &[b"a", b"b", b"c"],
            Some(&mut |i| created.push(i)),
        )
        .unwrap();
        assert!(tmp.path().join("a/b/c").is_dir());
        assert_eq!(created, [1, 2]);
        assert!(matches!(
            walk(fd.as_fd(), &[b"x", b"y"], None),
            Err(WalkError::Missing(0))
        ));
    }

    #[test]
    fn walk_refuses_symlinks_even_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        symlink("real", tmp.path().join("link")).unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        let fd = root(tmp.path());
        assert!(matches!(
            walk(fd.as_fd(), &[b"link", b"x"], Some(&mut |_| {})),
            Err(WalkError::Symlink(0))
        ));
        assert!(matches!(
            walk(fd.as_fd(), &[b"file", b"x"], Some(&mut |_| {})),
            Err(WalkError::NotDir(0))
        ));
        assert!(!tmp.path().join("real/x").exists());
    }

    #[test]
    fn remove_tree_does_not_follow_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"precious").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("d/sub")).unwrap();
        std::fs::write(tmp.path().join("d/sub/f"), b"").unwrap();
        symlink(outside.path(), tmp.path().join("d/out")).unwrap();
        let fd = root(tmp.path());
        remove_tree(fd.as_fd(), b"d").unwrap();
        assert!(!tmp.path().join("d").exists());
        assert!(outside.path().join("keep").exists());
    }
}
