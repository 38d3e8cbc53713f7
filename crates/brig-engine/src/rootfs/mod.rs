//! Files inside a live sandbox, read and written from the host as root.
//!
//! The daemon holds a descriptor for the sandbox's root (`/proc/<init>/root`,
//! the root of the sandbox's mount namespace) and never builds a host path
//! from a sandbox path. Every API path is absolute inside the sandbox and is
//! resolved with openat2 from that descriptor with `RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS`: `..` stops at the root, absolute symlinks restart
//! from it, and `/proc/*/root`, `/proc/*/fd/*` are refused. The untrusted
//! code can change the tree at any moment, so nothing is checked by path and
//! then used by path again: checks are made on descriptors, and changes on
//! the last component are `*at()` calls on its parent's descriptor.
//!
//! Rules, beyond confinement to the root:
//! - **Last component.** Writing, removing and archive extraction act on the
//!   last component itself and never follow it: a symlink there is replaced
//!   or removed, never written through. Reading, listing and archiving a
//!   directory follow symlinks like a process inside the sandbox would (a
//!   symlink in the last position of a read is followed, its target resolved
//!   again from the root).
//! - **New inodes only.** Data is only ever written into files the daemon
//!   has just created (`O_CREAT|O_EXCL`), under a temporary name, renamed over
//!   the target on commit: no write lands in an existing inode, whatever it
//!   is linked to. New entries belong to the sandbox's user (its host ids),
//!   chowned before any data is written; files 0644, directories 0755.
//! - **Reads as the sandbox's user.** The daemon bypasses permission checks,
//!   and host directories (`/usr`...) are bound read-only into sandboxes; so
//!   reads check the mode bits of the file and search permission on every
//!   directory up to the root against the sandbox's ids, as the kernel would
//!   for a process of the sandbox.
//! - **Kernel filesystems** (procfs, sysfs, cgroupfs...) are never read,
//!   listed or written: as host root the daemon would see and change more
//!   than the sandbox may (`/proc/1/mem` of the non-dumpable init...).
//! - **Mounts** are never removed or replaced, and a recursive removal does
//!   not descend into one (`Busy`). Removing a mount point from the host's
//!   mount namespace would silently detach the sandbox's mount.
//!
//! Everything is blocking; the daemon calls it from `spawn_blocking`.

#![forbid(unsafe_code)]

mod error;
mod fsops;
mod path;
mod stat;
mod tar_in;
mod tar_out;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;

pub use error::RootfsError;
pub use stat::EntryStat;
pub use tar_in::{ExtractLimits, ExtractSummary};

use error::{errno, show};
use fsops::{Info, NodeId, OpenRefusal, Stopped, BENEATH, IN_ROOT, PATH_DIR, R, READ_DIR, X};
use path::Final;

/// More symlinks than Linux follows in one resolution (40).
const MAX_SYMLINKS: usize = 40;
/// Directory levels a recursive walk descends (one descriptor each), and
/// ancestors checked for search permission.
const MAX_DEPTH: usize = 256;
/// Entries returned by one listing.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Entries of one directory an archive, or the count of what a snapshot
/// claims, goes through. Not held (names are read a buffer at a time), but a
/// sandbox could add names as fast as they are read.
const MAX_DIR_ENTRIES: usize = 1 << 20;
/// Entries one recursive removal removes at most: a sandbox that adds names as
/// fast as they go would otherwise keep the daemon's thread for ever. Above most
/// real trees (a large node_modules holds a few hundred thousand); a larger one
/// takes more than one request.
#[cfg(not(test))]
const MAX_REMOVED_ENTRIES: u64 = 1 << 20;
#[cfg(test)]
const MAX_REMOVED_ENTRIES: u64 = 5_000;
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;
/// Set-id bits are never given to what the daemon creates.
const MODE_MASK: u32 = 0o7777 & !0o6000;
const CHUNK: usize = 128 * 1024;

/// The root of one sandbox's filesystem.
#[derive(Debug)]
pub struct SandboxRoot {
    root: OwnedFd,
    root_id: NodeId,
    uid: Uid,
    gid: Gid,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

impl EntryKind {
    fn of(file_type: FileType) -> Self {
        match file_type {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Directory,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Directory => "directory",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        }
    }
}

/// Metadata of a file opened for reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub size_bytes: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Unix seconds.
    pub modified: i64,
}

/// What [`SandboxRoot::disk_usage`] reads of a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    pub used_bytes: u64,
    pub size_bytes: u64,
}

/// One entry of [`SandboxRoot::list_dir`], describing the entry itself (a
/// symlink is a symlink; its size is the length of its target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryInfo {
    /// Lossy UTF-8 if the sandbox used other bytes.
    pub name: String,
    pub kind: EntryKind,
    pub size_bytes: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Unix seconds.
    pub modified: i64,
    /// The nanoseconds of `modified`.
    pub modified_nsec: u32,
}

impl DirEntryInfo {
    /// The modification time in nanoseconds since the epoch (saturating),
    /// to notice changes within a second.
    pub fn modified_ns(&self) -> i64 {
        self.modified
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(self.modified_nsec))
    }
}

