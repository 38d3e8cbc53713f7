//! What one entry is, described without opening it: [`SandboxRoot::stat`].
//!
//! Like `lstat` inside the sandbox: a symlink in the last position is described
//! itself, with what it leads to (resolved from the sandbox's root, never the
//! host's) alongside. Front ends that mirror another system's file metadata (E2B's
//! envd) build on it.

use std::os::fd::AsFd;

use rustix::fs::FileType;
use rustix::io::Errno;

use super::error::{errno, show};
use super::fsops::{self, PATH_DIR};
use super::path::{self, Final};
use super::{EntryKind, RootfsError, SandboxRoot, MAX_SYMLINKS};

/// One entry, as `lstat` sees it, with the symlink it may be followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryStat {
    /// What the entry itself is (`Symlink` for a symlink).
    pub kind: EntryKind,
    /// Permission bits of the entry (`mode & 0o7777`).
    pub mode: u32,
    /// The size of the entry itself (a symlink's is the length of its target).
    pub size_bytes: u64,
    /// Owner and group as the host sees them.
    pub uid: u32,
    pub gid: u32,
    /// Owned by (or of the group of) the sandbox's user.
    pub owned_by_user: bool,
    pub group_of_user: bool,
    /// Unix seconds and their nanoseconds.
    pub modified: i64,
    pub modified_nsec: u32,
    /// For a symlink: the path it resolves to in the sandbox (all symlinks on the
    /// way followed), or `None` if it leads nowhere (dangling, a loop).
    pub target: Option<String>,
    /// For a symlink: what its target is and its permission bits, if it leads
    /// somewhere.
    pub target_kind: Option<EntryKind>,
    pub target_mode: Option<u32>,
}

impl SandboxRoot {
    /// Describes `path` itself (a symlink in the last position is not followed;
    /// symlinks before it are, confined to the root). Refused like a listing:
    /// the way to it must be searchable by the sandbox's user.
    pub fn stat(&self, path: &str) -> Result<EntryStat, RootfsError> {
        let shown = show(path.as_bytes());
        let info = match path::split_final(path)? {
            Final::Root => {
                let root = self
                    .resolve(b"/", PATH_DIR)
                    .map_err(|e| errno(e, "opening", "/"))?;
                fsops::stat_fd(root.as_fd()).map_err(|e| errno(e, "inspecting", "/"))?
            }
            Final::Entry { parent, name } => {
                let dir = self.open_dir(parent, &shown)?;
                self.refuse_kernel_fs(dir.as_fd(), &shown)?;
                self.check_search_path(dir.as_fd(), &shown)?;
                fsops::stat_at(dir.as_fd(), name).map_err(|e| errno(e, "inspecting", &shown))?
            }
        };
        let mut stat = EntryStat {
            kind: EntryKind::of(info.file_type),
            mode: info.perm,
            size_bytes: info.size,
            uid: info.uid,
            gid: info.gid,
            owned_by_user: info.uid == self.uid.as_raw(),
            group_of_user: info.gid == self.gid.as_raw(),
            modified: info.mtime,
            modified_nsec: info.mtime_nsec,
            target: None,
            target_kind: None,
            target_mode: None,
        };
        if info.file_type == FileType::Symlink {
            stat.target = self.real_path(path).ok();
            if let Some(target) = &stat.target {
                if let Ok(fd) = self.resolve(target.as_bytes(), rustix::fs::OFlags::PATH) {
                    if let Ok(info) = fsops::stat_fd(fd.as_fd()) {
                        stat.target_kind = Some(EntryKind::of(info.file_type));
                        stat.target_mode = Some(info.perm);
                    }
                }
            }
        }
        Ok(stat)
    }

