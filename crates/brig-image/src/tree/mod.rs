//! Layer trees: the canonical content digest of one layer, the merged view of a
//! stack of layers, diffs between stacks, and turning an overlayfs upper directory
//! into a layer.
//!
//! A layer is a directory tree in the overlayfs layer format with the `userxattr`
//! convention: a whiteout is a character device 0:0 and deletes that name from the
//! layers below; a directory with the xattr `user.overlay.opaque` = `y` hides
//! everything the layers below have under it. An image is a stack of layers,
//! bottom first.
//!
//! # Canonical layer digest (`brig-tree-v1`)
//!
//! The digest of a layer tree is `sha256:` followed by the lowercase hex SHA-256
//! of the byte stream defined here. It depends only on names, metadata and
//! contents: not on directory order, creation order, inode numbers or the
//! filesystem that holds the tree.
//!
//! Encodings used below:
//!
//! - `u64(n)`: `n` as 8 bytes, big-endian.
//! - `i64(n)`: `n` as 8 bytes, big-endian two's complement.
//! - `bytes(b)`: `u64(length of b)` followed by the bytes of `b`.
//!
//! The stream is `bytes("brig-tree-v1")` followed by one record per entry of the
//! tree. Entries are visited depth first, each directory before its children,
//! the children of a directory in ascending order of their names compared as raw
//! bytes (no locale, no Unicode normalization). The root directory is the first
//! entry. Symlinks are never followed.
//!
//! A record is, in this order:
//!
//! 1. `bytes(path)`: the path relative to the root as raw bytes, components joined
//!    by `/`, without leading or trailing `/`. The root's path is empty.
//! 2. The type, one ASCII byte: `f` regular file, `d` directory, `l` symlink,
//!    `c` character device (a whiteout is `c` with device 0:0), `b` block device,
//!    `p` FIFO, `s` socket.
//! 3. `u64(mode & 0o7777)`: the permission bits including setuid, setgid and sticky.
//! 4. `u64(uid)`, then `u64(gid)`.
//! 5. `i64(mtime seconds)`, then `u64(mtime nanoseconds)`.
//! 6. Per type: `f`: `u64(size)` then the 32 raw bytes of the SHA-256 of the
//!    contents; `l`: `bytes(target)`; `c` and `b`: `u64(major)` then `u64(minor)`;
//!    `d`, `p` and `s`: nothing.
//! 7. `u64(number of xattrs)`, then for each xattr in ascending order of its name
//!    as raw bytes: `bytes(name)`, `bytes(value)`.
//!
//! Only content xattrs are recorded: names starting with `user.`, and exactly
//! `security.capability`, `system.posix_acl_access` and `system.posix_acl_default`.
//! Other names are left out because they would make the digest depend on where
//! the tree lives or who reads it: `security.selinux`, `security.ima`, `btrfs.*`
//! and the like are assigned by the host or the filesystem, and `trusted.*` is
//! invisible to unprivileged processes. Overlay xattrs such as
//! `user.overlay.opaque` are content of a layer and are recorded.
//!
//! Not part of the digest: atime, ctime, inode numbers, link counts, sizes of
//! anything but regular files, and hardlink structure: every path of a hardlinked
//! file is its own `f` record, so a tree with a hardlink and a tree with two equal
//! independent files have the same digest.
//!
//! Every variable-length field is length-prefixed and the type byte fixes which
//! fields follow, so a stream decodes to exactly one list of records: two
//! different trees never serialize to the same bytes.
//!
//! # Merged view
//!
//! [`merged`] computes what an overlayfs mount of a stack shows, following the
//! kernel: the uppermost layer that has a name decides its metadata; a whiteout
//! removes the name and everything below it from the layers underneath; an opaque
//! directory, or a directory over a non-directory, hides what the layers
//! underneath have below it; a non-directory over a directory hides that
//! directory's subtree. As in the kernel, the opaque xattr of a layer's root
//! directory is ignored. Paths are absolute-style (`/`, `/etc/passwd`).

mod copy;
mod digest;
mod merge;
mod scan;
mod upper;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::Result;

pub use copy::{copy_beneath, CopyOptions, CopyStats};
pub use digest::{digest, digest_excluding};
pub use merge::{diff, merged, Diff};
pub use upper::clean_upper;