impl SandboxRoot {
    /// Opens the root of a sandbox: `proc_root` is `/proc/<pid>/root` of a
    /// process inside it (or, in tests, any directory). `owner_uid` and
    /// `owner_gid` are the host ids of the sandbox's user, given to
    /// everything created through this handle.
    pub fn open(proc_root: &Path, owner_uid: u32, owner_gid: u32) -> Result<Self, RootfsError> {
        // -1 means "leave unchanged" to chown.
        if owner_uid == u32::MAX || owner_gid == u32::MAX {
            return Err(RootfsError::io(
                "opening the sandbox's root",
                io::Error::new(io::ErrorKind::InvalidInput, "owner id -1"),
            ));
        }
        // `proc_root` is the daemon's own, trusted: following the magic link
        // is the point. The host path stays out of error messages.
        let root = rustix::fs::open(proc_root, PATH_DIR, Mode::empty())
            .map_err(|e| RootfsError::io("opening the sandbox's root", e.into()))?;
        let root_id = fsops::stat_fd(root.as_fd())
            .map_err(|e| RootfsError::io("inspecting the sandbox's root", e.into()))?
            .id;
        Ok(SandboxRoot {
            root,
            root_id,
            uid: Uid::from_raw(owner_uid),
            gid: Gid::from_raw(owner_gid),
        })
    }

    fn owner(&self) -> (u32, u32) {
        (self.uid.as_raw(), self.gid.as_raw())
    }

    /// Resolves `path` (or a prefix of it, bytes) from the root.
    fn resolve(&self, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        fsops::openat2(self.root.as_fd(), path, flags, IN_ROOT)
    }

    /// The directory `path`, following symlinks (confined), for `*at()` calls.
    fn open_dir(&self, path: &str, shown: &str) -> Result<OwnedFd, RootfsError> {
        self.resolve(path.as_bytes(), PATH_DIR)
            .map_err(|e| errno(e, "opening", shown))
    }

    /// Refuses to act in a directory on a kernel filesystem.
    fn refuse_kernel_fs(&self, fd: BorrowedFd<'_>, shown: &str) -> Result<(), RootfsError> {
        match fsops::kernel_fs(fd) {
            Ok(None) => Ok(()),
            Ok(Some(fs)) => Err(kernel_fs_refused(shown, fs)),
            Err(e) => Err(errno(e, "inspecting", shown)),
        }
    }

    /// Search permission for the sandbox's user on `dir` and every directory
    /// above it up to the root. Walks `..` from the descriptor, so it checks
    /// the directories the kernel would cross to reach `dir` by any path
    /// (every path to an inode goes through its parent).
    fn check_search_path(&self, dir: BorrowedFd<'_>, shown: &str) -> Result<(), RootfsError> {
        let fail = |e: Errno| errno(e, "inspecting", shown);
        let mut info = fsops::stat_fd(dir).map_err(fail)?;
        let mut current: Option<OwnedFd> = None;
        for _ in 0..max_ancestors() {
            if !fsops::permits(&info, self.owner(), X) {
                return Err(denied(shown));
            }
            if info.id == self.root_id {
                return Ok(());
            }
            let here = current.as_ref().map_or(dir, |fd| fd.as_fd());
            // `..` is resolved unconfined on purpose: only stat'ed, and the
            // walk stops at the root (or fails if it never meets it).
            let up = rustix::fs::openat(here, "..", PATH_DIR, Mode::empty()).map_err(fail)?;
            let up_info = fsops::stat_fd(up.as_fd()).map_err(fail)?;
            if up_info.id == info.id {
                return Err(RootfsError::Escapes(format!(
                    "{shown}: not below the sandbox's root"
                )));
            }
            current = Some(up);
            info = up_info;
        }
        Err(RootfsError::Escapes(format!(
            "{shown}: not below the sandbox's root"
        )))
    }

    /// Opens a regular file for reading. A symlink in the last position is
    /// followed (its target resolved again from the root, so it cannot leave
    /// it); directories, devices, fifos and sockets are `NotAFile`. The file
    /// must be readable by the sandbox's user.
    pub fn open_read(&self, path: &str) -> Result<(File, FileStat), RootfsError> {
        path::check(path)?;
        let shown = show(path.as_bytes());
        let (parent, name) = match self.locate(path, &shown)? {
            Located::Dir => return Err(RootfsError::NotAFile(format!("{shown}: is a directory"))),
            Located::Entry { parent, name } => (parent, name),
        };
        self.check_search_path(parent.as_fd(), &shown)?;
        let owner = self.owner();
        let check = |info: &Info| {
            if fsops::permits(info, owner, R) {
                Ok(())
            } else {
                Err(OpenRefusal::Denied)
            }
        };
        let (file, info) = fsops::open_regular(parent.as_fd(), &name, &check)
            .map_err(|refusal| refused(refusal, &shown))?;
        Ok((
            file,
            FileStat {
                size_bytes: info.size,
                mode: info.perm,
                modified: info.mtime,
            },
        ))
    }