    /// `path` with every symlink on it resolved, `.` and `..` folded, as the
    /// sandbox would see it (`realpath`). Each prefix is inspected from the
    /// sandbox's root, so a symlink cannot lead the walk out of it.
    pub fn real_path(&self, path: &str) -> Result<String, RootfsError> {
        path::check(path)?;
        let shown = show(path.as_bytes());
        let mut pending: Vec<Vec<u8>> = path::components(path)
            .into_iter()
            .rev()
            .map(|c| c.as_bytes().to_vec())
            .collect();
        let mut done: Vec<Vec<u8>> = Vec::new();
        let mut links = 0;
        while let Some(component) = pending.pop() {
            match component.as_slice() {
                b"" | b"." => continue,
                b".." => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let parent = join(&done);
            let dir = self
                .resolve(&parent, PATH_DIR)
                .map_err(|e| errno(e, "opening", &shown))?;
            let info = fsops::stat_at(dir.as_fd(), component.as_slice())
                .map_err(|e| errno(e, "inspecting", &shown))?;
            if info.file_type != FileType::Symlink {
                done.push(component);
                continue;
            }
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(errno(Errno::LOOP, "resolving", &shown));
            }
            let target = rustix::fs::readlinkat(dir.as_fd(), component.as_slice(), Vec::new())
                .map_err(|e| errno(e, "reading the symlink", &shown))?
                .into_bytes();
            if target.is_empty() {
                return Err(RootfsError::NotFound(format!("{shown}: empty symlink")));
            }
            if target.starts_with(b"/") {
                done.clear();
            }
            for part in target.split(|&b| b == b'/').rev() {
                pending.push(part.to_vec());
            }
            if pending.iter().map(Vec::len).sum::<usize>() > path::MAX_PATH {
                return Err(RootfsError::InvalidPath(format!(
                    "{shown}: symlink target too long"
                )));
            }
        }
        Ok(String::from_utf8_lossy(&join(&done)).into_owned())
    }
}

fn join(components: &[Vec<u8>]) -> Vec<u8> {
    if components.is_empty() {
        return b"/".to_vec();
    }
    let mut out = Vec::new();
    for c in components {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, SandboxRoot) {
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = (rustix::process::getuid(), rustix::process::getgid());
        let root = SandboxRoot::open(dir.path(), uid.as_raw(), gid.as_raw()).unwrap();
        (dir, root)
    }

    #[test]
    fn stat_describes_files_dirs_and_symlinks_inside_the_root() {
        let (dir, root) = root();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"four").unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("d/rel")).unwrap();
        // Absolute targets are the sandbox's paths, not the host's.
        std::os::unix::fs::symlink("/d/f", dir.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("/nowhere", dir.path().join("dangling")).unwrap();

        let file = root.stat("/d/f").unwrap();
        assert_eq!(
            (file.kind, file.size_bytes, file.owned_by_user),
            (EntryKind::File, 4, true)
        );
        assert_eq!(file.target, None);
        assert_eq!(root.stat("/d").unwrap().kind, EntryKind::Directory);
        assert_eq!(root.stat("/").unwrap().kind, EntryKind::Directory);

        for link in ["/d/rel", "/abs"] {
            let stat = root.stat(link).unwrap();
            assert_eq!(stat.kind, EntryKind::Symlink);
            assert_eq!(stat.target.as_deref(), Some("/d/f"));
            assert_eq!(stat.target_kind, Some(EntryKind::File));
        }
        let dangling = root.stat("/dangling").unwrap();
        assert_eq!((dangling.target, dangling.target_kind), (None, None));
        assert!(matches!(
            root.stat("/missing"),
            Err(RootfsError::NotFound(_))
        ));
    }

    #[test]
    fn real_path_folds_dots_and_stays_in_the_root() {
        let (dir, root) = root();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("../../../..", dir.path().join("a/b/up")).unwrap();
        assert_eq!(root.real_path("/a/./b/../b").unwrap(), "/a/b");
        // `..` stops at the sandbox's root, as in the kernel's RESOLVE_IN_ROOT.
        assert_eq!(root.real_path("/a/b/up").unwrap(), "/");
        std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
        assert!(root.real_path("/loop").is_err());
    }
}