/// The xattr that marks a directory opaque in a `userxattr` overlay layer.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// What kind of filesystem object an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl Kind {
    /// The type letter of the canonical serialization.
    pub fn letter(self) -> u8 {
        match self {
            Kind::File => b'f',
            Kind::Dir => b'd',
            Kind::Symlink => b'l',
            Kind::CharDevice => b'c',
            Kind::BlockDevice => b'b',
            Kind::Fifo => b'p',
            Kind::Socket => b's',
        }
    }

    fn of(file_type: fs::FileType) -> Kind {
        if file_type.is_file() {
            Kind::File
        } else if file_type.is_dir() {
            Kind::Dir
        } else if file_type.is_symlink() {
            Kind::Symlink
        } else if file_type.is_char_device() {
            Kind::CharDevice
        } else if file_type.is_block_device() {
            Kind::BlockDevice
        } else if file_type.is_fifo() {
            Kind::Fifo
        } else {
            // The last type Linux has; anything unknown would fail later when
            // packed, and a socket carries no data either way.
            Kind::Socket
        }
    }
}

/// The metadata of one entry that the digest and diffs look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub kind: Kind,
    /// Permission bits including setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size of a regular file; 0 for everything else, whose sizes depend on the
    /// filesystem (directories) or repeat other fields (symlinks).
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// Target of a symlink.
    pub target: Option<PathBuf>,
    /// `(major, minor)` of a character or block device.
    pub device: Option<(u32, u32)>,
    /// Content xattrs (see [`is_content_xattr`]) by name.
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
}

impl Metadata {
    /// A whiteout deletes its name from the layers below.
    pub fn is_whiteout(&self) -> bool {
        self.kind == Kind::CharDevice && self.device == Some((0, 0))
    }

    /// Reads the metadata of the entry at `path`, whose `lstat` is `st`.
    fn read(path: &Path, st: &fs::Metadata) -> Result<Metadata> {
        let kind = Kind::of(st.file_type());
        let target = match kind {
            Kind::Symlink => Some(scan::read_link(path)?),
            _ => None,
        };
        let device = matches!(kind, Kind::CharDevice | Kind::BlockDevice).then(|| {
            let rdev = st.rdev();
            (rustix::fs::major(rdev), rustix::fs::minor(rdev))
        });
        Ok(Metadata {
            kind,
            mode: st.mode() & 0o7777,
            uid: st.uid(),
            gid: st.gid(),
            size: if kind == Kind::File { st.size() } else { 0 },
            mtime: st.mtime(),
            // The kernel keeps nanoseconds below 1e9, so this never truncates.
            mtime_nsec: st.mtime_nsec() as u32,
            target,
            device,
            xattrs: scan::xattrs(path, is_content_xattr)?,
        })
    }
}

/// One path of a merged view: its metadata and where its content lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Metadata as the mount shows it: content xattrs without overlayfs' own
    /// (`user.overlay.*`), which the mount hides.
    pub meta: Metadata,
    /// Index in the stack (0 = bottom) of the layer this entry comes from.
    pub layer: usize,
    /// The entry's path on the host: the layer's root joined with the entry's path.
    pub source: PathBuf,
}

/// Whether an xattr is part of a tree's content: carried by images, recorded in
/// the digest and compared by diffs. Anything that stores or packs layers should
/// drop the others, which the digest does not cover: names the host or the
/// filesystem assigns (SELinux labels, IMA/EVM hashes, btrfs properties) and
/// `trusted.*`, which only privileged processes can see.
pub fn is_content_xattr(name: &OsStr) -> bool {
    let name = name.as_bytes();
    name.starts_with(b"user.")
        || matches!(
            name,
            b"security.capability" | b"system.posix_acl_access" | b"system.posix_acl_default"
        )
}

/// Whether an xattr belongs to overlayfs itself rather than to the file.
fn is_overlay_xattr(name: &OsStr) -> bool {
    let name = name.as_bytes();
    name.starts_with(b"user.overlay.") || name.starts_with(b"trusted.overlay.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_xattrs() {
        for name in [
            "user.mime_type",
            "user.overlay.opaque",
            "security.capability",
            "system.posix_acl_access",
            "system.posix_acl_default",
        ] {
            assert!(is_content_xattr(OsStr::new(name)), "{name}");
        }
        for name in [
            "trusted.overlay.opaque",
            "trusted.foo",
            "security.selinux",
            "security.ima",
            "security.capabilityx",
            "system.nfs4_acl",
            "btrfs.compression",
            "user",
        ] {
            assert!(!is_content_xattr(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn overlay_xattrs() {
        assert!(is_overlay_xattr(OsStr::new("user.overlay.origin")));
        assert!(is_overlay_xattr(OsStr::new("trusted.overlay.opaque")));
        assert!(!is_overlay_xattr(OsStr::new("user.overlayfoo")));
        assert!(!is_overlay_xattr(OsStr::new("user.mime_type")));
    }
}