    /// Finds the real parent directory and name of what `path` designates,
    /// following a symlink in the last position by hand (its target is
    /// resolved again from the root: a relative target from the symlink's
    /// directory, as the kernel does). The parent is needed to check search
    /// permission above a file, which has no `..` of its own.
    fn locate(&self, path: &str, shown: &str) -> Result<Located, RootfsError> {
        let mut current: Vec<u8> = path.as_bytes().to_vec();
        for _ in 0..=MAX_SYMLINKS {
            let trimmed_len = current
                .iter()
                .rposition(|&b| b != b'/')
                .map_or(0, |i| i + 1);
            let trailing_slash = trimmed_len < current.len();
            let trimmed = &current[..trimmed_len];
            // Every path here is absolute: no slash left means `/`.
            let Some(slash) = trimmed.iter().rposition(|&b| b == b'/') else {
                return Ok(Located::Dir);
            };
            let name = &trimmed[slash + 1..];
            // `x/.`, `x/..` and `x/` can only be directories: the kernel
            // resolves them entirely.
            if trailing_slash || name == b"." || name == b".." {
                self.resolve(&current, PATH_DIR)
                    .map_err(|e| errno(e, "opening", shown))?;
                return Ok(Located::Dir);
            }
            let parent_path: &[u8] = if slash == 0 { b"/" } else { &trimmed[..slash] };
            let parent = self
                .resolve(parent_path, PATH_DIR)
                .map_err(|e| errno(e, "opening", shown))?;
            self.refuse_kernel_fs(parent.as_fd(), shown)?;
            let info =
                fsops::stat_at(parent.as_fd(), name).map_err(|e| errno(e, "opening", shown))?;
            match info.file_type {
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(parent.as_fd(), name, Vec::new())
                        .map_err(|e| errno(e, "reading the symlink", shown))?
                        .into_bytes();
                    if target.is_empty() {
                        return Err(RootfsError::NotFound(format!(
                            "{shown}: no such file or directory (empty symlink)"
                        )));
                    }
                    // Sandbox paths, resolved from the sandbox's root again:
                    // joining them cannot name anything outside it.
                    current = if target.starts_with(b"/") {
                        target
                    } else {
                        let mut joined = parent_path.to_vec();
                        joined.push(b'/');
                        joined.extend_from_slice(&target);
                        joined
                    };
                    if current.len() > path::MAX_PATH {
                        return Err(RootfsError::InvalidPath(format!(
                            "{shown}: symlink target too long"
                        )));
                    }
                }
                FileType::Directory => return Ok(Located::Dir),
                _ => {
                    return Ok(Located::Entry {
                        parent,
                        name: name.to_vec(),
                    })
                }
            }
        }
        Err(RootfsError::Escapes(format!(
            "{shown}: too many levels of symlinks"
        )))
    }

    /// Starts writing the regular file `path`, created with mode 0644. See
    /// [`SandboxRoot::create_write_mode`].
    pub fn create_write(&self, path: &str, make_parents: bool) -> Result<FileWriter, RootfsError> {
        self.create_write_mode(path, make_parents, FILE_MODE)
    }

    /// Starts writing the regular file `path`: data goes to a new file with a
    /// temporary name in the same directory, owned by the sandbox's user,
    /// with `mode` (set-id bits dropped); [`FileWriter::commit`] renames it
    /// over `path`, atomically replacing a file or a symlink there (never
    /// written through). A directory or a mount point at `path` is refused.
    /// With `make_parents`, missing directories are created as by
    /// [`SandboxRoot::mkdir_all`].
    pub fn create_write_mode(
        &self,
        path: &str,
        make_parents: bool,
        mode: u32,
    ) -> Result<FileWriter, RootfsError> {
        let shown = show(path.as_bytes());
        let (parent_path, name) = match path::split_final(path)? {
            Final::Root => return Err(RootfsError::NotAFile(format!("{shown}: is a directory"))),
            Final::Entry { parent, name } => (parent, name),
        };
        let parent = if make_parents {
            self.ensure_dir(parent_path)?
        } else {
            self.open_dir(parent_path, &shown)?
        };
        self.new_writer(parent, name.as_bytes(), shown, mode)
    }

    /// A writer for `name` in `parent`: checks that it may be replaced,
    /// creates the temporary file, gives it to the sandbox's user.
    fn new_writer(
        &self,
        parent: OwnedFd,
        name: &[u8],
        shown: String,
        mode: u32,
    ) -> Result<FileWriter, RootfsError> {
        self.refuse_kernel_fs(parent.as_fd(), &shown)?;
        check_replaceable(parent.as_fd(), name, &shown)?;
        let (file, temp) = create_temp(parent.as_fd(), &shown)?;
        let writer = FileWriter {
            file,
            parent,
            temp,
            name: name.to_vec(),
            shown,
            committed: false,
        };
        // Owner first, before any data: the file is never the daemon's with
        // the caller's content in it. chown also clears set-id bits, so the
        // mode comes after.
        rustix::fs::fchown(&writer.file, Some(self.uid), Some(self.gid))
            .map_err(|e| errno(e, "setting the owner of", &writer.shown))?;
        rustix::fs::fchmod(&writer.file, Mode::from_bits_truncate(mode & MODE_MASK))
            .map_err(|e| errno(e, "setting the mode of", &writer.shown))?;
        Ok(writer)
    }

    /// Creates the new empty regular file `path` (mode 0644, the sandbox
    /// user's) and returns it open for writing: for a descriptor handed to a
    /// process in the sandbox, such as its output. Nothing may exist at
    /// `path`, not even a symlink (`AlreadyExists`): the file is always new.
    pub fn create_file(&self, path: &str, make_parents: bool) -> Result<File, RootfsError> {
        let shown = show(path.as_bytes());
        let (parent_path, name) = match path::split_final(path)? {
            Final::Root => {
                return Err(RootfsError::AlreadyExists(format!(
                    "{shown}: is a directory"
                )))
            }
            Final::Entry { parent, name } => (parent, name),
        };
        let parent = if make_parents {
            self.ensure_dir(parent_path)?
        } else {
            self.open_dir(parent_path, &shown)?
        };
        self.refuse_kernel_fs(parent.as_fd(), &shown)?;
        let fd = fsops::openat2(
            parent.as_fd(),
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            BENEATH,
        )
        .map_err(|e| errno(e, "creating", &shown))?;
        let owned = rustix::fs::fchown(&fd, Some(self.uid), Some(self.gid))
            .and_then(|()| rustix::fs::fchmod(&fd, Mode::from_bits_truncate(FILE_MODE)));
        if let Err(e) = owned {
            // Not left behind as the daemon's.
            let _ = rustix::fs::unlinkat(&parent, name, AtFlags::empty());
            return Err(errno(e, "setting the owner of", &shown));
        }
        Ok(File::from(fd))
    }

    /// Renames `from` to `to`, like rename(2) inside the sandbox: neither
    /// last component is followed (a symlink is moved or replaced itself),
    /// a file or symlink at `to` is replaced atomically, an empty directory
    /// by a directory. Mount points are refused on either side, as is a move
    /// across mounts (`InvalidPath`).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), RootfsError> {
        let shown_from = show(from.as_bytes());
        let shown_to = show(to.as_bytes());
        let root_refused = |shown: &str| {
            RootfsError::InvalidPath(format!("{shown}: the sandbox's root cannot be renamed"))
        };
        let Final::Entry {
            parent: from_parent,
            name: from_name,
        } = path::split_final(from)?
        else {
            return Err(root_refused(&shown_from));
        };
        let Final::Entry {
            parent: to_parent,
            name: to_name,
        } = path::split_final(to)?
        else {
            return Err(root_refused(&shown_to));
        };
        let from_dir = self.open_dir(from_parent, &shown_from)?;
        let to_dir = self.open_dir(to_parent, &shown_to)?;
        self.refuse_kernel_fs(from_dir.as_fd(), &shown_from)?;
        self.refuse_kernel_fs(to_dir.as_fd(), &shown_to)?;
        let source = fsops::stat_at(from_dir.as_fd(), from_name)
            .map_err(|e| errno(e, "renaming", &shown_from))?;
        if source.mount_root {
            return Err(mount_point(&shown_from));
        }
        let target = fsops::stat_at_opt(to_dir.as_fd(), to_name)
            .map_err(|e| errno(e, "inspecting", &shown_to))?;
        if target.is_some_and(|t| t.mount_root) {
            return Err(mount_point(&shown_to));
        }
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(|e| match e {
            Errno::XDEV => RootfsError::InvalidPath(format!(
                "{shown_from}: cannot be renamed to {shown_to}, on another mount"
            )),
            Errno::INVAL => RootfsError::InvalidPath(format!(
                "{shown_from}: cannot be moved into itself ({shown_to})"
            )),
            // EISDIR, ENOTDIR, ENOTEMPTY are about the target.
            Errno::ISDIR | Errno::NOTDIR | Errno::NOTEMPTY | Errno::EXIST => {
                errno(e, "renaming", &shown_to)
            }
            other => errno(other, "renaming", &shown_from),
        })
    }

    /// Checks that `path` is a directory the sandbox's user may list (what
    /// [`SandboxRoot::write_tar`] needs first), without reading its entries.
    pub fn check_dir(&self, path: &str) -> Result<(), RootfsError> {
        path::check(path)?;
        let shown = show(path.as_bytes());
        let dir = self.open_dir(path, &shown)?;
        self.check_listable(dir.as_fd(), &shown)?;
        rustix::fs::openat(&dir, ".", READ_DIR, Mode::empty())
            .map(drop)
            .map_err(|e| errno(e, "opening", &shown))
    }

    /// Lists the directory `path` (following symlinks, confined), sorted by
    /// name; at most [`MAX_LIST_ENTRIES`] entries, else `TooLarge`.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntryInfo>, RootfsError> {
        path::check(path)?;
        let shown = show(path.as_bytes());
        let dir = self.open_dir(path, &shown)?;
        self.check_listable(dir.as_fd(), &shown)?;
        let reader = rustix::fs::openat(&dir, ".", READ_DIR, Mode::empty())
            .map_err(|e| errno(e, "opening", &shown))?;
        let (names, more) = fsops::read_names(reader.as_fd(), MAX_LIST_ENTRIES)
            .map_err(|e| errno(e, "listing", &shown))?;
        if more {
            return Err(RootfsError::TooLarge(format!(
                "{shown}: more than {MAX_LIST_ENTRIES} entries"
            )));
        }
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            let info = match fsops::stat_at(reader.as_fd(), &name) {
                Ok(info) => info,
                // Removed by the sandbox since it was listed.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(errno(e, "inspecting an entry of", &shown)),
            };
            entries.push((name, info));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(entries
            .into_iter()
            .map(|(name, info)| DirEntryInfo {
                name: String::from_utf8_lossy(&name).into_owned(),
                kind: EntryKind::of(info.file_type),
                size_bytes: info.size,
                mode: info.perm,
                modified: info.mtime,
                modified_nsec: info.mtime_nsec,
            })
            .collect())
    }

    /// Bytes used and the size of the filesystem holding the directory `path`.
    pub fn disk_usage(&self, path: &str) -> Result<DiskUsage, RootfsError> {
        path::check(path)?;
        let shown = show(path.as_bytes());
        let dir = self.open_dir(path, &shown)?;
        let stat = rustix::fs::fstatvfs(&dir).map_err(|e| errno(e, "inspecting", &shown))?;
        Ok(DiskUsage {
            used_bytes: stat
                .f_blocks
                .saturating_sub(stat.f_bfree)
                .saturating_mul(stat.f_frsize),
            size_bytes: stat.f_blocks.saturating_mul(stat.f_frsize),
        })
    }

    /// A directory may be listed (and archived): not on a kernel filesystem,
    /// readable and searchable by the sandbox's user, as is the way to it.
    fn check_listable(&self, dir: BorrowedFd<'_>, shown: &str) -> Result<(), RootfsError> {
        self.refuse_kernel_fs(dir, shown)?;
        let info = fsops::stat_fd(dir).map_err(|e| errno(e, "inspecting", shown))?;
        if !fsops::permits(&info, self.owner(), R | X) {
            return Err(denied(shown));
        }
        self.check_search_path(dir, shown)
    }

    /// Creates the directory `path` and missing parents (like `mkdir -p`),
    /// owned by the sandbox's user, mode 0755. Existing directories (or
    /// symlinks to directories) are left as they are.
    pub fn mkdir_all(&self, path: &str) -> Result<(), RootfsError> {
        path::check(path)?;
        self.ensure_dir(path).map(drop)
    }

    /// [`SandboxRoot::mkdir_all`], returning the directory.
    fn ensure_dir(&self, path: &str) -> Result<OwnedFd, RootfsError> {
        let shown = show(path.as_bytes());
        match self.resolve(path.as_bytes(), PATH_DIR) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(errno(e, "opening", &shown)),
        }
        // One prefix at a time, each resolved from the root again, so that
        // `..` and symlinks among the components mean what they would to
        // `mkdir -p` inside the sandbox.
        let mut current = self
            .resolve(b"/", PATH_DIR)
            .map_err(|e| errno(e, "opening", "/"))?;
        let mut prefix = String::with_capacity(path.len());
        for component in path::components(path) {
            prefix.push('/');
            prefix.push_str(component);
            let shown_prefix = show(prefix.as_bytes());
            match self.resolve(prefix.as_bytes(), PATH_DIR) {
                Ok(fd) => {
                    current = fd;
                    continue;
                }
                Err(Errno::NOENT) => {}
                Err(e) => return Err(errno(e, "opening", &shown_prefix)),
            }
            self.refuse_kernel_fs(current.as_fd(), &shown_prefix)?;
            current = match self.make_dir(current.as_fd(), component.as_bytes(), DIR_MODE) {
                Ok(fd) => fd,
                // Created meanwhile by someone else, or a dangling symlink.
                Err(Errno::EXIST) => match self.resolve(prefix.as_bytes(), PATH_DIR) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT) => {
                        return Err(RootfsError::AlreadyExists(format!(
                            "{shown_prefix}: exists and is not a directory (a dangling symlink?)"
                        )))
                    }
                    Err(e) => return Err(errno(e, "opening", &shown_prefix)),
                },
                Err(e) => return Err(errno(e, "creating directory", &shown_prefix)),
            };
        }
        Ok(current)
    }

    /// The prefixes of `path` (`/a`, `/a/b`, ...) that do not exist yet, from the
    /// first missing one down: what [`SandboxRoot::ensure_dir`] would create, for
    /// undoing it.
    fn missing_prefixes(&self, path: &str) -> Vec<String> {
        let mut prefix = String::with_capacity(path.len());
        let mut missing = Vec::new();
        for component in path::components(path) {
            prefix.push('/');
            prefix.push_str(component);
            if !missing.is_empty() || self.resolve(prefix.as_bytes(), PATH_DIR).is_err() {
                missing.push(prefix.clone());
            }
        }
        missing
    }

    /// Creates directory `name` in `parent`, owned by the sandbox's user.
    fn make_dir(&self, parent: BorrowedFd<'_>, name: &[u8], mode: u32) -> Result<OwnedFd, Errno> {
        rustix::fs::mkdirat(parent, name, Mode::from_bits_truncate(0o700))?;
        // Opened without following: if the sandbox swapped in a symlink
        // meanwhile, this fails rather than chowning its target.
        let dir = fsops::openat2(parent, name, READ_DIR | OFlags::NOFOLLOW, BENEATH)?;
        rustix::fs::fchown(&dir, Some(self.uid), Some(self.gid))?;
        // After chown (which clears set-id bits); also undoes the umask.
        rustix::fs::fchmod(&dir, Mode::from_bits_truncate(mode & MODE_MASK))?;
        Ok(dir)
    }

    /// Removes `path` itself: a symlink is removed, never followed. A
    /// directory must be empty unless `recursive`; a recursive removal walks
    /// with descriptors, never follows a symlink and never enters another
    /// mount (`Busy`). `/` and mount points are refused.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), RootfsError> {
        let shown = show(path.as_bytes());
        let (parent_path, name) = match path::split_final(path)? {
            Final::Root => {
                return Err(RootfsError::InvalidPath(
                    "refusing to remove the sandbox's root".into(),
                ))
            }
            Final::Entry { parent, name } => (parent, name),
        };
        let parent = self.open_dir(parent_path, &shown)?;
        self.refuse_kernel_fs(parent.as_fd(), &shown)?;
        let info =
            fsops::stat_at(parent.as_fd(), name).map_err(|e| errno(e, "removing", &shown))?;
        if info.mount_root {
            return Err(mount_point(&shown));
        }
        let name = name.as_bytes();
        let result = if !info.is_dir() {
            rustix::fs::unlinkat(&parent, name, AtFlags::empty())
        } else if !recursive {
            rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)
        } else {
            let mut shown_path = path.trim_end_matches('/').as_bytes().to_vec();
            let mut budget = MAX_REMOVED_ENTRIES;
            return remove_tree(parent.as_fd(), name, &mut shown_path, 0, &mut budget);
        };
        result.map_err(|e| errno(e, "removing", &shown))
    }

    /// Streams a tar of the contents of directory `dir` (followed if a
    /// symlink, confined) to `out`, names relative to it: regular files,
    /// directories, and symlinks stored as symlinks (never followed); other
    /// types, kernel filesystems and what the sandbox's user could not read
    /// are left out. Files are streamed, never held in memory. On an error
    /// the archive written so far is cut short.
    pub fn write_tar<W: Write>(&self, dir: &str, out: W) -> Result<(), RootfsError> {
        tar_out::write_tar(self, dir, out)
    }

    /// Extracts a tar stream into directory `dir` (created if missing, owned
    /// by the sandbox's user). Absolute names and `..` are refused, no
    /// symlink is ever followed (from the archive or already there), files
    /// replace what is at their name without writing through it, hard links
    /// only reach files extracted earlier from the same archive, devices and
    /// fifos are skipped; everything belongs to the sandbox's user, modes
    /// without set-id bits. All or nothing: a refused archive changes nothing
    /// (see `tar_in`).
    pub fn extract_tar<R: Read>(
        &self,
        dir: &str,
        input: R,
        limits: ExtractLimits,
    ) -> Result<ExtractSummary, RootfsError> {
        tar_in::extract_tar(self, dir, input, limits, &mut Direct::new())
    }

    /// [`SandboxRoot::extract_tar`] with the files' data written by `filler`.
    pub fn extract_tar_with<R: Read>(
        &self,
        dir: &str,
        input: R,
        limits: ExtractLimits,
        filler: &mut dyn Filler,
    ) -> Result<ExtractSummary, RootfsError> {
        tar_in::extract_tar(self, dir, input, limits, filler)
    }
}

