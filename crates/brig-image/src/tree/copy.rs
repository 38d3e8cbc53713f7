//! A private, frozen copy of a tree a sandbox can still change.
//!
//! A snapshot packs what a sandbox wrote, as host root, with a tool (mkfs.erofs)
//! that walks its input by path. Run over the sandbox's own tree, a symlink swapped
//! in mid-walk would make it pack host files, and bytes written between the digest
//! and the pack would be stored under a digest that does not describe them. So the
//! tree is first copied, by descriptors, into a directory only the store can reach,
//! and everything after (cleanup, digest, pack) reads that copy alone.
//!
//! The copy never follows a symlink and never leaves the tree: every name is
//! opened relative to its parent's descriptor with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`,
//! only regular files and directories are ever opened (devices, fifos and sockets
//! are recreated from their `lstat`), and an entry that is not what its `lstat`
//! said when it is opened fails the copy ([`ImageError::Changed`]). Its owners are
//! the ones that will be stored (`force_owner`), so the digest of the copy is the
//! digest of the layer. Sizes are bounded up front: a regular file counts at its
//! apparent size, so a sparse file cannot make packing (which reads holes as
//! zeros) unbounded. Holes are kept as holes in the copy.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{
    AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, SeekFrom, Stat, Timespec, Timestamps,
    XattrFlags,
};
use rustix::io::Errno;

use crate::error::{ImageError, IoContext, Result};
use crate::progress::Progress;

/// Directory levels copied at most: one descriptor and two stack frames each. As
/// deep as the daemon's other walks of a sandbox's tree (archives, removals), and
/// what fits the 2 MiB stack of its blocking threads in a debug build.
pub const MAX_DEPTH: usize = 256;

/// How the source is resolved: beneath the parent, never through a symlink, a
/// magic link or into another mount.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// NONBLOCK and NOCTTY: a name swapped for a fifo or a terminal since its `lstat`
/// must not block or change anything when opened (it is then refused).
const FILE_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);
const CHUNK: usize = 1 << 20;

/// What to copy and how.
#[derive(Debug, Clone, Default)]
pub struct CopyOptions {
    /// Every entry gets this uid:gid in the copy (what the layer will store).
    pub force_owner: Option<(u32, u32)>,
    /// Paths relative to the source left out, with everything below them.
    pub exclude: Vec<PathBuf>,
    /// The most the regular files may add up to at their apparent sizes.
    pub max_bytes: Option<u64>,
    /// The path the tree is shown as in messages (`/workspace`; empty for `/`).
    pub shown_as: String,
}

/// What a copy held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub entries: u64,
    /// Regular files at their apparent sizes (each hardlinked inode once).
    pub bytes: u64,
}

/// Copies the directory `source` (a descriptor, possibly of a detached mount) to
/// the new directory `dest`, which must not exist and whose parent only the caller
/// can reach. See the module's documentation for what it guarantees.
pub fn copy_beneath(
    source: BorrowedFd<'_>,
    dest: &Path,
    options: &CopyOptions,
    progress: &dyn Progress,
) -> Result<CopyStats> {
    let root = rustix::fs::openat(source, ".", DIR_FLAGS, Mode::empty())
        .context(|| "open the tree to copy".into())?;
    let st = rustix::fs::fstat(&root).context(|| "inspect the tree to copy".into())?;
    // What a sandbox hands over is a tree of its files; a kernel filesystem read as
    // root would show more than the sandbox may see.
    if let Some(fs) =
        brig_sys::resolve::kernel_fs(root.as_fd()).context(|| "inspect the tree to copy".into())?
    {
        return Err(ImageError::BadSource(format!(
            "the tree to copy is on {fs}, a kernel filesystem, not a sandbox's files"
        )));
    }
    rustix::fs::mkdir(dest, Mode::from_bits_truncate(0o700))
        .context(|| format!("create {}", dest.display()))?;
    let dest_fd = rustix::fs::open(dest, DIR_FLAGS, Mode::empty())
        .context(|| format!("open {}", dest.display()))?;
    let mut copier = Copier {
        options,
        progress,
        stats: CopyStats::default(),
        links: HashMap::new(),
        buf: vec![0; CHUNK],
        dest_root: dest.to_path_buf(),
        base: options.shown_as.clone(),
    };
    copier.dir(root.as_fd(), dest_fd.as_fd(), &mut PathBuf::new(), 0)?;
    copier.finish(root.as_fd(), dest_fd.as_fd(), &st, "")?;
    Ok(copier.stats)
}