fn max_ancestors() -> usize {
    // A path of PATH_MAX has at most 2048 components; mounts add a few.
    path::MAX_PATH / 2 + MAX_DEPTH
}

enum Located {
    Dir,
    Entry { parent: OwnedFd, name: Vec<u8> },
}

/// A file being written; see [`SandboxRoot::create_write_mode`]. Dropping it
/// without [`FileWriter::commit`] removes the temporary file and leaves the
/// target as it was.
#[derive(Debug)]
pub struct FileWriter {
    file: File,
    parent: OwnedFd,
    temp: Vec<u8>,
    name: Vec<u8>,
    shown: String,
    committed: bool,
}

impl FileWriter {
    /// The new file (not yet at its path). Anything written here is what
    /// commit puts in place.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// The sandbox path this writer will commit to.
    pub fn path(&self) -> &str {
        &self.shown
    }

    /// Fills the new file from `input` through `filler`: `len` bytes, or up to
    /// the end of `input` with `None`. Returns the bytes copied (fewer than
    /// `len` if `input` ended first).
    pub fn fill(
        &mut self,
        filler: &mut dyn Filler,
        input: &mut dyn Read,
        len: Option<u64>,
    ) -> Result<u64, FillError> {
        filler.fill(&self.file, input, len, &self.shown)
    }

    /// Appends `data`, with errors mapped (ENOSPC/EDQUOT are `NoSpace`).
    pub fn write_chunk(&mut self, data: &[u8]) -> Result<(), RootfsError> {
        self.file
            .write_all(data)
            .map_err(|e| error::io_error(e, "writing", &self.shown))
    }

    /// Streams `input` into the file through a fixed buffer; returns the
    /// number of bytes copied. Errors reading `input` are `Io`.
    pub fn copy_from<R: Read>(&mut self, mut input: R) -> Result<u64, RootfsError> {
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(RootfsError::io(
                        format!("reading the data for {}", self.shown),
                        e,
                    ))
                }
            };
            self.write_chunk(&buf[..n])?;
            total += n as u64;
        }
    }

    /// Puts the file in place: renames it over the target (a file or a
    /// symlink there is replaced; a directory or mount point refused).
    /// Returns the file's size. Not fsync'ed: a sandbox does not outlive a
    /// host crash.
    pub fn commit(mut self) -> Result<u64, RootfsError> {
        let size = rustix::fs::fstat(&self.file)
            .map_err(|e| errno(e, "inspecting", &self.shown))?
            .st_size;
        check_replaceable(self.parent.as_fd(), &self.name, &self.shown)?;
        rustix::fs::renameat(&self.parent, &self.temp, &self.parent, &self.name)
            .map_err(|e| errno(e, "replacing", &self.shown))?;
        self.committed = true;
        Ok(u64::try_from(size).unwrap_or(0))
    }
}