struct Copier<'a> {
    options: &'a CopyOptions,
    progress: &'a dyn Progress,
    stats: CopyStats,
    /// Copies of hardlinked inodes by their source `(dev, ino)`: the same inode
    /// is copied once, and its other names are links to that copy.
    links: HashMap<(u64, u64), PathBuf>,
    buf: Vec<u8>,
    dest_root: PathBuf,
    /// [`CopyOptions::shown_as`].
    base: String,
}

impl Copier<'_> {
    /// Copies the entries of `src` (whose path relative to the root is `rel`)
    /// into `dest`.
    fn dir(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        rel: &mut PathBuf,
        depth: usize,
    ) -> Result<()> {
        if depth >= MAX_DEPTH {
            return Err(ImageError::BadSource(format!(
                "{} is nested deeper than {MAX_DEPTH} directories, more than a layer may hold",
                shown(&self.base, rel)
            )));
        }
        let mut entries =
            Dir::read_from(src).context(|| format!("list {}", shown(&self.base, rel)))?;
        while let Some(entry) = entries.read() {
            let entry = entry.context(|| format!("list {}", shown(&self.base, rel)))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if self.progress.cancelled() {
                return Err(ImageError::Interrupted);
            }
            rel.push(OsStr::from_bytes(name));
            let copied = if self.options.exclude.iter().any(|x| x == rel) {
                Ok(())
            } else {
                self.entry(src, dest, name, rel, depth)
            };
            rel.pop();
            copied?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        name: &[u8],
        rel: &mut PathBuf,
        depth: usize,
    ) -> Result<()> {
        if name.len() > crate::pack::MAX_NAME_BYTES {
            // The path's start is enough to find it; the name alone is 255 bytes.
            const SHOWN: usize = 80;
            let mut path = shown(&self.base, rel);
            if let Some((cut, _)) = path.char_indices().nth(SHOWN) {
                path.truncate(cut);
                path.push('…');
            }
            return Err(ImageError::BadSource(format!(
                "{path}: a name of {} bytes, longer than a snapshot holds (at most {} bytes); \
                 rename it",
                name.len(),
                crate::pack::MAX_NAME_BYTES
            )));
        }
        self.stats.entries += 1;
        let st = rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW)
            .context(|| format!("inspect {}", shown(&self.base, rel)))?;
        let kind = FileType::from_raw_mode(st.st_mode);
        match kind {
            FileType::Directory => {
                let child = open_beneath(src, name, DIR_FLAGS, &st, &shown(&self.base, rel))?;
                rustix::fs::mkdirat(dest, name, Mode::from_bits_truncate(0o700))
                    .context(|| format!("copy {}", shown(&self.base, rel)))?;
                let child_dest = rustix::fs::openat(dest, name, DIR_FLAGS, Mode::empty())
                    .context(|| format!("copy {}", shown(&self.base, rel)))?;
                self.dir(child.as_fd(), child_dest.as_fd(), rel, depth + 1)?;
                self.finish(child.as_fd(), child_dest.as_fd(), &st, rel)
            }
            FileType::RegularFile => self.file(src, dest, name, &st, rel),
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name, Vec::new())
                    .context(|| format!("read the symlink {}", shown(&self.base, rel)))?;
                rustix::fs::symlinkat(target.as_c_str(), dest, name)
                    .context(|| format!("copy {}", shown(&self.base, rel)))?;
                self.set_owner_and_time_at(dest, name, &st, rel)
            }
            FileType::CharacterDevice
            | FileType::BlockDevice
            | FileType::Fifo
            | FileType::Socket => {
                // Recreated from the lstat, never opened: opening a device or a fifo
                // as root can act on it.
                rustix::fs::mknodat(
                    dest,
                    name,
                    kind,
                    Mode::from_bits_truncate(st.st_mode & 0o777),
                    st.st_rdev,
                )
                .context(|| format!("copy {}", shown(&self.base, rel)))?;
                self.set_owner_and_time_at(dest, name, &st, rel)?;
                rustix::fs::chmodat(
                    dest,
                    name,
                    Mode::from_bits_truncate(st.st_mode & 0o7777),
                    AtFlags::empty(),
                )
                .context(|| format!("copy {}", shown(&self.base, rel)))
            }
            FileType::Unknown => Err(ImageError::BadSource(format!(
                "{}: a file of unknown type",
                shown(&self.base, rel)
            ))),
        }
    }

    fn file(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        name: &[u8],
        st: &Stat,
        rel: &Path,
    ) -> Result<()> {
        let key = (st.st_dev, st.st_ino);
        if st.st_nlink > 1 {
            if let Some(first) = self.links.get(&key) {
                return rustix::fs::linkat(
                    rustix::fs::CWD,
                    self.dest_root.join(first),
                    dest,
                    name,
                    AtFlags::empty(),
                )
                .context(|| format!("copy {}", shown(&self.base, rel)));
            }
        }
        let input = open_beneath(src, name, FILE_FLAGS, st, &shown(&self.base, rel))?;
        // The size when opened: a file that grows while it is copied is cut there,
        // so the bound below holds whatever the sandbox does meanwhile.
        let now =
            rustix::fs::fstat(&input).context(|| format!("inspect {}", shown(&self.base, rel)))?;
        let size = now.st_size.max(0) as u64;
        self.stats.bytes = self.stats.bytes.saturating_add(size);
        if let Some(max) = self.options.max_bytes {
            if self.stats.bytes > max {
                return Err(ImageError::TooLarge(format!(
                    "the files add up to more than {max} bytes at their apparent sizes \
                     (a sparse file counts whole, as packing reads it)"
                )));
            }
        }
        let output = rustix::fs::openat(
            dest,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .context(|| format!("copy {}", shown(&self.base, rel)))?;
        self.data(&input, &output, size, rel)?;
        self.finish(input.as_fd(), output.as_fd(), &now, rel)?;
        if st.st_nlink > 1 {
            self.links.insert(key, rel.to_path_buf());
        }
        Ok(())
    }

    /// Copies the first `size` bytes of `input`, leaving its holes as holes.
    fn data(&mut self, input: &OwnedFd, output: &OwnedFd, size: u64, rel: &Path) -> Result<()> {
        let context = || format!("copy {}", shown(&self.base, rel));
        let mut offset = 0u64;
        while offset < size {
            let data = match rustix::fs::seek(input, SeekFrom::Data(offset)) {
                Ok(data) => data,
                // Nothing but a hole from here to the end.
                Err(Errno::NXIO) => break,
                Err(e) => return Err(e).context(context),
            };
            if data >= size {
                break;
            }
            let hole = match rustix::fs::seek(input, SeekFrom::Hole(data)) {
                Ok(hole) => hole.min(size),
                Err(Errno::NXIO) => size,
                Err(e) => return Err(e).context(context),
            };
            let mut at = data;
            while at < hole {
                if self.progress.cancelled() {
                    return Err(ImageError::Interrupted);
                }
                let want = ((hole - at) as usize).min(self.buf.len());
                let n = rustix::io::pread(input, &mut self.buf[..want], at).context(context)?;
                if n == 0 {
                    // Shrunk while copied: what is missing stays a hole (zeros).
                    break;
                }
                let mut written = 0;
                while written < n {
                    written +=
                        rustix::io::pwrite(output, &self.buf[written..n], at + written as u64)
                            .context(context)?;
                }
                at += n as u64;
            }
            offset = hole.max(at);
        }
        rustix::fs::ftruncate(output, size).context(context)
    }

    /// Gives the copy `dest` of `src` (an opened file or directory) the owner,
    /// permission bits, content xattrs and mtime of `st`. The mtime comes last: for
    /// a directory, after everything was copied into it.
    fn finish(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        st: &Stat,
        rel: impl AsRef<Path>,
    ) -> Result<()> {
        let rel = rel.as_ref();
        let context = || format!("copy {}", shown(&self.base, rel));
        let (uid, gid) = self.owner(st);
        rustix::fs::fchown(
            dest,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .context(context)?;
        // After chown, which clears set-id bits.
        rustix::fs::fchmod(dest, Mode::from_bits_truncate(st.st_mode & 0o7777)).context(context)?;
        for name in xattr_names(src).context(context)? {
            if !super::is_content_xattr(&name) {
                continue;
            }
            if let Some(value) = xattr_value(src, &name).context(context)? {
                rustix::fs::fsetxattr(dest, &name, &value, XattrFlags::empty()).context(context)?;
            }
        }
        rustix::fs::futimens(dest, &times(st)).context(context)
    }

    fn set_owner_and_time_at(
        &self,
        dest: BorrowedFd<'_>,
        name: &[u8],
        st: &Stat,
        rel: &Path,
    ) -> Result<()> {
        let context = || format!("copy {}", shown(&self.base, rel));
        let (uid, gid) = self.owner(st);
        rustix::fs::chownat(
            dest,
            name,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .context(context)?;
        rustix::fs::utimensat(dest, name, &times(st), AtFlags::SYMLINK_NOFOLLOW).context(context)
    }

    fn owner(&self, st: &Stat) -> (u32, u32) {
        self.options.force_owner.unwrap_or((st.st_uid, st.st_gid))
    }
}

/// Opens `name` below `parent` with `flags`, confined, and checks it is still the
/// inode `st` described: anything else means the tree changed under the copy.
fn open_beneath(
    parent: BorrowedFd<'_>,
    name: &[u8],
    flags: OFlags,
    st: &Stat,
    shown_path: &str,
) -> Result<OwnedFd> {
    let changed = || {
        ImageError::Changed(format!(
            "{shown_path} changed while it was copied: keep the tree still while it is snapshotted"
        ))
    };
    let fd = match brig_sys::resolve::openat2(parent, name, flags, Mode::empty(), RESOLVE) {
        Ok(fd) => fd,
        // A symlink, a mount, a non-directory or nothing where the lstat saw a
        // file or a directory.
        Err(Errno::LOOP | Errno::XDEV | Errno::NOTDIR | Errno::NOENT | Errno::NXIO) => {
            return Err(changed())
        }
        // Opened non-blocking: a file a sandbox's process holds a write lease on
        // (F_SETLEASE) would otherwise keep the copy waiting for the lease-break
        // time while the sandbox, frozen, cannot let go.
        Err(Errno::AGAIN) => {
            return Err(ImageError::Busy(format!(
                "{shown_path}: the file is leased by a process in the sandbox (fcntl \
                 F_SETLEASE); try again once it lets go"
            )))
        }
        Err(e) => return Err(e).context(|| format!("open {shown_path}")),
    };
    let now = rustix::fs::fstat(&fd).context(|| format!("inspect {shown_path}"))?;
    let same_kind = FileType::from_raw_mode(now.st_mode) == FileType::from_raw_mode(st.st_mode);
    if !same_kind || (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(changed());
    }
    Ok(fd)
}

/// `rel` as the sandbox sees it, below the tree shown as `base`.
fn shown(base: &str, rel: &Path) -> String {
    format!("{base}/{}", rel.display())
}

fn times(st: &Stat) -> Timestamps {
    let mtime = Timespec {
        tv_sec: st.st_mtime as _,
        tv_nsec: st.st_mtime_nsec as _,
    };
    Timestamps {
        last_access: mtime,
        last_modification: mtime,
    }
}

fn xattr_names(fd: BorrowedFd<'_>) -> std::result::Result<Vec<std::ffi::OsString>, Errno> {
    super::scan::list_xattrs(
        || rustix::fs::flistxattr_query(fd),
        |list| rustix::fs::flistxattr(fd, list),
    )
}

fn xattr_value(fd: BorrowedFd<'_>, name: &OsStr) -> std::result::Result<Option<Vec<u8>>, Errno> {
    super::scan::read_xattr(
        || rustix::fs::fgetxattr_query(fd, name),
        |value| rustix::fs::fgetxattr(fd, name, value),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt};

    fn copy(source: &Path, dest: &Path, options: &CopyOptions) -> Result<CopyStats> {
        let fd = rustix::fs::open(source, DIR_FLAGS, Mode::empty()).unwrap();
        copy_beneath(fd.as_fd(), dest, options, &crate::Silent)
    }

    #[test]
    fn symlinks_are_copied_as_symlinks_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (source, dest, host) = (
            tmp.path().join("source"),
            tmp.path().join("dest"),
            tmp.path().join("host"),
        );
        fs::create_dir_all(source.join("dir")).unwrap();
        fs::create_dir(&host).unwrap();
        fs::write(host.join("secret"), "host only").unwrap();
        symlink(&host, source.join("dir/to-host")).unwrap();
        symlink(host.join("secret"), source.join("secret")).unwrap();
        copy(&source, &dest, &CopyOptions::default()).unwrap();
        for link in ["dir/to-host", "secret"] {
            let meta = dest.join(link).symlink_metadata().unwrap();
            assert!(meta.file_type().is_symlink(), "{link}");
        }
        assert_eq!(
            fs::read_link(dest.join("secret")).unwrap(),
            host.join("secret")
        );
        assert_eq!(fs::read_dir(dest.join("dir")).unwrap().count(), 1);
    }

    #[test]
    fn the_copy_is_the_tree_with_its_digest_and_the_owner_it_is_stored_with() {
        let tmp = tempfile::tempdir().unwrap();
        let (source, dest) = (tmp.path().join("source"), tmp.path().join("dest"));
        fs::create_dir_all(source.join("a/b")).unwrap();
        fs::write(source.join("a/b/file"), "content").unwrap();
        fs::write(source.join("top"), vec![7u8; 300_000]).unwrap();
        fs::hard_link(source.join("top"), source.join("a/top-link")).unwrap();
        symlink("a/b/file", source.join("rel-link")).unwrap();
        rustix::fs::setxattr(
            source.join("a"),
            crate::tree::OPAQUE_XATTR,
            b"y",
            XattrFlags::empty(),
        )
        .unwrap();
        let stats = copy(&source, &dest, &CopyOptions::default()).unwrap();
        assert_eq!(stats.bytes, 7 + 300_000, "a hardlinked inode counts once");
        assert_eq!(
            crate::tree::digest(&source, &crate::Silent).unwrap(),
            crate::tree::digest(&dest, &crate::Silent).unwrap()
        );
        assert_eq!(
            fs::metadata(dest.join("top")).unwrap().ino(),
            fs::metadata(dest.join("a/top-link")).unwrap().ino(),
            "hardlinks stay hardlinks"
        );
        // Owned as stored: the digest then describes the stored layer.
        let owned = tmp.path().join("owned");
        let options = CopyOptions {
            force_owner: Some((1234, 5678)),
            ..Default::default()
        };
        copy(&source, &owned, &options).unwrap();
        for path in ["", "a", "a/b/file", "rel-link"] {
            let meta = owned.join(path).symlink_metadata().unwrap();
            assert_eq!((meta.uid(), meta.gid()), (1234, 5678), "{path}");
        }
    }

    #[test]
    fn holes_stay_holes_and_count_at_their_apparent_size() {
        let tmp = tempfile::tempdir().unwrap();
        let (source, dest) = (tmp.path().join("source"), tmp.path().join("dest"));
        fs::create_dir(&source).unwrap();
        let file = fs::File::create(source.join("sparse")).unwrap();
        file.set_len(1 << 40).unwrap();
        rustix::io::pwrite(&file, b"middle", 1 << 30).unwrap();
        let bounded = CopyOptions {
            max_bytes: Some(1 << 30),
            ..Default::default()
        };
        let refused = copy(&source, &dest, &bounded).unwrap_err();
        assert!(matches!(refused, ImageError::TooLarge(_)), "{refused}");
        let dest = tmp.path().join("dest2");
        let stats = copy(&source, &dest, &CopyOptions::default()).unwrap();
        assert_eq!(stats.bytes, 1 << 40);
        let copied = fs::metadata(dest.join("sparse")).unwrap();
        assert_eq!(copied.len(), 1 << 40);
        assert!(
            copied.blocks() * 512 < 1 << 20,
            "{} blocks",
            copied.blocks()
        );
        let mut middle = [0u8; 6];
        rustix::io::pread(
            fs::File::open(dest.join("sparse")).unwrap(),
            &mut middle,
            1 << 30,
        )
        .unwrap();
        assert_eq!(&middle, b"middle");
    }

    /// The copy recurses once per level: as deep as it goes, it fits the 2 MiB
    /// stack of the daemon's blocking threads, in a debug build.
    #[test]
    fn a_copy_as_deep_as_allowed_fits_a_blocking_threads_stack() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("source");
        let deep = source.join("d/".repeat(MAX_DEPTH - 1));
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("f"), "abc").unwrap();
        let dest = tmp.path().join("dest");
        let copied = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || copy(&source, &dest, &CopyOptions::default()).unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(copied.entries, MAX_DEPTH as u64);
        let too_deep = tmp.path().join("too-deep");
        fs::create_dir_all(too_deep.join("d/".repeat(MAX_DEPTH + 1))).unwrap();
        let refused = copy(&too_deep, &tmp.path().join("dest2"), &Default::default()).unwrap_err();
        assert!(matches!(refused, ImageError::BadSource(_)), "{refused}");
    }

    #[test]
    fn excluded_paths_are_left_out() {
        let tmp = tempfile::tempdir().unwrap();
        let (source, dest) = (tmp.path().join("source"), tmp.path().join("dest"));
        fs::create_dir_all(source.join(".brig/jobs")).unwrap();
        fs::write(source.join(".brig/jobs/out"), "daemon's").unwrap();
        fs::write(source.join("kept"), "tenant's").unwrap();
        let options = CopyOptions {
            exclude: vec![PathBuf::from(".brig")],
            ..Default::default()
        };
        copy(&source, &dest, &options).unwrap();
        let names: Vec<_> = fs::read_dir(&dest)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kept"]);
    }

    #[test]
    fn a_kernel_filesystem_is_never_copied() {
        let tmp = tempfile::tempdir().unwrap();
        let refused = copy(
            Path::new("/proc"),
            &tmp.path().join("dest"),
            &Default::default(),
        )
        .unwrap_err();
        assert!(matches!(refused, ImageError::BadSource(_)), "{refused}");
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_mid_copy_fails_the_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let (source, host) = (tmp.path().join("source"), tmp.path().join("host"));
        fs::create_dir_all(source.join("sub")).unwrap();
        fs::create_dir(&host).unwrap();
        fs::write(host.join("secret"), "host only").unwrap();
        let st = rustix::fs::stat(source.join("sub")).unwrap();
        // The swap lands between the lstat and the open.
        fs::remove_dir(source.join("sub")).unwrap();
        symlink(&host, source.join("sub")).unwrap();
        let parent = rustix::fs::open(&source, DIR_FLAGS, Mode::empty()).unwrap();
        let refused = open_beneath(parent.as_fd(), b"sub", DIR_FLAGS, &st, "/sub").unwrap_err();
        assert!(matches!(refused, ImageError::Changed(_)), "{refused}");
    }
}