impl Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        if !self.committed {
            // The temp name was created by us in this very directory; if the
            // sandbox renamed it away meanwhile, this removes nothing else
            // of importance (at worst an entry it put under that name).
            let _ = rustix::fs::unlinkat(&self.parent, &self.temp, AtFlags::empty());
        }
    }
}

/// The error of a write into `shown` that failed with `errno` in the sandbox:
/// there, ENOMEM means the session's memory limit refused the file's pages.
pub fn write_errno(errno: i32, shown: &str) -> RootfsError {
    match Errno::from_raw_os_error(errno) {
        Errno::NOMEM => error::no_memory(shown),
        e => error::errno(e, "writing", shown),
    }
}

/// A file that did not fit in the session's memory.
pub fn out_of_memory(shown: &str) -> RootfsError {
    error::no_memory(shown)
}

/// Who writes the data of the files the daemon creates. tmpfs pages are charged
/// to the memory cgroup of the task that writes them: bytes [`Direct`] writes are
/// the daemon's memory, so the files of a live session are filled by a process
/// inside it instead (the session's copier, see `backend::namespaces::copy_in`), and are its
/// memory, under its limit. Either way the file is the new one the daemon made
/// and checked: a filler is handed its descriptor, never a path.
pub trait Filler {
    /// Copies `input` into `file`, a new empty file open for writing: `len`
    /// bytes, or up to the end of `input` with `None`. Returns the bytes copied:
    /// fewer than `len` when `input` ended first. `shown` names the file in
    /// errors.
    fn fill(
        &mut self,
        file: &File,
        input: &mut dyn Read,
        len: Option<u64>,
        shown: &str,
    ) -> Result<u64, FillError>;
}

/// Why a [`Filler`] failed: reading its input (the caller's to explain) or
/// writing the file.
#[derive(Debug)]
pub enum FillError {
    Input(io::Error),
    Output(RootfsError),
}

/// Writes the data itself, charged to the daemon: for files that are the daemon's
/// to pay for, and tests.
pub struct Direct {
    buf: Vec<u8>,
}

impl Direct {
    pub fn new() -> Direct {
        Direct {
            buf: vec![0; CHUNK],
        }
    }
}

impl Default for Direct {
    fn default() -> Self {
        Direct::new()
    }
}

impl Filler for Direct {
    fn fill(
        &mut self,
        mut file: &File,
        input: &mut dyn Read,
        len: Option<u64>,
        shown: &str,
    ) -> Result<u64, FillError> {
        let mut copied = 0u64;
        loop {
            let want = len.map_or(CHUNK, |len| (len - copied).min(CHUNK as u64) as usize);
            if want == 0 {
                return Ok(copied);
            }
            let n = match input.read(&mut self.buf[..want]) {
                Ok(0) => return Ok(copied),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(FillError::Input(e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|e| FillError::Output(error::io_error(e, "writing", shown)))?;
            copied += n as u64;
        }
    }
}

/// Whether `name` in `parent` may be replaced by a new file: not a directory
/// and not a mount point. Absent is fine.
fn check_replaceable(parent: BorrowedFd<'_>, name: &[u8], shown: &str) -> Result<(), RootfsError> {
    match fsops::stat_at_opt(parent, name).map_err(|e| errno(e, "inspecting", shown))? {
        Some(info) if info.mount_root => Err(mount_point(shown)),
        Some(info) if info.is_dir() => {
            Err(RootfsError::NotAFile(format!("{shown}: is a directory")))
        }
        _ => Ok(()),
    }
}

/// A fresh name for something the daemon creates and then renames into
/// place. Seen by the sandbox meanwhile; unique per process and call.
fn temp_name() -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let pid = rustix::process::getpid().as_raw_nonzero().get();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(".brig-tmp-{pid:x}-{n:x}-{nanos:x}").into_bytes()
}

/// Runs `create` with fresh temporary names until one is free (the sandbox
/// may have taken one).
fn with_temp_name<T>(
    shown: &str,
    mut create: impl FnMut(&[u8]) -> Result<T, Errno>,
) -> Result<(T, Vec<u8>), RootfsError> {
    for _ in 0..16 {
        let temp = temp_name();
        match create(&temp) {
            Ok(made) => return Ok((made, temp)),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(errno(e, "creating", shown)),
        }
    }
    Err(RootfsError::io(
        format!("creating a temporary file for {shown}"),
        io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
    ))
}

/// Creates a new empty file with a fresh temporary name in `parent`. O_EXCL
/// and O_NOFOLLOW: whatever the sandbox put under that name (a symlink, a
/// file), the new name is never it.
fn create_temp(parent: BorrowedFd<'_>, shown: &str) -> Result<(File, Vec<u8>), RootfsError> {
    let (fd, temp) = with_temp_name(shown, |temp| {
        fsops::openat2(
            parent,
            temp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            BENEATH,
        )
    })?;
    Ok((File::from(fd), temp))
}

/// Removes directory `name` in `parent` and everything below it. The walk
/// holds a descriptor per level, opened with `O_NOFOLLOW` and
/// `RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: a directory swapped for a symlink
/// mid-walk is unlinked as a symlink, and the walk never leaves the mount it
/// started on. `shown` is the sandbox path of `name`, for messages.
fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &[u8],
    shown: &mut Vec<u8>,
    depth: usize,
    budget: &mut u64,
) -> Result<(), RootfsError> {
    let fail = |e: Errno, what: &str, shown: &[u8]| errno(e, what, &show(shown));
    if depth >= MAX_DEPTH {
        return Err(RootfsError::TooLarge(format!(
            "{}: nested more than {MAX_DEPTH} directories deep",
            show(shown)
        )));
    }
    // A sandbox can keep adding entries while they are removed; give up
    // after a few rounds rather than loop forever.
    for _ in 0..4 {
        let dir = match fsops::openat2(
            parent,
            name,
            READ_DIR | OFlags::NOFOLLOW,
            BENEATH | rustix::fs::ResolveFlags::NO_XDEV,
        ) {
            Ok(dir) => dir,
            Err(Errno::XDEV) => return Err(mount_point(&show(shown))),
            // No longer a directory: remove whatever it became, unfollowed.
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => Ok(()),
                    Err(e) => Err(fail(e, "removing", shown)),
                }
            }
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(fail(e, "opening", shown)),
        };
        #[cfg(test)]
        tests::hooks::walked(shown);
        loop {
            #[cfg(test)]
            tests::hooks::listing(shown);
            // Passes over the names, streamed and removed as they come, until one
            // finds none: entries the sandbox adds during a pass may be missed by it.
            let mut found = false;
            fsops::each_name(dir.as_fd(), |child| {
                found = true;
                if *budget == 0 {
                    return Err(RootfsError::NotEmpty(format!(
                        "{}: removal stopped after {MAX_REMOVED_ENTRIES} entries, the most \
                         one request removes (or entries keep appearing); the rest is still \
                         there: ask again",
                        show(shown)
                    )));
                }
                *budget -= 1;
                let len = shown.len();
                shown.push(b'/');
                shown.extend_from_slice(child);
                let result = remove_child(dir.as_fd(), child, shown, depth, budget);
                shown.truncate(len);
                result.map(|()| ControlFlow::Continue(()))
            })
            .map_err(|stopped| match stopped {
                Stopped::Listing(e) => fail(e, "listing", shown),
                Stopped::By(e) => e,
            })?;
            if !found {
                break;
            }
        }
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::NOTEMPTY) => continue,
            // Swapped for something else after it was emptied.
            Err(Errno::NOTDIR) => {
                return match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => Ok(()),
                    Err(e) => Err(fail(e, "removing", shown)),
                }
            }
            Err(e) => return Err(fail(e, "removing", shown)),
        }
    }
    Err(RootfsError::NotEmpty(format!(
        "{}: directory not empty (entries keep appearing)",
        show(shown)
    )))
}

fn remove_child(
    dir: BorrowedFd<'_>,
    name: &[u8],
    shown: &mut Vec<u8>,
    depth: usize,
    budget: &mut u64,
) -> Result<(), RootfsError> {
    let info = match fsops::stat_at(dir, name) {
        Ok(info) => info,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(errno(e, "inspecting", &show(shown))),
    };
    if info.mount_root {
        return Err(mount_point(&show(shown)));
    }
    if info.is_dir() {
        return remove_tree(dir, name, shown, depth + 1, budget);
    }
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        // Became a directory since the stat.
        Err(Errno::ISDIR) => remove_tree(dir, name, shown, depth + 1, budget),
        Err(e) => Err(errno(e, "removing", &show(shown))),
    }
}

fn mount_point(shown: &str) -> RootfsError {
    RootfsError::Busy(format!(
        "{shown}: is a mount point, which cannot be removed or replaced"
    ))
}

fn denied(shown: &str) -> RootfsError {
    RootfsError::PermissionDenied(format!(
        "{shown}: permission denied (the session's user could not read it)"
    ))
}

fn kernel_fs_refused(shown: &str, fs: &str) -> RootfsError {
    RootfsError::Escapes(format!(
        "{shown}: is on a kernel filesystem ({fs}) that the API does not access; use exec in the session"
    ))
}

fn refused(refusal: OpenRefusal, shown: &str) -> RootfsError {
    match refusal {
        OpenRefusal::Errno(e) => errno(e, "opening", shown),
        OpenRefusal::NotRegular(file_type) => RootfsError::NotAFile(format!(
            "{shown}: is {}, not a regular file",
            fsops::kind_name(file_type)
        )),
        OpenRefusal::KernelFs(fs) => kernel_fs_refused(shown, fs),
        OpenRefusal::Denied => denied(shown),
        OpenRefusal::Changing => {
            RootfsError::NotAFile(format!("{shown}: kept changing while being opened"))
        }
        OpenRefusal::Leased => leased(shown),
    }
}

fn leased(shown: &str) -> RootfsError {
    RootfsError::Busy(format!(
        "{shown}: the file is leased by a process in the sandbox (fcntl F_SETLEASE); \
         try again once it lets go"
    ))
}
